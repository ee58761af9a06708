// Chunk-level reading: finding a record's chunk, validating a chunk on first use, decoding
// compressed chunks through the cache, and the full verify() pass.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "codec_engine.h"
#include "dataset_concat.h"
#include "dataset_impl.h"
#include "import_util.h"
#include "mmtensor/error.h"
#include "page_cache.h"

namespace mmt {
namespace {

// The last compressed chunk this thread read, so reading a chunk's records one by one costs
// one cache lookup per chunk instead of one per record. Keyed by the Dataset's instance_id
// (never reused), it holds at most one decoded chunk per thread alive.
struct LastChunk {
  uint64_t owner = 0;
  ChunkRef ref;
};
// Linked into a program, the linker turns its accesses into direct ones (local-exec); in
// a module loaded with dlopen (the Python one) they go through __tls_get_addr. It is not
// declared initial-exec: see t_guard_frame in mapping_guard.cc for why the module could not
// load then.
thread_local LastChunk last_chunk;


// A chunk's place in the dataset, without its bytes yet.
ChunkRef ref_without_storage(const format::ChunkEntry& e, int64_t chunk) {
  ChunkRef ref;
  ref.first_record = static_cast<int64_t>(e.first_record);
  ref.record_count = e.record_count;
  ref.decoded_bytes = static_cast<int64_t>(e.decoded_bytes);
  ref.index = chunk;
  return ref;
}

}  // namespace

[[noreturn]] void rethrow_in_file(const std::string& path) {
  try {
    throw;
  } catch (const ChecksumError& e) {
    throw ChecksumError(detail::str(path, ": ", e.what()));
  } catch (const FormatError& e) {
    throw FormatError(detail::str(path, ": ", e.what()));
  }
}

int64_t Dataset::Impl::normalize_index(int64_t index, const char* what) const {
  int64_t i = index < 0 ? index + record_count : index;
  if (i < 0 || i >= record_count) [[unlikely]]
    throw IndexError(detail::str(what, ": record index ", index, " is out of range for a dataset of ",
                                 record_count, " records",
                                 record_count > 0 ? detail::str(" (valid: ", -record_count, "..", record_count - 1, ")")
                                                  : std::string()));
  return i;
}

int64_t Dataset::Impl::chunk_of(int64_t record) const {
  if (records_per_chunk > 0) return record / records_per_chunk;
  // Chunks of varying size: binary search on the mapped table's first_record. The table is
  // untrusted, so the search only picks a candidate; chunk_ref's caller checks it holds the record.
  return guarded([&] {
    int64_t lo = 0, hi = chunk_count;
    const std::byte* table = base + chunk_table_offset;
    while (hi - lo > 1) {
      int64_t mid = lo + (hi - lo) / 2;
      if (format::peek_first_record(table + mid * format::kChunkEntryBytes) <= static_cast<uint64_t>(record))
        lo = mid;
      else
        hi = mid;
    }
    return lo;
  });
}

format::ChunkEntry Dataset::Impl::check_entry(int64_t c) const {
  const int64_t entry_at = chunk_table_offset + c * format::kChunkEntryBytes;
  format::ChunkEntry e;
  try {
    e = guarded([&] { return format::decode_chunk_entry(base + entry_at, static_cast<uint64_t>(c)); });
  } catch (const FormatError&) {
    rethrow_in_file(path);
  }
  const auto where = [&] { return detail::str(path, ": chunk ", c, " (table entry at byte offset ", entry_at, ")"); };
  const uint64_t n = static_cast<uint64_t>(record_count);
  MMT_CHECK(e.record_count >= 1 && e.first_record <= n && e.record_count <= n - e.first_record, FormatError,
            where(), ": records [", e.first_record, ", +", e.record_count, ") are outside the dataset's ",
            record_count, " records");
  if (records_per_chunk > 0) {
    const uint64_t rpc = static_cast<uint64_t>(records_per_chunk);
    const uint64_t first = static_cast<uint64_t>(c) * rpc;
    MMT_CHECK(e.first_record == first && e.record_count == std::min(rpc, n - first), FormatError, where(),
              ": holds records [", e.first_record, ", +", e.record_count, ") but chunks of ", rpc,
              " records put records [", first, ", +", std::min(rpc, n - first), ") there");
  } else {
    // Chunks closed by size hold records in order, c + 1 starting where c ends. The search for
    // a record trusts neither entry, but a table whose neighbours overlap would still read:
    // a record two chunks claim comes from the later one, and the earlier one's copy is never
    // seen (verify refuses such a table; reading, exporting or repacking it must too). So the
    // neighbours' records are compared with this entry's; one that disagrees is checked
    // against its own checksum first, so that a damaged neighbour is named, not this chunk.
    const std::byte* table = base + chunk_table_offset;
    const auto neighbour = [&](int64_t k) {
      return guarded([&] { return format::peek_chunk_entry(table + k * format::kChunkEntryBytes); });
    };
    const auto check_neighbour = [&](int64_t k) {
      try {
        (void)guarded([&] { return format::decode_chunk_entry(table + k * format::kChunkEntryBytes, static_cast<uint64_t>(k)); });
      } catch (const FormatError&) {
        rethrow_in_file(path);
      }
    };
    if (c > 0) {
      const format::ChunkEntry previous = neighbour(c - 1);
      const bool in_order = previous.first_record <= n && previous.record_count <= n - previous.first_record &&
                            e.first_record == previous.first_record + previous.record_count;
      if (!in_order) check_neighbour(c - 1);
      MMT_CHECK(in_order, FormatError, where(), ": starts at record ", e.first_record, " but chunk ", c - 1,
                " (by its table entry) holds records [", previous.first_record, ", +", previous.record_count,
                "); chunks hold records in order, each starting where the one before ends");
    } else {
      MMT_CHECK(e.first_record == 0, FormatError, where(), ": starts at record ", e.first_record,
                " but the first chunk starts at record 0");
    }
    if (c + 1 < chunk_count) {
      const format::ChunkEntry next = neighbour(c + 1);
      const bool in_order = next.first_record == e.first_record + e.record_count;
      if (!in_order) check_neighbour(c + 1);
      MMT_CHECK(in_order, FormatError, where(), ": holds records [", e.first_record, ", +", e.record_count,
                ") but chunk ", c + 1, " (by its table entry) starts at record ", next.first_record,
                "; chunks hold records in order, each starting where the one before ends");
    }
  }
  const uint64_t alignment = preamble.alignment;
  MMT_CHECK(e.file_offset % alignment == 0 && e.file_offset >= static_cast<uint64_t>(data_offset) &&
                format::in_bounds(e.file_offset, e.stored_bytes, static_cast<uint64_t>(schema_offset)),
            FormatError, where(), ": payload [", e.file_offset, ", +", e.stored_bytes, ") is not a ",
            alignment, "-aligned range inside the data region [", data_offset, ", ", schema_offset, ")");
  const Codec codec_used = static_cast<Codec>(e.codec);
  if (codec_used == Codec::None) {
    MMT_CHECK(e.decoded_bytes == e.stored_bytes, FormatError, where(), ": uncompressed chunk stores ",
              e.stored_bytes, " bytes but declares ", e.decoded_bytes, " decoded bytes");
  } else {
    MMT_CHECK(e.decoded_bytes <= static_cast<uint64_t>(format::kMaxDecodedChunkBytes), FormatError, where(),
              ": declares ", e.decoded_bytes, " decoded bytes, over the limit of ", format::kMaxDecodedChunkBytes,
              " (a decompression bomb or a corrupt entry)");
    MMT_CHECK(e.stored_bytes >= 1, FormatError, where(), ": compressed chunk with no stored bytes");
    const uint64_t expansion = codec_used == Codec::LZ4 ? format::kMaxLz4Expansion : format::kMaxZstdExpansion;
    MMT_CHECK((e.decoded_bytes + expansion - 1) / expansion <= e.stored_bytes, FormatError, where(), ": declares ",
              e.decoded_bytes, " decoded bytes from ", e.stored_bytes, " stored, more than ", to_string(codec_used),
              " can make of them (", expansion, " per stored byte)");
  }
  int64_t fixed_bytes = 0;
  MMT_CHECK(format::checked_mul(e.record_count, record_stride_bytes, &fixed_bytes) &&
                static_cast<uint64_t>(fixed_bytes) <= e.decoded_bytes,
            FormatError, where(), ": ", e.record_count, " records of ", record_stride_bytes,
            " bytes do not fit in its ", e.decoded_bytes, " decoded bytes");
  if (layout.ragged_fields.empty()) {
    MMT_CHECK(static_cast<uint64_t>(fixed_bytes) == e.decoded_bytes, FormatError, where(), ": decodes to ",
              e.decoded_bytes, " bytes but ", e.record_count, " fixed records take ", fixed_bytes);
  } else {
    int64_t least = 0;
    MMT_CHECK(format::checked_mul(e.record_count, min_decoded_bytes_per_record, &least) &&
                  static_cast<uint64_t>(least) <= e.decoded_bytes,
              FormatError, where(), ": ", e.record_count, " records take at least ", min_decoded_bytes_per_record,
              " bytes each (fixed values, value ends and extents), more than its ", e.decoded_bytes, " decoded bytes");
  }
  if (contiguous) {
    // Records of a contiguous file are read straight from the mapping: a compressed chunk
    // there would be served as values.
    MMT_CHECK(codec_used == Codec::None, FormatError, where(), ": is ", to_string(codec_used),
              "-compressed, but the contiguous layout stores every chunk uncompressed");
    MMT_CHECK(e.file_offset == static_cast<uint64_t>(data_offset + static_cast<int64_t>(e.first_record) * record_stride_bytes),
              FormatError, where(), ": at byte offset ", e.file_offset, " but the contiguous layout puts it at ",
              data_offset + static_cast<int64_t>(e.first_record) * record_stride_bytes);
  }
  return e;
}

format::ChunkEntry Dataset::Impl::validate_chunk(int64_t c, bool force_payload_check) const {
  format::ChunkEntry e = check_entry(c);
  // A compressed chunk is read in full to be decoded, so hashing it costs little; hashing an
  // uncompressed chunk would read all of it to serve one zero-copy record (opt-in).
  const bool required = options.verify_checksums &&
                        (static_cast<Codec>(e.codec) != Codec::None || options.verify_uncompressed);
  const bool verify_payload = force_payload_check || required;
  if (verify_payload) {
    uint64_t actual = guarded([&] {
      return format::payload_checksum(base + e.file_offset, static_cast<int64_t>(e.stored_bytes), static_cast<uint64_t>(c));
    });
    MMT_CHECK(actual == e.payload_checksum, ChecksumError, path, ": chunk ", c, " (byte offset ", e.file_offset,
              ", ", e.stored_bytes, " stored bytes): payload checksum mismatch; the chunk is corrupt or "
              "was moved from another position");
  }
  // Everything the options require is checked: remember it. One thread stores the slot; a
  // thread that loses the race already holds the same entry.
  ValidatedChunk& slot = validated_chunks.get()[c];
  uint8_t expected = 0;
  if (std::atomic_ref<uint8_t>(slot.state).compare_exchange_strong(expected, 1, std::memory_order_acquire)) {
    slot.store(e);
    std::atomic_ref<uint8_t>(slot.state).store(2, std::memory_order_release);
    validated_count.fetch_add(1, std::memory_order_release);
  }
  return e;
}

UntypedStorage Dataset::Impl::decode_chunk(int64_t c, const format::ChunkEntry& e) const {
  const auto nbytes = static_cast<int64_t>(e.decoded_bytes);
  const std::string what = detail::str("chunk ", c, " (byte offset ", e.file_offset, ")");
  // Decoded chunks are shared through the cache by every reader of the file, so they are
  // handed out read-only, as the mapping is: a view's mutable_data_ptr() throws instead of
  // changing what other threads and later reads see.
  const auto rounded = static_cast<size_t>(std::max<int64_t>(64, (nbytes + 63) / 64 * 64));
  std::unique_ptr<std::byte, void (*)(void*)> out(static_cast<std::byte*>(std::aligned_alloc(64, rounded)), std::free);
  MMT_CHECK(out != nullptr, Error, "out of memory: decoding ", what, " of ", path, " needs ", nbytes, " bytes");
  try {
    guarded([&] {
      detail::decompress(static_cast<Codec>(e.codec), base + e.file_offset, static_cast<int64_t>(e.stored_bytes),
                         out.get(), nbytes, what);
    });
  } catch (const FormatError&) {
    rethrow_in_file(path);
  }
  UntypedStorage decoded = UntypedStorage::from_blob(
      out.get(), nbytes,
      [memory = decoded_memory, nbytes](void* p) {
        std::free(p);
        memory->live.fetch_sub(nbytes, std::memory_order_relaxed);
      },
      kCPU, /*read_only=*/true);
  out.release();  // the storage frees it now
  decoded_memory->add(nbytes);
  return decoded;
}

std::optional<ChunkRef> Dataset::Impl::cached_chunk_ref(int64_t c) const {
  // Checked first: a chunk this thread has just read was validated then.
  if (last_chunk.owner == instance_id && last_chunk.ref.index == c) {
    cache->note_hit();
    return last_chunk.ref;
  }
  const format::ChunkEntry e = validated_entry(c);
  ChunkRef ref = ref_without_storage(e, c);
  if (static_cast<Codec>(e.codec) == Codec::None) {
    ref.storage = file;
    ref.payload_offset_bytes = static_cast<int64_t>(e.file_offset);
    return ref;
  }
  std::optional<UntypedStorage> decoded = cache->find(cache_key(c));
  if (!decoded) return std::nullopt;
  ref.storage = *std::move(decoded);
  last_chunk.owner = instance_id;
  last_chunk.ref = ref;
  return ref;
}

ChunkRef Dataset::Impl::chunk_ref(int64_t c) const {
  if (std::optional<ChunkRef> cached = cached_chunk_ref(c)) return *std::move(cached);
  // A compressed chunk the cache does not hold (its entry was validated just now).
  const format::ChunkEntry e = validated_entry(c);
  ChunkRef ref = ref_without_storage(e, c);
  ref.storage = cache->get_or_decode(cache_key(c), [&] {
    // Chunks decoded in order: ask the kernel for the next one while this one decodes.
    // A hint only: a damaged next entry is reported when that chunk is read, not here.
    if (last_decoded_chunk.exchange(c, std::memory_order_relaxed) == c - 1 && c + 1 < chunk_count) {
      try {
        const format::ChunkEntry next = check_entry(c + 1);
        file.advise(AccessAdvice::WillNeed, static_cast<int64_t>(next.file_offset), static_cast<int64_t>(next.stored_bytes));
      } catch (const Error&) {
      }
    }
    return decode_chunk(c, e);
  });
  last_chunk.owner = instance_id;
  last_chunk.ref = ref;
  return ref;
}

void Dataset::Impl::verify_ragged_structure(const ChunkRef& ref, int64_t* sizes) const {
  int64_t end_of_sections = ref.record_count * record_stride_bytes;
  format::RaggedSection section;
  for (size_t k = 0; k < layout.ragged_fields.size(); ++k) {
    const size_t f = layout.ragged_fields[k];
    section = next_ragged_section(ref, k == 0 ? nullptr : &section, f);
    // Every record's value range and extents, checked as get() checks them: ranges that
    // follow one another inside the section, extents that account for every value.
    for (int64_t r = 0; r < ref.record_count; ++r) (void)read_ragged_value(ref, section, ref.first_record + r, f, sizes);
    end_of_sections = section.end_offset;
  }
  MMT_CHECK(end_of_sections == ref.decoded_bytes, FormatError, path, ": chunk ", ref.index, " decodes to ",
            ref.decoded_bytes, " bytes but its records end at byte ", end_of_sections);
}

void Dataset::Impl::verify_bool_values(const ChunkRef& ref) const {
  const std::byte* chunk = ref.storage.data() + ref.payload_offset_bytes;
  const auto refuse_non_bool = [&](const std::byte* begin, int64_t count, size_t f, const char* where) {
    const int64_t at = detail::first_invalid_bool(begin, count);
    MMT_CHECK(at < 0, FormatError, path, ": chunk ", ref.index, ", field '", (*schema)[f].name,
              "': a bool value byte at decoded byte ", begin + at - chunk, " (", where, ") holds ",
              static_cast<int>(static_cast<uint8_t>(begin[at])), "; bool values are 0 or 1");
  };
  format::RaggedSection section;
  bool past_first_ragged = false;
  for (size_t f = 0; f < plans.size(); ++f) {
    const FieldPlan& plan = plans[f];
    if (!plan.fixed) {
      section = next_ragged_section(ref, past_first_ragged ? &section : nullptr, f);
      past_first_ragged = true;
      if (plan.dtype == kBool)
        refuse_non_bool(chunk + section.values_offset, section.end_offset - section.values_offset, f, "ragged values");
      continue;
    }
    if (plan.dtype != kBool) continue;
    for (int64_t r = 0; r < ref.record_count; ++r)
      refuse_non_bool(chunk + r * record_stride_bytes + plan.offset_bytes, plan.value_bytes, f, "a fixed value");
  }
}

// ---- Dataset methods that work chunk by chunk ----
void Dataset::verify() const {
  if (concat_) {  // each part names its own path in what it finds
    for (const Dataset& part : concat_->parts) part.verify();
    return;
  }
  const Impl& d = checked_impl(impl_);
  // A file cut short under the reader faults past the page its new end falls in (the guard
  // names that), but the rest of that page reads as zeros: checked by size first, so the cut
  // is named as one rather than as the damage its zeros look like.
  struct stat now {};
  if (d.file_inode != 0 && ::stat(d.absolute_path.c_str(), &now) == 0 && static_cast<uint64_t>(now.st_dev) == d.file_device &&
      static_cast<uint64_t>(now.st_ino) == d.file_inode)
    MMT_CHECK(now.st_size == d.file_bytes, IoError, d.path, ": the file is ", now.st_size, " bytes now, ", d.file_bytes,
              " when it was opened: it was truncated or changed while mapped; reopen it");
  d.file.advise(AccessAdvice::Sequential);
  // The reader's own hint comes back however verify() ends, a corrupt chunk included.
  struct RestoreAdvice {
    const Impl& d;
    ~RestoreAdvice() {
      try {
        d.apply_reader_advice();
      } catch (...) {  // a hint: nothing to report from a destructor
      }
    }
  } restore_advice{d};
  // Padding is zero (FORMAT.md): readers never look at it, but a flipped byte there is damage
  // all the same, and verify() promises every byte outside the payloads it hashes is checked.
  const auto first_nonzero = [&](uint64_t begin, uint64_t end) {
    const std::byte* bytes = d.base;
    return d.guarded([&] {
      for (uint64_t at = begin; at < end; ++at)
        if (bytes[at] != std::byte{0}) return at;
      return end;
    });
  };
  const auto check_zero_padding = [&](uint64_t begin, uint64_t end, const char* where) {
    const uint64_t nonzero = first_nonzero(begin, end);
    MMT_CHECK(nonzero == end, FormatError, d.path, ": padding byte at offset ", nonzero, " (", where, ") is not zero");
  };
  check_zero_padding(static_cast<uint64_t>(format::kPreambleBytes), static_cast<uint64_t>(d.data_offset),
                     "before the first chunk");
  int64_t expected_first = 0;
  uint64_t previous_end = static_cast<uint64_t>(d.data_offset);
  size_t most_dims = 0;
  for (const Field& field : d.schema->fields()) most_dims = std::max(most_dims, field.shape.size());
  std::vector<int64_t> value_sizes(most_dims);  // a ragged value's sizes, as verify reads them
  for (int64_t c = 0; c < d.chunk_count; ++c) {
    const format::ChunkEntry e = d.validate_chunk(c, /*force_payload_check=*/true);
    MMT_CHECK(e.first_record == static_cast<uint64_t>(expected_first), FormatError, d.path, ": chunk ", c,
              " starts at record ", e.first_record, ", expected ", expected_first, " (chunks hold records in order)");
    MMT_CHECK(e.file_offset >= previous_end, FormatError, d.path, ": chunk ", c, " at byte offset ", e.file_offset,
              " overlaps the previous chunk, which ends at byte ", previous_end);
    if (const uint64_t nonzero = first_nonzero(previous_end, e.file_offset); nonzero != e.file_offset) {
      // Bytes before this chunk's payload: damage, or a later chunk's payload placed before
      // it, which is named as such (looked for only now, on the way to an error).
      for (int64_t later = c + 1; later < d.chunk_count; ++later) {
        const format::ChunkEntry l = d.check_entry(later);
        MMT_CHECK(nonzero < l.file_offset || nonzero - l.file_offset >= l.stored_bytes, FormatError, d.path,
                  ": chunk ", later, "'s payload (at byte offset ", l.file_offset, ") lies before chunk ", c,
                  "'s (at byte offset ", e.file_offset, "); payloads must lie in the chunk table's order");
      }
      check_zero_padding(previous_end, e.file_offset, "between chunks");
    }
    expected_first += e.record_count;
    previous_end = e.file_offset + e.stored_bytes;
    ChunkRef ref;
    ref.first_record = static_cast<int64_t>(e.first_record);
    ref.record_count = e.record_count;
    ref.decoded_bytes = static_cast<int64_t>(e.decoded_bytes);
    ref.index = c;
    if (static_cast<Codec>(e.codec) == Codec::None) {
      ref.storage = d.file;
      ref.payload_offset_bytes = static_cast<int64_t>(e.file_offset);
    } else {
      ref.storage = d.decode_chunk(c, e);  // not through the cache: verify must not evict the working set
    }
    if (!d.layout.ragged_fields.empty()) {
      int64_t* sizes = value_sizes.data();  // owned out here: the guarded section owns nothing
      d.guarded_if_mapped(ref, [&] { d.verify_ragged_structure(ref, sizes); });
    }
    if (d.has_bool_field) d.guarded_if_mapped(ref, [&] { d.verify_bool_values(ref); });
  }
  MMT_CHECK(expected_first == d.record_count, FormatError, d.path, ": the chunks hold ", expected_first,
            " records but the footer says ", d.record_count);
  check_zero_padding(previous_end, static_cast<uint64_t>(d.schema_offset), "after the last chunk");
}

void Dataset::prefetch(std::span<const int64_t> indices) const {
  if (concat_) return concat_->prefetch(indices, {}, /*every_field=*/true);
  const Impl& d = checked_impl(impl_);
  std::vector<size_t> every_field(d.schema->size());
  for (size_t f = 0; f < every_field.size(); ++f) every_field[f] = f;
  d.prefetch(indices, every_field);
}

void Dataset::prefetch(std::span<const int64_t> indices, std::span<const std::string> fields) const {
  if (concat_) return concat_->prefetch(indices, fields, /*every_field=*/false);
  const Impl& d = checked_impl(impl_);
  std::vector<size_t> chosen;
  for (const std::string& name : fields) chosen.push_back(d.schema->index_of(name));  // ValueError lists the fields
  d.prefetch(indices, chosen);
}

bool Dataset::Impl::batch_looks_cold(std::span<const int64_t> indices, std::span<const size_t> fields) const noexcept {
  // The largest field: a value already read (labels, say) says nothing about the images.
  const FieldPlan* largest = nullptr;
  for (size_t f : fields)
    if (plans[f].fixed && (largest == nullptr || plans[f].value_bytes > largest->value_bytes)) largest = &plans[f];
  if (largest == nullptr || largest->value_bytes == 0 || indices.empty()) return false;
  const int64_t page = detail::page_bytes();
  // Whether a page of bytes [begin, end) of the file is missing from the page cache: every
  // page up to 64 (one mincore call), else the first, middle and last. The mapping starts on
  // a page boundary, and every range below lies inside it (the index and the chunk entry are
  // checked first).
  const auto missing = [&](int64_t begin, int64_t end) {
    constexpr int64_t kMaxPages = 64;
    std::array<unsigned char, kMaxPages> resident{};
    const int64_t first_page = begin / page, last_page = (end - 1) / page;
    const auto any_missing = [&](int64_t from, int64_t pages) {
      resident.fill(1);
      if (::mincore(const_cast<std::byte*>(base + from * page), static_cast<size_t>(pages * page), resident.data()) != 0)
        return false;
      return std::any_of(resident.begin(), resident.begin() + pages, [](unsigned char r) { return (r & 1) == 0; });
    };
    if (last_page - first_page < kMaxPages) return any_missing(first_page, last_page - first_page + 1);
    return any_missing(first_page, 1) || any_missing((first_page + last_page) / 2, 1) || any_missing(last_page, 1);
  };
  try {
    const size_t n = indices.size();
    for (const size_t k : {size_t{0}, n / 4, n / 2, 3 * n / 4}) {  // spread: a batch may start in cached records
      const int64_t i = normalize_index(indices[k], "get_batch");
      int64_t offset = 0;
      if (contiguous) {
        offset = data_offset + i * record_stride_bytes + largest->offset_bytes;
      } else {
        int64_t c = 0;
        const format::ChunkEntry e = entry_holding(i, &c);
        if (static_cast<Codec>(e.codec) != Codec::None) {  // read whole: its first and last pages
          if (cache->holds(cache_key(c))) continue;
          if (missing(static_cast<int64_t>(e.file_offset), static_cast<int64_t>(e.file_offset + e.stored_bytes)))
            return true;
          continue;
        }
        offset = static_cast<int64_t>(e.file_offset) + (i - static_cast<int64_t>(e.first_record)) * record_stride_bytes +
                 largest->offset_bytes;
      }
      // The whole value: its first and last pages may be cached with its neighbours' fields
      // (labels read already), and a 150 KB image spans 37.
      if (missing(offset, offset + largest->value_bytes)) return true;
    }
  } catch (...) {
  }
  return false;
}

void Dataset::Impl::prefetch(std::span<const int64_t> indices, std::span<const size_t> fields) const {
  // Byte ranges of the file, merged while they touch the same or the next page, one madvise
  // for each merged range.
  int64_t pending_begin = -1, pending_end = -1;
  auto flush = [&] {
    if (pending_begin >= 0) file.advise(AccessAdvice::WillNeed, pending_begin, pending_end - pending_begin);
    pending_begin = pending_end = -1;
  };
  auto hint = [&](int64_t begin, int64_t end) {
    if (end <= begin) return;
    constexpr int64_t kPage = 4096;
    if (pending_begin >= 0 && begin <= pending_end + kPage && end >= pending_begin - kPage) {
      pending_begin = std::min(pending_begin, begin);
      pending_end = std::max(pending_end, end);
    } else {
      flush();
      pending_begin = begin;
      pending_end = end;
    }
  };
  std::vector<const FieldPlan*> fixed;
  std::vector<char> ragged_chosen(layout.ragged_fields.size(), 0);  // by position among the ragged fields
  size_t ragged_levels = 0;  // sections to locate in each chunk: up to the last chosen one
  for (size_t f : fields) {
    if (plans[f].fixed) {
      fixed.push_back(&plans[f]);
    } else {
      ragged_chosen[plans[f].ragged_index] = 1;
      ragged_levels = std::max(ragged_levels, plans[f].ragged_index + 1);
    }
  }
  if (fields.empty()) {  // nothing to read; the indices are still checked, as get() would
    for (int64_t index : indices) normalize_index(index, "prefetch");
    return;
  }
  // Uncompressed chunks with ragged fields to hint, each once, and the records read there.
  struct RaggedChunk {
    int64_t index = 0;
    int64_t file_offset = 0;
    int64_t decoded_bytes = 0;
    int64_t record_count = 0;
    int64_t header = 0;  // decoded offset of the section being located
    format::RaggedSection section;  // the section located last
  };
  struct RaggedRecord {
    size_t chunk = 0;  // position in ragged_chunks
    int64_t row = 0;
  };
  std::vector<RaggedChunk> ragged_chunks;
  std::unordered_map<int64_t, size_t> ragged_chunk_at;  // chunk index -> position in ragged_chunks
  std::vector<RaggedRecord> ragged_records;
  std::unordered_set<int64_t> whole_chunks_hinted;  // compressed chunks, hinted once however often indexed
  int64_t last_chunk_seen = -1;
  format::ChunkEntry last_entry{};
  for (int64_t index : indices) {
    const int64_t i = normalize_index(index, "prefetch");
    if (contiguous) {
      const int64_t slot = data_offset + i * record_stride_bytes;
      for (const FieldPlan* plan : fixed) hint(slot + plan->offset_bytes, slot + plan->offset_bytes + plan->value_bytes);
      continue;
    }
    const int64_t c = chunk_of(i);
    const format::ChunkEntry e = c == last_chunk_seen ? last_entry : check_entry(c);
    // A table whose chunks vary in size is searched: a damaged one may point elsewhere.
    check_chunk_holds(c, static_cast<int64_t>(e.first_record), e.record_count, i);
    last_chunk_seen = c;
    last_entry = e;
    const int64_t chunk_offset = static_cast<int64_t>(e.file_offset);
    if (static_cast<Codec>(e.codec) != Codec::None) {
      // Read whole to be decoded, and not at all when its decoded bytes are cached (or being
      // decoded).
      if (!cache->holds(cache_key(c)) && whole_chunks_hinted.insert(c).second)
        hint(chunk_offset, chunk_offset + static_cast<int64_t>(e.stored_bytes));
      continue;
    }
    // Uncompressed: the chosen fields' own bytes, not the chunk's (check_entry made sure the
    // chunk's records fit its stored bytes).
    const int64_t row = i - static_cast<int64_t>(e.first_record);
    const int64_t slot = chunk_offset + row * record_stride_bytes;
    for (const FieldPlan* plan : fixed) hint(slot + plan->offset_bytes, slot + plan->offset_bytes + plan->value_bytes);
    if (ragged_levels == 0) continue;
    const auto [at, inserted] = ragged_chunk_at.try_emplace(c, ragged_chunks.size());
    if (inserted) {
      RaggedChunk chunk;
      chunk.index = c;
      chunk.file_offset = chunk_offset;
      chunk.decoded_bytes = static_cast<int64_t>(e.decoded_bytes);
      chunk.record_count = e.record_count;
      try {
        chunk.header = format::first_ragged_section_offset(chunk.decoded_bytes, chunk.record_count,
                                                           record_stride_bytes, c);
      } catch (const FormatError&) {
        rethrow_in_file(path);
      }
      ragged_chunks.push_back(chunk);
    }
    ragged_records.push_back({at->second, row});
  }
  if (ragged_records.empty()) {
    flush();
    return;
  }
  // A ragged section's place is known only once the one before it is read (its last value
  // end), and a value's place only once its value ends are read. Reading those one chunk at a
  // time would fault once a chunk and field, in series: a random batch over a large file
  // touches about one chunk a record. So the sections are located level by level across all
  // the batch's chunks: each round hints every chunk's entries it will read, then reads them
  // while the kernel brings them in together.
  std::vector<uint64_t> value_ends(2 * ragged_records.size());  // [first, last) of each record, in elements
  for (size_t k = 0; k < ragged_levels; ++k) {
    const size_t f = layout.ragged_fields[k];
    const int64_t vdims = (*schema)[f].variable_dims();
    // Round 1: the section's last value end, and the records' value ends and extents when
    // the field is chosen. Only entries inside the chunk are hinted: locating the section
    // checks its header and reports one that runs past.
    std::vector<char> fits(ragged_chunks.size());
    for (size_t n = 0; n < ragged_chunks.size(); ++n) {
      const RaggedChunk& chunk = ragged_chunks[n];
      int64_t header_end = 0;
      fits[n] = format::ragged_header_fits(chunk.decoded_bytes, chunk.record_count, vdims, chunk.header, &header_end);
      if (!fits[n]) continue;
      const int64_t last_end = chunk.file_offset + chunk.header + 8 * (chunk.record_count - 1);
      hint(last_end, last_end + 8);
    }
    if (ragged_chosen[k]) {
      for (const RaggedRecord& record : ragged_records) {
        if (!fits[record.chunk]) continue;
        const RaggedChunk& chunk = ragged_chunks[record.chunk];
        const int64_t table = chunk.file_offset + chunk.header;
        hint(table + 8 * std::max<int64_t>(record.row - 1, 0), table + 8 * (record.row + 1));  // its value ends
        const int64_t extents = table + 8 * chunk.record_count + 8 * record.row * vdims;
        hint(extents, extents + 8 * vdims);  // and its extents, which reading the record needs
      }
    }
    flush();
    // Round 2: read them. Locating checks the section as get() does; the guarded sections
    // own nothing (mapping_guard.h): they write into vectors that live out here.
    RaggedChunk* chunks = ragged_chunks.data();
    const size_t chunk_count = ragged_chunks.size();
    try {
      guarded([&] {
        for (size_t n = 0; n < chunk_count; ++n) {
          RaggedChunk& chunk = chunks[n];
          chunk.section = format::ragged_section_at(base + chunk.file_offset, chunk.decoded_bytes,
                                                    chunk.record_count, (*schema)[f], chunk.header, chunk.index);
          chunk.header = format::next_section_offset(chunk.section.end_offset);
        }
      });
    } catch (const FormatError&) {
      rethrow_in_file(path);
    }
    if (!ragged_chosen[k]) continue;
    const RaggedRecord* records = ragged_records.data();
    const size_t record_count = ragged_records.size();
    uint64_t* ends = value_ends.data();
    guarded([&] {
      for (size_t r = 0; r < record_count; ++r) {
        const RaggedChunk& chunk = chunks[records[r].chunk];
        const std::byte* table = base + chunk.file_offset + chunk.section.ends_offset;
        const int64_t row = records[r].row;
        ends[2 * r] = row == 0 ? 0 : format::load_u64(table + 8 * (row - 1));
        ends[2 * r + 1] = format::load_u64(table + 8 * row);
      }
    });
    // The values, hinted now: they arrive while the next level is located. A range outside
    // its section is not hinted: reading the record reports it.
    const uint64_t element_bytes = static_cast<uint64_t>(plans[f].element_bytes);
    for (size_t r = 0; r < record_count; ++r) {
      const RaggedChunk& chunk = chunks[records[r].chunk];
      const format::RaggedSection& section = chunk.section;
      const uint64_t first = ends[2 * r], last = ends[2 * r + 1];
      const uint64_t values = static_cast<uint64_t>(section.end_offset - section.values_offset) / element_bytes;
      if (first >= last || last > values) continue;
      const int64_t values_at = chunk.file_offset + section.values_offset;
      hint(values_at + static_cast<int64_t>(first * element_bytes), values_at + static_cast<int64_t>(last * element_bytes));
    }
  }
  flush();
}

}  // namespace mmt
