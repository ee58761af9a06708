// Crafting dataset files that get past the checksums, as a buggy writer would leave them: the
// chunk table rewritten with valid entry checksums, a payload's checksum recomputed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "format.h"

namespace mmt::testing {

inline format::Footer footer_of(const std::vector<std::byte>& bytes) {
  format::Preamble p = format::decode_preamble(bytes.data(), static_cast<int64_t>(bytes.size()));
  return format::decode_footer(bytes.data(), static_cast<int64_t>(bytes.size()), p);
}

// Re-encodes chunk `c`'s table entry after `change`, with a valid entry checksum.
inline void rewrite_entry(std::vector<std::byte>& bytes, int64_t c,
                          const std::function<void(format::ChunkEntry&)>& change) {
  const format::Footer footer = footer_of(bytes);
  std::byte* entry = bytes.data() + footer.chunk_table_offset + c * format::kChunkEntryBytes;
  format::ChunkEntry e = format::decode_chunk_entry(entry, static_cast<uint64_t>(c));
  change(e);
  format::encode_chunk_entry(e, static_cast<uint64_t>(c), entry);
}

// Makes chunk `c`'s payload checksum match its (changed) stored bytes.
inline void reseal_payload(std::vector<std::byte>& bytes, int64_t c) {
  rewrite_entry(bytes, c, [&](format::ChunkEntry& e) {
    e.payload_checksum = format::payload_checksum(bytes.data() + e.file_offset, static_cast<int64_t>(e.stored_bytes),
                                                  static_cast<uint64_t>(c));
  });
}

}  // namespace mmt::testing
