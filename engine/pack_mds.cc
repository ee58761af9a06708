// PackSources::from_mds: MosaicML Streaming datasets (MDS shards and their index.json) as
// pack sources, one record per sample; values view the mapped shards (or, a run of small
// samples at a time, are copied into one buffer a column).
//
// The layout read (streaming/base/format/mds, index version 2):
//   index.json  {"version": 2, "shards": [{"format": "mds", "version": 2, "samples": N,
//               "column_names": [...], "column_encodings": [...], "column_sizes": [int|null],
//               "compression": null | "zstd[:L]" | "gz[:L]" | ..., "raw_data": {"basename",
//               "bytes", "hashes": {"xxh64": HEX, ...}},
//               "zip_data": null | {"basename"}, ...}, ...]}
//   a shard     uint32 N; uint32 offsets[N + 1] (absolute, from the file's start); the
//               writer's config as JSON; the samples. A sample: a uint32 size for each
//               column of no fixed size, in column order, then each column's bytes.
// Column encodings: "bytes", "str", "json", "pkl", "jpeg", "png", "pil", "str_int",
// "str_float", "str_decimal" are kept as bytes (uint8, variable length; the encoding is in
// the metadata); "int" and the scalar encodings ("uint8" ... "float64") as one value of that
// dtype; "ndarray:DTYPE:D1,D2,..." as a fixed field of that shape; "ndarray:DTYPE" and
// "ndarray" (the dtype in each sample) as an array a record, every sample's of the first
// one's rank (1 to 8) and dtype: ragged, its first dimension variable and the others too unless
// every sample's are alike (boxes of shape (n, 4): a [-1, 4] field). Nothing is trusted: every
// offset, size and array header is checked against the shard when the sources are made, and
// again as a record is read.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <deque>
#include <filesystem>
#include <future>

#include <nlohmann/json.hpp>

#include "checksum.h"
#include "cpu_budget.h"
#include "decompressed_file.h"
#include "import_util.h"
#include "mapping_guard.h"
#include "mmtensor/error.h"
#include "mmtensor/packer.h"
#include "utf8.h"

namespace mmt {

namespace detail {

struct MdsShards {
  enum class Kind : uint8_t { Bytes, Fixed, Array };
  struct Column {
    std::string name, encoding;
    Kind kind = Kind::Bytes;
    ScalarType dtype = kUInt8;
    DimVector shape;            // Fixed: the value's shape
    int64_t fixed_bytes = -1;   // the encoded size when fixed, else -1
    bool dtype_in_sample = false;  // Array: "ndarray" without a dtype
    int64_t rank = 0;              // Array: its arrays' dimensions, the first sample's (0 before it)
    // Array: the first sample's dimensions after its first. When every sample's are the same
    // (boxes of shape (n, 4)), the field is [-1, ...row_shape] and its records pack in runs, in
    // PyTorch's jagged layout; else every dimension is variable and records pack one by one.
    DimVector row_shape;
    bool rows_alike = true;

    // The values in one step of an array's first dimension: 0 when a dimension after it is 0.
    int64_t row_values() const {
      int64_t n = 1;
      for (const int64_t size : row_shape) n *= size;  // sample_values() checked they multiply
      return n;
    }
  };
  struct Shard {
    UntypedStorage file;  // the shard mapped; empty for a compressed one, whose decompression is
    int64_t decompressed = -1;  // this one of `decompressed`
    std::string path;     // as named in errors: the .mds, or the compressed file
    int64_t samples = 0;
  };
  std::vector<Column> columns;
  std::vector<Shard> shards;
  std::vector<int64_t> shard_end;  // records before the end of each shard
  DecompressedFiles decompressed;  // compressed shards' decompressions, within a budget of $TMPDIR

  UntypedStorage file_of(const Shard& shard) const {
    return shard.decompressed < 0 ? shard.file : decompressed.get(static_cast<size_t>(shard.decompressed));
  }

};

}  // namespace detail

namespace {

using detail::MdsShards;
using detail::str;
namespace fs = std::filesystem;

// MDS's NDArray value dtypes and their codes in a sample; also its scalar encodings' dtypes.
struct NdarrayDtype {
  int code;
  ScalarType dtype;
};
constexpr NdarrayDtype kNdarrayDtypes[] = {{8, kUInt8},    {9, kInt8},     {16, kUInt16}, {17, kInt16},
                                           {18, kFloat16}, {32, kUInt32},  {33, kInt32},  {34, kFloat32},
                                           {64, kUInt64},  {65, kInt64},   {66, kFloat64}};
std::optional<ScalarType> ndarray_dtype(int code) {
  for (const NdarrayDtype& d : kNdarrayDtypes)
    if (d.code == code) return d.dtype;
  return std::nullopt;
}
// The dtype an MDS dtype name ("uint8" ... "float64") names; nullopt for other text.
std::optional<ScalarType> mds_dtype(const std::string& name) {
  for (const NdarrayDtype& d : kNdarrayDtypes)
    if (to_string(d.dtype) == name) return d.dtype;
  return std::nullopt;
}

// A column as its encoding makes it; ValueError naming the column for one that is not MDS's.
MdsShards::Column column_of(const std::string& name, const std::string& encoding, const std::string& where) {
  MdsShards::Column column{.name = name, .encoding = encoding};
  const auto refuse = [&](const std::string& why) {
    return ValueError(str(where, ": column '", detail::cut_for_message(name, 100), "' (encoding '",
                          detail::cut_for_message(encoding, 100), "'): ", why));
  };
  static const char* const kBytes[] = {"bytes",   "str", "json",      "pkl",       "jpeg",       "png",
                                       "pil",     "str_int", "str_float", "str_decimal"};
  const std::string base = encoding.substr(0, encoding.find(':'));
  for (const char* b : kBytes) {
    if (encoding == b) return column;
    if (base == b && base == "jpeg") {  // "jpeg:QUALITY", the only bytes encoding with a setting
      const std::string quality = encoding.substr(5);
      int q = -1;
      const auto [at, error] = std::from_chars(quality.data(), quality.data() + quality.size(), q);
      if (error != std::errc() || at != quality.data() + quality.size() || q < 0 || q > 100)
        throw refuse("a JPEG quality is 0 to 100");
      return column;
    }
  }
  if (encoding == "int") {
    column.kind = MdsShards::Kind::Fixed;
    column.dtype = kInt64;
    column.fixed_bytes = 8;
    return column;
  }
  if (const std::optional<ScalarType> scalar = mds_dtype(encoding)) {
    column.kind = MdsShards::Kind::Fixed;
    column.dtype = *scalar;
    column.fixed_bytes = element_size(*scalar);
    return column;
  }
  if (base != "ndarray") throw refuse("not an MDS encoding this packer reads");
  const std::string config = encoding.size() > base.size() ? encoding.substr(base.size() + 1) : std::string();
  const size_t colon = config.find(':');
  const std::string dtype_text = config.substr(0, colon);
  if (dtype_text.empty()) {
    if (colon != std::string::npos) throw refuse("a shape without a dtype");
    column.kind = MdsShards::Kind::Array;
    column.dtype_in_sample = true;
    return column;
  }
  const std::optional<ScalarType> dtype = mds_dtype(dtype_text);
  if (!dtype) throw refuse(str("'", dtype_text, "' is not an NDArray dtype"));
  column.dtype = *dtype;
  if (colon == std::string::npos) {
    column.kind = MdsShards::Kind::Array;
    return column;
  }
  column.kind = MdsShards::Kind::Fixed;
  const std::string shape = config.substr(colon + 1);
  for (size_t begin = 0; begin <= shape.size();) {
    const size_t end = std::min(shape.find(',', begin), shape.size());
    int64_t d = 0;
    const auto [at, error] = std::from_chars(shape.data() + begin, shape.data() + end, d);
    if (error != std::errc() || at != shape.data() + end || d < 1) throw refuse(str("the shape '", shape, "' is not dimensions >= 1"));
    column.shape.push_back(d);
    begin = end + 1;
  }
  column.fixed_bytes = detail::checked_shape_nbytes(column.shape, element_size(*dtype), where);
  return column;
}

uint32_t u32_at(const UntypedStorage& file, int64_t at) { return detail::load_le32(file.data() + at); }

// Shards against a digest their index gives in raw_data.hashes (MDSWriter(hashes=[...])): a
// shard damaged, or replaced by another of the same size, is refused before any of it is
// packed. One digest a shard is checked, the fastest given (the digests describe the same
// bytes): xxHash's run at 6-7 GB/s on one core, SHA-1 and SHA-256 at about 1.2-1.3 GB/s on CPUs
// with SHA instructions, MD5 and BLAKE2 at 0.4-0.6, SHA-3 at 0.1-0.2. So shards are hashed on
// threads, one a CPU, while the next shards' structures are read; an index giving only names
// hashlib and python-xxhash do not know has nothing checkable, as one giving no digest.
class ShardDigests {
 public:
  ShardDigests() : in_flight_(static_cast<size_t>(std::max(1, detail::available_cpus()))) {}

  void check(const nlohmann::json& raw_data, const MdsShards::Shard& read, bool is_raw, const std::string& where) {
    const auto hashes = raw_data.find("hashes");
    if (hashes == raw_data.end() || !hashes->is_object()) return;
    std::vector<std::pair<std::string, std::string>> given;  // fastest first
    for (const char* algorithm : kFastestFirst) {
      const auto expected = hashes->find(algorithm);
      if (expected != hashes->end() && expected->is_string()) given.emplace_back(algorithm, expected->get<std::string>());
    }
    if (given.empty()) return;
    if (pending_.size() == in_flight_) wait_oldest();
    // The task holds the shard's storage: a decompressed one outlives its place in the budget.
    pending_.push_back(std::async(std::launch::async, [given = std::move(given), file = read.file, path = read.path,
                                                       is_raw, where] {
      for (const auto& digest : given) {
        const std::string& algorithm = digest.first;  // named, not bound: clang 14 captures no bindings
        const std::string& expected = digest.second;
        std::optional<detail::HexDigest> hasher = detail::HexDigest::make(algorithm);
        if (!hasher) continue;  // a digest this libcrypto withholds: the next one given, if any
        // The guarded section only reads: the hasher's state is made and freed outside it.
        detail::guard_storage_reads(file, [&] { hasher->update(file.data(), static_cast<size_t>(file.nbytes())); });
        const std::string actual = hasher->hex();
        std::string expected_hex = expected;
        for (char& c : expected_hex) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        MMT_CHECK(actual == expected_hex, FormatError, path, ": its ", is_raw ? "" : "decompressed ", "bytes' ",
                  algorithm, " digest is ", actual, ", but ", where, " says ", detail::cut_for_message(expected, 40),
                  " (raw_data.hashes); the shard is damaged, or is not the one the index was written with");
        return;
      }
    }));
  }

  // Every check done; the first failure (in shard order) thrown.
  void wait_all() {
    while (!pending_.empty()) wait_oldest();
  }

 private:
  static constexpr const char* kFastestFirst[] = {
      "xxh3_64", "xxh3_128", "xxh128", "xxh64",  "xxh32",   "sha1",     "sha256",   "sha224",  "blake2b",
      "md5",     "sha512",   "sha384", "blake2s", "sha3_224", "sha3_256", "sha3_384", "sha3_512"};

  void wait_oldest() {
    std::future<void> oldest = std::move(pending_.front());
    pending_.pop_front();
    oldest.get();
  }

  size_t in_flight_;
  std::deque<std::future<void>> pending_;  // a future of std::async joins its thread when destroyed
};

// Where sample `j` of `shard` lies, checked: [begin, end) in the file.
// `file` is the shard's bytes (its mapping, or its decompression).
std::pair<int64_t, int64_t> sample_range(const MdsShards::Shard& shard, const UntypedStorage& file, int64_t j, bool again) {
  const int64_t header_end = 4 + 4 * (shard.samples + 1);
  const int64_t begin = u32_at(file, 4 + 4 * j), end = u32_at(file, 8 + 4 * j);
  if (begin < header_end || begin > end || end > file.nbytes()) {
    const std::string what = str(shard.path, ": sample ", j, " spans bytes [", begin, ", ", end, ") (offsets at byte ",
                                 4 + 4 * j, "), outside the samples of a ", file.nbytes(), "-byte shard");
    if (again) throw IoError(what + "; the shard changed while it was being packed");
    throw FormatError(what);
  }
  return {begin, end};
}

// The columns' byte ranges of a sample, checked against its size; and for a 1-D array, where
// its values begin and its dtype. Throws FormatError (or IoError when `again`) naming the shard,
// the sample and the column.
struct ValueAt {
  int64_t offset = 0, size = 0;
  ScalarType dtype = kUInt8;
  DimVector shape;  // an array's of no fixed shape
};
void sample_values(const MdsShards& mds, const MdsShards::Shard& shard, const UntypedStorage& file, int64_t j, bool again,
                   std::vector<ValueAt>& values) {
  const std::pair<int64_t, int64_t> range = sample_range(shard, file, j, again);
  const int64_t begin = range.first, end = range.second;  // plain variables: lambdas capture them (clang 14)
  // Thrown here, as its own type: an Error returned by value would be sliced to the base.
  const auto fault = [&](const std::string& why) {
    const std::string what = str(shard.path, ": sample ", j, " (bytes ", begin, " to ", end, "): ", why);
    if (again) throw IoError(what + "; the shard changed while it was being packed");
    throw FormatError(what);
  };
  values.resize(mds.columns.size());
  int64_t at = begin;
  for (size_t c = 0; c < mds.columns.size(); ++c) {
    if (mds.columns[c].fixed_bytes >= 0) continue;
    if (end - at < 4) fault("its column sizes run past its end");
    values[c].size = u32_at(file, at);
    at += 4;
  }
  for (size_t c = 0; c < mds.columns.size(); ++c) {
    const MdsShards::Column& column = mds.columns[c];
    ValueAt& value = values[c];
    if (column.fixed_bytes >= 0) value.size = column.fixed_bytes;
    if (value.size > end - at)
      fault(str("column '", detail::cut_for_message(column.name, 100), "' (", value.size,
                      " bytes) runs past its end"));
    value.offset = at;
    value.dtype = column.dtype;
    at += value.size;
    if (column.kind != MdsShards::Kind::Array) continue;
    // [dtype code, when not in the encoding] [ndim << 2 | shape dtype] [shape] [values]
    int64_t header = 0;
    const auto byte = [&](int64_t k) -> int {
      if (k >= value.size) fault(str("column '", detail::cut_for_message(column.name, 100), "': its array header is cut short"));
      return static_cast<int>(static_cast<uint8_t>(file.data()[value.offset + k]));
    };
    if (column.dtype_in_sample) {
      const std::optional<ScalarType> dtype = ndarray_dtype(byte(0));
      if (!dtype) fault(str("column '", detail::cut_for_message(column.name, 100), "': dtype code ", byte(0), " is none of NDArray's"));
      value.dtype = *dtype;
      header = 1;
    }
    const int shape_byte = byte(header);
    const int64_t rank = shape_byte >> 2;
    if (rank < 1 || rank > 8)  // kMaxFieldRank is more; MDS writes what numpy holds, and 0-d is no array here
      fault(str("column '", detail::cut_for_message(column.name, 100), "': an array of ", rank, " dimensions; arrays "
                "of 1 to 8 are packed"));
    const int64_t shape_bytes = int64_t{1} << (shape_byte & 3);
    if (value.size - header - 1 < rank * shape_bytes)
      fault(str("column '", detail::cut_for_message(column.name, 100), "': its array header is cut short"));
    value.shape.clear();
    // An array may have no values and other dimensions (boxes of shape (0, 4): an image with
    // no object). The dimensions that are not 0 multiply, with the item size, to no more than
    // an int64 holds, so that no extent or stride made of them overflows; an array with values
    // must then fill its bytes exactly (below).
    int64_t nonzero = element_size(value.dtype);
    bool empty = false;
    for (int64_t d = 0; d < rank; ++d) {
      uint64_t n = 0;
      for (int64_t k = 0; k < shape_bytes; ++k) n |= static_cast<uint64_t>(byte(header + 1 + d * shape_bytes + k)) << (8 * k);
      if (n > static_cast<uint64_t>(INT64_MAX) || (n > 0 && __builtin_mul_overflow(nonzero, static_cast<int64_t>(n), &nonzero)))
        fault(str("column '", detail::cut_for_message(column.name, 100), "': dimension ", d, " of its array is ", n,
                  ", and its shape's bytes overflow a 64-bit size"));
      empty = empty || n == 0;
      value.shape.push_back(static_cast<int64_t>(n));
    }
    const int64_t numel = empty ? 0 : nonzero / element_size(value.dtype);
    header += 1 + rank * shape_bytes;
    const int64_t item = element_size(value.dtype);
    if (numel > value.size || numel * item != value.size - header)
      fault(str("column '", detail::cut_for_message(column.name, 100), "': its array of shape ", IntArrayRef(value.shape),
                " (", to_string(value.dtype), ") does not fill its ", value.size - header, " bytes"));
    value.offset += header;
    value.size -= header;
  }
  if (at != end) fault(str("its columns take ", at - begin, " of its ", end - begin, " bytes"));
}

// Whether an array's dimensions after its first are `row_shape`.
bool rows_are(const DimVector& shape, const DimVector& row_shape) {
  return shape.size() == row_shape.size() + 1 && std::equal(row_shape.begin(), row_shape.end(), shape.begin() + 1);
}

// An array's dtype, rank and (in a field of alike rows) dimensions after its first as the scan
// found them in every sample: one that differs now was written while the shard was being packed.
void check_array_unchanged(const MdsShards::Shard& shard, int64_t j, const MdsShards::Column& column,
                           const ValueAt& value) {
  if (column.kind == MdsShards::Kind::Array &&
      (value.dtype != column.dtype || static_cast<int64_t>(value.shape.size()) != column.rank ||
       (column.rows_alike && !rows_are(value.shape, column.row_shape))))
    throw IoError(str(shard.path, ": sample ", j, ", column '", column.name,
                      "': its dtype or shape changed while the shard was being packed"));
}

// The index.json of an MDS input: DIR/index.json, or the file itself.
std::optional<std::string> mds_index_of(const std::string& spec) {
  std::error_code ec;
  const fs::path path(spec);
  const fs::path index = fs::is_directory(path, ec) ? path / "index.json" : path;
  if (index.filename() != "index.json" || !fs::is_regular_file(index, ec)) return std::nullopt;
  return index.string();
}

}  // namespace

bool are_mds_inputs(std::span<const std::string> specs) {
  return std::any_of(specs.begin(), specs.end(), [](const std::string& s) { return mds_index_of(s).has_value(); });
}

PackSources PackSources::from_mds(std::span<const std::string> specs) {
  MMT_CHECK(!specs.empty(), ValueError, "no MDS datasets to pack");
  auto mds = std::make_shared<MdsShards>();
  PackSources out;
  std::string first_index;
  std::vector<std::string> indexes, index_paths;  // canonical, and as found
  ShardDigests digests;
  // A shard that fails its digest check is named first, whatever the reading of its structure
  // (or of a later shard's) finds meanwhile: a damaged shard's bytes make either error, and
  // the digest says which shard is not the one indexed.
  try {
    for (const std::string& spec : specs) {
      const std::optional<std::string> index_path = mds_index_of(spec);
      MMT_CHECK(index_path.has_value(), ValueError, "input '", spec, "' is not an MDS dataset (a folder holding ",
                "index.json, or that file); MDS datasets are packed alone, not with other inputs");
      std::error_code ec;
      const std::string canonical = fs::weakly_canonical(*index_path, ec).string();  // folder or index.json, the same
      const auto earlier = std::find(indexes.begin(), indexes.end(), canonical);
      MMT_CHECK(earlier == indexes.end(), ValueError, "input '", spec, "' is the dataset of ",
                index_paths[static_cast<size_t>(earlier - indexes.begin())], " again; each MDS dataset is packed once");
      indexes.push_back(canonical);
      index_paths.push_back(*index_path);
      const int64_t index_bytes = detail::regular_file_size(*index_path);
      MMT_CHECK(index_bytes <= (int64_t{1} << 30), FormatError, *index_path, ": ", index_bytes,
                " bytes; an index past 1 GiB is not one");
      const UntypedStorage text = detail::read_file_bytes(*index_path);
      const nlohmann::json index = nlohmann::json::parse(reinterpret_cast<const char*>(text.data()),
                                                         reinterpret_cast<const char*>(text.data()) + text.nbytes(),
                                                         nullptr, false);
      const auto malformed = [&](const std::string& why) { return FormatError(str(*index_path, ": ", why)); };
      if (!index.is_object()) throw malformed("not a JSON object");
      if (!index.contains("version") || index["version"] != 2) throw malformed("not an MDS index of version 2");
      const auto shards = index.find("shards");
      if (shards == index.end() || !shards->is_array()) throw malformed("has no list of shards");
      const fs::path folder = fs::path(*index_path).parent_path();
      for (size_t s = 0; s < shards->size(); ++s) {
        const nlohmann::json& shard = (*shards)[s];
        const std::string where = str(*index_path, ": shard ", s);
        const auto string_of = [&](const nlohmann::json& j, const char* key) -> std::string {
          const auto it = j.find(key);
          if (it == j.end() || !it->is_string()) throw FormatError(str(where, ": no text '", key, "'"));
          return it->get<std::string>();
        };
        if (!shard.is_object()) throw FormatError(str(where, ": not a JSON object"));
        const std::string format = string_of(shard, "format");
        MMT_CHECK(format == "mds", ValueError, where, ": format '", detail::cut_for_message(format, 40),
                  "'; this packer reads MDS shards (convert JSONL or CSV shards with their own tools)");
        const auto version = shard.find("version");
        MMT_CHECK(version != shard.end() && *version == 2, ValueError, where, ": not a shard of MDS version 2");
        const auto samples = shard.find("samples");
        if (samples == shard.end() || !samples->is_number_unsigned() || samples->get<uint64_t>() > UINT32_MAX)
          throw FormatError(str(where, ": no count of samples (0 to 2^32 - 1)"));
        const auto names = shard.find("column_names"), encodings = shard.find("column_encodings");
        if (names == shard.end() || encodings == shard.end() || !names->is_array() || !encodings->is_array() ||
            names->size() != encodings->size() || names->empty())
          throw FormatError(str(where, ": column_names and column_encodings are not lists of one length"));
        std::vector<MdsShards::Column> columns;
        for (size_t c = 0; c < names->size(); ++c) {
          if (!(*names)[c].is_string() || !(*encodings)[c].is_string())
            throw FormatError(str(where, ": column ", c, " has a name or encoding that is not text"));
          columns.push_back(column_of((*names)[c].get<std::string>(), (*encodings)[c].get<std::string>(), where));
        }
        if (mds->columns.empty()) {
          mds->columns = columns;
          first_index = *index_path;
        }
        // column_sizes is what Streaming's reader lays a sample out by: it must say what the
        // encodings say (0 and null alike: no fixed size), or the bytes would be read otherwise.
        const auto sizes = shard.find("column_sizes");
        if (sizes == shard.end() || !sizes->is_array() || sizes->size() != columns.size())
          throw FormatError(str(where, ": column_sizes is not a list of one entry a column"));
        for (size_t c = 0; c < columns.size(); ++c) {
          const nlohmann::json& size = (*sizes)[c];
          const bool variable = size.is_null() || (size.is_number_integer() && size.get<int64_t>() == 0);
          const bool agrees = variable ? columns[c].fixed_bytes < 0
                                       : size.is_number_integer() && size.get<int64_t>() == columns[c].fixed_bytes;
          if (!agrees)
            throw FormatError(str(where, ": column '", detail::cut_for_message(columns[c].name, 100), "' has column_size ",
                                  detail::cut_for_message(size.dump(), 40), ", but its encoding '", columns[c].encoding,
                                  "' makes ", columns[c].fixed_bytes < 0 ? std::string("no fixed size")
                                                                         : str(columns[c].fixed_bytes, " bytes")));
        }
        bool same = columns.size() == mds->columns.size();
        for (size_t c = 0; same && c < columns.size(); ++c)
          same = columns[c].name == mds->columns[c].name && columns[c].encoding == mds->columns[c].encoding;
        MMT_CHECK(same, ValueError, where, ": its columns differ from those of shard 0 of ", first_index,
                  "; the shards packed together must have the same columns and encodings");
        // The shard: its raw file when it is there, else its compressed one (zstd or gzip).
        const auto raw_data = shard.find("raw_data");
        if (raw_data == shard.end() || !raw_data->is_object()) throw FormatError(str(where, ": no raw_data"));
        // A shard lies in the index's folder or below it (merge_index writes "part/shard.mds").
        const auto shard_path = [&](const nlohmann::json& info) {
          const fs::path basename(string_of(info, "basename"));
          bool inside = !basename.empty() && basename.is_relative();
          for (const fs::path& part : basename) inside = inside && part != "..";
          MMT_CHECK(inside, FormatError, where, ": the shard '", detail::cut_for_message(basename.string(), 200),
                    "' is not a path inside the index's folder");
          return (folder / basename).string();
        };
        const std::string raw = shard_path(*raw_data);
        std::error_code ec;
        MdsShards::Shard read;
        std::optional<detail::FileCompression> compressed;
        if (fs::is_regular_file(raw, ec)) {
          read.path = raw;
          read.file = detail::regular_file_size(raw) == 0 ? UntypedStorage() : UntypedStorage::map_file(raw);
        } else {
          const auto zip = shard.find("zip_data");
          MMT_CHECK(zip != shard.end() && zip->is_object(), IoError, where, ": its shard ", raw, " is missing, and it has ",
                    "no compressed one");
          const std::string compression = shard.contains("compression") && shard["compression"].is_string()
                                              ? shard["compression"].get<std::string>() : std::string();
          const std::string algorithm = compression.substr(0, compression.find(':'));
          MMT_CHECK(algorithm == "zstd" || algorithm == "gz", ValueError, where, ": compressed with '",
                    detail::cut_for_message(compression.empty() ? std::string("(no compression named)") : compression, 40),
                    "'; this packer decompresses zstd and gz shards (decompress others first, as StreamingDataset "
                    "would into its cache)");
          read.path = shard_path(*zip);
          compressed = algorithm == "zstd" ? detail::FileCompression::Zstd : detail::FileCompression::Gzip;
          read.file = detail::decompressed_file(read.path, *compressed);
        }
        // The index's size of the shard, when it gives one: a shard cut short or left over from
        // another write is named here.
        const auto raw_bytes = raw_data->find("bytes");
        if (raw_bytes != raw_data->end() && raw_bytes->is_number_unsigned())
          MMT_CHECK(raw_bytes->get<uint64_t>() == static_cast<uint64_t>(read.file.nbytes()), FormatError, read.path, ": ",
                    read.file.nbytes(), " bytes", read.path == raw ? "" : " decompressed", ", but the index says ",
                    raw_bytes->get<uint64_t>());
        digests.check(*raw_data, read, read.path == raw, where);
        read.samples = static_cast<int64_t>(samples->get<uint64_t>());
        const int64_t header_end = 4 + 4 * (read.samples + 1);
        MMT_CHECK(read.file.nbytes() >= header_end, FormatError, read.path, ": ", read.file.nbytes(), " bytes, too few for ",
                  "the sample count and offsets of its ", read.samples, " samples (the index says)");
        std::vector<ValueAt> values;
        detail::guard_storage_reads(read.file, [&] {
          MMT_CHECK(u32_at(read.file, 0) == read.samples, FormatError, read.path, ": begins with a count of ",
                    u32_at(read.file, 0), " samples, but the index says ", read.samples);
          for (int64_t j = 0; j < read.samples; ++j) {
            sample_values(*mds, read, read.file, j, /*again=*/false, values);
            for (size_t c = 0; c < values.size(); ++c) {
              if (mds->columns[c].kind == MdsShards::Kind::Array) {
                MdsShards::Column& column = mds->columns[c];
                const bool first_sample = out.records_ == 0 && j == 0;
                if (first_sample && column.dtype_in_sample) column.dtype = values[c].dtype;
                if (first_sample) {
                  column.rank = static_cast<int64_t>(values[c].shape.size());
                  column.row_shape.assign(IntArrayRef(values[c].shape.data() + 1, values[c].shape.size() - 1));
                }
                MMT_CHECK(values[c].dtype == column.dtype, ValueError, read.path, ": sample ", j, ", column '",
                          column.name, "': an array of ", to_string(values[c].dtype), ", where the first sample's "
                          "is of ", to_string(column.dtype), "; a field holds one dtype");
                MMT_CHECK(static_cast<int64_t>(values[c].shape.size()) == column.rank, ValueError, read.path, ": sample ",
                          j, ", column '", column.name, "': an array of ", values[c].shape.size(), " dimensions, where "
                          "the first sample's has ", column.rank, "; a field holds arrays of one rank");
                column.rows_alike = column.rows_alike && rows_are(values[c].shape, column.row_shape);
              }
              out.total_bytes_ += values[c].size;
            }
          }
        });
        MMT_CHECK(!__builtin_add_overflow(out.records_, read.samples, &out.records_), ValueError, "too many samples");
        if (compressed)  // kept within the budget, else decompressed again when its samples are packed
          read.decompressed = static_cast<int64_t>(mds->decompressed.add(read.path, *compressed, std::move(read.file)));
        mds->shard_end.push_back(out.records_);
        out.input_paths_.push_back(read.path);
        mds->shards.push_back(std::move(read));
      }
      out.input_paths_.push_back(*index_path);
    }
  } catch (...) {
    digests.wait_all();
    throw;
  }
  digests.wait_all();
  MMT_CHECK(!mds->columns.empty(), ValueError, first_index.empty() ? specs.front() : first_index, ": no shards");
  // Rows of no values ((n, 0) in every sample) make no [-1, 0] field (a fixed dimension is at
  // least 1): every dimension of such a column varies.
  for (MdsShards::Column& column : mds->columns) column.rows_alike = column.rows_alike && column.row_values() > 0;
  std::vector<Field> fields;
  nlohmann::json encodings = nlohmann::json::object();
  for (const MdsShards::Column& column : mds->columns) {
    try {
      switch (column.kind) {
        case MdsShards::Kind::Bytes: fields.push_back(Field::bytes(column.name)); break;
        case MdsShards::Kind::Fixed: fields.push_back(Field::fixed(column.name, column.dtype, column.shape)); break;
        case MdsShards::Kind::Array: {
          // Of no sample at all: 1-D, as the shape says nothing.
          DimVector shape(static_cast<size_t>(std::max<int64_t>(column.rank, 1)), kVariableDim);
          if (column.rows_alike) std::copy(column.row_shape.begin(), column.row_shape.end(), shape.begin() + 1);
          fields.push_back(Field::ragged(column.name, column.dtype, std::move(shape)));
          break;
        }
      }
    } catch (const ValueError& e) {
      throw ValueError(str(first_index, ": column '", detail::cut_for_message(column.name, 100), "' cannot be a field: ",
                           e.what()));
    }
    encodings[column.name] = column.encoding;
    out.origins_.push_back(str(column.name, "=", first_index, " (MDS column, encoding ", column.encoding, ")"));
  }
  try {
    out.schema_ = Schema(std::move(fields));
  } catch (const ValueError& e) {  // a column named twice
    throw ValueError(str(first_index, ": ", e.what()));
  }
  out.metadata_["source"] = "mds";
  // Which bytes are JPEG, JSON, pickles...: what a reader needs to decode them.
  out.metadata_["mds_encodings"] = encodings.dump();
  out.mds_ = std::move(mds);
  return out;
}

void PackSources::mds_record(int64_t index, std::vector<Tensor>& values) const {
  const MdsShards& mds = *mds_;
  const auto [s, j] = detail::part_of(mds.shard_end, index);
  const MdsShards::Shard& shard = mds.shards[s];
  thread_local std::vector<ValueAt> at;  // record() runs on many threads; no allocation a record
  const int64_t sample = j;  // a plain variable for the lambda
  const UntypedStorage file = mds.file_of(shard);
  detail::guard_storage_reads(file, [&] { sample_values(mds, shard, file, sample, /*again=*/true, at); });
  for (size_t c = 0; c < mds.columns.size(); ++c) {
    const MdsShards::Column& column = mds.columns[c];
    const ValueAt& value = at[c];
    check_array_unchanged(shard, j, column, value);
    const int64_t item = element_size(value.dtype);
    DimVector shape = column.kind == MdsShards::Kind::Fixed   ? column.shape
                      : column.kind == MdsShards::Kind::Array ? value.shape
                                                              : DimVector{value.size / item};
    if (value.size == 0) {
      values[c] = empty(shape, value.dtype);
    } else if (value.offset % item == 0) {  // the shard's bytes where they lie
      values[c] = Tensor(file, value.dtype, shape, value.offset / item);
    } else {  // MDS packs values back to back, unaligned: copied
      Tensor copy = empty(shape, value.dtype);
      detail::guard_storage_reads(file, [&] {
        std::memcpy(copy.mutable_data_ptr(), file.data() + value.offset, static_cast<size_t>(value.size));
      });
      values[c] = std::move(copy);
    }
  }
}

namespace {

// Samples whose columns are all of fixed size are S bytes each, and MDSWriter writes a shard's
// back to back: a run of them whose offsets step by S is each column's [n, ...] view with a
// record stride of S, with no Tensor made a sample (about 1 us each, most of a pack's CPU
// time for 784-byte samples). A run whose offsets say otherwise goes a sample at a time (0),
// where mds_record() names what is wrong.
int64_t fixed_size_run(const MdsShards& mds, int64_t sample_bytes, int64_t start, int64_t count,
                       std::vector<Tensor>& values) {
  const auto [s, j] = detail::part_of(mds.shard_end, start);
  const MdsShards::Shard& shard = mds.shards[s];
  const int64_t first_sample = j, n = std::min(count, shard.samples - j);  // plain variables for the lambda
  const UntypedStorage file = mds.file_of(shard);
  int64_t first = 0;
  bool back_to_back = true;
  detail::guard_storage_reads(file, [&] {
    // The n + 1 offsets from sample j's lie in the header, which from_mds() checked.
    first = u32_at(file, 4 + 4 * first_sample);
    for (int64_t k = 1; k <= n && back_to_back; ++k)
      back_to_back = u32_at(file, 4 + 4 * (first_sample + k)) == first + k * sample_bytes;
  });
  const int64_t header_end = 4 + 4 * (shard.samples + 1);
  if (!back_to_back || first < header_end || first + n * sample_bytes > file.nbytes()) return 0;
  values.resize(mds.columns.size());
  int64_t column_offset = 0;
  for (size_t c = 0; c < mds.columns.size(); ++c) {
    const MdsShards::Column& column = mds.columns[c];
    const int64_t item = element_size(column.dtype), at = first + column_offset;
    column_offset += column.fixed_bytes;
    DimVector sizes{n};
    for (const int64_t size : column.shape) sizes.push_back(size);
    if (at % item == 0 && sample_bytes % item == 0) {
      DimVector strides(sizes.size(), 1);
      for (size_t d = sizes.size() - 1; d > 1; --d) strides[d - 1] = strides[d] * sizes[d];
      strides[0] = sample_bytes / item;
      values[c] = Tensor(file, column.dtype, sizes, strides, at / item);
    } else {  // MDS packs values back to back, unaligned: copied
      Tensor copy = empty(sizes, column.dtype);
      std::byte* out = static_cast<std::byte*>(copy.mutable_data_ptr());
      const size_t value_bytes = static_cast<size_t>(column.fixed_bytes);
      detail::guard_storage_reads(file, [&] {
        for (int64_t k = 0; k < n; ++k)
          std::memcpy(out + k * column.fixed_bytes, file.data() + at + k * sample_bytes, value_bytes);
      });
      values[c] = std::move(copy);
    }
  }
  return n;
}

// Samples with bytes columns (str, jpeg, json...) or arrays of alike rows (tokens, boxes of
// shape (n, 4)) besides fixed ones: a run of one shard's samples, each under kRecordAloneBytes
// and kCopiedRunBytes in all (import_util.h), each checked as mds_record() checks it and copied
// into one buffer a column: a bytes column's values or an array column's rows back to back
// with their offsets (the writer's jagged batch), a fixed column's [n, ...]. (mds_batch() sends
// no column of arrays whose dimensions after the first vary.) A sample at a time makes a
// Tensor a column (about 1 us a sample, most of the CPU a pack of short texts takes). A larger
// sample goes alone (-1), through mds_record(), which views its values in the shard.
int64_t copied_run(const MdsShards& mds, int64_t start, int64_t count, std::vector<Tensor>& values,
                   std::vector<Tensor>& offsets) {
  const auto [s, j] = detail::part_of(mds.shard_end, start);
  const MdsShards::Shard& shard = mds.shards[s];
  const int64_t first_sample = j, n = std::min(count, shard.samples - j);  // plain variables for the lambda
  const UntypedStorage file = mds.file_of(shard);
  const size_t columns = mds.columns.size();
  // Pass one checks each sample and keeps its values' spans (offset, size a column); the
  // buffers are then made, outside the guard; pass two copies the values.
  thread_local std::vector<ValueAt> at;
  thread_local std::vector<int64_t> spans;
  spans.clear();
  std::vector<int64_t> column_bytes(columns, 0), row_bytes(columns, 0);
  for (size_t c = 0; c < columns; ++c)  // > 0: from_mds() made no field of empty rows alike
    row_bytes[c] = element_size(mds.columns[c].dtype) * mds.columns[c].row_values();
  int64_t samples = 0, batch_bytes = 0;
  detail::guard_storage_reads(file, [&] {
    for (; samples < n; ++samples) {
      const auto [begin, end] = sample_range(shard, file, first_sample + samples, /*again=*/true);
      if (end - begin >= detail::kRecordAloneBytes || (samples > 0 && batch_bytes + (end - begin) > detail::kCopiedRunBytes))
        break;
      batch_bytes += end - begin;
      sample_values(mds, shard, file, first_sample + samples, /*again=*/true, at);
      for (size_t c = 0; c < columns; ++c) {
        check_array_unchanged(shard, first_sample + samples, mds.columns[c], at[c]);
        spans.push_back(at[c].offset);
        spans.push_back(at[c].size);
        column_bytes[c] += at[c].size;
      }
    }
  });
  if (samples == 0) return -1;
  values.assign(columns, Tensor());
  offsets.assign(columns, Tensor());
  std::vector<std::byte*> out(columns);
  std::vector<int64_t*> ends(columns, nullptr);
  for (size_t c = 0; c < columns; ++c) {
    const MdsShards::Column& column = mds.columns[c];
    if (column.kind == MdsShards::Kind::Fixed) {
      DimVector sizes{samples};
      for (const int64_t size : column.shape) sizes.push_back(size);
      values[c] = empty(sizes, column.dtype);
    } else {  // bytes (uint8), or an array's rows of its dtype: [rows, ...row_shape]
      DimVector sizes{column_bytes[c] / row_bytes[c]};
      for (const int64_t size : column.row_shape) sizes.push_back(size);
      values[c] = empty(sizes, column.dtype);
      offsets[c] = empty({samples + 1}, kInt64);
      ends[c] = static_cast<int64_t*>(offsets[c].mutable_data_ptr());
      *ends[c]++ = 0;
    }
    out[c] = static_cast<std::byte*>(values[c].mutable_data_ptr());
  }
  detail::guard_storage_reads(file, [&] {
    const int64_t* span = spans.data();
    for (int64_t k = 0; k < samples; ++k) {
      for (size_t c = 0; c < columns; ++c, span += 2) {
        const size_t size = static_cast<size_t>(span[1]);
        if (size > 0) std::memcpy(out[c], file.data() + span[0], size);
        out[c] += size;
        if (ends[c]) {  // in rows: sample_values() checked that an array fills its bytes
          *ends[c] = ends[c][-1] + span[1] / row_bytes[c];
          ++ends[c];
        }
      }
    }
  });
  return samples;
}

}  // namespace

int64_t PackSources::mds_batch(int64_t start, int64_t count, std::vector<Tensor>& values,
                               std::vector<Tensor>& offsets) const {
  const MdsShards& mds = *mds_;
  int64_t sample_bytes = 0;
  bool all_fixed = true;
  for (const MdsShards::Column& column : mds.columns) {
    // An array whose dimensions after its first vary (or whose rows hold no values) is no
    // jagged [rows, ...] tensor: its records are given one by one.
    if (column.kind == MdsShards::Kind::Array && !column.rows_alike) return 0;
    if (column.kind == MdsShards::Kind::Fixed) sample_bytes += column.fixed_bytes;
    else all_fixed = false;
  }
  if (!all_fixed) return copied_run(mds, start, count, values, offsets);
  if (sample_bytes == 0) return 0;
  const int64_t given = fixed_size_run(mds, sample_bytes, start, count, values);
  if (given > 0) offsets.assign(values.size(), Tensor());
  return given;
}

std::string PackSources::mds_origin(size_t field, int64_t index) const {
  const MdsShards& mds = *mds_;
  const auto [s, j] = detail::part_of(mds.shard_end, index);
  return str("sample ", j, " of ", mds.shards[s].path, " (column '", mds.columns[field].name, "')");
}

}  // namespace mmt
