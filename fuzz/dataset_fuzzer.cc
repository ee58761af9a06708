// Fuzzes the dataset reader: any bytes must open and read as a dataset or give an mmt::Error,
// never a crash, a hang or a read outside the file.
//
// Input: one mode byte, then the file. Mode bit 0 set: before opening, the harness recomputes
// every checksum it can locate (preamble, footer, schema, table entries, payloads), so the
// fuzzer explores the decoders behind the checksums instead of stopping at them.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "checksum.h"
#include "format.h"
#include "mmtensor/dataset.h"

namespace {

using namespace mmt;

void store_u64(std::byte* p, uint64_t v) { std::memcpy(p, &v, 8); }

void fix_checksums(std::vector<std::byte>& file) {
  const uint64_t size = file.size();
  if (size < format::kPreambleBytes + format::kFooterBytes) return;
  std::byte* data = file.data();
  store_u64(data + 56, detail::checksum64(data, 56));
  std::byte* footer = data + size - format::kFooterBytes;
  const uint64_t schema_offset = format::load_u64(footer + 24), schema_bytes = format::load_u64(footer + 32);
  if (format::in_bounds(schema_offset, schema_bytes, size))
    store_u64(footer + 48, detail::checksum64(data + schema_offset, schema_bytes));
  const uint64_t table_offset = format::load_u64(footer + 16), chunk_count = format::load_u64(footer + 8);
  for (uint64_t c = 0; c < chunk_count && c < 4096; ++c) {
    const uint64_t at = table_offset + c * format::kChunkEntryBytes;
    if (table_offset > size || !format::in_bounds(at, format::kChunkEntryBytes, size - format::kFooterBytes)) break;
    std::byte* entry = data + at;
    const uint64_t offset = format::load_u64(entry), stored = format::load_u64(entry + 8);
    if (format::in_bounds(offset, stored, size))
      store_u64(entry + 48, format::payload_checksum(data + offset, static_cast<int64_t>(stored), c));
    store_u64(entry + 56, detail::checksum64(entry, 56, c));
  }
  store_u64(footer + 56, detail::checksum64(footer, 56));
}

void read_everything(const std::string& path, bool verify_checksums) {
  ReaderOptions options;
  options.cache_bytes = 1 << 16;
  options.verify_checksums = verify_checksums;
  Dataset ds = Dataset::open(path, options);
  const int64_t n = std::min<int64_t>(ds.size(), 256);
  std::vector<int64_t> indices;
  for (int64_t i = 0; i < n; ++i) indices.push_back(n - 1 - i);
  // prefetch reads ragged value ends from the file: as untrusted as the rest. Every field, then
  // each field alone (a later ragged field is found through the sections before it), with the
  // indices repeated so that chunks are met again.
  std::vector<int64_t> twice = indices;
  twice.insert(twice.end(), indices.begin(), indices.end());
  try {
    ds.prefetch(twice);
  } catch (const Error&) {
  }
  for (const Field& field : ds.schema()) {
    const std::string one[] = {field.name};
    try {
      ds.prefetch(indices, one);
    } catch (const Error&) {
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    Sample s = ds.get(i);
    for (size_t f = 0; f < s.size(); ++f) (void)s[f].contiguous();
  }
  for (const Field& field : ds.schema()) {
    if (!field.is_fixed()) {
      (void)ds.ragged_column(field.name, 0, n);  // a view inside one chunk, a copy across chunks
      continue;
    }
    if (field.fixed_nbytes() > (1 << 20)) continue;
    (void)ds.get_batch(indices, field.name, 2);
    if (ds.size() * field.fixed_nbytes() <= (16 << 20)) (void)ds.column(field.name);
  }
  for (int64_t c = 0; c < std::min<int64_t>(ds.num_chunks(), 64); ++c) (void)ds.chunk(c);
  ds.verify();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static int fd = memfd_create("mmt-dataset-fuzz", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  std::vector<std::byte> file(size - 1);
  if (!file.empty()) std::memcpy(file.data(), data + 1, size - 1);
  if (data[0] & 1) fix_checksums(file);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, file.data(), file.size(), 0) != static_cast<ssize_t>(file.size())) return 0;
  for (bool verify : {true, false}) {
    try {
      read_everything(path, verify);
    } catch (const mmt::Error&) {
    }
  }
  return 0;
}
