#include "buffer_recycler.h"

#include <utility>

namespace mmt::detail {

RecycledBuffer BufferRecycler::take(int64_t nbytes, const char* what) {
  {
    std::lock_guard lock(mutex_);
    size_t best = idle_.size();
    for (size_t i = 0; i < idle_.size(); ++i) {
      const int64_t capacity = idle_[i].capacity_bytes;
      if (capacity >= nbytes && capacity / 2 <= nbytes &&
          (best == idle_.size() || capacity < idle_[best].capacity_bytes))
        best = i;
    }
    if (best != idle_.size()) {
      RecycledBuffer taken = std::move(idle_[best]);
      idle_[best] = std::move(idle_.back());
      idle_.pop_back();
      return taken;
    }
  }
  return RecycledBuffer{io::allocate(nbytes, what), nbytes};
}

void BufferRecycler::give(RecycledBuffer buffer) noexcept {
  if (!buffer.bytes) return;
  std::lock_guard lock(mutex_);
  if (idle_.size() < max_idle_ && idle_.size() < idle_.capacity()) idle_.push_back(std::move(buffer));
  // Otherwise `buffer` frees itself here.
}

void BufferRecycler::set_max_idle(size_t max_idle) {
  std::lock_guard lock(mutex_);
  max_idle_ = max_idle;
  idle_.reserve(max_idle);  // give() then never allocates
}

size_t BufferRecycler::idle() const {
  std::lock_guard lock(mutex_);
  return idle_.size();
}

}  // namespace mmt::detail
