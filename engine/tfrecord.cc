#include "tfrecord.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "crc32c.h"
#include "load_cancel.h"
#include "mmtensor/error.h"
#include "utf8.h"

namespace mmt::detail {

namespace {

uint64_t load_le64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return std::endian::native == std::endian::little ? v : __builtin_bswap64(v);
}
uint32_t load_le32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return std::endian::native == std::endian::little ? v : __builtin_bswap32(v);
}

// Protobuf's wire types (https://protobuf.dev/programming-guides/encoding/).
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kStartGroup = 3, kEndGroup = 4, kFixed32 = 5 };

// Reads a message's fields front to back, each checked against the message's end. `origin`
// is the byte that positions in its messages count from (see Origin).
class WireReader {
 public:
  // Where the byte positions in messages are counted from: the record's first byte, or, where
  // the record's is not known (a list read after the scan), the list's.
  enum class Origin { Record, List };

  // `what` names the message read ("the tf.train.Example"), `key` the feature it belongs to
  // (empty for none): both must outlive the reader.
  WireReader(std::span<const std::byte> bytes, const std::byte* origin, Origin origin_kind, const std::string& where,
             std::string_view what, std::string_view key = {})
      : p_(bytes.data()), end_(bytes.data() + bytes.size()), origin_(origin), origin_kind_(origin_kind), where_(where),
        what_(what), key_(key) {}

  bool done() const { return p_ == end_; }

  uint64_t varint() {
    const std::byte* start = p_;
    uint64_t value = 0;
    for (int shift = 0;; shift += 7) {
      check(p_ < end_, start, "a varint runs past the end of its message");
      const auto byte = static_cast<uint8_t>(*p_++);
      // The tenth byte holds bit 63 alone: more is no 64-bit value.
      check(shift < 63 || byte <= 1, start, "a varint longer than 64 bits");
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return value;
    }
  }

  // The next field's number and wire type.
  std::pair<uint64_t, uint32_t> tag() {
    const std::byte* start = p_;
    const uint64_t tag = varint();
    const uint64_t field = tag >> 3;
    const auto type = static_cast<uint32_t>(tag & 7);
    check(field >= 1 && field <= (uint64_t{1} << 29) - 1, start, "a field number of ", field, ", outside 1 to 2^29 - 1");
    check(type != kStartGroup && type != kEndGroup, start,
          "field ", field, " is a group (wire type ", type, "), which no field of a tf.train.Example is");
    check(type == kVarint || type == kFixed64 || type == kLengthDelimited || type == kFixed32, start,
          "field ", field, " has wire type ", type, ", which protobuf does not have");
    return {field, type};
  }

  std::span<const std::byte> length_delimited() {
    const std::byte* start = p_;
    const uint64_t n = varint();
    check(n <= static_cast<uint64_t>(end_ - p_), start,
          "a field of ", n, " bytes runs past the end of its message (", end_ - p_, " bytes left)");
    std::span<const std::byte> out(p_, static_cast<size_t>(n));
    p_ += n;
    return out;
  }

  const std::byte* fixed(int64_t n) {
    check(end_ - p_ >= n, p_, "a ", n * 8, "-bit value runs past the end of its message");
    const std::byte* at = p_;
    p_ += n;
    return at;
  }

  void skip(uint32_t type) {
    switch (type) {
      case kVarint: varint(); break;
      case kFixed64: fixed(8); break;
      case kFixed32: fixed(4); break;
      default: length_delimited(); break;
    }
  }

  // FormatError naming where, the byte of `at`, what is being read and the message `parts`
  // make (formatted only on failure: a record's reads run these checks by the dozen).
  template <class... Parts>
  void check(bool ok, const std::byte* at, const Parts&... parts) const {
    if (!ok) [[unlikely]]
      fail(at, str(parts...));
  }
  [[noreturn]] void fail(const std::byte* at, std::string_view message) const {
    throw FormatError(str(where_, ": byte ", at - origin_, origin_kind_ == Origin::List ? " of the list" : " of the record", " (in ", what_,
                          key_.empty() ? "" : " of feature '", key_.empty() ? "" : cut_for_message(std::string(key_), 200),
                          key_.empty() ? "" : "'", "): ", message));
  }
  const std::byte* position() const { return p_; }

 private:
  const std::byte* p_;
  const std::byte* end_;
  const std::byte* origin_;
  Origin origin_kind_;
  const std::string& where_;
  std::string_view what_;
  std::string_view key_;
};

// A list message's field 1, the values, in the form `kind` stores them: fn(type, reader) for
// each occurrence, after which the reader must be past it. Other fields are skipped.
template <class Fn>
void walk_list(const ExampleFeature& feature, const std::string& where, Fn&& fn) {
  const char* what = feature.kind == FeatureKind::Bytes   ? "the bytes_list"
                     : feature.kind == FeatureKind::Float ? "the float_list"
                                                          : "the int64_list";
  WireReader list(feature.list, feature.list.data(), WireReader::Origin::List, where, what, feature.key);
  while (!list.done()) {
    const std::byte* start = list.position();
    const auto [field, type] = list.tag();
    if (field != 1) {
      list.skip(type);
      continue;
    }
    fn(type, list, start);
  }
}

}  // namespace

bool is_tfrecord_start(const std::byte* head, size_t n) {
  return n >= 12 && masked_crc32c(crc32c(head, 8)) == load_le32(head + 8);
}

void scan_tfrecords(const std::byte* file, int64_t n, const std::string& path, std::vector<TfRecordSpan>& out) {
  for (int64_t at = 0; at < n;) {
    const int64_t record = static_cast<int64_t>(out.size());
    if (record % 4096 == 0) check_load_cancelled();  // a cold file of GBs takes its disk's time
    const int64_t left = n - at;
    MMT_CHECK(left >= kTfRecordHeaderBytes, FormatError, path, ": record ", record, " (byte ", at, "): ", left,
              " bytes left, fewer than a record's 12-byte header: the file is cut short or has bytes after its "
              "last record");
    const uint64_t length = load_le64(file + at);
    const uint32_t stated = load_le32(file + at + 8), actual = masked_crc32c(crc32c(file + at, 8));
    MMT_CHECK(stated == actual, FormatError, path, ": record ", record, " (byte ", at, "): its length's CRC-32C is ",
              actual, ", its header states ", stated,
              record == 0 ? "; is this a TFRecord file? (gzip- and zlib-compressed ones are read as such)"
                          : " (the file is damaged, or has bytes after its last record)");
    MMT_CHECK(length <= static_cast<uint64_t>(left - kTfRecordHeaderBytes) &&
                  left - kTfRecordHeaderBytes - static_cast<int64_t>(length) >= kTfRecordFooterBytes,
              FormatError, path, ": record ", record, " (byte ", at, ") states ", length, " bytes, but ",
              left - kTfRecordHeaderBytes, " bytes follow its header, less than that and its 4-byte CRC: the file is cut "
              "short");
    out.push_back({at + kTfRecordHeaderBytes, static_cast<int64_t>(length)});
    at += kTfRecordHeaderBytes + static_cast<int64_t>(length) + kTfRecordFooterBytes;
  }
}

void check_tfrecord_data(const std::byte* file, TfRecordSpan span, const std::string& where) {
  const uint32_t stated = load_le32(file + span.offset + span.size);
  const uint32_t actual = masked_crc32c(crc32c(file + span.offset, static_cast<size_t>(span.size)));
  if (stated != actual)
    throw ChecksumError(str(where, ": the masked CRC-32C of its ", span.size, " bytes of data is ", actual,
                            ", its footer (byte ", span.offset + span.size, ") states ", stated));
}

const char* to_string(FeatureKind kind) {
  switch (kind) {
    case FeatureKind::Bytes: return "bytes_list";
    case FeatureKind::Float: return "float_list";
    case FeatureKind::Int64: return "int64_list";
    case FeatureKind::None: break;
  }
  return "Feature with no list";
}

namespace {

constexpr size_t kPairwiseKeys = 32;

// "'KEY' is given twice...", after "feature " or "feature list ".
std::string twice(std::string_view key) {
  return str("'", cut_for_message(std::string(key), 200),
             "' is given twice (protobuf would keep the last; no writer of Examples makes this)");
}

}  // namespace

namespace {

// Reads the Feature message `value` into `feature` (its kind and list).
void read_feature(std::span<const std::byte> value, const std::byte* origin, const std::string& where,
                  ExampleFeature& feature) {
  WireReader kind(value, origin, WireReader::Origin::Record, where, "the Feature", feature.key);
  while (!kind.done()) {
    const std::byte* at = kind.position();
    const auto [f, t] = kind.tag();
    if (f < 1 || f > 3) {
      kind.skip(t);
      continue;
    }
    kind.check(t == kLengthDelimited, at, "its list is not a message");
    kind.check(feature.kind == FeatureKind::None, at,
               "it holds a ", to_string(static_cast<FeatureKind>(f)), " after a ", to_string(feature.kind),
               " (protobuf would keep the last, or merge two of one kind; no writer of Examples makes this)");
    feature.kind = static_cast<FeatureKind>(f);
    feature.list = kind.length_delimited();
  }
}

// The entries of a protobuf map<string, MESSAGE> held in `map` (a Features or FeatureLists
// message, whose field 1 is the map): on_entry(key, value, entry_start, entry) for each, in
// the order written, `entry` the entry's reader (for its errors).
template <class OnEntry>
void walk_string_map(WireReader& map, const std::byte* origin, const std::string& where, const char* entry_what,
                     const char* value_what, OnEntry&& on_entry) {
  while (!map.done()) {
    const std::byte* entry_start = map.position();
    const auto [entry_field, entry_type] = map.tag();
    if (entry_field != 1) {
      map.skip(entry_type);
      continue;
    }
    map.check(entry_type == kLengthDelimited, entry_start, entry_what, " is not a message");
    WireReader entry(map.length_delimited(), origin, WireReader::Origin::Record, where, entry_what);
    std::string_view key;
    std::span<const std::byte> value;
    bool has_key = false, has_value = false;
    while (!entry.done()) {
      const std::byte* at = entry.position();
      const auto [f, t] = entry.tag();
      if (f == 1 || f == 2) {
        entry.check(t == kLengthDelimited, at, f == 1 ? "its key is not a string" : value_what);
        // Protobuf would keep the last key, and merge two values (two FeatureLists' steps
        // joined): no writer makes either, and a reader would have to guess.
        entry.check(!(f == 1 ? has_key : has_value), at, f == 1 ? "its key is given twice" : "its value is given twice",
                    " (protobuf would keep the last key, or merge the values; no writer of Examples makes this)");
        (f == 1 ? has_key : has_value) = true;
        const std::span<const std::byte> bytes = entry.length_delimited();
        if (f == 1)
          key = std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size());
        else
          value = bytes;
      } else {
        entry.skip(t);
      }
    }
    on_entry(key, value, entry_start, entry);
  }
}

// FormatError naming where unless the keys of `items` (each with a `key`) are unique. The first
// few are compared pairwise as they come (`check_last`); past that, all at once, sorted (a
// record of tens of thousands of keys must not take their square).
template <class Item>
void check_last_key_unique(const std::vector<Item>& items, WireReader& reader, const std::byte* at,
                           const char* what) {
  if (items.size() > kPairwiseKeys) return;
  for (size_t i = 0; i + 1 < items.size(); ++i)
    if (items[i].key == items.back().key) reader.fail(at, str(what, twice(items.back().key)));
}
template <class Item>
void check_keys_unique(const std::vector<Item>& items, const std::string& where, const char* what) {
  if (items.size() <= kPairwiseKeys) return;
  thread_local std::vector<std::string_view> keys;
  keys.clear();
  for (const Item& item : items) keys.push_back(item.key);
  std::sort(keys.begin(), keys.end());
  const auto repeated = std::adjacent_find(keys.begin(), keys.end());
  if (repeated != keys.end()) throw FormatError(str(where, ": ", what, twice(*repeated)));
}

}  // namespace

void parse_example(std::span<const std::byte> record, const std::string& where, std::vector<ExampleFeature>& out,
                   std::vector<ExampleFeatureList>& lists) {
  out.clear();
  lists.clear();
  const std::byte* origin = record.data();
  WireReader example(record, origin, WireReader::Origin::Record, where, "the tf.train.Example");
  while (!example.done()) {
    const std::byte* field_start = example.position();
    const auto [field, type] = example.tag();
    if (field == 2 && type == kLengthDelimited) {  // a SequenceExample's feature_lists
      WireReader feature_lists(example.length_delimited(), origin, WireReader::Origin::Record, where,
                               "its FeatureLists");
      walk_string_map(feature_lists, origin, where, "a feature list map entry", "its value is not a FeatureList message",
                      [&](std::string_view key, std::span<const std::byte> value, const std::byte* entry_start,
                          WireReader& entry) {
                        lists.push_back({key, value});
                        check_last_key_unique(lists, entry, entry_start, "feature list ");
                      });
      continue;
    }
    if (field != 1) {
      example.skip(type);
      continue;
    }
    example.check(type == kLengthDelimited, field_start, "its field 1 (features) is not a message");
    WireReader features(example.length_delimited(), origin, WireReader::Origin::Record, where, "its Features");
    walk_string_map(features, origin, where, "a feature map entry", "its value is not a Feature message",
                    [&](std::string_view key, std::span<const std::byte> value, const std::byte* entry_start,
                        WireReader& entry) {
                      ExampleFeature feature;
                      feature.key = key;
                      read_feature(value, origin, where, feature);
                      out.push_back(feature);
                      check_last_key_unique(out, entry, entry_start, "feature ");
                    });
  }
  check_keys_unique(out, where, "feature ");
  check_keys_unique(lists, where, "feature list ");
}

int64_t next_feature_list_step(const ExampleFeatureList& list, const std::byte* record, const std::string& where,
                               int64_t at, ExampleFeature& step) {
  WireReader steps(list.steps.subspan(static_cast<size_t>(at)), record, WireReader::Origin::Record, where,
                   "the FeatureList", list.key);
  while (!steps.done()) {
    const std::byte* start = steps.position();
    const auto [field, type] = steps.tag();
    if (field != 1) {
      steps.skip(type);
      continue;
    }
    steps.check(type == kLengthDelimited, start, "a step is not a Feature message");
    step = ExampleFeature{list.key, FeatureKind::None, {}};
    read_feature(steps.length_delimited(), record, where, step);
    return steps.position() - list.steps.data();
  }
  return -1;
}

namespace {

// Walks a float_list's or int64_list's values, checking their form, and calls put(value) for
// each: feature_value_count() counts them, the copies store them.
template <class Put>
void walk_numbers(const ExampleFeature& feature, const std::string& where, Put&& put) {
  walk_list(feature, where, [&](uint32_t type, WireReader& list, const std::byte* start) {
    if (feature.kind == FeatureKind::Float) {
      if (type == kFixed32) {
        put(std::bit_cast<float>(load_le32(list.fixed(4))));
        return;
      }
      list.check(type == kLengthDelimited, start, "a value is neither a float nor a packed run of them");
      const std::span<const std::byte> run = list.length_delimited();
      list.check(run.size() % 4 == 0, start, "a packed run of floats holds ", run.size(), " bytes, no multiple of 4");
      for (size_t i = 0; i < run.size(); i += 4) put(std::bit_cast<float>(load_le32(run.data() + i)));
      return;
    }
    if (type == kVarint) {
      put(static_cast<int64_t>(list.varint()));
      return;
    }
    list.check(type == kLengthDelimited, start, "a value is neither a varint nor a packed run of them");
    WireReader run(list.length_delimited(), feature.list.data(), WireReader::Origin::List, where,
                   "a packed run of int64 values", feature.key);
    while (!run.done()) put(static_cast<int64_t>(run.varint()));
  });
}

// Stores the values of `feature` into `out`, which must hold exactly as many: the record is
// read again from a mapping that another process could change between the count and the copy.
template <class T>
void copy_numbers(const ExampleFeature& feature, std::span<T> out, const std::string& where) {
  size_t n = 0;
  const auto changed = [&] {
    throw IoError(str(where, ": feature '", cut_for_message(std::string(feature.key), 200),
                      "' changed while it was being read (its values no longer number ", out.size(), ")"));
  };
  walk_numbers(feature, where, [&](auto value) {
    if (n == out.size()) changed();
    out[n++] = static_cast<T>(value);
  });
  if (n != out.size()) changed();
}

}  // namespace

int64_t feature_value_count(const ExampleFeature& feature, const std::string& where) {
  int64_t count = 0;
  if (feature.kind == FeatureKind::Bytes) {
    walk_list(feature, where, [&](uint32_t type, WireReader& list, const std::byte* start) {
      list.check(type == kLengthDelimited, start, "a value is not a byte string");
      list.length_delimited();
      ++count;
    });
  } else if (feature.kind != FeatureKind::None) {
    walk_numbers(feature, where, [&](auto) { ++count; });
  }
  return count;
}

std::optional<std::span<const std::byte>> packed_float_run(const ExampleFeature& feature) {
  if (feature.kind != FeatureKind::Float) return std::nullopt;
  // The writers' form exactly: tag 0x0A, the run's length, the run.
  const std::span<const std::byte> list = feature.list;
  if (list.empty()) return std::span<const std::byte>();
  if (static_cast<uint8_t>(list[0]) != 0x0A) return std::nullopt;
  uint64_t n = 0;
  size_t at = 1;
  for (int shift = 0; at < list.size() && shift < 64; shift += 7) {
    const auto byte = static_cast<uint8_t>(list[at++]);
    n |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      if (n != list.size() - at || n % 4 != 0) return std::nullopt;
      return list.subspan(at);
    }
  }
  return std::nullopt;
}

void copy_float_values(const ExampleFeature& feature, std::span<float> out, const std::string& where) {
  copy_numbers(feature, out, where);
}

void copy_int64_values(const ExampleFeature& feature, std::span<int64_t> out, const std::string& where) {
  copy_numbers(feature, out, where);
}

void bytes_values(const ExampleFeature& feature, const std::string& where, std::vector<std::span<const std::byte>>& out) {
  out.clear();
  walk_list(feature, where, [&](uint32_t type, WireReader& list, const std::byte* start) {
    list.check(type == kLengthDelimited, start, "a value is not a byte string");
    out.push_back(list.length_delimited());
  });
}

}  // namespace mmt::detail
