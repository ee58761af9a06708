// Dataset::open: maps the file and validates what open reads, all of it fixed-size: the
// preamble, the footer, the schema block and, when there are chunks, the last chunk entry.
// Nothing here grows with the record count.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "checksum.h"
#include "dataset_concat.h"
#include "dataset_impl.h"
#include "page_cache.h"
#include "mmtensor/error.h"

namespace mmt {
namespace {

std::atomic<uint64_t> next_instance_id{1};

std::string in_file(const std::string& path, const std::string& message) {
  return detail::str(path, ": ", message);
}

}  // namespace

std::shared_ptr<const Dataset::Impl> Dataset::Impl::open(const std::string& path, const ReaderOptions& options,
                                                          const SharedCache* shared_cache) {
  MMT_CHECK(options.cache_bytes >= 0, ValueError, "ReaderOptions::cache_bytes must be >= 0, got ",
            options.cache_bytes);
  MMT_CHECK(options.read_ahead == ReadAhead::Auto || options.read_ahead == ReadAhead::Always ||
                options.read_ahead == ReadAhead::Never,
            ValueError, "ReaderOptions::read_ahead must be Auto, Always or Never, got ",
            static_cast<int>(options.read_ahead));
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    int err = errno;
    throw IoError(detail::str("cannot open dataset ", path, ": ", std::strerror(err)), err);
  }
  MMT_CHECK(S_ISREG(st.st_mode), IoError, "cannot open dataset ", path, ": not a regular file");
  MMT_CHECK(st.st_size > 0, FormatError, path, ": empty file, not an mmtensor dataset");

  auto impl = std::make_shared<Impl>();
  impl->path = path;
  std::error_code no_working_folder;  // removed under the process: the path as given
  const std::filesystem::path absolute = std::filesystem::absolute(path, no_working_folder);
  impl->absolute_path = no_working_folder ? path : absolute.string();
  impl->options = options;
  try {
    impl->file = UntypedStorage::map_file(path, MapMode::ReadOnly);
  } catch (const ValueError& e) {
    throw IoError(detail::str("cannot map dataset ", path, ": ", e.what()));
  }
  // The open's own reads (preamble, footer, schema, a chunk entry or two) are a few pages at
  // either end of the file: made without the kernel's read-around, which on a disk with a
  // large read_ahead_kb reads megabytes around each (16 MB an open at 8 MiB, paid again for
  // every shard of a set opened together). The reader's advice applies once they are done.
  impl->file.advise(AccessAdvice::Random);
  impl->base = impl->file.data();
  impl->file_bytes = impl->file.nbytes();
  // The stat above only words the common errors; the mapping's own size is the truth (a
  // writer may have renamed another file onto the path in between).
  MMT_CHECK(impl->file_bytes > 0, FormatError, path, ": empty file, not an mmtensor dataset");
  // Every read of the mapping here is guarded, as the engine's later ones are: a file cut
  // short under the open is an IoError naming it, not a SIGBUS.
  try {
    impl->guarded([&] {
      impl->preamble = format::decode_preamble(impl->base, impl->file_bytes);
      impl->footer = format::decode_footer(impl->base, impl->file_bytes, impl->preamble);
    });
  } catch (const FormatError& e) {
    if (dynamic_cast<const ChecksumError*>(&e)) throw ChecksumError(in_file(path, e.what()));
    throw FormatError(in_file(path, e.what()));
  }
  const format::Footer& footer = impl->footer;
  impl->record_count = static_cast<int64_t>(footer.record_count);
  impl->chunk_count = static_cast<int64_t>(footer.chunk_count);
  impl->records_per_chunk = static_cast<int64_t>(impl->preamble.records_per_chunk);
  impl->record_stride_bytes = static_cast<int64_t>(impl->preamble.record_stride_bytes);
  impl->data_offset = format::data_offset(impl->preamble);
  impl->schema_offset = static_cast<int64_t>(footer.schema_offset);
  impl->chunk_table_offset = static_cast<int64_t>(footer.chunk_table_offset);

  // The schema block: capped by decode_footer before anything is allocated for it. Copied
  // once, then hashed and parsed from the copy: the bytes parsed are the bytes checked, even
  // if the file changes under the mapping.
  std::string schema_text(static_cast<size_t>(footer.schema_bytes), '\0');
  int64_t nonzero_padding = -1;
  impl->guarded([&] {
    std::memcpy(schema_text.data(), impl->base + impl->schema_offset, schema_text.size());
    for (int64_t i = impl->schema_offset + static_cast<int64_t>(footer.schema_bytes); i < impl->chunk_table_offset; ++i)
      if (impl->base[i] != std::byte{0}) {
        nonzero_padding = i;
        break;
      }
  });
  MMT_CHECK(detail::checksum64(schema_text.data(), schema_text.size()) == footer.schema_checksum, ChecksumError,
            path, ": schema block checksum mismatch (byte offset ", impl->schema_offset, ", ",
            footer.schema_bytes, " bytes)");
  MMT_CHECK(nonzero_padding < 0, FormatError, path, ": padding byte at offset ", nonzero_padding,
            " before the chunk table is not zero");
  format::SchemaBlock block;
  try {
    block = format::decode_schema_block(schema_text, impl->schema_offset);
    impl->layout = format::compute_record_layout(block.schema);
  } catch (const Error& e) {
    throw FormatError(in_file(path, e.what()));
  }
  MMT_CHECK(impl->layout.record_stride_bytes == impl->record_stride_bytes, FormatError, path,
            ": the preamble's record_stride_bytes is ", impl->record_stride_bytes, " but the schema's "
            "record layout needs ", impl->layout.record_stride_bytes);
  // Saturated: with no records the stride is not capped below, and nothing uses the figure.
  impl->min_decoded_bytes_per_record = impl->record_stride_bytes;
  for (size_t f : impl->layout.ragged_fields)
    if (!format::checked_add(impl->min_decoded_bytes_per_record, 8 * (1 + block.schema[f].variable_dims()),
                             &impl->min_decoded_bytes_per_record))
      impl->min_decoded_bytes_per_record = INT64_MAX;
  // One record lies inside one chunk, and a chunk decodes to at most the data region (stored
  // as is) or kMaxDecodedChunkBytes (compressed): a larger stride is corrupt, and would size
  // the allocations of column() and get_batch() before any chunk is looked at.
  const int64_t data_region_bytes = impl->schema_offset - impl->data_offset;
  MMT_CHECK(impl->record_count == 0 ||
                impl->record_stride_bytes <= std::max(data_region_bytes, format::kMaxDecodedChunkBytes),
            FormatError, path, ": record_stride_bytes ", impl->record_stride_bytes,
            " cannot fit in a chunk (data region of ", data_region_bytes, " bytes, decoded chunks of at most ",
            format::kMaxDecodedChunkBytes, ")");
  const Schema& schema = block.schema;
  if (impl->preamble.flags & format::kFlagContiguousFixedLayout) {
    int64_t rpc = impl->records_per_chunk, stride = impl->record_stride_bytes, run = 0, data_bytes = 0;
    bool ok = schema.all_fixed() && rpc > 0 && format::checked_mul(rpc, stride, &run) &&
              run % static_cast<int64_t>(impl->preamble.alignment) == 0 &&
              format::checked_mul(impl->record_count, stride, &data_bytes) &&
              data_bytes <= impl->schema_offset - impl->data_offset;
    MMT_CHECK(ok, FormatError, path, ": the preamble claims the contiguous fixed layout, but the schema, "
              "chunk size or data region (", impl->schema_offset - impl->data_offset, " bytes for ",
              impl->record_count, " records of ", stride, " bytes) does not allow it");
    impl->contiguous = true;
  }
  size_t ragged_seen = 0;
  for (size_t f = 0; f < schema.size(); ++f) {
    const Field& field = schema[f];
    FieldPlan plan;
    plan.dtype = field.dtype;
    plan.element_bytes = element_size(field.dtype);
    plan.fixed = field.is_fixed();
    if (field.dtype == kBool) impl->has_bool_field = true;
    if (plan.fixed) {
      plan.offset_bytes = impl->layout.field_offset_bytes[f];
      plan.value_bytes = field.fixed_nbytes();
      plan.sizes = field.shape;
      plan.strides = field.value_strides(field.shape);
      plan.dense_row_major = plan.strides == contiguous_strides(plan.sizes);
    } else {
      plan.ragged_index = ragged_seen++;  // layout.ragged_fields lists them in schema order
    }
    impl->plans.push_back(std::move(plan));
  }
  impl->schema = std::make_shared<const Schema>(std::move(block.schema));
  impl->metadata = std::move(block.metadata);
  impl->codec = block.codec;
  impl->codec_named = block.codec_named;
  impl->writer = std::move(block.writer);
  if (impl->chunk_count > 0) {
    impl->validated_chunks.reset(
        static_cast<ValidatedChunk*>(std::calloc(static_cast<size_t>(impl->chunk_count), sizeof(ValidatedChunk))));
    MMT_CHECK(impl->validated_chunks, Error, path, ": out of memory for ", impl->chunk_count, " chunk slots");
  }
  if (impl->chunk_count > 0) {
    // The footer's record count is only bounded by the chunk count (up to 2^32 - 1 records
    // each). The last chunk must end it and pass every check of its entry (one entry read:
    // open stays O(1)), so the count cannot claim records that no chunk holds.
    const format::ChunkEntry last = impl->check_entry(impl->chunk_count - 1);
    MMT_CHECK(last.first_record + last.record_count == footer.record_count, FormatError, path, ": the last chunk (",
              impl->chunk_count - 1, ") ends at record ", last.first_record + last.record_count,
              " but the footer counts ", footer.record_count, " records");
  }
  if (shared_cache != nullptr) {
    impl->cache = shared_cache->cache;
    impl->cache_key_base = shared_cache->key_base;
    impl->decoded_memory = shared_cache->decoded_memory;
  } else {
    impl->cache = std::make_shared<detail::ChunkCache>(options.cache_bytes);
  }
  impl->read_ahead = std::make_unique<detail::ReadAheadPolicy>(options.read_ahead, /*auto_hints_from_start=*/false);
  // Asked of the path: a file renamed onto it since the stat above (a writer replacing the
  // dataset) may not be the one mapped, and then mincore is not relied on.
  struct stat now {};
  const bool path_names_the_stat_file =
      ::stat(path.c_str(), &now) == 0 && now.st_dev == st.st_dev && now.st_ino == st.st_ino;
  impl->mincore_reports_page_cache = detail::mincore_reports_page_cache(path, st.st_uid) && path_names_the_stat_file;
  if (path_names_the_stat_file && now.st_size == impl->file_bytes) {
    impl->file_device = static_cast<uint64_t>(st.st_dev);
    impl->file_inode = static_cast<uint64_t>(st.st_ino);
  }
  impl->instance_id = new_instance_id();
  impl->apply_reader_advice();
  return impl;
}

void Dataset::Impl::apply_reader_advice() const {
  if (options.advice == AccessAdvice::WillNeed || options.advice == AccessAdvice::DontNeed)
    file.advise(AccessAdvice::Normal);
  file.advise(options.advice);
}

uint64_t Dataset::Impl::new_instance_id() { return next_instance_id.fetch_add(1, std::memory_order_relaxed); }

// ---- Dataset: handle and accessors ----
Dataset::Dataset() = default;
Dataset::Dataset(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Dataset Dataset::open(const std::string& path, ReaderOptions options) {
  return Dataset(Impl::open(path, options));
}

int64_t Dataset::size() const { return concat_ ? concat_->size() : checked_impl(impl_).record_count; }
const Schema& Dataset::schema() const { return concat_ ? *concat_->schema : *checked_impl(impl_).schema; }
const Metadata& Dataset::metadata() const { return concat_ ? concat_->metadata : checked_impl(impl_).metadata; }
const std::string& Dataset::path() const { return concat_ ? concat_->path : checked_impl(impl_).path; }
const std::string& Dataset::absolute_path() const {
  return concat_ ? concat_->absolute_path : checked_impl(impl_).absolute_path;
}
const ReaderOptions& Dataset::options() const { return concat_ ? concat_->options : checked_impl(impl_).options; }
int64_t Dataset::num_chunks() const { return concat_ ? concat_->num_chunks() : checked_impl(impl_).chunk_count; }

uint64_t Dataset::fingerprint() const {
  if (concat_) {
    uint64_t hash = concat_->fingerprint.load(std::memory_order_relaxed);
    if (hash == 0) {
      hash = concat_->compute_fingerprint();
      concat_->fingerprint.store(hash, std::memory_order_relaxed);
    }
    return hash;
  }
  const Impl& d = checked_impl(impl_);
  uint64_t hash = d.fingerprint.load(std::memory_order_relaxed);
  if (hash != 0) return hash;
  // The chunk table and the footer: every chunk's place, sizes, codec and payload checksum,
  // the record count and the schema's checksum. Two threads may both compute it; they agree.
  const int64_t begin = d.chunk_table_offset;
  hash = d.guarded([&] { return detail::checksum64(d.base + begin, static_cast<size_t>(d.file_bytes - begin)); });
  hash = hash == 0 ? 1 : hash;  // 0 means "not computed yet"
  d.fingerprint.store(hash, std::memory_order_relaxed);
  return hash;
}

DatasetInfo Dataset::info() const {
  if (concat_) return concat_->info();
  const Impl& d = checked_impl(impl_);
  DatasetInfo info;
  info.format_version = d.preamble.format_version;
  info.records = d.record_count;
  info.chunks = d.chunk_count;
  info.file_bytes = d.file_bytes;
  info.alignment = static_cast<int64_t>(d.preamble.alignment);
  info.codec = d.codec;
  for (int64_t c = 0; c < d.chunk_count; ++c) {
    format::ChunkEntry entry = d.check_entry(c);
    if (!d.codec_named) {
      // Another writer's file whose schema block names no codec: the chunks' own, and
      // "differ" when they do (no level: a chunk does not record it).
      const CodecSpec chunk_codec{static_cast<Codec>(entry.codec), 0};
      if (c == 0) info.codec = chunk_codec;
      else if (chunk_codec.codec != info.codec.codec) info.codecs_differ = true;
    }
    // Entries are checked one by one, not against each other (verify() does that): a table
    // whose entries share payloads could sum past int64.
    MMT_CHECK(format::checked_add(info.stored_bytes, static_cast<int64_t>(entry.stored_bytes), &info.stored_bytes) &&
                  format::checked_add(info.decoded_bytes, static_cast<int64_t>(entry.decoded_bytes),
                                      &info.decoded_bytes),
              FormatError, d.path, ": the chunk sizes overflow int64 at chunk ", c,
              " (do chunks share their payloads? mmt verify says)");
  }
  return info;
}

ChunkInfo Dataset::chunk(int64_t chunk_index) const {
  if (concat_) return concat_->chunk(chunk_index);
  const Impl& d = checked_impl(impl_);
  MMT_CHECK(chunk_index >= 0 && chunk_index < d.chunk_count, IndexError, "chunk index ", chunk_index,
            " is out of range for a dataset of ", d.chunk_count, " chunks");
  // A validated chunk's entry is remembered: no read of the table (which a file truncated
  // under the reader may have lost) and no second check.
  const format::ChunkEntry entry = d.entry_without_validating(chunk_index);
  ChunkInfo info;
  info.index = chunk_index;
  info.first_record = static_cast<int64_t>(entry.first_record);
  info.record_count = entry.record_count;
  info.file_offset = static_cast<int64_t>(entry.file_offset);
  info.stored_bytes = static_cast<int64_t>(entry.stored_bytes);
  info.decoded_bytes = static_cast<int64_t>(entry.decoded_bytes);
  info.codec = static_cast<Codec>(entry.codec);
  info.checksum = entry.payload_checksum;
  return info;
}

int64_t Dataset::chunk_of(int64_t record_index) const {
  if (concat_) {
    const Location at = concat_->locate(record_index, "chunk_of");
    return concat_->first_chunk[at.part] + concat_->parts[at.part].chunk_of(at.index);
  }
  const Impl& d = checked_impl(impl_);
  // The binary search trusts the table's order: say which chunk holds the record only once
  // its entry says so (a disordered table is a FormatError, as on every read).
  int64_t c = 0;
  d.entry_holding(d.normalize_index(record_index, "chunk_of"), &c);
  return c;
}

CacheStats Dataset::cache_stats() const {
  if (concat_) return concat_->cache_stats();
  const Impl& d = checked_impl(impl_);
  CacheStats stats = d.cache->stats();
  stats.decoded_bytes_live = d.decoded_memory->live.load(std::memory_order_relaxed);
  stats.decoded_bytes_peak = d.decoded_memory->peak.load(std::memory_order_relaxed);
  return stats;
}

ReadAheadStats Dataset::read_ahead_stats() const {
  if (concat_) return concat_->read_ahead_stats();
  const Impl& d = checked_impl(impl_);
  return {.batches_read_ahead = d.read_ahead->batches_hinted(),
          .reading_ahead = d.read_ahead->hinting(),
          .batches_checked = d.read_ahead->batches_checked()};
}

void Dataset::advise(AccessAdvice advice) const {
  if (concat_) {
    for (const Dataset& part : concat_->parts) part.advise(advice);
    return;
  }
  checked_impl(impl_).file.advise(advice);
}

}  // namespace mmt
