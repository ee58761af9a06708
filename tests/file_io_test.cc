// The writer's I/O seam under injected faults: whichever step fails, the target path holds
// the old file or nothing, no temporary file is left, and the error names the step.
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string_view>

#include "file_io.h"
#include "temp_files.h"
#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "test_util.h"

namespace mmt {
namespace {

using io::Fault;
using io::ScopedFault;
using io::Step;
using testing::TempDir;

using testing::file_bytes;
using testing::folder_entries;

// Writes a small compressed dataset of `records` records (several chunks).
void write_small(const std::string& path, int64_t records, bool overwrite) {
  WriterOptions options;
  options.codec = CodecSpec::parse("lz4");
  options.chunk_records = 8;
  options.threads = 2;
  options.overwrite = overwrite;
  options.alignment = 64;
  DatasetWriter writer = DatasetWriter::create(path, Schema({Field::fixed("x", kInt64, {4}), Field::bytes("b")}), options);
  for (int64_t i = 0; i < records; ++i) writer.append({full({4}, static_cast<double>(i), kInt64), full({i % 5}, 1, kUInt8)});
  writer.finish();
}

TEST(FileIoTest, WritableFileWritesPadsAndRefusesExistingFiles) {
  TempDir dir;
  const std::string path = dir.file("f.bin");
  io::WritableFile file = io::WritableFile::create(path);
  file.write("abc", 3);
  file.pad_to(8);
  EXPECT_EQ(file.offset(), 8);
  file.fsync();
  file.close();
  EXPECT_EQ(file_bytes(path), std::string("abc\0\0\0\0\0", 8));
  EXPECT_THROW(io::WritableFile::create(path), IoError);
  io::rename_file(path, dir.file("g.bin"), /*replace=*/false);
  EXPECT_FALSE(std::filesystem::exists(path));
  io::fsync_parent_dir(dir.file("g.bin"));
  io::remove_file(dir.file("g.bin"));
  io::remove_file(dir.file("g.bin"));  // missing: not an error
  EXPECT_EQ(io::parent_dir("a"), ".");
  EXPECT_EQ(io::parent_dir("/a"), "/");
  EXPECT_EQ(io::parent_dir("x/y/a"), "x/y");
}

TEST(FileIoTest, FaultInjectorFailsTheNthCallOnceOrForever) {
  TempDir dir;
  io::WritableFile file = io::WritableFile::create(dir.file("f.bin"));
  {
    ScopedFault fault({Step::Write, 2, false, EIO});
    file.write("a", 1);
    EXPECT_THROW(file.write("b", 1), IoError);
    file.write("c", 1);
    EXPECT_EQ(io::FaultInjector::calls(Step::Write), 3);
  }
  {
    ScopedFault fault({Step::Write, 1, true, EIO});
    EXPECT_THROW(file.write("d", 1), IoError);
    EXPECT_THROW(file.write("e", 1), IoError);
  }
  file.write("f", 1);
  {
    ScopedFault fault({Step::Write, 1, false, ENOSPC});
    try {
      file.write("0123456789", 10);
      FAIL();
    } catch (const IoError& e) {
      EXPECT_EQ(e.errno_value(), ENOSPC);
      EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(file.offset(), 3 + 5);  // the full disk took half of the last write
  ScopedFault alloc({Step::Allocate, 1, false, ENOMEM});
  EXPECT_THROW(io::allocate(100, "a test buffer"), IoError);
  EXPECT_NE(io::allocate(100, "a test buffer"), nullptr);
}

struct StepCase {
  Step step;
  int errno_value;
  const char* named;
};

class WriterFault : public ::testing::TestWithParam<StepCase> {};

// Fails every call of the step in turn (1st, 2nd, ...) and checks what each failure leaves.
TEST_P(WriterFault, OldFileOrNothingAndNoTemporary) {
  const StepCase c = GetParam();
  for (bool old_file : {false, true}) {
    TempDir dir;
    const std::string path = dir.file("d.mmt");
    std::string old_bytes;
    if (old_file) {
      write_small(path, 3, false);
      old_bytes = file_bytes(path);
    }
    int64_t calls = 0;
    {
      ScopedFault count({c.step, std::numeric_limits<int64_t>::max(), false, c.errno_value});
      write_small(dir.file("count.mmt"), 40, false);
      calls = io::FaultInjector::calls(c.step);
      std::filesystem::remove(dir.file("count.mmt"));
    }
    ASSERT_GT(calls, 0);
    for (int64_t nth = 1; nth <= calls; ++nth) {
      SCOPED_TRACE(::testing::Message() << io::step_name(c.step) << " #" << nth << (old_file ? " over an old file" : ""));
      bool failed = false;
      int64_t calls_made = 0;
      {
        ScopedFault fault({c.step, nth, false, c.errno_value});
        try {
          write_small(path, 40, /*overwrite=*/true);
        } catch (const IoError& e) {
          failed = true;
          EXPECT_NE(std::string(e.what()).find(c.named), std::string::npos) << e.what();
          EXPECT_EQ(e.errno_value(), c.errno_value);
        }
        calls_made = io::FaultInjector::calls(c.step);
      }
      if (!failed) {
        // Allocations depend on timing (the writer reuses the buffers its compression threads
        // hand back), so a run may make fewer than the counting run did. Then the nth call never
        // came, and the write must have completed.
        ASSERT_LT(calls_made, nth) << "call #" << nth << " was made but did not fail the write";
        ASSERT_EQ(Dataset::open(path).size(), 40);
        ASSERT_EQ(folder_entries(dir), std::vector<std::string>{"d.mmt"});
        std::filesystem::remove(path);  // back to the starting state for the next call
        if (old_file) std::ofstream(path, std::ios::binary) << old_bytes;
        continue;
      }
      std::vector<std::string> entries = folder_entries(dir);
      if (c.step == Step::DirFsync) {
        // The rename already happened: the new, complete dataset is in place.
        ASSERT_EQ(entries, std::vector<std::string>{"d.mmt"});
        EXPECT_EQ(Dataset::open(path).size(), 40);
        std::filesystem::remove(path);
        if (old_file) {
          std::ofstream(path, std::ios::binary) << old_bytes;
        }
      } else if (old_file) {
        ASSERT_EQ(entries, std::vector<std::string>{"d.mmt"});
        EXPECT_EQ(file_bytes(path), old_bytes);
      } else {
        ASSERT_TRUE(entries.empty()) << entries[0];
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Steps, WriterFault,
                         ::testing::Values(StepCase{Step::Open, EACCES, "create of "},
                                           StepCase{Step::Write, EIO, "write of "},
                                           StepCase{Step::Write, ENOSPC, "No space left on device"},
                                           StepCase{Step::Fsync, EIO, "fsync of "},
                                           StepCase{Step::Rename, EXDEV, "rename of "},
                                           StepCase{Step::DirFsync, EIO, "folder fsync of "},
                                           StepCase{Step::Allocate, ENOMEM, "allocation of "}),
                         [](const auto& info) {
                           std::string name = io::step_name(info.param.step);
                           for (char& ch : name)
                             if (ch == ' ') ch = '_';
                           return name + "_" + std::to_string(info.param.errno_value);
                         });

TEST(FileIoTest, FailureForeverDuringAppendAbortsTheWriter) {
  TempDir dir;
  WriterOptions options;
  options.chunk_records = 4;
  DatasetWriter writer = DatasetWriter::create(dir.file("w.mmt"), Schema({Field::fixed("x", kInt64, {})}), options);
  EXPECT_TRUE(writer.is_open());
  {
    ScopedFault fault({Step::Write, 1, true, ENOSPC});
    EXPECT_THROW(
        for (int i = 0; i < 100; ++i) writer.append({full({}, i, kInt64)}), IoError);
  }
  EXPECT_TRUE(folder_entries(dir).empty());
  EXPECT_FALSE(writer.is_open());  // failed: nothing left to finish
  EXPECT_THROW(writer.append({full({}, 1, kInt64)}), ValueError);  // aborted: says so
  // Open until finished or aborted; a value refused before anything is written leaves it open.
  DatasetWriter done = DatasetWriter::create(dir.file("done.mmt"), Schema({Field::fixed("x", kInt64, {})}));
  EXPECT_THROW(done.append({full({2}, 1, kInt64)}), ValueError);
  EXPECT_TRUE(done.is_open());
  done.finish();
  EXPECT_FALSE(done.is_open());
  DatasetWriter dropped = DatasetWriter::create(dir.file("dropped.mmt"), Schema({Field::fixed("x", kInt64, {})}));
  dropped.abort();
  EXPECT_FALSE(dropped.is_open());
  EXPECT_FALSE(DatasetWriter(std::move(dropped)).is_open());
}

std::span<const std::byte> bytes_of(std::string_view text) { return std::as_bytes(std::span(text)); }

// A group of files changes all together or not at all: until publish() nothing is in place,
// and a rename that fails part-way takes back the ones already placed.
// A file written out of order (export's Fortran order): bytes land where they are put, and a
// write past the end, a fill that leaves bytes unwritten, a fill that throws or a failing
// write leave no temporary behind.
TEST(StagedFilesTest, PositionedWritesLandInPlaceAndFailuresLeaveNothing) {
  TempDir dir;
  const std::string target = dir.file("f.npy");
  auto fill_abc = [](const detail::WriteAt& write_at) {
    write_at(2, bytes_of("c"));
    write_at(0, bytes_of("ab"));
    write_at(3, bytes_of("def"));
  };
  {
    detail::StagedFiles files(/*replace=*/false);
    files.stage_positioned(target, 6, fill_abc);
    files.publish();
  }
  EXPECT_EQ(file_bytes(target), "abcdef");
  const auto refused = [&](int64_t nbytes, const std::function<void(const detail::WriteAt&)>& fill,
                           const std::string& why) {
    SCOPED_TRACE(why);
    detail::StagedFiles files(/*replace=*/true);
    try {
      files.stage_positioned(target, nbytes, fill);
      ADD_FAILURE() << "not refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    EXPECT_EQ(folder_entries(dir), std::vector<std::string>{"f.npy"}) << "no temporary is left";
  };
  refused(5, fill_abc, "3 bytes at offset 3 go past the file's 5 bytes");
  refused(7, fill_abc, "6 bytes written of " + target + "'s 7: the rest would be left as zeros");
  refused(6, [](const detail::WriteAt& write_at) { write_at(0, bytes_of("ab")); throw ValueError("a damaged chunk"); },
          "a damaged chunk");
  {
    ScopedFault fault({.step = Step::Write, .nth = 2, .errno_value = ENOSPC});
    refused(6, fill_abc, "No space left on device");
  }
  EXPECT_EQ(file_bytes(target), "abcdef") << "the published file is untouched";
}

TEST(StagedFilesTest, PublishPutsEveryFileInPlaceOrNone) {
  TempDir dir;
  const std::string old_file = dir.file("old.npy"), new_file = dir.file("new.npy"), third = dir.file("third.npy");
  { std::ofstream(old_file) << "old content"; }
  {
    detail::StagedFiles files(/*replace=*/true);
    files.stage(old_file, {bytes_of("replaced")});
    files.stage(new_file, {bytes_of("created")});
    EXPECT_EQ(file_bytes(old_file), "old content") << "nothing is in place before publish()";
    EXPECT_FALSE(std::filesystem::exists(new_file));
  }  // destroyed unpublished: the temporaries go
  EXPECT_EQ(folder_entries(dir), std::vector<std::string>{"old.npy"});

  // The third rename fails: the first file gets its old content back, the second goes.
  {
    detail::StagedFiles files(/*replace=*/true);
    files.stage(old_file, {bytes_of("replaced")});
    files.stage(new_file, {bytes_of("created")});
    files.stage(third, {bytes_of("third")});
    ScopedFault fault({.step = Step::Rename, .nth = 3, .errno_value = EIO});
    EXPECT_THROW(files.publish(), IoError);
  }
  EXPECT_EQ(file_bytes(old_file), "old content");
  EXPECT_EQ(folder_entries(dir), std::vector<std::string>{"old.npy"}) << "no file or temporary is left";

  {
    detail::StagedFiles files(/*replace=*/true);
    files.stage(old_file, {bytes_of("replaced")});
    files.stage(new_file, {bytes_of("created"), bytes_of(" in two pieces")});
    files.publish();
  }
  EXPECT_EQ(file_bytes(old_file), "replaced");
  EXPECT_EQ(file_bytes(new_file), "created in two pieces");
  EXPECT_EQ(folder_entries(dir), (std::vector<std::string>{"new.npy", "old.npy"})) << "no backup is left";

  // Without replace, an existing target is refused when staged, and one that appears after
  // staging is refused by the rename, and the files placed before it are taken back.
  detail::StagedFiles no_replace(/*replace=*/false);
  EXPECT_THROW_WITH(no_replace.stage(old_file, {bytes_of("x")}), IoError, "old.npy already exists; it is kept");
  no_replace.stage(dir.file("a.npy"), {bytes_of("a")});
  no_replace.stage(third, {bytes_of("third")});
  { std::ofstream(third) << "appeared"; }
  EXPECT_THROW(no_replace.publish(), IoError);
  EXPECT_FALSE(std::filesystem::exists(dir.file("a.npy")));
  EXPECT_EQ(file_bytes(third), "appeared");
}

}  // namespace
}  // namespace mmt
