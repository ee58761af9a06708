// DatasetWriter: records -> chunks -> (worker threads: codec, checksum) -> file, in order.
// The file layout is docs/FORMAT.md's; every byte leaves through file_io.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <numeric>
#include <thread>

#include "buffer_recycler.h"
#include "checksum.h"
#include "codec_engine.h"
#include "cpu_budget.h"
#include "file_io.h"
#include "fork_safety.h"
#include "format.h"
#include "import_util.h"
#include "mapping_guard.h"
#include "mmtensor/dataset_writer.h"
#include "mmtensor/error.h"
#include "strided_copy.h"
#include "temp_files.h"
#include "thread_pool.h"
#include "utf8.h"

namespace mmt {
namespace {

using format::ChunkEntry;

// How often a waiting writer asks WriterOptions::cancelled: a Ctrl-C is acted on within it.
constexpr std::chrono::milliseconds kCancelPollInterval{100};

// The schema block's "writer" entry.
constexpr const char* kWriterName = "mmtensor " MMT_VERSION_STRING;

// Metadata is stored as JSON text, which is UTF-8: refused here, naming the key, rather than
// at finish() by the JSON library.
void check_metadata_text(const std::string& key, const std::string& value) {
  const size_t in_key = detail::first_invalid_utf8(key);
  MMT_CHECK(in_key == std::string::npos, ValueError, "metadata key of ", key.size(),
            " bytes is not valid UTF-8 (byte ", in_key, ")");
  const size_t in_value = detail::first_invalid_utf8(value);
  MMT_CHECK(in_value == std::string::npos, ValueError, "metadata '", key, "': the value is not valid UTF-8 (byte ",
            in_value, " of ", value.size(), ")");
}

// A payload ready for the file, in the chunk's stored form.
struct EncodedChunk {
  detail::RecycledBuffer bytes;
  int64_t stored_bytes = 0;
  int64_t decoded_bytes = 0;
  uint64_t checksum = 0;
};

struct PendingChunk {
  int64_t first_record = 0;
  int64_t record_count = 0;
  std::future<EncodedChunk> result;
};

// The records of the chunk being filled: the fixed region, and one growing column per
// ragged field.
struct ChunkBuilder {
  struct RaggedColumn {
    std::vector<uint64_t> value_ends;  // cumulative element counts
    std::vector<uint64_t> extents;     // variable_dims values per record
    std::vector<std::byte> values;
  };
  detail::RecycledBuffer fixed;
  int64_t fixed_capacity_bytes = 0;
  int64_t record_count = 0;
  std::vector<RaggedColumn> ragged;
};

// Largest span of contiguous fixed records for which one run of records_per_chunk records
// is still worth keeping in memory to get the whole-file column view.
constexpr int64_t kMaxContiguousUnitBytes = int64_t{64} << 20;

// How much written data the writer lets accumulate before asking the kernel to start putting
// it on the disk. Without it the kernel waits (dirty_expire, seconds) and finish()'s fsync
// writes the whole file while the writer idles; with it the disk writes while the writer
// copies and compresses, and fsync waits for the last few MiB.
constexpr int64_t kWritebackBytes = int64_t{4} << 20;

// The strided copy of `source` into the chunk, dst[...] = source[...]. A source mapped from a
// file (a memory-mapped .npy being packed, a view into another dataset) that another program
// truncates meanwhile faults with SIGBUS on its lost pages; under the guard that is an
// IoError naming the file, the writer aborts like on any failed append, and the process lives.
void copy_from(const Tensor& source, void* dst, IntArrayRef dst_strides) {
  const auto copy = [&] {
    detail::copy_strided(dst, dst_strides, source.data_ptr(), source.strides(), source.sizes(),
                         element_size(source.dtype()));
  };
  detail::guard_storage_reads(source.untyped_storage(), copy);
}

// The decoded bytes a chunk closed by size aims at: chunk_bytes, but with a codec at least the
// alignment (a fixed-field chunk holds the whole records that fit, at least one). Each compressed chunk starts on an alignment boundary, so smaller chunks would
// pad the file with more zeros than data (1-byte chunks at 16 MiB alignment: 16 MiB of file
// per record); uncompressed ones are rounded to the alignment in their own way.
int64_t chunk_target_bytes(const WriterOptions& options) {
  return options.codec.codec == Codec::None ? options.chunk_bytes : std::max(options.chunk_bytes, options.alignment);
}

}  // namespace

struct DatasetWriter::Impl {
  // fork_safety.h: a writer inherited by the child of a fork is the parent's to finish; the
  // child can neither use it nor, on destruction, remove its temporary file.
  const uint64_t made_in_generation = detail::fork_generation();
  std::string path;
  std::string temp_path;
  Schema schema;
  format::RecordLayout layout;
  std::vector<DimVector> fixed_strides;  // per field, for fixed fields
  bool record_has_padding = false;
  WriterOptions options;
  format::Preamble preamble;
  int64_t records_per_chunk = 0;  // 0: close chunks by size
  io::WritableFile file;
  // Declared before `pool`, as what follows: compression tasks use them until it is joined.
  detail::BufferRecycler buffers{4};
  // Set when the writer stops (cancelled, failed or aborted): compression queued or in flight
  // gives up, before it starts or between pieces of a large chunk (codec_engine.h), rather
  // than finish what will be thrown away.
  std::atomic<bool> stop_compressing{false};
  // The thread in append() or finish(), which alone may ask options.cancelled (a compression
  // task that thread runs asks it too, between pieces); and when it last asked.
  std::atomic<std::thread::id> writing_thread{};
  std::chrono::steady_clock::time_point last_cancel_poll{};
  bool cancel_seen = false;
  std::unique_ptr<detail::ThreadPool> pool;
  size_t max_pending = 1;
  std::deque<PendingChunk> pending;
  std::vector<ChunkEntry> table;
  ChunkBuilder current;
  int64_t current_first_record = 0;
  int64_t writeback_offset = 0;  // bytes before it have been handed to start_writeback
  Metadata metadata;
  // The schema block without metadata, encoded, and what the entries add to it
  // (format::encoded_metadata_entry_bytes, commas apart).
  format::SchemaBlockSize schema_block_base;
  int64_t metadata_json_bytes = 0;
  // Refuses an entry that would take the schema block past what a reader opens (over
  // kMaxSchemaBytes once encoded, or kMaxSchemaValues values) when it is set, not at finish()
  // after every record was written; finish() checks the encoded block again.
  void add_metadata(std::string key, std::string value);
  enum class State { Open, Finished, Failed, Aborted, Cancelled } state = State::Open;
  std::atomic<int64_t> records{0}, chunks{0}, bytes_in{0}, bytes_out{0};
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  void check_open() const {
    if (detail::inherited_through_fork(made_in_generation))
      detail::throw_inherited_through_fork(
          detail::str("DatasetWriter for ", path),
          "Append and finish in the process that made it, which still owns its temporary file.");
    MMT_CHECK(state == State::Open, ValueError, "dataset writer for ", path, " is ",
              state == State::Finished ? "finished"
              : state == State::Aborted   ? "aborted (abort() was called)"
              : state == State::Cancelled ? "aborted (WriterOptions::cancelled said to stop)"
                                          : "aborted after an error",
              "; create a new one");
  }
  void validate_record(std::span<const Tensor> values, int64_t record) const;
  void copy_record(std::span<const Tensor> values);
  void grow_fixed_buffer(int64_t wanted);
  // A batch for append_batch, checked: B records, each field's tensor (on the host), and the
  // offsets of its jagged fields, as int64 (empty for a field given [B, ...]).
  struct Batch {
    int64_t records = 0;
    std::vector<Tensor> values;
    std::vector<std::vector<int64_t>> offsets;
  };
  Batch validate_batch(std::span<const Tensor> values, std::span<const Tensor> offsets) const;
  // Bytes of ragged field f's values in records [start, start + count) of the batch.
  int64_t batch_value_bytes(const Batch& batch, size_t f, int64_t start, int64_t count) const;
  // decoded_bytes_with() for records [start, start + count) of the batch.
  int64_t batch_decoded_bytes(const Batch& batch, int64_t start, int64_t count, bool fresh) const;
  // How many records of the batch from `start` go into the current chunk before it closes
  // (FORMAT.md, "Chunking"; what append() record by record would put there); 0 when, with a
  // codec, the next record must start a new chunk.
  int64_t batch_records_for_chunk(const Batch& batch, int64_t start) const;
  void check_batch_chunks_fit(const Batch& batch) const;
  void copy_batch_records(const Batch& batch, int64_t start, int64_t count);
  int64_t records_left_in_chunk() const;
  int64_t current_decoded_bytes() const;
  // The decoded bytes of the current chunk (of a new one when `fresh`) once `count` more
  // records join it whose ragged field f adds `added_bytes(f)` bytes of values, saturating.
  // FORMAT.md's "Decoded chunk payload": the fixed region, then per ragged field its
  // value_end and extents words (from S_i) and its values (from V_i), each 64-byte aligned.
  template <class AddedBytes>
  int64_t decoded_bytes(int64_t count, bool fresh, const AddedBytes& added_bytes) const;
  // decoded_bytes() for `count` records shaped like `record` (unread when `count` is 0).
  int64_t decoded_bytes_with(std::span<const Tensor> record, int64_t count, bool fresh) const;
  bool chunk_is_full() const;
  // For a compressed writer chunking by bytes: whether adding `values` would take the current
  // chunk past the decoded-chunk limit, so the chunk must be sealed before it.
  bool record_would_overflow_chunk(std::span<const Tensor> values) const;
  // For a compressed writer with a ragged field and chunk_records: a ValueError, before
  // anything is written, when `count` records shaped like `record` would take a chunk past
  // the decoded-chunk limit (its record count is fixed, so it cannot close early).
  void check_counted_chunks_fit(std::span<const Tensor> record, int64_t count, int64_t first) const;
  void seal_chunk();
  void write_chunk(int64_t first_record, int64_t record_count, EncodedChunk chunk);
  void drain_one();
  // Whether options.cancelled said to stop, asked at most every kCancelPollInterval (every
  // time when `now`); on the writing thread only. It stops compression when it has.
  bool cancel_requested(bool now = false);
  // WriteCancelled for the writer's path; the caller's catch aborts the writer.
  [[noreturn]] void throw_cancelled() const;
  // The schema block as JSON; ValueError if a reader would refuse it.
  std::string readable_schema_block() const;
  void finish_file(const std::string& schema_json);
  void abort_files() noexcept;
};

// ---------------------------------------------------------------------------------------------
DatasetWriter DatasetWriter::create(const std::string& path, Schema schema, WriterOptions options) {
  MMT_CHECK(!path.empty(), ValueError, "dataset writer: empty path");
  MMT_CHECK(!schema.empty(), ValueError, "dataset writer for ", path, ": the schema has no fields");
  for (const Field& field : schema) {
    field.validate();
    MMT_CHECK(field.name.size() <= kMaxWrittenFieldNameBytes, ValueError, "dataset writer for ", path, ": field name of ",
              field.name.size(), " bytes is longer than ", kMaxWrittenFieldNameBytes,
              ", the most that leaves room for '.npy' in a 255-byte file name (mmt export writes NAME.npy)");
  }
  const int64_t alignment = options.alignment;
  MMT_CHECK(alignment >= format::kMinAlignment && alignment <= format::kMaxAlignment &&
                std::has_single_bit(static_cast<uint64_t>(alignment)),
            ValueError, "WriterOptions::alignment must be a power of two in [", format::kMinAlignment,
            ", ", format::kMaxAlignment, "], got ", alignment);
  MMT_CHECK(options.chunk_bytes > 0, ValueError, "WriterOptions::chunk_bytes must be > 0, got ",
            options.chunk_bytes);
  MMT_CHECK(options.chunk_records >= 0 && options.chunk_records <= format::kMaxChunkRecords,
            ValueError, "WriterOptions::chunk_records must be in [0, ", format::kMaxChunkRecords,
            "], got ", options.chunk_records);
  // More compression threads than chunks in flight only cost memory and start-up; 1024 is
  // far past any machine's cores, and below the system's thread limits.
  MMT_CHECK(options.threads >= 0 && options.threads <= kMaxWriterThreads, ValueError,
            "WriterOptions::threads must be in [0, ", kMaxWriterThreads, "], got ", options.threads);
  options.codec = CodecSpec::parse(options.codec.str());  // refuses levels out of range

  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->layout = format::compute_record_layout(schema);
  impl->schema = std::move(schema);
  int64_t field_bytes = 0;
  for (const Field& field : impl->schema) {
    impl->fixed_strides.push_back(field.is_fixed() ? field.value_strides(field.shape) : DimVector());
    if (field.is_fixed()) field_bytes += field.fixed_nbytes();
  }
  const int64_t stride = impl->layout.record_stride_bytes;
  impl->record_has_padding = field_bytes != stride;
  const bool compressed = options.codec.codec != Codec::None;
  MMT_CHECK(!compressed || stride <= format::kMaxDecodedChunkBytes, ValueError, "dataset writer for ",
            path, ": a record of ", stride, " bytes exceeds the ", format::kMaxDecodedChunkBytes,
            "-byte limit of a compressed chunk; store it without a codec");

  // Records per chunk (FORMAT.md, "Chunking").
  format::Preamble& pre = impl->preamble;
  pre.alignment = static_cast<uint64_t>(alignment);
  pre.record_stride_bytes = static_cast<uint64_t>(stride);
  if (impl->schema.all_fixed()) {
    int64_t rpc = options.chunk_records > 0 ? options.chunk_records
                                            : std::max<int64_t>(1, chunk_target_bytes(options) / stride);
    // Clamped before the contiguity rounding below, which must see the final count: clamping
    // after it wrote files (chunk_bytes of 8 GiB, 1-byte records) whose flag the reader refused.
    rpc = std::min(rpc, format::kMaxChunkRecords);
    if (compressed) rpc = std::min(rpc, format::kMaxDecodedChunkBytes / stride);
    if (!compressed) {
      // Chunks that are whole multiples of the alignment sit back to back: one column view.
      const int64_t unit = alignment / std::gcd(stride, alignment);
      if (options.chunk_records == 0 && unit * stride <= kMaxContiguousUnitBytes)
        rpc = std::max(unit, rpc / unit * unit);
      if (rpc % unit == 0 && unit * stride <= kMaxContiguousUnitBytes)
        pre.flags |= format::kFlagContiguousFixedLayout;
    }
    impl->records_per_chunk = rpc;
  } else {
    impl->records_per_chunk = options.chunk_records;
  }
  pre.records_per_chunk = static_cast<uint64_t>(impl->records_per_chunk);

  // The target: refuse to clobber before writing anything.
  io::check_output_target(path, options.overwrite, "set WriterOptions::overwrite to replace it");
  impl->schema_block_base = format::encoded_size({impl->schema, {}, options.codec, kWriterName});
  for (const auto& [key, value] : options.metadata) {
    check_metadata_text(key, value);
    impl->add_metadata(key, value);
  }
  impl->options = std::move(options);
  detail::remove_dead_temporaries(path);  // what writers of this target killed earlier left
  impl->file = detail::create_temporary(path, impl->temp_path);
  try {
    std::byte bytes[format::kPreambleBytes];
    format::encode_preamble(pre, bytes);
    impl->file.write(bytes, sizeof bytes);
    impl->file.pad_to(alignment);
    if (compressed) {
      // Inside the try: threads the system refuses (a container's process limit) must not
      // leave the temporary file behind.
      int threads = impl->options.threads > 0 ? impl->options.threads : detail::available_cpus();
      impl->pool = std::make_unique<detail::ThreadPool>(threads);
      impl->max_pending = static_cast<size_t>(2 * threads);
      // Each pending chunk holds an input and an output buffer; what they free is reused.
      impl->buffers.set_max_idle(impl->max_pending + 4);
    }
  } catch (...) {
    impl->abort_files();
    throw;
  }
  impl->bytes_out = impl->file.offset();
  return DatasetWriter(std::move(impl));
}

DatasetWriter::DatasetWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DatasetWriter::DatasetWriter(DatasetWriter&&) noexcept = default;
DatasetWriter& DatasetWriter::operator=(DatasetWriter&& other) noexcept {
  if (this != &other) {
    abort();
    impl_ = std::move(other.impl_);
  }
  return *this;
}
DatasetWriter::~DatasetWriter() { abort(); }

// ---------------------------------------------------------------------------------------------
namespace {

// Whether one value's sizes fit a field's shape: the same rank, and every dimension equal but
// the field's variable ones (kVariableDim), which take any size.
bool value_has_field_shape(const Field& field, IntArrayRef sizes) {
  if (sizes.size() != field.shape.size()) return false;
  for (size_t d = 0; d < sizes.size(); ++d)
    if (field.shape[d] != kVariableDim && field.shape[d] != sizes[d]) return false;
  return true;
}

// A bool value holds only bytes 0 and 1 (FORMAT.md, "Schema"): numpy's importer refuses
// others, and C++ reads them as undefined behaviour. A tensor made over foreign memory can
// hold anything, so the writer looks before it writes.
//
// `values` holds `records` records' values of `field` (1 for one record, B for a [B, ...]
// batch), the first of them record `first_record`; the error names the record and element.
void check_bool_bytes(const Tensor& values, int64_t records, int64_t first_record, const Field& field) {
  if (values.numel() == 0) return;
  const Tensor host = (values.is_cuda() ? values.cpu() : values).contiguous();
  const auto* bytes = static_cast<const std::byte*>(host.data_ptr());
  const int64_t at = detail::first_invalid_bool(bytes, host.numel());
  if (at < 0) return;
  const int64_t per_record = host.numel() / records;
  throw ValueError(detail::str("record ", first_record + at / per_record, ", field '", field.name,
                               "': bool element ", at % per_record, " holds the byte ",
                               static_cast<int>(static_cast<uint8_t>(bytes[at])), "; a bool value may hold only 0 and 1"));
}

int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? INT64_MAX : product;
}

// The chunk buffer's next capacity, for `needed` bytes of a chunk that takes `full_chunk`
// bytes when full. A chunk of ordinary size is allocated whole, once. A huge one (chunk_bytes
// of 100 GB, say) grows with what is appended, doubling: the data may never fill it.
int64_t grown_capacity(int64_t needed, int64_t full_chunk, int64_t capacity) {
  constexpr int64_t kWholeChunkBytes = int64_t{64} << 20;
  if (full_chunk <= kWholeChunkBytes) return std::max(needed, full_chunk);
  const int64_t doubled = capacity > INT64_MAX / 2 ? INT64_MAX : 2 * capacity;
  return std::max(needed, std::min(full_chunk, std::max(doubled, kWholeChunkBytes)));
}

}  // namespace

void DatasetWriter::Impl::validate_record(std::span<const Tensor> values, int64_t record) const {
  MMT_CHECK(values.size() == schema.size(), ValueError, "record ", record, ": expected ",
            schema.size(), " values (one per field), got ", values.size());
  int64_t ragged_bytes = 0;
  for (size_t f = 0; f < schema.size(); ++f) {
    const Field& field = schema[f];
    const Tensor& value = values[f];
    MMT_CHECK(value.defined(), ValueError, "record ", record, ", field '", field.name, "': undefined tensor");
    MMT_CHECK(value.dtype() == field.dtype, ValueError, "record ", record, ", field '", field.name,
              "': expected dtype ", to_string(field.dtype), ", got ", to_string(value.dtype()));
    MMT_CHECK(value_has_field_shape(field, value.sizes()), ValueError, "record ", record, ", field '", field.name, "': expected shape ",
              field.shape, ", got ", value.sizes());
    int64_t elements = 0;  // what readers check: an empty value's strides must fit in int64 too
    MMT_CHECK(field.is_fixed() || format::ragged_value_elements(value.sizes().data(), value.sizes().size(), &elements),
              ValueError, "record ", record, ", field '", field.name, "': the extents ", value.sizes(),
              " overflow int64 (each 0 counted as 1)");
    if (field.dtype == kBool) check_bool_bytes(value, 1, record, field);
    if (!field.is_fixed()) ragged_bytes += value.nbytes();
  }
  // Alone in a chunk, the record must fit a compressed one: counted exactly, its value ends,
  // extents and section padding too (a value of many variable dimensions adds 8 bytes each).
  if (options.codec.codec != Codec::None && !schema.all_fixed()) {
    const int64_t alone = decoded_bytes_with(values, 1, true);
    MMT_CHECK(alone <= format::kMaxDecodedChunkBytes, ValueError, "record ", record, ": ", ragged_bytes,
              " bytes of ragged values make a chunk of ", alone, " decoded bytes by themselves, over the ",
              format::kMaxDecodedChunkBytes, "-byte limit of a compressed chunk; store it without a codec");
  }
}

int64_t DatasetWriter::Impl::current_decoded_bytes() const { return decoded_bytes_with({}, 0, false); }

template <class AddedBytes>
int64_t DatasetWriter::Impl::decoded_bytes(int64_t count, bool fresh, const AddedBytes& added_bytes) const {
  auto add = [](int64_t a, int64_t b) {
    int64_t sum = 0;
    return __builtin_add_overflow(a, b, &sum) ? INT64_MAX : sum;
  };
  auto section = [&](int64_t offset) { return offset > INT64_MAX - 64 ? INT64_MAX : format::next_section_offset(offset); };
  const int64_t records = add(fresh ? 0 : current.record_count, count);
  int64_t total = saturating_mul(records, layout.record_stride_bytes);
  size_t ragged_index = 0;
  for (size_t f = 0; f < schema.size(); ++f) {
    const Field& field = schema[f];
    if (field.is_fixed()) continue;
    const auto* column = fresh || ragged_index >= current.ragged.size() ? nullptr : &current.ragged[ragged_index];
    ++ragged_index;
    const int64_t variable_dims = std::count(field.shape.begin(), field.shape.end(), kVariableDim);
    const int64_t words = add(column ? static_cast<int64_t>(column->value_ends.size() + column->extents.size()) : 0,
                              saturating_mul(count, 1 + variable_dims));
    const int64_t values = add(column ? static_cast<int64_t>(column->values.size()) : 0, added_bytes(f));
    total = add(section(add(section(total), saturating_mul(words, 8))), values);
  }
  return total;
}

int64_t DatasetWriter::Impl::decoded_bytes_with(std::span<const Tensor> record, int64_t count, bool fresh) const {
  return decoded_bytes(count, fresh,
                       [&](size_t f) { return count == 0 ? int64_t{0} : saturating_mul(count, record[f].nbytes()); });
}

// Moves the current chunk's fixed records into a (recycled) buffer of `wanted` bytes.
void DatasetWriter::Impl::grow_fixed_buffer(int64_t wanted) {
  detail::RecycledBuffer grown = buffers.take(wanted, "a chunk buffer");
  if (current.record_count > 0)
    std::memcpy(grown.get(), current.fixed.get(), current.record_count * layout.record_stride_bytes);
  buffers.give(std::move(current.fixed));
  current.fixed = std::move(grown);
  current.fixed_capacity_bytes = wanted;
}

void DatasetWriter::Impl::copy_record(std::span<const Tensor> values) {
  const int64_t stride = layout.record_stride_bytes;
  if (current.ragged.size() != layout.ragged_fields.size()) current.ragged.resize(layout.ragged_fields.size());
  if (stride > 0 && (current.record_count + 1) * stride > current.fixed_capacity_bytes) {
    const int64_t needed = (current.record_count + 1) * stride;
    grow_fixed_buffer(records_per_chunk > 0
                          ? grown_capacity(needed, saturating_mul(records_per_chunk, stride), current.fixed_capacity_bytes)
                          : std::max(needed * 2, 64 * stride));
  }
  std::byte* slot = current.fixed.get() + current.record_count * stride;
  if (record_has_padding) std::memset(slot, 0, static_cast<size_t>(stride));
  size_t ragged_index = 0;
  int64_t value_bytes = 0;
  for (size_t f = 0; f < schema.size(); ++f) {
    const Field& field = schema[f];
    Tensor value = values[f].is_cuda() ? values[f].cpu() : values[f];
    value_bytes += value.nbytes();
    if (field.is_fixed()) {
      copy_from(value, slot + layout.field_offset_bytes[f], fixed_strides[f]);
      continue;
    }
    auto& column = current.ragged[ragged_index++];
    const size_t old_size = column.values.size();
    column.values.resize(old_size + static_cast<size_t>(value.nbytes()));
    if (value.numel() > 0) copy_from(value, column.values.data() + old_size, field.value_strides(value.sizes()));
    uint64_t previous_end = column.value_ends.empty() ? 0 : column.value_ends.back();
    column.value_ends.push_back(previous_end + static_cast<uint64_t>(value.numel()));
    for (size_t d = 0; d < field.shape.size(); ++d)
      if (field.shape[d] == kVariableDim) column.extents.push_back(static_cast<uint64_t>(value.sizes()[d]));
  }
  ++current.record_count;
  records.fetch_add(1, std::memory_order_relaxed);
  bytes_in.fetch_add(value_bytes, std::memory_order_relaxed);
}

// How many more records the current chunk takes, for a schema of fixed fields only (where a
// chunk is full by record count or by record_count * stride >= chunk_target_bytes()).
int64_t DatasetWriter::Impl::records_left_in_chunk() const {
  int64_t capacity = records_per_chunk;
  if (capacity == 0) {
    const int64_t stride = std::max<int64_t>(layout.record_stride_bytes, 1);
    capacity = std::min<int64_t>(format::kMaxChunkRecords, (chunk_target_bytes(options) + stride - 1) / stride);
  }
  return std::max<int64_t>(capacity - current.record_count, 1);
}

namespace {
// "[B, 3, 28, 28]": the shape append_batch takes for `field` (-1 for a ragged dimension).
std::string batch_shape(const Field& field) {
  std::string shape = "[B";
  for (const int64_t size : field.shape) shape += ", " + std::to_string(size);
  return shape + "]";
}
}  // namespace

// Checks a whole batch for append_batch, before any of it is appended: its tensors against
// the schema, the same B for every field, offsets in order and within their values, bools,
// and with a codec that each record fits a compressed chunk alone.
DatasetWriter::Impl::Batch DatasetWriter::Impl::validate_batch(std::span<const Tensor> values,
                                                               std::span<const Tensor> offsets) const {
  const int64_t first = records.load(std::memory_order_relaxed);
  MMT_CHECK(values.size() == schema.size(), ValueError, "append_batch at record ", first, ": expected ",
            schema.size(), " tensors (one per field), got ", values.size());
  MMT_CHECK(offsets.empty() || offsets.size() == schema.size(), ValueError, "append_batch at record ", first,
            ": expected ", schema.size(), " offsets tensors (one per field, undefined where a field has none), got ",
            offsets.size());
  const auto jagged = [&](size_t f) { return !offsets.empty() && offsets[f].defined(); };
  Batch batch;
  batch.records = -1;
  size_t first_field = 0;  // the one whose B the others are held to
  for (size_t f = 0; f < schema.size(); ++f) {
    const Field& field = schema[f];
    const Tensor& value = values[f];
    const auto where = [&] { return detail::str("append_batch at record ", first, ", field '", field.name, "'"); };
    MMT_CHECK(value.defined(), ValueError, where(), ": undefined tensor");
    int64_t records_here = 0;
    if (jagged(f)) {
      MMT_CHECK(field.variable_dims() == 1 && field.shape[0] == kVariableDim, ValueError, where(), " (shape ",
                field.shape, ") takes no offsets: only a field whose one variable dimension is its first does");
      const Tensor& offset = offsets[f];
      MMT_CHECK(offset.dim() == 1 && offset.size(0) >= 1 && (offset.dtype() == kInt64 || offset.dtype() == kInt32),
                ValueError, where(), ": offsets must be [B + 1] int64 or int32, got ", to_string(offset.dtype()),
                offset.sizes());
      MMT_CHECK(value.dim() == static_cast<int64_t>(field.shape.size()), ValueError, where(),
                ": expected its values back to back, ", field.shape, " with the records along dimension 0 (",
                field.shape.size(), " dimensions), got ", value.sizes());
      records_here = offset.size(0) - 1;
    } else {
      MMT_CHECK(value.dim() == static_cast<int64_t>(field.shape.size()) + 1, ValueError, where(), ": expected ",
                batch_shape(field), " (", field.shape.size() + 1, " dimensions), got ", value.sizes());
      records_here = value.size(0);
    }
    if (batch.records < 0) {
      batch.records = records_here;
      first_field = f;
    }
    MMT_CHECK(records_here == batch.records, ValueError, where(), ": holds ", records_here, " records but field '",
              schema[first_field].name, "' holds ", batch.records);
  }
  // Checked for an empty batch too: a wrong dtype or shape is a bug whatever the batch holds.
  for (size_t f = 0; f < schema.size(); ++f) {
    const Field& field = schema[f];
    MMT_CHECK(values[f].dtype() == field.dtype, ValueError, "append_batch at record ", first, ", field '",
              field.name, "': expected dtype ", to_string(field.dtype), ", got ", to_string(values[f].dtype()));
    const IntArrayRef sizes = values[f].sizes();  // [B, ...] or, jagged, [N, ...], its rank checked above
    const bool fits = jagged(f) ? std::equal(sizes.begin() + 1, sizes.end(), field.shape.begin() + 1)
                                : value_has_field_shape(field, IntArrayRef(sizes.data() + 1, sizes.size() - 1));
    MMT_CHECK(fits, ValueError, "append_batch at record ", first, ", field '", field.name, "': expected records of shape ",
              field.shape, ", got ", sizes, jagged(f) ? " (records back to back along dimension 0)" : " (B first)");
  }
  batch.values.assign(values.begin(), values.end());
  for (Tensor& value : batch.values)
    if (value.is_cuda()) value = value.cpu();
  batch.offsets.resize(schema.size());
  for (size_t f = 0; f < schema.size(); ++f) {
    if (!jagged(f)) continue;
    const Field& field = schema[f];
    // Read once, as int64; guarded, as the values are: offsets may be a view of a mapped file.
    const Tensor offset = offsets[f].is_cuda() ? offsets[f].cpu() : offsets[f];
    std::vector<int64_t>& out = batch.offsets[f];
    out.resize(static_cast<size_t>(offset.size(0)));
    detail::guard_storage_reads(offset.untyped_storage(), [&] {
      const auto* base = static_cast<const std::byte*>(offset.data_ptr());
      const int64_t step = offset.stride(0) * element_size(offset.dtype());
      for (size_t i = 0; i < out.size(); ++i) {
        const std::byte* p = base + static_cast<int64_t>(i) * step;
        if (offset.dtype() == kInt64) {
          std::memcpy(&out[i], p, 8);
        } else {
          int32_t v;
          std::memcpy(&v, p, 4);
          out[i] = v;
        }
      }
    });
    const int64_t available = values[f].size(0);
    const auto where = [&](size_t i) { return detail::str("append_batch at record ", first + static_cast<int64_t>(i), ", field '", field.name, "'"); };
    MMT_CHECK(out[0] >= 0, ValueError, where(0), ": its first offset is ", out[0]);
    for (size_t i = 1; i < out.size(); ++i)
      MMT_CHECK(out[i] >= out[i - 1], ValueError, where(i - 1), ": offsets decrease (", out[i - 1], " then ", out[i],
                ")");
    MMT_CHECK(out.back() <= available, ValueError, where(out.size() - 2 + (out.size() == 1)), ": offsets reach ",
              out.back(), ", past the ", available, " values given");
  }
  if (batch.records <= 0) return batch;
  for (size_t f = 0; f < schema.size(); ++f) {
    const Field& field = schema[f];
    if (field.dtype != kBool) continue;
    if (!jagged(f)) {
      check_bool_bytes(batch.values[f], batch.records, first, field);
      continue;
    }
    // The values the records hold; an error names the record whose value holds the byte.
    const std::vector<int64_t>& offset = batch.offsets[f];
    const Tensor held = batch.values[f].narrow(0, offset.front(), offset.back() - offset.front());
    int64_t at = -1;
    uint8_t byte = 0;
    detail::guard_storage_reads(held.untyped_storage(), [&] {  // a view of a mapped file, perhaps
      const Tensor dense = held.contiguous();
      const auto* bytes = static_cast<const std::byte*>(dense.data_ptr());
      at = detail::first_invalid_bool(bytes, dense.numel());
      if (at >= 0) byte = static_cast<uint8_t>(bytes[at]);
    });
    if (at < 0) continue;
    const int64_t inner = held.size(0) == 0 ? 1 : held.numel() / held.size(0);
    const int64_t row = offset.front() + at / inner;
    const auto record = std::upper_bound(offset.begin(), offset.end(), row) - offset.begin() - 1;
    throw ValueError(detail::str("record ", first + record, ", field '", field.name, "': bool element ",
                         (row - offset[static_cast<size_t>(record)]) * inner + at % inner, " holds the byte ",
                         static_cast<int>(byte),
                         "; a bool value may hold only 0 and 1"));
  }
  if (schema.all_fixed()) return batch;
  for (size_t f = 0; f < schema.size(); ++f) {
    const Field& field = schema[f];
    if (field.is_fixed()) continue;
    // What readers check: a value's extents (each 0 counted as 1) must not overflow int64.
    const IntArrayRef sizes = batch.values[f].sizes();
    const size_t skip = jagged(f) ? 0 : 1;
    DimVector largest(IntArrayRef(sizes.data() + skip, sizes.size() - skip));
    if (jagged(f)) {
      const std::vector<int64_t>& offset = batch.offsets[f];
      largest[0] = 0;
      for (size_t i = 1; i < offset.size(); ++i) largest[0] = std::max(largest[0], offset[i] - offset[i - 1]);
    }
    int64_t elements = 0;
    MMT_CHECK(format::ragged_value_elements(largest.data(), largest.size(), &elements), ValueError,
              "append_batch at record ", first, ", field '", field.name, "': the extents ", largest,
              " overflow int64 (each 0 counted as 1)");
  }
  // Alone in a chunk, each record must fit a compressed one (append() checks the same).
  if (options.codec.codec != Codec::None) {
    for (int64_t i = 0; i < batch.records; ++i) {
      const int64_t alone = batch_decoded_bytes(batch, i, 1, true);
      if (alone <= format::kMaxDecodedChunkBytes) continue;
      int64_t ragged_bytes = 0;
      for (size_t f = 0; f < schema.size(); ++f)
        if (!schema[f].is_fixed()) ragged_bytes += batch_value_bytes(batch, f, i, 1);
      throw ValueError(detail::str("record ", first + i, ": ", ragged_bytes, " bytes of ragged values make a chunk of ", alone,
                           " decoded bytes by themselves, over the ", format::kMaxDecodedChunkBytes,
                           "-byte limit of a compressed chunk; store it without a codec"));
    }
  }
  return batch;
}

int64_t DatasetWriter::Impl::batch_value_bytes(const Batch& batch, size_t f, int64_t start, int64_t count) const {
  const Tensor& value = batch.values[f];
  const int64_t element = element_size(value.dtype());
  int64_t inner = 1;  // elements of a record ([B, ...]) or of one row along dimension 0 (jagged)
  for (size_t d = 1; d < value.sizes().size(); ++d) inner = saturating_mul(inner, value.sizes()[d]);
  const std::vector<int64_t>& offset = batch.offsets[f];
  const int64_t rows = offset.empty() ? count : offset[static_cast<size_t>(start + count)] - offset[static_cast<size_t>(start)];
  return saturating_mul(saturating_mul(rows, inner), element);
}

int64_t DatasetWriter::Impl::batch_decoded_bytes(const Batch& batch, int64_t start, int64_t count, bool fresh) const {
  return decoded_bytes(count, fresh, [&](size_t f) { return batch_value_bytes(batch, f, start, count); });
}

int64_t DatasetWriter::Impl::batch_records_for_chunk(const Batch& batch, int64_t start) const {
  const int64_t left = batch.records - start;
  if (records_per_chunk > 0) return std::min(left, records_per_chunk - current.record_count);
  if (schema.all_fixed()) return std::min(left, records_left_in_chunk());
  // Closed by size: after the record that takes it to its target, or at kMaxChunkRecords;
  // with a codec, before a record that would take it past the decoded limit. The decoded
  // bytes grow with each record: both bounds are binary searches.
  int64_t count = std::min(left, format::kMaxChunkRecords - current.record_count);
  const int64_t target = chunk_target_bytes(options);
  int64_t low = 1, high = count;  // the first k in [1, count] that reaches the target, else count
  while (low < high) {
    const int64_t mid = low + (high - low) / 2;
    if (batch_decoded_bytes(batch, start, mid, false) >= target) high = mid;
    else low = mid + 1;
  }
  count = low;
  if (options.codec.codec == Codec::None) return count;
  // The last k in [0, count] within the limit; an empty chunk takes at least one record (it
  // fits alone: validate_batch checked).
  low = current.record_count == 0 ? 1 : 0, high = count;
  while (low < high) {
    const int64_t mid = low + (high - low + 1) / 2;
    if (batch_decoded_bytes(batch, start, mid, false) <= format::kMaxDecodedChunkBytes) low = mid;
    else high = mid - 1;
  }
  return low;
}

// For a compressed writer with a ragged field and chunk_records: a ValueError, before anything
// is written, when a chunk the batch fills would decode past the limit (its record count is
// fixed, so it cannot close early).
void DatasetWriter::Impl::check_batch_chunks_fit(const Batch& batch) const {
  if (records_per_chunk == 0 || options.codec.codec == Codec::None || schema.all_fixed()) return;
  const int64_t first = records.load(std::memory_order_relaxed);
  for (int64_t start = 0, room = records_per_chunk - current.record_count; start < batch.records;
       room = records_per_chunk) {
    const int64_t count = std::min(room, batch.records - start);
    const int64_t bytes = batch_decoded_bytes(batch, start, count, start > 0);
    MMT_CHECK(bytes <= format::kMaxDecodedChunkBytes, ValueError, "records ", first + start, " to ",
              first + start + count - 1, " (of a batch): a chunk of chunk_records=", records_per_chunk,
              " records holding them would decode to ", bytes, " bytes, over the ", format::kMaxDecodedChunkBytes,
              "-byte limit of a compressed chunk; lower chunk_records, or leave it 0 so that chunks close by size "
              "(each record then fits one alone). Nothing of it was written");
    start += count;
  }
}

// Copies records [start, start + count) of a validated batch into the current chunk, which
// has room for them: one strided copy per field (for a jagged field stored in another order
// than its logical one, one per record).
void DatasetWriter::Impl::copy_batch_records(const Batch& batch, int64_t start, int64_t count) {
  const int64_t stride = layout.record_stride_bytes;
  if (current.ragged.size() != layout.ragged_fields.size()) current.ragged.resize(layout.ragged_fields.size());
  const int64_t needed = (current.record_count + count) * stride;
  if (stride > 0 && needed > current.fixed_capacity_bytes) {
    const int64_t full_chunk = schema.all_fixed() ? saturating_mul(current.record_count + records_left_in_chunk(), stride)
                               : records_per_chunk > 0 ? saturating_mul(records_per_chunk, stride)
                                                       : 0;
    grow_fixed_buffer(full_chunk > 0 ? grown_capacity(needed, full_chunk, current.fixed_capacity_bytes)
                                     : std::max(needed * 2, 64 * stride));
  }
  std::byte* first_slot = current.fixed.get() + current.record_count * stride;
  if (record_has_padding) std::memset(first_slot, 0, static_cast<size_t>(count * stride));
  int64_t value_bytes = 0;
  size_t ragged_index = 0;
  for (size_t f = 0; f < schema.size(); ++f) {
    const Field& field = schema[f];
    const Tensor& value = batch.values[f];
    const int64_t elem = element_size(field.dtype);
    if (field.is_fixed()) {
      const Tensor part = value.narrow(0, start, count);
      value_bytes += part.nbytes();
      // One copy of the [count, ...] block: the record stride is a stride like any other. It
      // is a whole number of elements: the layout rounds it to the largest field alignment,
      // and every field's alignment (its element size, or 64) is a multiple of its element size.
      DimVector dst_strides{stride / elem};
      for (int64_t s : fixed_strides[f]) dst_strides.push_back(s);
      copy_from(part, first_slot + layout.field_offset_bytes[f], dst_strides);
      continue;
    }
    ChunkBuilder::RaggedColumn& column = current.ragged[ragged_index++];
    const int64_t bytes = batch_value_bytes(batch, f, start, count);
    value_bytes += bytes;
    const size_t old_size = column.values.size();
    column.values.resize(old_size + static_cast<size_t>(bytes));
    std::byte* out = column.values.data() + old_size;
    uint64_t value_end = column.value_ends.empty() ? 0 : column.value_ends.back();
    const std::vector<int64_t>& offset = batch.offsets[f];
    if (!offset.empty()) {  // jagged: records [start, start + count) are rows [first, last) of the values
      int64_t inner = 1;
      for (size_t d = 1; d < value.sizes().size(); ++d) inner *= value.sizes()[d];
      const int64_t first = offset[static_cast<size_t>(start)], last = offset[static_cast<size_t>(start + count)];
      if (last > first && inner > 0) {
        if (field.stored_in_logical_order()) {  // records back to back, each dense: the rows as they are
          const Tensor rows = value.narrow(0, first, last - first);
          copy_from(rows, out, contiguous_strides(rows.sizes()));
        } else {
          for (int64_t i = start; i < start + count; ++i) {
            const int64_t from = offset[static_cast<size_t>(i)], length = offset[static_cast<size_t>(i) + 1] - from;
            if (length == 0) continue;
            const Tensor record = value.narrow(0, from, length);
            copy_from(record, out + (from - first) * inner * elem, field.value_strides(record.sizes()));
          }
        }
      }
      column.value_ends.reserve(column.value_ends.size() + static_cast<size_t>(count));
      column.extents.reserve(column.extents.size() + static_cast<size_t>(count));
      for (int64_t i = start; i < start + count; ++i) {
        const int64_t length = offset[static_cast<size_t>(i) + 1] - offset[static_cast<size_t>(i)];
        value_end += static_cast<uint64_t>(length * inner);
        column.value_ends.push_back(value_end);
        column.extents.push_back(static_cast<uint64_t>(length));
      }
      continue;
    }
    // [B, ...]: every record of the batch has the same extents.
    const IntArrayRef record_sizes(value.sizes().data() + 1, value.sizes().size() - 1);
    int64_t record_elements = 1;
    for (const int64_t size : record_sizes) record_elements *= size;
    if (bytes > 0) {
      DimVector dst_strides{record_elements};
      for (const int64_t s : field.value_strides(record_sizes)) dst_strides.push_back(s);
      copy_from(value.narrow(0, start, count), out, dst_strides);
    }
    for (int64_t i = 0; i < count; ++i) {
      value_end += static_cast<uint64_t>(record_elements);
      column.value_ends.push_back(value_end);
      for (size_t d = 0; d < field.shape.size(); ++d)
        if (field.shape[d] == kVariableDim) column.extents.push_back(static_cast<uint64_t>(record_sizes[d]));
    }
  }
  current.record_count += count;
  records.fetch_add(count, std::memory_order_relaxed);
  bytes_in.fetch_add(value_bytes, std::memory_order_relaxed);
}

bool DatasetWriter::Impl::chunk_is_full() const {
  if (current.record_count == 0) return false;
  if (records_per_chunk > 0) return current.record_count >= records_per_chunk;
  return current.record_count >= format::kMaxChunkRecords ||
         current_decoded_bytes() >= chunk_target_bytes(options);
}

bool DatasetWriter::Impl::record_would_overflow_chunk(std::span<const Tensor> values) const {
  if (current.record_count == 0 || records_per_chunk > 0 || options.codec.codec == Codec::None) return false;
  return decoded_bytes_with(values, 1, false) > format::kMaxDecodedChunkBytes;
}

void DatasetWriter::Impl::check_counted_chunks_fit(std::span<const Tensor> record, int64_t count,
                                                   int64_t first) const {
  if (records_per_chunk == 0 || options.codec.codec == Codec::None || schema.all_fixed() || count <= 0) return;
  // The rest of the current chunk, then (for a batch) a whole chunk of such records: the
  // largest any of them reaches.
  const int64_t into_current = std::min(count, records_per_chunk - current.record_count);
  int64_t largest = decoded_bytes_with(record, into_current, false);
  if (count > into_current)
    largest = std::max(largest, decoded_bytes_with(record, std::min(records_per_chunk, count - into_current), true));
  MMT_CHECK(largest <= format::kMaxDecodedChunkBytes, ValueError, "record ", first, count > 1 ? " (of a batch)" : "",
            ": a chunk of chunk_records=", records_per_chunk, " records like it would decode to ", largest,
            " bytes, over the ", format::kMaxDecodedChunkBytes, "-byte limit of a compressed chunk; lower "
            "chunk_records, or leave it 0 so that chunks close by size (each record then fits one "
            "alone). Nothing of it was written");
}

// Turns the current records into one decoded payload and hands it to the codec.
void DatasetWriter::Impl::seal_chunk() {
  if (current.record_count == 0) return;
  const int64_t record_count = current.record_count;
  const int64_t first_record = current_first_record;
  const uint64_t chunk_index = table.size() + pending.size();
  const int64_t fixed_bytes = record_count * layout.record_stride_bytes;
  EncodedChunk decoded;
  decoded.decoded_bytes = current_decoded_bytes();
  MMT_CHECK(options.codec.codec == Codec::None || decoded.decoded_bytes <= format::kMaxDecodedChunkBytes,
            ValueError, "chunk ", chunk_index, " would hold ", decoded.decoded_bytes, " decoded bytes, over the ",
            format::kMaxDecodedChunkBytes, "-byte limit of a compressed chunk; lower chunk_records (",
            records_per_chunk, ")");
  if (current.ragged.empty()) {
    decoded.bytes = std::move(current.fixed);
  } else {
    decoded.bytes = buffers.take(decoded.decoded_bytes, "a chunk buffer");
    std::byte* out = decoded.bytes.get();
    std::memset(out, 0, static_cast<size_t>(decoded.decoded_bytes));
    if (fixed_bytes > 0) std::memcpy(out, current.fixed.get(), static_cast<size_t>(fixed_bytes));
    int64_t offset = format::next_section_offset(fixed_bytes);
    for (const auto& column : current.ragged) {
      std::memcpy(out + offset, column.value_ends.data(), 8 * column.value_ends.size());
      offset += 8 * static_cast<int64_t>(column.value_ends.size());
      if (!column.extents.empty()) std::memcpy(out + offset, column.extents.data(), 8 * column.extents.size());
      offset = format::next_section_offset(offset + 8 * static_cast<int64_t>(column.extents.size()));
      if (!column.values.empty()) std::memcpy(out + offset, column.values.data(), column.values.size());
      offset = format::next_section_offset(offset + static_cast<int64_t>(column.values.size()));
    }
    buffers.give(std::move(current.fixed));
  }
  // Cleared, not reallocated: the ragged columns keep their capacity from chunk to chunk.
  current.fixed = {};
  current.fixed_capacity_bytes = 0;
  current.record_count = 0;
  for (auto& column : current.ragged) {
    column.value_ends.clear();
    column.extents.clear();
    column.values.clear();
  }
  current_first_record += record_count;

  if (options.codec.codec == Codec::None) {
    decoded.stored_bytes = decoded.decoded_bytes;
    decoded.checksum = format::payload_checksum(decoded.bytes.get(), decoded.stored_bytes, chunk_index);
    write_chunk(first_record, record_count, std::move(decoded));
    return;
  }
  CodecSpec codec = options.codec;
  PendingChunk job{first_record, record_count, {}};
  job.result = pool->submit([this, codec, chunk_index, decoded = std::move(decoded)]() mutable {
    EncodedChunk encoded;
    encoded.decoded_bytes = decoded.decoded_bytes;
    const int64_t bound = detail::compress_bound(codec.codec, decoded.decoded_bytes);
    encoded.bytes = buffers.take(bound, "a compressed chunk buffer");
    // The writing thread, compressing a queued chunk while it waits (drain_one), still asks
    // whether to stop; the pool's threads see what it and abort_files() decided.
    const auto stop = [this] {
      if (std::this_thread::get_id() == writing_thread.load(std::memory_order_relaxed)) return cancel_requested();
      return stop_compressing.load(std::memory_order_relaxed);
    };
    encoded.stored_bytes = detail::compress(codec, decoded.bytes.get(), decoded.decoded_bytes,
                                            encoded.bytes.get(), bound, stop);
    buffers.give(std::move(decoded.bytes));
    if (encoded.stored_bytes >= 0)  // < 0: given up (stop), never written
      encoded.checksum = format::payload_checksum(encoded.bytes.get(), encoded.stored_bytes, chunk_index);
    return encoded;
  });
  pending.push_back(std::move(job));
  // Chunks whose compression is done go to the file now, without waiting for any: waiting
  // for the oldest while the others finish would leave workers idle with nothing queued.
  while (!pending.empty() &&
         pending.front().result.wait_for(std::chrono::seconds(0)) == std::future_status::ready)
    drain_one();
  // Bounded: memory holds at most max_pending chunks, however large the dataset.
  while (pending.size() > max_pending) drain_one();
}

void DatasetWriter::Impl::drain_one() {
  PendingChunk job = std::move(pending.front());
  pending.pop_front();
  // Rather than wait for the oldest chunk, compress queued ones on this thread: the writer's
  // own thread then adds to the compression threads instead of idling beside them. With
  // nothing queued it waits, asking options.cancelled between waits.
  writing_thread.store(std::this_thread::get_id(), std::memory_order_relaxed);
  while (job.result.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    if (cancel_requested()) throw_cancelled();
    if (!pool->run_one_queued()) job.result.wait_for(kCancelPollInterval);
  }
  EncodedChunk chunk = job.result.get();
  if (chunk.stored_bytes < 0 || cancel_requested()) throw_cancelled();  // < 0: compression gave up
  write_chunk(job.first_record, job.record_count, std::move(chunk));
}

bool DatasetWriter::Impl::cancel_requested(bool now) {
  if (cancel_seen) return true;
  if (!options.cancelled) return false;
  const auto time = std::chrono::steady_clock::now();
  if (!now && time - last_cancel_poll < kCancelPollInterval) return false;
  last_cancel_poll = time;
  if (options.cancelled()) {
    cancel_seen = true;
    stop_compressing.store(true, std::memory_order_relaxed);
  }
  return cancel_seen;
}

void DatasetWriter::Impl::throw_cancelled() const {
  throw WriteCancelled(detail::str("dataset writer for ", path, ": cancelled after ", records.load(),
                                   " records; the path was left as it was"));
}

void DatasetWriter::Impl::write_chunk(int64_t first_record, int64_t record_count, EncodedChunk chunk) {
  file.pad_to(options.alignment);
  ChunkEntry entry;
  entry.file_offset = static_cast<uint64_t>(file.offset());
  entry.stored_bytes = static_cast<uint64_t>(chunk.stored_bytes);
  entry.decoded_bytes = static_cast<uint64_t>(chunk.decoded_bytes);
  entry.first_record = static_cast<uint64_t>(first_record);
  entry.record_count = static_cast<uint32_t>(record_count);
  entry.codec = static_cast<uint8_t>(options.codec.codec);
  entry.payload_checksum = chunk.checksum;
  file.write(chunk.bytes.get(), chunk.stored_bytes);
  buffers.give(std::move(chunk.bytes));
  if (file.offset() - writeback_offset >= kWritebackBytes) {
    file.start_writeback(writeback_offset, file.offset() - writeback_offset);
    writeback_offset = file.offset();
  }
  table.push_back(entry);
  chunks.fetch_add(1, std::memory_order_relaxed);
  bytes_out.store(file.offset(), std::memory_order_relaxed);
}

std::string DatasetWriter::Impl::readable_schema_block() const {
  format::SchemaBlock block{schema, metadata, options.codec, kWriterName};
  std::string json = format::encode_schema_block(block);
  // set_metadata keeps count of the encoded size; this checks the block itself, as a reader
  // will judge it.
  MMT_CHECK(static_cast<int64_t>(json.size()) <= format::kMaxSchemaBytes, ValueError, "dataset writer for ",
            path, ": the schema and metadata take ", json.size(), " bytes as JSON, over the limit of ",
            format::kMaxSchemaBytes, "; remove or shorten metadata, then finish() again");
  try {  // what readers refuse (too many JSON values, say) is refused here instead
    (void)format::decode_schema_block(json, file.offset());
  } catch (const FormatError& e) {
    throw ValueError(detail::str("dataset writer for ", path, ": the schema and metadata would not be readable (",
                                 e.what(), "); remove or shorten metadata, then finish() again"));
  }
  return json;
}

void DatasetWriter::Impl::finish_file(const std::string& json) {
  seal_chunk();
  while (!pending.empty()) drain_one();
  format::Footer footer;
  footer.record_count = static_cast<uint64_t>(records.load());
  footer.chunk_count = table.size();
  footer.schema_offset = static_cast<uint64_t>(file.offset());
  footer.schema_bytes = json.size();
  footer.schema_checksum = detail::checksum64(json.data(), json.size());
  file.write(json.data(), static_cast<int64_t>(json.size()));
  file.pad_to(format::kChunkTableAlignment);
  footer.chunk_table_offset = static_cast<uint64_t>(file.offset());
  // The table goes out in blocks so its staging memory stays small.
  constexpr size_t kEntriesPerWrite = 1024;
  std::vector<std::byte> block_bytes(kEntriesPerWrite * format::kChunkEntryBytes);
  for (size_t start = 0; start < table.size(); start += kEntriesPerWrite) {
    size_t n = std::min(kEntriesPerWrite, table.size() - start);
    for (size_t i = 0; i < n; ++i)
      format::encode_chunk_entry(table[start + i], start + i, block_bytes.data() + i * format::kChunkEntryBytes);
    file.write(block_bytes.data(), static_cast<int64_t>(n) * format::kChunkEntryBytes);
  }
  footer.file_bytes = static_cast<uint64_t>(file.offset() + format::kFooterBytes);
  std::byte footer_bytes[format::kFooterBytes];
  format::encode_footer(footer, footer_bytes);
  file.write(footer_bytes, sizeof footer_bytes);
  bytes_out.store(file.offset(), std::memory_order_relaxed);
  io::crash_point("after-write");
  file.fsync();
  file.close();
  io::crash_point("after-fsync");
  // The last moment the path is as it was: after the fsync, which for a large file may take
  // seconds, before the rename, which does not.
  if (cancel_requested(/*now=*/true)) throw_cancelled();
  // Again: a device or link may have taken the target's place while the data was written.
  if (options.overwrite) io::check_output_target(path, true, "");
  io::rename_file(temp_path, path, options.overwrite);
  state = State::Finished;  // the dataset is in place from here on; never remove it
  io::crash_point("after-rename");
  io::fsync_parent_dir(path);
}

void DatasetWriter::Impl::abort_files() noexcept {
  if (state == State::Open) state = cancel_seen ? State::Cancelled : State::Failed;
  stop_compressing.store(true, std::memory_order_relaxed);  // a large chunk gives up within a piece
  pool.reset();  // waits for in-flight compression, which owns its own buffers
  pending.clear();
  file = io::WritableFile();
  if (state != State::Finished && !temp_path.empty()) {
    try {
      io::remove_file(temp_path);
    } catch (...) {
      ::unlink(temp_path.c_str());  // the seam refused (a test fault); still leave no temp behind
    }
  }
}

// ---------------------------------------------------------------------------------------------
void DatasetWriter::append(std::span<const Tensor> values) {
  MMT_CHECK(impl_, ValueError, "append on a moved-from DatasetWriter");
  impl_->check_open();
  const int64_t record = impl_->records.load(std::memory_order_relaxed);
  impl_->validate_record(values, record);  // a bad record leaves the writer usable
  impl_->check_counted_chunks_fit(values, 1, record);
  try {
    // With a codec, a record that would take the chunk past the decoded limit starts the next
    // one (FORMAT.md, "Chunking").
    if (impl_->record_would_overflow_chunk(values)) impl_->seal_chunk();
    if (impl_->current.record_count == 0) impl_->current_first_record = record;
    impl_->copy_record(values);
    if (impl_->chunk_is_full()) impl_->seal_chunk();
  } catch (...) {
    impl_->abort_files();
    throw;
  }
}

void DatasetWriter::append(const std::map<std::string, Tensor, std::less<>>& values) {
  MMT_CHECK(impl_, ValueError, "append on a moved-from DatasetWriter");
  const Schema& schema = impl_->schema;
  const int64_t record = impl_->records.load(std::memory_order_relaxed);
  // Unknown names first: a misspelt name ('lable') is reported as itself, with the known
  // fields listed, rather than as the field it was meant for being missing.
  for (const auto& [name, value] : values) {
    if (!schema.find(name)) schema.index_of(name);  // throws, listing the known fields
  }
  std::vector<Tensor> ordered;
  ordered.reserve(schema.size());
  for (const Field& field : schema) {
    auto it = values.find(field.name);
    MMT_CHECK(it != values.end(), ValueError, "record ", record, ": field '", field.name, "' is missing");
    ordered.push_back(it->second);
  }
  append(std::span<const Tensor>(ordered));
}

void DatasetWriter::append_batch(std::span<const Tensor> values) { append_batch(values, {}); }

void DatasetWriter::append_batch(std::span<const Tensor> values, std::span<const Tensor> offsets) {
  MMT_CHECK(impl_, ValueError, "append_batch on a moved-from DatasetWriter");
  Impl& d = *impl_;
  d.check_open();
  const Impl::Batch batch = d.validate_batch(values, offsets);  // a bad batch leaves the writer as it was
  if (batch.records == 0) return;
  d.check_batch_chunks_fit(batch);
  const int64_t first = d.records.load(std::memory_order_relaxed);
  try {
    for (int64_t done = 0; done < batch.records;) {
      if (d.current.record_count == 0) d.current_first_record = first + done;
      const int64_t count = d.batch_records_for_chunk(batch, done);
      if (count == 0) {  // with a codec, the next record would take the chunk past its limit
        d.seal_chunk();
        continue;
      }
      d.copy_batch_records(batch, done, count);
      done += count;
      if (d.chunk_is_full()) d.seal_chunk();
    }
  } catch (...) {
    d.abort_files();
    throw;
  }
}

void DatasetWriter::set_metadata(std::string key, std::string value) {
  MMT_CHECK(impl_, ValueError, "set_metadata on a moved-from DatasetWriter");
  impl_->check_open();
  check_metadata_text(key, value);
  impl_->add_metadata(std::move(key), std::move(value));
}

void DatasetWriter::Impl::add_metadata(std::string key, std::string value) {
  const auto it = metadata.find(key);
  const int64_t replaced = it == metadata.end() ? 0 : format::encoded_metadata_entry_bytes(it->first, it->second);
  const int64_t entries_json = metadata_json_bytes - replaced + format::encoded_metadata_entry_bytes(key, value);
  const int64_t entries = static_cast<int64_t>(metadata.size()) + (it == metadata.end() ? 1 : 0);
  const int64_t commas = entries - 1;
  const int64_t bytes = schema_block_base.bytes + entries_json + commas;
  MMT_CHECK(bytes <= format::kMaxSchemaBytes, ValueError, "metadata '", key, "': the schema block would take ",
            bytes, " bytes as JSON, over the limit of ", format::kMaxSchemaBytes, " that readers open");
  MMT_CHECK(schema_block_base.separators + commas < format::kMaxSchemaValues, ValueError, "metadata '", key, "': ",
            entries, " metadata entries would take the schema block past the ", format::kMaxSchemaValues,
            " JSON values a reader opens");
  metadata.insert_or_assign(std::move(key), std::move(value));
  metadata_json_bytes = entries_json;
}

int64_t DatasetWriter::size() const { return impl_ ? impl_->records.load() : 0; }
bool DatasetWriter::is_open() const { return impl_ && impl_->state == Impl::State::Open; }
const Schema& DatasetWriter::schema() const {
  MMT_CHECK(impl_, ValueError, "schema() on a moved-from DatasetWriter");
  return impl_->schema;
}
const std::string& DatasetWriter::path() const {
  MMT_CHECK(impl_, ValueError, "path() on a moved-from DatasetWriter");
  return impl_->path;
}

WriteStats DatasetWriter::stats() const {
  WriteStats s;
  if (!impl_) return s;
  s.records = impl_->records.load(std::memory_order_relaxed);
  s.chunks = impl_->chunks.load(std::memory_order_relaxed);
  s.bytes_in = impl_->bytes_in.load(std::memory_order_relaxed);
  s.bytes_out = impl_->bytes_out.load(std::memory_order_relaxed);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - impl_->started).count();
  return s;
}

WriteStats DatasetWriter::finish() {
  MMT_CHECK(impl_, ValueError, "finish on a moved-from DatasetWriter");
  impl_->check_open();
  // Checked before anything is sealed: a schema block readers would refuse leaves the writer
  // open, its records kept, for the metadata to be mended.
  const std::string json = impl_->readable_schema_block();
  try {
    impl_->finish_file(json);
  } catch (...) {
    impl_->abort_files();
    throw;
  }
  impl_->pool.reset();
  return stats();
}

void DatasetWriter::abort() noexcept {
  if (!impl_) return;
  // Before the Finished test: a writer forked inside finish() is Finished while its pool is
  // still the parent's.
  if (detail::inherited_through_fork(impl_->made_in_generation)) {
    // The temporary file and the compression threads are the parent's: removing the one
    // would lose its dataset, joining the others would wait for ever. Let the copy go.
    detail::abandon_after_fork(impl_.release());
    return;
  }
  if (impl_->state == Impl::State::Finished) return;
  if (impl_->state == Impl::State::Open) impl_->state = Impl::State::Aborted;
  impl_->abort_files();
}

}  // namespace mmt
