// Writes Megatron-LM indexed datasets (PREFIX.bin + PREFIX.idx) as Megatron's
// IndexedDatasetBuilder does (megatron/core/datasets/indexed_dataset.py): sequences back to
// back in the .bin, each document's sequences listed in document_indices, which begin with 0.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "importer_test_util.h"

namespace mmt::testutil {

class MegatronBuilder {
 public:
  // code: Megatron's DType (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32,
  // 8 uint16); item: its byte size.
  explicit MegatronBuilder(uint8_t code = 8, int64_t item = 2) : code_(code), item_(item) {}

  // One document of these sequences (each a list of token values, stored in the dtype's
  // little-endian bytes: integers only, which is what tests need).
  MegatronBuilder& document(const std::vector<std::vector<int64_t>>& sequences) {
    for (const auto& sequence : sequences) {
      lengths_.push_back(static_cast<int32_t>(sequence.size()));
      pointers_.push_back(static_cast<int64_t>(bin_.size()));
      for (int64_t token : sequence)
        for (int64_t b = 0; b < item_; ++b) bin_.push_back(static_cast<std::byte>((token >> (8 * b)) & 0xFF));
    }
    document_indices_.push_back(static_cast<int64_t>(lengths_.size()));
    return *this;
  }

  Bytes index() const {
    Bytes out = to_bytes(std::string("MMIDIDX\0\0", 9));
    put(out, uint64_t{1}, 8);
    put(out, code_, 1);
    put(out, lengths_.size(), 8);
    put(out, document_indices_.size(), 8);
    for (int32_t length : lengths_) put(out, static_cast<uint32_t>(length), 4);
    for (int64_t pointer : pointers_) put(out, static_cast<uint64_t>(pointer), 8);
    for (int64_t index : document_indices_) put(out, static_cast<uint64_t>(index), 8);
    return out;
  }
  const Bytes& bin() const { return bin_; }
  std::vector<int64_t>& pointers() { return pointers_; }

  // Writes PREFIX.bin and PREFIX.idx.
  void write(const std::string& prefix) const {
    write_file(prefix + ".bin", bin_);
    write_file(prefix + ".idx", index());
  }

  // The byte of each array in the index.
  static constexpr size_t kLengthsAt = 34;
  size_t pointers_at() const { return kLengthsAt + 4 * lengths_.size(); }
  size_t document_indices_at() const { return pointers_at() + 8 * lengths_.size(); }

 private:
  static void put(Bytes& out, uint64_t value, int bytes) {
    for (int b = 0; b < bytes; ++b) out.push_back(static_cast<std::byte>((value >> (8 * b)) & 0xFF));
  }

  uint8_t code_;
  int64_t item_;
  Bytes bin_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> document_indices_{0};
};

}  // namespace mmt::testutil
