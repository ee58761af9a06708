// The format's building blocks, named as in docs/FORMAT.md.
#include <gtest/gtest.h>
#include <zstd.h>

#include <cstring>

#include "checksum.h"
#include "codec_engine.h"
#include "format.h"
#include "mmtensor/error.h"

namespace mmt {
namespace {

using namespace format;

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(FormatTest, PreambleRoundTripAndChecks) {
  Preamble p;
  p.alignment = 4096;
  p.records_per_chunk = 1024;
  p.record_stride_bytes = 832;
  p.flags = kFlagContiguousFixedLayout;
  std::vector<std::byte> file(kPreambleBytes + kFooterBytes);
  encode_preamble(p, file.data());
  EXPECT_EQ(std::memcmp(file.data(), "\x89MMT\r\n\x1a\n", 8), 0);
  Preamble q = decode_preamble(file.data(), static_cast<int64_t>(file.size()));
  EXPECT_EQ(q.alignment, 4096u);
  EXPECT_EQ(q.records_per_chunk, 1024u);
  EXPECT_EQ(q.record_stride_bytes, 832u);
  EXPECT_EQ(q.flags, kFlagContiguousFixedLayout);

  Preamble newer = p;
  newer.format_version = 2;
  encode_preamble(newer, file.data());
  EXPECT_EQ(message_of([&] { decode_preamble(file.data(), static_cast<int64_t>(file.size())); }),
            "format version 2 is newer than this reader (supports 1)");
  Preamble flags = p;
  flags.flags = 0x6;
  encode_preamble(flags, file.data());
  EXPECT_NE(message_of([&] { decode_preamble(file.data(), static_cast<int64_t>(file.size())); }).find("unknown flags 0x6"),
            std::string::npos);
  Preamble align = p;
  align.alignment = 100;
  encode_preamble(align, file.data());
  EXPECT_THROW(decode_preamble(file.data(), static_cast<int64_t>(file.size())), FormatError);
  encode_preamble(p, file.data());
  file[20] ^= std::byte{1};
  EXPECT_THROW(decode_preamble(file.data(), static_cast<int64_t>(file.size())), ChecksumError);
  EXPECT_NE(message_of([&] { decode_preamble(reinterpret_cast<const std::byte*>("PK\3\4 not ours"), 13); })
                .find("not an mmtensor dataset"),
            std::string::npos);
  encode_preamble(p, file.data());
  EXPECT_NE(message_of([&] { decode_preamble(file.data(), 100); }).find("truncated"), std::string::npos);
}

TEST(FormatTest, FooterRoundTripAndTiling) {
  Preamble p;
  p.alignment = 64;
  p.records_per_chunk = 10;
  Footer f;
  f.record_count = 25;
  f.chunk_count = 3;
  f.schema_offset = 64 + 3 * 128;
  f.schema_bytes = 13;
  f.chunk_table_offset = round_up(static_cast<int64_t>(f.schema_offset + f.schema_bytes), 8);
  f.file_bytes = f.chunk_table_offset + 3 * kChunkEntryBytes + kFooterBytes;
  f.schema_checksum = 77;
  std::vector<std::byte> file(f.file_bytes);
  encode_preamble(p, file.data());
  encode_footer(f, file.data() + file.size() - kFooterBytes);
  EXPECT_EQ(std::memcmp(file.data() + file.size() - 8, kEndMagic, 8), 0);
  Footer g = decode_footer(file.data(), static_cast<int64_t>(file.size()), p);
  EXPECT_EQ(g.record_count, 25u);
  EXPECT_EQ(g.schema_checksum, 77u);
  // 25 records in chunks of 10 need exactly 3 chunks.
  Footer wrong = f;
  wrong.record_count = 31;
  encode_footer(wrong, file.data() + file.size() - kFooterBytes);
  EXPECT_THROW(decode_footer(file.data(), static_cast<int64_t>(file.size()), p), FormatError);
  encode_footer(f, file.data() + file.size() - kFooterBytes);
  file[file.size() - kFooterBytes] ^= std::byte{4};
  EXPECT_THROW(decode_footer(file.data(), static_cast<int64_t>(file.size()), p), ChecksumError);
  EXPECT_NE(message_of([&] { decode_footer(file.data(), static_cast<int64_t>(file.size()) - 1, p); }).find("end magic"),
            std::string::npos);
}

TEST(FormatTest, ChunkEntryChecksumCoversItsIndex) {
  ChunkEntry e;
  e.file_offset = 4096;
  e.stored_bytes = 100;
  e.decoded_bytes = 300;
  e.first_record = 20;
  e.record_count = 10;
  e.codec = static_cast<uint8_t>(Codec::LZ4);
  e.payload_checksum = 0xabc;
  std::byte bytes[kChunkEntryBytes];
  encode_chunk_entry(e, 2, bytes);
  ChunkEntry d = decode_chunk_entry(bytes, 2);
  EXPECT_EQ(d.file_offset, 4096u);
  EXPECT_EQ(d.record_count, 10u);
  EXPECT_EQ(d.codec, 1u);
  EXPECT_EQ(peek_first_record(bytes), 20u);
  EXPECT_NE(message_of([&] { decode_chunk_entry(bytes, 3); }).find("chunk 3: chunk table entry checksum mismatch"),
            std::string::npos);
  EXPECT_NE(payload_checksum("abc", 3, 0), payload_checksum("abc", 3, 1));
  EXPECT_EQ(payload_checksum("abc", 3, 0), detail::checksum64("abc", 3));
}

TEST(FormatTest, RecordLayoutRule) {
  RecordLayout ints = compute_record_layout(Schema({Field::fixed("x", kInt32, {})}));
  EXPECT_EQ(ints.record_stride_bytes, 4);  // tiny records are not padded to 64
  RecordLayout mnist = compute_record_layout(
      Schema({Field::fixed("image", kUInt8, {1, 28, 28}), Field::fixed("label", kUInt8, {})}));
  EXPECT_EQ(mnist.field_offset_bytes, (std::vector<int64_t>{0, 784}));
  EXPECT_EQ(mnist.record_stride_bytes, 832);
  RecordLayout mixed = compute_record_layout(Schema({Field::fixed("a", kUInt8, {3}), Field::bytes("raw"),
                                                     Field::fixed("b", kFloat64, {}), Field::fixed("c", kFloat32, {16})}));
  EXPECT_EQ(mixed.field_offset_bytes, (std::vector<int64_t>{0, -1, 8, 64}));
  EXPECT_EQ(mixed.ragged_fields, std::vector<size_t>{1});
  EXPECT_EQ(mixed.record_stride_bytes, 128);
  RecordLayout ragged = compute_record_layout(Schema({Field::bytes("raw")}));
  EXPECT_EQ(ragged.record_stride_bytes, 0);
}

// A file may declare as many fields as its schema block holds values (~100k here). Each
// field's duplicate check was a scan of those before it, so decoding took time quadratic in
// the count: 80k fields took 9 s, the ~350k that fit about 3 minutes. The test is not timed;
// that regression would show as a test taking minutes.
TEST(FormatTest, ASchemaOfManyFieldsDecodesAndADuplicateAmongThemIsFound) {
  constexpr int kFields = 100000;
  std::vector<Field> fields;
  for (int i = 0; i < kFields; ++i) fields.push_back(Field::fixed(std::string("f").append(std::to_string(i)), kUInt8, {1}));
  SchemaBlock block;
  block.schema = Schema(fields);
  block.writer = "mmtensor test";
  const std::string json = encode_schema_block(block);
  SchemaBlock back = decode_schema_block(json, 4096);
  ASSERT_EQ(back.schema.size(), static_cast<size_t>(kFields));
  EXPECT_EQ(back.schema.index_of("f77777"), 77777u);
  const std::string unknown = message_of([&] { back.schema.index_of("nope"); });
  EXPECT_NE(unknown.find("'f31' and 99968 more"), std::string::npos) << unknown.substr(0, 200);

  std::string duplicated = json;
  const size_t at = duplicated.find("\"f99999\"");
  ASSERT_NE(at, std::string::npos);
  duplicated.replace(at, 8, "\"f12345\"");
  EXPECT_NE(message_of([&] { decode_schema_block(duplicated, 4096); }).find("already has a field named 'f12345'"),
            std::string::npos);
}

TEST(FormatTest, SchemaBlockRoundTripAndValidation) {
  SchemaBlock block;
  block.schema = Schema({Field::fixed("image", kUInt8, {3, 4, 5}).stored_channels_last(), Field::bytes("jpeg"),
                         Field::ragged("boxes", kFloat32, {kVariableDim, 4})});
  block.metadata = {{"source", "ünïcode ok"}};
  block.codec = CodecSpec::parse("zstd:7");
  block.writer = "mmtensor test";
  std::string json = encode_schema_block(block);
  SchemaBlock back = decode_schema_block(json, 4096);
  EXPECT_EQ(back.schema, block.schema);
  EXPECT_EQ(back.metadata, block.metadata);
  EXPECT_EQ(back.codec, block.codec);
  EXPECT_EQ(back.writer, "mmtensor test");

  auto error = [](const std::string& text) { return message_of([&] { decode_schema_block(text, 4096); }); };
  EXPECT_NE(error("{not json").find("schema block at byte offset 4096: not valid JSON"), std::string::npos);
  EXPECT_NE(error("[]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(error(R"({"fields":[]})").find("\"fields\""), std::string::npos);
  EXPECT_NE(error(R"({"fields":[{"name":"x","dtype":"complex","shape":[1]}]})").find("unknown dtype"), std::string::npos);
  EXPECT_NE(error(R"({"fields":[{"name":"x","dtype":"uint8","shape":[0]}]})").find("field 'x'"), std::string::npos);
  EXPECT_NE(error(R"({"fields":[{"name":"x","dtype":"uint8","shape":[1]},{"name":"x","dtype":"uint8","shape":[1]}]})")
                .find("already has a field named 'x'"),
            std::string::npos);
  EXPECT_NE(error(R"({"fields":[{"name":"x","dtype":"uint8","shape":[1,2],"storage_order":[1,1]}]})").find("permutation"),
            std::string::npos);
  EXPECT_NE(error(R"({"fields":[{"name":"x","dtype":"uint8","shape":[18446744073709551615]}]})").find("too large"),
            std::string::npos);
  EXPECT_NE(error(R"({"fields":[{"name":"x","dtype":"uint8","shape":[1]}],"metadata":{"k":1}})").find("metadata"),
            std::string::npos);
  EXPECT_NE(error(R"({"fields":[{"name":"x","dtype":"uint8","shape":[1]}],"codec":"brotli"})").find("unknown codec"),
            std::string::npos);
  EXPECT_NE(error(std::string(100, '[') + std::string(100, ']')).find("nested"), std::string::npos);
  // Refused before parsing: text after a NUL (the parser would stop there and ignore it), and
  // more values than a schema needs (a parser builds a node for each).
  const std::string valid = R"({"fields":[{"name":"x","dtype":"uint8","shape":[1]}]})";
  EXPECT_NE(error(valid + std::string(1, '\0') + "garbage").find("NUL"), std::string::npos);
  std::string crowded = R"({"fields":[{"name":"x","dtype":"uint8","shape":[1]}],"extra":[0)";
  for (int64_t i = 0; i < kMaxSchemaValues; ++i) crowded += ",0";
  EXPECT_NE(error(crowded + "]}").find("values"), std::string::npos);
}

TEST(FormatTest, CodecSpecParseAndStr) {
  EXPECT_EQ(CodecSpec::parse("none"), (CodecSpec{Codec::None, 0}));
  EXPECT_EQ(CodecSpec::parse("lz4"), (CodecSpec{Codec::LZ4, 0}));
  EXPECT_EQ(CodecSpec::parse("lz4:9"), (CodecSpec{Codec::LZ4, 9}));
  EXPECT_EQ(CodecSpec::parse("zstd:19").str(), "zstd:19");
  EXPECT_EQ(CodecSpec::parse("zstd").str(), "zstd");
  EXPECT_EQ(CodecSpec::parse("zstd:03"), (CodecSpec{Codec::Zstd, 3}));  // leading zeros: FORMAT.md allows them
  for (const char* bad : {"", "gzip", "none:1", "lz4:", "lz4:13", "zstd:-1", "zstd:23", "zstd:3x", "ZSTD", "lz4:-0",
                          "zstd:-0", "zstd:+3", "zstd: 3"})
    EXPECT_THROW(CodecSpec::parse(bad), ValueError) << bad;
}

TEST(FormatTest, CodecsRoundTripAndRefuseWrongSizes) {
  std::vector<char> data(10000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 7) % 13);
  for (const char* name : {"none", "lz4", "lz4:12", "zstd", "zstd:19"}) {
    CodecSpec spec = CodecSpec::parse(name);
    std::vector<char> packed(detail::compress_bound(spec.codec, 10000));
    int64_t n = detail::compress(spec, data.data(), 10000, packed.data(), static_cast<int64_t>(packed.size()));
    std::vector<char> back(10000);
    detail::decompress(spec.codec, packed.data(), n, back.data(), 10000, "chunk 0");
    EXPECT_EQ(back, data) << name;
    std::vector<char> small(9999);
    EXPECT_THROW(detail::decompress(spec.codec, packed.data(), n, small.data(), 9999, "chunk 0"), FormatError) << name;
    if (spec.codec != Codec::None) {
      std::vector<char> big(10001);
      EXPECT_THROW(detail::decompress(spec.codec, packed.data(), n, big.data(), 10001, "chunk 0"), FormatError) << name;
      packed[n / 2] ^= 0x55;
      packed[n / 3] ^= 0x55;
      try {
        detail::decompress(spec.codec, packed.data(), n, back.data(), 10000, "chunk 0");
      } catch (const FormatError& e) {
        EXPECT_NE(std::string(e.what()).find("chunk 0"), std::string::npos);
      }
    }
  }
}

// zstd inputs over kZstdPiecesAboveBytes go through the codec a piece at a time, one frame
// all the same, and may be given up between pieces.
TEST(FormatTest, LargeZstdInputsAreOneFrameMadeInPiecesThatMayBeGivenUp) {
  if (ZSTD_versionNumber() < 10502) GTEST_SKIP() << "libzstd " << ZSTD_versionString() << " compresses in one call";
  const int64_t size = detail::kZstdPiecesAboveBytes + 3 * detail::kZstdPieceBytes + 12345;
  std::vector<uint8_t> data(static_cast<size_t>(size));
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i * 2654435761u) >> 27);
  const CodecSpec zstd{Codec::Zstd, 3};
  std::vector<uint8_t> frame(static_cast<size_t>(detail::compress_bound(Codec::Zstd, size)));
  int asked = 0;
  const int64_t n = detail::compress(zstd, data.data(), size, frame.data(), static_cast<int64_t>(frame.size()),
                                     [&] { ++asked; return false; });
  ASSERT_GT(n, 0);
  EXPECT_EQ(asked, static_cast<int>(size / detail::kZstdPieceBytes) + 1) << "before the first piece and between each two";
  // The frame one call of the library makes, byte for byte.
  std::vector<uint8_t> at_once(frame.size());
  at_once.resize(ZSTD_compress(at_once.data(), at_once.size(), data.data(), data.size(), 3));
  EXPECT_EQ(std::vector<uint8_t>(frame.begin(), frame.begin() + n), at_once);
  std::vector<uint8_t> back(data.size());
  detail::decompress(Codec::Zstd, frame.data(), n, back.data(), size, "chunk 0");
  EXPECT_EQ(back, data);
  // Given up after the first piece: -1, and the thread's context compresses the next input whole.
  asked = 0;
  EXPECT_EQ(detail::compress(zstd, data.data(), size, frame.data(), static_cast<int64_t>(frame.size()),
                             [&] { return ++asked == 2; }),
            -1);
  EXPECT_EQ(asked, 2);
  EXPECT_EQ(detail::compress(zstd, data.data(), size, frame.data(), static_cast<int64_t>(frame.size())), n);
  // What `stop` runs (a Python signal handler) may compress on the same thread: with a context
  // of its own, so the frame under way comes out whole.
  std::vector<uint8_t> inner(frame.size());
  int inner_calls = 0;
  const int64_t outer = detail::compress(zstd, data.data(), size, frame.data(), static_cast<int64_t>(frame.size()), [&] {
    ++inner_calls;
    EXPECT_EQ(detail::compress(zstd, data.data(), size, inner.data(), static_cast<int64_t>(inner.size())), n);
    EXPECT_GT(detail::compress(zstd, data.data(), 1000, inner.data(), static_cast<int64_t>(inner.size())), 0);
    return false;
  });
  EXPECT_EQ(inner_calls, static_cast<int>(size / detail::kZstdPieceBytes) + 1);
  EXPECT_EQ(std::vector<uint8_t>(frame.begin(), frame.begin() + outer), at_once);
}

TEST(FormatTest, ZstdPayloadsAreExactlyOneFrame) {
  // The decoder accepts concatenated and skippable frames; the format allows one frame only.
  std::vector<std::byte> data(10000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 7 % 251);
  const CodecSpec zstd{Codec::Zstd, 3};
  std::vector<std::byte> frame(static_cast<size_t>(detail::compress_bound(Codec::Zstd, 10000)));
  frame.resize(static_cast<size_t>(detail::compress(zstd, data.data(), 10000, frame.data(),
                                                    static_cast<int64_t>(frame.size()))));
  std::vector<std::byte> back(20000);
  auto error_of_payload = [&](const std::vector<std::byte>& payload, int64_t decoded) {
    return message_of([&] {
      detail::decompress(Codec::Zstd, payload.data(), static_cast<int64_t>(payload.size()), back.data(), decoded,
                         "chunk 3");
    });
  };
  EXPECT_EQ(error_of_payload(frame, 10000), "(no error)");
  std::vector<std::byte> two = frame;
  two.insert(two.end(), frame.begin(), frame.end());
  EXPECT_NE(error_of_payload(two, 20000).find("chunk 3: the"), std::string::npos);
  EXPECT_NE(error_of_payload(two, 20000).find("not one zstd frame"), std::string::npos);
  // A skippable frame (magic 0x184D2A50, 4 bytes of content) in front of a real one.
  std::vector<std::byte> skippable = {std::byte{0x50}, std::byte{0x2A}, std::byte{0x4D}, std::byte{0x18},
                                      std::byte{4},    std::byte{0},    std::byte{0},    std::byte{0},
                                      std::byte{1},    std::byte{2},    std::byte{3},    std::byte{4}};
  skippable.reserve(skippable.size() + frame.size());  // gcc 12 warns falsely (-Warray-bounds) on a growing insert
  skippable.insert(skippable.end(), frame.begin(), frame.end());
  EXPECT_NE(error_of_payload(skippable, 10000).find("not one zstd frame"), std::string::npos);
  // A frame whose header names another size than the chunk table: refused before decoding.
  EXPECT_NE(error_of_payload(frame, 9000).find("the zstd frame holds 10000 bytes"), std::string::npos);
}

TEST(FormatTest, BoundsHelpersCannotOverflow) {
  EXPECT_TRUE(in_bounds(0, 10, 10));
  EXPECT_FALSE(in_bounds(1, 10, 10));
  EXPECT_FALSE(in_bounds(UINT64_MAX, 2, 10));
  EXPECT_FALSE(in_bounds(5, UINT64_MAX, 10));
  int64_t out = 0;
  EXPECT_FALSE(checked_mul(int64_t{1} << 40, int64_t{1} << 30, &out));
  EXPECT_FALSE(checked_add(INT64_MAX, 1, &out));
  EXPECT_TRUE(checked_mul(3, 4, &out));
  EXPECT_EQ(out, 12);
}

}  // namespace
}  // namespace mmt
