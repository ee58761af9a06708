#include "hdf5_chunks.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <optional>
#include <span>

#include "cpu_budget.h"
#include "hdf5_input.h"
#include "load_cancel.h"
#include "mmtensor/dims.h"
#include "mmtensor/error.h"
#include "thread_pool.h"

namespace mmt::detail {
namespace {

// One filter of the dataset's pipeline that this file undoes.
struct Filter {
  H5Z_filter_t id = H5Z_FILTER_NONE;
  size_t shuffle_bytes = 0;  // the shuffle filter's element size (its first parameter)
};

// The pipeline in the order the writer applied it, or nullopt when there is none, or a filter
// is not deflate or shuffle (or its parameters are not what libhdf5 takes).
std::optional<std::vector<Filter>> pipeline_of(hid_t create_plist) {
  const int filters = H5Pget_nfilters(create_plist);
  if (filters < 0) return std::nullopt;
  std::vector<Filter> pipeline;
  for (int f = 0; f < filters; ++f) {
    unsigned flags = 0, values[8] = {};
    size_t value_count = 8;
    const H5Z_filter_t id =
        H5Pget_filter2(create_plist, static_cast<unsigned>(f), &flags, &value_count, values, 0, nullptr, nullptr);
    // libhdf5's own filters take one parameter each: deflate its level, shuffle the element size.
    if (id == H5Z_FILTER_DEFLATE && value_count == 1 && values[0] <= 9) {
      pipeline.push_back({id, 0});
    } else if (id == H5Z_FILTER_SHUFFLE && value_count == 1 && values[0] >= 1) {
      pipeline.push_back({id, values[0]});
    } else {
      return std::nullopt;
    }
  }
  if (pipeline.empty()) return std::nullopt;  // unfiltered: nothing to decode, the library copies as fast
  return pipeline;
}

std::string chunk_name(const std::vector<hsize_t>& offset) {
  return str("the chunk at ", IntArrayRef(std::vector<int64_t>(offset.begin(), offset.end())));
}

// Inflates a zlib stream (HDF5's deflate filter writes one per chunk, as compress2 does) into
// `out`, which must hold what it decodes to: at most `limit` bytes. Bytes after the stream's
// end are ignored, as libhdf5 ignores them. Empty on success, else what is wrong.
std::string inflate_into(std::span<const std::byte> in, std::vector<std::byte>& out, size_t limit) {
  out.resize(limit);
  z_stream stream{};
  if (inflateInit(&stream) != Z_OK) return "zlib cannot start inflating (out of memory?)";
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(in.data()));
  stream.avail_in = static_cast<uInt>(in.size());  // bounded by the caller: under 4 GiB
  size_t produced = 0;
  int status = Z_OK;
  bool too_long = false;
  while (status == Z_OK) {
    // Once `out` is full the stream must end without another byte: one byte of room tells.
    const bool full = produced == limit;
    unsigned char probe = 0;
    const size_t room = full ? 1 : std::min<size_t>(limit - produced, size_t{1} << 30);
    stream.next_out = full ? &probe : reinterpret_cast<Bytef*>(out.data() + produced);
    stream.avail_out = static_cast<uInt>(room);
    status = inflate(&stream, Z_NO_FLUSH);  // Z_BUF_ERROR: no progress, the input ended first
    const size_t wrote = room - stream.avail_out;
    too_long = full && wrote > 0;
    if (too_long) break;
    produced += wrote;
  }
  const std::string message = stream.msg ? stream.msg : "zlib error";
  inflateEnd(&stream);
  if (status == Z_STREAM_END && !too_long) {
    out.resize(produced);
    return {};
  }
  if (too_long) return str("inflates to more than its ", limit, " bytes of values (damaged)");
  if (status == Z_BUF_ERROR) return str("its deflate stream of ", in.size(), " bytes ends early (cut short or damaged)");
  return str("its deflate stream is damaged (", message, ")");
}

// HDF5's shuffle filter stores byte k of every element together; undone: element i's byte k
// comes from plane k. Bytes past the last whole element stay where they are, as libhdf5
// leaves them. (Elements of one byte, or fewer than two elements, are stored as they are:
// shuffle_changes() is false for them.)
bool shuffle_changes(size_t bytes, size_t element_bytes) { return element_bytes > 1 && bytes / element_bytes > 1; }

void unshuffle_into(std::span<const std::byte> in, std::vector<std::byte>& out, size_t element_bytes) {
  out.resize(in.size());
  const size_t elements = in.size() / element_bytes;
  for (size_t k = 0; k < element_bytes; ++k) {
    const std::byte* plane = in.data() + k * elements;
    std::byte* to = out.data() + k;
    for (size_t i = 0; i < elements; ++i) to[i * element_bytes] = plane[i];
  }
  const size_t whole = elements * element_bytes;
  std::memcpy(out.data() + whole, in.data() + whole, in.size() - whole);
}

// Buffers for decoding chunks, lent to one thread at a time: as many exist as threads decode
// at once, and they go with the read.
class BufferPool {
 public:
  std::vector<std::byte> take() {
    const std::lock_guard lock(mutex_);
    if (free_.empty()) return {};
    std::vector<std::byte> buffer = std::move(free_.back());
    free_.pop_back();
    return buffer;
  }
  void give(std::vector<std::byte> buffer) {
    const std::lock_guard lock(mutex_);
    free_.push_back(std::move(buffer));
  }

 private:
  std::mutex mutex_;
  std::vector<std::vector<std::byte>> free_;
};

// A chunk's stored bytes, as the library read them.
struct StoredChunk {
  std::vector<hsize_t> offset;  // its first element's coordinates
  std::vector<std::byte> bytes;
  unsigned filter_mask = 0;  // bit f: filter f was not applied to this chunk
  bool written = false;      // false: never written, its values are the fill value (zeros)
};

// How much a read may hold: a slab's stored chunks (the library's calls are serial, so a
// slab's are read before its decoding starts) and, on each thread, two buffers of a chunk's
// decoded size. Chunks past these bounds (a chunk row of many thousands, chunks of hundreds of
// MB) are what the library reads one at a time, at its speed but in its memory.
constexpr int64_t kMaxChunksASlab = 4096;
// Chunks smaller than this are many for their bytes: finding each costs more than decoding
// it, and a file of a few bytes may declare millions of them.
constexpr int64_t kMinChunkBytes = 1024;
constexpr int64_t kMaxChunkRowBytes = int64_t{128} << 20;  // a chunk row's chunks, decoded whole
constexpr int64_t kDecodeBuffersBytes = int64_t{256} << 20;  // every thread's buffers together

// A chunk's decoded bytes and how many chunks share its first-dimension offset, or nullopt
// past int64_t.
struct ChunkGrid {
  int64_t chunk_bytes = 0;
  int64_t chunks_a_row = 1;
};
std::optional<ChunkGrid> grid_of(const ChunkedDataset& dataset) {
  ChunkGrid grid{.chunk_bytes = dataset.element_bytes};
  for (size_t d = 0; d < dataset.dims.size(); ++d) {
    const hsize_t extent = dataset.chunk[d];
    if (extent < 1 || extent > static_cast<hsize_t>(INT64_MAX) ||
        __builtin_mul_overflow(grid.chunk_bytes, static_cast<int64_t>(extent), &grid.chunk_bytes))
      return std::nullopt;
    const hsize_t along = (dataset.dims[d] + extent - 1) / extent;
    if (d > 0 && (along > static_cast<hsize_t>(INT64_MAX) ||
                  __builtin_mul_overflow(grid.chunks_a_row, static_cast<int64_t>(along), &grid.chunks_a_row)))
      return std::nullopt;
  }
  return grid;
}

// The bytes the chunk at `offset` is stored in; 0 for one never written. Through the index
// (H5Dget_chunk_storage_size): H5Dget_chunk_info_by_coord walks the whole index in libhdf5
// 1.10, quadratic in the chunks. libhdf5 1.10 answers a chunk never written with an error,
// "chunk storage is not allocated" (later versions with 0); any other error is confirmed by
// the walk, so that a version wording it otherwise is only slower.
hsize_t stored_size(hid_t dataset, const std::vector<hsize_t>& offset, const std::string& what) {
  hsize_t size = 0;
  if (H5Dget_chunk_storage_size(dataset, offset.data(), &size) >= 0) return size;
  const std::string reason = hdf5_reason();
  if (reason.find("chunk storage is not allocated") != std::string::npos) return 0;
  unsigned filter_mask = 0;
  haddr_t address = HADDR_UNDEF;
  if (H5Dget_chunk_info_by_coord(dataset, offset.data(), &filter_mask, &address, &size) >= 0 && address == HADDR_UNDEF)
    return 0;
  H5Eclear2(H5E_DEFAULT);
  throw FormatError(str(what, ": ", chunk_name(offset), " cannot be found: ", reason));
}

}  // namespace

bool chunks_read_here(const ChunkedDataset& dataset) {
  if (dataset.dims.empty() || dataset.dims.size() != dataset.chunk.size()) return false;
  const std::optional<ChunkGrid> grid = grid_of(dataset);
  int64_t row_bytes = 0;
  bool here = grid && grid->chunks_a_row <= kMaxChunksASlab && grid->chunk_bytes >= kMinChunkBytes &&
              !__builtin_mul_overflow(grid->chunks_a_row, grid->chunk_bytes, &row_bytes) &&
              row_bytes <= kMaxChunkRowBytes && H5Pget_layout(dataset.create_plist) == H5D_CHUNKED &&
              H5Tequal(dataset.file_type, dataset.memory_type) > 0 && pipeline_of(dataset.create_plist).has_value();
  unsigned options = 0;
  here = here && H5Pget_chunk_opts(dataset.create_plist, &options) >= 0 && options == 0;
  H5D_fill_value_t fill = H5D_FILL_VALUE_ERROR;
  here = here && H5Pfill_value_defined(dataset.create_plist, &fill) >= 0 && fill != H5D_FILL_VALUE_ERROR;
  if (here && fill == H5D_FILL_VALUE_USER_DEFINED) {  // chunks never written read as it: zeros only
    std::vector<std::byte> value(static_cast<size_t>(dataset.element_bytes));
    here = H5Pget_fill_value(dataset.create_plist, dataset.memory_type, value.data()) >= 0 &&
           std::all_of(value.begin(), value.end(), [](std::byte b) { return b == std::byte{0}; });
  }
  H5Eclear2(H5E_DEFAULT);
  return here;
}

void read_chunks_here(const ChunkedDataset& dataset, int64_t slab_bytes, ScratchFile& out, const std::string& what) {
  const std::vector<Filter> pipeline = *pipeline_of(dataset.create_plist);
  const ChunkGrid grid = *grid_of(dataset);
  const std::vector<hsize_t>& dims = dataset.dims;
  const std::vector<hsize_t>& chunk = dataset.chunk;
  const size_t rank = dims.size();
  const auto element = static_cast<size_t>(dataset.element_bytes);
  // Strides in bytes: of the values in C order (a slab's rows are laid out so too), and of a
  // decoded chunk.
  std::vector<size_t> value_stride(rank), chunk_stride(rank);
  value_stride[rank - 1] = chunk_stride[rank - 1] = element;
  for (size_t d = rank - 1; d > 0; --d) {
    value_stride[d - 1] = value_stride[d] * dims[d];
    chunk_stride[d - 1] = chunk_stride[d] * chunk[d];
  }
  const size_t row_bytes = value_stride[0], chunk_bytes = static_cast<size_t>(grid.chunk_bytes);
  // A deflate stream grows incompressible bytes by a few per 16 KiB (zlib's compressBound), but
  // bytes after a stream are ignored, as libhdf5 ignores them, so a writer may leave some:
  // twice the values, and 64 KiB, is room for any. A chunk stored in more is a damaged index,
  // whose sizes would steer allocations. (libhdf5 stores a chunk's size in 32 bits.)
  const size_t stored_limit = std::min<size_t>(
      {2 * chunk_bytes + 65536, static_cast<size_t>(dataset.file_bytes), size_t{UINT32_MAX}});
  if (dims[0] == 0 || row_bytes == 0) return;
  // What the index says the dataset stores, every chunk's size summed (the library walks the
  // index once): none, and no chunk need be looked for; at the end, the sizes found inside the
  // extent must add up to it, or the index lost chunks, which would read as zeros. Only a
  // dataset that may grow keeps chunks outside its extent (one shrunk).
  H5Eclear2(H5E_DEFAULT);
  const hsize_t stored_total = H5Dget_storage_size(dataset.dataset);
  const bool total_known = H5Eget_num(H5E_DEFAULT) == 0;  // 0 is also its answer to an error
  hsize_t stored_found = 0;
  bool may_grow = false;
  {
    std::vector<hsize_t> max_dims(rank);
    const hid_t space = H5Dget_space(dataset.dataset);
    may_grow = space < 0 || H5Sget_simple_extent_dims(space, nullptr, max_dims.data()) != static_cast<int>(rank) ||
               max_dims != dims;
    if (space >= 0) H5Sclose(space);
  }
  H5Eclear2(H5E_DEFAULT);

  // A slab: whole chunk rows, about `slab_bytes` of their chunks decoded, at most
  // kMaxChunksASlab chunks.
  const auto chunk_rows_a_slab = static_cast<hsize_t>(
      std::max<int64_t>(1, std::min(slab_bytes / (grid.chunks_a_row * grid.chunk_bytes), kMaxChunksASlab / grid.chunks_a_row)));
  const int threads =
      static_cast<int>(std::clamp<int64_t>(kDecodeBuffersBytes / (2 * grid.chunk_bytes), 1, std::max(1, available_cpus())));
  const hsize_t chunk_rows = (dims[0] + chunk[0] - 1) / chunk[0];
  std::vector<hsize_t> grid_extent(rank);  // chunks along each dimension
  for (size_t d = 0; d < rank; ++d) grid_extent[d] = (dims[d] + chunk[d] - 1) / chunk[d];
  BufferPool buffers;
  std::vector<std::byte> slab;
  // Chunks as wide as the dataset past its first dimension hold whole rows: each is written
  // where its rows go by the thread that decoded it, not copied into a slab appended after.
  bool rows_whole = true;
  for (size_t d = 1; d < rank; ++d) rows_whole = rows_whole && chunk[d] == dims[d];
  const int64_t first_byte = out.size();
  if (rows_whole) out.resize(first_byte + static_cast<int64_t>(dims[0] * row_bytes));  // chunks never written: zeros

  for (hsize_t first = 0; first < chunk_rows; first += chunk_rows_a_slab) {
    check_load_cancelled();
    const hsize_t last = std::min(chunk_rows, first + chunk_rows_a_slab);
    const hsize_t row_begin = first * chunk[0], row_end = std::min(dims[0], last * chunk[0]);
    // The slab's chunks' stored bytes, read on this thread (the library's calls are serial).
    std::vector<StoredChunk> chunks;
    bool all_written = true;
    for (std::vector<hsize_t> at(rank, 0); at[0] == 0;) {  // the chunk grid past the first dimension
      for (hsize_t row = first; row < last; ++row) {
        StoredChunk stored;
        stored.offset.resize(rank);
        stored.offset[0] = row * chunk[0];
        for (size_t d = 1; d < rank; ++d) stored.offset[d] = at[d] * chunk[d];
        const hsize_t size = total_known && stored_total == 0 ? 0 : stored_size(dataset.dataset, stored.offset, what);
        stored_found += size;
        if (size > 0) {  // 0: never written, its values the fill value (zeros)
          MMT_CHECK(size <= stored_limit, FormatError, what, ": ", chunk_name(stored.offset), " is stored in ", size,
                    " bytes, more than twice its ", chunk_bytes, " bytes of values and 64 KiB (a damaged file)");
          stored.bytes.resize(static_cast<size_t>(size));
          uint32_t mask = 0;
          if (H5Dread_chunk(dataset.dataset, H5P_DEFAULT, stored.offset.data(), &mask, stored.bytes.data()) < 0)
            throw FormatError(str(what, ": ", chunk_name(stored.offset), " cannot be read: ", hdf5_reason()));
          stored.filter_mask = mask;
          stored.written = true;
        }
        all_written = all_written && stored.written;
        chunks.push_back(std::move(stored));
      }
      size_t d = rank - 1;  // the next chunk of dimensions 1.., the last fastest; at[0] ends it
      while (d > 0 && ++at[d] == grid_extent[d]) at[d--] = 0;
      if (d == 0) break;
    }
    H5Eclear2(H5E_DEFAULT);

    if (!rows_whole) {
      slab.resize(static_cast<size_t>(row_end - row_begin) * row_bytes);
      if (!all_written) std::fill(slab.begin(), slab.end(), std::byte{0});
    }
    ThreadPool::shared().parallel_for(static_cast<int64_t>(chunks.size()), threads, [&](int64_t index) {
      const StoredChunk& stored = chunks[static_cast<size_t>(index)];
      if (!stored.written) return;
      const auto refuse = [&](const std::string& why) {
        return FormatError(str(what, ": ", chunk_name(stored.offset), ": ", why));
      };
      // The filters undone last to first; the decoded bytes end in `decoded`. A deflate undone
      // before another (deflate twice) gives a stream, which may be longer than the values.
      const auto applied = [&](size_t f) { return f >= 32 || (stored.filter_mask >> f & 1u) == 0; };
      size_t last_deflate = pipeline.size();
      for (size_t f = pipeline.size(); f-- > 0;)
        if (pipeline[f].id == H5Z_FILTER_DEFLATE && applied(f)) last_deflate = f;
      std::vector<std::byte> decoded = buffers.take(), spare = buffers.take();
      std::span<const std::byte> bytes = stored.bytes;
      for (size_t f = pipeline.size(); f-- > 0;) {
        if (!applied(f)) continue;
        if (pipeline[f].id == H5Z_FILTER_DEFLATE) {
          const size_t limit = f == last_deflate ? chunk_bytes : chunk_bytes + chunk_bytes / 256 + 4096;
          if (const std::string why = inflate_into(bytes, spare, limit); !why.empty()) throw refuse(why);
        } else if (shuffle_changes(bytes.size(), pipeline[f].shuffle_bytes)) {
          unshuffle_into(bytes, spare, pipeline[f].shuffle_bytes);
        } else {
          continue;
        }
        std::swap(decoded, spare);
        bytes = decoded;
      }
      if (bytes.size() != chunk_bytes)
        throw refuse(str("decodes to ", bytes.size(), " bytes, not the ", chunk_bytes, " bytes of a chunk (damaged)"));
      // Its values inside the dataset: its rows at their place, or row by row of its last
      // dimension into the slab.
      std::vector<hsize_t> extent(rank);
      for (size_t d = 0; d < rank; ++d) extent[d] = std::min(chunk[d], dims[d] - stored.offset[d]);
      if (rows_whole) {
        out.write_at(first_byte + static_cast<int64_t>(stored.offset[0] * row_bytes), bytes.data(),
                     static_cast<int64_t>(extent[0] * row_bytes));
        buffers.give(std::move(decoded));
        buffers.give(std::move(spare));
        return;
      }
      const size_t run = static_cast<size_t>(extent[rank - 1]) * element;
      std::byte* slab_at = slab.data() + (stored.offset[0] - row_begin) * row_bytes;
      for (size_t d = 1; d < rank; ++d) slab_at += stored.offset[d] * value_stride[d];
      for (std::vector<hsize_t> i(rank, 0);;) {
        size_t from = 0, to = 0;
        for (size_t d = 0; d + 1 < rank; ++d) {
          from += i[d] * chunk_stride[d];
          to += i[d] * value_stride[d];
        }
        std::memcpy(slab_at + to, bytes.data() + from, run);
        size_t d = rank - 1;  // the next row: dimensions 0..rank-2, the last of them fastest
        while (d > 0 && ++i[d - 1] == extent[d - 1]) i[--d] = 0;
        if (d == 0) break;
      }
      buffers.give(std::move(decoded));
      buffers.give(std::move(spare));
    });
    if (!rows_whole) out.append(slab.data(), static_cast<int64_t>(slab.size()));
  }
  MMT_CHECK(!total_known || stored_found == stored_total || (may_grow && stored_found < stored_total), FormatError,
            what, ": its chunks are stored in ", stored_found, " bytes, but its chunk index counts ", stored_total,
            " (a damaged index: chunks it lost would read as zeros)");
}

}  // namespace mmt::detail
