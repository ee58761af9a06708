// PackSources::from_tfrecord: TensorFlow TFRecord files of tf.train.Example records as pack
// sources, one record per Example, one field per feature (tfrecord.h reads the bytes).
//
// An Example carries no schema: each record names its features, and a feature's list may
// hold any number of values. The files are read once when the sources are made (the records'
// headers and their Examples' structure, not their values), to learn each feature's kind and
// how many values its records hold:
//   - int64_list and float_list: int64 and float32. One value in every record: a scalar
//     field (shape []); n in every record: shape [n]; else ragged ([-1]), a record lacking the
//     feature holding none (TensorFlow's VarLenFeature).
//   - bytes_list: one value in every record: bytes (uint8 [-1], a view of the file); else two
//     fields, NAME with the record's values joined and NAME.lengths (int64 [-1]) with each
//     one's length, as Arrow lists of strings are packed.
// A field is named after its key with '/' made '.' ("image/encoded" -> "image.encoded"),
// since field names are file names in `mmt export`. The metadata key "tfrecord_features"
// maps each feature's field to its key and kind. A data CRC is checked as its record is read.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "decompressed_file.h"
#include "import_util.h"
#include "mapping_guard.h"
#include "mmtensor/error.h"
#include "mmtensor/packer.h"
#include "tfrecord.h"
#include "utf8.h"

namespace mmt {

namespace detail {

struct TfRecordExamples {
  struct File {
    std::string path;
    UntypedStorage bytes;  // mapped, or decompressed (gzip); empty for an empty file
    bool gzip = false;
  };
  // One per feature packed, in schema order.
  struct Column {
    std::string key;
    FeatureKind kind = FeatureKind::None;
    size_t field = 0;        // its field; a joined bytes_list's lengths are field + 1
    bool joined = false;     // a bytes_list of other than one value a record
    int64_t fixed = -1;      // values every record holds (a fixed field), or -1
  };
  std::vector<File> files;
  std::vector<TfRecordSpan> spans;  // every record's, the files one after another
  std::vector<int64_t> file_end;    // records before each file's end
  std::vector<Column> columns;
  std::unordered_map<std::string_view, size_t> column_of;  // key -> column (keys in `columns`)

  std::string where(int64_t record) const {
    const auto [f, local] = part_of(file_end, record);
    return str(files[f].path, ", record ", local, " (byte ", spans[static_cast<size_t>(record)].offset - kTfRecordHeaderBytes,
               files[f].gzip ? " of the decompressed file)" : ")");
  }
};

}  // namespace detail

namespace {

using detail::ExampleFeature;
using detail::FeatureKind;
using detail::str;
using detail::TfRecordExamples;
namespace fs = std::filesystem;

// Runs fn(), prefixing `where()` to the message of an error it throws: the readers of
// tfrecord.h are given an empty `where`, so that a record read costs no message text.
template <class Fn, class Where>
decltype(auto) naming(const Where& where, Fn&& fn) {
  try {
    return fn();
  } catch (const ChecksumError& e) {
    throw ChecksumError(where() + e.what());
  } catch (const FormatError& e) {
    throw FormatError(where() + e.what());
  } catch (const IoError& e) {
    throw IoError(where() + e.what());
  } catch (const ValueError& e) {
    throw ValueError(where() + e.what());
  }
}
const std::string kNoWhere;

// Whether TensorFlow would call `bytes` a ZLIB stream (TFRecordOptions' other compression):
// a zlib header, deflate with a window of at most 32 KiB and a check that divides by 31.
bool is_zlib_start(const std::byte* b, size_t n) {
  if (n < 2) return false;
  const auto cmf = static_cast<uint8_t>(b[0]), flg = static_cast<uint8_t>(b[1]);
  return (cmf & 0x0f) == 8 && (cmf >> 4) <= 7 && (cmf * 256 + flg) % 31 == 0;
}

TfRecordExamples::File open_file(const std::string& path) {
  detail::InputFile file = detail::map_input_file(path);  // IoError naming a missing file or a folder
  if (file.bytes.empty()) return {path, UntypedStorage(), false};
  const auto [compressor, starts_as_record] = detail::guard_storage_reads(file.mapping, [&] {
    const size_t n = std::min<size_t>(file.bytes.size(), 12);
    return std::pair{detail::compressor_of(file.bytes.data(), n), detail::is_tfrecord_start(file.bytes.data(), n)};
  });
  if (!starts_as_record && compressor != nullptr && std::strcmp(compressor, "gzip") == 0) {
    UntypedStorage decompressed = detail::decompressed_file(
        path, file.mapping, detail::FileCompression::Gzip, detail::kTfRecordHeaderBytes,
        [&](const std::byte* head, int64_t n) {
          MMT_CHECK(n == 0 || detail::is_tfrecord_start(head, static_cast<size_t>(n)), ValueError, path,
                    ": decompresses (gzip) to something that is not a TFRecord file (no record header with its "
                    "CRC-32C at its start)");
        });
    return {path, std::move(decompressed), true};
  }
  MMT_CHECK(starts_as_record || compressor == nullptr, ValueError, path, ": a ", compressor,
            "-compressed file; TFRecord files are read uncompressed or gzip-compressed (TFRecordOptions' GZIP): "
            "decompress it first");
  const bool zlib = !starts_as_record && detail::guard_storage_reads(file.mapping, [&] {
    return is_zlib_start(file.bytes.data(), file.bytes.size());
  });
  MMT_CHECK(!zlib, ValueError, path, ": a ZLIB-compressed TFRecord file (TFRecordOptions' ZLIB), which this packer "
            "does not read: decompress it first, or write it with GZIP");
  return {path, std::move(file.mapping), false};
}

// What the scan learns of one feature key.
struct KeyStats {
  std::string key;
  FeatureKind kind = FeatureKind::None;
  int64_t first_record = 0;     // where it was first seen, and first seen with its kind
  int64_t kind_record = -1;
  int64_t present = 0;          // records that have it
  int64_t min_values = INT64_MAX, max_values = 0;
};

// The field name for a feature key: '/' made '.'.
std::string field_name_of(std::string_view key) {
  std::string name(key);
  std::replace(name.begin(), name.end(), '/', '.');
  return name;
}

bool is_tfrecord_path(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  const std::string name = fs::path(path).filename().string();
  if (name.find(".tfrecord") != std::string::npos) return true;  // .tfrecord, .tfrecords, TFDS' .tfrecord-00000-of-00008
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  std::byte head[12];
  const size_t got = std::fread(head, 1, sizeof head, f);
  std::fclose(f);
  return detail::is_tfrecord_start(head, got);
}

}  // namespace

bool are_tfrecord_inputs(std::span<const std::string> specs) {
  return std::any_of(specs.begin(), specs.end(), [](const std::string& spec) { return is_tfrecord_path(spec); });
}

PackSources PackSources::from_tfrecord(std::span<const std::string> specs, std::span<const std::string> fields) {
  MMT_CHECK(!specs.empty(), ValueError, "no TFRecord files to pack");
  auto examples = std::make_shared<TfRecordExamples>();
  PackSources out;
  for (const std::string& path : specs) {
    MMT_CHECK(is_tfrecord_path(path) || !fs::is_regular_file(path), ValueError, "input '", path,
              "' is not a TFRecord file (its name has no .tfrecord and it does not begin with a record header); "
              "TFRecord files are packed alone, not with other inputs");
    TfRecordExamples::File file = open_file(path);  // IoError naming a missing file
    for (const TfRecordExamples::File& earlier : examples->files)
      MMT_CHECK(!fs::equivalent(earlier.path, path), ValueError, "input '", path, "' is ", earlier.path,
                " again; each TFRecord file is packed once");
    if (file.bytes.nbytes() > 0)
      detail::guard_storage_reads(file.bytes, [&] {
        detail::scan_tfrecords(file.bytes.data(), file.bytes.nbytes(), file.gzip ? path + " (decompressed)" : path,
                               examples->spans);
      });
    examples->file_end.push_back(static_cast<int64_t>(examples->spans.size()));
    out.input_paths_.push_back(path);
    examples->files.push_back(std::move(file));
  }
  out.records_ = static_cast<int64_t>(examples->spans.size());
  MMT_CHECK(out.records_ > 0, ValueError, "the TFRecord files hold no records: there is no feature to pack");

  // The scan: each record's Example, its keys and how many values each holds. Records mostly
  // list the same keys in the same order, so each feature is first looked for where the
  // record before had it.
  std::vector<KeyStats> stats;
  std::unordered_map<std::string, size_t> stat_of;
  std::vector<size_t> previous;  // the stats of the record before's features, in its order
  std::vector<ExampleFeature> features;
  for (int64_t r = 0; r < out.records_; ++r) {
    const TfRecordExamples::File& file = examples->files[detail::part_of(examples->file_end, r).first];
    const detail::TfRecordSpan span = examples->spans[static_cast<size_t>(r)];
    const auto where = [&] { return examples->where(r); };
    detail::guard_storage_reads(file.bytes, [&] {
      try {
        naming(where, [&] {
          detail::parse_example({file.bytes.data() + span.offset, static_cast<size_t>(span.size)}, kNoWhere, features);
          for (size_t j = 0; j < features.size(); ++j) {
            const ExampleFeature& feature = features[j];
            size_t s = j < previous.size() && stats[previous[j]].key == feature.key ? previous[j] : SIZE_MAX;
            if (s == SIZE_MAX) {
              const std::string key(feature.key);
              const auto found = stat_of.find(key);
              if (found != stat_of.end()) {
                s = found->second;
              } else {
                s = stats.size();
                stat_of.emplace(key, s);
                stats.push_back({key, FeatureKind::None, r});
              }
            }
            if (j < previous.size())
              previous[j] = s;
            else
              previous.push_back(s);
            KeyStats& stat = stats[s];
            if (feature.kind != FeatureKind::None) {
              if (stat.kind == FeatureKind::None) {
                stat.kind = feature.kind;
                stat.kind_record = r;
              }
              MMT_CHECK(feature.kind == stat.kind, ValueError, ": feature '",
                        detail::cut_for_message(stat.key, 200), "' is a ", to_string(feature.kind), ", but record ",
                        stat.kind_record, " gave it a ", to_string(stat.kind), "; a feature holds one kind of list");
            }
            const int64_t n = detail::feature_value_count(feature, kNoWhere);
            ++stat.present;
            stat.min_values = std::min(stat.min_values, n);
            stat.max_values = std::max(stat.max_values, n);
          }
          previous.resize(features.size());
        });
      } catch (const Error&) {
        // A record that is not an Example, or disagrees with the others, may be one whose
        // bytes are damaged: say so when its CRC says so.
        detail::check_tfrecord_data(file.bytes.data(), span, where());
        throw;
      }
    });
    out.total_bytes_ += span.size;
  }

  // The features chosen, in the order asked for, or all, in the order of their names.
  std::map<std::string, size_t> by_name;  // field name -> stat
  for (size_t s = 0; s < stats.size(); ++s) {
    const std::string name = field_name_of(stats[s].key);
    const auto [it, fresh] = by_name.emplace(name, s);
    MMT_CHECK(fresh, ValueError, "features '", detail::cut_for_message(stats[it->second].key, 200), "' and '",
              detail::cut_for_message(stats[s].key, 200), "' would both be field '", detail::cut_for_message(name, 200),
              "' ('/' is '.' in a field name); choose one with --field");
  }
  std::vector<size_t> chosen;
  if (fields.empty()) {
    for (const auto& [name, s] : by_name) chosen.push_back(s);
  } else {
    for (const std::string& name : fields) {
      auto it = by_name.find(name);
      if (it == by_name.end()) it = by_name.find(field_name_of(name));  // the key itself, '/' and all
      if (it == by_name.end() && name.ends_with(".lengths")) {
        // A bytes_list's lengths (as `mmt verify --against` lists a dataset's fields): chosen
        // with its values.
        const auto values = by_name.find(field_name_of(std::string_view(name).substr(0, name.size() - 8)));
        if (values != by_name.end() && stats[values->second].kind == FeatureKind::Bytes) {
          if (std::find(chosen.begin(), chosen.end(), values->second) == chosen.end()) chosen.push_back(values->second);
          continue;
        }
      }
      if (it == by_name.end()) {
        std::vector<std::string> known;
        for (const auto& [n, s] : by_name) known.push_back(n);
        throw ValueError(str("the TFRecord files have no feature '", detail::cut_for_message(name, 200),
                             "' (features, as fields: ", detail::cut_for_message(detail::joined(known), 2000), ")"));
      }
      // Once, though a bytes_list's lengths may have chosen it already.
      if (std::find(chosen.begin(), chosen.end(), it->second) == chosen.end()) chosen.push_back(it->second);
    }
  }

  std::vector<Field> schema_fields;
  nlohmann::ordered_json described = nlohmann::ordered_json::object();
  for (const size_t s : chosen) {
    const KeyStats& stat = stats[s];
    const std::string name = field_name_of(stat.key);
    MMT_CHECK(stat.kind != FeatureKind::None, ValueError, "feature '", detail::cut_for_message(stat.key, 200),
              "' holds no list in any record (first seen in ", examples->where(stat.first_record),
              "): it has no dtype to pack; leave it out with --field");
    TfRecordExamples::Column column{stat.key, stat.kind, schema_fields.size()};
    const bool constant = stat.present == out.records_ && stat.min_values == stat.max_values && stat.min_values >= 1;
    try {
      if (stat.kind == FeatureKind::Bytes) {
        column.joined = !(constant && stat.min_values == 1);
        if (!column.joined) column.fixed = 1;
        schema_fields.push_back(Field::bytes(name));
        if (column.joined) schema_fields.push_back(Field::ragged(name + ".lengths", kInt64, {kVariableDim}));
      } else {
        const ScalarType dtype = stat.kind == FeatureKind::Float ? kFloat32 : kInt64;
        if (constant) {
          column.fixed = stat.min_values;
          schema_fields.push_back(column.fixed == 1 ? Field::fixed(name, dtype, {}) : Field::fixed(name, dtype, {column.fixed}));
        } else {
          schema_fields.push_back(Field::ragged(name, dtype, {kVariableDim}));
        }
      }
    } catch (const ValueError& e) {
      throw ValueError(str("feature '", detail::cut_for_message(stat.key, 200), "': ", e.what()));
    }
    described[name] = {{"key", stat.key}, {"kind", to_string(stat.kind)}};
    examples->columns.push_back(std::move(column));
  }
  try {
    out.schema_ = Schema(std::move(schema_fields));
  } catch (const ValueError& e) {
    throw ValueError(str("the TFRecord files' features: ", e.what()));
  }
  for (const TfRecordExamples::Column& column : examples->columns) examples->column_of.emplace(column.key, &column - examples->columns.data());

  std::string files;
  for (size_t f = 0; f < examples->files.size(); ++f) files += str(f == 0 ? "" : ", ", examples->files[f].path);
  for (const TfRecordExamples::Column& column : examples->columns) {
    out.origins_.push_back(str(out.schema_[column.field].name, "=", files, " (TFRecord feature '", column.key, "', ",
                               to_string(column.kind), ")"));
    if (column.joined)
      out.origins_.push_back(str(out.schema_[column.field + 1].name, "=", files, " (the lengths of TFRecord feature '",
                                 column.key, "')"));
  }
  out.metadata_["source"] = "tfrecord";
  out.metadata_["tfrecord_features"] = described.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  out.tfrecord_ = std::move(examples);
  return out;
}

void PackSources::tfrecord_record(int64_t index, std::vector<Tensor>& values) const {
  const TfRecordExamples& examples = *tfrecord_;
  const TfRecordExamples::File& file = examples.files[detail::part_of(examples.file_end, index).first];
  const detail::TfRecordSpan span = examples.spans[static_cast<size_t>(index)];
  const auto where = [&] { return examples.where(index); };
  thread_local std::vector<ExampleFeature> features;
  thread_local std::vector<std::span<const std::byte>> items;
  thread_local std::vector<uint8_t> filled;
  filled.assign(examples.columns.size(), 0);
  detail::guard_storage_reads(file.bytes, [&] {
    naming(where, [&] {
      const std::byte* base = file.bytes.data();
      detail::check_tfrecord_data(base, span, kNoWhere);
      detail::parse_example({base + span.offset, static_cast<size_t>(span.size)}, kNoWhere, features);
      for (const ExampleFeature& feature : features) {
        const auto found = examples.column_of.find(feature.key);
        if (found == examples.column_of.end()) continue;  // not chosen
        const TfRecordExamples::Column& column = examples.columns[found->second];
        MMT_CHECK(feature.kind == column.kind || feature.kind == FeatureKind::None, IoError, ": feature '",
                  detail::cut_for_message(column.key, 200), "' is now a ", to_string(feature.kind), ", not the ",
                  to_string(column.kind), " it was when the files were scanned: the file changed");
        filled[found->second] = 1;
        const int64_t n = detail::feature_value_count(feature, kNoWhere);
        MMT_CHECK(column.fixed < 0 || n == column.fixed, IoError, ": feature '", detail::cut_for_message(column.key, 200),
                  "' holds ", n, " values, not the ", column.fixed, " it held in every record when the files were "
                  "scanned: the file changed");
        Tensor& value = values[column.field];
        if (column.kind == FeatureKind::Bytes) {
          detail::bytes_values(feature, kNoWhere, items);
          MMT_CHECK(static_cast<int64_t>(items.size()) == n, IoError, ": feature '",
                    detail::cut_for_message(column.key, 200), "' changed while it was being read");
          if (!column.joined) {
            const std::span<const std::byte> item = items.front();
            value = item.empty() ? empty({0}, kUInt8)
                                 : Tensor(file.bytes, kUInt8, {static_cast<int64_t>(item.size())}, item.data() - base);
            continue;
          }
          int64_t total = 0;
          for (const auto& item : items) total += static_cast<int64_t>(item.size());
          value = empty({total}, kUInt8);
          Tensor lengths = empty({static_cast<int64_t>(items.size())}, kInt64);
          auto* joined = static_cast<std::byte*>(value.mutable_data_ptr());
          auto* length = static_cast<int64_t*>(lengths.mutable_data_ptr());
          for (const auto& item : items) {
            if (!item.empty()) std::memcpy(joined, item.data(), item.size());
            joined += item.size();
            *length++ = static_cast<int64_t>(item.size());
          }
          values[column.field + 1] = std::move(lengths);
          continue;
        }
        const std::vector<int64_t> shape =
            column.fixed == 1 ? std::vector<int64_t>{} : std::vector<int64_t>{n};
        if (column.kind == FeatureKind::Float) {
          const std::optional<std::span<const std::byte>> run = detail::packed_float_run(feature);
          const int64_t offset = run && !run->empty() ? run->data() - base : -1;
          if (offset >= 0 && offset % 4 == 0 && static_cast<int64_t>(run->size()) == 4 * n) {
            value = Tensor(file.bytes, kFloat32, shape, offset / 4);  // a view of the file
            continue;
          }
          value = empty(shape, kFloat32);
          detail::copy_float_values(feature, {static_cast<float*>(value.mutable_data_ptr()), static_cast<size_t>(n)},
                                    kNoWhere);
          continue;
        }
        value = empty(shape, kInt64);
        detail::copy_int64_values(feature, {static_cast<int64_t*>(value.mutable_data_ptr()), static_cast<size_t>(n)},
                                  kNoWhere);
      }
    });
  });
  for (size_t c = 0; c < examples.columns.size(); ++c) {
    if (filled[c]) continue;
    const TfRecordExamples::Column& column = examples.columns[c];
    MMT_CHECK(column.fixed < 0, IoError, where(), ": feature '", detail::cut_for_message(column.key, 200),
              "' is missing, but every record held it when the files were scanned: the file changed");
    const ScalarType dtype = schema_[column.field].dtype;
    values[column.field] = empty({0}, dtype);
    if (column.joined) values[column.field + 1] = empty({0}, kInt64);
  }
}

std::string PackSources::tfrecord_origin(size_t field, int64_t index) const {
  const TfRecordExamples& examples = *tfrecord_;
  for (const TfRecordExamples::Column& column : examples.columns)
    if (field == column.field || (column.joined && field == column.field + 1))
      return str(examples.where(index), ", feature '", column.key, "'", field == column.field ? "" : " (its lengths)");
  return examples.where(index);
}

}  // namespace mmt
