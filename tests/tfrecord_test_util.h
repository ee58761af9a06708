// Writes TFRecord files of tf.train.Example (and SequenceExample) records as TensorFlow's TFRecordWriter and
// Example.SerializeToString() do (tfrecord.h gives the layouts), so the tests need no
// TensorFlow: protobuf's wire format, packed numbers, and the masked CRC-32C framing.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "crc32c.h"
#include "importer_test_util.h"

namespace mmt::testutil {

inline std::string varint(uint64_t v) {
  std::string out;
  do {
    out.push_back(static_cast<char>((v & 0x7f) | (v > 0x7f ? 0x80 : 0)));
    v >>= 7;
  } while (v != 0);
  return out;
}
// A length-delimited field: tag, length, payload.
inline std::string message_field(int field, const std::string& payload) {
  std::string out = varint(static_cast<uint64_t>(field) << 3 | 2);  // appended, not a + chain: GCC 12's
  out += varint(payload.size());                                     // -Wrestrict misfires on those
  out += payload;
  return out;
}

using FeatureValue = std::variant<std::vector<std::string>, std::vector<float>, std::vector<int64_t>>;

// The bytes of a Feature message holding `value`'s list, numbers packed (as every writer does) or each
// with its own tag.
inline std::string feature_message(const FeatureValue& value, bool packed = true) {
  std::string list;
  if (const auto* bytes = std::get_if<std::vector<std::string>>(&value)) {
    for (const std::string& b : *bytes) list += message_field(1, b);
    return message_field(1, list);
  }
  if (const auto* floats = std::get_if<std::vector<float>>(&value)) {
    std::string run;
    for (const float f : *floats) {
      char le[4];
      std::memcpy(le, &f, 4);
      if (packed)
        run.append(le, 4);
      else
        list += varint(1 << 3 | 5) + std::string(le, 4);
    }
    if (packed && !floats->empty()) list = message_field(1, run);
    return message_field(2, list);
  }
  std::string run;
  for (const int64_t v : std::get<std::vector<int64_t>>(value)) {
    if (packed)
      run += varint(static_cast<uint64_t>(v));
    else
      list += varint(1 << 3 | 0) + varint(static_cast<uint64_t>(v));
  }
  if (packed && !run.empty()) list = message_field(1, run);
  return message_field(3, list);
}

// A serialized tf.train.Example of these features, in this order.
inline std::string example_bytes(const std::vector<std::pair<std::string, FeatureValue>>& features, bool packed = true) {
  std::string map;
  for (const auto& [key, value] : features) {  // a map entry: key = 1, value = 2
    std::string entry = message_field(1, key);
    entry += message_field(2, feature_message(value, packed));
    map += message_field(1, entry);
  }
  return message_field(1, map);
}

// A serialized tf.train.SequenceExample: `context` as an Example's features (left out when
// empty, as protobuf leaves an unset message), and `lists`, each a feature list of one Feature
// a step.
inline std::string sequence_example_bytes(const std::vector<std::pair<std::string, FeatureValue>>& context,
                                          const std::vector<std::pair<std::string, std::vector<FeatureValue>>>& lists) {
  std::string out = context.empty() ? std::string() : example_bytes(context);
  std::string map;
  for (const auto& [key, steps] : lists) {
    std::string list;
    for (const FeatureValue& step : steps) list += message_field(1, feature_message(step));
    std::string entry = message_field(1, key);
    entry += message_field(2, list);
    map += message_field(1, entry);
  }
  out += message_field(2, map);
  return out;
}

// Records framed as TFRecordWriter frames them.
inline Bytes tfrecord_file(const std::vector<std::string>& records) {
  Bytes out;
  const auto put = [&](const void* p, size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  };
  for (const std::string& record : records) {
    const uint64_t length = record.size();
    const uint32_t length_crc = detail::masked_crc32c(detail::crc32c(&length, 8));
    const uint32_t data_crc = detail::masked_crc32c(detail::crc32c(record.data(), record.size()));
    put(&length, 8);
    put(&length_crc, 4);
    put(record.data(), record.size());
    put(&data_crc, 4);
  }
  return out;
}

}  // namespace mmt::testutil
