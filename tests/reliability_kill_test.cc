// `mmt pack` killed with SIGKILL, at random moments and at the named points of publication:
// every time, the target path holds nothing (when there was nothing), the old file byte for
// byte, or the new complete file that `mmt verify` accepts; nothing else appears in the
// folder but the killed process's own temporary file (a SIGKILL leaves no chance to remove
// it; it is never at the target path).
//
// The named points come from MMT_CRASH_AT (engine/file_io.cc), read by the child only:
//   after-write   every byte written, the file not yet fsynced   -> old file or nothing
//   after-fsync   the file fsynced, not yet renamed               -> old file or nothing
//   after-rename  renamed onto the target, folder not yet fsynced -> the new file, complete
//
// CI runs a short loop; MMT_KILL_ITERATIONS=N runs N random kills (docs/RELIABILITY.md
// records the last long run).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <thread>

#include "checksum.h"
#include "mmtensor/dataset.h"
#include "mmtensor/numpy_io.h"
#include "test_util.h"

extern char** environ;

namespace mmt {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using Clock = std::chrono::steady_clock;

const std::string kMmt = std::string(MMT_BINARY_DIR) + "/mmt";

uint64_t file_hash(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes{std::istreambuf_iterator<char>(in), {}};
  return detail::checksum64(bytes.data(), bytes.size());
}

// Starts mmt with `args` (and `extra_env` on top of ours), its output thrown away.
pid_t spawn_mmt(const std::vector<std::string>& args, const std::vector<std::string>& extra_env = {}) {
  std::vector<char*> argv{const_cast<char*>(kMmt.c_str())};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  for (const std::string& e : extra_env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, kMmt.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw IoError(detail::str("posix_spawn of ", kMmt, ": ", std::strerror(rc)), rc);
  return pid;
}

// The child's exit code, or 128 + signal.
int wait_for(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int run_mmt(const std::vector<std::string>& args, const std::vector<std::string>& extra_env = {}) {
  return wait_for(spawn_mmt(args, extra_env));
}

enum class Outcome { Nothing, OldFile, NewFile };
const char* outcome_name(Outcome o) {
  return o == Outcome::Nothing ? "nothing" : o == Outcome::OldFile ? "old file" : "new file";
}

class ReliabilityKill : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kMmt)) GTEST_SKIP() << kMmt << " is not built";
    // 24 MiB of float32 values that lz4 compresses a little: packing takes a moment.
    constexpr int64_t kRows = 6144, kCols = 1024;
    Tensor values = empty({kRows, kCols}, kFloat32);
    std::mt19937 rng(3);
    float* p = static_cast<float*>(values.mutable_data_ptr());
    for (int64_t i = 0; i < kRows * kCols; ++i) p[i] = static_cast<float>(rng() % 1000) / 8.0f;
    save_npy(source_, values);
    save_npy(old_source_, full({3, 5}, 1.5, kFloat64));
    // The old file and the reference new file, packed once, completely.
    ASSERT_EQ(run_mmt({"pack", old_path_, "old=" + old_source_, "--quiet"}), 0);
    ASSERT_EQ(run_mmt({"pack", reference_path_, "x=" + source_, "--quiet", "--codec", "lz4", "--chunk-bytes", "256K"}), 0);
    old_hash_ = file_hash(old_path_);
    new_hash_ = file_hash(reference_path_);
  }

  // The pack command every iteration runs, replacing the target.
  std::vector<std::string> pack_args() const {
    return {"pack", target_, "x=" + source_, "--force", "--quiet", "--codec", "lz4", "--chunk-bytes", "256K"};
  }

  // Puts the old file at the target (or nothing), and nothing else in the work folder.
  void prepare(bool with_old_file) {
    for (const auto& entry : fs::directory_iterator(work_.path())) fs::remove(entry.path());
    if (with_old_file) fs::copy_file(old_path_, target_);
  }

  // What the target holds now; fails the test for anything but the three allowed states.
  // Also checks that the folder holds nothing but the target and the killed packer's temporary.
  Outcome inspect(bool had_old_file, pid_t packer, int* temporaries) {
    *temporaries = 0;
    const std::string temp_prefix = "out.mmt.tmp-" + std::to_string(packer) + "-";
    for (const auto& entry : fs::directory_iterator(work_.path())) {
      const std::string name = entry.path().filename();
      if (name == "out.mmt") continue;
      EXPECT_EQ(name.rfind(temp_prefix, 0), 0u) << "unexpected file " << name;
      ++*temporaries;
    }
    if (!fs::exists(target_)) {
      EXPECT_FALSE(had_old_file) << "the old file disappeared";
      return Outcome::Nothing;
    }
    const uint64_t hash = file_hash(target_);
    if (had_old_file && hash == old_hash_) return Outcome::OldFile;
    EXPECT_EQ(hash, new_hash_) << "the target is neither the old file nor the complete new one";
    EXPECT_EQ(run_mmt({"verify", target_}), 0) << "mmt verify refuses the published file";
    return Outcome::NewFile;
  }

  TempDir dir_;
  TempDir work_;
  const std::string source_ = dir_.file("x.npy");
  const std::string old_source_ = dir_.file("old.npy");
  const std::string old_path_ = dir_.file("old.mmt");
  const std::string reference_path_ = dir_.file("reference.mmt");
  const std::string target_ = work_.file("out.mmt");
  uint64_t old_hash_ = 0;
  uint64_t new_hash_ = 0;
};

TEST_F(ReliabilityKill, OutputIsDeterministicSoTheNewFileCanBeRecognised) {
  prepare(false);
  ASSERT_EQ(run_mmt(pack_args()), 0);
  EXPECT_EQ(file_hash(target_), new_hash_) << "two packs of the same input differ: the kill loop needs "
                                              "a byte-exact reference";
}

TEST_F(ReliabilityKill, KilledAtTheNamedPointsOfPublication) {
  struct Point {
    const char* name;
    Outcome with_old;
    Outcome without_old;
  };
  const Point points[] = {{"after-write", Outcome::OldFile, Outcome::Nothing},
                          {"after-fsync", Outcome::OldFile, Outcome::Nothing},
                          {"after-rename", Outcome::NewFile, Outcome::NewFile}};
  for (const Point& point : points) {
    for (bool with_old : {false, true}) {
      SCOPED_TRACE(std::string(point.name) + (with_old ? ", replacing an old file" : ", no old file"));
      prepare(with_old);
      pid_t pid = spawn_mmt(pack_args(), {std::string("MMT_CRASH_AT=") + point.name});
      EXPECT_EQ(wait_for(pid), 128 + SIGKILL) << "the crash point was not reached";
      int temporaries = 0;
      const Outcome outcome = inspect(with_old, pid, &temporaries);
      EXPECT_EQ(outcome_name(outcome), outcome_name(with_old ? point.with_old : point.without_old));
      // Before the rename the temporary is still there; after it, it has become the target.
      EXPECT_EQ(temporaries, outcome == Outcome::NewFile ? 0 : 1);
    }
  }
}

TEST_F(ReliabilityKill, KilledAtRandomMoments) {
  // How long a whole run takes, to spread the kills over it (and a little past it).
  prepare(false);
  const auto started = Clock::now();
  ASSERT_EQ(run_mmt(pack_args()), 0);
  const int64_t full_run_us =
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - started).count();

  const char* env = std::getenv("MMT_KILL_ITERATIONS");
  const int iterations = env ? std::atoi(env) : 24;
  const uint64_t seed = std::random_device{}();
  std::mt19937_64 rng(seed);
  // Half the kills anywhere in the run, half in its last fifth, where publication happens.
  std::uniform_int_distribution<int64_t> anywhere_us(0, full_run_us * 11 / 10);
  std::uniform_int_distribution<int64_t> near_the_end_us(full_run_us * 8 / 10, full_run_us * 11 / 10);
  std::map<std::string, int> tally;
  int temporaries_left = 0;
  for (int i = 0; i < iterations; ++i) {
    const bool with_old = i % 2 == 1;
    const int64_t kill_after_us = i % 4 < 2 ? anywhere_us(rng) : near_the_end_us(rng);
    SCOPED_TRACE(detail::str("iteration ", i, " (seed ", seed, "): kill after ", kill_after_us, " us of a ",
                             full_run_us, " us run", with_old ? ", replacing an old file" : ""));
    prepare(with_old);
    pid_t pid = spawn_mmt(pack_args());
    std::this_thread::sleep_for(std::chrono::microseconds(kill_after_us));
    ::kill(pid, SIGKILL);
    const int exit_code = wait_for(pid);
    int temporaries = 0;
    const Outcome outcome = inspect(with_old, pid, &temporaries);
    temporaries_left += temporaries;
    if (exit_code == 0) {
      EXPECT_EQ(outcome_name(outcome), outcome_name(Outcome::NewFile)) << "finished cleanly";
    }
    ++tally[std::string(outcome_name(outcome)) + (exit_code == 128 + SIGKILL ? " (killed)" : " (finished)")];
    if (::testing::Test::HasFailure()) break;
  }
  std::string summary = detail::str(iterations, " kills over a ", full_run_us / 1000, " ms pack (seed ", seed, "):");
  for (const auto& [outcome, count] : tally) summary += detail::str(" ", outcome, " x", count, ";");
  summary += detail::str(" temporaries left by SIGKILL: ", temporaries_left);
  std::printf("%s\n", summary.c_str());
  RecordProperty("summary", summary);
}

}  // namespace
}  // namespace mmt
