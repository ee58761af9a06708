// pack_dataset and PackSources: what the library refuses before it writes anything, so a pack
// can never replace one of its own inputs or make a dataset of nothing.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "mmtensor/dataset.h"
#include "mmtensor/numpy_io.h"
#include "mmtensor/packer.h"
#include "importer_test_util.h"
#include "test_util.h"

namespace mmt {
namespace {

namespace fs = std::filesystem;
using testing::error_of;
using testing::file_bytes;
using testing::folder_entries;
using testing::ScopedEnv;
using testing::TempDir;

// The process's working folder is `dir` while this lives, and then where it was, whatever
// happens (later tests use relative paths too).
class WorkingDirectory {
 public:
  explicit WorkingDirectory(const fs::path& dir) { fs::current_path(dir); }
  WorkingDirectory(const WorkingDirectory&) = delete;
  WorkingDirectory& operator=(const WorkingDirectory&) = delete;
  ~WorkingDirectory() { fs::current_path(was_); }

 private:
  fs::path was_ = fs::current_path();  // initialised before the constructor's body moves away
};

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

TEST(PackerTest, AFolderWithoutFilesIsRefused) {
  TempDir dir;
  fs::create_directories(dir.path() / "empty");
  EXPECT_NE(error_of([&] { PackSources::from_folder(dir.file("empty")); }).find("no class folders"),
            std::string::npos);
  fs::create_directories(dir.path() / "classes" / "cat");
  fs::create_directories(dir.path() / "classes" / "dog" / "puppies");
  const std::string message = error_of([&] { PackSources::from_folder(dir.file("classes")); });
  EXPECT_NE(message.find("its 2 class folders hold no files"), std::string::npos) << message;
  // One class folder whose only file is hidden: the message says why it counts as empty.
  write_text(dir.path() / "one" / "cat" / ".DS_Store", "");
  const std::string hidden = error_of([&] { PackSources::from_folder(dir.file("one")); });
  EXPECT_NE(hidden.find("its 1 class folder holds no files (1 hidden entries"), std::string::npos) << hidden;
  // One empty class among others is a class with no samples, which is allowed.
  write_text(dir.path() / "classes" / "dog" / "puppies" / "rex.jpg", "woof");
  PackSources sources = PackSources::from_folder(dir.file("classes"));
  EXPECT_EQ(sources.records(), 1);
  EXPECT_EQ(sources.metadata().at("classes"), R"(["cat","dog"])");
}

// A uint8 value's bytes as text (a folder record's data or path).
std::string bytes_text(const Tensor& value) {
  const Tensor bytes = value.contiguous();
  return {static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.nbytes())};
}

// Unlabeled data (self-supervised pre-training, say) is a folder of files with no classes;
// it was refused file by file ("has no class"). Now it packs as bytes alone, in name order.
TEST(PackerTest, AFolderOfFilesAlonePacksUnlabeled) {
  TempDir dir;
  write_text(dir.path() / "flat" / "b.bin", "bee");
  write_text(dir.path() / "flat" / "a.bin", "ay");
  write_text(dir.path() / "flat" / ".DS_Store", "hidden");
  write_text(dir.path() / "flat" / ".ipynb_checkpoints" / "a.bin", "hidden too");
  const PackSources sources = PackSources::from_folder(dir.file("flat"));
  EXPECT_EQ(sources.records(), 2);
  ASSERT_EQ(sources.schema().size(), 1u);
  EXPECT_EQ(sources.schema()[0].name, "data");
  EXPECT_FALSE(sources.metadata().contains("classes"));
  EXPECT_EQ(sources.hidden_skipped(), 2);
  EXPECT_EQ(sources.record_origin(0, 1), dir.file("flat") + "/b.bin");
  pack_dataset(dir.file("flat.mmt"), sources, {});
  const Dataset ds = Dataset::open(dir.file("flat.mmt"));
  ASSERT_EQ(ds.size(), 2);
  EXPECT_EQ(bytes_text(ds[0]["data"]), "ay");
  EXPECT_EQ(bytes_text(ds[1]["data"]), "bee");
  EXPECT_EQ(compare_with_sources(ds, sources), 2);

  // Files beside class folders have no class: refused, naming the first of them.
  write_text(dir.path() / "flat" / "cat" / "c.jpg", "meow");
  const std::string mixed = error_of([&] { PackSources::from_folder(dir.file("flat")); });
  EXPECT_NE(mixed.find(dir.file("flat") + "/a.bin: a file directly in " + dir.file("flat") + ", beside class folders ("),
            std::string::npos) << mixed;
  EXPECT_NE(mixed.find("has no class"), std::string::npos) << mixed;
}

// Which file a record came from, once the folder is gone (or to find a mislabeled image):
// FolderOptions::paths stores each file's path under the folder, however the folder was spelled.
TEST(PackerTest, FolderPathsNameEachRecordsFile) {
  TempDir dir;
  write_text(dir.path() / "photos" / "cat" / "a.jpg", "meow");
  write_text(dir.path() / "photos" / "dog" / "puppies" / "rex.jpg", "woof");
  for (const std::string& spelled : {dir.file("photos"), dir.file("photos") + "/", dir.file("photos") + "/./"}) {
    SCOPED_TRACE(spelled);
    const PackSources sources = PackSources::from_folder(spelled, {.paths = true});
    ASSERT_EQ(sources.schema().size(), 3u);
    EXPECT_EQ(sources.schema()[2].name, "path");
    EXPECT_FALSE(sources.schema()[2].is_fixed());
    EXPECT_EQ(sources.origins().at(2), "path=" + spelled + " (file paths)");
    EXPECT_EQ(bytes_text(sources.record(0).at(2)), "cat/a.jpg");
    EXPECT_EQ(bytes_text(sources.record(1).at(2)), "dog/puppies/rex.jpg");
    EXPECT_EQ(sources.record(1).at(1).item<int64_t>(), 1);
    EXPECT_NE(sources.record_origin(2, 1).find("the path of "), std::string::npos);
    EXPECT_NE(sources.record_origin(1, 1).find("the class folder of "), std::string::npos);
  }
  const PackSources sources = PackSources::from_folder(dir.file("photos"), {.paths = true});
  pack_dataset(dir.file("p.mmt"), sources, {.writer = {.codec = CodecSpec::parse("zstd")}});
  const Dataset ds = Dataset::open(dir.file("p.mmt"));
  EXPECT_EQ(bytes_text(ds[1]["path"]), "dog/puppies/rex.jpg");
  EXPECT_EQ(ds[1]["label"].item<int64_t>(), 1);
  EXPECT_EQ(compare_with_sources(ds, sources), 2);
  // Repacked without "label", the class names index nothing and are dropped.
  const std::vector<std::string> p_mmt{dir.file("p.mmt")}, unlabeled{"data", "path"};
  EXPECT_FALSE(PackSources::from_inputs(p_mmt, unlabeled).metadata().contains("classes"));
  EXPECT_TRUE(PackSources::from_inputs(p_mmt).metadata().contains("classes"));
  // Without the option the schema is as before: no "path".
  EXPECT_FALSE(PackSources::from_folder(dir.file("photos")).schema().find("path").has_value());

  // A folder of files alone, packed from inside it ("."): "data" and "path", the bare name.
  write_text(dir.path() / "flat" / "x.txt", "x");
  {
    const WorkingDirectory in_flat(dir.path() / "flat");
    const PackSources flat = PackSources::from_folder(".", {.paths = true});
    ASSERT_EQ(flat.schema().size(), 2u);
    EXPECT_EQ(bytes_text(flat.record(0).at(1)), "x.txt");
  }
}

// Hidden folders are skipped with what is under them (a notebook's checkpoints used to become
// samples of their class), linked folders are followed like linked files (they used to be
// dropped without a word), and a link loop is refused instead of walked.
TEST(PackerTest, ClassFoldersSkipHiddenFoldersFollowLinksAndRefuseLoops) {
  TempDir dir;
  const fs::path root = dir.path() / "photos";
  write_text(root / "cat" / "a.jpg", "a");
  write_text(root / "cat" / ".ipynb_checkpoints" / "a-checkpoint.jpg", "stale");
  write_text(root / "cat" / ".hidden.jpg", "hidden");
  write_text(dir.path() / "elsewhere" / "b.jpg", "b");
  fs::create_directories(root / "dog");
  fs::create_directory_symlink(dir.path() / "elsewhere", root / "dog" / "linked");
  PackSources sources = PackSources::from_folder(root.string());
  ASSERT_EQ(sources.records(), 2);
  EXPECT_EQ(sources.metadata().at("classes"), R"(["cat","dog"])");
  EXPECT_EQ(sources.record(0)[0].to_vector<uint8_t>(), std::vector<uint8_t>{'a'});
  EXPECT_EQ(sources.record(1)[0].to_vector<uint8_t>(), std::vector<uint8_t>{'b'});
  EXPECT_EQ(sources.record(1)[1].item<int64_t>(), 1);

  fs::create_directory_symlink(root / "dog", root / "dog" / "loop");
  const std::string message = error_of([&] { PackSources::from_folder(root.string()); });
  EXPECT_NE(message.find("loop: this folder is reached twice"), std::string::npos) << message;
  fs::remove(root / "dog" / "loop");
  // A link from one class into another would pack the same files under two labels.
  fs::create_directory_symlink(root / "cat", root / "dog" / "cats-too");
  const std::string across = error_of([&] { PackSources::from_folder(root.string()); });
  EXPECT_NE(across.find("cats-too: this folder is reached twice"), std::string::npos) << across;
  fs::remove(root / "dog" / "cats-too");
  fs::create_directory_symlink(root / "dog", root / "dog" / "loop");

  if (::geteuid() != 0) {  // root lists anything: permissions cannot make a folder unlistable
    fs::remove(root / "dog" / "loop");
    fs::create_directories(root / "dog" / "locked");
    fs::permissions(root / "dog" / "locked", fs::perms::none);
    const std::string locked = error_of([&] { PackSources::from_folder(root.string()); });
    fs::permissions(root / "dog" / "locked", fs::perms::owner_all);
    EXPECT_NE(locked.find((root / "dog" / "locked").string() + ": cannot list the folder"), std::string::npos) << locked;
  }
}

TEST(PackerTest, AClassFolderNameThatIsNotUtf8IsNamed) {
  TempDir dir;
  write_text(dir.path() / "classes" / "caf\xe9" / "a.bin", "x");
  const std::string message = error_of([&] { PackSources::from_folder(dir.file("classes")); });
  EXPECT_NE(message.find("class folder's name is not valid UTF-8"), std::string::npos) << message;
}

TEST(PackerTest, AnArrayNameThatCannotBeAFieldNameNamesItsSource) {
  TempDir dir;
  save_npy(dir.file("a.npy"), arange(4));
  const std::string message = error_of([&] { PackSources::from_arrays(std::vector<std::string>{"x/y=" + dir.file("a.npy")}); });
  EXPECT_FALSE(message.empty());  // "x/y=..." is read as a path: the file does not exist
  const std::string dotdot = error_of([&] { PackSources::from_arrays(std::vector<std::string>{"..=" + dir.file("a.npy")}); });
  EXPECT_NE(dotdot.find("..=" + dir.file("a.npy") + " (an array of shape [4]): field name '..'"), std::string::npos)
      << dotdot;
  // A dimension of 0 past the first: the message gives the array's whole shape, and the rule in
  // the user's terms (it said "dimensions are >= 1, or -1 for variable", a schema detail).
  save_npy(dir.file("z.npy"), zeros({3, 0, 4}));
  const std::string zero = error_of([&] { PackSources::from_arrays(std::vector<std::string>{"z=" + dir.file("z.npy")}); });
  EXPECT_NE(zero.find("z.npy: the array's shape [3, 0, 4] has size 0 in dimension 1, so each record would hold no "
                      "values; such arrays cannot be packed, because a field's fixed dimensions must be >= 1"),
            std::string::npos) << zero;
  EXPECT_EQ(zero.find("-1 for variable"), std::string::npos) << zero;
}

// "=a.npy" got the hint "write NAME==a.npy", which names the file "=a.npy".
TEST(PackerTest, TheHintForAMissingFieldNameAddsOnlyTheName) {
  TempDir dir;
  save_npy(dir.file("a.npy"), arange(4));
  std::string message, empty;
  {
    const WorkingDirectory in_dir(dir.path());
    message = error_of([] { PackSources::from_arrays(std::vector<std::string>{"=a.npy"}); });
    empty = error_of([] { PackSources::from_arrays(std::vector<std::string>{""}); });
  }
  EXPECT_NE(message.find("input '=a.npy' needs a field name: write NAME=a.npy"), std::string::npos) << message;
  EXPECT_NE(empty.find("an input is empty"), std::string::npos) << empty;  // not "has no path after '='"
}

// Inputs of the wrong kind are named for what they are, not for the advice that fits another
// mistake: a field name with '/' ("cannot open"), an mmtensor dataset ("write NAME=", then "not
// an IDX magic"), a dangling link at the top of a class folder ("has no class"), a --folder
// that is a file ("does not exist or is a file").
TEST(PackerTest, InputsOfTheWrongKindAreNamedForWhatTheyAre) {
  TempDir dir;
  save_npy(dir.file("a.npy"), arange(4));
  std::string slash;
  {
    const WorkingDirectory in_dir(dir.path());
    slash = error_of([] { PackSources::from_arrays(std::vector<std::string>{"x/y=a.npy"}); });
  }
  EXPECT_NE(slash.find("field name 'x/y' cannot contain '/'"), std::string::npos) << slash;

  pack_dataset(dir.file("d.mmt"), PackSources::from_arrays(std::vector<std::string>{"a=" + dir.file("a.npy")}), {});
  for (const std::string& spec : {dir.file("d.mmt"), "a=" + dir.file("d.mmt")}) {
    const std::string message = error_of([&] { PackSources::from_arrays(std::vector<std::string>{spec}); });
    EXPECT_NE(message.find("an mmtensor dataset, not an array input"), std::string::npos) << message;
  }

  write_text(dir.path() / "photos" / "cat" / "a.jpg", "meow");
  fs::create_symlink(dir.path() / "nowhere", dir.path() / "photos" / "dangling");
  const std::string dangling = error_of([&] { PackSources::from_folder(dir.file("photos")); });
  EXPECT_NE(dangling.find("dangling: not a folder nor a file (a dangling link"), std::string::npos) << dangling;
  const std::string file = error_of([&] { PackSources::from_folder(dir.file("a.npy")); });
  EXPECT_NE(file.find("not a folder (it is a file)"), std::string::npos) << file;
}

// A compressed .npy or .npz was taken for IDX (the one kind that may be gzipped) and refused as
// "magic 0x... is not an IDX magic"; a bare ok.npz.gz first got the hint "write NAME=ok.npz.gz".
TEST(PackerTest, ACompressedNpyOrNpzIsNamedAsSuch) {
  TempDir dir;
  save_npy(dir.file("a.npy"), arange(4));
  testutil::write_file(dir.file("a.npy.gz"), testutil::gzip_bytes(testutil::read_file(dir.file("a.npy"))));
  testutil::write_file(dir.file("ok.npz.gz"),
                       testutil::gzip_bytes(testutil::zip_archive({{"a.npy", testutil::read_file(dir.file("a.npy"))}})));
  testutil::write_file(dir.file("a.npy.bz2"), testutil::to_bytes("BZh91AY&SY not really"));
  for (const std::string& spec : {"a=" + dir.file("a.npy.gz"), dir.file("ok.npz.gz")}) {
    const std::string message = error_of([&] { PackSources::from_arrays(std::vector<std::string>{spec}); });
    EXPECT_NE(message.find(".gz: a gzip-compressed .npy/.npz is not supported (only IDX files may be gzipped)"),
              std::string::npos) << message;
  }
  const std::string bz2 = error_of([&] { PackSources::from_arrays(std::vector<std::string>{"a=" + dir.file("a.npy.bz2")}); });
  EXPECT_NE(bz2.find("a.npy.bz2: a bzip2-compressed file is not supported"), std::string::npos) << bz2;
  // A gzipped IDX file is still what it always was.
  testutil::Bytes idx{std::byte{0}, std::byte{0}, std::byte{0x08}, std::byte{1}, std::byte{0}, std::byte{0},
                      std::byte{0}, std::byte{2}, std::byte{7}, std::byte{9}};
  testutil::write_file(dir.file("labels-idx1-ubyte.gz"), testutil::gzip_bytes(idx));
  EXPECT_EQ(PackSources::from_arrays(std::vector<std::string>{"y=" + dir.file("labels-idx1-ubyte.gz")}).records(), 2);
}

// `TMPDIR= mmt pack ...` failed with "TMPDIR is '': No such file or directory" where a
// Fortran-order array needs converting; an empty TMPDIR is an unset one, as for Python's tempfile.
TEST(PackerTest, AnEmptyTmpdirIsTreatedAsUnset) {
  TempDir dir;
  testutil::write_file(dir.file("f.npy"), testutil::npy_file(">i4", true, "(3, 2)",
                                                             testutil::element_bytes(std::vector<int32_t>{0, 2, 4, 1, 3, 5}, true)));
  const ScopedEnv empty("TMPDIR", "");
  const PackSources sources = PackSources::from_arrays(std::vector<std::string>{"f=" + dir.file("f.npy")});
  EXPECT_TRUE(sources.record(1)[0].equal(tensor(std::vector<int32_t>{2, 3})));
}

// Hidden files and folders are skipped under a class folder, and counted, so the pack summary
// can say how many.
TEST(PackerTest, HiddenEntriesOfAClassFolderAreCounted) {
  TempDir dir;
  const fs::path root = dir.path() / "photos";
  write_text(root / "cat" / "a.jpg", "a");
  write_text(root / "cat" / ".DS_Store", "x");
  write_text(root / "cat" / ".ipynb_checkpoints" / "a-checkpoint.jpg", "stale");  // one, with what is under it
  write_text(root / ".git" / "HEAD", "ref");
  EXPECT_EQ(PackSources::from_folder(root.string()).hidden_skipped(), 3);
  EXPECT_EQ(PackSources().hidden_skipped(), 0);
}

// verify --against matched fields by position: the right fields in another order, or some of
// them, were "schema differs" with two lists that looked alike. By name now; a subset is
// compared as given; a field the dataset lacks, or of another dtype or shape, is named.
TEST(PackerTest, ComparingWithSourcesMatchesFieldsByName) {
  TempDir dir;
  save_npy(dir.file("a.npy"), arange(6, kInt32).view({2, 3}));
  save_npy(dir.file("b.npy"), arange(2, kUInt8));
  save_npy(dir.file("c.npy"), arange(2, kInt64));
  save_npy(dir.file("wide.npy"), arange(8, kInt32).view({2, 4}));
  const auto sources = [&](std::vector<std::string> specs) {
    for (std::string& spec : specs) spec = spec.substr(0, 2) + dir.file(spec.substr(2));
    return PackSources::from_arrays(specs);
  };
  pack_dataset(dir.file("o.mmt"), sources({"a=a.npy", "b=b.npy"}), {});
  const Dataset ds = Dataset::open(dir.file("o.mmt"));
  EXPECT_EQ(compare_with_sources(ds, sources({"b=b.npy", "a=a.npy"})), 2);
  EXPECT_EQ(compare_with_sources(ds, sources({"a=a.npy"})), 2);
  EXPECT_EQ(compare_with_sources(ds, sources({"b=b.npy"}), std::vector<int64_t>{1}), 1);
  for (int64_t outside : {int64_t{-1}, int64_t{2}})  // a shard's lookup read before its table on -1
    EXPECT_THROW(compare_with_sources(ds, sources({"b=b.npy"}), std::vector<int64_t>{outside}), IndexError);
  const std::string missing = error_of([&] { compare_with_sources(ds, sources({"a=a.npy", "c=c.npy"})); });
  EXPECT_NE(missing.find("the sources give field 'c' (c=" + dir.file("c.npy") +
                         "), which the dataset lacks; its fields are 'a', 'b'"), std::string::npos) << missing;
  const std::string retyped = error_of([&] { compare_with_sources(ds, sources({"b=c.npy"})); });
  EXPECT_NE(retyped.find("field 'b' is uint8[] in the dataset but int64[] in its source b="), std::string::npos)
      << retyped;
  const std::string reshaped = error_of([&] { compare_with_sources(ds, sources({"a=wide.npy"})); });
  EXPECT_NE(reshaped.find("field 'a' is int32[3] in the dataset but int32[4] in its source a="), std::string::npos)
      << reshaped;
  // Same dtype and shape, other values: the first byte that differs.
  save_npy(dir.file("a2.npy"), tensor(std::vector<int32_t>{0, 1, 2, 3, 4, 9}).view({2, 3}));
  const std::string differs = error_of([&] { compare_with_sources(ds, sources({"a=a2.npy"})); });
  EXPECT_NE(differs.find("record 1, field 'a' differs from its source a=" + dir.file("a2.npy") +
                         " at byte 8 of the value (dataset: int32[3], source: int32[3])"), std::string::npos)
      << differs;
}

// Shards tile the records in order, sizes differing by at most one, for any count.
TEST(PackerTest, ShardRecordsTileTheRecordsInOrder) {
  for (int64_t records : {0, 1, 7, 25, 1000}) {
    for (int64_t shards : {1, 2, 3, 4, 9}) {
      int64_t next = 0;
      for (int64_t k = 0; k < shards; ++k) {
        const RecordRange r = shard_records(records, k, shards);
        ASSERT_EQ(r.begin, next) << records << " records, shard " << k << " of " << shards;
        EXPECT_TRUE(r.size() == records / shards || r.size() == records / shards + 1);
        next = r.end;
      }
      EXPECT_EQ(next, records);
    }
  }
  // No overflow where shard * records passes int64.
  const int64_t huge = int64_t{1} << 62;
  EXPECT_EQ(shard_records(huge, 3, 4).begin, huge / 4 * 3);
  EXPECT_THROW(shard_records(10, 4, 4), ValueError);
  EXPECT_THROW(shard_records(10, -1, 4), ValueError);
  EXPECT_THROW(shard_records(10, 0, 0), ValueError);
}

// Repacking: shards merged into one file with another codec, some fields left out, ragged
// fields too; `mmt pack OUT part-*.mmt --codec zstd`. A pack's shards whole read as one pack
// of everything, so the merged file carries no shard keys, and compares equal to them.
TEST(PackerTest, DatasetsRepackMergedWithAnotherCodecAndSomeFields) {
  TempDir dir;
  const Schema schema({Field::fixed("x", kInt32, {3}), Field::ragged("tokens", kInt16, {-1}), Field::fixed("y", kInt64, {})});
  std::vector<std::string> parts;
  for (int64_t k = 0; k < 3; ++k) {
    parts.push_back(dir.file("part" + std::to_string(k) + ".mmt"));
    DatasetWriter w = DatasetWriter::create(parts.back(), schema,
                                            {.codec = CodecSpec::parse(k == 1 ? "lz4" : "none"), .chunk_records = 4,
                                             .metadata = {{std::string(kShardMetadataKey), std::to_string(k) + "/3 of 30"},
                                                          {std::string(kFortranOrderMetadataKey), R"(["x","y"])"},
                                                          {"mine", "kept"}}});
    for (int64_t r = 10 * k; r < 10 * k + 10; ++r)
      w.append({arange(r, r + 3, 1, kInt32), arange(r % 5, kInt16), full({}, static_cast<double>(r), kInt64)});
    w.finish();
  }
  const PackSources all = PackSources::from_inputs(parts);
  EXPECT_EQ(all.records(), 30);
  EXPECT_EQ(all.schema(), schema);
  EXPECT_EQ(all.metadata().count(std::string(kShardMetadataKey)), 0u);
  EXPECT_EQ(all.metadata().at("mine"), "kept");
  EXPECT_EQ(all.origins().at(1), "tokens of " + parts[0] + ", " + parts[1] + ", " + parts[2]);
  pack_dataset(dir.file("all.mmt"), all, {.writer = {.codec = CodecSpec::parse("zstd")}});
  const Dataset merged = Dataset::open(dir.file("all.mmt"));
  EXPECT_EQ(merged.size(), 30);
  EXPECT_EQ(merged.info().codec.codec, Codec::Zstd);
  EXPECT_EQ(merged.metadata().count(std::string(kShardMetadataKey)), 0u);
  EXPECT_EQ(merged.get(27, "tokens").numel(), 2);
  EXPECT_EQ(merged.get(27, "y").item<int64_t>(), 27);
  EXPECT_EQ(compare_with_sources(merged, all), 30);

  // Fixed fields only, chosen in another order: copied a batch at a time; the Fortran-order
  // list keeps the fields kept.
  const std::vector<std::string> chosen{"y", "x"};
  const PackSources fixed = PackSources::from_inputs(parts, chosen);
  std::vector<Tensor> batch;
  ASSERT_TRUE(fixed.record_batch(8, 5, batch));
  EXPECT_TRUE(batch[0].equal(arange(8, 13, 1, kInt64)));
  EXPECT_EQ(fixed.metadata().at(std::string(kFortranOrderMetadataKey)), R"(["x","y"])");
  const std::vector<std::string> only_tokens{"tokens"};
  EXPECT_EQ(PackSources::from_datasets(parts, only_tokens).metadata().count(std::string(kFortranOrderMetadataKey)), 0u);
  EXPECT_FALSE(all.record_batch(0, 2, batch)) << "ragged fields go a record at a time";
  pack_dataset(dir.file("yx.mmt"), fixed, {});
  EXPECT_EQ(compare_with_sources(Dataset::open(dir.file("yx.mmt")), fixed), 30);

  // One shard repacked alone is still that shard: it keeps its keys, so a set of them is
  // checked for order, and it compares equal to the shard it came from.
  const std::vector<std::string> one{parts[1]};
  pack_dataset(dir.file("re1.mmt"), PackSources::from_inputs(one), {.writer = {.codec = CodecSpec::parse("zstd")}});
  EXPECT_EQ(Dataset::open(dir.file("re1.mmt")).metadata().at(std::string(kShardMetadataKey)), "1/3 of 30");
  EXPECT_EQ(compare_with_sources(Dataset::open(dir.file("re1.mmt")), PackSources::from_inputs(one)), 10);
  EXPECT_THROW_WITH(Dataset::open_concat({dir.file("re1.mmt"), parts[0]}), ValueError, "shards out of order");
  EXPECT_EQ(Dataset::open_concat({parts[0], dir.file("re1.mmt"), parts[2]}).size(), 30);
  // Some shards but not all would be one file claiming several shards, which the order checks
  // do not take: that repack is a dataset of its own.
  const std::vector<std::string> two{parts[0], parts[1]};
  EXPECT_EQ(PackSources::from_inputs(two).metadata().count(std::string(kShardMetadataKey)), 0u);
  EXPECT_EQ(PackSources::from_inputs(two).metadata().count(std::string(kShardSourceMetadataKey)), 0u);

  // Mistakes: an unknown field, one twice, fields of arrays, a dataset among arrays, a
  // missing dataset (named, not taken for an array).
  const std::vector<std::string> missing{parts[0], dir.file("nowhere.mmt")};
  EXPECT_THROW_WITH(PackSources::from_inputs(missing), IoError, "nowhere.mmt");
  const std::vector<std::string> only_missing{dir.file("nowhere.mmt")}, with_folder{parts[0], dir.path().string()};
  EXPECT_THROW_WITH(PackSources::from_inputs(only_missing, chosen), IoError, "nowhere.mmt");  // fields: datasets
  EXPECT_THROW_WITH(PackSources::from_inputs(with_folder), Error, dir.path().string());
  const std::vector<std::string> unknown{"z"}, twice{"x", "x"};
  EXPECT_THROW_WITH(PackSources::from_inputs(parts, unknown), ValueError, "unknown field 'z'");
  EXPECT_THROW_WITH(PackSources::from_inputs(parts, twice), ValueError, "field 'x' is chosen twice");
  save_npy(dir.file("a.npy"), arange(30, kInt32));
  const std::vector<std::string> arrays{"a=" + dir.file("a.npy")}, mixed{parts[0], "a=" + dir.file("a.npy")};
  EXPECT_THROW_WITH(PackSources::from_inputs(arrays, chosen), InputSpecError, "choosing fields is for dataset inputs");
  EXPECT_THROW_WITH(PackSources::from_inputs(mixed), ValueError, "to repack datasets give them alone");

  // A corrupt input (uncompressed: views into the file, which get(i) alone does not hash)
  // stops the repack before anything appears at the output.
  const std::string corrupt = dir.file("corrupt.mmt");
  fs::copy_file(parts[0], corrupt);
  {
    std::fstream f(corrupt, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096 + 10);
    f.put('\x7f');
  }
  const std::vector<std::string> bad{corrupt};
  EXPECT_THROW(pack_dataset(dir.file("bad.mmt"), PackSources::from_inputs(bad), {}), ChecksumError);
  EXPECT_FALSE(fs::exists(dir.file("bad.mmt")));
}

// Shards packed one by one (as parallel processes would) read as the whole: arrays, and a
// class folder whose every shard keeps the full class list (so the shards concatenate), even
// a shard holding no record.
TEST(PackerTest, ShardsPackedApartReadAsOnePackOfEverything) {
  TempDir dir;
  save_npy(dir.file("a.npy"), arange(30, kInt32).view({10, 3}));
  const PackSources arrays = PackSources::from_arrays(std::vector<std::string>{"a=" + dir.file("a.npy")});
  std::vector<std::string> parts;
  for (int64_t k = 0; k < 3; ++k) {
    PackOptions options;
    options.shard = k;
    options.shards = 3;
    options.writer.codec = CodecSpec::parse(k == 1 ? "lz4" : "none");
    parts.push_back(dir.file("a" + std::to_string(k) + ".mmt"));
    EXPECT_EQ(pack_dataset(parts.back(), arrays, options).records, k == 2 ? 4 : 3);
  }
  const Dataset whole = Dataset::open_concat(parts);
  EXPECT_EQ(compare_with_sources(whole, arrays), 10);
  // Each shard says which it is; the whole, read in order, is a dataset of its own again.
  EXPECT_EQ(Dataset::open(parts[1]).metadata().at(std::string(kShardMetadataKey)), "1/3 of 10");
  EXPECT_EQ(whole.metadata().count(std::string(kShardMetadataKey)), 0u);
  // Shards out of order, given twice or of another count read as a plausible dataset of the
  // wrong records: refused, naming the parts. Some of them, in order, are a subset, and say so.
  EXPECT_THROW_WITH(Dataset::open_concat({parts[0], parts[2], parts[1]}), ValueError, "shards out of order");
  EXPECT_THROW_WITH(Dataset::open_concat({parts[0], parts[0]}), ValueError, "shard 0 of 3 is given twice");
  EXPECT_EQ(Dataset::open_concat({parts[0], parts[2]}).metadata().at(std::string(kShardMetadataKey)), "0,2/3 of 10");
  // Another pack's shards (another N, or sources of other records) may follow: each pack's
  // are checked on their own.
  PackOptions halves;
  halves.shards = 2;
  for (int64_t k = 0; k < 2; ++k) {
    halves.shard = k;
    pack_dataset(dir.file("half" + std::to_string(k) + ".mmt"), arrays, halves);
  }
  const Dataset two_packs = Dataset::open_concat({parts[0], parts[1], parts[2], dir.file("half0.mmt"), dir.file("half1.mmt")});
  EXPECT_EQ(two_packs.size(), 20);
  EXPECT_EQ(two_packs.metadata().count(std::string(kShardMetadataKey)), 0u);
  EXPECT_THROW_WITH(Dataset::open_concat({dir.file("half1.mmt"), parts[0], dir.file("half0.mmt")}), ValueError,
                    "shards out of order");
  // Two datasets of as many records, cut in as many shards: read one after the other, or one
  // rank's shard of each. A shard number its pack holds already begins another pack when the
  // files differ, and is the same shard given twice when they hold the same records.
  save_npy(dir.file("b.npy"), arange(100, 130, 1, kInt32).view({10, 3}));
  const PackSources other = PackSources::from_arrays(std::vector<std::string>{"a=" + dir.file("b.npy")});
  std::vector<std::string> both = parts;
  for (int64_t k = 0; k < 3; ++k) {
    PackOptions options;
    options.shard = k;
    options.shards = 3;
    both.push_back(dir.file("b" + std::to_string(k) + ".mmt"));
    pack_dataset(both.back(), other, options);
  }
  const Dataset a_then_b = Dataset::open_concat(both);
  EXPECT_EQ(a_then_b.size(), 20);
  EXPECT_EQ(a_then_b.get(12, "a")[0].item<int32_t>(), 106);
  EXPECT_EQ(Dataset::concat({Dataset::open_concat(parts), Dataset::open_concat({both[3], both[4], both[5]})}).size(), 20);
  const Dataset rank_1 = Dataset::open_concat({parts[1], both[4]});
  EXPECT_EQ(rank_1.size(), 6);
  EXPECT_EQ(rank_1.get(3, "a")[0].item<int32_t>(), 109);
  EXPECT_EQ(Dataset::open_concat({parts[1], parts[2], both[4], both[5]}).size(), 14);
  EXPECT_THROW_WITH(Dataset::open_concat({parts[0], parts[1], parts[2], parts[0], parts[1], parts[2]}), ValueError,
                    "shard 0 of 3 is given twice: part 0 (" + parts[0] + ") and part 3 (" + parts[0] +
                        ") are the same file or copies of it");
  // Each shard says which sources it was cut from; packs of other sources interleave freely.
  EXPECT_EQ(Dataset::open(parts[0]).metadata().at(std::string(kShardSourceMetadataKey)),
            Dataset::open(parts[2]).metadata().at(std::string(kShardSourceMetadataKey)));
  EXPECT_NE(Dataset::open(parts[0]).metadata().at(std::string(kShardSourceMetadataKey)),
            Dataset::open(both[3]).metadata().at(std::string(kShardSourceMetadataKey)));
  EXPECT_EQ(Dataset::open_concat({parts[2], both[3]}).size(), 7);
  EXPECT_EQ(Dataset::open_concat({both[3], parts[0], both[4], parts[1]}).size(), 12);
  EXPECT_THROW_WITH(Dataset::open_concat({parts[0], both[3], parts[0]}), ValueError, "shard 0 of 3 is given twice");
  fs::copy_file(parts[2], dir.file("copy-of-a2.mmt"));
  EXPECT_THROW_WITH(Dataset::open_concat({parts[0], parts[1], parts[2], dir.file("copy-of-a2.mmt")}), ValueError,
                    "shard 2 of 3 is given twice");
  // Shards cut from sources that changed between pack runs (here an array that gained a
  // record) are shards of two packs to a reader (`mmt verify` finds each incomplete).
  save_npy(dir.file("a11.npy"), arange(33, kInt32).view({11, 3}));
  PackOptions middle;
  middle.shard = 1;
  middle.shards = 3;
  pack_dataset(dir.file("a11-1.mmt"), PackSources::from_arrays(std::vector<std::string>{"a=" + dir.file("a11.npy")}),
               middle);
  const Dataset mixed = Dataset::open_concat({parts[0], dir.file("a11-1.mmt"), parts[2]});
  EXPECT_EQ(mixed.metadata().count(std::string(kShardMetadataKey)), 0u);
  EXPECT_EQ(mixed.metadata().count(std::string(kShardSourceMetadataKey)), 0u);
  // A shard beside a file of its own is not "some shards of one pack": no key says so.
  pack_dataset(dir.file("whole.mmt"), arrays, PackOptions{});
  EXPECT_EQ(Dataset::open_concat({dir.file("whole.mmt"), parts[0]}).metadata().count(std::string(kShardMetadataKey)), 0u);
  // Some shards of one pack say which, and of what sources.
  EXPECT_EQ(Dataset::open_concat({parts[0], parts[2]}).metadata().at(std::string(kShardSourceMetadataKey)),
            Dataset::open(parts[0]).metadata().at(std::string(kShardSourceMetadataKey)));
  // The text: "K/N of R", a subset's shards listed; anything else is someone else's value.
  EXPECT_EQ(to_string(*parse_shard_list("0,2,5/6 of 100")), "0,2,5/6 of 100");
  for (const char* other : {"1/3", "3/3 of 10", "2,1/3 of 10", "1,1/3 of 10", "a/3 of 10", "1/3 of -1", "1/3 of 10 "})
    EXPECT_FALSE(parse_shard_list(other)) << other;
  PackOptions bad;
  bad.shard = 3;
  bad.shards = 3;
  EXPECT_THROW_WITH(pack_dataset(dir.file("bad.mmt"), arrays, bad), ValueError, "shard 3 of 3");
  EXPECT_FALSE(fs::exists(dir.file("bad.mmt")));

  write_text(dir.path() / "photos" / "cat" / "a.jpg", "meow");
  write_text(dir.path() / "photos" / "dog" / "b.jpg", "woof");
  write_text(dir.path() / "photos" / "emu" / "c.jpg", "hmm");
  const PackSources folder = PackSources::from_folder(dir.file("photos"));
  std::vector<std::string> folder_parts;
  for (int64_t k = 0; k < 4; ++k) {  // 3 files in 4 shards: shard 0 holds none
    PackOptions options;
    options.shard = k;
    options.shards = 4;
    folder_parts.push_back(dir.file("p" + std::to_string(k) + ".mmt"));
    pack_dataset(folder_parts.back(), folder, options);
    EXPECT_EQ(Dataset::open(folder_parts.back()).metadata().at("classes"), R"(["cat","dog","emu"])");
  }
  EXPECT_EQ(Dataset::open(folder_parts[0]).size(), 0);
  const Dataset photos = Dataset::open_concat(folder_parts);
  EXPECT_EQ(compare_with_sources(photos, folder), 3);
  EXPECT_EQ(photos.get(2, "label").item<int64_t>(), 2);
  // A folder's shards name its files in pack_source: however the folder is spelled, the same
  // value; after a file is renamed between runs, another.
  const auto source_of = [&](const std::string& folder_spelling, const std::string& out) {
    PackOptions options;
    options.shard = 1;
    options.shards = 4;
    pack_dataset(out, PackSources::from_folder(folder_spelling), options);
    return Dataset::open(out).metadata().at(std::string(kShardSourceMetadataKey));
  };
  const std::string as_packed = Dataset::open(folder_parts[1]).metadata().at(std::string(kShardSourceMetadataKey));
  EXPECT_EQ(source_of(dir.file("photos") + "/", dir.file("slash.mmt")), as_packed);
  EXPECT_EQ(source_of(dir.file("photos") + "/./", dir.file("dot.mmt")), as_packed);
  fs::rename(dir.path() / "photos" / "dog" / "b.jpg", dir.path() / "photos" / "dog" / "z.jpg");
  EXPECT_NE(source_of(dir.file("photos"), dir.file("renamed.mmt")), as_packed);
}

// A cancel flag stops a pack wherever it is set before the file is published, even by the
// progress report after the last records (a Ctrl-C there was lost: the pack went on to
// publish): the path keeps what it had.
TEST(PackerTest, CancelStopsThePackUntilTheFileIsPublished) {
  TempDir dir;
  save_npy(dir.file("a.npy"), arange(30, kInt32).view({10, 3}));
  const PackSources arrays = PackSources::from_arrays(std::vector<std::string>{"a=" + dir.file("a.npy")});
  std::atomic<bool> cancel{true};
  PackOptions options;
  options.cancel = &cancel;
  EXPECT_THROW_WITH(pack_dataset(dir.file("x.mmt"), arrays, options), PackCancelled,
                    "packing " + dir.file("x.mmt") + " was interrupted after 0 of 10 records; " + dir.file("x.mmt") +
                        " was not created");
  cancel = false;
  options.progress_interval_seconds = 0;  // a report after every batch: here one, of all 10 records
  options.on_progress = [&](const WriteStats& stats) {
    if (stats.records == 10) cancel = true;
  };
  EXPECT_THROW_WITH(pack_dataset(dir.file("x.mmt"), arrays, options), PackCancelled,
                    "was interrupted after 10 of 10 records; " + dir.file("x.mmt") + " was not created");
  EXPECT_EQ(folder_entries(dir), std::vector<std::string>{"a.npy"});
  // Over an old file (overwrite): the old file stays.
  cancel = false;
  options.on_progress = nullptr;
  pack_dataset(dir.file("x.mmt"), arrays, options);
  const std::string old_bytes = file_bytes(dir.file("x.mmt"));
  options.writer.overwrite = true;
  options.writer.codec = CodecSpec::parse("lz4");
  options.on_progress = [&](const WriteStats& stats) {
    if (stats.records == 10) cancel = true;
  };
  EXPECT_THROW_WITH(pack_dataset(dir.file("x.mmt"), arrays, options), PackCancelled,
                    dir.file("x.mmt") + " was left as it was");
  EXPECT_EQ(file_bytes(dir.file("x.mmt")), old_bytes);
}

// Shards cut from an input re-made between pack runs with other values of the same shape (same
// name, same size) are shards of two packs, not one: pack_source samples each input's bytes.
// A copy of the inputs elsewhere (another machine's disk) gives the same value.
TEST(PackerTest, ShardsOfAnInputRemadeWithOtherValuesAreShardsOfTwoPacks) {
  TempDir dir;
  const auto pack_source = [&](const std::string& input, const std::string& name, int64_t shard) {
    PackOptions options;
    options.shard = shard;
    options.shards = 3;
    const std::string out = dir.file(name);
    pack_dataset(out, PackSources::from_arrays(std::vector<std::string>{"a=" + input}), options);
    return Dataset::open(out).metadata().at(std::string(kShardSourceMetadataKey));
  };
  fs::create_directories(dir.path() / "here");
  fs::create_directories(dir.path() / "there");
  const std::string here = dir.file("here/a.npy"), there = dir.file("there/a.npy");
  save_npy(here, arange(30, kInt32).view({10, 3}));
  const std::string first = pack_source(here, "old0.mmt", 0);
  pack_source(here, "old1.mmt", 1);
  fs::copy_file(here, there);
  EXPECT_EQ(pack_source(there, "copy1.mmt", 1), first);
  // The same shard packed again with other options (here zstd chunks): other bytes, the same
  // records, the same shard given twice.
  PackOptions zstd;
  zstd.shard = 1;
  zstd.shards = 3;
  zstd.writer.codec = CodecSpec::parse("zstd");
  pack_dataset(dir.file("old1-zstd.mmt"), PackSources::from_arrays(std::vector<std::string>{"a=" + here}), zstd);
  EXPECT_NE(Dataset::open(dir.file("old1-zstd.mmt")).fingerprint(), Dataset::open(dir.file("old1.mmt")).fingerprint());
  EXPECT_THROW_WITH(Dataset::open_concat({dir.file("old0.mmt"), dir.file("old1.mmt"), dir.file("old1-zstd.mmt")}),
                    ValueError,
                    "shard 1 of 3 is given twice: part 1 (" + dir.file("old1.mmt") + ") and part 2 (" +
                        dir.file("old1-zstd.mmt") +
                        ") hold the same records (the first, middle and last compared) in other bytes: the shard "
                        "packed again with other options (codec, chunk size)?");
  // Compared bit for bit: a float field holding NaN (unequal to itself as a value) is the
  // same record all the same.
  save_npy(dir.file("nan.npy"), full({10, 2}, std::numeric_limits<float>::quiet_NaN(), kFloat32));
  const PackSources nan = PackSources::from_arrays(std::vector<std::string>{"f=" + dir.file("nan.npy")});
  for (const char* codec : {"none", "zstd"}) {
    PackOptions options;
    options.shard = 1;
    options.shards = 2;
    options.writer.codec = CodecSpec::parse(codec);
    pack_dataset(dir.file(std::string("nan1-") + codec + ".mmt"), nan, options);
  }
  EXPECT_THROW_WITH(Dataset::open_concat({dir.file("nan1-none.mmt"), dir.file("nan1-zstd.mmt")}), ValueError,
                    "hold the same records");
  save_npy(here, arange(1000, 1030, 1, kInt32).view({10, 3}));
  EXPECT_NE(pack_source(here, "new1.mmt", 1), first);
  pack_source(here, "new2.mmt", 2);
  const Dataset mixed = Dataset::open_concat({dir.file("old0.mmt"), dir.file("new1.mmt"), dir.file("new2.mmt")});
  EXPECT_EQ(mixed.metadata().count(std::string(kShardMetadataKey)), 0u);  // not one pack's shards
  EXPECT_EQ(Dataset::open_concat({dir.file("old0.mmt"), dir.file("copy1.mmt")}).metadata().at(
                std::string(kShardMetadataKey)),
            "0,1/3 of 10");

  // A large .npy: a value changed in its last 64 KiB changes the value; changed back, the value
  // is the first one again. (One between the blocks sampled would go unseen.)
  const int64_t rows = 1 << 18;  // 1 MiB of int32
  save_npy(there, arange(rows, kInt32).view({rows, 1}));
  const std::string large = pack_source(there, "large.mmt", 1);
  const auto change_byte_at = [&](int64_t offset) {
    testutil::Bytes bytes = testutil::read_file(there);
    bytes[static_cast<size_t>(offset)] ^= std::byte{1};
    testutil::write_file(there, bytes);
  };
  const int64_t size = static_cast<int64_t>(fs::file_size(there));
  change_byte_at(size - 5);
  EXPECT_NE(pack_source(there, "large-end.mmt", 1), large);
  change_byte_at(size - 5);
  EXPECT_EQ(pack_source(there, "large-back.mmt", 1), large);

  // An .npz: any changed value changes a member's CRC-32, which the archive's directory (at
  // its end) lists, wherever the value lies.
  const auto npz_source = [&](int32_t middle_value, bool deflate) {
    std::vector<int32_t> v(rows, 7);
    v[rows / 2 + 1000] = middle_value;
    testutil::write_file(dir.file("z.npz"),
                         testutil::zip_archive({{"a.npy", testutil::npy_file("<i4", false, "(262144,)",
                                                                             testutil::element_bytes(v, false)),
                                                 deflate}}));
    PackOptions options;
    options.shard = 0;
    options.shards = 2;
    options.writer.overwrite = true;
    pack_dataset(dir.file("z.mmt"), PackSources::from_arrays(std::vector<std::string>{dir.file("z.npz")}), options);
    return Dataset::open(dir.file("z.mmt")).metadata().at(std::string(kShardSourceMetadataKey));
  };
  for (bool deflate : {false, true}) {
    SCOPED_TRACE(deflate ? "deflated" : "stored");
    EXPECT_NE(npz_source(7, deflate), npz_source(8, deflate));
    EXPECT_EQ(npz_source(7, deflate), npz_source(7, deflate));
  }
}

// A folder record that differs named its source "data=DIR", which the user never typed; it
// names the file now, and the first byte that differs.
TEST(PackerTest, AFolderRecordThatDiffersNamesItsFile) {
  TempDir dir;
  write_text(dir.path() / "f1" / "cat" / "a.jpg", "meow");
  write_text(dir.path() / "f1" / "dog" / "b.jpg", "woof");
  pack_dataset(dir.file("o.mmt"), PackSources::from_folder(dir.file("f1")), {});
  write_text(dir.path() / "f1" / "cat" / "a.jpg", "meoW");
  const std::string message =
      error_of([&] { compare_with_sources(Dataset::open(dir.file("o.mmt")), PackSources::from_folder(dir.file("f1"))); });
  EXPECT_NE(message.find("record 0, field 'data' differs from its source " + (dir.path() / "f1" / "cat" / "a.jpg").string() +
                         " at byte 3 of the value"), std::string::npos) << message;
}

// A file in the current folder whose name holds '=' ("train=v2.npz") is that file, when the
// text after the '=' names no file: it was read as field "train" of the missing "v2.npz".
TEST(PackerTest, AFileNameWithAnEqualsSignIsAPath) {
  TempDir dir;
  save_npy(dir.file("train=v2.npy"), arange(4));
  std::string message, bare;
  PackSources sources;
  {
    const WorkingDirectory in_dir(dir.path());
    try {
      sources = PackSources::from_arrays(std::vector<std::string>{"x=train=v2.npy"});  // NAME=PATH, PATH with '='
    } catch (const std::exception& e) {
      message = e.what();
    }
    bare = error_of([] { PackSources::from_arrays(std::vector<std::string>{"train=v2.npy"}); });
  }
  EXPECT_EQ(message, "");
  EXPECT_EQ(sources.schema()[0].name, "x");
  // Bare, it is the .npy file itself, which needs a field name (not field "train" of "v2.npy").
  EXPECT_NE(bare.find("needs a field name: write NAME=train=v2.npy"), std::string::npos) << bare;
}

TEST(PackerTest, TheOutputCannotBeAnInputOrInsideTheInputFolder) {
  TempDir dir;
  save_npy(dir.file("x.npy"), arange(10));
  const std::string before = file_bytes(dir.file("x.npy"));
  const PackSources arrays = PackSources::from_arrays(std::vector<std::string>{"x=" + dir.file("x.npy")});
  PackOptions force;
  force.writer.overwrite = true;
  for (const std::string& output : {dir.file("x.npy"), (dir.path() / "." / "x.npy").string()}) {
    const std::string message = error_of([&] { pack_dataset(output, arrays, force); });
    EXPECT_NE(message.find("is also an input"), std::string::npos) << message;
  }
  fs::create_hard_link(dir.file("x.npy"), dir.file("same-inode.npy"));
  EXPECT_NE(error_of([&] { pack_dataset(dir.file("same-inode.npy"), arrays, force); }).find("is also an input"),
            std::string::npos);
  EXPECT_EQ(file_bytes(dir.file("x.npy")), before);

  write_text(dir.path() / "photos" / "cat" / "a.jpg", "meow");
  const PackSources folder = PackSources::from_folder(dir.file("photos"));
  for (const fs::path& output : {dir.path() / "photos" / "out.mmt", dir.path() / "photos" / "cat" / "out.mmt"}) {
    const std::string message = error_of([&] { pack_dataset(output.string(), folder, {}); });
    EXPECT_NE(message.find("lies inside the input folder"), std::string::npos) << message;
    EXPECT_FALSE(fs::exists(output));
  }
  // Relative paths from inside the folder: "out.mmt" does not exist yet, and weakly_canonical
  // gave it back relative, so `pack out.mmt --folder .` wrote its output among the classes,
  // where the next pack of the folder failed on it ("a file directly in . has no class").
  {
    std::string message;
    {
      const WorkingDirectory in_photos(dir.path() / "photos");
      message = error_of([] { pack_dataset("out.mmt", PackSources::from_folder("."), {}); });
    }
    EXPECT_NE(message.find("lies inside the input folder"), std::string::npos) << message;
    EXPECT_FALSE(fs::exists(dir.path() / "photos" / "out.mmt"));
  }
  // A sibling whose name starts like the folder's is outside it.
  pack_dataset(dir.file("photos2.mmt"), folder, {});
  EXPECT_EQ(Dataset::open(dir.file("photos2.mmt")).size(), 1);

  // A class folder linked from elsewhere, and a class file linked from elsewhere: the output may
  // neither land in the linked folder (it would be packed next time, or replace a record) nor
  // replace the linked file's target (the link would lead to the dataset).
  write_text(dir.path() / "shared_dogs" / "2.jpg", "woof");
  write_text(dir.path() / "elsewhere" / "3.jpg", "purr");
  fs::create_directory_symlink("../shared_dogs", dir.path() / "photos" / "dog");
  fs::create_symlink("../../elsewhere/3.jpg", dir.path() / "photos" / "cat" / "3.jpg");
  const PackSources linked = PackSources::from_folder(dir.file("photos"));
  ASSERT_EQ(linked.records(), 3);
  for (const fs::path& output : {dir.path() / "shared_dogs" / "2.jpg", dir.path() / "shared_dogs" / "out.mmt"}) {
    const std::string message = error_of([&] { pack_dataset(output.string(), linked, force); });
    EXPECT_NE(message.find("lies in a folder that the input folder"), std::string::npos) << message;
  }
  const std::string message = error_of([&] { pack_dataset(dir.file("elsewhere/3.jpg"), linked, force); });
  EXPECT_NE(message.find("is an input that a link in"), std::string::npos) << message;
  EXPECT_EQ(file_bytes(dir.file("shared_dogs/2.jpg")), "woof");
  EXPECT_EQ(file_bytes(dir.file("elsewhere/3.jpg")), "purr");
  EXPECT_FALSE(fs::exists(dir.file("shared_dogs/out.mmt")));
  pack_dataset(dir.file("elsewhere/out.mmt"), linked, {});  // beside a linked file: fine
}

// The anonymous memory this process holds (heap, not pages of mapped files): what a whole
// copy of an input adds.
int64_t anonymous_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("RssAnon:")) return std::stoll(line.substr(8)) * 1024;
  return -1;
}

// The same with the shared memory it maps (a file on a tmpfs): memory either way.
int64_t anonymous_and_shared_bytes() {
  std::ifstream status("/proc/self/status");
  int64_t bytes = 0;
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("RssAnon:") || line.starts_with("RssShmem:")) bytes += std::stoll(line.substr(9)) * 1024;
  return bytes;
}

// A limit on the size of files this process writes (RLIMIT_FSIZE), with SIGXFSZ ignored so
// that a write past it fails with EFBIG, as on a full disk; both put back on every way out.
class ScopedFileSizeLimit {
 public:
  explicit ScopedFileSizeLimit(rlim_t bytes) {
    EXPECT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit_), 0);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = old_limit_;
    limit.rlim_cur = bytes;
    EXPECT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  }
  ~ScopedFileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_limit_);
    std::signal(SIGXFSZ, old_handler_);
  }
  ScopedFileSizeLimit(const ScopedFileSizeLimit&) = delete;
  ScopedFileSizeLimit& operator=(const ScopedFileSizeLimit&) = delete;

 private:
  struct rlimit old_limit_ {};
  void (*old_handler_)(int) = nullptr;
};

// Packs `sources` (an .npz of fields "ids" and "small") into out.mmt and checks the dataset
// against them, at three records, and against load_npz(npz) whole.
void expect_packed_as_loaded(const TempDir& dir, const PackSources& sources, const std::string& npz) {
  pack_dataset(dir.file("out.mmt"), sources, {});
  Dataset ds = Dataset::open(dir.file("out.mmt"));
  const std::vector<int64_t> some{sources.records() - 1, 3, sources.records() / 2};
  EXPECT_EQ(compare_with_sources(ds, sources, some), 3);
  std::vector<NpzMember> loaded = load_npz(npz);
  EXPECT_TRUE(ds.column("ids").equal(loaded[0].array));
  EXPECT_TRUE(ds.column("small").equal(loaded[1].array));
}

// Values that cannot be used where they lie (a stored .npz member unaligned for its dtype, as
// numpy's ZIP headers leave most; a big-endian .npy) are converted a batch at a time: records
// come out right, and a large input is not copied into memory whole (it was: a 40 GB
// np.savez needed 40 GB of memory to pack).
TEST(PackerTest, UnalignedAndBigEndianArraysAreConvertedABatchAtATime) {
  TempDir dir;
  constexpr int64_t kRecords = 655360;  // float64 [8] (40 MiB) and big-endian int32 [8] (20 MiB)
  {
    std::vector<double> reals(kRecords * 8);
    std::vector<int32_t> ints(kRecords * 8);
    for (size_t i = 0; i < reals.size(); ++i) {
      reals[i] = static_cast<double>(i) * 0.5;
      ints[i] = static_cast<int32_t>(i) - 7;
    }
    // Not "(" + ...: gcc 12 warns falsely on it (-Wrestrict, its bug 105329).
    const std::string shape = std::string("(").append(std::to_string(kRecords)).append(", 8)");
    testutil::Bytes npz = testutil::zip_archive(
        {{"reals.npy", testutil::npy_file("<f8", false, shape, testutil::element_bytes(reals, false))}});
    testutil::write_file(dir.file("a.npz"), npz);
    testutil::write_file(dir.file("ints.npy"), testutil::npy_file(">i4", false, shape, testutil::element_bytes(ints, true)));
  }  // freed: big blocks go straight back to the system
  ASSERT_TRUE(load_npz(dir.file("a.npz"))[0].array.untyped_storage().filename().empty())
      << "the member must lie unaligned (load_npz copies it) for the test to mean anything";

  const int64_t before = anonymous_bytes();
  const PackSources sources =
      PackSources::from_arrays(std::vector<std::string>{dir.file("a.npz"), "ints=" + dir.file("ints.npy")});
  std::vector<Tensor> batch;
  ASSERT_TRUE(sources.record_batch(kRecords - 1000, 1000, batch));
  const int64_t grown = anonymous_bytes() - before;
  EXPECT_LT(grown, int64_t{16} << 20) << "the inputs hold 60 MiB that would have been copied";

  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(DimVector(batch[0].sizes()), (DimVector{1000, 8}));
  EXPECT_EQ(batch[0].select(0, 999).select(0, 7).item<double>(), static_cast<double>(kRecords * 8 - 1) * 0.5);
  EXPECT_EQ(batch[1].select(0, 999).select(0, 7).item<int32_t>(), static_cast<int32_t>(kRecords * 8 - 1) - 7);
  const std::vector<Tensor> one = sources.record(3);
  EXPECT_EQ(DimVector(one[0].sizes()), (DimVector{8}));
  EXPECT_EQ(one[0].select(0, 5).item<double>(), 29 * 0.5);
  EXPECT_EQ(one[1].select(0, 5).item<int32_t>(), 29 - 7);

  pack_dataset(dir.file("out.mmt"), sources, {});
  Dataset ds = Dataset::open(dir.file("out.mmt"));
  const std::vector<int64_t> some{0, 1, kRecords / 2, kRecords - 1};
  EXPECT_EQ(compare_with_sources(ds, sources, some), 4);
  EXPECT_TRUE(ds.column("reals").equal(load_npz(dir.file("a.npz"))[0].array));
  EXPECT_TRUE(ds.column("ints").equal(load_npy(dir.file("ints.npy"))));
}

// A deflated member (np.savez_compressed) is inflated a batch of records at a time as it is
// packed, not whole into memory; its CRC-32 is checked when its last byte is read, and a
// mismatch fails the pack and leaves nothing. Random reads (compare_with_sources) work too.
TEST(PackerTest, DeflatedMembersAreInflatedABatchAtATime) {
  TempDir dir;
  constexpr int64_t kRecords = 1 << 20;  // int64 [8]: 64 MiB inflated
  testutil::Bytes archive;
  {
    std::vector<int64_t> ids(kRecords * 8);
    std::vector<int16_t> small(kRecords);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i % 1000) - 3;
    for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<int16_t>(i % 300);
    const std::string records = std::to_string(kRecords);
    archive = testutil::zip_archive(
        {{"ids.npy", testutil::npy_file("<i8", false, std::string("(").append(records).append(", 8)"),
                                        testutil::element_bytes(ids, false)), /*deflate=*/true},
         {"small.npy", testutil::npy_file(">i2", false, std::string("(").append(records).append(",)"),
                                          testutil::element_bytes(small, true)), /*deflate=*/true}});
  }
  testutil::write_file(dir.file("c.npz"), archive);

  const int64_t before = anonymous_bytes();
  const PackSources sources = PackSources::from_arrays(std::vector<std::string>{dir.file("c.npz")});
  std::vector<Tensor> batch;
  ASSERT_TRUE(sources.record_batch(kRecords - 10, 10, batch));
  EXPECT_LT(anonymous_bytes() - before, int64_t{24} << 20) << "the member inflates to 66 MiB";
  EXPECT_EQ(batch[0].select(0, 9).select(0, 7).item<int64_t>(), static_cast<int64_t>((kRecords * 8 - 1) % 1000) - 3);
  EXPECT_EQ(batch[1].select(0, 9).item<int16_t>(), static_cast<int16_t>((kRecords - 1) % 300));
  EXPECT_EQ(sources.record(5)[0].select(0, 2).item<int64_t>(), 42 - 3);  // a read behind: starts over

  expect_packed_as_loaded(dir, sources, dir.file("c.npz"));

  // The central directory's CRC of the first member, flipped: found at its last byte.
  const size_t central = archive.size() - 22 - 2 * 46 - std::string("ids.npy").size() - std::string("small.npy").size();
  archive[central + 16] ^= std::byte{1};
  testutil::write_file(dir.file("bad.npz"), archive);
  const PackSources bad = PackSources::from_arrays(std::vector<std::string>{dir.file("bad.npz")});
  EXPECT_THROW_WITH(pack_dataset(dir.file("bad.mmt"), bad, {}), ChecksumError, "member 'ids.npy': CRC-32 mismatch");
  EXPECT_FALSE(fs::exists(dir.file("bad.mmt")));
  // A shard that stops before the member's end reads the rest, so it is refused too.
  PackOptions first_half;
  first_half.shards = 2;
  EXPECT_THROW_WITH(pack_dataset(dir.file("bad.mmt"), bad, first_half), ChecksumError,
                    "member 'ids.npy': CRC-32 mismatch");
  EXPECT_FALSE(fs::exists(dir.file("bad.mmt")));
}

// A Fortran-order array's records are not contiguous bytes, so a deflated one cannot be
// inflated a batch of records at a time: it is inflated once into an unnamed temporary file,
// converted to native byte order on the way, and mapped. Packing it then costs the page
// cache, not the process's memory (it took the whole array in memory before), and a missing
// temporary folder is a clear error.
TEST(PackerTest, FortranOrderDeflatedMembersAreInflatedIntoATemporaryFileNotIntoMemory) {
  TempDir dir;
  constexpr int64_t kRecords = 1 << 20;  // int64 [8] (64 MiB) and big-endian int16 [3] (6 MiB)
  auto id = [](int64_t i, int64_t k) { return static_cast<int64_t>((i * 8 + k) % 1000) - 3; };
  auto small_value = [](int64_t i, int64_t k) { return static_cast<int16_t>((i + 7 * k) % 30000 - 15000); };
  {
    std::vector<int64_t> ids(kRecords * 8);  // Fortran order: the record index varies fastest
    std::vector<int16_t> small(kRecords * 3);
    for (int64_t k = 0; k < 8; ++k)
      for (int64_t i = 0; i < kRecords; ++i) ids[static_cast<size_t>(k * kRecords + i)] = id(i, k);
    for (int64_t k = 0; k < 3; ++k)
      for (int64_t i = 0; i < kRecords; ++i) small[static_cast<size_t>(k * kRecords + i)] = small_value(i, k);
    const std::string records = std::to_string(kRecords);
    testutil::write_file(
        dir.file("f.npz"),
        testutil::zip_archive(
            {{"ids.npy", testutil::npy_file("<i8", true, "(" + records + ", 8)", testutil::element_bytes(ids, false)),
              /*deflate=*/true},
             {"small.npy", testutil::npy_file(">i2", true, "(" + records + ", 3)", testutil::element_bytes(small, true)),
              /*deflate=*/true}}));
  }
  // The temporary file goes to the test's folder. On a disk its pages are the page cache's;
  // on a tmpfs (where this check cannot see them: no process is charged for them) memory.
  const ScopedEnv tmpdir("TMPDIR", dir.path());
  const int64_t before = anonymous_and_shared_bytes();
  const PackSources sources = PackSources::from_arrays(std::vector<std::string>{dir.file("f.npz")});
  std::vector<Tensor> batch;
  ASSERT_TRUE(sources.record_batch(kRecords - 10, 10, batch));
  EXPECT_LT(anonymous_and_shared_bytes() - before, int64_t{24} << 20) << "the members inflate to 70 MiB";
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1)
      << "the temporary file has no name: nothing but f.npz is in the folder";
  for (int64_t k = 0; k < 8; ++k) EXPECT_EQ(batch[0].select(0, 9).select(0, k).item<int64_t>(), id(kRecords - 1, k));
  for (int64_t k = 0; k < 3; ++k)
    EXPECT_EQ(batch[1].select(0, 9).select(0, k).item<int16_t>(), small_value(kRecords - 1, k));

  expect_packed_as_loaded(dir, sources, dir.file("f.npz"));

  // A big-endian Fortran-order .npy is converted the same way, not copied into memory whole.
  {
    std::vector<int32_t> wide(kRecords * 8);
    for (int64_t k = 0; k < 8; ++k)
      for (int64_t i = 0; i < kRecords; ++i) wide[static_cast<size_t>(k * kRecords + i)] = static_cast<int32_t>(i * 8 + k);
    testutil::write_file(dir.file("wide.npy"), testutil::npy_file(">i4", true, "(" + std::to_string(kRecords) + ", 8)",
                                                                  testutil::element_bytes(wide, true)));
  }
  const int64_t before_wide = anonymous_and_shared_bytes();
  const PackSources wide = PackSources::from_arrays(std::vector<std::string>{"wide=" + dir.file("wide.npy")});
  ASSERT_TRUE(wide.record_batch(kRecords - 10, 10, batch));
  EXPECT_LT(anonymous_and_shared_bytes() - before_wide, int64_t{16} << 20) << "the array holds 32 MiB";
  EXPECT_EQ(batch[0].select(0, 9).select(0, 5).item<int32_t>(), static_cast<int32_t>((kRecords - 1) * 8 + 5));
  EXPECT_TRUE(wide.record(3)[0].equal(tensor(std::vector<int32_t>{24, 25, 26, 27, 28, 29, 30, 31})));

  // Nowhere to convert to, or no room there: the error names the member, what it needed,
  // and the way out; the checks of the sources come first.
  {
    const ScopedEnv missing("TMPDIR", dir.file("missing"));
    const std::string message = error_of([&] { PackSources::from_arrays(std::vector<std::string>{dir.file("f.npz")}); });
    EXPECT_NE(message.find("ids.npy"), std::string::npos) << message;
    EXPECT_NE(message.find("Fortran-order"), std::string::npos) << message;
    EXPECT_NE(message.find(dir.file("missing")), std::string::npos) << message;
  }
  {
    // A full disk, as a file size limit gives it (EFBIG, with SIGXFSZ ignored).
    const ScopedFileSizeLimit limit(1 << 20);
    const std::string message = error_of([&] { PackSources::from_arrays(std::vector<std::string>{dir.file("f.npz")}); });
    EXPECT_NE(message.find("ids.npy"), std::string::npos) << message;
    EXPECT_NE(message.find(std::to_string(kRecords * 8 * 8) + " bytes"), std::string::npos) << message;
    EXPECT_NE(message.find("set TMPDIR"), std::string::npos) << message;
    // Every source is checked before anything is converted, whichever comes first: a
    // conversion here would fail on the limit instead.
    testutil::write_file(dir.file("five.npy"),
                         testutil::npy_file("<i4", false, "(5,)", testutil::element_bytes(std::vector<int32_t>(5), false)));
    for (const auto& inputs : {std::vector<std::string>{"five=" + dir.file("five.npy"), dir.file("f.npz")},
                               std::vector<std::string>{dir.file("f.npz"), "five=" + dir.file("five.npy")}})
      EXPECT_THROW_WITH(PackSources::from_arrays(inputs), ValueError, "record counts disagree");
  }
}

// A file named as a dataset, an Arrow or a Parquet file is read as one however damaged (an
// interrupted download, an empty file): its reader names what is wrong, where the array
// inputs would ask for a NAME= that could not help.
TEST(Packer, FilesNamedAsDatasetsArrowOrParquetAreJudgedByTheirReader) {
  TempDir dir;
  const auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir.file(name), std::ios::binary) << bytes;
    return dir.file(name);
  };
  const auto from = [](const std::string& path) { return PackSources::from_inputs(std::vector<std::string>{path}); };
  EXPECT_THROW_WITH(from(write("e.mmt", "")), FormatError, "e.mmt: empty file, not an mmtensor dataset");
  EXPECT_THROW_WITH(from(write("d.mmt", "MMTENSOX12345678")), FormatError,
                    "d.mmt: not an mmtensor dataset: the first 8 bytes are not the mmtensor magic");
  EXPECT_THROW_WITH(from(write("e.parquet", "")), FormatError, "e.parquet: 0 bytes: not a Parquet file");
  EXPECT_THROW_WITH(from(write("s.parquet", "PAR1xxxx")), FormatError,
                    "s.parquet: 8 bytes, too few for a Parquet file (at least 12");
  EXPECT_THROW_WITH(from(write("e.arrow", "")), FormatError, "e.arrow: an empty file, not an Arrow IPC file or stream");
}

}  // namespace
}  // namespace mmt
