// Parquet inputs: real files written by DuckDB 1.5.6, arrow-rs 59 (parquet-wasm 0.8.0) and
// hyparquet-writer 0.17.0 (tests/data/parquet, each with the values its writer was given, as
// another reader read them back: NAME.expected.json), decoded value for value; packed as
// Arrow inputs are; and damaged at every byte, which must give errors, never crashes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "arrow_test_util.h"
#include "importer_test_util.h"
#include "mmtensor/dataset.h"
#include "mmtensor/error.h"
#include "mmtensor/packer.h"
#include "parquet.h"
#include "test_util.h"

namespace mmt {
namespace {

namespace fs = std::filesystem;
using detail::ArrowBatch;
using detail::ArrowField;
using detail::ArrowIpc;
using detail::ArrowTypeId;
using json = nlohmann::json;
using testing::error_of;
using testutil::field_value;
using testutil::TempFolder;
using testutil::text_of;

const fs::path kData = fs::path(MMT_SOURCE_DIR) / "tests" / "data" / "parquet";

std::string data_file(const std::string& name) { return (kData / (name + ".parquet")).string(); }

json expected_of(const std::string& name) {
  std::ifstream in(kData / (name + ".expected.json"));
  return json::parse(in);
}

// --- Arrow batches as JSON rows, as the expected files write them ---------------------------

class ArrowAsJson {
 public:
  explicit ArrowAsJson(const ArrowIpc& ipc) : ipc_(ipc) {
    first_.resize(static_cast<size_t>(ipc.node_count));
    int buffer = 0;
    number(ipc.fields, buffer);
  }
  json column(const std::string& name) const {
    const auto field = std::find_if(ipc_.fields.begin(), ipc_.fields.end(), [&](const ArrowField& f) { return f.name == name; });
    if (field == ipc_.fields.end()) return nullptr;
    json rows = json::array();
    for (const ArrowBatch& batch : ipc_.batches)
      for (int64_t r = 0; r < batch.rows; ++r) rows.push_back(value(batch, *field, r));
    return rows;
  }

 private:
  void number(const std::vector<ArrowField>& fields, int& buffer) {
    for (const ArrowField& f : fields) {
      first_[static_cast<size_t>(f.node)] = buffer;
      buffer += f.type == ArrowTypeId::Struct ? 1 : f.type == ArrowTypeId::LargeBinary || f.type == ArrowTypeId::LargeUtf8 ? 3 : 2;
      number(f.children, buffer);
    }
  }
  const std::byte* buffer(const ArrowBatch& b, int node, int k) const {
    return ipc_.decompressed.data() + b.buffers[static_cast<size_t>(first_[static_cast<size_t>(node)] + k)].offset;
  }
  template <class T>
  static T load(const std::byte* p, int64_t i) {
    T v;
    std::memcpy(&v, p + sizeof(T) * static_cast<size_t>(i), sizeof(T));
    return v;
  }
  static std::string hex(const std::byte* p, size_t n) {
    std::string out = "hex:";
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; ++i) {
      out += digits[static_cast<uint8_t>(p[i]) >> 4];
      out += digits[static_cast<uint8_t>(p[i]) & 15];
    }
    return out;
  }
  json value(const ArrowBatch& b, const ArrowField& f, int64_t i) const {
    if (b.nodes[static_cast<size_t>(f.node)].null_count > 0 &&
        ((static_cast<uint8_t>(buffer(b, f.node, 0)[i / 8]) >> (i % 8)) & 1) == 0)
      return nullptr;
    const std::byte* p = buffer(b, f.node, 1);
    switch (f.type) {
      case ArrowTypeId::Bool: return ((static_cast<uint8_t>(p[i / 8]) >> (i % 8)) & 1) != 0;
      case ArrowTypeId::Int: case ArrowTypeId::Date: case ArrowTypeId::Time: case ArrowTypeId::Timestamp:
        switch (f.bit_width) {
          case 8: return f.is_signed ? json(load<int8_t>(p, i)) : json(load<uint8_t>(p, i));
          case 16: return f.is_signed ? json(load<int16_t>(p, i)) : json(load<uint16_t>(p, i));
          case 32: return f.is_signed || f.type != ArrowTypeId::Int ? json(load<int32_t>(p, i)) : json(load<uint32_t>(p, i));
          default: return f.is_signed || f.type != ArrowTypeId::Int ? json(load<int64_t>(p, i)) : json(load<uint64_t>(p, i));
        }
      case ArrowTypeId::FloatingPoint:
        if (f.precision == 1) return load<float>(p, i);
        if (f.precision == 2) return load<double>(p, i);
        return half_to_double(load<uint16_t>(p, i));
      case ArrowTypeId::LargeUtf8:
      case ArrowTypeId::LargeBinary: {
        const auto start = load<int64_t>(p, i), end = load<int64_t>(p, i + 1);
        const std::byte* data = buffer(b, f.node, 2) + start;
        if (f.type == ArrowTypeId::LargeBinary) return hex(data, static_cast<size_t>(end - start));
        return std::string(reinterpret_cast<const char*>(data), static_cast<size_t>(end - start));
      }
      case ArrowTypeId::FixedSizeBinary: return hex(p + f.fixed_size * i, static_cast<size_t>(f.fixed_size));
      case ArrowTypeId::Decimal: {  // decimal128: its integer, and the point `scale` digits from its end
        EXPECT_EQ(f.bit_width, 128);
        __int128 v;
        std::memcpy(&v, p + 16 * i, 16);
        const bool negative = v < 0;
        unsigned __int128 magnitude = negative ? -static_cast<unsigned __int128>(v) : static_cast<unsigned __int128>(v);
        std::string digits;
        do {
          digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(magnitude % 10)));
          magnitude /= 10;
        } while (magnitude > 0);
        if (f.scale > 0) {
          if (digits.size() <= static_cast<size_t>(f.scale)) digits.insert(0, static_cast<size_t>(f.scale) + 1 - digits.size(), '0');
          digits.insert(digits.end() - f.scale, '.');
        }
        return (negative ? "-" : "") + digits;
      }
      case ArrowTypeId::LargeList:
      case ArrowTypeId::Map: {  // the reader's maps have 64-bit offsets too
        json out = json::array();
        for (int64_t k = load<int64_t>(p, i); k < load<int64_t>(p, i + 1); ++k) out.push_back(value(b, f.children[0], k));
        return out;
      }
      case ArrowTypeId::Struct: {
        json out = json::object();
        for (const ArrowField& child : f.children) out[child.name] = value(b, child, i);
        return out;
      }
      default: return "unexpected type";
    }
  }
  static double half_to_double(uint16_t h) {
    const int exponent = (h >> 10) & 31, mantissa = h & 1023;
    const double sign = (h & 0x8000) != 0 ? -1 : 1;
    if (exponent == 0) return sign * std::ldexp(mantissa, -24);
    if (exponent == 31) return mantissa == 0 ? sign * INFINITY : NAN;
    return sign * std::ldexp(1024 + mantissa, exponent - 25);
  }

  const ArrowIpc& ipc_;
  std::vector<int> first_;
};

// Equal as the writers' values: numbers by value (float32 values as their doubles), UUIDs as
// their 16 bytes.
bool same(const json& got, const json& want) {
  if (got.is_number() && want.is_number()) {
    if (got.is_number_float() || want.is_number_float()) return got.get<double>() == want.get<double>();
    const bool got_negative = got.is_number_integer() && !got.is_number_unsigned() && got.get<int64_t>() < 0;
    const bool want_negative = want.is_number_integer() && !want.is_number_unsigned() && want.get<int64_t>() < 0;
    if (got_negative != want_negative) return false;
    if (!got_negative) return got.get<uint64_t>() == want.get<uint64_t>();
    return got.get<int64_t>() == want.get<int64_t>();
  }
  if (got.is_string() && want.is_string() && want.get<std::string>().size() == 36 &&
      got.get<std::string>().starts_with("hex:")) {  // a UUID
    std::string digits = want.get<std::string>();
    digits.erase(std::remove(digits.begin(), digits.end(), '-'), digits.end());
    return "hex:" + digits == got.get<std::string>();
  }
  if (got.is_array() && want.is_array()) {
    if (got.size() != want.size()) return false;
    for (size_t i = 0; i < got.size(); ++i)
      if (!same(got[i], want[i])) return false;
    return true;
  }
  if (got.is_object() && want.is_object()) {
    if (got.size() != want.size()) return false;
    for (const auto& [key, value] : want.items())
      if (!got.contains(key) || !same(got[key], value)) return false;
    return true;
  }
  return got == want;
}

// Columns no field holds, which the reader refuses by name: left out here.
bool refused_type(const std::string& type) {
  for (const char* t : {"interval", "source column was DuckDB HUGEINT"})
    if (type.find(t) != std::string::npos) return true;
  return false;
}

std::vector<std::string> data_files() {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(kData))
    if (entry.path().extension() == ".parquet") out.push_back(entry.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ParquetReader, EveryRealFileDecodesToTheValuesItsWriterWasGiven) {
  const std::vector<std::string> files = data_files();
  ASSERT_GE(files.size(), 20u);
  for (const std::string& name : files) {
    SCOPED_TRACE(name);
    const json expected = expected_of(name);
    std::vector<std::string> columns;
    for (const json& column : expected["columns"])
      if (!refused_type(column["type"].get<std::string>())) columns.push_back(column["name"]);
    const ArrowIpc ipc = detail::read_parquet_as_arrow(data_file(name), columns);
    const ArrowAsJson rows(ipc);
    for (const json& column : expected["columns"]) {
      const std::string column_name = column["name"];
      if (refused_type(column["type"].get<std::string>())) continue;
      SCOPED_TRACE(column_name);
      const json got = rows.column(column_name);
      ASSERT_TRUE(got.is_array());
      ASSERT_EQ(got.size(), column["values"].size());
      for (size_t r = 0; r < got.size(); ++r)
        EXPECT_TRUE(same(got[r], column["values"][r])) << "row " << r << ": " << got[r].dump() << " vs " << column["values"][r].dump();
    }
    for (const auto& [key, value] : expected["key_value_metadata"].items()) {
      const auto it = std::find_if(ipc.metadata.begin(), ipc.metadata.end(), [&](const auto& kv) { return kv.first == key; });
      ASSERT_NE(it, ipc.metadata.end()) << key;
      EXPECT_EQ(it->second, value.get<std::string>());
    }
  }
}

// A column chunk's pages decoded on several threads, one part of them each, then joined:
// the same levels and values as decoded in order, for every column of files of many pages.
TEST(ParquetReader, PagesDecodedOnThreadsJoinAsDecodedInOrder) {
  for (const std::string name : {"pw_rowgroups_pages_v2_dict", "hw_rowgroups_pages", "pw_nested_v2_plain"}) {
    SCOPED_TRACE(name);
    const testutil::Bytes file = testutil::read_file(data_file(name));
    const detail::ParquetMetadata meta = detail::read_parquet_metadata(file, name);
    // The leaves' levels, from the schema (pre-order; a group's children follow it).
    std::vector<detail::ParquetLeaf> leaves;
    struct Open {
      int32_t children_left;
      int16_t definition, repetition;
    };
    std::vector<Open> stack{{meta.schema[0].num_children, 0, 0}};
    for (size_t i = 1; i < meta.schema.size(); ++i) {
      while (stack.back().children_left == 0) stack.pop_back();
      --stack.back().children_left;
      const detail::ParquetSchemaElement& e = meta.schema[i];
      const auto definition = static_cast<int16_t>(stack.back().definition + (e.repetition != detail::ParquetRepetition::Required));
      const auto repetition = static_cast<int16_t>(stack.back().repetition + (e.repetition == detail::ParquetRepetition::Repeated));
      if (e.type == detail::ParquetType::Group) stack.push_back({e.num_children, definition, repetition});
      else leaves.push_back({e.type, e.type_length, definition, repetition});
    }
    int many_pages = 0;
    for (const detail::ParquetRowGroup& group : meta.row_groups) {
      ASSERT_EQ(group.columns.size(), leaves.size());
      for (size_t c = 0; c < leaves.size(); ++c) {
        detail::ParquetColumnValues in_order, on_threads;
        const auto end = static_cast<int64_t>(file.size()) - 8;
        const detail::ParquetByteRange range = detail::parquet_chunk_range(group.columns[c], end, name);
        const std::span<const std::byte> bytes(file.data() + range.begin, static_cast<size_t>(range.end - range.begin));
        detail::read_parquet_column(bytes, range.begin, group.columns[c], leaves[c], name, in_order, 1);
        detail::read_parquet_column(bytes, range.begin, group.columns[c], leaves[c], name, on_threads, 3);
        EXPECT_EQ(on_threads.definition, in_order.definition);
        EXPECT_EQ(on_threads.repetition, in_order.repetition);
        EXPECT_EQ(on_threads.values, in_order.values);
        EXPECT_EQ(on_threads.offsets, in_order.offsets);
        EXPECT_EQ(on_threads.entries, in_order.entries);
        EXPECT_EQ(on_threads.count, in_order.count);
        many_pages += in_order.entries > 0;
      }
    }
    EXPECT_GT(many_pages, 0);
  }
}

// Row groups are decoded on several threads (the CPUs this process may use, up to 8), a few
// ahead of the one written, and written in order: the rows of a file of 10 row groups (or
// 3) come out in order, and an error in one of them reaches the caller. (Named for the
// thread sanitizer's filter.)
TEST(ParquetReader, RowGroupsDecodedInParallelComeOutInOrder) {
  for (const std::string name : {"pw_rowgroups_pages_v2_dict", "hw_rowgroups_pages", "duckdb_codec_zstd"}) {
    SCOPED_TRACE(name);
    const json expected = expected_of(name);
    const ArrowIpc ipc = detail::read_parquet_as_arrow(data_file(name), {});
    const ArrowAsJson rows(ipc);
    for (const json& column : expected["columns"]) {
      const json got = rows.column(column["name"]);
      ASSERT_EQ(got.size(), column["values"].size());
      for (size_t r = 0; r < got.size(); ++r) ASSERT_TRUE(same(got[r], column["values"][r])) << r;
    }
  }
  // A page of the last row group damaged: its error, naming it, after the others decoded.
  TempFolder dir;
  testutil::Bytes bytes = testutil::read_file(data_file("pw_rowgroups_pages_v2_dict"));
  const detail::ParquetMetadata meta = detail::read_parquet_metadata(bytes, "file");
  ASSERT_GE(meta.row_groups.size(), 3u);
  const detail::ParquetColumnChunk& last = meta.row_groups.back().columns.front();
  const int64_t first_page = last.dictionary_page_offset > 0 ? last.dictionary_page_offset : last.data_page_offset;
  bytes[static_cast<size_t>(first_page)] = std::byte{0xFF};  // no page header begins so
  const std::string damaged = dir / "damaged.parquet";
  testutil::write_file(damaged, bytes);
  const std::string error = error_of([&] { (void)detail::read_parquet_as_arrow(damaged, {}); });
  EXPECT_NE(error.find("row group " + std::to_string(meta.row_groups.size() - 1) + ", column '"), std::string::npos) << error;
}

// Files written by hand, byte by byte, as other writers lay them out (tests/data/parquet/edge):
// the list and struct forms of the spec's rules, pages of nothing, and a bomb.
TEST(ParquetReader, ListFormsEmptyPagesAndBombs) {
  const auto rows_of = [](const std::string& name, const std::string& column) {
    const ArrowIpc ipc = detail::read_parquet_as_arrow((kData / "edge" / (name + ".parquet")).string(), {});
    return ArrowAsJson(ipc).column(column).dump();
  };
  // optional group a (LIST) { repeated int32 element }: the two-level form of older writers.
  EXPECT_EQ(rows_of("two_level_list", "a"), "[[1,2],[],null,[3]]");
  // list<list<int32>>, three levels each, nulls and empty lists at both.
  EXPECT_EQ(rows_of("nested_lists_with_nulls", "a"), "[[[1,null],[],null],null,[],[[2]]]");
  // optional struct s { optional LIST l, optional int32 y }.
  EXPECT_EQ(rows_of("struct_of_list", "s"), R"([null,{"l":null,"y":7},{"l":[4,null],"y":null},{"l":[],"y":8}])");
  // repeated int32 r, not annotated: a list (never null) of required values.
  EXPECT_EQ(rows_of("unannotated_repeated", "r"), "[[1,2],[],[3]]");
  EXPECT_EQ(rows_of("struct_of_repeated", "s"), R"([null,{"r":[]},{"r":[5,6]}])");
  // required group a (LIST) { repeated group list { required int32 element } }.
  EXPECT_EQ(rows_of("required_list", "a"), "[[1],[],[2,3]]");
  // Lists of structs: parquet-avro's two-level form (the repeated group of two fields is the
  // element), and an unannotated repeated group (a list, never null, of required structs).
  EXPECT_EQ(rows_of("two_level_list_of_structs", "points"),
            R"([[{"x":1,"y":"a"},{"x":2,"y":"bc"}],[],null,[{"x":3,"y":""}]])");
  EXPECT_EQ(rows_of("repeated_group", "points"), R"([[{"w":0.5,"x":1},{"w":1.5,"x":2}],[],[{"w":2.5,"x":3}]])");
  // A struct's lists come from its first column; another whose levels put as many values in
  // other lists (three rows of one point, against [2 points], [], [1 point]) is refused:
  // equal counts alone would pair one row's x with another's w.
  const std::string misaligned = error_of([&] { (void)rows_of("misaligned_struct_lists", "points"); });
  EXPECT_NE(misaligned.find("row group 0, column 'points.w': its levels place its values in other lists than those "
                            "of column 'points.x', beside it in group 'points'"),
            std::string::npos)
      << misaligned;
  // A map as older writers annotate it: MAP_KEY_VALUE on the outer group. Its value column's
  // levels putting as many values in other maps is refused, as a struct's are.
  EXPECT_EQ(rows_of("legacy_map", "m"), R"([[{"key":"a","value":1},{"key":"b","value":2}],null,[],[{"key":"c","value":3}]])");
  const std::string misaligned_map = error_of([&] { (void)rows_of("legacy_map_misaligned", "m"); });
  EXPECT_NE(misaligned_map.find("column 'm.map.value': its levels place its values in other lists than those of "
                                "column 'm.map.key'"),
            std::string::npos)
      << misaligned_map;
  // A first data page of no values, then one of [1, 2].
  EXPECT_EQ(rows_of("first_page_empty", "a"), "[[1,2]]");
  // Pages whose values are nothing: arrow-rs's zstd frame of no bytes (all-null strings, V2,
  // and an empty dictionary), and Spark's V2 page of nulls with no body at all.
  EXPECT_EQ(rows_of("arrow_rs_null_strings_zstd_v2", "s"), "[null,null,null]");
  EXPECT_EQ(rows_of("v2_empty_body_zstd", "value"), "[null]");
  // 667 bytes: a dictionary of one 16 MiB value, 65,536 indices of it (1 TiB): refused before
  // anything is allocated, naming the page.
  const std::string bomb = error_of([&] { (void)rows_of("dictionary_bomb", "x"); });
  EXPECT_NE(bomb.find("row group 0, column 'x', the page at byte 552: decodes to more than "), std::string::npos) << bomb;
  EXPECT_NE(bomb.find("refused as a decompression bomb"), std::string::npos)
      << bomb;
}

// Bombs: a few hundred bytes standing for gigabytes of levels and slots (8 pages of 200 million nulls)
// or of offsets (150 million empty strings of a dictionary) are refused at the limit (here
// set to 256 MiB), counted over every thread that decodes a part of the column chunk.
TEST(ParquetReader, DecompressionBombsAreRefusedWhateverTheThreads) {
  detail::set_parquet_decode_floor(int64_t{256} << 20);
  for (const std::string name : {"null_runs_bomb", "empty_strings_bomb", "dictionary_bomb"}) {
    for (const int threads : {1, 4}) {
      SCOPED_TRACE(name + " on " + std::to_string(threads) + " threads");
      const testutil::Bytes file = testutil::read_file((kData / "edge" / (name + ".parquet")).string());
      const detail::ParquetMetadata meta = detail::read_parquet_metadata(file, name);
      const detail::ParquetSchemaElement& e = meta.schema.at(1);
      const detail::ParquetLeaf leaf{e.type, e.type_length,
                                     static_cast<int16_t>(e.repetition == detail::ParquetRepetition::Optional), 0};
      const detail::ParquetColumnChunk& chunk = meta.row_groups.at(0).columns.at(0);
      const detail::ParquetByteRange range = detail::parquet_chunk_range(chunk, static_cast<int64_t>(file.size()) - 8, name);
      detail::ParquetColumnValues out;
      const std::string error = error_of([&] {
        detail::read_parquet_column(std::span(file).subspan(static_cast<size_t>(range.begin),
                                                            static_cast<size_t>(range.end - range.begin)),
                                    range.begin, chunk, leaf, name, out, threads);
      });
      EXPECT_NE(error.find("refused as a decompression bomb"), std::string::npos) << error;
      // Its nulls' slots in Arrow's layout (8 bytes each, beside a byte of level) are counted
      // as their page is decoded: the first page's 200 million are past the limit.
      if (name == "null_runs_bomb" && threads == 1) {
        EXPECT_NE(error.find("the page at byte 4: decodes to more than"), std::string::npos) << error;
      }
    }
  }
  detail::set_parquet_decode_floor(0);
}

TEST(ParquetReader, TypesReadAsPyarrowReadsThem) {
  const ArrowIpc ipc = detail::read_parquet_as_arrow(data_file("pw_types"), std::vector<std::string>{"i8", "u64", "date", "ts_ns_utc", "time_ms", "f16"});
  std::vector<std::string> types;
  for (const ArrowField& f : ipc.fields) types.push_back(detail::arrow_type_name(f));
  EXPECT_EQ(types, (std::vector<std::string>{"int8", "uint64", "date32[day]", "timestamp[ns, tz=UTC]", "time32[ms]", "halffloat"}));
}

TEST(PackParquet, HuggingFaceImageRowsPackWithTheirClassNames) {
  const std::string path = data_file("pw_hf_image");
  EXPECT_TRUE(are_arrow_inputs(std::vector<std::string>{path}));
  const PackSources sources = PackSources::from_inputs(std::vector<std::string>{path});
  ASSERT_EQ(sources.records(), 6);
  const Schema& schema = sources.schema();
  ASSERT_EQ(schema.size(), 4u);
  EXPECT_EQ(schema[0].name, "image.bytes");
  EXPECT_EQ(schema[1].name, "image.path");
  EXPECT_EQ(schema[2].name, "image.path.valid");
  EXPECT_EQ(schema[3].name, "label");
  EXPECT_EQ(schema[3].dtype, kInt64);
  EXPECT_EQ(sources.metadata().at("source"), "parquet");
  EXPECT_EQ(sources.metadata().at("classes"), R"(["cat","dog"])");
  EXPECT_EQ(sources.metadata().at("arrow_nulls"), R"({"image.path":3})");
  const json expected = expected_of("pw_hf_image");
  for (int64_t r = 0; r < 6; ++r) {
    const std::vector<Tensor> record = sources.record(r);
    const json& image = expected["columns"][0]["values"][static_cast<size_t>(r)];
    std::string hex = "hex:";
    for (const unsigned char c : text_of(record[0])) {
      static const char digits[] = "0123456789abcdef";
      hex += digits[c >> 4];
      hex += digits[c & 15];
    }
    EXPECT_EQ(hex, image["bytes"].get<std::string>());
    EXPECT_EQ(text_of(record[1]), image["path"].is_null() ? "" : image["path"].get<std::string>());
    EXPECT_EQ(record[2].item<bool>(), !image["path"].is_null());
    EXPECT_EQ(*static_cast<const int64_t*>(record[3].data_ptr()), expected["columns"][1]["values"][static_cast<size_t>(r)]);
  }
}

TEST(PackParquet, ListsBecomeArrays) {
  const std::string path = data_file("duckdb_nested");
  const std::vector<std::string> fields{"list_int32", "embedding", "nested_struct.b.c"};
  const PackSources sources = PackSources::from_inputs(std::vector<std::string>{path}, fields);
  ASSERT_EQ(sources.records(), 12);
  const Schema& schema = sources.schema();
  ASSERT_EQ(schema.size(), 6u);
  EXPECT_EQ(schema[0].name, "list_int32");
  EXPECT_EQ(schema[0].shape, (DimVector{kVariableDim}));
  // Every row of `embedding` holds 8 floats: a fixed [8] (its null row NaN).
  EXPECT_EQ(schema[2].name, "embedding");
  EXPECT_EQ(schema[2].dtype, kFloat32);
  EXPECT_EQ(schema[2].shape, (DimVector{8}));
  EXPECT_EQ(schema[4].name, "nested_struct.b.c");
  EXPECT_EQ(schema[4].dtype, kFloat64);
  // Row 4: [4, 14, 24, 34, 44]; row 2 null (empty).
  const std::vector<Tensor> row4 = sources.record(4);
  ASSERT_EQ(row4[0].numel(), 5);
  EXPECT_EQ(static_cast<const int32_t*>(row4[0].contiguous().data_ptr())[4], 44);
  EXPECT_EQ(static_cast<const float*>(row4[2].contiguous().data_ptr())[7], 1.875f);
  EXPECT_EQ(sources.record(2)[0].numel(), 0);
  // Each column's mask tells its nulls from the empty list and the NaN.
  for (const size_t mask : {1, 3, 5}) EXPECT_EQ(schema[mask].name, schema[mask - 1].name + ".valid");
  EXPECT_FALSE(sources.record(2)[1].item<bool>());
  EXPECT_TRUE(sources.record(4)[1].item<bool>());
  EXPECT_FALSE(sources.record(7)[3].item<bool>());
  EXPECT_FALSE(sources.record(1)[5].item<bool>());
  EXPECT_TRUE(sources.record(2)[5].item<bool>());
  EXPECT_TRUE(std::isnan(static_cast<const float*>(sources.record(7)[2].contiguous().data_ptr())[0]));
  // A null struct, or a null value under it: NaN.
  EXPECT_TRUE(std::isnan(*static_cast<const double*>(sources.record(1)[4].data_ptr())));
  EXPECT_EQ(*static_cast<const double*>(sources.record(2)[4].data_ptr()), 2.25);
  // A row whose inner lists differ in length (row 1 of a list of lists: [[1], []]) or a null
  // inside a list is refused, naming it.
  const auto error_packing = [&](const char* field) {
    return error_of([&] { (void)PackSources::from_inputs(std::vector<std::string>{path}, std::vector<std::string>{field}); });
  };
  const std::string jagged = error_packing("list_list_int16");
  EXPECT_NE(jagged.find("row group 0: column 'list_list_int16', row 1: a jagged list"), std::string::npos) << jagged;
  const std::string null_inside = error_packing("list_string");
  EXPECT_NE(null_inside.find("column 'list_string', row 1: a null inside its lists"), std::string::npos) << null_inside;
}

// A chat dataset's messages, list<struct<role, content>>, and a detection dataset's objects,
// list<struct<bbox: float[4], category>>, from DuckDB and from arrow-rs: each of the struct's
// columns a field of the row's list of its values; a struct by its name chooses them all.
TEST(PackParquet, ListsOfStructsBecomeAFieldForEachOfTheirColumns) {
  for (const std::string name : {"duckdb_chat", "pw_chat"}) {
    SCOPED_TRACE(name);
    const json expected = expected_of(name);
    const PackSources sources = PackSources::from_inputs(std::vector<std::string>{data_file(name)});
    ASSERT_EQ(sources.records(), 9);
    const Schema& schema = sources.schema();
    std::vector<std::string> names;
    for (const Field& f : schema.fields()) names.push_back(f.name);
    EXPECT_EQ(names, (std::vector<std::string>{"id", "messages.role", "messages.role.lengths", "messages.role.valid",
                                               "messages.content", "messages.content.lengths", "messages.content.valid",
                                               "objects.bbox", "objects.category"}));
    EXPECT_EQ(schema[7].dtype, kFloat32);
    EXPECT_EQ(schema[7].shape, (DimVector{kVariableDim, 4}));  // every box has 4 values
    EXPECT_EQ(schema[8].dtype, kInt64);
    EXPECT_EQ(schema[8].shape, (DimVector{kVariableDim}));
    // The null conversation (row 7) is stored empty, counted, and masked.
    const json nulls = json::parse(sources.metadata().at("arrow_nulls"));
    EXPECT_EQ(nulls["messages.role"], 1);
    const json& messages = expected["columns"][1]["values"];
    const json& objects = expected["columns"][2]["values"];
    for (int64_t r = 0; r < 9; ++r) {
      SCOPED_TRACE(r);
      const std::vector<Tensor> record = sources.record(r);
      const json& conversation = messages[static_cast<size_t>(r)];
      const size_t turns = conversation.is_null() ? 0 : conversation.size();
      EXPECT_EQ(record[3].item<bool>(), !conversation.is_null());
      EXPECT_EQ(record[6].item<bool>(), !conversation.is_null());
      ASSERT_EQ(record[2].numel(), static_cast<int64_t>(turns));
      ASSERT_EQ(record[5].numel(), static_cast<int64_t>(turns));
      std::string roles, contents;
      for (size_t k = 0; k < turns; ++k) {
        roles += conversation[k]["role"].get<std::string>();
        contents += conversation[k]["content"].get<std::string>();
        EXPECT_EQ(record[2].contiguous().data_ptr<int64_t>()[k], static_cast<int64_t>(conversation[k]["role"].get<std::string>().size()));
        EXPECT_EQ(record[5].contiguous().data_ptr<int64_t>()[k], static_cast<int64_t>(conversation[k]["content"].get<std::string>().size()));
      }
      EXPECT_EQ(text_of(record[1]), roles);
      EXPECT_EQ(text_of(record[4]), contents);
      const json& boxes = objects[static_cast<size_t>(r)];
      ASSERT_EQ(record[7].sizes()[0], static_cast<int64_t>(boxes.size()));
      ASSERT_EQ(record[8].numel(), static_cast<int64_t>(boxes.size()));
      const Tensor bbox = record[7].contiguous();
      for (size_t k = 0; k < boxes.size(); ++k) {
        for (size_t j = 0; j < 4; ++j)
          EXPECT_EQ(bbox.data_ptr<float>()[4 * k + j], boxes[k]["bbox"][j].get<float>());
        EXPECT_EQ(record[8].contiguous().data_ptr<int64_t>()[k], boxes[k]["category"].get<int64_t>());
      }
    }
    // `--field messages`: the struct's columns, its strings' lengths with them.
    const PackSources chosen = PackSources::from_inputs(std::vector<std::string>{data_file(name)},
                                                        std::vector<std::string>{"messages", "id"});
    ASSERT_EQ(chosen.schema().size(), 7u);
    EXPECT_EQ(chosen.schema()[0].name, "messages.role");
    EXPECT_EQ(chosen.schema()[4].name, "messages.content.lengths");
    EXPECT_EQ(chosen.schema()[6].name, "id");
  }
  // DuckDB's list<struct<x, y>> of duckdb_nested holds nulls inside its lists: refused, naming
  // the row, as a list of numbers with a null inside is.
  const std::string null_inside = error_of([&] {
    (void)PackSources::from_inputs(std::vector<std::string>{data_file("duckdb_nested")}, std::vector<std::string>{"list_struct"});
  });
  EXPECT_NE(null_inside.find("column 'list_struct.x', row 2: a null inside its lists"), std::string::npos) << null_inside;
}

// A map is a list of struct<key, value>: NAME.key and NAME.value, each a list a row.
TEST(PackParquet, MapsBecomeTheirKeysAndValues) {
  const std::string nested = data_file("duckdb_nested");
  const PackSources keys = PackSources::from_inputs(std::vector<std::string>{nested}, std::vector<std::string>{"map_str_int32.key"});
  ASSERT_EQ(keys.schema().size(), 3u);
  EXPECT_EQ(keys.schema()[1].name, "map_str_int32.key.lengths");
  EXPECT_EQ(text_of(keys.record(4)[0]), "k0k1");
  EXPECT_EQ(keys.record(1)[1].numel(), 0);  // a null map: empty, and masked
  EXPECT_EQ(keys.schema()[2].name, "map_str_int32.key.valid");
  EXPECT_FALSE(keys.record(1)[2].item<bool>());
  EXPECT_TRUE(keys.record(4)[2].item<bool>());
  EXPECT_NE(keys.metadata().at("arrow_types").find(R"("map_str_int32.key":"large_string in map<large_string, int32>")"),
            std::string::npos)
      << keys.metadata().at("arrow_types");
  // Row 5 maps k2 to null: no tensor holds a null inside a list.
  const std::string null_value = error_of([&] {
    (void)PackSources::from_inputs(std::vector<std::string>{nested}, std::vector<std::string>{"map_str_int32"});
  });
  EXPECT_NE(null_value.find("column 'map_str_int32.value', row 5: a null inside its lists"), std::string::npos) << null_value;
}

// A map from an Arrow file (32-bit offsets) and one from a Parquet file (64-bit, as the reader
// makes them) are not packed together: their columns differ.
TEST(PackParquet, MapsOfArrowAndParquetFilesAreNotMixed) {
  namespace arrow = testutil::arrow;
  TempFolder dir;
  const std::string parquet = (kData / "edge" / "legacy_map.parquet").string();
  const ArrowIpc ipc = detail::read_parquet_as_arrow(parquet, {});
  ASSERT_EQ(ipc.fields.size(), 1u);
  EXPECT_EQ(ipc.fields[0].type, ArrowTypeId::Map);
  EXPECT_EQ(ipc.fields[0].bit_width, 64);
  // The same map in an Arrow file: m: map<large_string, int32>, its entries named as the
  // Parquet file's key_value group ("map").
  arrow::Column m = arrow::map("m", arrow::texts("", {"a", "b", "c"}, {}, true, /*large=*/true),
                               arrow::numbers("", std::vector<int32_t>{1, 2, 3}), {0, 2, 2, 2, 3}, {true, false, true, true});
  m.children[0].name = "map";
  const std::string arrow_file = dir / "m.arrow";
  std::ofstream(arrow_file, std::ios::binary)
      .write(reinterpret_cast<const char*>(arrow::write({{m}}).bytes.data()), static_cast<std::streamsize>(arrow::write({{m}}).bytes.size()));
  const PackSources alone = PackSources::from_inputs(std::vector<std::string>{arrow_file});
  EXPECT_EQ(text_of(alone.record(0)[0]), "ab");
  (void)PackSources::from_inputs(std::vector<std::string>{parquet, parquet});
  for (const auto& order : {std::vector<std::string>{parquet, arrow_file}, std::vector<std::string>{arrow_file, parquet}}) {
    const std::string error = error_of([&] { (void)PackSources::from_arrow(order); });
    EXPECT_NE(error.find("its columns differ from those of"), std::string::npos) << error;
  }
  // Columns of the same type otherwise do pack together: f: float, from either kind of file.
  const std::string floats = (kData / "edge" / "one_float_column.parquet").string();
  const std::string float_arrow = dir / "f.arrow";
  const std::vector<uint8_t> bytes = arrow::write({{arrow::numbers("f", std::vector<float>{1.5f})}}).bytes;
  std::ofstream(float_arrow, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  const PackSources mixed = PackSources::from_arrow(std::vector<std::string>{float_arrow, floats});
  ASSERT_EQ(mixed.records(), 3);
  EXPECT_EQ(mixed.record(2)[0].item<float>(), 4.5f);
}

// Decimals, as DuckDB, arrow-rs and Spark store them (INT32, INT64, FIXED_LEN_BYTE_ARRAY of
// 16 bytes or of the fewest for the precision, 4 and 8 in Spark's legacy form, BYTE_ARRAY of
// the fewest for each value): float64,
// the double nearest the decimal up to 15 digits; one of a precision no decimal has is refused
// by name, and left out by choosing its siblings.
TEST(PackParquet, DecimalsBecomeFloat64) {
  const std::string types = data_file("duckdb_types");
  for (const std::string name : {"duckdb_types", "pw_types"}) {
    SCOPED_TRACE(name);
    const PackSources d = PackSources::from_inputs(std::vector<std::string>{data_file(name)},
                                                   std::vector<std::string>{"dec_9_2", "dec_18_4", "dec_38_10"});
    const json expected = expected_of(name);
    const Schema& schema = d.schema();
    for (const std::string decimal : {"dec_9_2", "dec_18_4", "dec_38_10"}) {
      const size_t f = schema.index_of(decimal);
      EXPECT_EQ(schema[f].dtype, kFloat64);
      const auto column = std::find_if(expected["columns"].begin(), expected["columns"].end(),
                                       [&](const json& c) { return c["name"] == decimal; });
      ASSERT_NE(column, expected["columns"].end());
      const std::optional<size_t> mask = schema.find(decimal + ".valid");
      for (int64_t r = 0; r < d.records(); ++r) {
        const std::vector<Tensor> record = d.record(r);
        const double got = record[f].item<double>();
        const json& want = (*column)["values"][static_cast<size_t>(r)];
        if (mask) EXPECT_EQ(record[*mask].item<bool>(), !want.is_null()) << r;
        if (want.is_null()) {
          EXPECT_TRUE(mask.has_value());
          EXPECT_TRUE(std::isnan(got)) << r;
          continue;
        }
        const double nearest = std::stod(want.get<std::string>());
        if (decimal == "dec_9_2") EXPECT_EQ(got, nearest) << decimal << " row " << r;  // 9 digits: the nearest
        else EXPECT_NEAR(got, nearest, std::abs(nearest) * 1e-15) << decimal << " row " << r;
      }
    }
    EXPECT_NE(d.metadata().at("arrow_types").find(R"x("dec_9_2":"decimal128(9, 2)")x"), std::string::npos);
  }
  // Spark's forms, and a decimal256.
  const PackSources spark = PackSources::from_inputs(std::vector<std::string>{(kData / "edge" / "decimals_spark.parquet").string()});
  const auto at = [&](int64_t r, const char* field) { return field_value(spark, r, field).item<double>(); };
  EXPECT_EQ(at(0, "price"), std::stod("12345678901234567.89"));
  EXPECT_EQ(at(1, "price"), -0.01);
  EXPECT_TRUE(std::isnan(at(2, "price")));
  EXPECT_EQ(at(3, "price"), 0.0);
  EXPECT_EQ(at(0, "amount"), 1.5);
  EXPECT_EQ(at(1, "amount"), std::stod("-123456789.12345"));
  EXPECT_TRUE(std::isnan(at(2, "amount")));
  EXPECT_FALSE(field_value(spark, 2, "amount.valid").item<bool>());
  EXPECT_TRUE(field_value(spark, 3, "amount.valid").item<bool>());
  EXPECT_NEAR(at(0, "wide"), 1e41, 1e41 * 1e-15);
  EXPECT_EQ(at(1, "wide"), -0.007);
  EXPECT_EQ(at(3, "wide"), 0.001);
  // Spark's legacy form: big-endian FIXED_LEN_BYTE_ARRAYs of 4 and 8 bytes.
  const std::vector<std::string> small = {"-123.45", "0.01", "0", "999.99"};
  const std::vector<std::string> mid = {"-123456789.012", "0.007", "0", "0.001"};
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(at(r, "small"), std::stod(small[static_cast<size_t>(r)])) << r;
    EXPECT_EQ(at(r, "mid"), std::stod(mid[static_cast<size_t>(r)])) << r;
  }
  EXPECT_EQ(spark.metadata().at("arrow_types"),
            R"x({"amount":"decimal128(25, 5)","amount.valid":"decimal128(25, 5) (valid)","mid":"decimal128(15, 3)",)x"
            R"x("price":"decimal128(20, 2)","price.valid":"decimal128(20, 2) (valid)","small":"decimal128(5, 2)",)x"
            R"x("wide":"decimal256(45, 3)"})x");
  // A value of more bytes than its precision's, past its sign's (2^127 in 17 bytes): refused,
  // naming its row.
  const std::string too_long = error_of([&] {
    (void)PackSources::from_inputs(std::vector<std::string>{(kData / "edge" / "decimal_too_long.parquet").string()});
  });
  EXPECT_NE(too_long.find("row group 0, column 'd': row 3: a decimal of more bytes than the 16 of its precision's"),
            std::string::npos)
      << too_long;
  // Inside a list of structs (repeated group pts { x; d: DECIMAL(0, 0) }, no precision): named,
  // and left out by choosing its sibling, whose column alone is decoded.
  const std::string points = (kData / "edge" / "repeated_group_with_decimal.parquet").string();
  const std::string inner = error_of([&] { (void)PackSources::from_inputs(std::vector<std::string>{points}); });
  EXPECT_NE(inner.find("'pts.d' (decimal(0, 0))"), std::string::npos) << inner;
  EXPECT_NE(inner.find("--field"), std::string::npos) << inner;
  const PackSources x = PackSources::from_inputs(std::vector<std::string>{points}, std::vector<std::string>{"pts.x"});
  ASSERT_EQ(x.schema().size(), 1u);
  EXPECT_EQ(x.schema()[0].name, "pts.x");
  // A name below a struct that none of its columns is: named, before anything is decoded.
  const std::string missing_inner = error_of([&] {
    (void)PackSources::from_inputs(std::vector<std::string>{points}, std::vector<std::string>{"pts.nope"});
  });
  EXPECT_NE(missing_inner.find("no column 'pts.nope' (the columns of 'pts': pts.x, pts.d)"), std::string::npos)
      << missing_inner;
  // Inside a map's values (m: map<int32, struct<a, d: DECIMAL(0, 0)>>): its key and value are
  // kept, the value's columns chosen one by one.
  const std::string map = (kData / "edge" / "map_of_structs_with_decimal.parquet").string();
  const PackSources a = PackSources::from_inputs(std::vector<std::string>{map}, std::vector<std::string>{"m.value.a"});
  ASSERT_EQ(a.schema().size(), 1u);
  EXPECT_EQ(a.schema()[0].name, "m.value.a");
  EXPECT_NE(error_of([&] { (void)PackSources::from_inputs(std::vector<std::string>{map}); }).find("'m.value.d' (decimal("),
            std::string::npos);
  const std::string missing = error_of([&] { (void)PackSources::from_inputs(std::vector<std::string>{types}, std::vector<std::string>{"nope"}); });
  EXPECT_NE(missing.find("no column 'nope' (its columns: i8, i16"), std::string::npos) << missing;
  // A null in an integer column is zero, and i8.valid false; in a float column it is NaN, and
  // f16.valid false.
  const PackSources i8 = PackSources::from_inputs(std::vector<std::string>{types}, std::vector<std::string>{"i8"});
  ASSERT_EQ(i8.schema().size(), 2u);
  EXPECT_EQ(i8.schema()[1].name, "i8.valid");
  EXPECT_EQ(i8.record(5)[0].item<int8_t>(), 0);
  EXPECT_FALSE(i8.record(5)[1].item<bool>());
  EXPECT_TRUE(i8.record(4)[1].item<bool>());
  const PackSources halves = PackSources::from_inputs(std::vector<std::string>{data_file("pw_types")}, std::vector<std::string>{"f16"});
  ASSERT_EQ(halves.schema().size(), 2u);
  EXPECT_EQ(halves.schema()[0].dtype, kFloat16);
  EXPECT_TRUE(std::isnan(halves.record(5)[0].item<double>()));
  EXPECT_FALSE(halves.record(5)[1].item<bool>());
  EXPECT_TRUE(halves.record(6)[1].item<bool>());
}

TEST(PackParquet, AFolderOfParquetFilesPacksInNameOrder) {
  TempFolder dir;
  const fs::path folder = dir / "data";
  fs::create_directory(folder);
  fs::copy_file(data_file("duckdb_codec_zstd"), folder / "train-00001-of-00002.parquet");
  fs::copy_file(data_file("duckdb_codec_brotli"), folder / "train-00000-of-00002.parquet");
  const std::vector<std::string> inputs{folder.string()};
  EXPECT_TRUE(are_arrow_inputs(inputs));
  const PackSources sources = PackSources::from_inputs(inputs, std::vector<std::string>{"c_double", "c_string"});
  ASSERT_EQ(sources.records(), 100);
  EXPECT_EQ(sources.input_paths().front(), (folder / "train-00000-of-00002.parquet").string());
  const json expected = expected_of("duckdb_codec_brotli");
  for (const json& column : expected["columns"]) {
    if (column["name"] != "c_string") continue;
    for (int64_t r : {0, 50, 99}) {
      const json& want = column["values"][static_cast<size_t>(r % 50)];
      EXPECT_EQ(text_of(field_value(sources, r, "c_string")), want.is_null() ? "" : want.get<std::string>()) << r;
    }
  }
}

// Every cut and a flip of every bit of the footer, and of bytes throughout: an error that
// names the file (or, for a flip in a value, other values), never a crash, hang or overread
// (the sanitizer builds run this too).
TEST(ParquetReader, DamagedFilesGiveErrorsNotCrashes) {
  TempFolder dir;
  for (const std::string name : {"duckdb_codec_snappy", "pw_nested_v2_plain", "hw_encodings", "pw_enc_delta_byte_array_v2"}) {
    SCOPED_TRACE(name);
    const testutil::Bytes original = testutil::read_file(data_file(name));
    const std::string damaged = dir / (name + ".parquet");
    const auto try_read = [&](const testutil::Bytes& bytes) {
      testutil::write_file(damaged, bytes);
      try {
        (void)detail::read_parquet_as_arrow(damaged, {});
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(damaged), std::string::npos) << e.what();
      }
    };
    // Every cut and every bit of the footer of the smallest file; of the others, every 7th cut
    // and a bit of every 13th byte (each try writes the file again).
    const bool everything = name == "duckdb_codec_snappy";
    const size_t step = everything ? 1 : 7;
    for (size_t cut = 0; cut < original.size(); cut += step) {
      testutil::Bytes bytes(original.begin(), original.begin() + static_cast<std::ptrdiff_t>(cut));
      try_read(bytes);
    }
    uint32_t footer = 0;
    std::memcpy(&footer, original.data() + original.size() - 8, 4);
    const size_t footer_start = original.size() - 8 - footer;
    for (size_t i = 0; i < original.size(); ++i) {
      const bool in_footer = i >= footer_start && (everything || i % 5 == 0);
      if (!in_footer && i % 13 != 0) continue;
      for (int bit = 0; bit < 8; ++bit) {
        if (!in_footer && bit != static_cast<int>(i % 8)) continue;
        testutil::Bytes bytes = original;
        bytes[i] ^= std::byte{static_cast<uint8_t>(1u << bit)};
        try_read(bytes);
      }
    }
  }
}

}  // namespace
}  // namespace mmt
