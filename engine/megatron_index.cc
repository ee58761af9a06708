#include "megatron_index.h"

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "mapping_guard.h"
#include "mmtensor/error.h"

namespace mmt::detail {

namespace {

std::optional<ScalarType> dtype_of_code(uint8_t code) {
  switch (code) {
    case 1: return kUInt8;
    case 2: return kInt8;
    case 3: return kInt16;
    case 4: return kInt32;
    case 5: return kInt64;
    case 6: return kFloat64;
    case 7: return kFloat32;
    case 8: return kUInt16;
    default: return std::nullopt;
  }
}

bool begins_with_index_magic(const std::string& path) {
  char magic[sizeof kMegatronIndexMagic] = {};
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  const size_t got = std::fread(magic, 1, sizeof magic, f);
  std::fclose(f);
  return got == sizeof magic && std::memcmp(magic, kMegatronIndexMagic, sizeof magic) == 0;
}

// PREFIX when PREFIX.idx begins with the index magic (`path` as a prefix first).
std::optional<std::string> megatron_prefix(const std::string& path) {
  const auto indexes = [](const std::string& prefix) {
    std::error_code ec;
    const std::string index = prefix + ".idx";
    return std::filesystem::is_regular_file(index, ec) && begins_with_index_magic(index);
  };
  if (indexes(path)) return path;
  if ((path.ends_with(".idx") || path.ends_with(".bin")) && indexes(path.substr(0, path.size() - 4)))
    return path.substr(0, path.size() - 4);
  return std::nullopt;
}

}  // namespace

std::optional<std::string> megatron_pair(const std::string& path) {
  if (std::optional<std::string> prefix = megatron_prefix(path)) return prefix;
  const auto pair = [](const std::string& prefix) {
    std::error_code ec;
    return std::filesystem::is_regular_file(prefix + ".idx", ec) && std::filesystem::is_regular_file(prefix + ".bin", ec);
  };
  if (pair(path)) return path;
  if ((path.ends_with(".idx") || path.ends_with(".bin")) && pair(path.substr(0, path.size() - 4)))
    return path.substr(0, path.size() - 4);
  return std::nullopt;
}

MegatronIndex::MegatronIndex(UntypedStorage index, int64_t bin_bytes, const std::string& bin_path)
    : index_(std::move(index)) {
  const std::string& path = index_.filename();
  const int64_t size = index_.nbytes();
  const auto fault = [&](const std::string& why) { return FormatError(str(path, ": ", why)); };
  if (size < kMegatronIndexHeaderBytes)
    throw fault(str(size, " bytes, less than the ", kMegatronIndexHeaderBytes,
                    "-byte header of a Megatron index (truncated, or not one)"));
  guard_storage_reads(index_, [&] {
    if (std::memcmp(at(0), "TNTIDX\0\0", 8) == 0)
      throw fault("an index of the older IndexedDataset (\"TNTIDX\", fairseq's and Megatron's 'lazy' and 'cached' "
                  "formats): rebuild it in the mmap format (\"MMIDIDX\", preprocess_data.py's default)");
    if (std::memcmp(at(0), kMegatronIndexMagic, sizeof kMegatronIndexMagic) != 0)
      throw fault("not a Megatron index (its first 9 bytes are not \"MMIDIDX\\0\\0\")");
    const uint64_t version = load_le64(at(9));
    if (version != 1)
      throw fault(str("index version ", version, " (byte 9); this reader knows version 1"));
    const auto code = static_cast<uint8_t>(*at(17));
    const std::optional<ScalarType> dtype = dtype_of_code(code);
    if (!dtype)
      throw fault(str("dtype code ", int{code}, " (byte 17) is none of Megatron's (1 to 8: uint8, int8, int16, int32, "
                      "int64, float64, float32, uint16)"));
    dtype_ = *dtype;
    const uint64_t sequence_count = load_le64(at(18)), document_count = load_le64(at(26));
    // The arrays' size, overflow-safe: each count is first bounded by the file's size.
    const auto counts_make = [&]() -> std::optional<int64_t> {
      if (sequence_count > static_cast<uint64_t>(size) || document_count > static_cast<uint64_t>(size))
        return std::nullopt;
      return kMegatronIndexHeaderBytes + 12 * static_cast<int64_t>(sequence_count) +
             8 * static_cast<int64_t>(document_count);
    };
    const std::optional<int64_t> expected = counts_make();
    const std::string counts = str(sequence_count, " sequences (byte 18) and ", document_count,
                                   " document indices (byte 26)");
    if (expected && sequence_count > 0 && size == *expected + static_cast<int64_t>(sequence_count))
      throw fault(str("a multimodal index (", counts, ", then a mode byte a sequence): its sequences are not all "
                      "tokens; pack the text-only dataset"));
    if (!expected || size != *expected)
      throw fault(str(size, " bytes, but its header's ", counts, " make ",
                      expected ? str(*expected, " bytes") : std::string("more than the file holds"),
                      size > (expected ? *expected : size) ? " (trailing bytes)" : " (truncated)"));
    if (document_count == 0)
      throw fault("no document indices (byte 26 is 0; Megatron's writer begins them with 0, so even a dataset of no "
                  "documents has one)");
    sequences_ = static_cast<int64_t>(sequence_count);
    documents_ = static_cast<int64_t>(document_count) - 1;
    lengths_ = kMegatronIndexHeaderBytes;
    pointers_ = lengths_ + 4 * sequences_;
    document_indices_ = pointers_ + 8 * sequences_;

    for (int64_t s = 0; s < sequences_; ++s) {
      const int64_t length = sequence_length(s);
      if (length < 0)
        throw fault(str("sequence ", s, " has length ", length, " (byte ", length_byte(s), ")"));
      if (!sequence_bytes(s, bin_bytes))
        throw fault(str("sequence ", s, " (", length, " tokens of ", to_string(dtype_), ") at byte ", sequence_pointer(s),
                        " of ", bin_path, " (pointer at byte ", pointer_byte(s), ") runs past its end (", bin_bytes,
                        " bytes)"));
      if (__builtin_add_overflow(total_tokens_, length, &total_tokens_))
        throw fault("its sequences hold more than 2^63 tokens");
    }
    int64_t previous = 0;
    for (int64_t d = 0; d <= documents_; ++d) {
      const int64_t first = first_sequence(d);
      if (d == 0 && first != 0)
        throw fault(str("document index 0 is ", first, " (byte ", document_byte(0), "); the first document begins at "
                        "sequence 0"));
      if (first < previous || first > sequences_)
        throw fault(str("document index ", d, " is ", first, " (byte ", document_byte(d), "), after ", previous,
                        "; document indices never decrease and stay within the ", sequences_, " sequences"));
      previous = first;
    }
    if (previous != sequences_)
      throw fault(str("the last document index is ", previous, " (byte ", document_byte(documents_), "), not the ",
                      sequences_, " sequences: the last ", sequences_ - previous,
                      sequences_ - previous == 1 ? " sequence belongs" : " sequences belong", " to no document"));
  });
}

}  // namespace mmt::detail
