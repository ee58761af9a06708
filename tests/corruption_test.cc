// Trust no byte: damaged, truncated, foreign and hostile files give a clear FormatError (or
// ChecksumError) naming what and where, never a crash, a hang or an out-of-bounds read.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <random>

#include <lz4.h>

#include "checksum.h"
#include "crafted_file_util.h"
#include "mmtensor/loader.h"
#include "format.h"
#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "test_util.h"

namespace mmt {
namespace {

using testing::TempDir;
using testing::footer_of;
using testing::rewrite_entry;
using testing::reseal_payload;

std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars{std::istreambuf_iterator<char>(in), {}};
  std::vector<std::byte> bytes(chars.size());
  if (!chars.empty()) std::memcpy(bytes.data(), chars.data(), chars.size());  // data() may be null
  return bytes;
}

void write_file(const std::string& path, const std::vector<std::byte>& bytes, size_t length) {
  // A fresh file each time: ext4 flushes a file truncated and rewritten in place on close
  // (auto_da_alloc), which would make the sweeps below crawl.
  std::filesystem::remove(path);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(length));
}
void write_file(const std::string& path, const std::vector<std::byte>& bytes) { write_file(path, bytes, bytes.size()); }

// Small datasets with alignment 64, so every region is a few hundred bytes.
std::string write_fixed(const TempDir& dir, const std::string& codec = "none") {
  const std::string path = dir.file("fixed-" + codec + ".mmt");
  WriterOptions options;
  options.overwrite = true;
  options.alignment = 64;
  options.chunk_records = 16;  // 16 records * 4 bytes = one 64-byte unit: contiguous layout
  options.codec = CodecSpec::parse(codec);
  DatasetWriter writer = DatasetWriter::create(path, Schema({Field::fixed("x", kInt32, {})}), options);
  for (int i = 0; i < 40; ++i) writer.append({full({}, i * 3, kInt32)});
  writer.finish();
  return path;
}

std::string write_ragged(const TempDir& dir, const std::string& codec) {
  const std::string path = dir.file("ragged-" + codec + ".mmt");
  WriterOptions options;
  options.overwrite = true;
  options.alignment = 64;
  options.chunk_records = 4;
  options.codec = CodecSpec::parse(codec);
  DatasetWriter writer = DatasetWriter::create(
      path, Schema({Field::fixed("label", kInt64, {}), Field::ragged("tokens", kInt32, {kVariableDim}), Field::bytes("raw")}),
      options);
  for (int i = 0; i < 10; ++i)
    writer.append({full({}, i, kInt64), full({i % 4}, i, kInt32), full({(i * 3) % 7}, i + 1, kUInt8)});
  writer.finish();
  return path;
}

// Opens, verifies and reads every record in every way; throws what the reader throws.
void read_everything(const std::string& path, bool verify_checksums = true) {
  ReaderOptions options;
  options.verify_checksums = verify_checksums;
  options.verify_uncompressed = verify_checksums;  // sweeps check the read path hashes too
  options.cache_bytes = 256;
  Dataset ds = Dataset::open(path, options);
  for (int64_t i = 0; i < ds.size(); ++i) {
    Sample s = ds.get(i);
    for (size_t f = 0; f < s.size(); ++f) (void)s[f].to_double_vector();
  }
  for (const Field& field : ds.schema())
    if (field.is_fixed()) {
      (void)ds.column(field.name).to_double_vector();
      std::vector<int64_t> all(static_cast<size_t>(ds.size()));
      for (int64_t i = 0; i < ds.size(); ++i) all[static_cast<size_t>(i)] = ds.size() - 1 - i;
      (void)ds.get_batch(all, field.name, 2);
    }
  (void)ds.info();
  ds.verify();
}

std::string format_error_of(const std::string& path, bool verify_checksums = true) {
  try {
    read_everything(path, verify_checksums);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

TEST(CorruptionTest, GoodFilesReadCleanly) {
  TempDir dir;
  for (const char* codec : {"none", "lz4", "zstd"}) {
    EXPECT_NO_THROW(read_everything(write_fixed(dir, codec)));
    EXPECT_NO_THROW(read_everything(write_ragged(dir, codec)));
  }
}

TEST(CorruptionTest, TruncationAtEveryByteOffset) {
  TempDir dir;
  for (const std::string& original : {write_fixed(dir), write_ragged(dir, "lz4")}) {
    const std::vector<std::byte> bytes = read_file(original);
    const std::string path = dir.file("cut.mmt");
    for (size_t length = 0; length < bytes.size(); ++length) {
      write_file(path, bytes, length);
      std::string error = format_error_of(path);
      ASSERT_FALSE(error.empty()) << "truncated to " << length << " of " << bytes.size() << " bytes was accepted";
      if (length >= 8 + 72) {
        ASSERT_TRUE(error.find("truncated") != std::string::npos || error.find("unfinished") != std::string::npos)
            << length << ": " << error;
      }
    }
  }
}

// Every bit of the preamble, schema block, chunk table and footer is protected.
TEST(CorruptionTest, EveryBitFlipOfTheStructuresIsCaught) {
  TempDir dir;
  for (const std::string& original : {write_fixed(dir), write_ragged(dir, "zstd")}) {
    const std::vector<std::byte> bytes = read_file(original);
    const format::Footer footer = footer_of(bytes);
    std::vector<std::pair<size_t, size_t>> regions = {
        {0, format::kPreambleBytes},
        {footer.schema_offset, footer.schema_offset + footer.schema_bytes},
        {footer.chunk_table_offset, bytes.size()},  // the table, then the footer
    };
    const std::string path = dir.file("flip.mmt");
    for (auto [begin, end] : regions) {
      for (size_t at = begin; at < end; ++at) {
        for (int bit = 0; bit < 8; ++bit) {
          std::vector<std::byte> damaged = bytes;
          damaged[at] ^= static_cast<std::byte>(1 << bit);
          write_file(path, damaged);
          ASSERT_FALSE(format_error_of(path).empty()) << "flip of bit " << bit << " at byte " << at << " went unnoticed";
        }
      }
    }
  }
}

TEST(CorruptionTest, PayloadBitFlipsAreChecksumErrorsNamingTheChunk) {
  TempDir dir;
  for (const std::string& original : {write_fixed(dir), write_ragged(dir, "lz4")}) {
    const std::vector<std::byte> bytes = read_file(original);
    Dataset good = Dataset::open(original);
    const std::string path = dir.file("payload.mmt");
    for (int64_t c = 0; c < good.num_chunks(); ++c) {
      ChunkInfo chunk = good.chunk(c);
      for (int64_t at = chunk.file_offset; at < chunk.file_offset + chunk.stored_bytes; at += 3) {
        std::vector<std::byte> damaged = bytes;
        damaged[static_cast<size_t>(at)] ^= std::byte{0x10};
        write_file(path, damaged);
        try {
          read_everything(path);
          FAIL() << "flip at " << at << " in chunk " << c << " went unnoticed";
        } catch (const ChecksumError& e) {
          ASSERT_NE(std::string(e.what()).find("chunk " + std::to_string(c) + " "), std::string::npos) << e.what();
        }
        // Without checksums the decoders still stay inside their buffers.
        try {
          read_everything(path, /*verify_checksums=*/false);
        } catch (const FormatError&) {
        }
      }
    }
  }
}

// 60 records of a label and ragged tokens in chunks closed by size (records_per_chunk 0):
// a chunk table that is searched.
std::string write_chunks_closed_by_size(const TempDir& dir) {
  const std::string path = dir.file("by-size.mmt");
  WriterOptions options;
  options.alignment = 64;
  options.chunk_bytes = 512;
  DatasetWriter writer = DatasetWriter::create(
      path, Schema({Field::fixed("label", kInt64, {}), Field::ragged("tokens", kInt32, {kVariableDim})}), options);
  for (int i = 0; i < 60; ++i) writer.append({full({}, i, kInt64), full({(i * 7) % 40}, i, kInt32)});
  writer.finish();
  return path;
}

// Chunks closed by size that overlap, every entry's checksum valid: chunk 1 claims the last
// record of chunk 0 as its first. Searched for, that record lands in chunk 1, which holds it
// by its own entry, so it read as chunk 1's first record (another record's values) and export
// and repack copied the file on; verify refused it. Now the neighbours must agree.
TEST(CorruptionTest, ChunksThatOverlapAreRefusedWhenEitherIsRead) {
  TempDir dir;
  const std::string path = write_chunks_closed_by_size(dir);
  ChunkInfo first, second;
  {
    Dataset ds = Dataset::open(path);
    ASSERT_GE(ds.num_chunks(), 4);
    first = ds.chunk(0);
    second = ds.chunk(1);
  }
  std::vector<std::byte> bytes = read_file(path);
  rewrite_entry(bytes, 1, [&](format::ChunkEntry& e) { --e.first_record; });
  const std::string damaged = dir.file("overlapping.mmt");
  write_file(damaged, bytes);
  Dataset ds = Dataset::open(damaged);
  const int64_t shared = second.first_record - 1;  // chunk 0's last record, claimed by chunk 1 too
  EXPECT_THROW_WITH((void)ds.get(shared), FormatError,
                    detail::str(damaged, ": chunk 1 (table entry at byte offset "));
  EXPECT_THROW_WITH((void)ds.get(shared), FormatError,
                    detail::str(": starts at record ", shared, " but chunk 0 (by its table entry) holds records [0, +",
                                first.record_count, "); chunks hold records in order"));
  EXPECT_THROW_WITH((void)ds.get(0), FormatError,
                    detail::str(": chunk 0 (table entry at byte offset "));
  EXPECT_THROW_WITH((void)ds.get(0), FormatError,
                    detail::str(": holds records [0, +", first.record_count, ") but chunk 1 (by its table entry) starts "
                                "at record ", shared));
  // A neighbour whose entry is damaged (its checksum fails) is named, not the chunk read.
  std::vector<std::byte> flipped = read_file(path);
  const format::Footer footer = footer_of(flipped);
  flipped[footer.chunk_table_offset + format::kChunkEntryBytes + 24] ^= std::byte{1};  // chunk 1's first_record
  const std::string damaged_entry = dir.file("damaged-entry.mmt");
  write_file(damaged_entry, flipped);
  EXPECT_THROW_WITH((void)Dataset::open(damaged_entry).get(0), ChecksumError,
                    detail::str(damaged_entry, ": chunk 1: chunk table entry checksum mismatch"));
  // Chunks past the two read as before.
  const ChunkInfo fourth = Dataset::open(path).chunk(3);
  EXPECT_TRUE(ds.get(fourth.first_record)["label"].equal(full({}, fourth.first_record, kInt64)));
}

// A file whose chunks were closed by size has a chunk table that is searched: a damaged
// `first_record` sends the search to a chunk that does not hold the record. prefetch() (and
// so the loader's read-ahead) must report it as reading does, not compute an offset from it.
TEST(CorruptionTest, AChunkTableOutOfOrderIsReportedByPrefetchAsByReading) {
  TempDir dir;
  const std::string path = write_chunks_closed_by_size(dir);
  ChunkInfo second, third;
  {
    Dataset ds = Dataset::open(path);
    ASSERT_GE(ds.num_chunks(), 3);
    second = ds.chunk(1);
    third = ds.chunk(2);
  }
  std::vector<std::byte> bytes = read_file(path);
  rewrite_entry(bytes, 1, [&](format::ChunkEntry& e) { e.first_record = static_cast<uint64_t>(third.first_record); });
  const std::string damaged = dir.file("damaged.mmt");
  write_file(damaged, bytes);
  Dataset ds = Dataset::open(damaged);
  const std::vector<int64_t> one{second.first_record};  // searched for, it lands in chunk 0
  for (const std::string& message : {testing::error_of([&] { ds.prefetch(one); }),
                                     testing::error_of([&] { (void)ds.get(second.first_record); }),
                                     testing::error_of([&] { (void)ds.chunk_of(second.first_record); })})
    EXPECT_NE(message.find(": holds records [0, +" + std::to_string(second.first_record) +
                           ") but chunk 1 (by its table entry) starts at record " +
                           std::to_string(third.first_record) + "; chunks hold records in order"),
              std::string::npos)
        << message;
  // A quasi-random sampler reads the whole table: a FormatError naming the file, not the
  // Sampler's ValueError about its arguments.
  SamplerOptions quasi;
  quasi.kind = SamplerKind::QuasiRandom;
  EXPECT_THROW_WITH(Sampler::for_dataset(ds, quasi), FormatError, damaged + ": chunk 0 (table entry at byte offset");
  // The loader's hints swallow it; its gather reports it, naming the sample.
  LoaderOptions loader_options;
  loader_options.batch_size = 60;
  loader_options.read_ahead = ReadAhead::Always;
  Loader loader(ds, loader_options);
  EXPECT_THROW((void)loader.next(), FormatError);
}

// Entries checked one at a time bound each chunk's decoded size by its own stored bytes; two
// entries naming one payload would count those bytes twice, so column()'s copy of many
// chunks could be sized past anything the file holds. Its pre-pass refuses overlapping
// payloads, as verify() does.
TEST(CorruptionTest, ChunksSharingOnePayloadCannotSizeAColumnCopy) {
  TempDir dir;
  std::vector<std::byte> bytes = read_file(write_fixed(dir, "lz4"));
  const format::ChunkEntry first = format::peek_chunk_entry(bytes.data() + footer_of(bytes).chunk_table_offset);
  rewrite_entry(bytes, 1, [&](format::ChunkEntry& e) {
    e.file_offset = first.file_offset;
    e.stored_bytes = first.stored_bytes;
    e.decoded_bytes = first.decoded_bytes;
  });
  testing::reseal_payload(bytes, 1);  // chunk 1's checksum, seeded with its own index, holds
  const std::string path = dir.file("shared-payload.mmt");
  write_file(path, bytes);
  Dataset ds = Dataset::open(path);
  EXPECT_THROW_WITH((void)ds.column("x"), FormatError, "chunk 1's payload at byte");
  EXPECT_THROW_WITH((void)ds.column("x"), FormatError, "overlaps chunk 0's");
  EXPECT_THROW(ds.verify(), FormatError);
}

TEST(CorruptionTest, DecompressionBombIsRefusedBeforeAllocating) {
  TempDir dir;
  for (const char* codec : {"lz4", "zstd"}) {
    std::vector<std::byte> bytes = read_file(write_ragged(dir, codec));
    rewrite_entry(bytes, 1, [](format::ChunkEntry& e) { e.decoded_bytes = uint64_t{1} << 62; });
    const std::string path = dir.file("bomb.mmt");
    write_file(path, bytes);
    Dataset ds = Dataset::open(path);
    EXPECT_NO_THROW(ds.get(0));  // other chunks are fine
    try {
      ds.get(5);
      FAIL();
    } catch (const FormatError& e) {
      std::string message = e.what();
      EXPECT_NE(message.find("chunk 1"), std::string::npos) << message;
      EXPECT_NE(message.find("decompression bomb"), std::string::npos) << message;
    }
  }
}

// Under the 1 GiB cap, a chunk may still not claim more than its codec can make of its stored
// bytes: refused from the table entry, before any allocation or decode.
TEST(CorruptionTest, AChunkClaimingMoreThanItsCodecCanExpandIsRefused) {
  TempDir dir;
  for (const auto& [codec, expansion] : {std::pair{"lz4", uint64_t{255}}, std::pair{"zstd", uint64_t{32768}}}) {
    std::vector<std::byte> bytes = read_file(write_ragged(dir, codec));
    uint64_t stored = 0;
    rewrite_entry(bytes, 1, [&](format::ChunkEntry& e) {
      stored = e.stored_bytes;
      e.decoded_bytes = e.stored_bytes * expansion + 1;
    });
    ASSERT_LE(stored * expansion + 1, uint64_t{1} << 30) << "the test must stay under the cap";
    const std::string path = dir.file("expanded.mmt");
    write_file(path, bytes);
    Dataset ds = Dataset::open(path);
    EXPECT_NO_THROW(ds.get(0));
    EXPECT_THROW_WITH(ds.get(5), FormatError, "chunk 1 (table entry at byte offset");
    EXPECT_THROW_WITH(ds.get(5), FormatError, std::string("more than ") + codec + " can make of them");
    EXPECT_THROW_WITH(ds.verify(), FormatError, std::string("more than ") + codec + " can make of them");
  }
}

TEST(CorruptionTest, RaggedValueEndsThatGoBackAreCaughtBehindValidChecksums) {
  // Chunk 0 holds records 0-3 with 0, 1, 2 and 3 tokens: value ends 0, 1, 3, 6. Record 2's end
  // becomes 0, before its start, and the payload checksum is recomputed, as a buggy writer
  // would leave it. get(), ragged_column() and verify() all refuse it, naming where.
  TempDir dir;
  std::vector<std::byte> bytes = read_file(write_ragged(dir, "none"));
  const std::string path = dir.file("ends.mmt");
  ChunkInfo chunk;
  Schema schema;
  {
    write_file(path, bytes);
    Dataset ds = Dataset::open(path);
    chunk = ds.chunk(0);
    schema = ds.schema();
  }
  std::byte* payload = bytes.data() + chunk.file_offset;
  const format::RecordLayout layout = format::compute_record_layout(schema);
  const format::RaggedSection section = format::locate_ragged_section(
      payload, chunk.decoded_bytes, chunk.record_count, layout.record_stride_bytes, schema, layout, 0, 0);
  ASSERT_EQ(format::load_u64(payload + section.ends_offset + 8 * 2), 3u);
  const uint64_t zero = 0;
  std::memcpy(payload + section.ends_offset + 8 * 2, &zero, 8);
  rewrite_entry(bytes, 0, [&](format::ChunkEntry& e) {
    e.payload_checksum = format::payload_checksum(payload, chunk.stored_bytes, 0);
  });
  write_file(path, bytes);
  Dataset ds = Dataset::open(path);
  EXPECT_EQ(ds.get(1, "tokens").numel(), 1);  // its neighbours before it still read
  EXPECT_THROW_WITH(ds.get(2, "tokens"), FormatError, "chunk 0, field 'tokens': record 2 has value range [1, 0)");
  EXPECT_THROW_WITH(ds.ragged_column("tokens", 0, 4), FormatError, "record 2 has value range [1, 0)");
  EXPECT_THROW_WITH(ds.verify(), FormatError, "chunk 0, field 'tokens': record 2 has value range [1, 0)");
  // ...and where: the file offset of the bad value end.
  EXPECT_THROW_WITH(ds.get(2, "tokens"), FormatError,
                    "(byte offset " + std::to_string(chunk.file_offset + section.ends_offset + 16) + ")");
}

// A bool value byte other than 0 or 1 in a chunk whose checksum was made valid again, as a
// buggy writer would leave it: reads take it as true (never undefined behaviour), and verify()
// names the chunk, the field and the byte.
TEST(CorruptionTest, BoolBytesOtherThanZeroAndOneAreReportedByVerify) {
  TempDir dir;
  const std::string good_path = dir.file("bools.mmt");
  {
    WriterOptions options;
    options.alignment = 64;
    options.chunk_records = 4;
    DatasetWriter writer = DatasetWriter::create(
        good_path, Schema({Field::fixed("mask", kBool, {3}), Field::ragged("flags", kBool, {kVariableDim})}), options);
    for (int i = 0; i < 6; ++i) writer.append({full({3}, i % 2, kBool), full({i % 3 + 1}, 1, kBool)});
    writer.finish();
  }
  Dataset good = Dataset::open(good_path);
  EXPECT_NO_THROW(good.verify());
  const ChunkInfo chunk = good.chunk(1);  // records 4 and 5
  const Schema schema = good.schema();
  const format::RecordLayout layout = format::compute_record_layout(schema);
  struct Damage {
    const char* field;
    int64_t decoded_byte;  // record 4's element `element`, false (mask) or true (flags) before
    int64_t element;
  };
  const format::RaggedSection flags = format::locate_ragged_section(
      read_file(good_path).data() + chunk.file_offset, chunk.decoded_bytes, chunk.record_count,
      layout.record_stride_bytes, schema, layout, 0, 1);
  for (const Damage& damage : {Damage{"mask", layout.field_offset_bytes[0] + 2, 2},
                               Damage{"flags", flags.values_offset + 1, 1}}) {
    SCOPED_TRACE(damage.field);
    std::vector<std::byte> bytes = read_file(good_path);
    std::byte* payload = bytes.data() + chunk.file_offset;
    payload[damage.decoded_byte] = std::byte{7};
    testing::reseal_payload(bytes, 1);
    const std::string path = dir.file("bad-bools.mmt");
    write_file(path, bytes);
    Dataset ds = Dataset::open(path);
    EXPECT_TRUE(ds.get(4, damage.field).select(0, damage.element).item<bool>()) << "read as true, not refused";
    EXPECT_THROW_WITH(ds.verify(), FormatError,
                      std::string("chunk 1, field '") + damage.field + "': a bool value byte at decoded byte " +
                          std::to_string(damage.decoded_byte));
  }
}

TEST(CorruptionTest, SizeLiesAreCaught) {
  TempDir dir;
  const std::string path = dir.file("lie.mmt");
  struct Lie {
    const char* codec;
    std::function<void(format::ChunkEntry&)> change;
    const char* expected;
  };
  std::vector<Lie> lies = {
      {"lz4", [](auto& e) { e.decoded_bytes += 64; }, "declares"},
      {"zstd", [](auto& e) { e.decoded_bytes -= 8; }, "zstd"},
      {"none", [](auto& e) { e.stored_bytes += 1 << 20; }, "data region"},
      {"none", [](auto& e) { e.decoded_bytes += 1; }, "decoded bytes"},
      {"lz4", [](auto& e) { e.record_count += 1; }, "records"},
      {"lz4", [](auto& e) { e.first_record = 1; }, "records"},
      {"none", [](auto& e) { e.file_offset += 64; }, ""},
      {"none", [](auto& e) { e.file_offset += 1; }, "aligned"},
      {"lz4", [](auto& e) { e.codec = 9; }, "unknown codec"},
  };
  for (const Lie& lie : lies) {
    std::vector<std::byte> bytes = read_file(write_ragged(dir, lie.codec));
    rewrite_entry(bytes, 0, lie.change);
    write_file(path, bytes);
    std::string error = format_error_of(path);
    EXPECT_FALSE(error.empty()) << lie.codec << " " << lie.expected;
    EXPECT_NE(error.find(lie.expected), std::string::npos) << error;
  }
  // A ragged value's ends pointing past its chunk, with every checksum made valid again.
  {
    std::vector<std::byte> bytes = read_file(write_ragged(dir, "none"));
    Dataset good = Dataset::open(dir.file("ragged-none.mmt"));
    ChunkInfo chunk = good.chunk(0);
    // The tokens section starts right after the fixed region (4 records * 8 bytes), 64-aligned.
    uint64_t huge = uint64_t{1} << 40;
    std::memcpy(bytes.data() + chunk.file_offset + 64 + 8 * 3, &huge, 8);
    rewrite_entry(bytes, 0, [&](format::ChunkEntry& e) {
      e.payload_checksum = format::payload_checksum(bytes.data() + chunk.file_offset, chunk.stored_bytes, 0);
    });
    write_file(path, bytes);
    std::string error = format_error_of(path);
    EXPECT_NE(error.find("field 'tokens'"), std::string::npos) << error;
  }
}

TEST(CorruptionTest, AChunkMovedToAnotherPositionIsCaught) {
  TempDir dir;
  std::vector<std::byte> bytes = read_file(write_fixed(dir));
  Dataset good = Dataset::open(dir.file("fixed-none.mmt"));
  ChunkInfo a = good.chunk(0), b = good.chunk(1);
  ASSERT_EQ(a.stored_bytes, b.stored_bytes);
  std::vector<std::byte> swapped = bytes;
  std::memcpy(swapped.data() + a.file_offset, bytes.data() + b.file_offset, static_cast<size_t>(b.stored_bytes));
  std::memcpy(swapped.data() + b.file_offset, bytes.data() + a.file_offset, static_cast<size_t>(a.stored_bytes));
  const std::string path = dir.file("moved.mmt");
  write_file(path, swapped);
  // By default uncompressed chunks are not hashed on the read path (that would read a whole
  // chunk per zero-copy record); verify() still finds the move, and so does a reader that
  // opts into hashing them.
  EXPECT_THROW(Dataset::open(path).verify(), ChecksumError);
  ReaderOptions hash_uncompressed;
  hash_uncompressed.verify_uncompressed = true;
  Dataset ds = Dataset::open(path, hash_uncompressed);
  try {
    ds.get(0);
    FAIL();
  } catch (const ChecksumError& e) {
    EXPECT_NE(std::string(e.what()).find("chunk 0 "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("moved"), std::string::npos) << e.what();
  }
  // A table entry copied into another slot fails its own checksum.
  const format::Footer footer = footer_of(bytes);
  std::vector<std::byte> copied = bytes;
  std::memcpy(copied.data() + footer.chunk_table_offset, bytes.data() + footer.chunk_table_offset + 64, 64);
  write_file(path, copied);
  try {
    Dataset::open(path).get(0);
    FAIL();
  } catch (const ChecksumError& e) {
    EXPECT_NE(std::string(e.what()).find("chunk 0: chunk table entry checksum mismatch"), std::string::npos) << e.what();
  }
}

// The footer, schema block and preamble re-encoded with valid checksums after a change: the
// schema text keeps its length (the writer's free text is cut or padded), so no offset moves.
void rewrite_footer(std::vector<std::byte>& bytes, const std::function<void(format::Footer&)>& change) {
  format::Footer footer = footer_of(bytes);
  change(footer);
  format::encode_footer(footer, bytes.data() + bytes.size() - format::kFooterBytes);
}

void rewrite_schema(std::vector<std::byte>& bytes, format::SchemaBlock block) {
  const format::Footer footer = footer_of(bytes);
  block.writer.clear();
  const size_t bare = format::encode_schema_block(block).size();
  ASSERT_LE(bare, footer.schema_bytes);
  block.writer.assign(footer.schema_bytes - bare, 'w');
  const std::string json = format::encode_schema_block(block);
  ASSERT_EQ(json.size(), footer.schema_bytes);
  std::memcpy(bytes.data() + footer.schema_offset, json.data(), json.size());
  rewrite_footer(bytes, [&](format::Footer& f) { f.schema_checksum = detail::checksum64(json.data(), json.size()); });
  format::Preamble preamble = format::decode_preamble(bytes.data(), static_cast<int64_t>(bytes.size()));
  preamble.record_stride_bytes = static_cast<uint64_t>(format::compute_record_layout(block.schema).record_stride_bytes);
  format::encode_preamble(preamble, bytes.data());
}

format::SchemaBlock schema_block_of(const std::vector<std::byte>& bytes) {
  const format::Footer footer = footer_of(bytes);
  return format::decode_schema_block(
      std::string_view(reinterpret_cast<const char*>(bytes.data() + footer.schema_offset), footer.schema_bytes),
      static_cast<int64_t>(footer.schema_offset));
}

// Replaces `from` with `to` (no longer) in the schema block's text, padded with JSON
// whitespace after it so no offset moves, and reseals the block's checksum.
void edit_schema_text(std::vector<std::byte>& bytes, const std::string& from, std::string to) {
  const format::Footer footer = footer_of(bytes);
  std::string json(reinterpret_cast<const char*>(bytes.data() + footer.schema_offset), footer.schema_bytes);
  const size_t at = json.find(from);
  ASSERT_NE(at, std::string::npos) << json;
  ASSERT_LE(to.size(), from.size());
  to.resize(from.size(), ' ');
  json.replace(at, from.size(), to);
  std::memcpy(bytes.data() + footer.schema_offset, json.data(), json.size());
  rewrite_footer(bytes, [&](format::Footer& f) { f.schema_checksum = detail::checksum64(json.data(), json.size()); });
}

// Clears the preamble's contiguous-layout flag, which a file whose chunks were moved or
// compressed no longer earns.
void preamble_without_contiguous_flag(std::vector<std::byte>& bytes) {
  format::Preamble preamble = format::decode_preamble(bytes.data(), static_cast<int64_t>(bytes.size()));
  preamble.flags &= ~format::kFlagContiguousFixedLayout;
  format::encode_preamble(preamble, bytes.data());
}

// Replaces uncompressed chunk `c`'s payload with its lz4 block, where it lies (the rest of the
// old payload zeroed, as padding), and reseals the entry: a chunk another writer compressed.
void compress_chunk_with_lz4_in_place(std::vector<std::byte>& bytes, int64_t c) {
  const format::Footer footer = footer_of(bytes);
  const format::ChunkEntry entry = format::decode_chunk_entry(
      bytes.data() + footer.chunk_table_offset + c * format::kChunkEntryBytes, static_cast<uint64_t>(c));
  ASSERT_EQ(entry.codec, static_cast<uint8_t>(Codec::None));
  std::byte* payload = bytes.data() + entry.file_offset;
  std::vector<char> compressed(static_cast<size_t>(LZ4_compressBound(static_cast<int>(entry.stored_bytes))));
  const int compressed_bytes =
      LZ4_compress_default(reinterpret_cast<const char*>(payload), compressed.data(),
                           static_cast<int>(entry.stored_bytes), static_cast<int>(compressed.size()));
  ASSERT_GT(compressed_bytes, 0);
  ASSERT_LT(static_cast<uint64_t>(compressed_bytes), entry.stored_bytes);
  std::memset(payload, 0, entry.stored_bytes);
  std::memcpy(payload, compressed.data(), static_cast<size_t>(compressed_bytes));
  rewrite_entry(bytes, c, [&](format::ChunkEntry& e) {
    e.codec = static_cast<uint8_t>(Codec::LZ4);
    e.stored_bytes = static_cast<uint64_t>(compressed_bytes);
  });
  reseal_payload(bytes, c);
}

// A key twice in one object: nlohmann's parser keeps the last, another reader might keep the
// first, and the two would read different schemas from one checksummed block.
TEST(CorruptionTest, AKeyGivenTwiceInTheSchemaIsRefused) {
  TempDir dir;
  const std::string path = dir.file("meta.mmt");
  WriterOptions options;
  options.alignment = 64;
  options.metadata = {{"pad", std::string(40, 'x')}};
  DatasetWriter writer = DatasetWriter::create(path, Schema({Field::fixed("x", kInt32, {})}), options);
  writer.append({full({}, 1, kInt32)});
  writer.finish();
  std::vector<std::byte> bytes = read_file(path);
  edit_schema_text(bytes, "\"pad\":\"" + std::string(40, 'x') + "\"", "\"pad\":\"a\",\"pad\":\"b\"");
  write_file(path, bytes);
  EXPECT_THROW_WITH(Dataset::open(path), FormatError, "the key 'pad' appears twice in one object");
}

// nlohmann's parser skips a UTF-8 byte order mark before the schema's JSON, which strict JSON
// readers refuse: refused, so that every reader reads one checksummed block alike.
TEST(CorruptionTest, AByteOrderMarkBeforeTheSchemaIsRefused) {
  TempDir dir;
  const std::string path = dir.file("bom.mmt");
  WriterOptions options;
  options.metadata = {{"pad", std::string(40, 'x')}};
  DatasetWriter writer = DatasetWriter::create(path, Schema({Field::fixed("x", kInt32, {})}), options);
  writer.append({full({}, 1, kInt32)});
  writer.finish();
  std::vector<std::byte> bytes = read_file(path);
  const format::Footer footer = footer_of(bytes);
  std::string json(reinterpret_cast<const char*>(bytes.data() + footer.schema_offset), footer.schema_bytes);
  json.erase(json.find(std::string(40, 'x')), 3);  // room for the mark; no offset moves
  json.insert(0, "\xEF\xBB\xBF");
  std::memcpy(bytes.data() + footer.schema_offset, json.data(), json.size());
  rewrite_footer(bytes, [&](format::Footer& f) { f.schema_checksum = detail::checksum64(json.data(), json.size()); });
  write_file(path, bytes);
  EXPECT_THROW_WITH(Dataset::open(path), FormatError,
                    "the JSON text begins with a UTF-8 byte order mark, which the format does not allow");
}

// The schema's "codec" key is optional (another writer may leave it out, and chunks name
// their own codecs): info() then reports the chunks' codec, "differ" when they use several,
// where it said "none" for a file of lz4 chunks.
TEST(CorruptionTest, AFileWithoutTheCodecKeyReportsItsChunksCodecs) {
  TempDir dir;
  const std::string path = dir.file("nokey.mmt");
  WriterOptions options;
  options.alignment = 64;
  options.chunk_records = 4;
  DatasetWriter writer = DatasetWriter::create(path, Schema({Field::fixed("x", kInt32, {64})}), options);
  for (int i = 0; i < 8; ++i) writer.append({full({64}, i, kInt32)});
  writer.finish();
  std::vector<std::byte> bytes = read_file(path);
  // Chunk 1 compressed with lz4 where it lies: chunk 0 stays uncompressed, so the file's
  // records no longer lie back to back.
  ASSERT_NO_FATAL_FAILURE(compress_chunk_with_lz4_in_place(bytes, 1));
  preamble_without_contiguous_flag(bytes);
  const std::vector<std::byte> with_key = bytes;  // chunk 0 none, chunk 1 lz4
  edit_schema_text(bytes, "\"codec\":\"none\",", "");
  write_file(path, bytes);
  {
    const Dataset ds = Dataset::open(path);
    ds.verify();
    EXPECT_TRUE(ds.get(5)["x"].equal(full({64}, 5, kInt32)));
    const DatasetInfo info = ds.info();
    EXPECT_TRUE(info.codecs_differ);
    EXPECT_EQ(info.codec.codec, Codec::None);  // chunk 0's
  }
  // The key kept: what the writer was asked for, whatever the chunks hold.
  write_file(path, with_key);
  EXPECT_FALSE(Dataset::open(path).info().codecs_differ);
  // Every chunk lz4, no key: lz4.
  bytes = with_key;
  ASSERT_NO_FATAL_FAILURE(compress_chunk_with_lz4_in_place(bytes, 0));
  edit_schema_text(bytes, "\"codec\":\"none\",", "");
  write_file(path, bytes);
  const Dataset all_lz4 = Dataset::open(path);
  all_lz4.verify();
  EXPECT_FALSE(all_lz4.info().codecs_differ);
  EXPECT_EQ(all_lz4.info().codec.str(), "lz4");
}

// Payloads out of the chunk table's order are refused by verify() naming them, where the
// message blamed a "padding byte" that was the other chunk's payload.
TEST(CorruptionTest, PayloadsOutOfTheTablesOrderAreNamedByVerify) {
  TempDir dir;
  const std::string path = dir.file("order.mmt");
  WriterOptions options;
  options.alignment = 64;
  options.chunk_records = 4;
  DatasetWriter writer = DatasetWriter::create(path, Schema({Field::fixed("x", kInt32, {16})}), options);
  for (int i = 0; i < 8; ++i) writer.append({full({16}, i + 1, kInt32)});
  writer.finish();
  std::vector<std::byte> bytes = read_file(path);
  const format::Footer footer = footer_of(bytes);
  const auto entry_at = [&](int64_t c) {
    return format::decode_chunk_entry(bytes.data() + footer.chunk_table_offset + c * format::kChunkEntryBytes,
                                      static_cast<uint64_t>(c));
  };
  const format::ChunkEntry e0 = entry_at(0), e1 = entry_at(1);
  ASSERT_EQ(e0.stored_bytes, e1.stored_bytes);
  // The two payloads swap places, and their entries say so (each payload checksum is seeded
  // with its chunk's index, so each stays valid where it moves).
  std::vector<std::byte> first(bytes.begin() + static_cast<int64_t>(e0.file_offset),
                               bytes.begin() + static_cast<int64_t>(e0.file_offset + e0.stored_bytes));
  std::memmove(bytes.data() + e0.file_offset, bytes.data() + e1.file_offset, e1.stored_bytes);
  std::memcpy(bytes.data() + e1.file_offset, first.data(), first.size());
  rewrite_entry(bytes, 0, [&](format::ChunkEntry& e) { e.file_offset = e1.file_offset; });
  rewrite_entry(bytes, 1, [&](format::ChunkEntry& e) { e.file_offset = e0.file_offset; });
  preamble_without_contiguous_flag(bytes);
  write_file(path, bytes);
  const Dataset ds = Dataset::open(path);
  EXPECT_TRUE(ds.get(5)["x"].equal(full({16}, 6, kInt32)));  // each chunk reads where it lies
  EXPECT_THROW_WITH(ds.verify(), FormatError,
                    "chunk 1's payload (at byte offset " + std::to_string(e0.file_offset) +
                        ") lies before chunk 0's (at byte offset " + std::to_string(e1.file_offset) +
                        "); payloads must lie in the chunk table's order");
}

// A field name that the schema rules refuse for its control bytes is not echoed into the
// message that refuses it (a terminal would obey an escape sequence there).
TEST(CorruptionTest, AFieldNameOfControlBytesIsRefusedWithoutBeingPrinted) {
  TempDir dir;
  const std::string path = dir.file("name.mmt");
  WriterOptions options;
  options.alignment = 64;
  options.codec = CodecSpec::parse("zstd:19");  // room in the text for what replaces it below
  DatasetWriter writer = DatasetWriter::create(path, Schema({Field::fixed("abcdefghijkl", kFloat64, {})}), options);
  writer.append({full({}, 1, kFloat64)});
  writer.finish();
  const std::vector<std::byte> original = read_file(path);
  std::vector<std::byte> bytes = original;
  edit_schema_text(bytes, "\"abcdefghijkl\"", "\"\\u001b[2J\"");  // ESC [ 2 J: clear the screen
  write_file(path, bytes);
  const std::string message = testing::error_of([&] { (void)Dataset::open(path); });
  EXPECT_NE(message.find("control character"), std::string::npos) << message;
  EXPECT_EQ(message.find('\x1b'), std::string::npos) << message;
  // Nor any other text of the schema block: a dtype, a metadata key, the codec.
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"float64\"", "\"\\u001bx\""}, {"\"zstd:19\"", "\"\\u001bx\""}}) {
    std::vector<std::byte> edited = original;
    ASSERT_NO_FATAL_FAILURE(edit_schema_text(edited, from, to));
    write_file(path, edited);
    const std::string refused = testing::error_of([&] { (void)Dataset::open(path); });
    EXPECT_NE(refused.find("bytes not shown"), std::string::npos) << refused;
    EXPECT_EQ(refused.find('\x1b'), std::string::npos) << refused;
  }
}

TEST(CorruptionTest, AContiguousFileWithACompressedChunkIsRefused) {
  // Records of a contiguous file are read straight from the mapping: a chunk entry claiming a
  // codec there would have its compressed bytes served as values.
  TempDir dir;
  std::vector<std::byte> bytes = read_file(write_fixed(dir));
  ASSERT_TRUE(format::decode_preamble(bytes.data(), static_cast<int64_t>(bytes.size())).flags &
              format::kFlagContiguousFixedLayout);
  rewrite_entry(bytes, 1, [](format::ChunkEntry& e) { e.codec = static_cast<uint8_t>(Codec::LZ4); });
  const std::string path = dir.file("contiguous-lz4.mmt");
  write_file(path, bytes);
  EXPECT_NE(format_error_of(path, false).find("chunk 1"), std::string::npos);
  Dataset ds = Dataset::open(path);
  for (auto read : std::vector<std::function<void()>>{[&] { ds.get(20); }, [&] { (void)ds.column("x"); },
                                                      [&] { (void)ds.column("x", 16, 17); }, [&] { ds.verify(); }}) {
    EXPECT_THROW_WITH(read(), FormatError, "contiguous layout stores every chunk uncompressed");
  }
  EXPECT_NO_THROW(ds.column("x", 0, 16));  // chunk 0 is sound
}

TEST(CorruptionTest, ARecordCountNoChunkHoldsIsRefusedAtOpen) {
  // With chunks of varying size the footer's count is bounded only by 2^32 - 1 records per
  // chunk; a count past the last chunk's end would size column()'s copy before any check.
  TempDir dir;
  const std::string good = dir.file("varying.mmt");
  {
    WriterOptions options;
    options.alignment = 64;
    options.chunk_bytes = 128;
    DatasetWriter writer =
        DatasetWriter::create(good, Schema({Field::fixed("x", kInt64, {}), Field::bytes("raw")}), options);
    for (int i = 0; i < 50; ++i) writer.append({full({}, i, kInt64), full({i % 5}, i, kUInt8)});
    writer.finish();
  }
  std::vector<std::byte> bytes = read_file(good);
  ASSERT_EQ(format::decode_preamble(bytes.data(), static_cast<int64_t>(bytes.size())).records_per_chunk, 0u);
  ASSERT_GT(footer_of(bytes).chunk_count, 2u);
  rewrite_footer(bytes, [](format::Footer& f) { f.record_count = uint64_t{1} << 32; });
  const std::string path = dir.file("overcounted.mmt");
  write_file(path, bytes);
  try {
    Dataset::open(path);
    FAIL() << "opened a file counting records that no chunk holds";
  } catch (const FormatError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("the last chunk"), std::string::npos) << message;
    EXPECT_NE(message.find("4294967296 records"), std::string::npos) << message;
  }
}

// Ten records of one ragged int32 field ("tokens", record i holds i % 4 values), 64-byte
// alignment, `chunk_records` to a chunk.
std::string write_tokens(const std::string& path, int64_t chunk_records, const std::string& codec) {
  WriterOptions options;
  options.alignment = 64;
  options.chunk_records = chunk_records;
  options.codec = CodecSpec::parse(codec);
  DatasetWriter writer = DatasetWriter::create(path, Schema({Field::ragged("tokens", kInt32, {kVariableDim})}), options);
  for (int i = 0; i < 10; ++i) writer.append({full({i % 4}, i, kInt32)});
  writer.finish();
  return path;
}

TEST(CorruptionTest, RaggedRecordsNoChunkCanHoldAreRefusedAtOpen) {
  // Fixed chunking too: a file of one small chunk whose preamble, footer and entry all claim
  // 2^32 - 1 records (checksums valid) used to open with that size(), and ragged_column()
  // over it then sized 32 GiB of offsets. Each record needs at least its value end and
  // extents in the chunk (FORMAT.md, check 14), and the last entry is checked at open.
  TempDir dir;
  for (const std::string codec : {"none", "lz4"}) {
    std::vector<std::byte> bytes = read_file(write_tokens(dir.file("one-chunk-" + codec + ".mmt"), 10, codec));
    constexpr uint64_t kClaimed = 0xffffffffu;
    format::Preamble preamble = format::decode_preamble(bytes.data(), static_cast<int64_t>(bytes.size()));
    ASSERT_EQ(preamble.records_per_chunk, 10u);
    preamble.records_per_chunk = kClaimed;
    format::encode_preamble(preamble, bytes.data());
    rewrite_footer(bytes, [](format::Footer& f) { f.record_count = kClaimed; });
    rewrite_entry(bytes, 0, [](format::ChunkEntry& e) { e.record_count = kClaimed; });
    const std::string path = dir.file("overclaimed-" + codec + ".mmt");
    write_file(path, bytes);
    EXPECT_THROW_WITH(Dataset::open(path), FormatError, "4294967295 records take at least 16 bytes each");
  }
}

// The same lie in a chunk other than the last, which open does not read: 2^32 - 1 records
// claimed by chunk 0 of two. ragged_column() over them used to size its offsets from the
// claim before reading the chunk (bad_alloc); it sizes them as chunks prove their records.
TEST(CorruptionTest, RaggedRecordsAnEarlierChunkCannotHoldAreAFormatErrorNotAnAllocation) {
  TempDir dir;
  std::vector<std::byte> bytes = read_file(write_tokens(dir.file("two-chunks.mmt"), 5, "none"));
  constexpr uint64_t kClaimed = 0xffffffffu;
  // Footer and preamble change together: each alone disagrees with the other.
  format::Footer footer = footer_of(bytes);
  format::Preamble preamble = format::decode_preamble(bytes.data(), static_cast<int64_t>(bytes.size()));
  preamble.records_per_chunk = kClaimed;
  format::encode_preamble(preamble, bytes.data());
  footer.record_count = kClaimed + 5;
  format::encode_footer(footer, bytes.data() + bytes.size() - format::kFooterBytes);
  rewrite_entry(bytes, 0, [](format::ChunkEntry& e) { e.record_count = kClaimed; });
  rewrite_entry(bytes, 1, [](format::ChunkEntry& e) { e.first_record = kClaimed; });
  const std::string path = dir.file("overclaimed.mmt");
  write_file(path, bytes);
  Dataset ds = Dataset::open(path);  // the last chunk is sound
  EXPECT_THROW_WITH(ds.ragged_column("tokens", 0, static_cast<int64_t>(kClaimed)), FormatError,
                    "4294967295 records take at least 16 bytes each");
  EXPECT_EQ(ds.get(kClaimed + 2, "tokens").numel(), 3);  // record 7 of the original (7 % 4 tokens), in the sound chunk
}

TEST(CorruptionTest, ARecordStrideNoChunkCanHoldIsRefusedAtOpen) {
  // A schema whose records are larger than any chunk can be (checksums made valid again):
  // refused at open, before column() or get_batch() size an allocation by it.
  TempDir dir;
  std::vector<std::byte> bytes = read_file(write_ragged(dir, "zstd"));
  format::SchemaBlock block = schema_block_of(bytes);
  std::vector<Field> fields(block.schema.begin(), block.schema.end());
  fields[0] = Field::fixed("label", kInt64, {int64_t{1} << 38});
  block.schema = Schema(fields);
  rewrite_schema(bytes, block);
  const std::string path = dir.file("huge-stride.mmt");
  write_file(path, bytes);
  EXPECT_THROW_WITH(Dataset::open(path), FormatError, "cannot fit in a chunk");
}

TEST(CorruptionTest, RaggedExtentsWhoseStridesOverflowAreAFormatError) {
  // A value with an empty dimension has no elements, yet its other extents still set its
  // strides: [0, 2^40, 2^40] would need a stride of 2^80.
  TempDir dir;
  const std::string good = dir.file("cube.mmt");
  const uint64_t planted[3] = {0, 12345, 54321};
  {
    WriterOptions options;
    options.alignment = 64;
    DatasetWriter writer = DatasetWriter::create(
        good, Schema({Field::ragged("cube", kUInt8, {kVariableDim, kVariableDim, kVariableDim})}), options);
    writer.append({empty({0, 12345, 54321}, kUInt8)});
    writer.append({full({2, 2, 2}, 1, kUInt8)});
    writer.finish();
  }
  std::vector<std::byte> bytes = read_file(good);
  Dataset dataset = Dataset::open(good);
  const ChunkInfo chunk = dataset.chunk(0);
  std::byte* payload = bytes.data() + chunk.file_offset;
  std::byte* const payload_end = payload + chunk.stored_bytes;
  std::byte* extents = std::search(payload, payload_end, reinterpret_cast<const std::byte*>(planted),
                                   reinterpret_cast<const std::byte*>(planted) + sizeof planted);
  ASSERT_NE(extents, payload_end) << "the record's extents were not found in its chunk";
  const uint64_t hostile[3] = {0, uint64_t{1} << 40, uint64_t{1} << 40};
  std::memcpy(extents, hostile, sizeof hostile);
  rewrite_entry(bytes, 0, [&](format::ChunkEntry& e) {
    e.payload_checksum = format::payload_checksum(payload, chunk.stored_bytes, 0);
  });
  const std::string path = dir.file("overflowing-cube.mmt");
  write_file(path, bytes);
  Dataset ds = Dataset::open(path);
  for (auto read : std::vector<std::function<void()>>{[&] { ds.get(0); }, [&] { ds.verify(); }}) {
    try {
      read();
      FAIL() << "strides of 2^80 elements were accepted";
    } catch (const FormatError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("field 'cube'"), std::string::npos) << message;
      EXPECT_NE(message.find("overflow"), std::string::npos) << message;
    }
  }
  EXPECT_TRUE(ds.get(1)[0].equal(full({2, 2, 2}, 1, kUInt8)));
}

TEST(CorruptionTest, ForeignAndUnfinishedFiles) {
  TempDir dir;
  const std::string path = dir.file("foreign");
  auto error_for = [&](const std::string& content) {
    std::vector<std::byte> bytes(content.size());
    if (!content.empty()) std::memcpy(bytes.data(), content.data(), content.size());  // data() may be null
    write_file(path, bytes);
    return format_error_of(path);
  };
  EXPECT_NE(error_for("").find("empty file"), std::string::npos);
  EXPECT_NE(error_for("hello, world\n").find("not an mmtensor dataset"), std::string::npos);
  EXPECT_NE(error_for("\x93NUMPY\x01\x00" + std::string(200, ' ')).find("not an mmtensor dataset"), std::string::npos);
  EXPECT_NE(error_for(std::string(500, '\0')).find("not an mmtensor dataset"), std::string::npos);
  // What a writer killed before finish() leaves: chunks but no schema, table or footer.
  std::vector<std::byte> bytes = read_file(write_ragged(dir, "lz4"));
  const format::Footer footer = footer_of(bytes);
  write_file(path, bytes, footer.schema_offset);
  EXPECT_NE(format_error_of(path).find("unfinished"), std::string::npos);
  // Bytes appended after a finished file.
  std::vector<std::byte> longer = bytes;
  longer.resize(bytes.size() + 10);
  write_file(path, longer);
  EXPECT_FALSE(format_error_of(path).empty());
}

TEST(CorruptionTest, ANewerFormatVersionIsRefusedByName) {
  TempDir dir;
  std::vector<std::byte> bytes = read_file(write_fixed(dir));
  format::Preamble p = format::decode_preamble(bytes.data(), static_cast<int64_t>(bytes.size()));
  p.format_version = 7;
  format::encode_preamble(p, bytes.data());
  const std::string path = dir.file("v7.mmt");
  write_file(path, bytes);
  try {
    Dataset::open(path);
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": format version 7 is newer than this reader (supports 1)");
  }
}

TEST(CorruptionTest, RandomDamageNeverEscapesAsAnythingButAFormatError) {
  TempDir dir;
  std::mt19937_64 rng(1234);
  const std::string path = dir.file("random.mmt");
  for (const std::string& original : {write_fixed(dir, "lz4"), write_ragged(dir, "zstd"), write_ragged(dir, "none")}) {
    const std::vector<std::byte> bytes = read_file(original);
    for (int round = 0; round < 400; ++round) {
      std::vector<std::byte> damaged = bytes;
      int changes = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < changes; ++k) damaged[rng() % damaged.size()] = static_cast<std::byte>(rng());
      write_file(path, damaged);
      for (bool verify : {true, false}) {
        try {
          read_everything(path, verify);
        } catch (const FormatError&) {
        }
      }
    }
  }
}

}  // namespace
}  // namespace mmt
