// Megatron-LM's indexed datasets (megatron/core/datasets/indexed_dataset.py, also NeMo's
// and GPT-NeoX's): a PREFIX.bin of token values, sequence after sequence, and a PREFIX.idx
// that says where each sequence lies and which sequences make each document. What
// PackSources::from_megatron packs documents from, each a view of the mapped .bin.
//
// The index, all little-endian, every field unaligned (the arrays start at byte 34):
//   magic              9 bytes  "MMIDIDX\0\0"
//   version            uint64   1
//   dtype code         uint8    1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
//                               7 float32, 8 uint16 (Megatron's DType; fairseq's older
//                               table also listed np.double as 7, though its writer
//                               never wrote it)
//   sequence_count     uint64   S
//   document_count     uint64   D: the entries of document_indices, one more than the
//                               documents
//   sequence_lengths   int32[S]   tokens of each sequence
//   sequence_pointers  int64[S]   byte offset of each sequence in the .bin
//   document_indices   int64[D]   document d is sequences [document_indices[d],
//                                 document_indices[d + 1])
// A multimodal index (Megatron's sequence_modes, int8[S]) follows with S more bytes: refused,
// its sequences are not all tokens.
//
// Nothing is trusted: the magic, version and code; the counts against the index's size
// (exactly, overflow-safe); every sequence's length (>= 0) and its bytes inside the .bin;
// document_indices from 0, never decreasing, ending at S. A fault is a FormatError naming
// the file, the entry and its byte. The checks read the whole index once (20 bytes a
// sequence, 8 a document), into no memory of its own: the arrays are read where they lie.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "import_util.h"
#include "mmtensor/dtype.h"
#include "mmtensor/storage.h"

namespace mmt::detail {

inline constexpr char kMegatronIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr int64_t kMegatronIndexHeaderBytes = 34;

// PREFIX when `path` is PREFIX, PREFIX.idx or PREFIX.bin of an indexed dataset (`path`
// itself is first taken as a prefix, so a prefix ending in ".bin" is found): PREFIX.idx is a
// regular file that begins with the index magic, or PREFIX.idx and PREFIX.bin both are
// regular files whatever the index holds (so that an index of another kind is named as such
// by MegatronIndex, not taken for another input). nullopt otherwise.
std::optional<std::string> megatron_pair(const std::string& path);

class MegatronIndex {
 public:
  // `index` maps PREFIX.idx whole (its filename() names it in errors); `bin_bytes` is the
  // .bin's size. Checks everything above; FormatError otherwise.
  MegatronIndex(UntypedStorage index, int64_t bin_bytes, const std::string& bin_path);

  ScalarType dtype() const { return dtype_; }
  int64_t sequences() const { return sequences_; }
  int64_t documents() const { return documents_; }
  const std::string& path() const { return index_.filename(); }

  // The entries, read from the mapping (unguarded: callers guard reads of the mapping when
  // the file may shrink under them).
  int64_t sequence_length(int64_t s) const { return static_cast<int32_t>(load_le32(at(lengths_ + 4 * s))); }
  int64_t sequence_pointer(int64_t s) const { return static_cast<int64_t>(load_le64(at(pointers_ + 8 * s))); }
  // Document d is sequences [first_sequence(d), first_sequence(d + 1)); d in [0, documents()].
  int64_t first_sequence(int64_t d) const { return static_cast<int64_t>(load_le64(at(document_indices_ + 8 * d))); }
  // Sequence s's bytes in a .bin of `bin_bytes`: (its pointer, its length in bytes), or nullopt
  // when its length is negative or it runs past the .bin's end.
  std::optional<std::pair<int64_t, int64_t>> sequence_bytes(int64_t s, int64_t bin_bytes) const {
    const int64_t length = sequence_length(s), pointer = sequence_pointer(s);
    const int64_t bytes = length * element_size(dtype_);  // an int32 times at most 8: no overflow
    if (length < 0 || pointer < 0 || pointer > bin_bytes || bytes > bin_bytes - pointer) return std::nullopt;
    return std::pair{pointer, bytes};
  }
  // The index's byte of each entry, for messages.
  int64_t length_byte(int64_t s) const { return lengths_ + 4 * s; }
  int64_t pointer_byte(int64_t s) const { return pointers_ + 8 * s; }
  int64_t document_byte(int64_t d) const { return document_indices_ + 8 * d; }

  // Tokens of all sequences (checked below 2^63 at construction).
  int64_t total_tokens() const { return total_tokens_; }
  const UntypedStorage& mapping() const { return index_; }

 private:
  const std::byte* at(int64_t offset) const { return index_.data() + offset; }

  UntypedStorage index_;
  ScalarType dtype_ = kUInt8;
  int64_t sequences_ = 0;
  int64_t documents_ = 0;  // the documents: document_count - 1
  int64_t lengths_ = 0, pointers_ = 0, document_indices_ = 0;  // byte offsets of the arrays
  int64_t total_tokens_ = 0;
};

}  // namespace mmt::detail
