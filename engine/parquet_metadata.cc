// Parquet's footer: the FileMetaData Thrift struct, read field by field (parquet.thrift's ids),
// every other field skipped.
#include <algorithm>
#include <array>
#include <cstring>

#include "parquet.h"
#include "thrift_compact.h"
#include "utf8.h"

namespace mmt::detail {

namespace {

constexpr char kMagic[4] = {'P', 'A', 'R', '1'};
constexpr char kEncryptedMagic[4] = {'P', 'A', 'R', 'E'};
constexpr int64_t kMaxSchemaElements = int64_t{1} << 20;

// LogicalType (a union of empty or small structs): which member, and its parameters.
void read_logical_type(ThriftReader& in, ParquetSchemaElement& e) {
  in.read_struct([&](int16_t id, ThriftType type) {
    if (type != ThriftType::Struct) return in.skip(type);
    switch (id) {
      case 1: e.logical = ParquetLogical::String; break;
      case 2: e.logical = ParquetLogical::Map; break;
      case 3: e.logical = ParquetLogical::List; break;
      case 4: e.logical = ParquetLogical::Enum; break;
      case 5:
        e.logical = ParquetLogical::Decimal;
        in.read_struct([&](int16_t f, ThriftType t) {
          if (f == 1) e.scale = static_cast<int32_t>(in.integer(t, INT32_MIN, INT32_MAX, "a decimal scale"));
          else if (f == 2) e.precision = static_cast<int32_t>(in.integer(t, INT32_MIN, INT32_MAX, "a decimal precision"));
          else in.skip(t);
        });
        return;
      case 6: e.logical = ParquetLogical::Date; break;
      case 7:
      case 8:
        e.logical = id == 7 ? ParquetLogical::Time : ParquetLogical::Timestamp;
        in.read_struct([&](int16_t f, ThriftType t) {
          if (f == 1) {
            e.adjusted_to_utc = in.boolean(t);
          } else if (f == 2 && t == ThriftType::Struct) {  // TimeUnit: MILLIS 1, MICROS 2, NANOS 3
            in.read_struct([&](int16_t unit, ThriftType u) {
              if (unit >= 1 && unit <= 3) e.time_unit = unit;
              in.skip(u);
            });
          } else {
            in.skip(t);
          }
        });
        return;
      case 10:
        e.logical = ParquetLogical::Integer;
        in.read_struct([&](int16_t f, ThriftType t) {
          if (f == 1) e.int_bits = static_cast<int>(in.integer(t, 0, 64, "an integer width"));
          else if (f == 2) e.int_signed = in.boolean(t);
          else in.skip(t);
        });
        return;
      case 11: e.logical = ParquetLogical::Unknown; break;
      case 12: e.logical = ParquetLogical::Json; break;
      case 13: e.logical = ParquetLogical::Bson; break;
      case 14: e.logical = ParquetLogical::Uuid; break;
      case 15: e.logical = ParquetLogical::Float16; break;
      default: e.logical = ParquetLogical::Other; break;
    }
    in.skip(type);
  });
}

// ConvertedType, the older annotation: taken where no LogicalType was written.
void apply_converted_type(int64_t converted, ParquetSchemaElement& e) {
  switch (converted) {
    case 0: e.logical = ParquetLogical::String; break;  // UTF8
    case 1: e.logical = ParquetLogical::Map; break;
    case 2: e.logical = ParquetLogical::Map; e.map_key_value = true; break;
    case 3: e.logical = ParquetLogical::List; break;
    case 4: e.logical = ParquetLogical::Enum; break;
    case 5: e.logical = ParquetLogical::Decimal; break;
    case 6: e.logical = ParquetLogical::Date; break;
    // As Arrow reads them: no time zone (what they were adjusted to is not said).
    case 7: case 8: e.logical = ParquetLogical::Time; e.time_unit = converted == 7 ? 1 : 2; break;
    case 9: case 10: e.logical = ParquetLogical::Timestamp; e.time_unit = converted == 9 ? 1 : 2; break;
    case 11: case 12: case 13: case 14:  // UINT_8 ... UINT_64
      e.logical = ParquetLogical::Integer; e.int_signed = false; e.int_bits = 8 << (converted - 11); break;
    case 15: case 16: case 17: case 18:  // INT_8 ... INT_64
      e.logical = ParquetLogical::Integer; e.int_signed = true; e.int_bits = 8 << (converted - 15); break;
    case 19: e.logical = ParquetLogical::Json; break;
    case 20: e.logical = ParquetLogical::Bson; break;
    case 21: e.logical = ParquetLogical::Interval; break;
    default: break;
  }
}

ParquetSchemaElement read_schema_element(ThriftReader& in) {
  ParquetSchemaElement e;
  int64_t converted = -1;
  bool has_logical = false;
  in.read_struct([&](int16_t id, ThriftType type) {
    switch (id) {
      case 1: e.type = static_cast<ParquetType>(in.integer(type, 0, 7, "a physical type")); break;
      case 2: e.type_length = static_cast<int32_t>(in.integer(type, INT32_MIN, INT32_MAX, "a type length")); break;
      case 3: e.repetition = static_cast<ParquetRepetition>(in.integer(type, 0, 2, "a repetition type")); break;
      case 4: e.name = std::string(in.binary(type)); break;
      case 5: e.num_children = static_cast<int32_t>(in.integer(type, 0, INT32_MAX, "a child count")); break;
      case 6: converted = in.integer(type); break;
      case 7: if (!has_logical) e.scale = static_cast<int32_t>(in.integer(type, INT32_MIN, INT32_MAX, "a scale")); else in.skip(type); break;
      case 8: if (!has_logical) e.precision = static_cast<int32_t>(in.integer(type, INT32_MIN, INT32_MAX, "a precision")); else in.skip(type); break;
      case 10:
        if (type != ThriftType::Struct) return in.skip(type);
        has_logical = true;
        read_logical_type(in, e);
        break;
      default: in.skip(type); break;
    }
  });
  if (!has_logical || e.logical == ParquetLogical::None) {
    apply_converted_type(converted, e);
  } else if (converted == 2) {
    e.map_key_value = true;
  }
  return e;
}

ParquetColumnChunk read_column_chunk(ThriftReader& in) {
  ParquetColumnChunk c;
  in.read_struct([&](int16_t id, ThriftType type) {
    switch (id) {
      case 1: c.file_path = std::string(in.binary(type)); break;
      case 3:
        if (type != ThriftType::Struct) return in.skip(type);
        c.has_metadata = true;
        in.read_struct([&](int16_t f, ThriftType t) {  // ColumnMetaData
          switch (f) {
            case 1: c.type = static_cast<ParquetType>(in.integer(t, 0, 7, "a physical type")); break;
            case 3:
              in.elements(in.list(t), [&](ThriftType element) { c.path.emplace_back(in.binary(element)); });
              break;
            case 4: c.codec = static_cast<int>(in.integer(t, 0, INT32_MAX, "a codec")); break;
            case 5: c.num_values = in.integer(t, 0, INT64_MAX, "a value count"); break;
            case 6: c.total_uncompressed_size = in.integer(t, 0, INT64_MAX, "an uncompressed size"); break;
            case 7: c.total_compressed_size = in.integer(t, 0, INT64_MAX, "a compressed size"); break;
            case 9: c.data_page_offset = in.integer(t, 0, INT64_MAX, "a data page offset"); break;
            case 11: c.dictionary_page_offset = in.integer(t); break;
            default: in.skip(t); break;
          }
        });
        break;
      default: in.skip(type); break;
    }
  });
  return c;
}

}  // namespace

bool is_parquet_start(const std::byte* head, size_t n) { return n >= 4 && std::memcmp(head, kMagic, 4) == 0; }

int64_t parquet_footer_length(int64_t size, std::span<const std::byte, 4> head, std::span<const std::byte, 8> tail,
                              const std::string& path) {
  MMT_CHECK(std::memcmp(head.data(), kMagic, 4) == 0 || size < 4, FormatError, path,
            ": not a Parquet file (it does not begin with \"PAR1\")");
  MMT_CHECK(size >= 12, FormatError, path, ": ", size, " bytes", size >= 4 ? ", too few for a Parquet file (at least "
            "12: its magic, footer length and end magic; cut short?)" : ": not a Parquet file (an empty or cut one)");
  MMT_CHECK(std::memcmp(tail.data() + 4, kEncryptedMagic, 4) != 0, ValueError, path,
            ": an encrypted Parquet file (its footer ends with \"PARE\"); decrypt it first");
  MMT_CHECK(std::memcmp(tail.data() + 4, kMagic, 4) == 0, FormatError, path,
            ": begins as a Parquet file but does not end with \"PAR1\" (", size,
            " bytes: cut short, or still being written)");
  uint32_t footer_length = 0;
  std::memcpy(&footer_length, tail.data(), 4);
  MMT_CHECK(footer_length > 0 && int64_t{footer_length} <= size - 12, FormatError, path, ": its footer's length (",
            footer_length, ") does not fit the file's ", size, " bytes");
  return footer_length;
}

ParquetMetadata read_parquet_metadata(std::span<const std::byte> bytes, const std::string& path) {
  const auto size = static_cast<int64_t>(bytes.size());
  std::array<std::byte, 4> head{};
  std::array<std::byte, 8> tail{};
  std::memcpy(head.data(), bytes.data(), std::min<size_t>(4, bytes.size()));
  if (bytes.size() >= 8) std::memcpy(tail.data(), bytes.data() + size - 8, 8);
  const int64_t footer_length = parquet_footer_length(size, head, tail, path);
  const int64_t footer_start = size - 8 - footer_length;
  return parse_parquet_footer(bytes.subspan(static_cast<size_t>(footer_start), static_cast<size_t>(footer_length)),
                              footer_start, path);
}

ParquetMetadata parse_parquet_footer(std::span<const std::byte> footer_bytes, int64_t footer_start,
                                     const std::string& path) {
  ThriftReader in(footer_bytes, str(path, ": the footer at byte ", footer_start));
  ParquetMetadata meta;
  bool has_schema = false, has_rows = false;
  in.read_struct([&](int16_t id, ThriftType type) {
    switch (id) {
      case 2: {
        const auto header = in.list(type);
        if (header.second > kMaxSchemaElements) in.fail(str("a schema of ", header.second, " elements"));
        has_schema = true;
        meta.schema.reserve(static_cast<size_t>(header.second));
        in.elements(header, [&](ThriftType element) {
          if (element != ThriftType::Struct) in.fail("a schema element that is not a struct");
          meta.schema.push_back(read_schema_element(in));
        });
        break;
      }
      case 3:
        meta.num_rows = in.integer(type, 0, INT64_MAX, "a row count");
        has_rows = true;
        break;
      case 4:
        in.elements(in.list(type), [&](ThriftType element) {
          if (element != ThriftType::Struct) in.fail("a row group that is not a struct");
          ParquetRowGroup& group = meta.row_groups.emplace_back();
          in.read_struct([&](int16_t f, ThriftType t) {
            if (f == 1) {
              in.elements(in.list(t), [&](ThriftType e) {
                if (e != ThriftType::Struct) in.fail("a column chunk that is not a struct");
                group.columns.push_back(read_column_chunk(in));
              });
            } else if (f == 3) {
              group.num_rows = in.integer(t, 0, INT64_MAX, "a row group's row count");
            } else {
              in.skip(t);
            }
          });
        });
        break;
      case 5:
        in.elements(in.list(type), [&](ThriftType element) {
          if (element != ThriftType::Struct) in.fail("a key-value pair that is not a struct");
          std::string key, value;
          in.read_struct([&](int16_t f, ThriftType t) {
            if (f == 1) key = std::string(in.binary(t));
            else if (f == 2) value = std::string(in.binary(t));
            else in.skip(t);
          });
          meta.key_values.emplace_back(std::move(key), std::move(value));
        });
        break;
      case 6: meta.created_by = std::string(in.binary(type)); break;
      default: in.skip(type); break;
    }
  });
  MMT_CHECK(has_schema && !meta.schema.empty() && has_rows, FormatError, path, ": the footer at byte ", footer_start,
            " lacks its schema or row count");
  return meta;
}

}  // namespace mmt::detail
