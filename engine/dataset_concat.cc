// Dataset::open_concat and Dataset::concat: several dataset files read as one. Records,
// chunks and batches go to the part that holds them. A batch spread over several parts is
// written straight into the caller's rows, each once, with no staging copy: in one run over
// contiguous parts (records found by address across them), else part by part. A range
// spanning parts is copied piece by piece.
#include "dataset_concat.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <optional>
#include <unordered_set>

#include "checksum.h"
#include "chunk_cache.h"
#include "dataset_impl.h"
#include "format.h"
#include "mmtensor/packer.h"
#include "mmtensor/error.h"
#include "read_ahead.h"
#include "strided_copy.h"

namespace mmt {
namespace {

std::string describe(const Field& f) {
  std::string text = detail::str("'", f.name, "' ", to_string(f.dtype), " ", f.shape);
  if (!f.stored_in_logical_order()) text += detail::str(" stored in order ", f.storage_order);
  return text;
}

std::string field_names(const Schema& schema) {
  std::string names;
  for (const Field& f : schema) names += (names.empty() ? "'" : ", '") + f.name + "'";
  return names;
}

// How `other`'s fields differ from `first`'s, for the error.
std::string schema_difference(const Schema& first, const Schema& other) {
  if (first.size() != other.size())
    return detail::str("it has ", other.size(), " fields (", field_names(other), "), the first part ", first.size(),
                       " (", field_names(first), ")");
  for (size_t j = 0; j < first.size(); ++j)
    if (!(first[j] == other[j]))
      return detail::str("its field ", j, " is ", describe(other[j]), ", the first part's ", describe(first[j]));
  return "they differ";
}

// A metadata value in a message: quoted, and cut short when long (a list of classes, say).
std::string quoted(const std::string& value) {
  constexpr size_t kShown = 80;
  if (value.size() <= kShown) return "\"" + value + "\"";
  return detail::str("\"", value.substr(0, kShown), "...\" (", value.size(), " bytes)");
}

std::string part_name(const Dataset::Concat& c, size_t p) { return detail::str("part ", p, " (", c.parts[p].path(), ")"); }

// A batch's records grouped by part: part p's are local[begin[p], begin[p + 1]), in batch
// order, and rows[k] is where local[k] stood in the batch. In the calling thread's scratch.
struct BatchByPart {
  std::vector<size_t> part_at;  // by batch position
  std::vector<int64_t> begin;   // parts + 1
  std::vector<int64_t> local;
  std::vector<int64_t> rows;
  size_t parts_used = 0;

  void group(const Dataset::Concat& c, std::span<const int64_t> indices, const char* what) {
    const size_t parts = c.parts.size();
    const size_t n = indices.size();
    part_at.resize(n);
    begin.assign(parts + 1, 0);
    const int64_t records = c.size();
    for (size_t b = 0; b < n; ++b) {  // every index checked before anything is read
      int64_t i = indices[b] < 0 ? indices[b] + records : indices[b];
      if (static_cast<uint64_t>(i) >= static_cast<uint64_t>(records)) [[unlikely]]
        i = c.normalize_index(indices[b], what);  // throws
      const size_t p = c.part_of_record(i);
      part_at[b] = p;
      ++begin[p + 1];
    }
    parts_used = 0;
    for (size_t p = 0; p < parts; ++p) {
      parts_used += begin[p + 1] > 0;
      begin[p + 1] += begin[p];
    }
    local.resize(n);
    rows.resize(n);
    std::vector<int64_t>& next = fill_cursor;
    next.assign(begin.begin(), begin.end() - 1);
    for (size_t b = 0; b < n; ++b) {
      const size_t p = part_at[b];
      const int64_t i = indices[b] < 0 ? indices[b] + c.size() : indices[b];
      local[static_cast<size_t>(next[p])] = i - c.first_record[p];
      rows[static_cast<size_t>(next[p]++)] = static_cast<int64_t>(b);
    }
  }
  std::span<const int64_t> local_of(size_t p) const {
    return std::span<const int64_t>(local).subspan(static_cast<size_t>(begin[p]),
                                                   static_cast<size_t>(begin[p + 1] - begin[p]));
  }

 private:
  std::vector<int64_t> fill_cursor;
};

// Copies `src` (of part `part`: a view into its mapping, or memory of its own) into `dst`,
// of the same sizes, under the part's guard: a part truncated under the reader gives
// IoError, as a single file's copies do.
void copy_from_part(const Dataset::Impl& part, const Tensor& dst, const Tensor& src) {
  if (src.numel() == 0) return;
  const DimVector sizes(src.sizes()), dst_strides(dst.strides()), src_strides(src.strides());
  void* to = dst.mutable_data_ptr();
  const void* from = src.data_ptr();
  const int64_t element_bytes = src.element_size();
  part.guarded([&] { detail::copy_strided(to, dst_strides, from, src_strides, sizes, element_bytes); });
}

}  // namespace

// ---- building ----

namespace {

// Bit for bit: value equality would call a record holding NaN unlike itself.
bool same_bytes(const Tensor& x, const Tensor& y) {
  // Both are new, contiguous tensors (get_batch, get_ragged_batch copy).
  return x.sizes() == y.sizes() && x.dtype() == y.dtype() && x.nbytes() == y.nbytes() &&
         (x.nbytes() == 0 || std::memcmp(x.data_ptr(), y.data_ptr(), static_cast<size_t>(x.nbytes())) == 0);
}

// Whether two files that hold the same shard of alike sources hold the same records, judged
// by the first, middle and last (copies, read under the parts' guards: a file truncated
// meanwhile gives IoError). The same shard packed again with other options (codec, chunk
// size) has other bytes and the same records; a shard of other data alike in names, sizes and
// sampled bytes differs in nearly every record. A few chunks decoded, in this case only.
bool same_records_sampled(const Dataset& a, const Dataset& b) {
  if (a.size() != b.size() || !(a.schema() == b.schema())) return false;
  const int64_t n = a.size();
  std::vector<int64_t> records{0, n / 2, n - 1};
  if (n == 0) records.clear();
  records.erase(std::unique(records.begin(), records.end()), records.end());
  for (const Field& field : a.schema().fields()) {
    if (field.is_fixed()) {
      if (!same_bytes(a.get_batch(records, field.name), b.get_batch(records, field.name))) return false;
      continue;
    }
    const RaggedBatch x = a.get_ragged_batch(records, field.name), y = b.get_ragged_batch(records, field.name);
    if (!same_bytes(x.shapes, y.shapes) || !same_bytes(x.values, y.values)) return false;
  }
  return true;
}

// Shards packed apart (kShardMetadataKey) must come in order, each once: a shell's
// `ls part-*` puts part-10 before part-2, and a shard given twice reads as a plausible
// dataset of the wrong records. One pack's shards are the parts of equal N, R and sources
// (kShardSourceMetadataKey; N and R alone for shards written before it). Packs may follow one
// another or interleave: one rank's shards of several corpora, say. A shard number its pack
// holds already is the same shard given twice, unless the two files' fingerprints differ and
// so do their records: inputs alike in names, sizes and sampled bytes that hold other data
// (fingerprints and records are read only then, so concatenating stays O(1) a part). A
// concatenation of only some shards of one pack (a quick run on part of the data) says which
// it holds under the key.
void check_shard_order(Dataset::Concat& c) {
  struct Pack {
    PackedShard first;            // the pack's N, R and sources (and its first shard)
    std::vector<int64_t> shards;  // its shards given, in order
    std::vector<size_t> from;     // the part that gave each
    // The part holding shard k, if the pack has it.
    std::optional<size_t> part_of(int64_t k) const {
      const auto it = std::lower_bound(shards.begin(), shards.end(), k);
      if (it == shards.end() || *it != k) return std::nullopt;
      return from[static_cast<size_t>(it - shards.begin())];
    }
  };
  std::vector<Pack> packs;
  for (size_t p = 0; p < c.parts.size(); ++p) {
    const std::optional<PackedShard> shard = packed_shard(c.parts[p].metadata());
    if (!shard) continue;
    const int64_t k = shard->index;
    const auto pack =
        std::find_if(packs.rbegin(), packs.rend(), [&](const Pack& known) { return known.first.same_pack(*shard); });
    if (pack == packs.rend()) {
      packs.push_back(Pack{*shard, {k}, {p}});
      continue;
    }
    if (pack->part_of(k)) {
      // Against every earlier holder of shard k alike, not only this pack's: a copy given
      // again after another pack of alike inputs is still the same shard twice.
      for (const Pack& known : packs) {
        const std::optional<size_t> earlier = known.part_of(k);
        if (!earlier || !known.first.same_pack(*shard)) continue;
        MMT_CHECK(c.parts[*earlier].fingerprint() != c.parts[p].fingerprint(), ValueError, "Dataset::concat: shard ",
                  k, " of ", shard->count, " is given twice: ", part_name(c, *earlier), " and ", part_name(c, p),
                  " are the same file or copies of it");
        MMT_CHECK(!same_records_sampled(c.parts[*earlier], c.parts[p]), ValueError, "Dataset::concat: shard ", k,
                  " of ", shard->count, " is given twice: ", part_name(c, *earlier), " and ", part_name(c, p),
                  c.parts[p].size() == 0 ? " hold no records, both of them,"
                                         : " hold the same records (the first, middle and last compared)",
                  " in other bytes: the shard packed again with other options (codec, chunk size)?");
      }
      packs.push_back(Pack{*shard, {k}, {p}});  // the same shard of other data
      continue;
    }
    const int64_t last = pack->shards.back();
    MMT_CHECK(k > last, ValueError, "Dataset::concat: shards out of order: ", part_name(c, pack->from.back()),
              " is shard ", last, " of ", shard->count, " and ", part_name(c, p), " after it shard ", k,
              "; give them in shard order (a shell's 'ls' puts part-10 before part-2: sort -V)");
    pack->shards.push_back(k);
    pack->from.push_back(p);
  }
  const std::string key(kShardMetadataKey), source_key(kShardSourceMetadataKey);
  c.metadata.erase(source_key);
  if (packs.empty()) return;
  // The keys describe the concatenation only when it is one pack's shards and nothing else.
  const Pack& only = packs[0];
  if (packs.size() == 1 && only.from.size() == c.parts.size()) {
    // One pack: the whole reads as the dataset one pack of everything makes; some of it says
    // which shards it holds, and from what.
    if (static_cast<int64_t>(only.shards.size()) < only.first.count) {
      c.metadata[key] = to_string(ShardList{only.shards, only.first.count, only.first.records});
      if (!only.first.source.empty()) c.metadata[source_key] = only.first.source;
    } else {
      c.metadata.erase(key);
    }
  } else {
    c.metadata.erase(key);  // several packs, or other files beside: `mmt verify` checks each pack whole
  }
}

}  // namespace

std::shared_ptr<const Dataset::Concat> Dataset::Concat::make(std::vector<Dataset> given,
                                                             const ReaderOptions& options) {
  auto c = std::make_shared<Concat>();
  for (size_t k = 0; k < given.size(); ++k) {
    MMT_CHECK(given[k].is_open(), ValueError, "Dataset::concat: part ", k,
              " is an empty Dataset handle; open it with Dataset::open() first");
    if (given[k].concat_)
      c->parts.insert(c->parts.end(), given[k].concat_->parts.begin(), given[k].concat_->parts.end());
    else
      c->parts.push_back(std::move(given[k]));
  }
  MMT_CHECK(!c->parts.empty(), ValueError, "Dataset::concat: no datasets given");
  c->schema = c->parts[0].impl_->schema;
  c->options = options;
  c->first_record.push_back(0);
  c->first_chunk.push_back(0);
  std::map<std::string, size_t, std::less<>> key_from;  // which part a metadata key came from first
  // Which fields pack took from Fortran-order arrays says how their sources were laid out, not
  // what the values mean: parts packed from differently laid-out files still read as one
  // dataset. The list is kept when every part has the same one, and dropped otherwise (an
  // export of the whole then writes C order).
  std::optional<std::string> fortran_order;
  bool fortran_order_agrees = true;
  for (size_t p = 0; p < c->parts.size(); ++p) {
    const Impl& part = *c->parts[p].impl_;
    MMT_CHECK(*part.schema == *c->schema, ValueError, "Dataset::concat: ", part_name(*c, p),
              " has other fields than part 0 (", c->parts[0].path(), "): ", schema_difference(*c->schema, *part.schema),
              "; the parts of one dataset must have the same fields");
    for (const auto& [key, value] : part.metadata) {
      if (key == kFortranOrderMetadataKey) continue;  // settled below: a hint, not a dataset's meaning
      if (key == kShardMetadataKey && parse_shard_list(value)) continue;  // each part's own: checked below
      if (key == kShardSourceMetadataKey) continue;                           // so is its shard's source
      const auto [it, inserted] = c->metadata.emplace(key, value);
      if (inserted) {
        key_from.emplace(key, p);
        continue;
      }
      MMT_CHECK(it->second == value, ValueError, "Dataset::concat: metadata '", key, "' is ", quoted(it->second),
                " in ", part_name(*c, key_from.at(key)), " but ", quoted(value), " in ", part_name(*c, p),
                "; the parts of one dataset must agree on their metadata (shards of class folders must be packed "
                "with the same classes, or their labels mean different things)");
    }
    const auto listed = part.metadata.find(std::string(kFortranOrderMetadataKey));
    const std::string part_fortran_order = listed == part.metadata.end() ? std::string() : listed->second;
    if (p == 0) fortran_order = part_fortran_order;
    else if (part_fortran_order != *fortran_order) fortran_order_agrees = false;
    int64_t records = 0, chunks = 0;
    MMT_CHECK(format::checked_add(c->first_record.back(), part.record_count, &records) &&
                  format::checked_add(c->first_chunk.back(), part.chunk_count, &chunks),
              ValueError, "Dataset::concat: the parts' records or chunks overflow int64 at ", part_name(*c, p));
    c->first_record.push_back(records);
    c->first_chunk.push_back(chunks);
    if (p > 0) c->path += ", ";
    c->path += part.path;
    if (p > 0) c->absolute_path += ", ";
    c->absolute_path += part.absolute_path;
  }
  if (fortran_order_agrees && fortran_order && !fortran_order->empty())
    c->metadata[std::string(kFortranOrderMetadataKey)] = *fortran_order;
  check_shard_order(*c);
  c->read_ahead = std::make_unique<detail::ReadAheadPolicy>(c->options.read_ahead, /*auto_hints_from_start=*/false);
  c->instance_id = Impl::new_instance_id();
  c->contiguous = true;
  c->mincore_reports_page_cache = true;
  c->regions.lowest = UINTPTR_MAX;
  for (const Dataset& handle : c->parts) {
    const Impl& part = *handle.impl_;
    c->contiguous = c->contiguous && part.contiguous;
    c->mincore_reports_page_cache = c->mincore_reports_page_cache && part.mincore_reports_page_cache;
    c->part_data.push_back(part.base + part.data_offset);
    c->regions.regions.push_back(detail::MappedRegion{&part.path, part.base, part.file_bytes});
    const auto begin = reinterpret_cast<uintptr_t>(part.base);
    c->regions.lowest = std::min(c->regions.lowest, begin);
    c->regions.end = std::max(c->regions.end, begin + static_cast<uintptr_t>(part.file_bytes));
  }
  return c;
}

Dataset::Dataset(std::shared_ptr<const Concat> concat) : concat_(std::move(concat)) {}

Dataset Dataset::concat(const std::vector<Dataset>& parts) {
  std::shared_ptr<const Concat> c =
      Concat::make(parts, parts.empty() || !parts[0].is_open() ? ReaderOptions{} : parts[0].options());
  if (c->parts.size() == 1) return c->parts[0];
  return Dataset(std::move(c));
}

Dataset Dataset::open_concat(const std::vector<std::string>& paths, ReaderOptions options) {
  MMT_CHECK(!paths.empty(), ValueError, "Dataset::open_concat: no paths given");
  if (paths.size() == 1) return open(paths[0], options);
  // The first part's cache (and its count of decoded memory) serves every part: one budget
  // for the whole dataset, whatever the number of shards.
  std::vector<Dataset> parts;
  parts.reserve(paths.size());
  Impl::SharedCache shared;
  for (const std::string& path : paths) {
    std::shared_ptr<const Impl> part = Impl::open(path, options, parts.empty() ? nullptr : &shared);
    if (parts.empty()) {
      shared.cache = part->cache;
      shared.decoded_memory = part->decoded_memory;
    }
    MMT_CHECK(format::checked_add(shared.key_base, part->chunk_count, &shared.key_base), ValueError,
              "Dataset::open_concat: the parts' chunks overflow int64 at ", path);
    parts.push_back(Dataset(std::move(part)));
  }
  return Dataset(Concat::make(std::move(parts), options));
}

std::vector<Dataset> Dataset::parts() const {
  if (concat_) return concat_->parts;
  checked_impl(impl_);
  return {*this};
}

Dataset::Location Dataset::locate(int64_t index) const {
  if (!concat_) return {0, checked_impl(impl_).normalize_index(index, "locate")};
  return concat_->locate(index, "locate");
}

Dataset::Location Dataset::Concat::locate(int64_t index, const char* what) const {
  const int64_t i = normalize_index(index, what);
  const size_t p = part_of_record(i);
  return {p, i - first_record[p]};
}

// ---- lookups ----

int64_t Dataset::Concat::normalize_index(int64_t index, const char* what) const {
  const int64_t records = size();
  const int64_t i = index < 0 ? index + records : index;
  if (i < 0 || i >= records) [[unlikely]]
    throw IndexError(detail::str(what, ": record index ", index, " is out of range for a dataset of ", records,
                                 " records in ", parts.size(), " parts",
                                 records > 0 ? detail::str(" (valid: ", -records, "..", records - 1, ")")
                                             : std::string()));
  return i;
}

size_t Dataset::Concat::part_of_record(int64_t record) const {
  return detail::part_holding(first_record.data() + 1, parts.size(), record);
}

size_t Dataset::Concat::part_of_chunk(int64_t chunk) const {
  return static_cast<size_t>(std::upper_bound(first_chunk.begin() + 1, first_chunk.end(), chunk) -
                             (first_chunk.begin() + 1));
}

DatasetInfo Dataset::Concat::info() const {
  DatasetInfo total;
  for (size_t p = 0; p < parts.size(); ++p) {
    const DatasetInfo part = parts[p].info();
    if (p == 0) {
      total.format_version = part.format_version;
      total.alignment = part.alignment;
      total.codec = part.codec;
    } else if (part.codec != total.codec) {
      total.codecs_differ = true;
    }
    total.codecs_differ = total.codecs_differ || part.codecs_differ;
    MMT_CHECK(format::checked_add(total.file_bytes, part.file_bytes, &total.file_bytes) &&
                  format::checked_add(total.stored_bytes, part.stored_bytes, &total.stored_bytes) &&
                  format::checked_add(total.decoded_bytes, part.decoded_bytes, &total.decoded_bytes),
              FormatError, "the sizes of the parts overflow int64 at ", part_name(*this, p));
  }
  total.records = size();
  total.chunks = num_chunks();
  total.part_count = static_cast<int64_t>(parts.size());
  return total;
}

uint64_t Dataset::Concat::compute_fingerprint() const {
  // Each part's record count and fingerprint, in order: the same files in another order (or
  // another file in one place) make another dataset.
  std::vector<uint64_t> words;
  words.reserve(2 * parts.size());
  for (const Dataset& part : parts) {
    words.push_back(static_cast<uint64_t>(part.size()));
    words.push_back(part.fingerprint());
  }
  const uint64_t hash = detail::checksum64(words.data(), words.size() * sizeof(uint64_t), /*seed=*/parts.size());
  return hash == 0 ? 1 : hash;
}

ChunkInfo Dataset::Concat::chunk(int64_t chunk_index) const {
  MMT_CHECK(chunk_index >= 0 && chunk_index < num_chunks(), IndexError, "chunk index ", chunk_index,
            " is out of range for a dataset of ", num_chunks(), " chunks in ", parts.size(), " parts");
  const size_t p = part_of_chunk(chunk_index);
  ChunkInfo info = parts[p].chunk(chunk_index - first_chunk[p]);
  info.index = chunk_index;
  info.first_record += first_record[p];
  info.part = static_cast<int64_t>(p);
  return info;
}

Sample Dataset::Concat::get(int64_t index) const {
  const int64_t i = normalize_index(index, "get");
  const size_t p = part_of_record(i);
  Sample sample = parts[p].get(i - first_record[p]);
  sample.index_ = i;
  return sample;
}

// ---- ranges ----

Tensor Dataset::Concat::column(std::string_view field, int64_t start, int64_t stop) const {
  MMT_CHECK(start >= 0 && start <= stop && stop <= size(), IndexError, "column('", field, "', ", start, ", ", stop,
            "): the range must satisfy 0 <= start <= stop <= ", size());
  if (start == stop) return parts[0].column(field, 0, 0);
  const size_t first = part_of_record(start), last = part_of_record(stop - 1);
  if (first == last) return parts[first].column(field, start - first_record[first], stop - first_record[first]);
  // Across parts: a copy, in the field's storage order, filled part by part.
  Tensor out;
  for (size_t p = first; p <= last; ++p) {
    const int64_t lo = std::max(start, first_record[p]), hi = std::min(stop, first_record[p + 1]);
    if (lo == hi) continue;  // an empty part
    const Tensor piece = parts[p].column(field, lo - first_record[p], hi - first_record[p]);
    if (!out.defined()) {
      DimVector sizes{stop - start}, strides{1};
      for (size_t d = 1; d < piece.sizes().size(); ++d) sizes.push_back(piece.size(static_cast<int64_t>(d)));
      int64_t value_numel = 1;
      for (size_t d = 1; d < sizes.size(); ++d) value_numel *= sizes[d];
      strides[0] = value_numel;
      for (size_t d = 1; d < piece.strides().size(); ++d) strides.push_back(piece.stride(static_cast<int64_t>(d)));
      out = empty_strided(sizes, strides, piece.dtype());
    }
    copy_from_part(*parts[p].impl_, out.narrow(0, lo - start, hi - lo), piece);
  }
  return out;
}

RaggedBatch Dataset::Concat::ragged_column(std::string_view field, int64_t start, int64_t stop) const {
  MMT_CHECK(start >= 0 && start <= stop && stop <= size(), IndexError, "ragged_column('", field, "', ", start, ", ",
            stop, "): the range must satisfy 0 <= start <= stop <= ", size());
  if (start == stop) return parts[0].ragged_column(field, 0, 0);
  const size_t first = part_of_record(start), last = part_of_record(stop - 1);
  if (first == last)
    return parts[first].ragged_column(field, start - first_record[first], stop - first_record[first]);
  std::vector<RaggedBatch> pieces;
  std::vector<const Impl*> piece_parts;
  for (size_t p = first; p <= last; ++p) {
    const int64_t lo = std::max(start, first_record[p]), hi = std::min(stop, first_record[p + 1]);
    if (lo == hi) continue;
    pieces.push_back(parts[p].ragged_column(field, lo - first_record[p], hi - first_record[p]));
    piece_parts.push_back(parts[p].impl_.get());
  }
  const int64_t n = stop - start;
  const int64_t ndim = pieces[0].shapes.size(1);
  RaggedBatch out;
  out.offsets = empty({n + 1}, kInt64);
  out.shapes = empty({n, ndim}, kInt64);
  int64_t* offsets = out.offsets.mutable_data_ptr<int64_t>();
  offsets[0] = 0;
  int64_t row = 0;
  for (const RaggedBatch& piece : pieces) {
    const int64_t rows = piece.shapes.size(0);
    const int64_t* piece_offsets = piece.offsets.data_ptr<int64_t>();
    for (int64_t r = 0; r < rows; ++r) offsets[row + r + 1] = offsets[row] + piece_offsets[r + 1];
    if (rows * ndim > 0) out.shapes.narrow(0, row, rows).copy_(piece.shapes);
    row += rows;
  }
  // The values one piece after another (a piece may be a view into its part's mapping).
  out.values = empty({offsets[n]}, pieces[0].values.dtype());
  for (size_t k = 0, at = 0; k < pieces.size(); ++k) {
    const int64_t count = pieces[k].values.numel();
    copy_from_part(*piece_parts[k], out.values.narrow(0, static_cast<int64_t>(at), count), pieces[k].values);
    at += static_cast<size_t>(count);
  }
  return out;
}

RaggedBatch Dataset::Concat::get_ragged_batch(std::span<const int64_t> indices, std::string_view field) const {
  thread_local BatchByPart scratch;
  BatchByPart& by_part = scratch;
  by_part.group(*this, indices, "get_ragged_batch");
  const size_t only = by_part.parts_used == 1 ? by_part.part_at[0] : parts.size();
  if (indices.empty() || only < parts.size())
    return parts[indices.empty() ? 0 : only].get_ragged_batch(by_part.local_of(indices.empty() ? 0 : only), field);
  // Each part's records in one call, then interleaved back into the batch's order.
  std::vector<RaggedBatch> pieces(parts.size());
  for (size_t p = 0; p < parts.size(); ++p)
    if (by_part.begin[p + 1] > by_part.begin[p]) pieces[p] = parts[p].get_ragged_batch(by_part.local_of(p), field);
  const int64_t batch = static_cast<int64_t>(indices.size());
  const RaggedBatch& some = pieces[by_part.part_at[0]];
  const int64_t ndim = some.shapes.size(1);
  const int64_t element_bytes = some.values.element_size();
  RaggedBatch out;
  out.offsets = empty({batch + 1}, kInt64);
  out.shapes = empty({batch, ndim}, kInt64);
  int64_t* offsets = out.offsets.mutable_data_ptr<int64_t>();
  int64_t* shapes = out.shapes.mutable_data_ptr<int64_t>();
  std::vector<int64_t> next_row(parts.size(), 0);  // each part's rows are in batch order
  offsets[0] = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const size_t p = by_part.part_at[static_cast<size_t>(b)];
    const int64_t r = next_row[p]++;
    const int64_t* piece_offsets = pieces[p].offsets.data_ptr<int64_t>();
    offsets[b + 1] = offsets[b] + piece_offsets[r + 1] - piece_offsets[r];
    std::memcpy(shapes + b * ndim, pieces[p].shapes.data_ptr<int64_t>() + r * ndim, static_cast<size_t>(ndim) * 8);
  }
  out.values = empty({offsets[batch]}, some.values.dtype());
  auto* values = static_cast<std::byte*>(out.values.mutable_data_ptr());
  std::fill(next_row.begin(), next_row.end(), 0);
  for (int64_t b = 0; b < batch; ++b) {
    const size_t p = by_part.part_at[static_cast<size_t>(b)];
    const int64_t r = next_row[p]++;
    const int64_t* piece_offsets = pieces[p].offsets.data_ptr<int64_t>();
    const auto* piece_values = static_cast<const std::byte*>(pieces[p].values.data_ptr());
    std::memcpy(values + offsets[b] * element_bytes, piece_values + piece_offsets[r] * element_bytes,
                static_cast<size_t>((offsets[b + 1] - offsets[b]) * element_bytes));
  }
  return out;
}

// ---- batches ----

void Dataset::Concat::get_batch(std::span<const int64_t> indices, std::span<const std::string> fields,
                                std::span<const Tensor> outs, int threads) const {
  // One read-ahead decision for the whole batch, whatever parts it falls in: a part's share
  // of a shuffled batch over many shards is a few records, too few for the part to tell a cold
  // batch by, and a check per part would cost as much as one for the batch.
  detail::gather_shards_reading_ahead(*this, indices, fields, outs, threads);
}

void Dataset::Concat::gather_part_by_part(std::span<const int64_t> indices, std::span<const std::string> fields,
                                          std::span<const Tensor> outs, int threads) const {
  const detail::ReadAheadPolicy::DatasetHintsOff parts_hints_off;  // held on the pool's threads too (gather_parts)
  thread_local BatchByPart scratch;
  BatchByPart& by_part = scratch;  // the pool's threads below reach it through this reference
  by_part.group(*this, indices, "get_batch");
  if (by_part.parts_used <= 1) {  // a batch inside one part (or none): that part's own gather
    const size_t p = indices.empty() ? 0 : by_part.part_at[0];
    return parts[p].get_batch(by_part.local_of(p), fields, outs, threads);
  }
  thread_local std::vector<detail::PartRows> used;
  used.clear();
  for (size_t p = 0; p < parts.size(); ++p)
    if (by_part.begin[p + 1] > by_part.begin[p])
      used.push_back({parts[p].impl_.get(), by_part.local_of(p), by_part.rows.data() + by_part.begin[p]});
  detail::gather_parts(used, static_cast<int64_t>(indices.size()), fields, outs, threads);
}

bool Dataset::Concat::sample_looks_cold(std::span<const int64_t> indices,
                                        std::span<const std::string> fields) const noexcept {
  try {
    std::vector<size_t> positions;
    for (const std::string& name : fields) positions.push_back(schema->index_of(name));
    const size_t n = indices.size();
    for (const size_t k : {size_t{0}, n / 4, n / 2, 3 * n / 4}) {  // spread: a batch may start in cached records
      const int64_t index = indices[k];
      if (index < -size() || index >= size()) return false;  // the gather's to report
      const Location at = locate(index, "get_batch");
      const Impl& part = *parts[at.part].impl_;
      if (part.batch_looks_cold(std::span<const int64_t>(&at.index, 1), positions)) return true;
    }
  } catch (...) {  // unsure: no hint (the gather reports what is wrong)
  }
  return false;
}

void Dataset::Concat::gather_records_at(std::span<const int64_t> indices, std::span<const std::string> fields,
                                        std::span<const Tensor> outs, int threads) const {
  // Every index checked (one pass without branches, as a single file's gather), and, until
  // every chunk has been, every record's chunk validated, before anything is written.
  const int64_t records = size();
  bool any_out_of_range = false;
  for (int64_t index : indices)
    any_out_of_range |= static_cast<uint64_t>(index < 0 ? index + records : index) >= static_cast<uint64_t>(records);
  if (any_out_of_range) [[unlikely]]
    for (int64_t index : indices) normalize_index(index, "get_batch");
  if (!all_validated.load(std::memory_order_acquire)) [[unlikely]] {
    for (int64_t index : indices) {
      const Location at = locate(index, "get_batch");
      const Impl& part = *parts[at.part].impl_;
      part.ensure_validated(at.index / part.records_per_chunk);
    }
    bool all = true;
    for (const Dataset& part : parts) all = all && part.impl_->all_chunks_validated();
    if (all) all_validated.store(true, std::memory_order_release);
  }
  const detail::ContiguousParts where{part_data.data(), first_record.data(), parts.size(),
                                      parts[0].impl_->record_stride_bytes, records};
  detail::gather_records(*parts[0].impl_, indices, where, regions, fields, outs, threads);
}

void Dataset::Concat::prefetch(std::span<const int64_t> indices, std::span<const std::string> fields,
                               bool every_field) const {
  thread_local BatchByPart scratch;
  BatchByPart& by_part = scratch;
  by_part.group(*this, indices, "prefetch");
  for (size_t p = 0; p < parts.size(); ++p) {
    if (by_part.begin[p + 1] == by_part.begin[p]) {
      if (!every_field && p == 0) parts[0].prefetch({}, fields);  // unknown field names: ValueError all the same
      continue;
    }
    if (every_field)
      parts[p].prefetch(by_part.local_of(p));
    else
      parts[p].prefetch(by_part.local_of(p), fields);
  }
}

// ---- statistics ----

CacheStats Dataset::Concat::cache_stats() const {
  // Parts opened together share one cache; parts concatenated from handles have their own
  // (a handle given twice, one). Each cache and each count of decoded memory once. The
  // budget is the smallest cache's: what a run of chunks can count on staying cached (the
  // quasi-random sampler sizes its window by it, and the loader what a piece may hold),
  // since nothing keeps those chunks spread over the parts' caches.
  CacheStats total;
  total.budget_bytes = -1;
  std::unordered_set<const void*> caches, memories;
  for (const Dataset& part : parts) {
    const Impl& d = *part.impl_;
    if (caches.insert(d.cache.get()).second) {
      const CacheStats s = d.cache->stats();
      total.hits += s.hits;
      total.misses += s.misses;
      total.evictions += s.evictions;
      total.bytes_cached += s.bytes_cached;
      total.budget_bytes = total.budget_bytes < 0 ? s.budget_bytes : std::min(total.budget_bytes, s.budget_bytes);
    }
    if (memories.insert(d.decoded_memory.get()).second) {
      total.decoded_bytes_live += d.decoded_memory->live.load(std::memory_order_relaxed);
      total.decoded_bytes_peak += d.decoded_memory->peak.load(std::memory_order_relaxed);  // each part's own peak
    }
  }
  return total;
}

ReadAheadStats Dataset::Concat::read_ahead_stats() const {
  ReadAheadStats total;
  std::unordered_set<const Impl*> seen;
  for (const Dataset& part : parts) {
    if (!seen.insert(part.impl_.get()).second) continue;
    const ReadAheadStats s = part.read_ahead_stats();
    total.batches_read_ahead += s.batches_read_ahead;
    total.batches_checked += s.batches_checked;
    total.reading_ahead = total.reading_ahead || s.reading_ahead;
  }
  total.batches_read_ahead += read_ahead->batches_hinted();
  total.batches_checked += read_ahead->batches_checked();
  total.reading_ahead = total.reading_ahead || read_ahead->hinting();
  return total;
}

}  // namespace mmt
