// Small containers for tensor sizes and strides.
//
// IntArrayRef is a non-owning view of int64 values (like c10::IntArrayRef): functions take
// sizes as IntArrayRef so callers may pass {2, 3}, a std::vector or a DimVector.
// DimVector owns up to kInlineDims values without a heap allocation (most tensors), and
// spills to the heap beyond that, so reading a sample allocates nothing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <vector>

namespace mmt {

class IntArrayRef {
 public:
  constexpr IntArrayRef() = default;
  constexpr IntArrayRef(const int64_t* data, size_t size) : data_(data), size_(size) {}
  // The initializer_list lives until the end of the full expression: fine for arguments,
  // which is the only use (as with c10::IntArrayRef); never store an IntArrayRef.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"
#endif
  constexpr IntArrayRef(std::initializer_list<int64_t> list)
      : data_(list.begin()), size_(list.size()) {}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
  IntArrayRef(const std::vector<int64_t>& v) : data_(v.data()), size_(v.size()) {}

  constexpr const int64_t* data() const { return data_; }
  constexpr size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr const int64_t* begin() const { return data_; }
  constexpr const int64_t* end() const { return data_ + size_; }
  constexpr int64_t operator[](size_t i) const { return data_[i]; }
  constexpr int64_t front() const { return data_[0]; }
  constexpr int64_t back() const { return data_[size_ - 1]; }
  std::vector<int64_t> vec() const { return {begin(), end()}; }

  friend bool operator==(IntArrayRef a, IntArrayRef b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
  }

 private:
  const int64_t* data_ = nullptr;
  size_t size_ = 0;
};

// Prints [2, 3] as PyTorch prints torch.Size values.
std::ostream& operator<<(std::ostream& out, IntArrayRef values);

class DimVector {
 public:
  static constexpr size_t kInlineDims = 6;

  DimVector() noexcept {}  // user-provided: inline_ is left unset (below)
  explicit DimVector(size_t n, int64_t value = 0) { assign(n, value); }
  DimVector(IntArrayRef values) { assign(values); }
  DimVector(std::initializer_list<int64_t> values) { assign(IntArrayRef(values)); }
  DimVector(const std::vector<int64_t>& values) { assign(IntArrayRef(values)); }
  DimVector(const DimVector& other) { assign(IntArrayRef(other)); }
  DimVector& operator=(const DimVector& other) {
    if (this != &other) assign(IntArrayRef(other));
    return *this;
  }
  DimVector(DimVector&& other) noexcept { *this = std::move(other); }
  DimVector& operator=(DimVector&& other) noexcept {
    if (this == &other) return *this;
    size_ = other.size_;
    capacity_ = other.capacity_;
    heap_ = std::move(other.heap_);
    if (!heap_) std::memcpy(inline_, other.inline_, sizeof(inline_));
    other.size_ = 0;
    other.capacity_ = kInlineDims;
    return *this;
  }

  operator IntArrayRef() const { return {data(), size_}; }
  int64_t* data() { return heap_ ? heap_.get() : inline_; }
  const int64_t* data() const { return heap_ ? heap_.get() : inline_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t* begin() { return data(); }
  int64_t* end() { return data() + size_; }
  const int64_t* begin() const { return data(); }
  const int64_t* end() const { return data() + size_; }
  int64_t& operator[](size_t i) { return data()[i]; }
  int64_t operator[](size_t i) const { return data()[i]; }
  int64_t& back() { return data()[size_ - 1]; }
  int64_t back() const { return data()[size_ - 1]; }
  std::vector<int64_t> vec() const { return {begin(), end()}; }

  void assign(size_t n, int64_t value) {
    reserve(n);
    std::fill_n(data(), n, value);
    size_ = n;
  }
  void assign(IntArrayRef values) {
    reserve(values.size());
    std::copy(values.begin(), values.end(), data());
    size_ = values.size();
  }
  void resize(size_t n, int64_t value = 0) {
    reserve(n);
    if (n > size_) std::fill(data() + size_, data() + n, value);
    size_ = n;
  }
  void push_back(int64_t v) {
    reserve(size_ + 1);
    data()[size_++] = v;
  }
  void insert(size_t pos, int64_t v) {
    reserve(size_ + 1);
    int64_t* d = data();
    std::copy_backward(d + pos, d + size_, d + size_ + 1);
    d[pos] = v;
    ++size_;
  }
  void erase(size_t pos) {
    int64_t* d = data();
    std::copy(d + pos + 1, d + size_, d + pos);
    --size_;
  }
  void clear() { size_ = 0; }
  void reserve(size_t n) {
    if (n <= capacity_) return;
    size_t cap = std::max(n, capacity_ * 2);
    std::unique_ptr<int64_t[]> grown(new int64_t[cap]);
    std::copy(data(), data() + size_, grown.get());
    heap_ = std::move(grown);
    capacity_ = cap;
  }

  friend bool operator==(const DimVector& a, const DimVector& b) {
    return IntArrayRef(a) == IntArrayRef(b);
  }

 private:
  // Left unset: only [0, size_) is ever read (a move copies the rest as bytes). Every tensor
  // has two of these, and a Sample made by Dataset::get four tensors: zeroing them was a
  // tenth of a get.
  int64_t inline_[kInlineDims];
  std::unique_ptr<int64_t[]> heap_;
  size_t size_ = 0;
  size_t capacity_ = kInlineDims;
};

inline std::ostream& operator<<(std::ostream& out, const DimVector& v) {
  return out << IntArrayRef(v);
}

}  // namespace mmt
