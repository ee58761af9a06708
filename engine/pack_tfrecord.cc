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
#include <cctype>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "decompressed_file.h"
#include "gzip_reader.h"
#include "import_util.h"
#include "load_cancel.h"
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
    UntypedStorage bytes;  // mapped; empty for an empty file, or a compressed one (see below)
    std::optional<FileCompression> compression;  // gzip or zlib (TFRecordOptions' GZIP, ZLIB)
    int64_t decompressed = -1;  // compressed: its index in `decompressed`
  };
  // One per feature packed, in schema order.
  struct Column {
    std::string key;
    FeatureKind kind = FeatureKind::None;
    size_t field = 0;        // its field; a joined bytes_list's lengths are field + 1
    bool joined = false;     // a bytes_list of other than one value a record, or a feature list of
                             // steps unlike: its values joined, and NAME.lengths
    int64_t fixed = -1;      // values every record holds (a fixed field), or -1
    bool sequence = false;   // a SequenceExample's feature list: a record holds steps
    int64_t step_width = -1; // values each step holds (bytes, for a bytes list), when alike
  };
  std::vector<File> files;
  DecompressedFiles decompressed;  // compressed files, kept in $TMPDIR within the scratch budget
  std::vector<TfRecordSpan> spans;  // every record's, the files one after another
  std::vector<int64_t> file_end;    // records before each file's end
  std::vector<Column> columns;
  std::unordered_map<std::string_view, size_t> column_of;  // key -> column (keys in `columns`)
  std::unordered_map<std::string_view, size_t> list_column_of;  // a feature list's key -> column
  size_t fixed_columns = 0;  // columns with `fixed` >= 0

  // File f's bytes: its mapping, or its decompression (made again when past the budget).
  UntypedStorage bytes_of(size_t f) const {
    return files[f].decompressed < 0 ? files[f].bytes : decompressed.get(static_cast<size_t>(files[f].decompressed));
  }

  std::string where(int64_t record) const {
    const auto [f, local] = part_of(file_end, record);
    return str(files[f].path, ", record ", local, " (byte ", spans[static_cast<size_t>(record)].offset - kTfRecordHeaderBytes,
               files[f].compression ? " of the decompressed file)" : ")");
  }
};

}  // namespace detail

namespace {

// `--field` spellings of a key that name its kind: a SequenceExample's context feature
// (a feature, as an Example's) or its feature list, which may share a key.
constexpr std::string_view kFeatureQualifier = "feature:";
constexpr std::string_view kFeatureListQualifier = "feature_list:";
constexpr std::string_view kTfRecordFeaturesMetadataKey = "tfrecord_features";

using detail::ExampleFeature;
using detail::FeatureKind;
using detail::FileCompression;
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

// How a TFRecord file that does not begin with a record may be compressed, from its first
// bytes: gzip or zlib (TFRecordOptions' GZIP and ZLIB); nullopt for neither. A file that
// begins with a record header (its length's CRC-32C agreeing) is read as it is, whatever its
// bytes; one whose header is damaged may begin with a compressor's magic all the same (the
// length 376 is 78 01, a zlib header): compressed_tfrecord_fault() tells them apart.
std::optional<FileCompression> tfrecord_compression(std::span<const std::byte> head) {
  head = head.first(std::min<size_t>(head.size(), detail::kTfRecordHeaderBytes));
  if (detail::is_tfrecord_start(head.data(), head.size())) return std::nullopt;
  if (detail::is_gzip(head)) return FileCompression::Gzip;
  if (detail::is_zlib_start(head)) return FileCompression::Zlib;
  return std::nullopt;
}

const char* name_of(FileCompression compression) { return compression == FileCompression::Gzip ? "gzip" : "zlib"; }

// What keeps `bytes` (a file's, or its first bytes) from being a TFRecord file compressed as
// `compression`: "" when its first 12 decompressed bytes are a record header, or when it
// decompresses to nothing and `empty_is_fine`; else the stream's fault or what it decompresses
// to. Reads only the stream's start; under `mapping`'s guard when `bytes` are mapped.
std::string compressed_tfrecord_fault(std::span<const std::byte> bytes, FileCompression compression,
                                      const std::string& path, bool empty_is_fine,
                                      const UntypedStorage* mapping = nullptr) {
  try {
    // Made outside the guard: a fault must not skip its destructor (mapping_guard.h).
    detail::GzipReader reader(bytes, path,
                              compression == FileCompression::Gzip ? detail::GzipReader::Wrapper::Gzip
                                                                   : detail::GzipReader::Wrapper::Zlib);
    std::byte head[detail::kTfRecordHeaderBytes];
    size_t got = 0;
    const auto read_head = [&] {
      for (size_t n; got < sizeof head && (n = reader.read(head + got, sizeof head - got)) > 0;) got += n;
    };
    if (mapping != nullptr)
      detail::guard_storage_reads(*mapping, read_head);
    else
      read_head();
    if ((got == 0 && empty_is_fine) || detail::is_tfrecord_start(head, got)) return {};
    return "it decompresses to something that is not a TFRecord file (no record header with its CRC-32C at its "
           "start)";
  } catch (const FormatError& e) {
    const std::string_view message = e.what();  // "PATH: what is wrong"
    return std::string(message.starts_with(path + ": ") ? message.substr(path.size() + 2) : message);
  }
}

TfRecordExamples::File open_file(const std::string& path) {
  detail::InputFile file = detail::map_input_file(path);  // IoError naming a missing file or a folder
  if (file.bytes.empty()) return {path, UntypedStorage(), std::nullopt};
  const auto [starts_as_record, compressor, compression] = detail::guard_storage_reads(file.mapping, [&] {
    const size_t n = std::min<size_t>(file.bytes.size(), detail::kTfRecordHeaderBytes);
    return std::tuple{detail::is_tfrecord_start(file.bytes.data(), n), detail::compressor_of(file.bytes.data(), n),
                      tfrecord_compression(file.bytes.first(n))};
  });
  if (compression) {
    const char* name = name_of(*compression);
    const std::string fault = compressed_tfrecord_fault(file.bytes, *compression, path, true, &file.mapping);
    // Its first bytes are no record header, and a compressor's magic: either reading may be the
    // one meant (a damaged plain file, a damaged compressed one), so the error gives both.
    MMT_CHECK(fault.empty(), FormatError, path, ": neither TFRecord records (",
              file.bytes.size() < detail::kTfRecordHeaderBytes
                  ? str("its ", file.bytes.size(), " bytes are fewer than a record's 12-byte header")
                  : std::string("the first record's 12-byte header fails its CRC-32C"),
              ") nor a ", name, "-compressed TFRecord file (", fault, ")");
    UntypedStorage decompressed = detail::decompressed_file(
        path, file.mapping, *compression, detail::kTfRecordHeaderBytes, [&](const std::byte* head, int64_t n) {
          // Checked again: the file may have changed since.
          MMT_CHECK(n == 0 || detail::is_tfrecord_start(head, static_cast<size_t>(n)), FormatError, path,
                    ": decompresses (", name, ") to something that is not a TFRecord file (no record header with "
                    "its CRC-32C at its start)");
        });
    return {path, std::move(decompressed), compression};
  }
  // A record's header can begin with a compressor's magic too; its CRC says which it is.
  MMT_CHECK(starts_as_record || compressor == nullptr, ValueError, path, ": a ", compressor,
            "-compressed file; TFRecord files are read uncompressed, gzip-compressed or zlib-compressed "
            "(TFRecordOptions' GZIP and ZLIB): decompress it first");
  return {path, std::move(file.mapping), std::nullopt};
}

// What the scan learns of one feature key.
struct KeyStats {
  std::string key;
  FeatureKind kind = FeatureKind::None;
  int64_t first_record = 0;     // where it was first seen, and first seen with its kind
  int64_t kind_record = -1;
  int64_t present = 0;          // records that have it
  int64_t min_values = INT64_MAX, max_values = 0;  // values a record holds (a context feature)
  // A SequenceExample's feature list: the values a step holds, and a bytes list's values'
  // lengths, over every step of every record.
  bool sequence = false;
  int64_t min_step_values = INT64_MAX, max_step_values = 0;
  int64_t min_value_bytes = INT64_MAX, max_value_bytes = 0;
  std::string conflict;  // what refuses it if it is chosen: records giving it two kinds
};

// "feature 'KEY'" or "feature list 'KEY'", for messages.
std::string feature_named(const KeyStats& stat) {
  return str(stat.sequence ? "feature list '" : "feature '", detail::cut_for_message(stat.key, 200), "'");
}

// The field name for a feature key: '/' made '.'.
std::string field_name_of(std::string_view key) {
  std::string name(key);
  std::replace(name.begin(), name.end(), '/', '.');
  return name;
}

// Whether a file's name is one TensorFlow's writers give TFRecord files: NAME.tfrecord,
// .tfrecords, .tfrec (Kaggle's), TFDS' NAME.tfrecord-00000-of-00008, TFX's
// data_tfrecord-00000-of-00001.gz. Not "x.tfrecord.mmt": the kind comes last.
bool named_as_tfrecord(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name.ends_with(".gz")) name.resize(name.size() - 3);
  // A shard's "-00000-of-00008" (or "-00000").
  const auto strip_number = [&] {
    size_t digits = 0;
    while (digits < name.size() && std::isdigit(static_cast<unsigned char>(name[name.size() - 1 - digits]))) ++digits;
    if (digits == 0 || digits == name.size() || name[name.size() - 1 - digits] != '-') return false;
    name.resize(name.size() - 1 - digits);
    return true;
  };
  const std::string before = name;
  if (strip_number() && name.ends_with("-of")) {
    name.resize(name.size() - 3);
    if (!strip_number()) name = before;
  } else if (name.ends_with("-of")) {
    name = before;
  }
  for (const std::string_view kind : {"tfrecords", "tfrecord", "tfrec"}) {
    if (!name.ends_with(kind)) continue;
    const size_t at = name.size() - kind.size();
    return at == 0 || name[at - 1] == '.' || name[at - 1] == '_' || name[at - 1] == '-';
  }
  return false;
}

// Whether `path` is a TFRecord file: a regular file named as one, or whose first bytes (after
// gzip or zlib, when it is compressed so) are a record header.
bool is_tfrecord_path(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  if (named_as_tfrecord(fs::path(path).filename().string())) return true;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  std::vector<std::byte> head(64 << 10);  // enough for a gzip header and a first deflate block's start
  head.resize(std::fread(head.data(), 1, head.size(), f));
  std::fclose(f);
  if (detail::is_tfrecord_start(head.data(), head.size())) return true;
  const std::optional<FileCompression> compression = tfrecord_compression(head);
  // Cut short here, empty, or not compressed after all: another reader names it.
  return compression && compressed_tfrecord_fault(head, *compression, path, false).empty();
}

}  // namespace

bool are_tfrecord_inputs(std::span<const std::string> specs) {
  return std::any_of(specs.begin(), specs.end(), [](const std::string& spec) { return is_tfrecord_path(spec); });
}

PackSources PackSources::from_tfrecord(std::span<const std::string> specs, std::span<const std::string> fields) {
  MMT_CHECK(!specs.empty(), ValueError, "no TFRecord files to pack");
  auto examples = std::make_shared<TfRecordExamples>();
  PackSources out;
  // The scan: each record's Example, its keys and how many values each holds. Records mostly
  // list the same keys in the same order, so each feature is first looked for where the
  // record before had it.
  // Everything the guarded sections fill outlives them (a fault must skip no destructor).
  std::vector<KeyStats> stats;
  std::unordered_map<std::string, size_t> stat_of, list_stat_of;  // key -> stat, of features and feature lists
  std::vector<size_t> previous;  // the stats of the record before's features, in its order
  std::vector<ExampleFeature> features;
  std::vector<detail::ExampleFeatureList> lists;
  std::vector<std::span<const std::byte>> items;  // a bytes step's values
  std::string key;  // a feature's key, copied out of the file
  std::exception_ptr error;
  // Notes the kind of list a feature (or a feature list's step) holds. A key of two kinds
  // refuses its feature (list) if it is chosen, not the files: `--field` can leave it out.
  // Unless the record's bytes are damaged (its CRC says so): that is the fault to report. The
  // message is made once, not for each step of a long list. Called under the scan's mapping
  // guard, where naming() names the record.
  const auto note_kind = [&](KeyStats& stat, FeatureKind kind, const std::byte* file, int64_t r,
                             const detail::TfRecordSpan& span) {
    if (kind == FeatureKind::None) return;
    if (stat.kind == FeatureKind::None) {
      stat.kind = kind;
      stat.kind_record = r;
    }
    if (kind == stat.kind || !stat.conflict.empty()) return;
    detail::check_tfrecord_data(file, span, kNoWhere);
    const std::string first = examples->where(stat.kind_record);
    stat.conflict = str(examples->where(r), ": ", feature_named(stat),
                        stat.sequence ? str(" has a step of ", to_string(kind), ", but ", first, " gave it steps of ",
                                            to_string(stat.kind), "; a feature list holds one kind of list")
                                      : str(" is a ", to_string(kind), ", but ", first, " gave it a ",
                                            to_string(stat.kind), "; a feature holds one kind of list"));
  };
  // File f's records [begin, end), its bytes `bytes`, read as soon as its records are found
  // (a compressed file's decompression may be dropped once added to the budget).
  const auto scan_examples = [&](const UntypedStorage& bytes, int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (r % 4096 == 0) detail::check_load_cancelled();
      const detail::TfRecordSpan span = examples->spans[static_cast<size_t>(r)];
      const auto where = [&] { return examples->where(r); };
      detail::guard_storage_reads(bytes, [&] {
        try {
          naming(where, [&] {
            const std::byte* record = bytes.data() + span.offset;
            detail::parse_example({record, static_cast<size_t>(span.size)}, kNoWhere, features, lists);
            for (size_t j = 0; j < features.size(); ++j) {
              const ExampleFeature& feature = features[j];
              size_t s = j < previous.size() && stats[previous[j]].key == feature.key ? previous[j] : SIZE_MAX;
              if (s == SIZE_MAX) {
                key.assign(feature.key);
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
              note_kind(stat, feature.kind, bytes.data(), r, span);
              const int64_t n = detail::feature_value_count(feature, kNoWhere);
              ++stat.present;
              stat.min_values = std::min(stat.min_values, n);
              stat.max_values = std::max(stat.max_values, n);
            }
            previous.resize(features.size());
            for (const detail::ExampleFeatureList& list : lists) {
              key.assign(list.key);
              auto found = list_stat_of.find(key);
              if (found == list_stat_of.end()) {
                found = list_stat_of.emplace(key, stats.size()).first;
                stats.push_back({key, FeatureKind::None, r});
                stats.back().sequence = true;
              }
              KeyStats& stat = stats[found->second];
              ++stat.present;
              // Step by step, keeping nothing of them: a record of millions of two-byte steps
              // must not take memory in proportion.
              detail::for_each_feature_list_step(list, record, kNoWhere, [&](const ExampleFeature& step) {
                note_kind(stat, step.kind, bytes.data(), r, span);
                const int64_t n = detail::feature_value_count(step, kNoWhere);
                if (step.kind == FeatureKind::Bytes && n == 1) {  // else refused, if chosen: no lengths needed
                  detail::bytes_values(step, kNoWhere, items);
                  stat.min_value_bytes = std::min(stat.min_value_bytes, static_cast<int64_t>(items[0].size()));
                  stat.max_value_bytes = std::max(stat.max_value_bytes, static_cast<int64_t>(items[0].size()));
                }
                stat.min_step_values = std::min(stat.min_step_values, n);
                stat.max_step_values = std::max(stat.max_step_values, n);
              });
            }
          });
        } catch (const Error&) {
          error = std::current_exception();
        }
      });
      if (error) {
        // A record that is not an Example, or disagrees with the others, may be one whose bytes
        // are damaged: say so when its CRC says so.
        detail::guard_storage_reads(bytes, [&] { detail::check_tfrecord_data(bytes.data(), span, where()); });
        std::rethrow_exception(error);
      }
      out.total_bytes_ += span.size;
    }
  };

  for (const std::string& path : specs) detail::refuse_input_of_another_kind(path, "TFRecord files");
  detail::DistinctInputs distinct("TFRecord file");
  for (const std::string& path : specs) {
    std::error_code ec;
    MMT_CHECK(is_tfrecord_path(path) || !fs::is_regular_file(path, ec), ValueError, "input '", path,
              "' is not a TFRecord file (not named as one, .tfrecord..., and it does not begin with a record "
              "header, compressed or not); TFRecord files are packed alone, not with other inputs");
    TfRecordExamples::File file = open_file(path);  // IoError naming a missing file
    distinct.add(path);
    const std::string name = file.compression ? path + " (decompressed)" : path;  // made outside the guard
    if (file.bytes.nbytes() > 0)
      detail::guard_storage_reads(file.bytes, [&] {
        detail::scan_tfrecords(file.bytes.data(), file.bytes.nbytes(), name, examples->spans);
      });
    const int64_t begin = examples->file_end.empty() ? 0 : examples->file_end.back();
    examples->file_end.push_back(static_cast<int64_t>(examples->spans.size()));
    out.input_paths_.push_back(path);
    examples->files.push_back(file);
    scan_examples(file.bytes, begin, examples->file_end.back());
    if (file.compression) {
      examples->files.back().decompressed =
          static_cast<int64_t>(examples->decompressed.add(path, *file.compression, std::move(file.bytes)));
      examples->files.back().bytes = UntypedStorage();  // the budget's to keep or drop
    }
  }
  out.records_ = static_cast<int64_t>(examples->spans.size());
  MMT_CHECK(out.records_ > 0, ValueError, "the TFRecord files hold no records: there is no feature to pack");


  // Each feature is a field of every record, present or not: a file of many keys, each in a
  // few records (a hostile one: a key a record), would make a file of their product.
  constexpr size_t kMaxFeatures = 1024;
  MMT_CHECK(!stats.empty(), ValueError, "the TFRecord files' Examples hold no features: there is nothing to pack");
  MMT_CHECK(fields.size() > 0 || stats.size() <= kMaxFeatures, ValueError, "the TFRecord files' Examples name ",
            stats.size(), " feature keys (first '", detail::cut_for_message(stats.front().key, 200), "', in ",
            examples->where(stats.front().first_record), "), more than the ", kMaxFeatures,
            " packed without a choice: each would be a field of every record; choose the features with --field");
  // The features chosen, in the order asked for, or all, in the order of their names.
  std::map<std::string, size_t> by_name;  // field name -> stat
  std::map<std::string, size_t> clash;    // field name -> another stat making it
  for (size_t s = 0; s < stats.size(); ++s) {
    const std::string name = field_name_of(stats[s].key);
    if (!by_name.emplace(name, s).second) clash.emplace(name, s);
  }
  // Two keys making one field name can be packed one at a time: each key chosen by itself.
  const auto refuse_pair = [&](const KeyStats& a, const KeyStats& b, const std::string& name) {
    const bool same_key = a.key == b.key;  // a context feature and a feature list
    throw ValueError(str(!a.sequence && !b.sequence ? str("features '", detail::cut_for_message(a.key, 200), "' and '",
                                                          detail::cut_for_message(b.key, 200), "'")
                                                    : str(feature_named(a), " and ", feature_named(b)),
                         " would both be field '", detail::cut_for_message(name, 200), "'",
                         same_key ? str(" (a SequenceExample's context and feature lists may share a key; one "
                                        "dataset field cannot hold both): choose one with --field 'feature:",
                                        detail::cut_for_message(a.key, 200), "' or --field 'feature_list:",
                                        detail::cut_for_message(a.key, 200), "'")
                                  : std::string(" ('/' is '.' in a field name); choose one with --field, by its key")));
  };
  const auto refuse_clash = [&](const std::string& name) {
    if (const auto other = clash.find(name); other != clash.end()) refuse_pair(stats[by_name.at(name)], stats[other->second], name);
  };
  // The stat `name` chooses: a key qualified by its kind ("feature:KEY", "feature_list:KEY",
  // for a SequenceExample whose context and feature lists share a key), a key itself, '/' and
  // all (of a feature or of a feature list), a field name, or a key's other spelling ('.' for
  // '/'); SIZE_MAX for none. The qualified reading comes first, so that what
  // tfrecord_fields_of() writes chooses exactly its key even beside a key spelled like it
  // ("feature:z" and "z"): that key is "feature:feature:z".
  const auto resolve = [&](const std::string& name) {
    for (const auto& [qualifier, keys] : {std::pair{std::string_view(kFeatureQualifier), &stat_of},
                                          std::pair{std::string_view(kFeatureListQualifier), &list_stat_of}})
      if (name.starts_with(qualifier))
        if (const auto it = keys->find(name.substr(qualifier.size())); it != keys->end()) return it->second;
    const auto as_feature = stat_of.find(name), as_list = list_stat_of.find(name);
    if (as_feature != stat_of.end() && as_list != list_stat_of.end())
      refuse_pair(stats[as_feature->second], stats[as_list->second], field_name_of(name));
    if (as_feature != stat_of.end()) return as_feature->second;
    if (as_list != list_stat_of.end()) return as_list->second;
    for (const std::string& spelling : {name, field_name_of(name)}) {
      refuse_clash(spelling);
      if (const auto it = by_name.find(spelling); it != by_name.end()) return it->second;
    }
    return SIZE_MAX;
  };
  std::vector<size_t> chosen;
  if (fields.empty()) {
    for (const auto& [name, s] : by_name) {
      refuse_clash(name);
      chosen.push_back(s);
    }
  } else {
    for (const std::string& name : fields) {
      size_t pick = resolve(name);
      if (pick == SIZE_MAX && name.ends_with(".lengths")) {
        // A bytes_list's or a feature list's lengths (as `mmt verify --against` lists a
        // dataset's fields): chosen with its values.
        const size_t values = resolve(name.substr(0, name.size() - 8));
        if (values != SIZE_MAX && (stats[values].kind == FeatureKind::Bytes || stats[values].sequence)) pick = values;
      }
      if (pick == SIZE_MAX) {
        std::vector<std::string> known;
        for (const auto& [n, s] : by_name) known.push_back(n);
        throw ValueError(str("the TFRecord files have no feature", list_stat_of.empty() ? "" : " or feature list", " '",
                             detail::cut_for_message(name, 200), "' (",
                             list_stat_of.empty() ? "features" : "features and feature lists",
                             ", as fields: ", detail::cut_for_message(detail::joined(known), 2000), ")"));
      }
      // Once, though a bytes_list's lengths may have chosen it already.
      if (std::find(chosen.begin(), chosen.end(), pick) == chosen.end()) chosen.push_back(pick);
    }
  }

  std::vector<Field> schema_fields;
  nlohmann::ordered_json described = nlohmann::ordered_json::object();
  for (const size_t s : chosen) {
    const KeyStats& stat = stats[s];
    const std::string name = field_name_of(stat.key);
    MMT_CHECK(stat.conflict.empty(), ValueError, stat.conflict, "; leave it out with --field");
    MMT_CHECK(stat.kind != FeatureKind::None, ValueError, feature_named(stat),
              stat.sequence ? " holds no list in any step of any record" : " holds no list in any record",
              " (first seen in ", examples->where(stat.first_record), "): it has no dtype to pack; leave it out with --field");
    TfRecordExamples::Column column{stat.key, stat.kind, schema_fields.size()};
    column.sequence = stat.sequence;
    const bool constant = stat.present == out.records_ && stat.min_values == stat.max_values && stat.min_values >= 1;
    // A feature list's steps hold one width when each holds as many values (or, for bytes,
    // one value of as many bytes): a field of [steps, width].
    const bool steps_alike = stat.min_step_values == stat.max_step_values && stat.min_step_values >= 1;
    try {
      if (stat.sequence && stat.kind == FeatureKind::Bytes) {
        MMT_CHECK(steps_alike && stat.min_step_values == 1, ValueError,
                  stat.max_step_values <= 1 ? std::string("a step holds no byte string (a Feature of no list, or an "
                                                          "empty bytes_list)")
                                            : str("its steps hold ", stat.min_step_values, " to ", stat.max_step_values,
                                                  " byte strings"),
                  "; a step of a bytes feature list is packed when it holds one, as "
                  "TensorFlow's FixedLenSequenceFeature reads it (lists of lists of strings are not packed): leave it "
                  "out with --field");
        if (stat.min_value_bytes == stat.max_value_bytes && stat.min_value_bytes >= 1) {
          column.step_width = stat.min_value_bytes;  // [steps, bytes]: YouTube-8M's quantized frames
          schema_fields.push_back(Field::ragged(name, kUInt8, {kVariableDim, column.step_width}));
        } else {
          column.joined = true;
          schema_fields.push_back(Field::bytes(name));
          schema_fields.push_back(Field::ragged(name + ".lengths", kInt64, {kVariableDim}));
        }
      } else if (stat.sequence) {
        const ScalarType dtype = stat.kind == FeatureKind::Float ? kFloat32 : kInt64;
        if (steps_alike) {
          column.step_width = stat.min_step_values;
          schema_fields.push_back(column.step_width == 1 ? Field::ragged(name, dtype, {kVariableDim})
                                                         : Field::ragged(name, dtype, {kVariableDim, column.step_width}));
        } else {
          column.joined = true;  // the steps' values joined, and each step's count
          schema_fields.push_back(Field::ragged(name, dtype, {kVariableDim}));
          schema_fields.push_back(Field::ragged(name + ".lengths", kInt64, {kVariableDim}));
        }
      } else if (stat.kind == FeatureKind::Bytes) {
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
      throw ValueError(str(feature_named(stat), ": ", e.what()));
    }
    described[name] = {{"key", stat.key}, {"kind", to_string(stat.kind)}};
    if (stat.sequence) described[name]["feature_list"] = true;
    examples->columns.push_back(std::move(column));
  }
  // Keys chosen together whose fields would share a name ('a/b' and 'a.b'; a list's
  // "j.lengths" and a feature "j/lengths"), named by key before the schema refuses the name.
  std::map<std::string_view, size_t> made_by;  // field name -> its chosen stat
  for (size_t c = 0; c < examples->columns.size(); ++c) {
    const TfRecordExamples::Column& column = examples->columns[c];
    for (size_t f = column.field; f <= column.field + (column.joined ? 1 : 0); ++f) {
      const auto [it, fresh] = made_by.emplace(schema_fields[f].name, chosen[c]);
      if (!fresh) refuse_pair(stats[it->second], stats[chosen[c]], schema_fields[f].name);
    }
  }
  try {
    out.schema_ = Schema(std::move(schema_fields));
  } catch (const ValueError& e) {
    throw ValueError(str("the TFRecord files' features: ", e.what()));
  }
  for (const TfRecordExamples::Column& column : examples->columns) {
    (column.sequence ? examples->list_column_of : examples->column_of).emplace(column.key, &column - examples->columns.data());
    examples->fixed_columns += column.fixed >= 0;
  }

  std::string files;
  for (size_t f = 0; f < examples->files.size(); ++f) files += str(f == 0 ? "" : ", ", examples->files[f].path);
  for (const TfRecordExamples::Column& column : examples->columns) {
    out.origins_.push_back(str(out.schema_[column.field].name, "=", files, " (TFRecord ",
                               column.sequence ? "feature list '" : "feature '", column.key, "', ",
                               to_string(column.kind), ")"));
    if (column.joined)
      out.origins_.push_back(str(out.schema_[column.field + 1].name, "=", files,
                                 column.sequence ? " (the step lengths of TFRecord feature list '"
                                                 : " (the lengths of TFRecord feature '",
                                 column.key, "')"));
  }
  out.metadata_["source"] = "tfrecord";
  out.metadata_[std::string(kTfRecordFeaturesMetadataKey)] = described.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  out.tfrecord_ = std::move(examples);
  return out;
}

std::vector<std::string> PackSources::tfrecord_fields_of(const Schema& schema, const Metadata& metadata,
                                                         const std::string& where) {
  std::vector<std::string> fields;
  const auto entry = metadata.find(std::string(kTfRecordFeaturesMetadataKey));
  if (entry == metadata.end()) {
    for (const Field& field : schema) fields.push_back(field.name);
    return fields;
  }
  const auto malformed = [&](const std::string& why) {
    return FormatError(str(where, ": metadata key '", kTfRecordFeaturesMetadataKey, "' ", why));
  };
  const nlohmann::json described = nlohmann::json::parse(entry->second, nullptr, false);
  if (!described.is_object()) throw malformed("is not a JSON object");
  for (const Field& field : schema) {
    const auto it = described.find(field.name);
    if (it == described.end()) {
      // A joined list's lengths come with its values.
      const bool lengths = field.name.ends_with(".lengths") &&
                           described.contains(field.name.substr(0, field.name.size() - 8));
      if (!lengths) fields.push_back(field.name);
      continue;
    }
    const auto key = it->is_object() ? it->find("key") : it->end();
    if (!it->is_object() || key == it->end() || !key->is_string())
      throw malformed(str("describes field '", detail::cut_for_message(field.name, 200), "' without its key"));
    const auto list = it->find("feature_list");
    const bool sequence = list != it->end() && list->is_boolean() && list->get<bool>();
    fields.push_back(str(sequence ? kFeatureListQualifier : kFeatureQualifier, key->get<std::string>()));
  }
  return fields;
}

namespace {

// A feature of a record that is packed: its column, its list, how many values it holds, and
// for a bytes_list where its values' spans begin in the reader's list of them.
struct PackedFeature {
  size_t column = 0;
  ExampleFeature feature;
  int64_t count = 0;  // values (of a feature list: of all its steps)
  size_t first_item = 0;
  // A feature list (`feature` holding its key and its FeatureList message): its steps, and the
  // rows it adds along its field's first dimension: its steps when they are alike, else its
  // values (bytes, for a bytes list). Its steps are read twice, counted then copied, and
  // never kept: a record of millions of two-byte steps must not take memory in proportion.
  int64_t steps = 0;
  int64_t rows = 0;
  int64_t bytes = 0;  // a bytes list's, all its steps'
};

// IoError ": feature list 'KEY' WHAT: the file changed" (naming() puts the record before it):
// a feature list read again is not what it was.
template <class... What>
[[noreturn]] void list_changed(const detail::TfRecordExamples::Column& column, const What&... what) {
  throw IoError(str(": feature list '", detail::cut_for_message(column.key, 200), "' ", what..., ": the file changed"));
}

// What one thread keeps while it reads records: these outlive the guarded sections that fill
// them (a fault inside one must skip no destructor: mapping_guard.h).
struct ReadScratch {
  std::vector<PackedFeature> packed;
  std::vector<std::span<const std::byte>> items;  // every bytes_list value, in packed's order
  std::vector<std::span<const std::byte>> list;   // one bytes_list's values
  std::vector<std::byte*> out;                    // per packed feature (record) or column (batch)
  std::vector<int64_t*> lengths_out;
  std::vector<int64_t> running, items_running, value_total, byte_total, step_total;
  std::vector<size_t> record_end;
};
ReadScratch& read_scratch() {
  thread_local ReadScratch scratch;
  return scratch;
}

// Reads the record at `span` of `base` (its file's bytes), under the caller's mapping guard:
// checks its data's CRC, parses its Example and appends each feature packed to
// scratch.packed (and a bytes_list's values to scratch.items), checked against the scan
// (kind, a fixed column's count, every fixed column present). Errors are left for the caller
// to name the record (naming()).
void read_packed_features(const TfRecordExamples& examples, const std::byte* base, detail::TfRecordSpan span,
                          ReadScratch& scratch) {
  thread_local std::vector<ExampleFeature> features;
  thread_local std::vector<detail::ExampleFeatureList> lists;
  detail::check_tfrecord_data(base, span, kNoWhere);
  detail::parse_example({base + span.offset, static_cast<size_t>(span.size)}, kNoWhere, features, lists);
  for (const detail::ExampleFeatureList& list : lists) {
    const auto found = examples.list_column_of.find(list.key);
    if (found == examples.list_column_of.end()) continue;  // not chosen
    const TfRecordExamples::Column& column = examples.columns[found->second];
    PackedFeature p{found->second, {list.key, column.kind, list.steps}};
    detail::for_each_feature_list_step(list, base + span.offset, kNoWhere, [&](const ExampleFeature& step) {
      if (step.kind != column.kind && step.kind != FeatureKind::None)
        list_changed(column, "now has a step of ", to_string(step.kind), ", not of the ", to_string(column.kind),
                     " it had when the files were scanned");
      int64_t n = 0;
      if (column.kind == FeatureKind::Bytes) {
        detail::bytes_values(step, kNoWhere, scratch.list);  // one, unless the file changed since the scan
        n = static_cast<int64_t>(scratch.list.size());
        if (n != 1) list_changed(column, "now has a step of ", n, " byte strings, not the one each held when scanned");
        const auto bytes = static_cast<int64_t>(scratch.list[0].size());
        if (column.step_width >= 0 && bytes != column.step_width)
          list_changed(column, "now has a step of ", bytes, " bytes, not the ", column.step_width, " each held when scanned");
        p.rows += column.step_width >= 0 ? 1 : bytes;
        p.bytes += bytes;
      } else {
        n = detail::feature_value_count(step, kNoWhere);
        if (column.step_width >= 0 && n != column.step_width)
          list_changed(column, "now has a step of ", n, " values, not the ", column.step_width, " each held when scanned");
        p.rows += column.step_width >= 0 ? 1 : n;
      }
      p.count += n;
      ++p.steps;
    });
    scratch.packed.push_back(p);
  }
  const size_t first = scratch.packed.size();
  size_t fixed_found = 0;
  for (const ExampleFeature& feature : features) {
    const auto found = examples.column_of.find(feature.key);
    if (found == examples.column_of.end()) continue;  // not chosen
    const TfRecordExamples::Column& column = examples.columns[found->second];
    MMT_CHECK(feature.kind == column.kind || feature.kind == FeatureKind::None, IoError, ": feature '",
              detail::cut_for_message(column.key, 200), "' is now a ", to_string(feature.kind), ", not the ",
              to_string(column.kind), " it was when the files were scanned: the file changed");
    const int64_t n = detail::feature_value_count(feature, kNoWhere);
    MMT_CHECK(column.fixed < 0 || n == column.fixed, IoError, ": feature '", detail::cut_for_message(column.key, 200),
              "' holds ", n, " values, not the ", column.fixed, " it held in every record when the files were "
              "scanned: the file changed");
    fixed_found += column.fixed >= 0;  // keys are unique within a record (parse_example)
    scratch.packed.push_back({found->second, feature, n, scratch.items.size()});
    if (column.kind != FeatureKind::Bytes) continue;
    detail::bytes_values(feature, kNoWhere, scratch.list);
    MMT_CHECK(static_cast<int64_t>(scratch.list.size()) == n, IoError, ": feature '",
              detail::cut_for_message(column.key, 200), "' changed while it was being read");
    scratch.items.insert(scratch.items.end(), scratch.list.begin(), scratch.list.end());
  }
  if (fixed_found == examples.fixed_columns) return;
  for (const TfRecordExamples::Column& column : examples.columns)
    MMT_CHECK(column.fixed < 0 || std::any_of(scratch.packed.begin() + static_cast<std::ptrdiff_t>(first),
                                              scratch.packed.end(),
                                              [&](const PackedFeature& p) { return &examples.columns[p.column] == &column; }),
              IoError, ": feature '", detail::cut_for_message(column.key, 200),
              "' is missing, but every record held it when the files were scanned: the file changed");
}

// Copies a float_list's or int64_list's values to `out` (count of them), under the caller's
// mapping guard.
void copy_numbers(const ExampleFeature& feature, int64_t count, FeatureKind kind, std::byte* out) {
  const auto n = static_cast<size_t>(count);
  if (kind == FeatureKind::Float)
    detail::copy_float_values(feature, {reinterpret_cast<float*>(out), n}, kNoWhere);
  else
    detail::copy_int64_values(feature, {reinterpret_cast<int64_t*>(out), n}, kNoWhere);
}

// Copies the values of feature list `p` (of `column`, in the record whose first byte is
// `record`) to `out`, its steps back to back, and when the column is joined each step's length
// (values, or bytes) to `lengths`, under the caller's mapping guard; read_packed_features()
// counted them. Returns the end of what it wrote to `out`. IoError, writing nothing past what
// was counted, when the steps are no longer what they were (the mapping changed since).
std::byte* copy_steps(const PackedFeature& p, const TfRecordExamples::Column& column, const std::byte* record,
                      std::byte* out, int64_t* lengths) {
  thread_local std::vector<std::span<const std::byte>> values;
  const int64_t value_bytes = column.kind == FeatureKind::Float ? 4 : 8;
  int64_t steps = 0, count = 0;  // so far
  detail::for_each_feature_list_step({p.feature.key, p.feature.list}, record, kNoWhere, [&](const ExampleFeature& step) {
    if (steps == p.steps) list_changed(column, "now has more steps than the ", p.steps, " it had");
    int64_t length = 0;
    if (column.kind == FeatureKind::Bytes) {
      detail::bytes_values(step, kNoWhere, values);
      if (values.size() != 1 || (column.step_width >= 0 && static_cast<int64_t>(values[0].size()) != column.step_width) ||
          static_cast<int64_t>(values[0].size()) > p.bytes - count)
        list_changed(column, "changed while it was being read");
      length = static_cast<int64_t>(values[0].size());
      if (length > 0) std::memcpy(out, values[0].data(), static_cast<size_t>(length));
      out += length;
      count += length;
    } else {
      length = column.step_width >= 0 ? column.step_width : detail::feature_value_count(step, kNoWhere);
      if (length > p.count - count) list_changed(column, "changed while it was being read");
      copy_numbers(step, length, column.kind, out);  // IoError unless it holds `length` values
      out += length * value_bytes;
      count += length;
    }
    if (lengths != nullptr) *lengths++ = length;
    ++steps;
  });
  if (steps != p.steps || count != (column.kind == FeatureKind::Bytes ? p.bytes : p.count))
    list_changed(column, "changed while it was being read");
  return out;
}

// The shape of `column`'s values for `rows` rows: [rows, width] for a feature list whose
// steps are alike and wider than one number, else [rows].
std::vector<int64_t> rows_shape(const TfRecordExamples::Column& column, const Field& field, int64_t rows) {
  return column.sequence && field.shape.size() == 2 ? std::vector<int64_t>{rows, column.step_width}
                                                    : std::vector<int64_t>{rows};
}

}  // namespace

void PackSources::tfrecord_record(int64_t index, std::vector<Tensor>& values) const {
  const TfRecordExamples& examples = *tfrecord_;
  const UntypedStorage bytes = examples.bytes_of(detail::part_of(examples.file_end, index).first);
  const detail::TfRecordSpan span = examples.spans[static_cast<size_t>(index)];
  const auto where = [&] { return examples.where(index); };
  ReadScratch& scratch = read_scratch();
  scratch.packed.clear();
  scratch.items.clear();
  const std::byte* base = bytes.data();
  // Read and checked first; then the tensors made, outside the guard; then the values copied.
  detail::guard_storage_reads(bytes, [&] {
    naming(where, [&] { read_packed_features(examples, base, span, scratch); });
  });
  for (const TfRecordExamples::Column& column : examples.columns) {  // what a record lacking the feature holds
    values[column.field] = empty(rows_shape(column, schema_[column.field], 0), schema_[column.field].dtype);
    if (column.joined) values[column.field + 1] = empty({0}, kInt64);
  }
  scratch.out.assign(scratch.packed.size(), nullptr);
  scratch.lengths_out.assign(scratch.packed.size(), nullptr);
  for (size_t k = 0; k < scratch.packed.size(); ++k) {
    const PackedFeature& p = scratch.packed[k];
    const TfRecordExamples::Column& column = examples.columns[p.column];
    Tensor& value = values[column.field];
    if (column.sequence) {
      value = empty(rows_shape(column, schema_[column.field], p.rows), schema_[column.field].dtype);
      if (column.joined) {
        values[column.field + 1] = empty({p.steps}, kInt64);
        scratch.lengths_out[k] = static_cast<int64_t*>(values[column.field + 1].mutable_data_ptr());
      }
    } else if (column.kind == FeatureKind::Bytes) {
      if (!column.joined) {  // a view of the file
        const std::span<const std::byte> item = scratch.items[p.first_item];
        if (!item.empty()) value = Tensor(bytes, kUInt8, {static_cast<int64_t>(item.size())}, item.data() - base);
        continue;
      }
      int64_t total = 0;
      Tensor lengths = empty({p.count}, kInt64);
      auto* length = static_cast<int64_t*>(lengths.mutable_data_ptr());
      for (int64_t i = 0; i < p.count; ++i) {
        length[i] = static_cast<int64_t>(scratch.items[p.first_item + static_cast<size_t>(i)].size());
        total += length[i];
      }
      value = empty({total}, kUInt8);
      values[column.field + 1] = std::move(lengths);
    } else {
      const std::vector<int64_t> shape = column.fixed == 1 ? std::vector<int64_t>{} : std::vector<int64_t>{p.count};
      if (column.kind == FeatureKind::Float) {
        const std::optional<std::span<const std::byte>> run = detail::packed_float_run(p.feature);
        const int64_t offset = run && !run->empty() ? run->data() - base : -1;
        if (offset >= 0 && offset % 4 == 0 && static_cast<int64_t>(run->size()) == 4 * p.count) {
          value = Tensor(bytes, kFloat32, shape, offset / 4);  // a view of the file
          continue;
        }
      }
      value = empty(shape, column.kind == FeatureKind::Float ? kFloat32 : kInt64);
    }
    scratch.out[k] = static_cast<std::byte*>(value.mutable_data_ptr());
  }
  detail::guard_storage_reads(bytes, [&] {
    naming(where, [&] {
      for (size_t k = 0; k < scratch.packed.size(); ++k) {
        const PackedFeature& p = scratch.packed[k];
        if (examples.columns[p.column].sequence) {
          copy_steps(p, examples.columns[p.column], base + span.offset, scratch.out[k], scratch.lengths_out[k]);
          continue;
        }
        if (scratch.out[k] == nullptr) continue;  // a view, or nothing to copy
        const FeatureKind kind = examples.columns[p.column].kind;
        if (kind != FeatureKind::Bytes) {
          copy_numbers(p.feature, p.count, kind, scratch.out[k]);
          continue;
        }
        std::byte* joined = scratch.out[k];
        for (int64_t i = 0; i < p.count; ++i) {
          const std::span<const std::byte> item = scratch.items[p.first_item + static_cast<size_t>(i)];
          if (!item.empty()) std::memcpy(joined, item.data(), item.size());
          joined += item.size();
        }
      }
    });
  });
}

int64_t PackSources::tfrecord_batch(int64_t start, int64_t count, std::vector<Tensor>& values,
                                    std::vector<Tensor>& offsets) const {
  const TfRecordExamples& examples = *tfrecord_;
  const size_t f = detail::part_of(examples.file_end, start).first;
  // Records of one file, up to detail::kCopiedRunBytes of them; a larger one goes alone,
  // through record(), which views its bytes in the file (import_util.h).
  count = std::min(count, examples.file_end[f] - start);
  int64_t records = 0, batch_bytes = 0;
  for (; records < count; ++records) {
    const int64_t size = examples.spans[static_cast<size_t>(start + records)].size;
    if (size >= detail::kRecordAloneBytes || (records > 0 && batch_bytes + size > detail::kCopiedRunBytes)) break;
    batch_bytes += size;
  }
  if (records == 0) return -1;
  count = records;

  // Pass one reads and checks each record, keeping its features, their counts and its byte
  // strings' spans; the buffers are then made, outside the guard; pass two copies the values.
  ReadScratch& scratch = read_scratch();
  scratch.packed.clear();
  scratch.items.clear();
  scratch.record_end.clear();
  const size_t columns = examples.columns.size();
  scratch.value_total.assign(columns, 0);
  scratch.byte_total.assign(columns, 0);
  scratch.step_total.assign(columns, 0);
  const UntypedStorage bytes = examples.bytes_of(f);
  const std::byte* base = bytes.data();
  detail::guard_storage_reads(bytes, [&] {
    for (int64_t r = 0; r < count; ++r) {
      naming([&] { return examples.where(start + r); },
             [&] { read_packed_features(examples, base, examples.spans[static_cast<size_t>(start + r)], scratch); });
      scratch.record_end.push_back(scratch.packed.size());
    }
  });
  for (const PackedFeature& p : scratch.packed) {
    if (examples.columns[p.column].sequence) {
      scratch.value_total[p.column] += p.rows;
      scratch.step_total[p.column] += p.steps;
      continue;
    }
    scratch.value_total[p.column] += p.count;
    if (examples.columns[p.column].kind == FeatureKind::Bytes)
      for (int64_t i = 0; i < p.count; ++i)
        scratch.byte_total[p.column] += static_cast<int64_t>(scratch.items[p.first_item + static_cast<size_t>(i)].size());
  }

  values.assign(schema_.size(), Tensor());
  offsets.assign(schema_.size(), Tensor());
  scratch.out.assign(columns, nullptr);  // where each column's next values go
  scratch.lengths_out.assign(columns, nullptr);  // a joined bytes_list's next lengths
  scratch.running.assign(columns, 0);
  scratch.items_running.assign(columns, 0);
  for (size_t c = 0; c < columns; ++c) {
    const TfRecordExamples::Column& column = examples.columns[c];
    const Field& field = schema_[column.field];
    if (column.sequence) {
      values[column.field] = empty(rows_shape(column, field, scratch.value_total[c]), field.dtype);
      offsets[column.field] = empty({count + 1}, kInt64);
      if (column.joined) {
        values[column.field + 1] = empty({scratch.step_total[c]}, kInt64);
        offsets[column.field + 1] = empty({count + 1}, kInt64);
        scratch.lengths_out[c] = static_cast<int64_t*>(values[column.field + 1].mutable_data_ptr());
      }
    } else if (column.kind == FeatureKind::Bytes) {
      values[column.field] = empty({scratch.byte_total[c]}, kUInt8);
      offsets[column.field] = empty({count + 1}, kInt64);
      if (column.joined) {
        values[column.field + 1] = empty({scratch.value_total[c]}, kInt64);
        offsets[column.field + 1] = empty({count + 1}, kInt64);
        scratch.lengths_out[c] = static_cast<int64_t*>(values[column.field + 1].mutable_data_ptr());
      }
    } else if (column.fixed >= 0) {
      std::vector<int64_t> shape{count};
      shape.insert(shape.end(), field.shape.begin(), field.shape.end());
      values[column.field] = empty(shape, field.dtype);
    } else {
      values[column.field] = empty({scratch.value_total[c]}, field.dtype);
      offsets[column.field] = empty({count + 1}, kInt64);
    }
    scratch.out[c] = static_cast<std::byte*>(values[column.field].mutable_data_ptr());
  }
  // Each column's record offsets, as one pointer per field (null for a fixed one).
  std::vector<int64_t*> field_offsets(schema_.size(), nullptr);
  for (size_t field = 0; field < schema_.size(); ++field)
    if (offsets[field].defined()) {
      field_offsets[field] = static_cast<int64_t*>(offsets[field].mutable_data_ptr());
      field_offsets[field][0] = 0;
    }
  detail::guard_storage_reads(bytes, [&] {
    size_t k = 0;
    for (int64_t r = 0; r < count; ++r) {
      naming([&] { return examples.where(start + r); }, [&] {
        for (; k < scratch.record_end[static_cast<size_t>(r)]; ++k) {
          const PackedFeature& p = scratch.packed[k];
          const size_t c = p.column;
          const TfRecordExamples::Column& column = examples.columns[c];
          if (column.sequence) {
            scratch.out[c] = copy_steps(p, column, base + examples.spans[static_cast<size_t>(start + r)].offset,
                                        scratch.out[c], scratch.lengths_out[c]);
            if (column.joined) scratch.lengths_out[c] += p.steps;
            scratch.running[c] += p.rows;
            scratch.items_running[c] += p.steps;
            continue;
          }
          if (column.kind == FeatureKind::Bytes) {
            for (int64_t i = 0; i < p.count; ++i) {
              const std::span<const std::byte> item = scratch.items[p.first_item + static_cast<size_t>(i)];
              if (!item.empty()) std::memcpy(scratch.out[c], item.data(), item.size());
              scratch.out[c] += item.size();
              scratch.running[c] += static_cast<int64_t>(item.size());
              if (column.joined) *scratch.lengths_out[c]++ = static_cast<int64_t>(item.size());
            }
            scratch.items_running[c] += p.count;
            continue;
          }
          copy_numbers(p.feature, p.count, column.kind, scratch.out[c]);
          scratch.out[c] += p.count * element_size(schema_[column.field].dtype);
          scratch.running[c] += p.count;
        }
      });
      for (size_t c = 0; c < columns; ++c) {
        const TfRecordExamples::Column& column = examples.columns[c];
        if (int64_t* at = field_offsets[column.field]) at[r + 1] = scratch.running[c];
        if (column.joined) field_offsets[column.field + 1][r + 1] = scratch.items_running[c];
      }
    }
  });
  return count;
}

std::string PackSources::tfrecord_origin(size_t field, int64_t index) const {
  const TfRecordExamples& examples = *tfrecord_;
  for (const TfRecordExamples::Column& column : examples.columns)
    if (field == column.field || (column.joined && field == column.field + 1))
      return str(examples.where(index), column.sequence ? ", feature list '" : ", feature '", column.key, "'",
                 field == column.field ? "" : column.sequence ? " (its steps' lengths)" : " (its lengths)");
  return examples.where(index);
}

}  // namespace mmt
