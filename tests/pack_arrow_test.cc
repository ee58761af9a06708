// Apache Arrow IPC files and streams as pack sources (PackSources::from_arrow): what Hugging
// Face datasets, Feather and pyarrow write. One record per row, a field per column; lists of
// numbers as N-d arrays; nulls as NaN or empty values; compressed batches; save_to_disk
// folders; every damaged file refused with the file, the message's byte and what is wrong.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "arrow_test_util.h"
#include "decode_limit.h"
#include "importer_test_util.h"
#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "mmtensor/error.h"
#include "mmtensor/packer.h"
#include "test_util.h"

namespace mmt {
namespace {

namespace arrow = testutil::arrow;
using testing::error_of;
using testutil::TempFolder;
using testutil::field_value;
using testutil::text_of;

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

std::vector<int64_t> shape_of(const Tensor& t) { return std::vector<int64_t>(t.sizes().begin(), t.sizes().end()); }

template <class T>
T scalar_of(const Tensor& t) {
  return *static_cast<const T*>(t.contiguous().data_ptr());
}
template <class T>
std::vector<T> values_of(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const T*>(c.data_ptr());
  return std::vector<T>(p, p + c.numel());
}

// Rows [first, first + n): every scalar type, bytes and text, one batch.
std::vector<arrow::Column> scalar_batch(int first, int n) {
  std::vector<int8_t> i8;
  std::vector<uint16_t> u16;
  std::vector<int32_t> i32;
  std::vector<int64_t> i64;
  std::vector<uint64_t> u64;
  std::vector<float> f32;
  std::vector<double> f64;
  std::vector<bool> flags;
  std::vector<std::string> text, blobs, fixed;
  for (int r = first; r < first + n; ++r) {
    i8.push_back(static_cast<int8_t>(-r));
    u16.push_back(static_cast<uint16_t>(r * 300));
    i32.push_back(r * 100000);
    i64.push_back(int64_t{r} << 40);
    u64.push_back(uint64_t{1} << 63 | static_cast<uint64_t>(r));
    f32.push_back(0.5f * static_cast<float>(r));
    f64.push_back(-0.25 * r);
    flags.push_back(r % 3 == 0);
    text.push_back("row " + std::to_string(r));
    blobs.push_back(std::string(static_cast<size_t>(r % 5), static_cast<char>('a' + r % 26)));
    fixed.push_back(std::string{static_cast<char>(r), static_cast<char>(r + 1), static_cast<char>(r + 2)});
  }
  return {arrow::numbers("i8", i8),       arrow::numbers("u16", u16),
          arrow::numbers("i32", i32),     arrow::numbers("i64", i64),
          arrow::numbers("u64", u64),     arrow::numbers("f32", f32),
          arrow::numbers("f64", f64),     arrow::bools("flag", flags),
          arrow::texts("text", text),     arrow::texts("blob", blobs, {}, /*utf8=*/false, /*large=*/true),
          arrow::fixed_binary("id", 3, fixed)};
}

void expect_scalar_rows(const PackSources& sources, int rows) {
  ASSERT_EQ(sources.records(), rows);
  const Schema& schema = sources.schema();
  ASSERT_EQ(schema.size(), 11u);
  EXPECT_EQ(schema[0].dtype, kInt8);
  EXPECT_EQ(schema[1].dtype, kUInt16);
  EXPECT_EQ(schema[4].dtype, kUInt64);
  EXPECT_EQ(schema[5].dtype, kFloat32);
  EXPECT_EQ(schema[7].dtype, kBool);
  EXPECT_TRUE(schema[0].shape.empty());
  EXPECT_EQ(schema[8].shape, (DimVector{kVariableDim}));
  EXPECT_EQ(schema[10].shape, (DimVector{3}));
  for (int r = 0; r < rows; ++r) {
    const std::vector<Tensor> v = sources.record(r);
    EXPECT_EQ(scalar_of<int8_t>(v[0]), static_cast<int8_t>(-r));
    EXPECT_EQ(scalar_of<uint16_t>(v[1]), static_cast<uint16_t>(r * 300));
    EXPECT_EQ(scalar_of<int32_t>(v[2]), r * 100000);
    EXPECT_EQ(scalar_of<int64_t>(v[3]), int64_t{r} << 40);
    EXPECT_EQ(scalar_of<uint64_t>(v[4]), uint64_t{1} << 63 | static_cast<uint64_t>(r));
    EXPECT_EQ(scalar_of<float>(v[5]), 0.5f * static_cast<float>(r));
    EXPECT_EQ(scalar_of<double>(v[6]), -0.25 * r);
    EXPECT_EQ(scalar_of<bool>(v[7]), r % 3 == 0);
    EXPECT_EQ(text_of(v[8]), "row " + std::to_string(r));
    EXPECT_EQ(text_of(v[9]), std::string(static_cast<size_t>(r % 5), static_cast<char>('a' + r % 26)));
    EXPECT_EQ(values_of<uint8_t>(v[10]), (std::vector<uint8_t>{static_cast<uint8_t>(r), static_cast<uint8_t>(r + 1),
                                                               static_cast<uint8_t>(r + 2)}));
  }
}

TEST(PackArrow, RowsBecomeRecordsAndColumnsFields) {
  TempFolder dir;
  const arrow::Written stream = arrow::write({scalar_batch(0, 5), scalar_batch(5, 4), scalar_batch(9, 0)});
  write_bytes(dir / "data.arrow", stream.bytes);
  EXPECT_TRUE(are_arrow_inputs(std::vector<std::string>{dir / "data.arrow"}));
  const PackSources sources = PackSources::from_inputs(std::vector<std::string>{dir / "data.arrow"});
  expect_scalar_rows(sources, 9);
  EXPECT_EQ(sources.metadata().at("source"), "arrow");
  EXPECT_NE(sources.metadata().at("arrow_types").find("\"blob\":\"large_binary\""), std::string::npos);
  EXPECT_NE(sources.metadata().at("arrow_types").find("\"id\":\"fixed_size_binary[3]\""), std::string::npos);
  EXPECT_FALSE(sources.metadata().contains("arrow_nulls"));
  // Values view the mapped file.
  EXPECT_EQ(sources.record(7)[2].untyped_storage().filename(), dir / "data.arrow");
  EXPECT_NE(sources.record_origin(2, 7).find("row 2 of " + (dir / "data.arrow") + ", the record batch at byte"),
            std::string::npos);

  // Packed and read back.
  pack_dataset(dir / "out.mmt", sources, {});
  const Dataset ds = Dataset::open(dir / "out.mmt");
  ASSERT_EQ(ds.size(), 9);
  EXPECT_EQ(text_of(ds.get(6)["text"]), "row 6");
  EXPECT_EQ(scalar_of<int64_t>(ds.get(8)["i64"]), int64_t{8} << 40);
  EXPECT_EQ(compare_with_sources(ds, sources), 9);
}

TEST(PackArrow, FileFormatAndEveryFraming) {
  TempFolder dir;
  const std::vector<std::vector<arrow::Column>> batches = {scalar_batch(0, 3), scalar_batch(3, 3)};
  arrow::WriteOptions file;
  file.file_format = true;
  write_bytes(dir / "file.feather", arrow::write(batches, file).bytes);
  arrow::WriteOptions legacy;  // streams of Arrow before 0.15
  legacy.legacy_framing = true;
  write_bytes(dir / "legacy.arrows", arrow::write(batches, legacy).bytes);
  arrow::WriteOptions unended;  // a stream closed without its end marker, which the format allows
  unended.end_marker = false;
  write_bytes(dir / "unended.arrow", arrow::write(batches, unended).bytes);
  // "ARROW1" names a file of any name, and a stream's first message (a Schema) a stream.
  write_bytes(dir / "file.bin", arrow::write(batches, file).bytes);
  write_bytes(dir / "stream.data", arrow::write(batches).bytes);
  // A file is read by its footer, which holds the schema and where each batch lies: Arrow JS
  // writes no Schema message before the batches.
  arrow::WriteOptions footer_schema = file;
  footer_schema.schema_message = false;
  write_bytes(dir / "js.arrow", arrow::write(batches, footer_schema).bytes);
  // pyarrow's metadata_version=V4 file: V4 messages under the V5 footer Arrow C++ always writes.
  arrow::WriteOptions v4 = file;
  v4.v4_messages = true;
  write_bytes(dir / "v4.arrow", arrow::write(batches, v4).bytes);
  for (const char* name : {"file.feather", "legacy.arrows", "unended.arrow", "file.bin", "stream.data", "js.arrow", "v4.arrow"}) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(are_arrow_inputs(std::vector<std::string>{dir / name}));
    expect_scalar_rows(PackSources::from_inputs(std::vector<std::string>{dir / name}), 6);
  }
  // Four bytes of 0xFF begin other files too: not taken for a stream without its Schema.
  write_bytes(dir / "ff.bin", {0xff, 0xff, 0xff, 0xff, 8, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_FALSE(are_arrow_inputs(std::vector<std::string>{dir / "ff.bin"}));
  // Several files read one after another.
  const PackSources both = PackSources::from_arrow(std::vector<std::string>{dir / "file.feather", dir / "legacy.arrows"});
  EXPECT_EQ(both.records(), 12);
  EXPECT_EQ(text_of(both.record(7)[8]), "row 1");

  // A footer's block that leads outside the messages, or whose body disagrees with its
  // message's, is refused naming the footer or the message.
  const arrow::Written whole = arrow::write(batches, file);
  int32_t footer_length = 0;
  std::memcpy(&footer_length, whole.bytes.data() + whole.bytes.size() - 10, 4);
  const size_t footer_start = whole.bytes.size() - 10 - static_cast<size_t>(footer_length);
  // The second record batch's block: found in the footer by its offset, where the batch's
  // message begins (then its metadata length, 4 bytes of padding, its body length).
  const int64_t second_offset = static_cast<int64_t>(whole.message_ends[1]);
  size_t block = 0;
  for (size_t i = footer_start; i + 8 <= whole.bytes.size() - 10; ++i) {
    int64_t v = 0;
    std::memcpy(&v, whole.bytes.data() + i, 8);
    if (v == second_offset) block = i;
  }
  ASSERT_NE(block, 0u);
  std::vector<uint8_t> outside = whole.bytes;
  const int64_t past = static_cast<int64_t>(footer_start);
  std::memcpy(outside.data() + block, &past, 8);
  write_bytes(dir / "outside.arrow", outside);
  std::string message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "outside.arrow"}); });
  EXPECT_NE(message.find("the Arrow file's footer at byte " + std::to_string(footer_start) + ": its record batch 1 ("),
            std::string::npos)
      << message;
  std::vector<uint8_t> shorter = whole.bytes;
  int64_t body = 0;
  std::memcpy(&body, shorter.data() + block + 16, 8);
  body -= 8;
  std::memcpy(shorter.data() + block + 16, &body, 8);
  write_bytes(dir / "shorter.arrow", shorter);
  message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "shorter.arrow"}); });
  EXPECT_NE(message.find("the Arrow message at byte " + std::to_string(second_offset) + ": a body of "), std::string::npos)
      << message;
  EXPECT_NE(message.find("where the file's footer states"), std::string::npos) << message;
  // A footer that lists one batch twice (a few bytes of footer for any number of rows).
  std::vector<uint8_t> twice = whole.bytes;
  const int64_t first_offset = static_cast<int64_t>(whole.message_ends[0]);
  std::memcpy(twice.data() + block, &first_offset, 8);
  write_bytes(dir / "twice.arrow", twice);
  message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "twice.arrow"}); });
  EXPECT_NE(message.find("its record batch 1 (at byte " + std::to_string(first_offset) + ") overlaps its record batch 0"),
            std::string::npos)
      << message;
}

// Files Apache Arrow JS 21.2.0 wrote (tests/data/arrow, generator/gen.mjs): its file format
// keeps the schema in the footer alone. Both read as the stream of the same table does:
// numbers, strings with a null, a dictionary, a fixed_size_list, a list of structs, a map.
TEST(PackArrow, FilesArrowJsWrites) {
  const std::filesystem::path data = std::filesystem::path(MMT_SOURCE_DIR) / "tests" / "data" / "arrow";
  for (const char* name : {"arrowjs.arrow", "arrowjs.arrows"}) {
    SCOPED_TRACE(name);
    const std::string path = (data / name).string();
    EXPECT_TRUE(are_arrow_inputs(std::vector<std::string>{path}));
    const PackSources sources = PackSources::from_inputs(std::vector<std::string>{path});
    ASSERT_EQ(sources.records(), 4);
    std::vector<std::string> names;
    for (const Field& f : sources.schema().fields()) names.push_back(f.name);
    // Each column with a null has its mask, NAME.valid (a list of strings', after its lengths).
    EXPECT_EQ(names, (std::vector<std::string>{"id", "name", "name.valid", "label", "vec", "messages.role",
                                               "messages.role.lengths", "messages.role.valid", "messages.content",
                                               "messages.content.lengths", "messages.content.valid", "scores.key",
                                               "scores.key.lengths", "scores.key.valid", "scores.value",
                                               "scores.value.valid"}));
    const auto value = [&](int64_t r, const char* field) { return field_value(sources, r, field); };
    EXPECT_EQ(scalar_of<int32_t>(value(3, "id")), 13);
    EXPECT_EQ(text_of(value(3, "name")), "ζήτα");
    EXPECT_EQ(value(2, "name").numel(), 0);  // null: empty, and told apart by its mask
    EXPECT_FALSE(scalar_of<bool>(value(2, "name.valid")));
    EXPECT_TRUE(scalar_of<bool>(value(3, "name.valid")));
    EXPECT_EQ(text_of(value(1, "label")), "cat");
    EXPECT_EQ(values_of<float>(value(3, "vec")), (std::vector<float>{0.5f, 0.25f, 0.125f}));
    EXPECT_EQ(text_of(value(0, "messages.role")), "userassistant");
    EXPECT_EQ(text_of(value(0, "messages.content")), "hihello");
    EXPECT_EQ(values_of<int64_t>(value(0, "messages.content.lengths")), (std::vector<int64_t>{2, 5}));
    EXPECT_EQ(value(2, "messages.role").numel(), 0);  // a null conversation
    for (const char* mask : {"messages.role.valid", "messages.content.valid"}) {
      EXPECT_FALSE(scalar_of<bool>(value(2, mask))) << mask;
      EXPECT_TRUE(scalar_of<bool>(value(1, mask))) << mask;  // [], not null
    }
    EXPECT_EQ(text_of(value(0, "scores.key")), "bleurouge");
    EXPECT_EQ(values_of<float>(value(0, "scores.value")), (std::vector<float>{0.5f, 0.75f}));
    EXPECT_EQ(values_of<float>(value(3, "scores.value")), (std::vector<float>{0.25f}));
  }
}

// What Polars writes (its default, the newest compat level): strings as string_view, inline in
// their views up to 12 bytes and in two data buffers past that, categoricals as dictionaries of
// string_view, lists as large_list; uncompressed and zstd (and a stream, lz4, of large_string).
// Each packs to the values Arrow JS reads back (polars.expected.json).
TEST(PackArrow, FilesPolarsWrites) {
  const std::filesystem::path data = std::filesystem::path(MMT_SOURCE_DIR) / "tests" / "data" / "arrow";
  std::ifstream in(data / "polars.expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in).at("rows");
  ASSERT_EQ(expected.size(), 45u);
  // A row's strings, joined, and their lengths.
  const auto joined = [](const nlohmann::json& strings, const char* key) {
    std::string bytes;
    std::vector<int64_t> lengths;
    for (const nlohmann::json& s : strings) {
      const std::string one = key == nullptr ? s.get<std::string>() : s.at(key).get<std::string>();
      bytes += one;
      lengths.push_back(static_cast<int64_t>(one.size()));
    }
    return std::pair{bytes, lengths};
  };
  TempFolder dir;
  for (const char* name : {"polars.arrow", "polars_zstd.arrow", "polars_lz4.arrows"}) {
    SCOPED_TRACE(name);
    const std::string path = (data / name).string();
    EXPECT_TRUE(are_arrow_inputs(std::vector<std::string>{path}));
    const PackSources sources = PackSources::from_inputs(std::vector<std::string>{path});
    std::vector<std::string> names;
    for (const Field& f : sources.schema().fields()) names.push_back(f.name);
    EXPECT_EQ(names, (std::vector<std::string>{"id", "text", "text.valid", "label", "score", "score.valid", "n",
                                               "n.valid", "flag", "flag.valid", "words", "words.lengths", "emb", "tokens", "meta.src", "meta.w",
                                               "messages.role", "messages.role.lengths", "messages.content",
                                               "messages.content.lengths"}));
    // nodejs-polars' writeIPCStream writes large_string (Polars' oldest compat level).
    const std::string string_type = std::string(name).ends_with(".arrows") ? "large_string" : "string_view";
    const std::string types = sources.metadata().at("arrow_types");
    EXPECT_NE(types.find(R"("text":")" + string_type + '"'), std::string::npos) << types;
    EXPECT_NE(types.find(R"("label":"dictionary<values=)" + string_type + R"(, indices=uint32>")"), std::string::npos)
        << types;
    EXPECT_NE(types.find(R"("words":"large_list<)" + string_type + '>'), std::string::npos) << types;
    pack_dataset(dir / (std::string(name) + ".mmt"), sources, {});
    const Dataset ds = Dataset::open(dir / (std::string(name) + ".mmt"));
    ASSERT_EQ(ds.size(), 45);
    for (int64_t r = 0; r < ds.size(); ++r) {
      SCOPED_TRACE(r);
      const nlohmann::json& row = expected[static_cast<size_t>(r)];
      const Sample sample = ds.get(r);
      EXPECT_EQ(scalar_of<int64_t>(sample["id"]), row.at("id").get<int64_t>());
      EXPECT_EQ(text_of(sample["text"]), row.at("text").is_null() ? "" : row.at("text").get<std::string>());
      EXPECT_EQ(scalar_of<bool>(sample["text.valid"]), !row.at("text").is_null());
      EXPECT_EQ(text_of(sample["label"]), row.at("label").get<std::string>());
      if (row.at("score").is_null()) EXPECT_TRUE(std::isnan(scalar_of<float>(sample["score"])));
      else EXPECT_EQ(scalar_of<float>(sample["score"]), row.at("score").get<float>());
      EXPECT_EQ(scalar_of<bool>(sample["score.valid"]), !row.at("score").is_null());
      // Nullable int32 and bool: zero and a false mask where null.
      EXPECT_EQ(scalar_of<int32_t>(sample["n"]), row.at("n").is_null() ? 0 : row.at("n").get<int32_t>());
      EXPECT_EQ(scalar_of<bool>(sample["n.valid"]), !row.at("n").is_null());
      EXPECT_EQ(scalar_of<bool>(sample["flag"]), row.at("flag").is_null() ? false : row.at("flag").get<bool>());
      EXPECT_EQ(scalar_of<bool>(sample["flag.valid"]), !row.at("flag").is_null());
      const auto [words, word_lengths] = joined(row.at("words"), nullptr);
      EXPECT_EQ(text_of(sample["words"]), words);
      EXPECT_EQ(values_of<int64_t>(sample["words.lengths"]), word_lengths);
      EXPECT_EQ(values_of<float>(sample["emb"]), row.at("emb").get<std::vector<float>>());
      EXPECT_EQ(values_of<int32_t>(sample["tokens"]), row.at("tokens").get<std::vector<int32_t>>());
      EXPECT_EQ(text_of(sample["meta.src"]), row.at("meta").at("src").get<std::string>());
      EXPECT_EQ(scalar_of<double>(sample["meta.w"]), row.at("meta").at("w").get<double>());
      for (const char* key : {"role", "content"}) {
        const auto [bytes, lengths] = joined(row.at("messages"), key);
        EXPECT_EQ(text_of(sample[std::string("messages.") + key]), bytes);
        EXPECT_EQ(values_of<int64_t>(sample[std::string("messages.") + key + ".lengths"]), lengths);
      }
    }
    // A string of the uncompressed file is a view of it: no copy.
    if (std::string(name) == "polars.arrow") {
      EXPECT_EQ(sources.record(0)[1].untyped_storage().filename(), path);
    }
  }
}

// binary_view and string_view columns (Polars' strings): plain, in lists, structs and
// dictionaries, over several data buffers, compressed or not; a single string stays a view of
// the file, a list's are gathered.
TEST(PackArrow, StringViewsInEveryPlaceAStringGoes) {
  TempFolder dir;
  const std::string long_a(40, 'a'), long_b = "a string past the twelve inline bytes", long_c(70, 'c');
  const arrow::Column view_values = arrow::string_views("", {});
  arrow::WriteOptions options;
  options.dictionaries = {{0, arrow::string_views("", {"cat", long_b}), false, 0}};
  const std::vector<std::vector<arrow::Column>> batches = {
      {arrow::string_views("text", {"short", long_a, "", long_b, long_c}, {true, true, true, true, true}),
       arrow::string_views("blob", {std::string("\0\1", 2), "", long_c, "x", long_a}, {true, false, true, true, true},
                           /*utf8=*/false),
       arrow::list("words", arrow::string_views("", {"w", long_a, long_b, "zz", long_c, "", ""}), {0, 2, 2, 3, 5, 7}, {},
                   true),
       arrow::structure("meta", {arrow::string_views("src", {"web", long_b, "a", "b", "c"})}, 5),
       arrow::encoded<int32_t>("label", view_values, 0, {1, 0, 0, 1, 0})},
      {arrow::string_views("text", {long_c}), arrow::string_views("blob", {"b"}, {}, false),
       arrow::list("words", arrow::string_views("", {long_c, "q"}), {0, 2}, {}, true),
       arrow::structure("meta", {arrow::string_views("src", {long_a})}, 1), arrow::encoded<int32_t>("label", view_values, 0, {0})},
  };
  ASSERT_GE(batches[0][0].data_buffers, 2);  // the long strings span data buffers
  for (int codec : {-1, 0, 1}) {
    SCOPED_TRACE(codec);
    options.codec = codec;
    write_bytes(dir / "views.arrow", arrow::write(batches, options).bytes);
    const PackSources sources = PackSources::from_arrow(std::vector<std::string>{dir / "views.arrow"});
    ASSERT_EQ(sources.records(), 6);
    std::vector<std::string> names;
    for (const Field& f : sources.schema().fields()) names.push_back(f.name);
    EXPECT_EQ(names,
              (std::vector<std::string>{"text", "blob", "blob.valid", "words", "words.lengths", "meta.src", "label"}));
    const std::vector<std::string> texts = {"short", long_a, "", long_b, long_c, long_c};
    const std::vector<std::string> blobs = {std::string("\0\1", 2), "", long_c, "x", long_a, "b"};
    const std::vector<std::string> words = {"w" + long_a, "", long_b, "zz" + long_c, "", long_c + "q"};
    const std::vector<std::vector<int64_t>> lengths = {{1, 40}, {}, {37}, {2, 70}, {0, 0}, {70, 1}};
    const std::vector<std::string> sources_of = {"web", long_b, "a", "b", "c", long_a};
    const std::vector<std::string> labels = {long_b, "cat", "cat", long_b, "cat", "cat"};
    for (int r = 0; r < 6; ++r) {
      SCOPED_TRACE(r);
      const std::vector<Tensor> v = sources.record(r);
      EXPECT_EQ(text_of(v[0]), texts[static_cast<size_t>(r)]);
      EXPECT_EQ(text_of(v[1]), blobs[static_cast<size_t>(r)]);
      EXPECT_EQ(v[2].item<bool>(), r != 1);  // blob's null, apart from its empty strings
      EXPECT_EQ(text_of(v[3]), words[static_cast<size_t>(r)]);
      EXPECT_EQ(values_of<int64_t>(v[4]), lengths[static_cast<size_t>(r)]);
      EXPECT_EQ(text_of(v[5]), sources_of[static_cast<size_t>(r)]);
      EXPECT_EQ(text_of(v[6]), labels[static_cast<size_t>(r)]);
    }
    EXPECT_EQ(sources.metadata().at("arrow_nulls"), R"({"blob":1})");
    const std::string types = sources.metadata().at("arrow_types");
    EXPECT_NE(types.find(R"("blob":"binary_view")"), std::string::npos) << types;
    EXPECT_NE(types.find(R"("words":"large_list<string_view>")"), std::string::npos) << types;
    if (codec < 0) {  // inline or in a data buffer, one string is a view of the file
      EXPECT_EQ(sources.record(0)[0].untyped_storage().filename(), dir / "views.arrow");
      EXPECT_EQ(sources.record(1)[0].untyped_storage().filename(), dir / "views.arrow");
    }
    pack_dataset(dir / ("views" + std::to_string(codec) + ".mmt"), sources, {});
    EXPECT_EQ(compare_with_sources(Dataset::open(dir / ("views" + std::to_string(codec) + ".mmt")), sources), 6);
  }
}

// A view that says a negative length, a data buffer the batch lacks, or bytes past its data
// buffer is refused, naming the column and the value; so is a views buffer too short, and a
// list repeating views of one string into more than a gigabyte (a bomb of a few megabytes).
TEST(PackArrow, DamagedStringViewsAreRefused) {
  TempFolder dir;
  const std::string long_a(40, 'a');
  const auto refused = [&](const arrow::Column& column, const std::string& expected) {
    write_bytes(dir / "bad.arrow", arrow::write({{column}}).bytes);
    const std::string message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "bad.arrow"}); });
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  };
  const auto put_i32 = [](arrow::Column& c, size_t at, int32_t v) { std::memcpy(c.buffers[1].data() + at, &v, 4); };
  arrow::Column column = arrow::string_views("text", {"ok", long_a});
  put_i32(column, 0, -3);
  refused(column, "column 'text' has a view of length -3 for value 0");
  column = arrow::string_views("text", {"ok", long_a});
  put_i32(column, 16 + 8, 1);
  refused(column, "column 'text' has value 1 in data buffer 1, where the batch has 1 for it");
  column = arrow::string_views("text", {"ok", long_a});
  put_i32(column, 16 + 12, 10);
  refused(column, "column 'text' has value 1 (40 bytes at byte 10 of data buffer 0) past that buffer's 40 bytes");
  column = arrow::string_views("text", {"ok", long_a});
  column.buffers[1].resize(20);
  refused(column, "column 'text' has a views buffer of 20 bytes, too few for 2 values of 16 bytes");
  column = arrow::string_views("text", {"ok", long_a});
  column.data_buffers = 3;  // more than the batch has
  refused(column, "has 3 buffers, fewer than its fields have");
  column.data_buffers = -1;  // no variadic count written
  refused(column, "has no valid variadic buffer count for view field 'text'");
  // A null's view is never read: it may hold anything.
  column = arrow::string_views("text", {"ok", long_a}, {true, false});
  put_i32(column, 16, -1);
  write_bytes(dir / "null.arrow", arrow::write({{column}}).bytes);
  EXPECT_EQ(PackSources::from_arrow(std::vector<std::string>{dir / "null.arrow"}).record(1)[0].numel(), 0);

  // 1,100 views of one 1 MiB string in one row: 1.1 GiB from a 1 MiB file.
  const std::string mebibyte(size_t{1} << 20, 'm');
  arrow::Column repeated = arrow::string_views("", {mebibyte}, {}, true, size_t{1} << 20);
  const std::vector<uint8_t> view(repeated.buffers[1].begin(), repeated.buffers[1].begin() + 16);
  for (int k = 1; k < 1100; ++k) repeated.buffers[1].insert(repeated.buffers[1].end(), view.begin(), view.end());
  repeated.length = 1100;
  write_bytes(dir / "bomb.arrow", arrow::write({{arrow::list("words", repeated, {0, 1100})}}).bytes);
  std::string message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "bomb.arrow"}); });
  EXPECT_NE(message.find("column 'words', row 0: its strings come to 1153433600 bytes, more than the 1066176 the batch's "
                         "views and data hold"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("refused as a bomb"), std::string::npos) << message;
  // The same, with 1,099 more data buffers that all name the first one's megabyte: the bytes
  // the batch holds are counted once.
  arrow::Column aliased = repeated;
  for (int k = 1; k < 1100; ++k) aliased.buffers.emplace_back();
  aliased.data_buffers = 1100;
  std::vector<uint8_t> bytes = arrow::write({{arrow::list("words", aliased, {0, 1100})}}).bytes;
  // The buffer specs (offset, length): the megabyte's, then the empty ones, pointed at it.
  size_t spec = 0;
  for (size_t p = 8; p + 24 <= bytes.size() && spec == 0; p += 8) {
    int64_t length, next_length;
    std::memcpy(&length, &bytes[p], 8);
    std::memcpy(&next_length, &bytes[p + 16], 8);
    if (length == int64_t{1} << 20 && next_length == 0) spec = p - 8;
  }
  ASSERT_NE(spec, 0u);
  for (int k = 1; k < 1100; ++k) std::memcpy(&bytes[spec + 16 * static_cast<size_t>(k)], &bytes[spec], 16);
  write_bytes(dir / "aliased.arrow", bytes);
  message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "aliased.arrow"}); });
  EXPECT_NE(message.find("column 'words', row 0: its strings come to 1153433600 bytes, more than the 1066176"),
            std::string::npos)
      << message;
  // 110 rows of 10 views of it each: no row past a gigabyte, but 105 rows are past 1,024 times
  // the bytes the batch holds.
  arrow::Column rows_of_ten = repeated;
  std::vector<int64_t> offsets;
  for (int64_t r = 0; r <= 110; ++r) offsets.push_back(10 * r);
  write_bytes(dir / "rows.arrow", arrow::write({{arrow::list("words", rows_of_ten, offsets)}}).bytes);
  message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "rows.arrow"}); });
  EXPECT_NE(message.find("column 'words', row 104: the rows up to it come to 1101004800 bytes, more than 1024 times "
                         "the 1066176 the batch's views and data hold"),
            std::string::npos)
      << message;

  // One string a row, every row a view of the same 20 KiB (what a broadcast literal makes): as
  // a dictionary of one value, no bomb, though its rows come to 2 GB.
  arrow::Column broadcast = arrow::string_views("text", {std::string(20 << 10, 'b')}, {}, true, 20 << 10);
  const std::vector<uint8_t> one_view(broadcast.buffers[1].begin(), broadcast.buffers[1].end());
  for (int k = 1; k < 100000; ++k) broadcast.buffers[1].insert(broadcast.buffers[1].end(), one_view.begin(), one_view.end());
  broadcast.length = 100000;
  write_bytes(dir / "broadcast.arrow", arrow::write({{broadcast}}).bytes);
  EXPECT_EQ(PackSources::from_arrow(std::vector<std::string>{dir / "broadcast.arrow"}).total_bytes(), int64_t{100000} * (20 << 10));

  // Every bit of a small file flipped, bodies too (the views are values the reader checks):
  // read or refused, never a crash or a read outside the file.
  const std::vector<uint8_t> whole =
      arrow::write({{arrow::string_views("text", {"ok", long_a, "another string past 12"}, {true, false, true}),
                     arrow::list("words", arrow::string_views("", {long_a, "w", "yet another long one"}), {0, 2, 2, 3}, {},
                                 true)}})
          .bytes;
  for (size_t byte = 0; byte < whole.size(); ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      std::vector<uint8_t> flipped = whole;
      flipped[byte] ^= static_cast<uint8_t>(1 << bit);
      write_bytes(dir / "flip.arrow", flipped);
      try {
        const PackSources sources = PackSources::from_arrow(std::vector<std::string>{dir / "flip.arrow"});
        std::vector<Tensor> values;
        for (int64_t r = 0; r < sources.records(); ++r) sources.record(r, values);
      } catch (const Error&) {
      }
    }
  }
}

// Decimals (a database's prices, Spark's and DuckDB's DECIMAL): float64, the integer times
// 10^-scale; the double nearest the decimal up to 15 digits (it reads back as written),
// rounded past that; a null is NaN; every width Arrow has, and in lists.
TEST(PackArrow, DecimalsBecomeFloat64) {
  TempFolder dir;
  __int128 thirty_digits = 0;  // 123456789012345678901234567890
  for (const char digit : std::string("123456789012345678901234567890")) thirty_digits = thirty_digits * 10 + (digit - '0');
  std::vector<std::vector<arrow::Column>> batches = {{
      arrow::decimals("price", {1234, -5, 0, 999999999, 7}, 9, 2, 128, {true, true, true, true, false}),
      arrow::decimals("wide", {thirty_digits, -thirty_digits, 1, 0, 0}, 38, 10),
      arrow::decimals("d32", {123, -1, 0, 0, 0}, 5, -2, 32),
      arrow::decimals("d64", {123456789012345678, 0, 0, 0, 0}, 18, 4, 64),
      arrow::decimals("d256", {-thirty_digits, 25, 0, 0, 0}, 60, 5, 256),
      arrow::list("steps", arrow::decimals("", {15, -20, 3}, 5, 1), {0, 2, 2, 3, 3, 3}),
  }};
  // A second batch (of the schema's types: the first batch's).
  batches.push_back({
      arrow::decimals("price", {5}, 9, 2), arrow::decimals("wide", {5}, 38, 10),
      arrow::decimals("d32", {3}, 5, -2, 32), arrow::decimals("d64", {3}, 18, 4, 64),
      arrow::decimals("d256", {1}, 60, 5, 256), arrow::list("steps", arrow::decimals("", {}, 5, 1), {0, 0}),
  });
  for (int codec : {-1, 1}) {
    SCOPED_TRACE(codec);
    arrow::WriteOptions options;
    options.codec = codec;
    write_bytes(dir / "prices.arrow", arrow::write(batches, options).bytes);
    const PackSources sources = PackSources::from_arrow(std::vector<std::string>{dir / "prices.arrow"});
    for (const Field& f : sources.schema().fields()) EXPECT_EQ(f.dtype, f.name == "price.valid" ? kBool : kFloat64) << f.name;
    const auto value = [&](int64_t row, const char* field) { return scalar_of<double>(field_value(sources, row, field)); };
    // Up to 15 digits: the double nearest the decimal, as a parser reads its text.
    EXPECT_EQ(value(0, "price"), std::stod("12.34"));
    EXPECT_EQ(value(1, "price"), std::stod("-0.05"));
    EXPECT_EQ(value(2, "price"), 0.0);
    EXPECT_EQ(value(3, "price"), std::stod("9999999.99"));
    EXPECT_TRUE(std::isnan(value(4, "price")));  // null: NaN, and its mask false
    EXPECT_FALSE(scalar_of<bool>(field_value(sources, 4, "price.valid")));
    EXPECT_TRUE(scalar_of<bool>(field_value(sources, 3, "price.valid")));
    EXPECT_EQ(value(0, "d32"), 12300.0);
    EXPECT_EQ(value(1, "d32"), -100.0);
    EXPECT_EQ(value(1, "d256"), std::stod("0.00025"));
    // Past 15 digits: rounded, within a few units of the last place.
    EXPECT_NEAR(value(0, "wide"), 12345678901234567890.123456789, 1e-15 * 1.2345678901234567e19);
    EXPECT_NEAR(value(1, "wide"), -12345678901234567890.123456789, 1e-15 * 1.2345678901234567e19);
    EXPECT_EQ(value(2, "wide"), 1e-10);
    EXPECT_NEAR(value(0, "d64"), 12345678901234.5678, 1e-15 * 1.2345678901234e13);
    EXPECT_NEAR(value(0, "d256"), -1234567890123456789012345.6789, 1e-15 * 1.2345678901234e24);
    EXPECT_EQ(values_of<double>(field_value(sources, 0, "steps")), (std::vector<double>{1.5, -2.0}));
    EXPECT_EQ(values_of<double>(field_value(sources, 2, "steps")), (std::vector<double>{std::stod("0.3")}));
    EXPECT_EQ(sources.schema()[sources.schema().index_of("steps")].shape, (DimVector{kVariableDim}));
    const std::string types = sources.metadata().at("arrow_types");
    EXPECT_NE(types.find(R"x("price":"decimal128(9, 2)")x"), std::string::npos) << types;
    EXPECT_NE(types.find(R"x("d32":"decimal32(5, -2)")x"), std::string::npos) << types;
    EXPECT_NE(types.find(R"x("steps":"list<decimal128(5, 1)>")x"), std::string::npos) << types;
    EXPECT_EQ(sources.metadata().at("arrow_nulls"), R"({"price":1})");
    EXPECT_EQ(value(5, "price"), 0.05);
    EXPECT_EQ(value(5, "wide"), 5e-10);
    EXPECT_EQ(value(5, "d32"), 300.0);
    EXPECT_EQ(value(5, "d64"), 3e-4);
    EXPECT_EQ(value(5, "d256"), 1e-5);
    EXPECT_EQ(field_value(sources, 5, "steps").numel(), 0);
    pack_dataset(dir / ("prices" + std::to_string(codec) + ".mmt"), sources, {});
    EXPECT_EQ(compare_with_sources(Dataset::open(dir / ("prices" + std::to_string(codec) + ".mmt")), sources), 6);
  }
  // Past 10^22 either way, the double nearest each decimal still, as a parser reads its text.
  write_bytes(dir / "scales.arrow",
              arrow::write({{arrow::decimals("small", {5, 1, 123456789012345, -7}, 38, 23),
                             arrow::decimals("large", {3, -3, 999999999999999, 1}, 18, -25)}})
                  .bytes);
  const PackSources scales = PackSources::from_arrow(std::vector<std::string>{dir / "scales.arrow"});
  const std::vector<std::string> small = {"5e-23", "1e-23", "123456789012345e-23", "-7e-23"};
  const std::vector<std::string> large = {"3e25", "-3e25", "999999999999999e25", "1e25"};
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(scales.record(r)[0].item<double>(), std::stod(small[static_cast<size_t>(r)])) << r;
    EXPECT_EQ(scales.record(r)[1].item<double>(), std::stod(large[static_cast<size_t>(r)])) << r;
  }
  // A precision no decimal of its width has is refused by name; a width Arrow lacks, as damage.
  write_bytes(dir / "zero.arrow", arrow::write({{arrow::decimals("p", {1}, 0, 0)}}).bytes);
  std::string message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "zero.arrow"}); });
  EXPECT_NE(message.find("'p' (decimal128(0, 0): a precision outside 1 to 38, or a scale outside -38 to 38)"),
            std::string::npos)
      << message;
  write_bytes(dir / "odd.arrow", arrow::write({{arrow::decimals("p", {1}, 5, 0, 48)}}).bytes);
  message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "odd.arrow"}); });
  EXPECT_NE(message.find("field 'p' is a decimal of 48 bits"), std::string::npos) << message;
}

TEST(PackArrow, CompressedBatchesAreDecompressed) {
  TempFolder dir;
  for (int codec : {0, 1}) {
    SCOPED_TRACE(codec == 0 ? "lz4" : "zstd");
    arrow::WriteOptions options;
    options.codec = codec;
    options.file_format = codec == 0;  // Feather V2: a file, lz4 by default
    write_bytes(dir / "c.arrow", arrow::write({scalar_batch(0, 4), scalar_batch(4, 5)}, options).bytes);
    const PackSources sources = PackSources::from_arrow(std::vector<std::string>{dir / "c.arrow"});
    expect_scalar_rows(sources, 9);
    // A buffer's stated length (the int64 before its compressed bytes) made wrong: the batch
    // is named. One column of 4 int32: its values buffer, 16 bytes, is the body's only one.
    std::vector<uint8_t> damaged =
        arrow::write({{arrow::numbers("i32", std::vector<int32_t>{1, 2, 3, 4})}}, options).bytes;
    bool changed = false;
    for (size_t i = damaged.size() - 8; i-- > 0 && !changed;) {
      int64_t stated;
      std::memcpy(&stated, damaged.data() + i, 8);
      if (stated == 16 && i % 8 == 0) {
        const int64_t wrong = 15;
        std::memcpy(damaged.data() + i, &wrong, 8);
        changed = true;
      }
    }
    ASSERT_TRUE(changed);
    write_bytes(dir / "bad.arrow", damaged);
    const std::string message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "bad.arrow"}); });
    EXPECT_NE(message.find("the batch at byte"), std::string::npos) << message;
    EXPECT_NE(message.find("decompresses to"), std::string::npos) << message;
  }
  // A bomb: 4 MiB of zeros in a file of a few hundred bytes, past both limits (1024 times the
  // file, here at least 1 MiB, the machine's floor lowered; and a scratch budget of 2 MiB),
  // refused before anything is decompressed. A larger budget lets it through.
  detail::set_decode_floor(int64_t{1} << 20);
  arrow::WriteOptions zstd;
  zstd.codec = 1;
  write_bytes(dir / "bomb.arrow",
              arrow::write({{arrow::numbers("zeros", std::vector<int64_t>(size_t{1} << 19, 0))}}, zstd).bytes);
  EXPECT_LT(std::filesystem::file_size(dir / "bomb.arrow"), 4096u);
  ::setenv("MMT_SCRATCH_BYTES", "2M", 1);
  const std::string bomb = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "bomb.arrow"}); });
  ::setenv("MMT_SCRATCH_BYTES", "8M", 1);
  EXPECT_EQ(PackSources::from_arrow(std::vector<std::string>{dir / "bomb.arrow"}).records(), int64_t{1} << 19);
  ::unsetenv("MMT_SCRATCH_BYTES");
  detail::set_decode_floor(0);
  EXPECT_NE(bomb.find("its compressed batches state 4194304 decompressed bytes, more than both 1024 times the file's "
                      "bytes (at least 1048576) and the scratch budget"),
            std::string::npos)
      << bomb;
  EXPECT_NE(bomb.find(": 2097152; refused as a decompression bomb (set MMT_SCRATCH_BYTES to allow more)"),
            std::string::npos)
      << bomb;
}

TEST(PackArrow, ListsBecomeArrays) {
  TempFolder dir;
  // tokens: list<int32>, ragged; embedding: list<float> all of 4 (fixed [4]); rgb:
  // fixed_size_list<uint8>[3]; grid: list<list<double>>, 2 x 3 and 1 x 2 (rectangular
  // rows, ragged); points: list<fixed_size_list<int16>[2]> (ragged [-1, 2]); mask:
  // list<bool>; long: large_list<int64>.
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6};
  const std::vector<float> embedding(12, 0.5f);
  const std::vector<uint8_t> rgb = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<double> grid = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int16_t> points = {1, 2, 3, 4, 5, 6};
  const std::vector<std::vector<arrow::Column>> batches = {{
      arrow::list("tokens", arrow::numbers("", tokens), {0, 1, 1, 6}),
      arrow::list("embedding", arrow::numbers("", embedding), {0, 4, 8, 12}),
      arrow::fixed_list("rgb", arrow::numbers("", rgb), 3, 3),
      arrow::list("grid", arrow::list("", arrow::numbers("", grid), {0, 3, 6, 8, 8}), {0, 2, 3, 3}),
      arrow::list("points", arrow::fixed_list("", arrow::numbers("", points), 2, 3), {0, 2, 2, 3}),
      arrow::list("mask", arrow::bools("", {true, false, true}), {0, 0, 3, 3}),
      arrow::list("long", arrow::numbers("", std::vector<int64_t>{7, 8}), {0, 2, 2, 2}, {}, /*large=*/true),
  }};
  write_bytes(dir / "lists.arrow", arrow::write(batches).bytes);
  const PackSources sources = PackSources::from_arrow(std::vector<std::string>{dir / "lists.arrow"});
  const Schema& schema = sources.schema();
  EXPECT_EQ(schema[0].shape, (DimVector{kVariableDim}));
  EXPECT_EQ(schema[1].shape, (DimVector{4}));
  EXPECT_EQ(schema[1].dtype, kFloat32);
  EXPECT_EQ(schema[2].shape, (DimVector{3}));
  EXPECT_EQ(schema[3].shape, (DimVector{kVariableDim, kVariableDim}));
  EXPECT_EQ(schema[4].shape, (DimVector{kVariableDim, 2}));
  EXPECT_EQ(schema[5].dtype, kBool);
  EXPECT_EQ(schema[6].dtype, kInt64);
  const std::vector<Tensor> r0 = sources.record(0), r1 = sources.record(1), r2 = sources.record(2);
  EXPECT_EQ(values_of<int32_t>(r0[0]), (std::vector<int32_t>{1}));
  EXPECT_EQ(r1[0].numel(), 0);
  EXPECT_EQ(values_of<int32_t>(r2[0]), (std::vector<int32_t>{2, 3, 4, 5, 6}));
  EXPECT_EQ(values_of<uint8_t>(r1[2]), (std::vector<uint8_t>{4, 5, 6}));
  EXPECT_EQ(shape_of(r0[3]), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(values_of<double>(r0[3]), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(shape_of(r1[3]), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(values_of<double>(r1[3]), (std::vector<double>{7, 8}));
  EXPECT_EQ(shape_of(r2[3]), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(shape_of(r0[4]), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(values_of<int16_t>(r0[4]), (std::vector<int16_t>{1, 2, 3, 4}));
  EXPECT_EQ(shape_of(r2[4]), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(values_of<bool>(r1[5]), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(values_of<int64_t>(r0[6]), (std::vector<int64_t>{7, 8}));
  pack_dataset(dir / "lists.mmt", sources, {});
  const Dataset ds = Dataset::open(dir / "lists.mmt");
  EXPECT_EQ(shape_of(ds.get(1)["grid"]), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(compare_with_sources(ds, sources), 3);
}

// A list of strings (captions, answers, tokens of text): the row's strings joined, and their
// lengths beside them; chosen together.
TEST(PackArrow, ListsOfStringsBecomeBytesAndLengths) {
  TempFolder dir;
  const std::vector<std::vector<arrow::Column>> batches = {{
      arrow::list("captions", arrow::texts("", {"a", "bb", "ccc"}), {0, 2, 2, 2, 3}, {true, true, false, true}),
      arrow::list("pair", arrow::texts("", {"x", "yz", "", "w"}, {}, false, /*large=*/true), {0, 2, 4, 4, 4}),
      arrow::list("deep", arrow::list("", arrow::texts("", {"q"}), {0, 1}), {0, 1, 1, 1, 1}),
      arrow::numbers("id", std::vector<int32_t>{0, 1, 2, 3}),
  }};
  write_bytes(dir / "captions.arrow", arrow::write(batches).bytes);
  const std::vector<std::string> input{dir / "captions.arrow"};
  const std::string message = error_of([&] { PackSources::from_arrow(input); });
  EXPECT_NE(message.find("'deep' (list<list<string>>: lists hold numbers, bools or (one level of) strings here)"),
            std::string::npos)
      << message;
  const std::vector<std::string> chosen{"captions", "pair", "id"};
  const PackSources sources = PackSources::from_arrow(input, chosen);
  const Schema& schema = sources.schema();
  ASSERT_EQ(schema.size(), 6u);
  EXPECT_EQ(schema[0].name, "captions");
  EXPECT_EQ(schema[0].shape, (DimVector{kVariableDim}));
  EXPECT_EQ(schema[1].name, "captions.lengths");
  EXPECT_EQ(schema[1].dtype, kInt64);
  EXPECT_EQ(schema[1].shape, (DimVector{kVariableDim}));
  EXPECT_EQ(schema[2].name, "captions.valid");  // after the lengths: the two are one column
  EXPECT_EQ(schema[4].name, "pair.lengths");
  const std::vector<Tensor> r0 = sources.record(0), r1 = sources.record(1), r2 = sources.record(2),
                            r3 = sources.record(3);
  EXPECT_EQ(text_of(r0[0]), "abb");
  EXPECT_EQ(values_of<int64_t>(r0[1]), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r1[0].numel(), 0);  // no strings
  EXPECT_TRUE(r1[2].item<bool>());
  EXPECT_EQ(r2[0].numel(), 0);  // null: no strings either, and a false mask
  EXPECT_EQ(r2[1].numel(), 0);
  EXPECT_FALSE(r2[2].item<bool>());
  EXPECT_EQ(text_of(r3[0]), "ccc");
  EXPECT_EQ(values_of<int64_t>(r3[1]), (std::vector<int64_t>{3}));
  EXPECT_EQ(text_of(r0[3]), "xyz");
  EXPECT_EQ(text_of(r1[3]), "w");
  EXPECT_EQ(values_of<int64_t>(r1[4]), (std::vector<int64_t>{0, 1}));
  EXPECT_NE(sources.metadata().at("arrow_types").find(R"x("captions.lengths":"list<string> (lengths)")x"),
            std::string::npos);
  pack_dataset(dir / "c.mmt", sources, {});
  EXPECT_EQ(compare_with_sources(Dataset::open(dir / "c.mmt"), sources), 4);

  // Every row of two strings: the lengths are a fixed [2].
  write_bytes(dir / "two.arrow",
              arrow::write({{arrow::list("q", arrow::texts("", {"a", "b", "cc", "d"}), {0, 2, 4})}}).bytes);
  const PackSources two = PackSources::from_arrow(std::vector<std::string>{dir / "two.arrow"});
  EXPECT_EQ(two.schema()[1].shape, (DimVector{2}));
  EXPECT_EQ(values_of<int64_t>(two.record(1)[1]), (std::vector<int64_t>{2, 1}));
  // A list of strings' mask chosen by name brings the strings, their lengths and the mask.
  const PackSources masked = PackSources::from_arrow(input, std::vector<std::string>{"captions.valid"});
  ASSERT_EQ(masked.schema().size(), 3u);
  EXPECT_EQ(masked.schema()[1].name, "captions.lengths");
  EXPECT_EQ(masked.schema()[2].name, "captions.valid");
  // Its lengths alone: the column's mask follows them.
  const PackSources lengths = PackSources::from_arrow(input, std::vector<std::string>{"captions.lengths"});
  ASSERT_EQ(lengths.schema().size(), 2u);
  EXPECT_EQ(lengths.schema()[1].name, "captions.valid");
  EXPECT_FALSE(lengths.record(2)[1].item<bool>());
  EXPECT_NE(lengths.metadata().at("arrow_types").find(R"x("captions.valid":"list<string> (valid)")x"), std::string::npos)
      << lengths.metadata().at("arrow_types");
  // Lengths and strings chosen apart, in either order: one mask, after the strings.
  const PackSources apart =
      PackSources::from_arrow(input, std::vector<std::string>{"captions.lengths", "id", "captions"});
  std::vector<std::string> apart_names;
  for (const Field& f : apart.schema().fields()) apart_names.push_back(f.name);
  EXPECT_EQ(apart_names, (std::vector<std::string>{"captions.lengths", "id", "captions", "captions.valid"}));
  EXPECT_FALSE(apart.record(2)[3].item<bool>());
  EXPECT_TRUE(apart.record(1)[3].item<bool>());
}

TEST(PackArrow, JaggedListsAndNullsInsideListsAreRefused) {
  TempFolder dir;
  // Row 1's lists have lengths 2 and 1: no tensor holds it.
  write_bytes(dir / "jagged.arrow",
              arrow::write({{arrow::list("grid", arrow::list("", arrow::numbers("", std::vector<int32_t>{1, 2, 3, 4, 5}),
                                                             {0, 2, 4, 5}),
                                         {0, 1, 3})}})
                  .bytes);
  std::string message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "jagged.arrow"}); });
  EXPECT_NE(message.find("column 'grid', row 1: a jagged list (its lists at depth 2 have lengths 2 and 1)"),
            std::string::npos)
      << message;
  write_bytes(dir / "inner.arrow",
              arrow::write({{arrow::list("tokens", arrow::numbers("", std::vector<int32_t>{1, 2}, {true, false}), {0, 2})}})
                  .bytes);
  message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "inner.arrow"}); });
  EXPECT_NE(message.find("column 'tokens', row 0: a null inside its lists, which no tensor holds"), std::string::npos)
      << message;
}

// list<struct<...>>: a chat dataset's messages and a detection dataset's objects. Each of the
// struct's columns is a field of the row's list of its values (a list of strings: its bytes
// and their lengths); a struct chosen by name brings all its columns.
TEST(PackArrow, ListsOfStructsBecomeAFieldForEachOfTheirColumns) {
  TempFolder dir;
  // Rows: [system "Be brief.", user "Hi"], [], null, [user "2+2?", assistant "4", user ""].
  const auto messages = [](std::vector<bool> valid_turns) {
    return arrow::list("messages",
                       arrow::structure("", {arrow::texts("role", {"system", "user", "user", "assistant", "user"}),
                                             arrow::texts("content", {"Be brief.", "Hi", "2+2?", "4", ""})},
                                        5, std::move(valid_turns)),
                       {0, 2, 2, 2, 5}, {true, true, false, true});
  };
  // Objects: two boxes, none, one, one; a box is a fixed_size_list<float, 4>.
  std::vector<float> boxes;
  for (int k = 0; k < 16; ++k) boxes.push_back(static_cast<float>(k) * 0.5f);
  const arrow::Column objects = arrow::list(
      "objects",
      arrow::structure("", {arrow::fixed_list("bbox", arrow::numbers("", boxes), 4, 4),
                            arrow::numbers("category", std::vector<int64_t>{3, 1, 4, 1})},
                       4),
      {0, 2, 2, 3, 4});
  write_bytes(dir / "chat.arrow", arrow::write({{arrow::numbers("id", std::vector<int64_t>{7, 8, 9, 10}), messages({}),
                                                 objects}})
                                      .bytes);
  const PackSources sources = PackSources::from_arrow(std::vector<std::string>{dir / "chat.arrow"});
  const Schema& schema = sources.schema();
  ASSERT_EQ(schema.size(), 9u);
  EXPECT_EQ(schema[1].name, "messages.role");
  EXPECT_EQ(schema[2].name, "messages.role.lengths");
  EXPECT_EQ(schema[3].name, "messages.role.valid");
  EXPECT_EQ(schema[4].name, "messages.content");
  EXPECT_EQ(schema[5].name, "messages.content.lengths");
  EXPECT_EQ(schema[6].name, "messages.content.valid");
  EXPECT_EQ(schema[7].name, "objects.bbox");
  EXPECT_EQ(schema[7].shape, (DimVector{kVariableDim, 4}));
  EXPECT_EQ(schema[8].name, "objects.category");
  EXPECT_EQ(schema[8].shape, (DimVector{kVariableDim}));
  const std::vector<Tensor> r0 = sources.record(0), r1 = sources.record(1), r2 = sources.record(2),
                            r3 = sources.record(3);
  EXPECT_EQ(text_of(r0[1]), "systemuser");
  EXPECT_EQ(values_of<int64_t>(r0[2]), (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(text_of(r0[4]), "Be brief.Hi");
  EXPECT_EQ(values_of<int64_t>(r0[5]), (std::vector<int64_t>{9, 2}));
  EXPECT_EQ(r1[2].numel(), 0);  // no messages
  EXPECT_EQ(r2[2].numel(), 0);  // a null conversation: stored empty, counted, and masked
  for (const size_t mask : {3, 6}) {
    EXPECT_TRUE(r1[mask].item<bool>());
    EXPECT_FALSE(r2[mask].item<bool>());
  }
  EXPECT_EQ(text_of(r3[4]), "2+2?4");
  EXPECT_EQ(values_of<int64_t>(r3[5]), (std::vector<int64_t>{4, 1, 0}));
  EXPECT_EQ(DimVector(r0[7].sizes()), (DimVector{2, 4}));
  EXPECT_EQ(values_of<float>(r0[7]), (std::vector<float>{0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5}));
  EXPECT_EQ(values_of<int64_t>(r0[8]), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(DimVector(r1[7].sizes()), (DimVector{0, 4}));
  EXPECT_EQ(values_of<float>(r3[7]), (std::vector<float>{6, 6.5, 7, 7.5}));
  EXPECT_NE(sources.metadata().at("arrow_nulls").find(R"("messages.role":1)"), std::string::npos);
  EXPECT_NE(sources.metadata().at("arrow_types").find(
                R"x("objects.category":"int64 in list<struct<bbox: fixed_size_list<float>[4], category: int64>>")x"),
            std::string::npos)
      << sources.metadata().at("arrow_types");
  pack_dataset(dir / "chat.mmt", sources, {});
  EXPECT_EQ(compare_with_sources(Dataset::open(dir / "chat.mmt"), sources), 4);

  // A struct chosen by its name: all its columns, in order.
  const PackSources chosen = PackSources::from_arrow(std::vector<std::string>{dir / "chat.arrow"},
                                                     std::vector<std::string>{"objects", "messages.content"});
  ASSERT_EQ(chosen.schema().size(), 5u);
  EXPECT_EQ(chosen.schema()[0].name, "objects.bbox");
  EXPECT_EQ(chosen.schema()[1].name, "objects.category");
  EXPECT_EQ(chosen.schema()[2].name, "messages.content");
  EXPECT_EQ(chosen.schema()[3].name, "messages.content.lengths");
  EXPECT_EQ(chosen.schema()[4].name, "messages.content.valid");
  // A column named and also brought by its struct's name is chosen once; one named twice is refused.
  const PackSources both = PackSources::from_arrow(std::vector<std::string>{dir / "chat.arrow"},
                                                   std::vector<std::string>{"messages.content", "messages"});
  ASSERT_EQ(both.schema().size(), 6u);
  EXPECT_EQ(both.schema()[0].name, "messages.content");
  EXPECT_EQ(both.schema()[3].name, "messages.role");
  std::string twice = error_of([&] {
    PackSources::from_arrow(std::vector<std::string>{dir / "chat.arrow"}, std::vector<std::string>{"id", "id"});
  });
  EXPECT_NE(twice.find("chat.arrow: column 'id' is chosen twice"), std::string::npos) << twice;

  // Lists of structs inside lists of structs: o: list<struct<a: list<struct<b: int32>>>>, rows
  // [{a: [{b: 1}]}], [{a: [{b: 2}]}, {a: [{b: 3}]}], [].
  write_bytes(dir / "nested.arrow",
              arrow::write({{arrow::list(
                                "o",
                                arrow::structure("", {arrow::list("a", arrow::structure("", {arrow::numbers("b", std::vector<int32_t>{1, 2, 3})}, 3), {0, 1, 2, 3})}, 3),
                                {0, 1, 3, 3})}})
                  .bytes);
  const PackSources nested = PackSources::from_arrow(std::vector<std::string>{dir / "nested.arrow"});
  ASSERT_EQ(nested.schema().size(), 1u);
  EXPECT_EQ(nested.schema()[0].name, "o.a.b");
  EXPECT_EQ(nested.schema()[0].shape, (DimVector{kVariableDim, 1}));
  EXPECT_EQ(values_of<int32_t>(nested.record(1)[0]), (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(DimVector(nested.record(2)[0].sizes()), (DimVector{0, 1}));
  EXPECT_NE(nested.metadata().at("arrow_types").find(R"("o.a.b":"int32 in list<struct<a: list<struct<b: int32>>>>")"),
            std::string::npos)
      << nested.metadata().at("arrow_types");

  // A null message inside a conversation: refused, naming the row, as a null inside a list is.
  write_bytes(dir / "null_turn.arrow",
              arrow::write({{messages({true, true, true, false, true})}}).bytes);
  std::string message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "null_turn.arrow"}); });
  EXPECT_NE(message.find("column 'messages.role', row 3: a null inside its lists"), std::string::npos) << message;
  // A list of strings inside a list of structs (two levels of strings): refused by name, and
  // choosing the struct names what holds it back.
  write_bytes(dir / "tags.arrow",
              arrow::write({{arrow::list("spans",
                                         arrow::structure("", {arrow::numbers("start", std::vector<int32_t>{0, 5}),
                                                               arrow::list("tags", arrow::texts("", {"a", "b"}), {0, 1, 2})},
                                                          2),
                                         {0, 2})}})
                  .bytes);
  message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "tags.arrow"}); });
  EXPECT_NE(message.find("'spans.tags' (list<string> in list<struct<start: int32, tags: list<string>>>: lists hold "
                         "numbers, bools or (one level of) strings here)"),
            std::string::npos)
      << message;
  message = error_of([&] {
    PackSources::from_arrow(std::vector<std::string>{dir / "tags.arrow"}, std::vector<std::string>{"spans"});
  });
  EXPECT_NE(message.find("column 'spans.tags' (list<string>"), std::string::npos) << message;
  EXPECT_NE(message.find("choose the others of 'spans' by their names"), std::string::npos) << message;
  const PackSources starts =
      PackSources::from_arrow(std::vector<std::string>{dir / "tags.arrow"}, std::vector<std::string>{"spans.start"});
  EXPECT_EQ(values_of<int32_t>(starts.record(0)[0]), (std::vector<int32_t>{0, 5}));
}

// A map is a list of struct<key, value> entries: NAME.key and NAME.value, a list each a row.
TEST(PackArrow, MapsBecomeTheirKeysAndValues) {
  TempFolder dir;
  // {"bleu": 0.5, "rouge": 0.75}, {}, null, {"bleu": 0.25}
  const auto scores = [](std::vector<bool> valid_values) {
    return arrow::map("scores", arrow::texts("", {"bleu", "rouge", "bleu"}),
                      arrow::numbers("", std::vector<float>{0.5f, 0.75f, 0.25f}, std::move(valid_values)), {0, 2, 2, 2, 3},
                      {true, true, false, true});
  };
  write_bytes(dir / "scores.arrow", arrow::write({{scores({})}}).bytes);
  const PackSources sources = PackSources::from_arrow(std::vector<std::string>{dir / "scores.arrow"});
  ASSERT_EQ(sources.schema().size(), 5u);
  EXPECT_EQ(sources.schema()[0].name, "scores.key");
  EXPECT_EQ(sources.schema()[1].name, "scores.key.lengths");
  EXPECT_EQ(sources.schema()[2].name, "scores.key.valid");
  EXPECT_EQ(sources.schema()[3].name, "scores.value");
  EXPECT_EQ(sources.schema()[3].dtype, kFloat32);
  EXPECT_EQ(sources.schema()[3].shape, (DimVector{kVariableDim}));
  EXPECT_EQ(text_of(sources.record(0)[0]), "bleurouge");
  EXPECT_EQ(values_of<int64_t>(sources.record(0)[1]), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(values_of<float>(sources.record(0)[3]), (std::vector<float>{0.5f, 0.75f}));
  EXPECT_EQ(sources.record(1)[3].numel(), 0);
  EXPECT_EQ(sources.record(2)[3].numel(), 0);  // null: empty, and apart from {} by its mask
  EXPECT_EQ(sources.schema()[4].name, "scores.value.valid");
  EXPECT_TRUE(sources.record(1)[4].item<bool>());
  EXPECT_FALSE(sources.record(2)[4].item<bool>());
  EXPECT_EQ(values_of<float>(sources.record(3)[3]), (std::vector<float>{0.25f}));
  EXPECT_NE(sources.metadata().at("arrow_types").find(R"("scores.value":"float in map<string, float>")"),
            std::string::npos)
      << sources.metadata().at("arrow_types");
  // A null value inside a map: refused, naming the row.
  write_bytes(dir / "null_value.arrow", arrow::write({{scores({true, false, true})}}).bytes);
  const std::string message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "null_value.arrow"}); });
  EXPECT_NE(message.find("column 'scores.value', row 0: a null inside its lists"), std::string::npos) << message;
}

TEST(PackArrow, StructsAreFlattenedAndNullsStoredAsHuggingFaceReadsThem) {
  TempFolder dir;
  // Hugging Face's Image feature: struct<bytes: binary, path: string>; row 1's image null,
  // row 2's path null. A float column with a null (NaN), a text column with one (empty). Each
  // column with a null has its mask beside it, NAME.valid.
  const std::vector<std::vector<arrow::Column>> batches = {{
      arrow::structure("image",
                       {arrow::texts("bytes", {"\x89PNG0", "", "\xff\xd8jpeg"}, {}, /*utf8=*/false),
                        arrow::texts("path", {"a.png", "", ""}, {true, true, false})},
                       3, {true, false, true}),
      arrow::numbers("score", std::vector<double>{1.5, 0, 2.5}, {true, false, true}),
      arrow::texts("caption", {"x", "", "z"}, {true, false, true}),
      arrow::list("tokens", arrow::numbers("", std::vector<int32_t>{1, 2}), {0, 2, 2, 2}, {true, true, false}),
  }};
  write_bytes(dir / "images.arrow", arrow::write(batches).bytes);
  const PackSources sources = PackSources::from_arrow(std::vector<std::string>{dir / "images.arrow"});
  const Schema& schema = sources.schema();
  ASSERT_EQ(schema.size(), 10u);
  EXPECT_EQ(schema[0].name, "image.bytes");
  EXPECT_EQ(schema[1].name, "image.bytes.valid");
  EXPECT_EQ(schema[2].name, "image.path");
  EXPECT_EQ(schema[3].name, "image.path.valid");
  EXPECT_EQ(schema[4].shape, DimVector{});
  const std::vector<Tensor> r0 = sources.record(0), r1 = sources.record(1), r2 = sources.record(2);
  EXPECT_EQ(text_of(r0[0]), "\x89PNG0");
  EXPECT_EQ(text_of(r0[2]), "a.png");
  EXPECT_EQ(r1[0].numel(), 0);  // the struct is null: each of its columns is
  EXPECT_EQ(text_of(r2[0]), "\xff\xd8jpeg");
  EXPECT_EQ(r2[2].numel(), 0);
  EXPECT_EQ(scalar_of<double>(r0[4]), 1.5);
  EXPECT_TRUE(std::isnan(scalar_of<double>(r1[4])));
  EXPECT_EQ(r1[6].numel(), 0);
  EXPECT_EQ(r2[8].numel(), 0);
  // The masks tell each null from the empty string, the NaN and the empty list beside it.
  const auto masks = [&](int64_t r) {
    std::vector<bool> valid;
    for (const size_t mask : {1, 3, 5, 7, 9}) valid.push_back(sources.record(r)[mask].item<bool>());
    return valid;
  };
  EXPECT_EQ(masks(0), (std::vector<bool>{true, true, true, true, true}));
  EXPECT_EQ(masks(1), (std::vector<bool>{false, false, false, false, true}));
  EXPECT_EQ(masks(2), (std::vector<bool>{true, false, true, true, false}));
  EXPECT_EQ(sources.metadata().at("arrow_nulls"),
            R"({"caption":1,"image.bytes":1,"image.path":2,"score":1,"tokens":1})");

  // A null in an integer (a bool, fixed bytes...): zero, and NAME.valid false (a mask, as a
  // training loop applies one); a column without nulls has none.
  write_bytes(dir / "labels.arrow",
              arrow::write({{arrow::numbers("label", std::vector<int64_t>{1, 7, 3}, {true, false, true}),
                             arrow::bools("flag", {true, true, false}, {false, true, true}),
                             arrow::numbers("id", std::vector<int32_t>{4, 5, 6})}})
                  .bytes);
  const PackSources labels = PackSources::from_arrow(std::vector<std::string>{dir / "labels.arrow"});
  std::vector<std::string> names;
  for (const Field& f : labels.schema().fields()) names.push_back(f.name);
  EXPECT_EQ(names, (std::vector<std::string>{"label", "label.valid", "flag", "flag.valid", "id"}));
  EXPECT_EQ(labels.schema()[1].dtype, kBool);
  EXPECT_TRUE(labels.schema()[1].shape.empty());
  EXPECT_EQ(scalar_of<int64_t>(labels.record(0)[0]), 1);
  EXPECT_EQ(scalar_of<int64_t>(labels.record(1)[0]), 0);  // null: zero, not the 7 beneath it
  EXPECT_EQ(scalar_of<bool>(labels.record(0)[1]), true);
  EXPECT_EQ(scalar_of<bool>(labels.record(1)[1]), false);
  EXPECT_EQ(scalar_of<bool>(labels.record(0)[2]), false);
  EXPECT_EQ(scalar_of<bool>(labels.record(0)[3]), false);
  EXPECT_EQ(scalar_of<bool>(labels.record(2)[3]), true);
  EXPECT_EQ(labels.metadata().at("arrow_nulls"), R"({"flag":1,"label":1})");
  EXPECT_NE(labels.metadata().at("arrow_types").find(R"x("label.valid":"int64 (valid)")x"), std::string::npos);
  pack_dataset(dir / "labels.mmt", labels, {});
  EXPECT_EQ(compare_with_sources(Dataset::open(dir / "labels.mmt"), labels), 3);
  // NAME.valid chosen by name is NAME, which brings it (verify chooses every field a pack made).
  const PackSources chosen = PackSources::from_arrow(std::vector<std::string>{dir / "labels.arrow"},
                                                     std::vector<std::string>{"label.valid", "id"});
  ASSERT_EQ(chosen.schema().size(), 3u);
  EXPECT_EQ(chosen.schema()[0].name, "label");
  EXPECT_EQ(chosen.schema()[1].name, "label.valid");
  // A string column's mask, and a struct's column's, the same way.
  const PackSources texts = PackSources::from_arrow(std::vector<std::string>{dir / "images.arrow"},
                                                    std::vector<std::string>{"caption.valid", "image.path.valid"});
  std::vector<std::string> text_names;
  for (const Field& f : texts.schema().fields()) text_names.push_back(f.name);
  EXPECT_EQ(text_names, (std::vector<std::string>{"caption", "caption.valid", "image.path", "image.path.valid"}));
  // A column already named so: the clash named, with the way out.
  write_bytes(dir / "clash.arrow",
              arrow::write({{arrow::numbers("x", std::vector<int32_t>{1, 2}, {true, false}),
                             arrow::bools("x.valid", {true, true})}})
                  .bytes);
  const std::string clash = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "clash.arrow"}); });
  EXPECT_NE(clash.find("column 'x' has nulls, and its mask, 'x.valid', would take the name of a column of the file"),
            std::string::npos)
      << clash;
  // Chosen alone, too: verify, asking the file for 'x.valid', would get the other column.
  const std::string chosen_clash = error_of(
      [&] { PackSources::from_arrow(std::vector<std::string>{dir / "clash.arrow"}, std::vector<std::string>{"x"}); });
  EXPECT_NE(chosen_clash.find("its mask, 'x.valid', would take the name of a column of the file; leave 'x' out"),
            std::string::npos)
      << chosen_clash;
  // The mask of a column without nulls is no column.
  const std::string no_mask = error_of([&] {
    PackSources::from_arrow(std::vector<std::string>{dir / "labels.arrow"}, std::vector<std::string>{"id.valid"});
  });
  EXPECT_NE(no_mask.find("no column 'id.valid': column 'id' has no nulls, so no mask"), std::string::npos) << no_mask;
}

TEST(PackArrow, ColumnsChosenAndTypesNoFieldHolds) {
  TempFolder dir;
  const std::vector<std::vector<arrow::Column>> batches = {{
      arrow::numbers("label", std::vector<int64_t>{4, 5}),
      arrow::intervals("period", 2),
      arrow::list("tags", arrow::texts("", {"a", "b"}), {0, 1, 2}),
      arrow::texts("text", {"p", "q"}),
  }};
  write_bytes(dir / "mixed.arrow", arrow::write(batches).bytes);
  const std::vector<std::string> input{dir / "mixed.arrow"};
  std::string message = error_of([&] { PackSources::from_inputs(input); });
  EXPECT_NE(message.find("columns of types no field holds: 'period' (interval); choose"), std::string::npos)
      << message;
  EXPECT_NE(message.find("--field"), std::string::npos) << message;
  const std::vector<std::string> chosen{"text", "label"};
  const PackSources sources = PackSources::from_inputs(input, chosen);
  ASSERT_EQ(sources.schema().size(), 2u);
  EXPECT_EQ(sources.schema()[0].name, "text");
  EXPECT_EQ(scalar_of<int64_t>(sources.record(1)[1]), 5);
  const std::vector<std::string> wrong{"labels"};
  message = error_of([&] { PackSources::from_inputs(input, wrong); });
  EXPECT_NE(message.find("no column 'labels' (its columns: label, tags, tags.lengths, text)"), std::string::npos)
      << message;
  const std::vector<std::string> refused{"period"};
  message = error_of([&] { PackSources::from_inputs(input, refused); });
  EXPECT_NE(message.find("column 'period' (interval) is of a type no field holds"), std::string::npos) << message;

  // Files of other columns are not packed together.
  write_bytes(dir / "other.arrow", arrow::write({{arrow::numbers("label", std::vector<int32_t>{1})}}).bytes);
  write_bytes(dir / "one.arrow", arrow::write({{arrow::numbers("label", std::vector<int64_t>{1})}}).bytes);
  message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "one.arrow", dir / "other.arrow"}); });
  EXPECT_NE(message.find("its columns differ from those of"), std::string::npos) << message;
}

TEST(PackArrow, HuggingFaceSaveToDiskFolders) {
  TempFolder dir;
  std::filesystem::create_directories(dir / "ds/train");
  const std::string features =
      R"({"info": {"features": {"img": {"_type": "Image"}, "label": {"names": ["cat", "dog"], "_type": "ClassLabel"}}}})";
  arrow::WriteOptions options;
  options.metadata = {{"huggingface", features}};
  const auto shard = [&](int first) {
    return arrow::write({{arrow::structure("img", {arrow::texts("bytes", {"jpg" + std::to_string(first)}, {}, false),
                                                   arrow::texts("path", {"p"})},
                                           1),
                          arrow::numbers("label", std::vector<int64_t>{first % 2})}},
                        options)
        .bytes;
  };
  write_bytes(dir / "ds/train/data-00000-of-00002.arrow", shard(0));
  write_bytes(dir / "ds/train/data-00001-of-00002.arrow", shard(1));
  std::ofstream(dir / "ds/train/state.json")
      << R"({"_data_files": [{"filename": "data-00000-of-00002.arrow"}, {"filename": "data-00001-of-00002.arrow"}],)"
      << R"( "_split": "train"})";
  std::ofstream(dir / "ds/dataset_dict.json") << R"({"splits": ["train"]})";

  const std::vector<std::string> split{dir / "ds/train"};
  EXPECT_TRUE(are_arrow_inputs(split));
  const std::vector<std::string> chosen{"img.bytes", "label"};
  const PackSources sources = PackSources::from_inputs(split, chosen);
  ASSERT_EQ(sources.records(), 2);
  EXPECT_EQ(text_of(sources.record(1)[0]), "jpg1");
  EXPECT_EQ(scalar_of<int64_t>(sources.record(1)[1]), 1);
  EXPECT_EQ(sources.metadata().at("classes"), R"(["cat","dog"])");
  EXPECT_EQ(sources.metadata().at("huggingface"), features);
  EXPECT_EQ(sources.input_paths().size(), 2u);

  // Features of other shapes than Hugging Face's: no class names, and no fault.
  for (const std::string& odd : {std::string(R"({"info": {"features": {"label": {"_type": 5}}}})"),
                                 std::string(R"({"info": {"features": {"label": {"_type": "ClassLabel", "names": [[["x"]]]}}}})"),
                                 std::string(R"({"info": {"features": {"label": {"_type": "ClassLabel", "names": )") +
                                     std::string(100000, '[') + std::string(100000, ']') + "}}}}",
                                 std::string("not json")}) {
    arrow::WriteOptions odd_options;
    odd_options.metadata = {{"huggingface", odd}};
    write_bytes(dir / "odd.arrow", arrow::write({{arrow::numbers("label", std::vector<int64_t>{1})}}, odd_options).bytes);
    const PackSources read = PackSources::from_arrow(std::vector<std::string>{dir / "odd.arrow"});
    EXPECT_FALSE(read.metadata().contains("classes"));
    EXPECT_EQ(read.metadata().at("huggingface"), odd);
  }

  // The DatasetDict's folder: one split is packed, and the message names them.
  const std::string message = error_of([&] { PackSources::from_inputs(std::vector<std::string>{dir / "ds"}); });
  EXPECT_NE(message.find("a Hugging Face DatasetDict (splits: train); pack one split's folder"), std::string::npos)
      << message;
  // A data file outside the folder is refused.
  std::ofstream(dir / "ds/train/state.json") << R"({"_data_files": [{"filename": "../x.arrow"}]})";
  EXPECT_NE(error_of([&] { PackSources::from_arrow(split); }).find("is not a path inside its folder"), std::string::npos);
}

// Empty lists above inner ones: an image without boxes. The inner dimension is the other
// rows' (no offsets of the empty level are read: an array of none may leave them out).
TEST(PackArrow, EmptyListsOverInnerOnes) {
  TempFolder dir;
  const std::vector<float> boxes = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  for (int codec : {-1, 1}) {
    SCOPED_TRACE(codec);
    arrow::WriteOptions options;
    options.codec = codec;
    write_bytes(dir / "boxes.arrow",
                arrow::write({{arrow::list("boxes", arrow::list("", arrow::numbers("", boxes), {0, 4, 8, 12}),
                                           {0, 2, 2, 3, 3}),
                               arrow::list("names", arrow::texts("", {"a"}), {0, 1, 1, 1, 1})}},
                             options)
                    .bytes);
    const PackSources sources = PackSources::from_arrow(std::vector<std::string>{dir / "boxes.arrow"});
    EXPECT_EQ(sources.schema()[0].shape, (DimVector{kVariableDim, 4}));
    EXPECT_EQ(shape_of(sources.record(0)[0]), (std::vector<int64_t>{2, 4}));
    EXPECT_EQ(shape_of(sources.record(1)[0]), (std::vector<int64_t>{0, 4}));
    EXPECT_EQ(values_of<float>(sources.record(2)[0]), (std::vector<float>{9, 10, 11, 12}));
    EXPECT_EQ(shape_of(sources.record(3)[0]), (std::vector<int64_t>{0, 4}));
    EXPECT_EQ(sources.record(3)[1].numel(), 0);
    EXPECT_EQ(sources.total_bytes(), 12 * 4 + 1 + 8);
    // Every row empty, its inner arrays of no values: nothing to say the inner dimension.
    write_bytes(dir / "none.arrow",
                arrow::write({{arrow::list("boxes", arrow::list("", arrow::numbers("", std::vector<float>{}), {0}),
                                           {0, 0, 0})}},
                             options)
                    .bytes);
    const PackSources none = PackSources::from_arrow(std::vector<std::string>{dir / "none.arrow"});
    EXPECT_EQ(none.schema()[0].shape, (DimVector{kVariableDim, kVariableDim}));
    EXPECT_EQ(shape_of(none.record(1)[0]), (std::vector<int64_t>{0, 0}));
  }
}

// A null fixed-size list: pyarrow writes its values null too. Floats take NaN; other
// dtypes are refused, naming the row.
TEST(PackArrow, NullFixedSizeListsAsPyarrowWritesThem) {
  TempFolder dir;
  write_bytes(dir / "v.arrow",
              arrow::write({{arrow::fixed_list("v", arrow::numbers("", std::vector<float>{1, 2, 0, 0, 5, 6},
                                                                   {true, true, false, false, true, true}),
                                               2, 3, {true, false, true})}})
                  .bytes);
  const PackSources sources = PackSources::from_arrow(std::vector<std::string>{dir / "v.arrow"});
  EXPECT_EQ(sources.schema()[0].shape, (DimVector{2}));
  EXPECT_EQ(values_of<float>(sources.record(2)[0]), (std::vector<float>{5, 6}));
  const std::vector<float> nan = values_of<float>(sources.record(1)[0]);
  ASSERT_EQ(nan.size(), 2u);
  EXPECT_TRUE(std::isnan(nan[0]) && std::isnan(nan[1]));
  EXPECT_EQ(sources.metadata().at("arrow_nulls"), R"({"v":1})");
  write_bytes(dir / "i.arrow",
              arrow::write({{arrow::fixed_list("v", arrow::numbers("", std::vector<int16_t>{1, 2, 0, 0},
                                                                   {true, true, false, false}),
                                               2, 2, {true, false})}})
                  .bytes);
  // Of integers: zeros of its shape, and v.valid.
  const PackSources ints = PackSources::from_arrow(std::vector<std::string>{dir / "i.arrow"});
  EXPECT_EQ(ints.schema()[0].shape, (DimVector{2}));
  EXPECT_EQ(values_of<int16_t>(ints.record(0)[0]), (std::vector<int16_t>{1, 2}));
  EXPECT_EQ(values_of<int16_t>(ints.record(1)[0]), (std::vector<int16_t>{0, 0}));
  EXPECT_EQ(ints.schema()[1].name, "v.valid");
  EXPECT_EQ(scalar_of<bool>(ints.record(1)[1]), false);
}

// pack_dataset() takes a record batch's rows as one batch (views of the file, strings and
// lists in their jagged layout); the file it writes is the one that appending record() row
// by row writes, for every kind of column, with nulls, and in chunks that cut the batches.
// Columns read row by row (views, dictionaries, lists of strings, null strings holding
// bytes) are gathered into the batch, to the same file.
TEST(PackArrow, BatchesOfRowsPackToTheSameFileAsRowByRow) {
  TempFolder dir;
  const auto batch_of = [](int first, int n, bool stray_bytes) {
    std::vector<float> score, emb;
    std::vector<int32_t> count, tokens;
    std::vector<int64_t> token_at{0}, box_at{0}, pair_at{0}, meta_a, pairs;
    std::vector<float> boxes;
    std::vector<bool> flag, valid, list_valid, emb_values_valid;
    std::vector<std::string> text, blob, id, meta_b;
    std::vector<__int128> price;
    std::vector<std::string> notes, words;
    std::vector<int64_t> word_at{0};
    std::vector<int32_t> animal;
    std::vector<int16_t> size;
    for (int r = first; r < first + n; ++r) {
      const bool null = r % 7 == 3;
      valid.push_back(!null);
      score.push_back(null ? 0 : 0.5f * static_cast<float>(r));
      count.push_back(null ? 0 : r * 3);
      flag.push_back(r % 2 == 0);
      text.push_back(null && !stray_bytes ? "" : "row " + std::to_string(r));
      blob.push_back(std::string(static_cast<size_t>(r % 9), static_cast<char>('a' + r % 26)));
      id.push_back(std::string{static_cast<char>(r), static_cast<char>(r + 1), static_cast<char>(r + 2)});
      const bool list_null = r % 11 == 5;
      list_valid.push_back(!list_null);
      for (int k = 0; k < (list_null ? 0 : r % 13); ++k) tokens.push_back(r * 100 + k);
      token_at.push_back(static_cast<int64_t>(tokens.size()));
      for (int k = 0; k < 4 * (r % 3); ++k) boxes.push_back(static_cast<float>(r) + 0.25f * static_cast<float>(k));
      box_at.push_back(static_cast<int64_t>(boxes.size()) / 4);
      for (int k = 0; k < 3; ++k) {
        emb.push_back(null ? 0 : static_cast<float>(r * 3 + k));
        emb_values_valid.push_back(!null);
      }
      price.push_back(static_cast<__int128>(r) * 1234 - 5000);
      meta_a.push_back(null ? 0 : int64_t{r} << 33);
      meta_b.push_back(null ? "" : std::string(static_cast<size_t>(r % 4), 'm'));
      pairs.push_back(r);
      pairs.push_back(-r);
      pair_at.push_back(pair_at.back() + 2);
      notes.push_back(null ? "" : std::string(static_cast<size_t>(r % 30), static_cast<char>('A' + r % 26)));
      for (int k = 0; k < (list_null ? 0 : r % 4); ++k) words.push_back(std::string(static_cast<size_t>(k + 1), 'w'));
      word_at.push_back(static_cast<int64_t>(words.size()));
      animal.push_back(r % 3);
      size.push_back(static_cast<int16_t>(r % 2));
    }
    return std::vector<arrow::Column>{
        arrow::numbers("score", score, valid),
        arrow::numbers("count", count, valid),
        arrow::bools("flag", flag, valid),
        arrow::texts("text", text, valid),
        arrow::texts("blob", blob, {}, /*utf8=*/false, /*large=*/true),
        arrow::fixed_binary("id", 3, id),
        arrow::list("tokens", arrow::numbers("", tokens), token_at, list_valid),
        arrow::list("boxes", arrow::fixed_list("", arrow::numbers("", boxes), 4, box_at.back()), box_at, {}, true),
        arrow::fixed_list("emb", arrow::numbers("", emb, emb_values_valid), 3, n, valid),
        arrow::decimals("price", price, 9, 2, 128, valid),
        arrow::structure("meta", {arrow::numbers("a", meta_a), arrow::texts("b", meta_b)}, n, valid),
        arrow::list("pair", arrow::numbers("", pairs), pair_at),
        // Gathered row by row into the batch: views, a list of strings, dictionaries.
        arrow::string_views("note", notes, valid),
        arrow::list("words", arrow::texts("", words), word_at, list_valid),
        arrow::encoded<int32_t>("animal", arrow::texts("", {}), 0, animal, valid),
        arrow::encoded<int16_t>("size", arrow::numbers("", std::vector<float>{}), 1, size),
    };
  };
  arrow::WriteOptions options;
  options.file_format = true;
  options.dictionaries = {{0, arrow::texts("", {"cat", "dog", "bird"}), false, 0},
                          {1, arrow::numbers("", std::vector<float>{0.5f, 1.5f}), false, 0}};
  for (const bool stray_bytes : {false, true}) {
    write_bytes(dir / "rows.arrow",
                arrow::write({batch_of(0, 700, stray_bytes), batch_of(700, 1, stray_bytes), batch_of(701, 0, stray_bytes),
                              batch_of(701, 2600, stray_bytes)},
                             options)
                    .bytes);
    const PackSources sources = PackSources::from_arrow(std::vector<std::string>{dir / "rows.arrow"});
    ASSERT_EQ(sources.records(), 3301);
    std::vector<std::string> names;
    for (const Field& field : sources.schema()) names.push_back(field.name);
    EXPECT_EQ(names, (std::vector<std::string>{"score", "score.valid", "count", "count.valid", "flag", "flag.valid",
                                               "text", "text.valid", "blob", "id", "tokens", "tokens.valid", "boxes",
                                               "emb", "emb.valid", "price", "price.valid", "meta.a", "meta.a.valid",
                                               "meta.b", "meta.b.valid", "pair", "note", "note.valid", "words",
                                               "words.lengths", "words.valid", "animal", "animal.valid", "size"}));
    EXPECT_EQ(sources.schema()[sources.schema().index_of("boxes")].shape, (DimVector{kVariableDim, 4}));
    EXPECT_EQ(sources.schema()[sources.schema().index_of("pair")].shape, (DimVector{2}));
    testutil::expect_batches_pack_as_records(dir.path(), sources, {int64_t{1} << 20, 5000},
                                             stray_bytes ? ", null strings holding bytes" : "");
    const Dataset packed = Dataset::open(dir / "batched.mmt");
    EXPECT_TRUE(std::isnan(scalar_of<float>(packed.get(3)["score"])));
    EXPECT_EQ(scalar_of<int32_t>(packed.get(3)["count"]), 0);
    EXPECT_FALSE(scalar_of<bool>(packed.get(3)["count.valid"]));
    EXPECT_EQ(packed.get(3)["text"].numel(), 0);
    EXPECT_FALSE(scalar_of<bool>(packed.get(3)["text.valid"]));
    EXPECT_FALSE(scalar_of<bool>(packed.get(5)["words.valid"]));  // a null list of strings
    EXPECT_TRUE(scalar_of<bool>(packed.get(4)["words.valid"]));
    EXPECT_EQ(packed.get(5)["words.lengths"].numel(), 0);
    EXPECT_FALSE(scalar_of<bool>(packed.get(3)["score.valid"]));
    EXPECT_TRUE(scalar_of<bool>(packed.get(4)["score.valid"]));
    EXPECT_EQ(text_of(packed.get(4)["text"]), "row 4");
    EXPECT_EQ(values_of<int32_t>(packed.get(5)["tokens"]).size(), 0u);
    EXPECT_EQ(values_of<int32_t>(packed.get(2)["tokens"]), (std::vector<int32_t>{200, 201}));
    EXPECT_EQ(shape_of(packed.get(701)["boxes"]), (std::vector<int64_t>{2, 4}));
    EXPECT_DOUBLE_EQ(scalar_of<double>(packed.get(4)["price"]), (4 * 1234 - 5000) / 100.0);
    EXPECT_EQ(values_of<int64_t>(packed.get(2000)["pair"]), (std::vector<int64_t>{2000, -2000}));
    EXPECT_EQ(text_of(packed.get(32)["note"]), "GG");
    EXPECT_EQ(text_of(packed.get(3)["words"]), "wwwwww");
    EXPECT_EQ(values_of<int64_t>(packed.get(3)["words.lengths"]), (std::vector<int64_t>{1, 2, 3}));
    EXPECT_EQ(text_of(packed.get(2)["animal"]), "bird");
    EXPECT_EQ(packed.get(3)["animal"].numel(), 0);
    EXPECT_EQ(scalar_of<float>(packed.get(5)["size"]), 1.5f);
  }
  // A gathered row of a megabyte or more goes by itself (record() keeps its string a view of
  // the file, where a batch would copy it); the rows before it make a batch.
  std::vector<std::string> notes(40, "short");
  notes[30] = std::string(size_t{3} << 19, 'n');
  write_bytes(dir / "big.arrow", arrow::write({{arrow::string_views("note", notes)}}).bytes);
  const PackSources big = PackSources::from_arrow(std::vector<std::string>{dir / "big.arrow"});
  std::vector<Tensor> values, offsets;
  EXPECT_EQ(big.jagged_record_batch(0, 40, values, offsets), 30);
  EXPECT_EQ(big.jagged_record_batch(30, 10, values, offsets), -1);
  EXPECT_EQ(big.jagged_record_batch(31, 9, values, offsets), 9);
  pack_dataset(dir / "big.mmt", big, {});
  EXPECT_EQ(Dataset::open(dir / "big.mmt").get(30)["note"].numel(), int64_t{3} << 19);
  // A null inside a list is refused as row by row, naming its row.
  write_bytes(dir / "inner.arrow",
              arrow::write({{arrow::list("l", arrow::numbers("", std::vector<int32_t>{1, 2, 3}, {true, false, true}),
                                         {0, 1, 3})}})
                  .bytes);
  EXPECT_NE(error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "inner.arrow"}); })
                .find("column 'l', row 1: a null inside its lists"),
            std::string::npos);
}

// Dictionary-encoded columns (pandas categoricals, polars' categorical): each row its value.
// Deltas add values, a stream's later dictionary replaces them; an index outside is named.
TEST(PackArrow, DictionaryEncodedColumns) {
  TempFolder dir;
  const arrow::Column strings = arrow::texts("", {});
  arrow::WriteOptions options;
  options.dictionaries = {{0, arrow::texts("", {"cat", "dog"}), false, 0},
                          {1, arrow::numbers("", std::vector<double>{0.5, 1.5}), false, 0},
                          {0, arrow::texts("", {"bird"}), /*delta=*/true, 1},
                          {0, arrow::texts("", {"fish"}), false, 2}};
  const arrow::Column doubles = arrow::numbers("", std::vector<double>{});
  const std::vector<std::vector<arrow::Column>> batches = {
      {arrow::encoded<int32_t>("animal", strings, 0, {1, 0, 0}, {true, true, false}),
       arrow::encoded<int8_t>("weight", doubles, 1, {1, 0, 1})},
      {arrow::encoded<int32_t>("animal", strings, 0, {2, 1}), arrow::encoded<int8_t>("weight", doubles, 1, {0, 0})},
      {arrow::encoded<int32_t>("animal", strings, 0, {0}), arrow::encoded<int8_t>("weight", doubles, 1, {1})},
  };
  for (int codec : {-1, 1}) {
    SCOPED_TRACE(codec);
    options.codec = codec;
    write_bytes(dir / "cat.arrow", arrow::write(batches, options).bytes);
    const PackSources sources = PackSources::from_arrow(std::vector<std::string>{dir / "cat.arrow"});
    ASSERT_EQ(sources.records(), 6);
    EXPECT_EQ(sources.schema()[0].shape, (DimVector{kVariableDim}));
    EXPECT_EQ(sources.schema()[1].name, "animal.valid");
    EXPECT_EQ(sources.schema()[2].dtype, kFloat64);
    const std::vector<std::string> animals = {"dog", "cat", "", "bird", "dog", "fish"};
    const std::vector<double> weights = {1.5, 0.5, 1.5, 0.5, 0.5, 1.5};
    for (int r = 0; r < 6; ++r) {
      EXPECT_EQ(text_of(sources.record(r)[0]), animals[static_cast<size_t>(r)]) << r;
      EXPECT_EQ(sources.record(r)[1].item<bool>(), r != 2) << r;
      EXPECT_EQ(scalar_of<double>(sources.record(r)[2]), weights[static_cast<size_t>(r)]) << r;
    }
    EXPECT_NE(sources.metadata().at("arrow_types").find(R"("animal":"dictionary<values=string, indices=int32>")"),
              std::string::npos);
    EXPECT_EQ(sources.metadata().at("arrow_nulls"), R"({"animal":1})");
  }
  // An index past the dictionary (batch 0 sees "cat" and "dog" only).
  options.codec = -1;
  write_bytes(dir / "bad.arrow",
              arrow::write({{arrow::encoded<int32_t>("animal", strings, 0, {0, 2}), arrow::encoded<int8_t>("weight", doubles, 1, {0, 0})}},
                           options)
                  .bytes);
  std::string message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "bad.arrow"}); });
  EXPECT_NE(message.find("column 'animal', row 1: dictionary index 2 is outside its dictionary's 2 values"),
            std::string::npos)
      << message;
  // No dictionary at all for an encoded column: named.
  write_bytes(dir / "none.arrow", arrow::write({{arrow::encoded<int32_t>("animal", strings, 7, {0})}}).bytes);
  message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "none.arrow"}); });
  EXPECT_NE(message.find("column 'animal', row 0: no dictionary of id 7 comes before it"), std::string::npos)
      << message;
  // Unsigned indices, and one past int64 named as it is.
  arrow::WriteOptions unsigned_indices;
  unsigned_indices.dictionaries = {{0, arrow::texts("", {"cat", "dog"}), false, 0}};
  write_bytes(dir / "u.arrow", arrow::write({{arrow::encoded<uint8_t>("animal", strings, 0, {1, 0})}}, unsigned_indices).bytes);
  EXPECT_EQ(text_of(PackSources::from_arrow(std::vector<std::string>{dir / "u.arrow"}).record(0)[0]), "dog");
  write_bytes(dir / "u64.arrow",
              arrow::write({{arrow::encoded<uint64_t>("animal", strings, 0, {uint64_t{1} << 63})}}, unsigned_indices).bytes);
  message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "u64.arrow"}); });
  EXPECT_NE(message.find("dictionary index 9223372036854775808 is outside"), std::string::npos) << message;
  // A file's dictionaries hold for all its batches, wherever they lie; it replaces none.
  arrow::WriteOptions late = unsigned_indices;
  late.file_format = true;
  late.dictionaries = {{0, arrow::texts("", {"cat"}), false, 1}, {0, arrow::texts("", {"dog"}), true, 1}};
  write_bytes(dir / "late.arrow", arrow::write({{arrow::encoded<int32_t>("animal", strings, 0, {1, 0})}}, late).bytes);
  EXPECT_EQ(text_of(PackSources::from_arrow(std::vector<std::string>{dir / "late.arrow"}).record(0)[0]), "dog");
  options.file_format = true;
  write_bytes(dir / "file.arrow", arrow::write(batches, options).bytes);
  message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "file.arrow"}); });
  EXPECT_NE(message.find("a second dictionary of id 0 in an Arrow file"), std::string::npos) << message;
  // Files whose columns read other dictionary ids are not packed together.
  arrow::WriteOptions swapped;
  swapped.dictionaries = {{1, arrow::texts("", {"cat", "dog"}), false, 0}, {0, arrow::numbers("", std::vector<double>{0.5}), false, 0}};
  write_bytes(dir / "swapped.arrow", arrow::write({{arrow::encoded<int32_t>("animal", strings, 1, {0}),
                                                    arrow::encoded<int8_t>("weight", doubles, 0, {0})}}, swapped).bytes);
  options.file_format = false;
  options.codec = -1;
  write_bytes(dir / "cat.arrow", arrow::write(batches, options).bytes);
  message = error_of([&] { PackSources::from_arrow(std::vector<std::string>{dir / "cat.arrow", dir / "swapped.arrow"}); });
  EXPECT_NE(message.find("its columns differ from those of"), std::string::npos) << message;
}

// A null fixed-size list of strings: stored empty, its lengths field ragged.
TEST(PackArrow, NullFixedSizeListsOfStrings) {
  TempFolder dir;
  write_bytes(dir / "pairs.arrow",
              arrow::write({{arrow::fixed_list("pair", arrow::texts("", {"a", "b", "", "", "c", "d"}, {true, true, false, false, true, true}),
                                               2, 3, {true, false, true})}})
                  .bytes);
  const PackSources sources = PackSources::from_arrow(std::vector<std::string>{dir / "pairs.arrow"});
  EXPECT_EQ(sources.schema()[1].name, "pair.lengths");
  EXPECT_EQ(sources.schema()[1].shape, (DimVector{kVariableDim}));
  EXPECT_EQ(sources.record(1)[1].numel(), 0);
  EXPECT_EQ(values_of<int64_t>(sources.record(2)[1]), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(text_of(sources.record(2)[0]), "cd");
}

// Rows read from many threads at once (each its own scratch), dictionaries and all
// (ThreadSanitizer runs this).
TEST(PackArrow, RowsReadConcurrently) {
  TempFolder dir;
  arrow::WriteOptions options;
  options.codec = 1;
  options.dictionaries = {{0, arrow::texts("", {"cat", "dog", "bird"}), false, 0}};
  std::vector<std::vector<arrow::Column>> batches;
  for (int b = 0; b < 4; ++b) {
    std::vector<int32_t> ids, animals;
    std::vector<int64_t> offsets{0};
    std::vector<float> values;
    for (int r = 0; r < 25; ++r) {
      const int row = b * 25 + r;
      ids.push_back(row);
      animals.push_back(row % 3);
      for (int k = 0; k < row % 4; ++k) values.push_back(static_cast<float>(row));
      offsets.push_back(static_cast<int64_t>(values.size()));
    }
    batches.push_back({arrow::numbers("id", ids), arrow::encoded<int32_t>("animal", arrow::texts("", {}), 0, animals),
                       arrow::list("v", arrow::numbers("", values), offsets)});
  }
  write_bytes(dir / "rows.arrow", arrow::write(batches, options).bytes);
  const PackSources sources = PackSources::from_arrow(std::vector<std::string>{dir / "rows.arrow"});
  const std::vector<std::string> names = {"cat", "dog", "bird"};
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<Tensor> values;
      for (int k = 0; k < 200; ++k) {
        const int64_t r = (k * 13 + t * 7) % 100;
        sources.record(r, values);
        const bool right = scalar_of<int32_t>(values[0]) == r && text_of(values[1]) == names[static_cast<size_t>(r % 3)] &&
                           values[2].numel() == r % 4;
        if (!right) ++wrong;
      }
    });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

// Trust no byte: a stream cut anywhere reads only when cut between messages (a stream may end
// there), a file never; every flipped bit of the metadata gives records or an error.
TEST(PackArrow, CutsAndFlipsNeverCrash) {
  TempFolder dir;
  const std::vector<std::vector<arrow::Column>> batches = {{
      arrow::structure("image", {arrow::texts("bytes", {"ab", "c"}, {}, false), arrow::texts("path", {"x", "y"})}, 2),
      arrow::list("grid", arrow::list("", arrow::numbers("", std::vector<int16_t>{1, 2, 3, 4, 5, 6}), {0, 2, 4, 6}),
                  {0, 1, 3}),
      arrow::numbers("score", std::vector<float>{1, 2}, {true, false}),
      arrow::list("turns",
                  arrow::structure("", {arrow::numbers("n", std::vector<int32_t>{1, 2, 3}), arrow::texts("t", {"a", "bb", "c"})}, 3),
                  {0, 1, 3}),
      arrow::string_views("note", {"n", "a note past twelve bytes"}),
  }};
  for (bool file_format : {false, true}) {
    SCOPED_TRACE(file_format ? "file" : "stream");
    arrow::WriteOptions options;
    options.file_format = file_format;
    const arrow::Written whole = arrow::write(batches, options);
    const std::string path = dir / "cut.arrow";
    for (size_t cut = 0; cut < whole.bytes.size(); ++cut) {
      write_bytes(path, std::vector<uint8_t>(whole.bytes.begin(), whole.bytes.begin() + static_cast<ptrdiff_t>(cut)));
      const bool between = !file_format && std::find(whole.message_ends.begin(), whole.message_ends.end(), cut) !=
                                               whole.message_ends.end();
      try {
        const PackSources sources = PackSources::from_arrow(std::vector<std::string>{path});
        EXPECT_TRUE(between) << "a cut at byte " << cut << " read";
        for (int64_t r = 0; r < sources.records(); ++r) (void)sources.record(r);
      } catch (const Error& e) {
        EXPECT_FALSE(between && cut > 0) << "a cut between messages at byte " << cut << " refused: " << e.what();
      }
    }
    // Every bit of the schema's and the batch's metadata (not the bodies, whose values the
    // reader checks where it reads them), and of a file's footer.
    const size_t metadata_end = whole.message_ends.back();
    int32_t footer_length = 0;
    if (file_format) std::memcpy(&footer_length, whole.bytes.data() + whole.bytes.size() - 10, 4);
    const size_t footer_start = whole.bytes.size() - 10 - static_cast<size_t>(footer_length);
    for (size_t byte = file_format ? 8 : 0; byte < whole.bytes.size() - 10; ++byte) {
      if (byte >= metadata_end && !(file_format && byte >= footer_start)) continue;
      for (int bit = 0; bit < 8; ++bit) {
        std::vector<uint8_t> flipped = whole.bytes;
        flipped[byte] ^= static_cast<uint8_t>(1 << bit);
        write_bytes(path, flipped);
        try {
          const PackSources sources = PackSources::from_arrow(std::vector<std::string>{path});
          std::vector<Tensor> values;
          for (int64_t r = 0; r < sources.records(); ++r) sources.record(r, values);
        } catch (const Error&) {
        }
      }
    }
  }
}

}  // namespace
}  // namespace mmt
