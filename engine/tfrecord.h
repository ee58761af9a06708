// TensorFlow's TFRecord files and the tf.train.Example records in them: what
// PackSources::from_tfrecord reads (pack_tfrecord.cc).
//
// A TFRecord file is records back to back, each framed as TensorFlow's record_writer.cc
// writes it:
//   uint64 length     little-endian
//   uint32 masked CRC-32C of the 8 length bytes
//   length bytes      the record's data
//   uint32 masked CRC-32C of the data
// (crc32c.h says what masked means). A record's data is usually a serialized tf.train.Example
// (tensorflow/core/example/example.proto, feature.proto):
//   Example  { Features features = 1; }
//   Features { map<string, Feature> feature = 1; }     entries: key = 1, value = 2
//   Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
//                           Int64List int64_list = 3; } }
//   BytesList { repeated bytes value = 1; }
//   FloatList { repeated float value = 1 [packed = true]; }
//   Int64List { repeated int64 value = 1 [packed = true]; }
// or a tf.train.SequenceExample, whose context has an Example's field number:
//   SequenceExample { Features context = 1; FeatureLists feature_lists = 2; }
//   FeatureLists    { map<string, FeatureList> feature_list = 1; }
//   FeatureList     { repeated Feature feature = 1; }          one Feature a step
// in protobuf's wire format. Readers of it accept what protobuf parsers accept: fields in any
// order, unknown fields skipped, repeated numbers packed or not. Refused, because no writer
// of Examples makes them and a reader would have to guess: a feature key (or a feature list
// key) given twice in one record, a map entry of two keys or two values, a Feature holding two
// lists, and groups (wire types 3 and 4).
//
// Nothing here trusts a byte: every length, varint and tag is checked against the bytes it
// lies in, and the errors name `where` (the file and record) and the byte within the record.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mmt::detail {

inline constexpr int64_t kTfRecordHeaderBytes = 12;  // length and its CRC
inline constexpr int64_t kTfRecordFooterBytes = 4;   // the data's CRC

// Whether `head` (a file's first bytes) begins as a TFRecord file: it holds a length and that
// length's masked CRC-32C (a chance of 1 in 2^32 for other bytes).
bool is_tfrecord_start(const std::byte* head, size_t n);

// Where a record's data lies in its file.
struct TfRecordSpan {
  int64_t offset = 0;  // of the data, after the 12-byte header
  int64_t size = 0;
};

// Appends the span of every record of `file` (n bytes, the file `path`) to `out`, checking
// each length's CRC and that the record and its footer lie within the file. The data's CRCs
// are not checked here (check_tfrecord_data() does, as each record is read): this reads only
// the headers. FormatError "PATH: record R (byte B): ..." for a bad length CRC, a record cut
// short or bytes after the last record that are no record.
void scan_tfrecords(const std::byte* file, int64_t n, const std::string& path, std::vector<TfRecordSpan>& out);

// ChecksumError "WHERE: its data's CRC-32C is X, its footer states Y" unless the data of
// `span` (in `file`, whose bytes hold the span and its footer) matches its footer.
void check_tfrecord_data(const std::byte* file, TfRecordSpan span, const std::string& where);

enum class FeatureKind : uint8_t { None, Bytes, Float, Int64 };  // None: a Feature holding no list
// "bytes_list", "float_list", "int64_list", "no list".
const char* to_string(FeatureKind kind);

// One feature of an Example: its key and its list message (a BytesList, FloatList or
// Int64List), both within the record's bytes.
struct ExampleFeature {
  std::string_view key;
  FeatureKind kind = FeatureKind::None;
  std::span<const std::byte> list;
};

// A feature list of a SequenceExample: its key and its FeatureList message, both within the
// record's bytes (for_each_feature_list_step() reads its steps).
struct ExampleFeatureList {
  std::string_view key;
  std::span<const std::byte> steps;
};

// The features of the serialized tf.train.Example or SequenceExample `record` (its context),
// in the order they are written, into `out`, and a SequenceExample's feature lists into
// `lists` (both cleared first; an Example has none). FormatError "WHERE: byte B: ..." for
// bytes that are neither (see above), or a key given twice.
void parse_example(std::span<const std::byte> record, const std::string& where, std::vector<ExampleFeature>& out,
                   std::vector<ExampleFeatureList>& lists);
// The steps of `list` (of the record whose first byte is `record`) one at a time, each a
// Feature keyed by the list's key, without storing them (a record of millions of two-byte
// steps must not take memory in proportion): reads the step that begins at or after byte `at`
// of the list (0 for the first) into `step`, and returns the byte of the list after it, or
// -1 when no step is left. FormatError as parse_example().
int64_t next_feature_list_step(const ExampleFeatureList& list, const std::byte* record, const std::string& where,
                               int64_t at, ExampleFeature& step);
// fn(step) for each step of `list`, in order.
template <class Fn>
void for_each_feature_list_step(const ExampleFeatureList& list, const std::byte* record, const std::string& where,
                                Fn&& fn) {
  ExampleFeature step;
  for (int64_t at = 0; (at = next_feature_list_step(list, record, where, at, step)) >= 0;) fn(step);
}

// The number of values in `feature`'s list; FormatError naming `where` and the feature for a
// malformed list (a packed float run whose size is no multiple of 4, a cut varint...).
int64_t feature_value_count(const ExampleFeature& feature, const std::string& where);
// A float_list's values when its list is one packed run and nothing else (what every writer
// makes): the run's bytes, viewable as little-endian float32; nullopt otherwise.
std::optional<std::span<const std::byte>> packed_float_run(const ExampleFeature& feature);
// The values of a float_list or an int64_list into `out`, which must hold exactly
// feature_value_count() of them: IoError when the list now holds another number (the
// mapping it lies in changed since it was counted), FormatError as feature_value_count().
void copy_float_values(const ExampleFeature& feature, std::span<float> out, const std::string& where);
void copy_int64_values(const ExampleFeature& feature, std::span<int64_t> out, const std::string& where);
// The values of a bytes_list, into `out` (cleared first), each within the record's bytes.
void bytes_values(const ExampleFeature& feature, const std::string& where, std::vector<std::span<const std::byte>>& out);

}  // namespace mmt::detail
