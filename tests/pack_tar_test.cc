// WebDataset shards as pack sources (PackSources::from_tars): samples grouped by key, one
// field per extension, "cls" as int64, keys, pax and GNU long names, and every kind of bad
// archive refused with the archive, the byte and what is wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <zstd.h>

#include "decompressed_file.h"
#include "importer_test_util.h"
#include "tar_test_util.h"
#include "mmtensor/dataset.h"
#include "mmtensor/error.h"
#include "mmtensor/numpy_io.h"
#include "mmtensor/packer.h"
#include "test_util.h"

namespace mmt {
namespace {

using testutil::Bytes;
using testutil::TarBuilder;
using testutil::TempFolder;
using testutil::text_of;
using testutil::to_bytes;
using testutil::write_file;

TarBuilder three_samples() {
  TarBuilder tar;
  for (int i = 0; i < 3; ++i) {
    const std::string key = "part/" + std::to_string(i);
    tar.add(key + ".jpg", std::string(static_cast<size_t>(i) * 700, static_cast<char>('a' + i)))
        .add(key + ".cls", " " + std::to_string(i * 10 - 5) + "\n")
        .add(key + ".JSON", "{\"i\": " + std::to_string(i) + "}");
  }
  return tar;
}

TEST(PackTar, OneRecordPerSampleOneFieldPerExtensionClsAsInt64) {
  TempFolder dir;
  TarBuilder first = three_samples();
  first.add("part/", "", '5').add("README", "no dot: not a sample's").add("part/.DS_Store", "hidden");
  write_file(dir / "a.tar", first.finish());
  TarBuilder second;
  second.add("z.jpg", "zz").add("z.cls", "7").add("z.json", "{}");
  write_file(dir / "b.tar", second.finish());

  const PackSources sources = PackSources::from_tars({dir / "a.tar", dir / "b.tar"}, {.keys = true});
  ASSERT_EQ(sources.records(), 4);
  EXPECT_EQ(sources.hidden_skipped(), 2);  // README and .DS_Store (folders are passed over)
  std::vector<std::string> names;
  for (const Field& f : sources.schema().fields()) names.push_back(f.name);
  EXPECT_EQ(names, (std::vector<std::string>{"cls", "jpg", "json", "__key__"}));  // lower-cased, in order
  EXPECT_EQ(sources.schema()[0].dtype, kInt64);
  EXPECT_EQ(sources.metadata().at("source"), "webdataset");

  const std::string out = dir / "out.mmt";
  pack_dataset(out, sources, {});
  const Dataset ds = Dataset::open(out);
  ASSERT_EQ(ds.size(), 4);
  for (int i = 0; i < 3; ++i) {
    const Sample s = ds[i];
    EXPECT_EQ(s["cls"].item<int64_t>(), i * 10 - 5);
    EXPECT_EQ(text_of(s["jpg"]), std::string(static_cast<size_t>(i) * 700, static_cast<char>('a' + i)));
    EXPECT_EQ(text_of(s["json"]), "{\"i\": " + std::to_string(i) + "}");
    EXPECT_EQ(text_of(s["__key__"]), "part/" + std::to_string(i));
  }
  EXPECT_EQ(text_of(ds[3]["__key__"]), "z");
  EXPECT_EQ(ds[3]["cls"].item<int64_t>(), 7);
  EXPECT_EQ(compare_with_sources(ds, sources), 4);
  // A class is the int64 its text says, to the last digit (no double between: 2^53 + 1 stays).
  TarBuilder extremes;
  const std::vector<int64_t> classes{(int64_t{1} << 53) + 1, std::numeric_limits<int64_t>::max(),
                                     std::numeric_limits<int64_t>::min(), -123456789012345679};
  for (size_t k = 0; k < classes.size(); ++k)
    extremes.add("s" + std::to_string(k) + ".cls", std::to_string(classes[k])).add("s" + std::to_string(k) + ".jpg", "j");
  write_file(dir / "extremes.tar", extremes.finish());
  pack_dataset(dir / "extremes.mmt", PackSources::from_tars({dir / "extremes.tar"}), {});
  const Dataset packed_classes = Dataset::open(dir / "extremes.mmt");
  for (size_t k = 0; k < classes.size(); ++k)
    EXPECT_EQ(packed_classes[static_cast<int64_t>(k)]["cls"].item<int64_t>(), classes[k]) << k;
  // Where a value comes from names the member and its archive.
  EXPECT_NE(sources.record_origin(1, 2).find("member 'part/2.jpg' of " + dir / "a.tar"), std::string::npos)
      << sources.record_origin(1, 2);
  // Values view the mapped archive: no copy per record.
  const std::vector<Tensor> values = sources.record(1);
  EXPECT_EQ(values[1].untyped_storage().filename(), dir / "a.tar");
}

// Tar archives are packed alone: an input of another kind beside them is named as such
// before any archive is read (a NAME=PATH array, a field name given to an archive, a Megatron
// prefix; each was reported as a file that cannot be opened), an archive given twice is
// refused, and an extension too long for a field name is named with the archives it came from.
TEST(PackTar, InputsOfOtherKindsArchivesGivenTwiceAndLongExtensionsAreNamed) {
  TempFolder dir;
  write_file(dir / "a.tar", three_samples().finish());
  save_npy(dir / "x.npy", arange(3));
  const std::string a = dir / "a.tar", x = dir / "x.npy";
  EXPECT_THROW_WITH(PackSources::from_inputs(std::vector<std::string>{a, "x=" + x}), ValueError,
                    "input 'x=" + x + "' gives a field name (NAME=PATH), as array inputs do; tar archives name their "
                    "fields themselves and are packed alone, not with other inputs: give them without NAME=");
  EXPECT_THROW_WITH(PackSources::from_inputs(std::vector<std::string>{"t=" + a}), ValueError,
                    "input 't=" + a + "' gives a field name (NAME=PATH)");
  write_file(dir / "p.idx", to_bytes("MMIDIDX\0\0"));
  EXPECT_THROW_WITH(PackSources::from_tars({a, dir / "p"}), ValueError,
                    "input '" + (dir / "p") + "' is the prefix of a Megatron dataset (" + (dir / "p.idx") +
                        "); tar archives are packed alone, not with other inputs");
  EXPECT_THROW_WITH(PackSources::from_tars({a, dir.path() + "/./a.tar"}), ValueError,
                    "input '" + dir.path() + "/./a.tar' is " + a + " again; each tar archive is packed once");

  TarBuilder long_extension;
  long_extension.pax({{"path", "s." + std::string(300, 'x')}}).add("ignored", "data");
  write_file(dir / "long.tar", long_extension.finish());
  const PackSources sources = PackSources::from_tars({dir / "long.tar"});
  EXPECT_THROW_WITH(pack_dataset(dir / "long.mmt", sources, {}), ValueError,
                    "(300 bytes)' of " + (dir / "long.tar"));
  EXPECT_THROW_WITH(pack_dataset(dir / "long.mmt", sources, {}), ValueError,
                    ": a field name is at most 251 bytes (mmt export writes it to NAME.npy)");
  EXPECT_FALSE(std::filesystem::exists(dir / "long.mmt"));
}

TEST(PackTar, PaxAndGnuLongNamesAndPaxSizes) {
  TempFolder dir;
  const std::string long_key = "shard/" + std::string(150, 'k');
  TarBuilder tar;
  tar.pax({{"path", long_key + ".txt"}, {"mtime", "1.5"}}).add("ignored-short-name.txt", "pax named");
  tar.add("././@LongLink", long_key + ".cls" + std::string(1, '\0'), 'L').add("ignored", "3");
  tar.add("g", "comment=x\n", 'g');  // a global header: passed over
  tar.add("other.txt", "x").add("other.cls", "4");
  write_file(dir / "a.tar", tar.finish());
  PackSources sources = PackSources::from_tars({dir / "a.tar"}, {.keys = true});
  ASSERT_EQ(sources.records(), 2);
  std::vector<Tensor> values = sources.record(0);
  EXPECT_EQ(values[0].item<int64_t>(), 3);
  EXPECT_EQ(text_of(values[1]), "pax named");
  EXPECT_EQ(text_of(values[2]), long_key);
}

TEST(PackTar, SamplesThatDifferFromTheFirstAreRefusedNamingThem) {
  TempFolder dir;
  const auto refuse = [&](TarBuilder tar, const std::string& text) {
    write_file(dir / "bad.tar", tar.finish());
    EXPECT_THROW_WITH(PackSources::from_tars({dir / "bad.tar"}), ValueError, text);
  };
  TarBuilder missing = three_samples();
  missing.add("part/9.jpg", "x").add("part/9.cls", "1");
  refuse(missing, "bad.tar: sample 'part/9' (header at byte");
  refuse(missing, "has no '.json' member, which the first sample ('part/0' of");
  TarBuilder extra = three_samples();
  extra.add("part/9.jpg", "x").add("part/9.cls", "1").add("part/9.json", "{}").add("part/9.txt", "t");
  refuse(extra, "has a '.txt' member, which the first sample");
  TarBuilder twice;
  twice.add("a.jpg", "1").add("a.jpg", "2");
  refuse(twice, "sample 'a' (header at byte 0) has two '.jpg' members (headers at bytes 0 and 1024)");
  TarBuilder not_a_number;
  not_a_number.add("a.cls", "cat");
  refuse(not_a_number, "its .cls member (byte 512) is not an integer in decimal text");
  TarBuilder nothing;
  nothing.add("README", "x").add("dir/", "", '5');
  refuse(nothing, "no samples (no member named KEY.EXTENSION; 1 other members were skipped)");
}

TEST(PackTar, LinksDevicesAndBadHeadersAreFormatErrorsNamingTheByte) {
  TempFolder dir;
  const auto refuse = [&](const Bytes& bytes, const std::string& text) {
    write_file(dir / "bad.tar", bytes);
    EXPECT_THROW_WITH(PackSources::from_tars({dir / "bad.tar"}), FormatError, text);
  };
  TarBuilder link;
  link.add("a.jpg", "x").add("b.jpg", "", '2');
  refuse(link.finish(), "bad.tar: byte 1024: member 'b.jpg' is a symbolic link; only regular files can be packed");
  TarBuilder checksum;
  checksum.add("a.jpg", "x").add("b.jpg", "y");
  Bytes damaged = checksum.finish();
  damaged[1024 + 3] = std::byte{'X'};  // in b.jpg's name
  refuse(damaged, "bad.tar: byte 1024: the header's checksum does not hold (damaged)");
  TarBuilder pax_only;
  pax_only.add("a.jpg", "x").pax({{"path", "b.jpg"}});
  refuse(pax_only.finish(), "an extended header is followed by no member");
  TarBuilder bad_pax;
  bad_pax.add("h", "8 path=x\n", 'x').add("a.jpg", "x");  // LEN says 8, the record is 9
  refuse(bad_pax.finish(), "byte 0: a pax header record is malformed");
  // A gzip stream that is not one: named as such, before any member is read.
  write_file(dir / "gz.tar.gz", to_bytes(std::string("\x1f\x8b\x08\x00", 4) + std::string(600, '\0')));
  EXPECT_THROW_WITH(PackSources::from_tars({dir / "gz.tar.gz"}), FormatError, dir / "gz.tar.gz");
  EXPECT_THROW_WITH(PackSources::from_inputs(std::vector<std::string>{dir / "gz.tar.gz"}), FormatError, dir / "gz.tar.gz");
  EXPECT_THROW_WITH(PackSources::from_tars({dir / "missing.tar"}), IoError, "missing.tar");
}

// The bytes of `in` as zstd frames of at most `frame_bytes` each, one after another (as zstd
// -T0 or a concatenation of .zst files writes them).
Bytes zstd_frames(const Bytes& in, size_t frame_bytes) {
  Bytes out;
  for (size_t at = 0; at < in.size(); at += frame_bytes) {
    const size_t n = std::min(frame_bytes, in.size() - at);
    Bytes frame(ZSTD_compressBound(n));
    const size_t made = ZSTD_compress(frame.data(), frame.size(), in.data() + at, n, 3);
    frame.resize(made);
    out.insert(out.end(), frame.begin(), frame.end());
  }
  return out;
}

TEST(PackTar, GzipAndZstdArchivesAreDecompressedIntoAScratchFile) {
  TempFolder dir;
  const Bytes plain = three_samples().finish();
  write_file(dir / "a.tar.gz", testutil::gzip_bytes(plain));
  write_file(dir / "b.tar.zst", zstd_frames(plain, 1000));  // several frames
  write_file(dir / "c.tar", plain);
  const std::vector<std::string> specs{dir / "a.tar.gz", dir / "b.tar.zst", dir / "c.tar"};
  EXPECT_TRUE(are_tar_inputs(specs));
  const PackSources sources = PackSources::from_inputs(specs);
  ASSERT_EQ(sources.records(), 9);
  for (int64_t r = 0; r < 9; ++r)
    EXPECT_EQ(text_of(sources.record(r)[1]), std::string(static_cast<size_t>(r % 3) * 700, static_cast<char>('a' + r % 3)));
  // Decompressed bytes are mapped from a scratch file named after the archive.
  const std::string name = sources.record(4)[1].untyped_storage().filename();
  EXPECT_NE(name.find(dir / "b.tar.zst" + " (decompressed into a temporary file in "), std::string::npos) << name;
  EXPECT_NE(sources.record_origin(1, 0).find(dir / "a.tar.gz"), std::string::npos) << sources.record_origin(1, 0);

  // An archive of exactly 2 MiB (as tar's 10240-byte records make them) in one frame: the
  // frame ends as the output block fills; and pzstd's skippable frame before a frame.
  Bytes whole = plain;
  whole.resize(size_t{2} << 20, std::byte{0});  // zeros past the end-of-archive marker
  write_file(dir / "exact.tar.zst", zstd_frames(whole, whole.size()));
  EXPECT_EQ(PackSources::from_tars({dir / "exact.tar.zst"}).records(), 3);
  Bytes skippable = to_bytes(std::string("\x50\x2a\x4d\x18\x04\x00\x00\x00" "pzst", 12));
  const Bytes frames = zstd_frames(plain, 4096);
  skippable.insert(skippable.end(), frames.begin(), frames.end());
  write_file(dir / "p.tar.zst", skippable);
  EXPECT_EQ(PackSources::from_tars({dir / "p.tar.zst"}).records(), 3);

  // Cut short, not a tar inside, another compressor, nowhere to decompress to: each named.
  const Bytes gz = testutil::gzip_bytes(plain), zst = zstd_frames(plain, 1 << 20);
  write_file(dir / "cut.tar.gz", Bytes(gz.begin(), gz.end() - 20));
  EXPECT_THROW_WITH(PackSources::from_tars({dir / "cut.tar.gz"}), FormatError, dir / "cut.tar.gz");
  write_file(dir / "cut.tar.zst", Bytes(zst.begin(), zst.end() - 20));
  EXPECT_THROW_WITH(PackSources::from_tars({dir / "cut.tar.zst"}), FormatError, "the zstd stream is cut short");
  Bytes junk(zst.begin(), zst.begin() + 4);
  junk.resize(68, std::byte{0x55});
  write_file(dir / "junk.tar.zst", junk);
  EXPECT_THROW_WITH(PackSources::from_tars({dir / "junk.tar.zst"}), FormatError, "a corrupt zstd stream");
  write_file(dir / "text.tar.gz", testutil::gzip_bytes(to_bytes(std::string(2000, 'x'))));
  EXPECT_THROW_WITH(PackSources::from_tars({dir / "text.tar.gz"}), ValueError,
                    "decompresses to something that is not a tar archive");
  write_file(dir / "b.tar.bz2", to_bytes("BZh91AY&SY" + std::string(600, '\0')));
  EXPECT_THROW_WITH(PackSources::from_inputs(std::vector<std::string>{dir / "b.tar.bz2"}), ValueError,
                    "a bzip2-compressed tar archive");
  {
    const testing::ScopedEnv missing("TMPDIR", dir / "missing");
    EXPECT_THROW_WITH(PackSources::from_tars({dir / "a.tar.gz"}), IoError, "no temporary folder to decompress this file into");
  }
}

// Compressed archives past the scratch budget (MMT_SCRATCH_BYTES; half of $TMPDIR's free
// space by default) are dropped once read and decompressed again when their records are
// packed: the same records, with about one archive in $TMPDIR at a time.
TEST(PackTar, ArchivesPastTheScratchBudgetAreDecompressedAgainWhenPacked) {
  TempFolder dir;
  std::vector<std::string> specs;
  for (int a = 0; a < 3; ++a) {
    TarBuilder tar;
    for (int i = 0; i < 4; ++i)
      tar.add("s" + std::to_string(a * 4 + i) + ".txt", std::string(5000, static_cast<char>('a' + a)))
          .add("s" + std::to_string(a * 4 + i) + ".cls", std::to_string(a * 4 + i));
    specs.push_back(dir / ("part" + std::to_string(a) + ".tar.gz"));
    write_file(specs.back(), testutil::gzip_bytes(tar.finish()));
  }
  const testing::ScopedEnv budget("MMT_SCRATCH_BYTES", "1K");  // less than one archive: only the one in use
  const PackSources sources = PackSources::from_tars(specs);
  ASSERT_EQ(sources.records(), 12);
  for (int64_t r : {0, 11, 4, 5, 0}) {  // out of order too: each archive made again as needed
    const std::vector<Tensor> values = sources.record(r);
    EXPECT_EQ(values[0].item<int64_t>(), r);
    EXPECT_EQ(text_of(values[1]), std::string(5000, static_cast<char>('a' + r / 4)));
  }
  pack_dataset(dir / "out.mmt", sources, {});
  EXPECT_EQ(compare_with_sources(Dataset::open(dir / "out.mmt"), sources), 12);

  // An archive that changed since it was read is named, not packed as it is now.
  TarBuilder other;
  other.add("s0.txt", std::string(5000, 'z')).add("s0.cls", "0");
  write_file(specs[0], testutil::gzip_bytes(other.finish()));
  EXPECT_THROW_WITH(sources.record(1), IoError, specs[0] + ": decompresses to other bytes than when it was first read");
}

// Threads reading records of compressed archives past the budget: each archive made again
// under the cache's lock, every value as it was (ThreadSanitizer runs this).
TEST(PackTar, ArchivesPastTheBudgetReadConcurrently) {
  TempFolder dir;
  std::vector<std::string> specs;
  for (int a = 0; a < 3; ++a) {
    TarBuilder tar;
    for (int i = 0; i < 8; ++i)
      tar.add("s" + std::to_string(a * 8 + i) + ".txt", std::string(3000, static_cast<char>('a' + a)))
          .add("s" + std::to_string(a * 8 + i) + ".cls", std::to_string(a * 8 + i));
    specs.push_back(dir / ("part" + std::to_string(a) + ".tar.zst"));
    write_file(specs.back(), zstd_frames(tar.finish(), 1 << 20));
  }
  const testing::ScopedEnv budget("MMT_SCRATCH_BYTES", "1");
  const PackSources sources = PackSources::from_tars(specs);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<Tensor> values;
      for (int k = 0; k < 60; ++k) {
        const int64_t r = (k * 7 + t * 5) % 24;
        sources.record(r, values);
        if (values[0].item<int64_t>() != r || text_of(values[1]) != std::string(3000, static_cast<char>('a' + r / 8)))
          ++wrong;
      }
    });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(DecompressedFiles, KeepsCopiesWithinTheBudgetTheLeastRecentlyUsedDropped) {
  TempFolder dir;
  std::vector<std::string> paths;
  for (char c : {'a', 'b', 'c'}) {
    paths.push_back(dir / (std::string(1, c) + ".gz"));
    write_file(paths.back(), testutil::gzip_bytes(to_bytes(std::string(1000, c))));
  }
  detail::DecompressedFiles files(2500);
  for (const std::string& path : paths)
    files.add(path, detail::FileCompression::Gzip, detail::decompressed_file(path, detail::FileCompression::Gzip));
  // a and b kept (2000 bytes), c dropped.
  EXPECT_EQ(files.get(0).nbytes(), 1000);
  EXPECT_EQ(files.get(1).nbytes(), 1000);
  EXPECT_EQ(files.decompressed_again(), 0);
  const UntypedStorage c = files.get(2);  // made again; a, the least recently used, dropped
  EXPECT_EQ(static_cast<char>(c.data()[999]), 'c');
  EXPECT_EQ(files.decompressed_again(), 1);
  (void)files.get(1);
  EXPECT_EQ(files.decompressed_again(), 1);
  (void)files.get(0);
  EXPECT_EQ(files.decompressed_again(), 2);
  // Made again from the file as it was mapped when added: a rename since changes nothing.
  std::filesystem::rename(paths[2], dir / "moved.gz");
  const UntypedStorage c_again = files.get(2);  // dropped by the get(0) above (c was used before b)
  EXPECT_EQ(static_cast<char>(c_again.data()[0]), 'c');
  EXPECT_EQ(files.decompressed_again(), 3);
  // Not a number of bytes: named, when a compressed input needs the budget (a plain tar does not).
  for (const char* bad : {"lots", " 5", "0x10", "5X", "-5", "1e30"}) {
    const testing::ScopedEnv budget("MMT_SCRATCH_BYTES", bad);
    EXPECT_THROW_WITH(detail::DecompressedFiles::scratch_budget(), ValueError,
                      std::string("MMT_SCRATCH_BYTES is '") + bad + "'");
    detail::DecompressedFiles lazy;
    EXPECT_THROW_WITH(lazy.add(paths[0], detail::FileCompression::Gzip,
                               detail::decompressed_file(paths[0], detail::FileCompression::Gzip)),
                      ValueError, "MMT_SCRATCH_BYTES");
  }
  const testing::ScopedEnv budget("MMT_SCRATCH_BYTES", "lots");
  write_file(dir / "plain.tar", three_samples().finish());
  EXPECT_EQ(PackSources::from_tars({dir / "plain.tar"}).records(), 3);
  const testing::ScopedEnv fine("MMT_SCRATCH_BYTES", "1.5k");
  EXPECT_EQ(detail::DecompressedFiles::scratch_budget(), 1536);
}

// Samples of a real crawl: images under two extensions, a caption some lack, an extra member.
TarBuilder uneven_samples() {
  TarBuilder tar;
  tar.add("s0.jpg", "J0").add("s0.cls", "0").add("s0.txt", "t0");
  tar.add("s1.cls", "1").add("s1.png", "P1");                       // no caption
  tar.add("s2.json", "{}").add("s2.txt", "t2").add("s2.png", "P2").add("s2.cls", "2").add("s2.jpg", "J2");
  return tar;
}

TEST(PackTar, ExtensionsChooseTheFieldsAndAMissingMemberIsAnErrorSkippedOrEmpty) {
  TempFolder dir;
  write_file(dir / "u.tar", uneven_samples().finish());
  const std::vector<std::string> archive{dir / "u.tar"};
  // By default every sample must have the first one's extensions; the message says how out.
  EXPECT_THROW_WITH(PackSources::from_tars(archive), ValueError, "sample 's1' (header at byte 3072) has a '.png' member");
  EXPECT_THROW_WITH(PackSources::from_tars(archive), ValueError, "--missing skip|empty");

  TarOptions chosen{.extensions = {"JPG;png", "cls", ".txt"}, .missing = MissingMember::Skip};
  const PackSources skipped = PackSources::from_tars(archive, chosen);
  ASSERT_EQ(skipped.records(), 2);
  EXPECT_EQ(skipped.samples_skipped(), 1);
  std::vector<std::string> names;
  for (const Field& f : skipped.schema().fields()) names.push_back(f.name);
  EXPECT_EQ(names, (std::vector<std::string>{"jpg", "cls", "txt"}));  // in the order given
  EXPECT_EQ(text_of(skipped.record(1)[0]), "J2");  // the first alternative a sample has
  EXPECT_EQ(skipped.record(1)[1].item<int64_t>(), 2);
  const std::optional<TarOptions> recorded = tar_options_of(skipped.metadata(), "u.mmt");
  ASSERT_TRUE(recorded.has_value());
  EXPECT_EQ(recorded->extensions, chosen.extensions);
  EXPECT_EQ(recorded->missing, MissingMember::Skip);

  chosen.missing = MissingMember::Empty;
  const PackSources emptied = PackSources::from_tars(archive, chosen);
  ASSERT_EQ(emptied.records(), 3);
  EXPECT_EQ(text_of(emptied.record(1)[0]), "P1");
  EXPECT_EQ(emptied.record(1)[2].numel(), 0);  // s1's caption
  EXPECT_NE(emptied.record_origin(2, 1).find("sample 's1' of " + dir / "u.tar" + ", which has no '.txt' member"),
            std::string::npos) << emptied.record_origin(2, 1);
  EXPECT_NE(emptied.record_origin(0, 1).find("for field 'jpg' (the first of 'JPG;png' it has)"), std::string::npos)
      << emptied.record_origin(0, 1);
  const std::string out = dir / "u.mmt";
  pack_dataset(out, emptied, {});
  EXPECT_EQ(Dataset::open(out)[1]["txt"].numel(), 0);
  EXPECT_EQ(compare_with_sources(Dataset::open(out), emptied), 3);

  // A class number cannot be empty; alternatives and names are checked.
  TarBuilder no_class;
  no_class.add("a.jpg", "x").add("a.cls", "1").add("b.jpg", "y");
  write_file(dir / "c.tar", no_class.finish());
  EXPECT_THROW_WITH(PackSources::from_tars({dir / "c.tar"}, {.extensions = {"jpg", "cls"}, .missing = MissingMember::Empty}),
                    ValueError, "sample 'b' (header at byte 2048) has no '.cls' member, and a class number cannot be empty");
  EXPECT_THROW_WITH(PackSources::from_tars(archive, {.extensions = {"jpg;;png"}}), ValueError, "an empty extension");
  EXPECT_THROW_WITH(PackSources::from_tars(archive, {.extensions = {"jpg", "png;jpg"}}), ValueError, "'jpg' is given twice");
  EXPECT_THROW_WITH(PackSources::from_tars(archive, {.extensions = {"webp"}, .missing = MissingMember::Skip}), ValueError,
                    "3 samples lacked a member and were skipped");
  // A field of alternatives none of which a sample has is named by them all.
  EXPECT_THROW_WITH(PackSources::from_tars(archive, {.extensions = {"jpg; png", "txt"}}), ValueError,
                    "sample 's1' (header at byte 3072) has no '.txt' member (a field chosen)");
  EXPECT_THROW_WITH(PackSources::from_tars(archive, {.extensions = {"webp;gif"}}), ValueError,
                    "has none of 'webp;gif' (a field chosen); say what such a sample gives: --missing skip|empty");
  // A class number comes from a .cls member only, and '__key__' is the key's field.
  EXPECT_THROW_WITH(PackSources::from_tars(archive, {.extensions = {"cls;txt"}}), ValueError, "it cannot have alternatives");
  EXPECT_THROW_WITH(PackSources::from_tars(archive, {.extensions = {"jpg", "__key__"}}), ValueError,
                    "'__key__' names the field of each sample's key");
  EXPECT_THROW_WITH(PackSources::from_tars(archive, {.extensions = {"a/b"}}), ValueError, "'a/b' cannot name a field");
  TarBuilder keyed;
  keyed.add("a.jpg", "x").add("a.__key__", "a");
  write_file(dir / "k.tar", keyed.finish());
  EXPECT_THROW_WITH(PackSources::from_tars({dir / "k.tar"}), ValueError, "has a '.__key__' member");
  // With empty values, a stray member of no field chosen is not made a record.
  TarBuilder stray = uneven_samples();
  stray.add("meta.json", "{}");
  write_file(dir / "stray.tar", stray.finish());
  const PackSources with_stray =
      PackSources::from_tars({dir / "stray.tar"}, {.extensions = {"jpg;png", "txt"}, .missing = MissingMember::Empty});
  EXPECT_EQ(with_stray.records(), 3);
  EXPECT_EQ(with_stray.samples_skipped(), 1);
  // Other inputs take no tar options.
  write_file(dir / "x.npy", testutil::npy_with_dict("{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }",
                                                    Bytes(8, std::byte{0})));
  EXPECT_THROW_WITH(PackSources::from_inputs(std::vector<std::string>{"x=" + dir / "x.npy"}, {},
                                             {.missing = MissingMember::Skip}),
                    InputSpecError, "these inputs are not tar archives");
}

TEST(PackTar, AnEmptyArchiveHasNoSamplesAndSparseFilesAreRefused) {
  TempFolder dir;
  // What tar writes for an empty list: the end-of-archive marker alone. Beside a shard with
  // samples it adds none; alone, there are no samples.
  write_file(dir / "empty.tar", TarBuilder().finish());
  write_file(dir / "a.tar", three_samples().finish());
  EXPECT_EQ(PackSources::from_inputs(std::vector<std::string>{dir / "empty.tar", dir / "a.tar"}).records(), 3);
  EXPECT_THROW_WITH(PackSources::from_tars({dir / "empty.tar"}), ValueError, "no samples");
  // GNU tar's pax sparse format: a type '0' member whose data starts with a map of holes.
  TarBuilder sparse;
  sparse.pax({{"GNU.sparse.major", "1"}, {"GNU.sparse.minor", "0"}, {"GNU.sparse.name", "s.bin"}})
      .add("./GNUSparseFile.1/s.bin", "1\n0\n4096\n");
  write_file(dir / "sparse.tar", sparse.finish());
  EXPECT_THROW_WITH(PackSources::from_tars({dir / "sparse.tar"}), FormatError,
                    "sparse.tar: byte 0: the next member is a GNU sparse file (pax key GNU.sparse.major)");
  // A pax size that is not digits is refused before it is multiplied past int64 (the tar
  // fuzzer's first find: "size=p/qqq...").
  TarBuilder bad_size;
  bad_size.pax({{"size", "p/" + std::string(130, 'q')}}).add("a.jpg", "x");
  write_file(dir / "size.tar", bad_size.finish());
  EXPECT_THROW_WITH(PackSources::from_tars({dir / "size.tar"}), FormatError, "the pax size 'p/qqq");
  // A pax record length of 19 digits is refused, not multiplied past int64.
  TarBuilder long_length;
  long_length.add("h", "9999999999999999999 path=x\n", 'x').add("a.jpg", "x");
  write_file(dir / "long.tar", long_length.finish());
  EXPECT_THROW_WITH(PackSources::from_tars({dir / "long.tar"}), FormatError, "a pax header record is malformed");
}

TEST(PackTar, ATruncatedArchiveIsRefusedWhereverItIsCut) {
  // Every length short of the end-of-archive marker is a FormatError naming the byte: a cut
  // inside a header, a member's data or its padding, and one between members too (samples
  // after it would be lost without a word). From the marker's first block on, the archive is
  // whole, as tar reads it.
  TempFolder dir;
  const Bytes whole = three_samples().finish();
  const PackSources reference = PackSources::from_tars({[&] {
    write_file(dir / "whole.tar", whole);
    return dir / "whole.tar";
  }()});
  const size_t marker = whole.size() - 1024;
  for (size_t length = 0; length < whole.size(); ++length) {
    write_file(dir / "cut.tar", Bytes(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(length)));
    if (length >= marker + 512) {
      EXPECT_EQ(PackSources::from_tars({dir / "cut.tar"}).records(), reference.records()) << length;
      continue;
    }
    try {
      (void)PackSources::from_tars({dir / "cut.tar"});
      ADD_FAILURE() << "an archive cut at byte " << length << " of " << whole.size() << " was read";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("cut.tar: "), std::string::npos) << e.what();
    } catch (const ValueError& e) {  // too short to show its first header's magic
      EXPECT_LT(length, 262u) << e.what();
      EXPECT_NE(std::string(e.what()).find("cut.tar: not a tar archive"), std::string::npos) << e.what();
    }
  }
  // part/0.jpg (no bytes) at 0, part/0.cls at 512 (data at 1024), part/0.JSON at 1536...
  write_file(dir / "cut.tar", Bytes(whole.begin(), whole.begin() + 1100));  // inside a member's padding
  EXPECT_THROW_WITH(PackSources::from_tars({dir / "cut.tar"}), FormatError,
                    "cut.tar: byte 1100: the archive ends inside the padding after the data of the member whose "
                    "header is at byte 512 (it is truncated)");
  write_file(dir / "cut.tar", Bytes(whole.begin(), whole.begin() + 1536));  // between members
  EXPECT_THROW_WITH(PackSources::from_tars({dir / "cut.tar"}), FormatError,
                    "cut.tar: byte 1536: the archive ends without its end-of-archive marker (a zero block) after 2 "
                    "members (it is truncated)");
}

TEST(PackTar, EveryBitFlipOfAHeaderIsCaughtByItsChecksum) {
  TempFolder dir;
  TarBuilder tar;
  tar.add("a.jpg", "x").add("a.cls", "1");
  const Bytes whole = tar.finish();
  for (int64_t header : tar.header_offsets) {
    for (int64_t byte = header; byte < header + 512; ++byte) {
      for (int bit = 0; bit < 8; ++bit) {
        Bytes flipped = whole;
        flipped[static_cast<size_t>(byte)] ^= std::byte{static_cast<unsigned char>(1u << bit)};
        write_file(dir / "flip.tar", flipped);
        try {
          const PackSources read = PackSources::from_tars({dir / "flip.tar"});
          // Only a flip inside the checksum field may pass, and only one that leaves its value
          // as it was (a leading '0' made a space, a NUL terminator a space: the sum of the
          // header, which counts the field as spaces, must still match it): the archive then
          // reads as it was.
          const int64_t in_field = byte - header - 148;
          ASSERT_TRUE(in_field >= 0 && in_field < 8) << "a flip of bit " << bit << " of byte " << byte << " was not caught";
          ASSERT_EQ(read.records(), 1);
          EXPECT_EQ(read.record(0)[0].item<int64_t>(), 1);
        } catch (const FormatError&) {
        } catch (const ValueError&) {  // the first header's: not a tar archive
          ASSERT_EQ(header, 0) << byte;
        }
      }
    }
  }
}

TEST(PackTar, ShardsOfTarsReadAsTheWholePack) {
  TempFolder dir;
  write_file(dir / "a.tar", three_samples().finish());
  const PackSources sources = PackSources::from_inputs(std::vector<std::string>{dir / "a.tar"});
  for (int64_t shard = 0; shard < 2; ++shard)
    pack_dataset(dir / ("part-" + std::to_string(shard) + ".mmt"), sources, {.shard = shard, .shards = 2});
  const Dataset parts = Dataset::open_concat({dir / "part-0.mmt", dir / "part-1.mmt"});
  EXPECT_EQ(compare_with_sources(parts, sources), 3);
  EXPECT_THROW_WITH(PackSources::from_inputs(std::vector<std::string>{dir / "a.tar"}, std::vector<std::string>{"jpg"}),
                    InputSpecError, "not for tar archives");
  EXPECT_THROW(pack_dataset(dir / "a.tar", sources, {.writer = {.overwrite = true}}), ValueError);  // the input itself
}

}  // namespace
}  // namespace mmt
