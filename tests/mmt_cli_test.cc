// The `mmt` command end to end: pack then export/get gives the inputs back for every input
// kind and codec; bad input gives a clear message, a non-zero exit and nothing new at the
// output path (missing files, mismatched counts, unsupported dtypes, corrupt headers, wrong
// magics, unreadable folder files, an existing output, a full disk, Ctrl-C).
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>

#include "crafted_file_util.h"
#include "file_io.h"
#include "importer_test_util.h"
#include "arrow_test_util.h"
#include "tfrecord_test_util.h"
#include "mds_test_util.h"
#include "megatron_test_util.h"
#include "tar_test_util.h"
#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "mmtensor/idx_io.h"
#include "mmtensor/numpy_io.h"
#include "mmtensor/packer.h"

namespace mmt {
namespace {

namespace fs = std::filesystem;
using testutil::Bytes;
using testutil::TempFolder;

const std::string kMmt = std::string(MMT_BINARY_DIR) + "/mmt";

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

struct RunOptions {
  int64_t file_size_limit_bytes = -1;  // RLIMIT_FSIZE in the child: a "full disk"
  // Send interrupt_signal once a file whose path starts with this appears (the writer's
  // temporary: by then mmt is surely packing, however slowly a loaded machine started it; a
  // fixed delay could land before mmt installed its handlers, or after it finished).
  std::string interrupt_once_exists;
  // Or once the child has mapped the file at this path (an input being read: nothing of the
  // output exists yet).
  std::string interrupt_once_mapped;
  int interrupt_signal = SIGINT;
  std::chrono::milliseconds interrupt_delay{0};  // after the file appeared, before the signal
  std::function<void()> instead_of_signal;  // run this then, and send no signal
  const char* stdout_path = nullptr;   // write stdout there instead of capturing it ("/dev/full")
  // Stdout is a pipe (SIGPIPE at its default action, as in a shell), whose read end this gets
  // while mmt runs; closed (unless it set the fd to -1 after closing it) once mmt has ended.
  std::function<void(int& read_fd, pid_t pid)> with_stdout_pipe;
  bool stdout_is_terminal = false;  // stdout is a pseudo-terminal (nothing of it is captured)
  // stderr is a pseudo-terminal; what mmt writes there (as the terminal passes it on: "\n"
  // becomes "\r\n") is RunResult::err.
  bool stderr_is_terminal = false;
  // Run as this user (and group) instead: as root, the way to meet a file its permissions
  // make unreadable. Exit status 126 when the child could not become that user.
  std::optional<uid_t> as_user;
};

std::string slurp(const std::string& path) {
  Bytes b = testutil::read_file(path);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// Runs the built mmt with `args`, capturing stdout and stderr.
RunResult run_mmt(const std::vector<std::string>& args, RunOptions options = {}) {
  TempFolder capture;
  std::string out_path = capture / "out", err_path = capture / "err";
  int pipe_fds[2] = {-1, -1};
  if (options.with_stdout_pipe && ::pipe(pipe_fds) != 0) ADD_FAILURE() << "pipe: " << std::strerror(errno);
  int terminal = -1;  // the pseudo-terminal's controlling side, held open while mmt runs
  std::string terminal_path;
  if (options.stdout_is_terminal) {
    terminal = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (terminal < 0 || ::grantpt(terminal) != 0 || ::unlockpt(terminal) != 0) ADD_FAILURE() << "no pseudo-terminal";
    else if (const char* name = ::ptsname(terminal)) terminal_path = name;
  }
  // Both sides opened here: the terminal side is mmt's stderr, and once mmt has ended (or
  // never started) nothing holds it open, so reading the other side ends (EIO).
  int error_terminal = -1, error_terminal_side = -1;
  if (options.stderr_is_terminal) {
    error_terminal = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    const char* name = error_terminal >= 0 && ::grantpt(error_terminal) == 0 && ::unlockpt(error_terminal) == 0
                           ? ::ptsname(error_terminal)
                           : nullptr;
    if (name != nullptr) error_terminal_side = ::open(name, O_WRONLY | O_NOCTTY | O_CLOEXEC);
    if (error_terminal_side < 0) {
      ADD_FAILURE() << "no pseudo-terminal for stderr";
      if (error_terminal >= 0) ::close(error_terminal);
      error_terminal = -1;
      options.stderr_is_terminal = false;
    }
  }
  const bool own_stdout = options.stdout_path || options.with_stdout_pipe || options.stdout_is_terminal;
  pid_t pid = ::fork();
  if (pid == 0) {
    int out = options.stdout_path       ? ::open(options.stdout_path, O_WRONLY)
              : options.with_stdout_pipe ? pipe_fds[1]
              : options.stdout_is_terminal ? ::open(terminal_path.c_str(), O_WRONLY | O_NOCTTY)
                                           : ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (options.with_stdout_pipe) {
      ::close(pipe_fds[0]);
      ::signal(SIGPIPE, SIG_DFL);  // as a shell starts a command, whatever the test runner does
    }
    int err = options.stderr_is_terminal ? error_terminal_side
                                         : ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, 1);
    ::dup2(err, 2);
    if (options.file_size_limit_bytes >= 0) {
      // SIGXFSZ keeps its default action (it kills): mmt itself must turn it into EFBIG.
      ::signal(SIGXFSZ, SIG_DFL);
      struct rlimit limit {};
      limit.rlim_cur = limit.rlim_max = static_cast<rlim_t>(options.file_size_limit_bytes);
      ::setrlimit(RLIMIT_FSIZE, &limit);
    }
    if (options.as_user && (::setgroups(0, nullptr) != 0 || ::setgid(*options.as_user) != 0 ||
                            ::setuid(*options.as_user) != 0))
      ::_exit(126);
    // mmt leaves a signal ignored when it starts ignored (nohup): the test's own run may be.
    if (!options.interrupt_once_exists.empty() || !options.interrupt_once_mapped.empty())
      ::signal(options.interrupt_signal, SIG_DFL);
    std::vector<char*> argv{const_cast<char*>(kMmt.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(kMmt.c_str(), argv.data());
    ::_exit(127);
  }
  // The terminal's buffer holds a few KiB: it is read while mmt runs, until mmt has closed it
  // (EIO), so a long progress bar cannot block mmt.
  std::string terminal_err;
  std::thread drain_terminal;
  if (error_terminal_side >= 0) ::close(error_terminal_side);  // mmt's now (or no one's, if fork failed)
  if (error_terminal >= 0)
    drain_terminal = std::thread([&] {
      char buffer[4096];
      for (ssize_t n; (n = ::read(error_terminal, buffer, sizeof buffer)) != 0;) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        terminal_err.append(buffer, static_cast<size_t>(n));
      }
    });
  int status = 0;
  bool ended = false;
  if (options.with_stdout_pipe) {
    ::close(pipe_fds[1]);
    options.with_stdout_pipe(pipe_fds[0], pid);
  }
  if (!options.interrupt_once_exists.empty() || !options.interrupt_once_mapped.empty()) {
    const fs::path wanted(options.interrupt_once_exists);
    const auto appeared = [&] {
      if (!options.interrupt_once_mapped.empty()) {
        std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
        for (std::string line; std::getline(maps, line);)
          if (line.ends_with(" " + options.interrupt_once_mapped)) return true;
        return false;
      }
      std::error_code ec;
      for (const auto& entry : fs::directory_iterator(wanted.parent_path(), ec))
        if (entry.path().filename().native().starts_with(wanted.filename().native())) return true;
      return false;
    };
    // Looked for often: `get` writes its file in a few milliseconds.
    while (!(ended = ::waitpid(pid, &status, WNOHANG) == pid) && !appeared())
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    const auto signal_at = std::chrono::steady_clock::now() + options.interrupt_delay;
    while (!ended && std::chrono::steady_clock::now() < signal_at) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ended = ::waitpid(pid, &status, WNOHANG) == pid;
    }
    if (!ended && options.instead_of_signal) options.instead_of_signal();
    else if (!ended) ::kill(pid, options.interrupt_signal);
  }
  if (!ended) ::waitpid(pid, &status, 0);
  if (pipe_fds[0] >= 0) ::close(pipe_fds[0]);
  if (terminal >= 0) ::close(terminal);
  if (drain_terminal.joinable()) drain_terminal.join();  // mmt has ended: the read meets EIO
  if (error_terminal >= 0) ::close(error_terminal);
  RunResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (!own_stdout) result.out = slurp(out_path);
  result.err = options.stderr_is_terminal ? terminal_err : slurp(err_path);
  return result;
}

class MmtCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kMmt)) GTEST_SKIP() << kMmt << " is not built";
  }
  // Every file in the test folder, so a test can check that nothing new appeared.
  std::set<std::string> listing() const {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_.path())) names.insert(e.path().filename());
    return names;
  }
  std::string path(const std::string& name) const { return dir_ / name; }
  void save(const std::string& name, const Tensor& t) { save_npy(path(name), t); }

  TempFolder dir_;
};

// `count` records of `dtype` values 0, 1, 2, ... shaped [count, ...record_shape].
Tensor records(ScalarType dtype, int64_t count, std::vector<int64_t> record_shape) {
  std::vector<int64_t> sizes{count};
  sizes.insert(sizes.end(), record_shape.begin(), record_shape.end());
  Tensor out = empty(sizes, dtype);
  int64_t n = out.numel();
  Tensor source = arange(n, kFloat64);
  if (dtype == kBool || dtype == kUInt8 || dtype == kInt8) {
    for (int64_t i = 0; i < n; ++i) source.set<double>({i}, static_cast<double>(i % (dtype == kBool ? 2 : 100)));
  }
  out.copy_(source.view(sizes));
  if (is_complex(dtype)) out.imag().copy_(arange(0, -n, -1, kFloat64).view(sizes));  // k - kj
  return out;
}

#define EXPECT_FAILS_WITH(result, fragment)                                         \
  do {                                                                               \
    EXPECT_NE((result).exit_code, 0);                                                \
    EXPECT_NE((result).err.find(fragment), std::string::npos) << (result).err;       \
  } while (0)

TEST_F(MmtCli, HelpForEverySubcommand) {
  RunResult top = run_mmt({"--help"});
  EXPECT_EQ(top.exit_code, 0);
  for (const char* sub : {"pack", "info", "verify", "get", "export", "bench"}) {
    EXPECT_NE(top.out.find(sub), std::string::npos) << sub;
    RunResult r = run_mmt({sub, "--help"});
    EXPECT_EQ(r.exit_code, 0) << sub;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << sub << ": " << r.out;
  }
  EXPECT_NE(run_mmt({}).exit_code, 0);
  EXPECT_NE(run_mmt({"frobnicate"}).exit_code, 0);
}

TEST_F(MmtCli, EveryBadCommandLineExitsTwoWithTheReason) {
  // CLI11 gives each kind of parse error its own code (105, 106, 109...); scripts test for 2.
  const std::vector<std::vector<std::string>> bad{
      {},                                        // no subcommand
      {"info"},                                  // a required argument missing
      {"export", "a.mmt"},                       // FILE... DIR with no DIR
      {"get", "a.mmt"},                          // FILE... INDEX with no INDEX
      {"bench", "a.mmt", "--batch", "many"},     // a value of the wrong kind
      {"pack", "out.mmt", "x=a.npy", "--nope"},  // an unknown option
      {"bench", "a.mmt", "--threads"},           // an option without its value
  };
  for (const std::vector<std::string>& args : bad) {
    RunResult r = run_mmt(args);
    std::string line;
    for (const std::string& a : args) line += a + " ";
    EXPECT_EQ(r.exit_code, 2) << line << "\n" << r.err;
    EXPECT_FALSE(r.err.empty()) << line;
  }
  // An option given where a value was due is taken by CLI11 for the value: said so, not
  // reported as a missing input file.
  EXPECT_FAILS_WITH(run_mmt({"verify", "a.mmt", "--against", "--folder", "photos"}),
                    "--against takes pack inputs, and '--folder' is an option: give the inputs after --against (a "
                    "file of that name: ./--folder); to compare with a folder, give --folder DIR alone");
  EXPECT_EQ(run_mmt({"verify", "a.mmt", "--against", "--folder", "photos"}).exit_code, 2);
  EXPECT_FAILS_WITH(run_mmt({"verify", "a.mmt", "--against", "b.mmt", "--field", "--seed"}),
                    "--field takes a field's name, and '--seed' is an option");
}

TEST_F(MmtCli, AnUnknownSubcommandIsNamedWithTheKnownOnes) {
  // It said "A subcommand is required", as if none had been given.
  for (std::vector<std::string> args : {std::vector<std::string>{"bogus"}, {"bogus", "info", "x.mmt"}}) {
    RunResult r = run_mmt(args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_NE(r.err.find("mmt: unknown subcommand 'bogus'; the subcommands are pack, info, verify, get, export, bench"),
              std::string::npos) << r.err;
  }
  EXPECT_EQ(run_mmt({"info", "--help"}).exit_code, 0) << "a known one still runs";
}

TEST_F(MmtCli, NpyRoundTripForEveryDtypeAndCodec) {
  const ScalarType types[] = {kBool, kUInt8, kInt8, kInt16, kUInt16, kInt32,
                              kUInt32, kInt64, kUInt64, kFloat16, kFloat32, kFloat64, kComplex64, kComplex128};
  std::vector<std::string> inputs;
  std::vector<std::pair<std::string, Tensor>> originals;
  for (ScalarType t : types) {
    std::string name = "f_" + std::string(to_string(t));
    Tensor values = records(t, 9, {2, 3});
    save(name + ".npy", values);
    inputs.push_back(name + "=" + path(name + ".npy"));
    originals.push_back({name, values});
  }
  // A Fortran-order source (non-contiguous once loaded) and a big-endian one.
  testutil::write_file(path("fortran.npy"),
                       testutil::npy_file("<i4", true, "(9, 2)",
                                          testutil::element_bytes(std::vector<int32_t>{
                                              0, 2, 4, 6, 8, 10, 12, 14, 16, 1, 3, 5, 7, 9, 11, 13, 15, 17}, false)));
  inputs.push_back("fortran=" + path("fortran.npy"));
  originals.push_back({"fortran", arange(18, kInt32).view({9, 2})});
  testutil::write_file(path("big.npy"),
                       testutil::npy_file(">f8", false, "(9,)",
                                          testutil::element_bytes(std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, 8}, true)));
  inputs.push_back("big=" + path("big.npy"));
  originals.push_back({"big", arange(9, kFloat64)});
  // A big-endian complex source: each part is swapped on its own.
  std::vector<double> parts;
  for (int k = 0; k < 9; ++k) parts.insert(parts.end(), {double(k), -0.5 * k});
  testutil::write_file(path("bigz.npy"),
                       testutil::npy_file(">c16", false, "(9,)", testutil::element_bytes(parts, true)));
  inputs.push_back("bigz=" + path("bigz.npy"));
  Tensor bigz = empty({9}, kComplex128);
  for (int k = 0; k < 9; ++k) bigz.set<std::complex<double>>({k}, {double(k), -0.5 * k});
  originals.push_back({"bigz", bigz});

  for (const char* codec : {"none", "lz4", "zstd:5"}) {
    SCOPED_TRACE(codec);
    std::string out = path(std::string("all-") + codec + ".mmt");
    std::vector<std::string> args{"pack", out};
    args.insert(args.end(), inputs.begin(), inputs.end());
    args.insert(args.end(), {"--codec", codec, "--chunk-bytes", "256"});
    RunResult packed = run_mmt(args);
    ASSERT_EQ(packed.exit_code, 0) << packed.err;
    EXPECT_NE(packed.out.find("packed 9 records (17 fields)"), std::string::npos) << packed.out;
    // `mmt info` widens its dtype column to the longest name (complex128, 10 characters).
    const std::string info = run_mmt({"info", out}).out;
    EXPECT_NE(info.find("  f_float16     float16     [2, 3]"), std::string::npos) << info;
    EXPECT_NE(info.find("  f_complex128  complex128  [2, 3]"), std::string::npos) << info;

    std::string export_dir = path(std::string("export-") + codec);
    RunResult exported = run_mmt({"export", out, export_dir});
    ASSERT_EQ(exported.exit_code, 0) << exported.err;
    for (const auto& [name, original] : originals) {
      Tensor back = load_npy(export_dir + "/" + name + ".npy");
      EXPECT_TRUE(back.equal(original.contiguous())) << name;
      // The Fortran-order source comes back in Fortran order: the very file that was packed.
      EXPECT_EQ(back.is_contiguous(), name != "fortran") << name;
    }
    EXPECT_EQ(testutil::read_file(export_dir + "/fortran.npy"), testutil::read_file(path("fortran.npy")));
    EXPECT_NE(exported.out.find("fortran.npy  int32 [9, 2] (Fortran order, as packed)"), std::string::npos)
        << exported.out;
    RunResult got = run_mmt({"get", out, "4", "--field", "fortran", "--npy", path("one.npy"), "--force"});
    ASSERT_EQ(got.exit_code, 0) << got.err;
    EXPECT_TRUE(load_npy(path("one.npy")).equal(arange(18, kInt32).view({9, 2})[4]));
    // Of a file of several fields, --npy needs --field: a bad command line, exit 2.
    RunResult unnamed = run_mmt({"get", out, "4", "--npy", path("two.npy")});
    EXPECT_EQ(unnamed.exit_code, 2) << unnamed.err;
    EXPECT_NE(unnamed.err.find("--npy and --raw write one field: name it with --field"), std::string::npos) << unnamed.err;
    RunResult verified = run_mmt({"verify", out, "--against"});
    EXPECT_NE(verified.exit_code, 0) << "--against needs inputs";
    std::vector<std::string> verify_args{"verify", out, "--against"};
    verify_args.insert(verify_args.end(), inputs.begin(), inputs.end());
    RunResult ok = run_mmt(verify_args);
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
  }
}

// numpy's own Fortran-order files (asfortranarray, as MATLAB-born data often is), of several
// ranks and dtypes, deflated in an .npz too: pack then export gives each file back byte for
// byte, from one file or from shards, through every codec.
TEST_F(MmtCli, FortranOrderSourcesExportAsTheFilesThatWerePacked) {
  const std::string python = testutil::python_with_numpy();
  if (python.empty()) GTEST_SKIP() << "python3 with numpy not available";
  ASSERT_EQ(testutil::run_python(python, dir_.path(), R"(
x = np.asfortranarray(np.arange(7 * 3 * 4, dtype='<f4').reshape(7, 3, 4))
z = np.asfortranarray((np.arange(7 * 5) - 2j * np.arange(7 * 5)).astype('<c16').reshape(7, 5))
c = np.arange(7 * 2, dtype='<i2').reshape(7, 2)
np.save('x.npy', x)
np.save('xc.npy', np.ascontiguousarray(x))
np.save('z.npy', z)
np.save('c.npy', c)
np.savez_compressed('xz.npz', x=x, z=z)
# Big-endian complex, each part swapped: deflated in an archive, and in Fortran order.
np.savez_compressed('bez.npz', bez=z.astype('>c8'))
np.save('bef.npy', np.asfortranarray(z.astype('>c16')))
np.save('x_offsets.npy', np.array([0, 3, 3, 7]))
)"), 0);
  for (const char* codec : {"none", "zstd"}) {
    SCOPED_TRACE(codec);
    const std::string out = path(std::string("f-") + codec + ".mmt");
    ASSERT_EQ(run_mmt({"pack", out, "x=" + path("x.npy"), "z=" + path("z.npy"), "c=" + path("c.npy"), "--codec", codec,
                       "--chunk-bytes", "64"}).exit_code, 0);
    EXPECT_EQ(Dataset::open(out).metadata().at("npy_fortran_order"), R"(["x","z"])");
    const std::string back = path(std::string("back-") + codec);
    RunResult exported = run_mmt({"export", out, back});
    ASSERT_EQ(exported.exit_code, 0) << exported.err;
    for (const char* name : {"x", "z", "c"})
      EXPECT_EQ(testutil::read_file(back + "/" + name + ".npy"), testutil::read_file(path(std::string(name) + ".npy")))
          << name;
  }
  // Shards packed apart from the deflated archive read as one dataset and export the whole.
  for (const char* shard : {"0/2", "1/2"})
    ASSERT_EQ(run_mmt({"pack", path(std::string("s") + shard[0] + ".mmt"), path("xz.npz"), "--shard", shard}).exit_code, 0);
  RunResult exported = run_mmt({"export", path("s0.mmt"), path("s1.mmt"), path("back-shards")});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  for (const char* name : {"x", "z"})
    EXPECT_EQ(testutil::read_file(path("back-shards/") + name + ".npy"), testutil::read_file(path(std::string(name) + ".npy")))
        << name;
  // --c-order writes C order whatever was packed.
  ASSERT_EQ(run_mmt({"export", path("f-none.mmt"), path("back-c"), "--c-order"}).exit_code, 0);
  EXPECT_TRUE(load_npy(path("back-c/x.npy")).is_contiguous());
  EXPECT_TRUE(load_npy(path("back-c/x.npy")).equal(load_npy(path("x.npy")).contiguous()));
  // Big-endian complex sources: the same values, each part in native order.
  ASSERT_EQ(run_mmt({"pack", path("be.mmt"), path("bez.npz"), "bef=" + path("bef.npy")}).exit_code, 0);
  ASSERT_EQ(run_mmt({"export", path("be.mmt"), path("back-be")}).exit_code, 0);
  const Tensor z = load_npy(path("z.npy"));
  Tensor z64 = empty(z.sizes(), kComplex64);
  z64.copy_(z);
  EXPECT_TRUE(load_npy(path("back-be/bez.npy")).equal(z64));
  EXPECT_TRUE(load_npy(path("back-be/bef.npy")).equal(z));
  EXPECT_FALSE(load_npy(path("back-be/bef.npy")).is_contiguous()) << "Fortran order, as packed";
  // Files packed from differently laid-out sources of one field still read as one dataset:
  // the hint is dropped, and the whole exports in C order.
  ASSERT_EQ(run_mmt({"pack", path("from-f.mmt"), "x=" + path("x.npy")}).exit_code, 0);
  ASSERT_EQ(run_mmt({"pack", path("from-c.mmt"), "x=" + path("xc.npy")}).exit_code, 0);
  const Dataset mixed = Dataset::open_concat({path("from-f.mmt"), path("from-c.mmt")});
  EXPECT_EQ(mixed.metadata().count("npy_fortran_order"), 0u);
  EXPECT_EQ(Dataset::open_concat({path("from-f.mmt"), path("from-f.mmt")}).metadata().at("npy_fortran_order"),
            R"(["x"])") << "kept when the parts agree";
  ASSERT_EQ(run_mmt({"export", path("from-f.mmt"), path("from-c.mmt"), path("back-mixed")}).exit_code, 0);
  EXPECT_TRUE(load_npy(path("back-mixed/x.npy")).is_contiguous());
  // A ragged field's records are runs of the Fortran-order values' rows: not recorded as
  // Fortran order, since export writes a ragged field's values in C order.
  ASSERT_EQ(run_mmt({"pack", path("ragged-f.mmt"), "x=" + path("x.npy"), "--offsets", "x=" + path("x_offsets.npy")})
                .exit_code, 0);
  EXPECT_EQ(Dataset::open(path("ragged-f.mmt")).metadata().count("npy_fortran_order"), 0u);
  ASSERT_EQ(run_mmt({"export", path("ragged-f.mmt"), path("back-ragged")}).exit_code, 0);
  EXPECT_TRUE(load_npy(path("back-ragged/x.npy")).equal(load_npy(path("x.npy")).contiguous()));
  // A value that is not a list of names (a plain string, a nested list) is reported, and the
  // fields come back in C order.
  for (const char* value : {"x", R"([["x"]])"}) {
    SCOPED_TRACE(value);
    const std::string odd = path("odd.mmt");
    {
      WriterOptions options;
      options.metadata["npy_fortran_order"] = value;
      options.overwrite = true;
      DatasetWriter writer = DatasetWriter::create(odd, Schema({Field::fixed("x", kInt32, {2})}), options);
      writer.append({arange(2, kInt32)});
      writer.finish();
    }
    RunResult c_order = run_mmt({"export", odd, path("back-odd"), "--force"});
    ASSERT_EQ(c_order.exit_code, 0) << c_order.err;
    EXPECT_NE(c_order.err.find("metadata 'npy_fortran_order' is not a list of field names; every field is written in C order"),
              std::string::npos) << c_order.err;
    EXPECT_TRUE(load_npy(path("back-odd/x.npy")).is_contiguous());
  }
}

TEST_F(MmtCli, ExportIsByteForByteWhatNumpyWrites) {
  Tensor images = records(kUInt8, 5, {4, 4});
  save("images.npy", images);
  ASSERT_EQ(run_mmt({"pack", path("x.mmt"), "images=" + path("images.npy"), "--codec", "lz4"}).exit_code, 0);
  ASSERT_EQ(run_mmt({"export", path("x.mmt"), path("back")}).exit_code, 0);
  EXPECT_EQ(testutil::read_file(path("back/images.npy")), testutil::read_file(path("images.npy")));
  // An existing export is not replaced without --force.
  EXPECT_FAILS_WITH(run_mmt({"export", path("x.mmt"), path("back")}), "already exists");
  EXPECT_EQ(run_mmt({"export", path("x.mmt"), path("back"), "--force"}).exit_code, 0);
}

// A field is exported a piece of records at a time (16 MiB), not read into memory whole: the
// pieces, whose ends fall inside chunks, make the same bytes numpy wrote, uncompressed and
// compressed.
TEST_F(MmtCli, ExportOfAFieldLargerThanAPieceIsByteForByte) {
  Tensor images = empty({5000, 3, 37, 37}, kUInt8);  // 20.5 MB, 4107 bytes a record
  uint8_t* pixels = images.mutable_data_ptr<uint8_t>();
  for (int64_t i = 0; i < images.numel(); ++i) pixels[i] = static_cast<uint8_t>(i * 7 % 251);
  Tensor labels = records(kInt16, 5000, {});
  save("images.npy", images);
  save("labels.npy", labels);
  for (const char* codec : {"none", "zstd:1"}) {
    SCOPED_TRACE(codec);
    const std::string out = path(std::string("big-") + codec + ".mmt");
    ASSERT_EQ(run_mmt({"pack", out, "images=" + path("images.npy"), "labels=" + path("labels.npy"), "--codec", codec,
                       "--chunk-bytes", "1000000"})
                  .exit_code,
              0);
    const std::string back = path(std::string("back-") + codec);
    RunResult exported = run_mmt({"export", out, back});
    ASSERT_EQ(exported.exit_code, 0) << exported.err;
    EXPECT_NE(exported.out.find("uint8 [5000, 3, 37, 37]"), std::string::npos) << exported.out;
    EXPECT_EQ(testutil::read_file(back + "/images.npy"), testutil::read_file(path("images.npy")));
    EXPECT_EQ(testutil::read_file(back + "/labels.npy"), testutil::read_file(path("labels.npy")));
  }
  // Two shards read as one: the first piece spans both.
  for (const char* share : {"0/2", "1/2"})
    ASSERT_EQ(run_mmt({"pack", path(std::string("shard-") + share[0] + ".mmt"), "images=" + path("images.npy"),
                       "--shard", share, "--quiet"})
                  .exit_code,
              0);
  RunResult exported = run_mmt({"export", path("shard-0.mmt"), path("shard-1.mmt"), path("back-shards")});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_EQ(testutil::read_file(path("back-shards/images.npy")), testutil::read_file(path("images.npy")));
}

// A bool byte other than 0 or 1 in a later piece of an export is named by its record in the
// whole field, not in its piece.
TEST_F(MmtCli, ExportNamesABadBoolByteInALaterPieceByItsRecord) {
  {
    WriterOptions options;
    options.chunk_records = 100;
    DatasetWriter writer = DatasetWriter::create(path("m.mmt"), Schema({Field::fixed("mask", kBool, {4096})}), options);
    writer.append_batch(std::vector<Tensor>{zeros({5000, 4096}, kBool)});  // 20 MB: pieces of 4096 records
    writer.finish();
  }
  const int64_t offset = Dataset::open(path("m.mmt")).get(4500)["mask"].storage_offset() + 7;  // bytes: bool
  testutil::Bytes bytes = testutil::read_file(path("m.mmt"));
  bytes[static_cast<size_t>(offset)] = std::byte{2};
  testing::reseal_payload(bytes, 45);  // record 4500's chunk
  testutil::write_file(path("m.mmt"), bytes);
  EXPECT_FAILS_WITH(run_mmt({"export", path("m.mmt"), path("out")}), "field 'mask': record 4500 holds the bool byte 2");
  EXPECT_FALSE(fs::exists(path("out")));
}

TEST_F(MmtCli, NpzInputsStoredAndDeflated) {
  for (bool deflate : {false, true})
    for (const char* codec : {"none", "lz4", "zstd"}) {
      SCOPED_TRACE(std::string(deflate ? "deflated, " : "stored, ") + codec);
      Tensor x = records(kFloat32, 6, {3});
      Tensor y = records(kInt64, 6, {});
      testutil::write_file(path("in.npz"), testutil::zip_archive({{"x.npy", npy_bytes(x), deflate},
                                                                  {"y.npy", npy_bytes(y), deflate}}));
      std::string out = path(std::string(deflate ? "d-" : "s-") + codec + ".mmt");
      RunResult packed = run_mmt({"pack", out, path("in.npz"), "--codec", codec, "--chunk-bytes", "64"});
      ASSERT_EQ(packed.exit_code, 0) << packed.err;
      Dataset ds = Dataset::open(out);
      ASSERT_EQ(ds.schema().size(), 2u);
      EXPECT_EQ(ds.schema()[0].name, "x");
      EXPECT_TRUE(ds.column("x").equal(x));
      EXPECT_TRUE(ds.column("y").equal(y));
      // export gives back the members' bytes.
      const std::string back = out + ".export";
      ASSERT_EQ(run_mmt({"export", out, back}).exit_code, 0);
      EXPECT_EQ(testutil::read_file(back + "/x.npy"), npy_bytes(x));
      EXPECT_EQ(testutil::read_file(back + "/y.npy"), npy_bytes(y));
    }
}

// An .npz inside other bytes (a stub before it, bytes appended after it), as Python's zipfile
// reads it: packed and verified, where pack said "no end-of-central-directory record".
TEST_F(MmtCli, NpzWithBytesAroundTheArchivePacksAndVerifies) {
  Tensor x = records(kFloat32, 6, {3});
  Bytes wrapped = testutil::to_bytes("#!/bin/sh\nexit 0\n");
  testutil::append(wrapped, testutil::zip_archive({{"x.npy", npy_bytes(x), /*deflate=*/true}}));
  testutil::append(wrapped, "appended");
  testutil::write_file(path("in.npz"), wrapped);
  RunResult packed = run_mmt({"pack", path("w.mmt"), path("in.npz")});
  ASSERT_EQ(packed.exit_code, 0) << packed.err;
  EXPECT_TRUE(Dataset::open(path("w.mmt")).column("x").equal(x));
  RunResult verified = run_mmt({"verify", path("w.mmt"), "--against", path("in.npz")});
  EXPECT_EQ(verified.exit_code, 0) << verified.err;
}

// Headers np.load reads that pack refused: a type string without a byte order, numpy's dtype
// name, a dict over several lines. Bytes after an array are still refused (np.load ignores
// them), with their count and the way to cut them off; in an .npz, through the packer's own
// way of reading deflated members too.
TEST_F(MmtCli, PackReadsTheHeadersNumpyReadsAndCountsBytesAfterAnArray) {
  const Bytes ints = testutil::element_bytes(std::vector<int32_t>{1, 2, 3, 4, 5, 6}, false);
  testutil::write_file(path("a.npy"), testutil::npy_with_dict("{'descr': 'i4',\n 'fortran_order': False,\n 'shape': (3, 2)}", ints));
  testutil::write_file(path("b.npy"), testutil::npy_file("float64", false, "(3,)", Bytes(24)));
  RunResult packed = run_mmt({"pack", path("ab.mmt"), "a=" + path("a.npy"), "b=" + path("b.npy")});
  ASSERT_EQ(packed.exit_code, 0) << packed.err;
  Dataset ds = Dataset::open(path("ab.mmt"));
  EXPECT_TRUE(ds.column("a").equal(parse_npy(testutil::npy_file("<i4", false, "(3, 2)", ints), "ref.npy")));
  EXPECT_EQ(ds.column("b").dtype(), kFloat64);

  Bytes longer = testutil::npy_file("<i4", false, "(3, 2)", ints);
  testutil::append(longer, testutil::element_bytes(std::vector<int32_t>{7, 8}, false));
  testutil::write_file(path("long.npy"), longer);
  EXPECT_FAILS_WITH(run_mmt({"pack", path("l.mmt"), "a=" + path("long.npy")}),
                    "mmt pack: error: " + path("long.npy") + ": header declares shape (3, 2) of <i4 = 24 bytes but the file "
                    "holds 32 bytes after the header: 8 bytes follow the array, as many as 1 more row along the first "
                    "dimension. np.load ignores such bytes");
  testutil::write_file(path("long.npz"), testutil::zip_archive({{"a.npy", longer, /*deflate=*/true}}));
  EXPECT_FAILS_WITH(run_mmt({"pack", path("l.mmt"), path("long.npz")}),
                    path("long.npz") + ":a.npy: header declares shape (3, 2) of <i4 = 24 bytes but the member holds 32 bytes");
  EXPECT_FALSE(fs::exists(path("l.mmt")));
}

TEST_F(MmtCli, IdxPlainAndGzipRoundTrip) {
  Bytes images = {std::byte{0}, std::byte{0}, std::byte{0x08}, std::byte{3}};
  for (uint32_t d : {5u, 3u, 2u})
    for (int s = 24; s >= 0; s -= 8) images.push_back(std::byte((d >> s) & 0xFF));
  for (int i = 0; i < 30; ++i) images.push_back(std::byte(i * 3));
  Bytes labels = {std::byte{0}, std::byte{0}, std::byte{0x0C}, std::byte{1},
                  std::byte{0}, std::byte{0}, std::byte{0}, std::byte{5}};
  testutil::append(labels, testutil::element_bytes(std::vector<int32_t>{9, 8, -7, 6, 5}, true));
  testutil::write_file(path("images-idx3-ubyte"), images);
  testutil::write_file(path("labels-idx1-int.gz"), testutil::gzip_bytes(labels));
  std::vector<std::string> inputs{"image=" + path("images-idx3-ubyte"), "label=" + path("labels-idx1-int.gz")};
  for (const char* codec : {"lz4", "zstd", "none"}) {  // m.mmt, checked below, is the last
    SCOPED_TRACE(codec);
    std::vector<std::string> args{"pack", path("m.mmt"), "--force", "--codec", codec, "--chunk-bytes", "32"};
    args.insert(args.end(), inputs.begin(), inputs.end());
    ASSERT_EQ(run_mmt(args).exit_code, 0);
    Dataset ds = Dataset::open(path("m.mmt"));
    EXPECT_TRUE(ds.column("image").equal(load_idx(path("images-idx3-ubyte"))));
    EXPECT_EQ(ds.get(2, "label").item<int>(), -7);
    ASSERT_EQ(run_mmt({"export", path("m.mmt"), path("m-export"), "--force"}).exit_code, 0);
    EXPECT_TRUE(load_npy(path("m-export/image.npy")).equal(load_idx(path("images-idx3-ubyte"))));
    EXPECT_TRUE(load_npy(path("m-export/label.npy")).equal(load_idx(path("labels-idx1-int.gz"))));
    ASSERT_EQ(run_mmt({"get", path("m.mmt"), "3", "--field", "image", "--npy", path("m3.npy"), "--force"}).exit_code, 0);
    EXPECT_TRUE(load_npy(path("m3.npy")).equal(load_idx(path("images-idx3-ubyte"))[3]));
  }
  std::vector<std::string> verify{"verify", path("m.mmt"), "--samples", "3", "--against"};
  verify.insert(verify.end(), inputs.begin(), inputs.end());
  RunResult ok = run_mmt(verify);
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("3 random records equal their sources"), std::string::npos) << ok.out;
  // Checking against other inputs names the record and field that differ.
  Bytes other = images;
  other.at(other.size() - 1) = std::byte{1};  // at(): gcc 12 cannot see that the copy is not empty
  testutil::write_file(path("other-idx3-ubyte"), other);
  RunResult differs = run_mmt({"verify", path("m.mmt"), "--against", "image=" + path("other-idx3-ubyte"),
                               "label=" + path("labels-idx1-int.gz")});
  EXPECT_FAILS_WITH(differs, "record 4, field 'image' differs");
}

TEST_F(MmtCli, ZeroOneAndChunkSizedRecords) {
  save("empty.npy", empty({0, 3}, kFloat32));
  RunResult zero = run_mmt({"pack", path("zero.mmt"), "x=" + path("empty.npy")});
  ASSERT_EQ(zero.exit_code, 0) << zero.err;
  EXPECT_EQ(Dataset::open(path("zero.mmt")).size(), 0);
  ASSERT_EQ(run_mmt({"export", path("zero.mmt"), path("zero")}).exit_code, 0);
  EXPECT_EQ(load_npy(path("zero/x.npy")).sizes(), IntArrayRef({0, 3}));

  save("one.npy", records(kInt16, 1, {5}));
  ASSERT_EQ(run_mmt({"pack", path("one.mmt"), "x=" + path("one.npy"), "--codec", "lz4"}).exit_code, 0);
  ASSERT_EQ(run_mmt({"export", path("one.mmt"), path("one")}).exit_code, 0);
  EXPECT_TRUE(load_npy(path("one/x.npy")).equal(records(kInt16, 1, {5})));

  // Each record is 40 kB, ten times the chunk target.
  Tensor big = records(kFloat64, 4, {5000});
  save("big.npy", big);
  for (const char* codec : {"none", "zstd"}) {
    std::string out = path(std::string("big-") + codec + ".mmt");
    ASSERT_EQ(run_mmt({"pack", out, "x=" + path("big.npy"), "--chunk-bytes", "4K", "--codec", codec}).exit_code, 0);
    EXPECT_TRUE(Dataset::open(out).column("x").equal(big)) << codec;
  }
}

TEST_F(MmtCli, FolderOfClassesPacksBytesAndLabels) {
  fs::create_directories(path("imgs/cat"));
  fs::create_directories(path("imgs/dog/nested"));
  testutil::write_file(path("imgs/cat/b.jpg"), testutil::to_bytes("cat two"));
  testutil::write_file(path("imgs/cat/a.jpg"), testutil::to_bytes("cat one!"));
  testutil::write_file(path("imgs/dog/nested/z.jpg"), testutil::to_bytes(std::string(70000, 'z')));
  testutil::write_file(path("imgs/dog/.hidden"), testutil::to_bytes("skipped"));
  testutil::write_file(path("imgs/dog/empty.jpg"), {});
  std::vector<std::pair<std::string, int>> expected{{"imgs/cat/a.jpg", 0}, {"imgs/cat/b.jpg", 0},
                                                    {"imgs/dog/empty.jpg", 1}, {"imgs/dog/nested/z.jpg", 1}};
  for (const char* codec : {"none", "zstd", "lz4"}) {  // f.mmt, used below, is the last
    SCOPED_TRACE(codec);
    RunResult packed = run_mmt(
        {"pack", path("f.mmt"), "--force", "--folder", path("imgs"), "--codec", codec, "--chunk-bytes", "16K"});
    ASSERT_EQ(packed.exit_code, 0) << packed.err;
    Dataset ds = Dataset::open(path("f.mmt"));
    ASSERT_EQ(ds.size(), 4);
    EXPECT_EQ(ds.metadata().at("classes"), R"(["cat","dog"])");
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(ds.get(i, "label").item<int>(), expected[i].second) << i;
      RunResult raw =
          run_mmt({"get", path("f.mmt"), std::to_string(i), "--field", "data", "--raw", path("raw.bin"), "--force"});
      ASSERT_EQ(raw.exit_code, 0) << raw.err;
      EXPECT_EQ(testutil::read_file(path("raw.bin")), testutil::read_file(path(expected[i].first))) << i;
    }
  }
  RunResult info = run_mmt({"info", path("f.mmt"), "--json"});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  nlohmann::json j = nlohmann::json::parse(info.out);
  EXPECT_EQ(j["records"], 4);
  EXPECT_EQ(j["fields"][0]["name"], "data");
  EXPECT_EQ(j["fields"][0]["fixed"], false);
  EXPECT_EQ(j["metadata"]["classes"], R"(["cat","dog"])");
  EXPECT_EQ(run_mmt({"verify", path("f.mmt"), "--folder", path("imgs")}).exit_code, 0);
  // The files' bytes come back as a ragged field in the jagged layout: values and offsets.
  RunResult exported = run_mmt({"export", path("f.mmt"), path("fx")});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_TRUE(load_npy(path("fx/label.npy")).equal(tensor<int64_t>({0, 0, 1, 1})));
  const Tensor values = load_npy(path("fx/data.npy")), offsets = load_npy(path("fx/data.offsets.npy"));
  ASSERT_EQ(offsets.sizes(), IntArrayRef({5}));
  for (int64_t i = 0; i < 4; ++i) {
    const Tensor file = values.slice(0, offsets.at<int64_t>({i}), offsets.at<int64_t>({i + 1}));
    const auto* bytes = static_cast<const std::byte*>(file.data_ptr());
    EXPECT_EQ(testutil::Bytes(bytes, bytes + file.numel()), testutil::read_file(path(expected[i].first))) << i;
  }
  EXPECT_FALSE(fs::exists(path("fx/data.shapes.npy"))) << "only the first dimension varies";

  // An unknown field or one given twice is refused before anything is written, the folder
  // included (it used to be created, or x.npy written, first).
  EXPECT_FAILS_WITH(run_mmt({"export", path("f.mmt"), path("fy"), "--field", "nope"}), "unknown field 'nope'");
  const RunResult twice = run_mmt({"export", path("f.mmt"), path("fy"), "--field", "label", "--field", "label"});
  EXPECT_FAILS_WITH(twice, "--field 'label' is given twice");
  EXPECT_EQ(twice.exit_code, 2) << "a command-line mistake";
  EXPECT_FALSE(fs::exists(path("fy")));
}

// A ragged field exports in PyTorch's jagged layout: NAME.npy holds the records' values back
// to back along its first dimension, NAME.offsets.npy where each starts; where a dimension
// after the first varies, NAME.npy is 1-D and NAME.shapes.npy gives each record's shape.
// Checked record by record against get(), over many chunks, a compressed file, pieces of the
// export (over 16 MiB of records) and shards read as one dataset.
TEST_F(MmtCli, ExportWritesRaggedFieldsAsValuesAndOffsets) {
  const Schema schema({Field::ragged("tokens", kInt32, {kVariableDim}), Field::ragged("boxes", kFloat32, {kVariableDim, 4}),
                       Field::ragged("image", kUInt8, {kVariableDim, kVariableDim, 3}),
                       Field::ragged("mask", kBool, {kVariableDim}), Field::fixed("label", kInt64, {})});
  auto write = [&](const std::string& name, const char* codec, int64_t first, int64_t count) {
    WriterOptions options;
    options.codec = CodecSpec::parse(codec);
    options.chunk_records = 37;
    DatasetWriter writer = DatasetWriter::create(path(name), schema, options);
    for (int64_t i = first; i < first + count; ++i) {
      const int64_t side = 20 + i % 100;  // up to 119 x 120 x 3: about 24 MB of images, two pieces
      Tensor image = empty({side, side + 1, 3}, kUInt8), mask = empty({i % 9}, kBool);
      for (int64_t k = 0; k < image.numel(); ++k) image.mutable_data_ptr<uint8_t>()[k] = static_cast<uint8_t>((k + i) % 251);
      for (int64_t k = 0; k < mask.numel(); ++k) mask.mutable_data_ptr<bool>()[k] = (k + i) % 2 == 1;
      writer.append({arange(i * 7, i * 7 + i % 13, 1, kInt32), arange(4 * (i % 5), kFloat32).view({i % 5, 4}), image,
                     mask, scalar_tensor(i)});
    }
    writer.finish();
  };
  write("r.mmt", "zstd:1", 0, 1600);
  write("s0.mmt", "none", 0, 700);  // the same records, as two shards
  write("s1.mmt", "lz4", 700, 900);
  const Dataset ds = Dataset::open(path("r.mmt"));
  for (const std::vector<std::string>& files : {std::vector<std::string>{path("r.mmt")},
                                                std::vector<std::string>{path("s0.mmt"), path("s1.mmt")}}) {
    const std::string out = path("out-" + std::to_string(files.size()));
    std::vector<std::string> args{"export"};
    args.insert(args.end(), files.begin(), files.end());
    args.push_back(out);
    const RunResult exported = run_mmt(args);
    ASSERT_EQ(exported.exit_code, 0) << exported.err;
    EXPECT_NE(exported.out.find(out + "/tokens.offsets.npy  int64 [1601] (where each record starts)"), std::string::npos)
        << exported.out;
    EXPECT_NE(exported.out.find(out + "/boxes.npy  float32 [3200, 4] (the values of a ragged field)"), std::string::npos)
        << exported.out;
    EXPECT_NE(exported.out.find(out + "/image.shapes.npy  int64 [1600, 3] (each record's shape)"), std::string::npos)
        << exported.out;
    EXPECT_FALSE(fs::exists(out + "/tokens.shapes.npy"));
    EXPECT_FALSE(fs::exists(out + "/boxes.shapes.npy"));
    EXPECT_TRUE(load_npy(out + "/label.npy").equal(arange(1600, kInt64)));
    for (const char* name : {"tokens", "boxes", "image", "mask"}) {
      SCOPED_TRACE(name);
      const Tensor values = load_npy(out + "/" + name + ".npy"), offsets = load_npy(out + "/" + name + ".offsets.npy");
      ASSERT_EQ(offsets.numel(), 1601);
      EXPECT_EQ(offsets.at<int64_t>({0}), 0);
      const bool with_shapes = std::string(name) == "image";
      const Tensor shapes = with_shapes ? load_npy(out + "/" + name + ".shapes.npy") : Tensor();
      for (int64_t i = 0; i < 1600; ++i) {
        const Tensor expected = ds.get(i)[name];
        Tensor back = values.slice(0, offsets.at<int64_t>({i}), offsets.at<int64_t>({i + 1}));
        if (with_shapes) {
          DimVector shape;
          for (int64_t d = 0; d < 3; ++d) shape.push_back(shapes.at<int64_t>({i, d}));
          back = back.view(shape);
        }
        ASSERT_TRUE(back.equal(expected)) << "record " << i;
      }
    }
    // What export wrote packs back into the same records (--offsets, --shapes), and verify
    // --against takes them as pack does.
    std::vector<std::string> inputs{"label=" + out + "/label.npy"}, jagged{"--shapes", "image=" + out + "/image.shapes.npy"};
    for (const char* name : {"tokens", "boxes", "image", "mask"}) {
      inputs.push_back(std::string(name) + "=" + out + "/" + name + ".npy");
      jagged.insert(jagged.end(), {"--offsets", std::string(name) + "=" + out + "/" + name + ".offsets.npy"});
    }
    std::vector<std::string> pack{"pack", out + ".mmt"};
    pack.insert(pack.end(), inputs.begin(), inputs.end());
    pack.insert(pack.end(), jagged.begin(), jagged.end());
    const RunResult packed = run_mmt(pack);
    ASSERT_EQ(packed.exit_code, 0) << packed.err;
    const RunResult same = run_mmt({"verify", out + ".mmt", "--against", path("r.mmt")});
    EXPECT_EQ(same.exit_code, 0) << same.err;
    EXPECT_NE(same.out.find("1600 records (all) equal their sources byte for byte"), std::string::npos) << same.out;
    std::vector<std::string> verify{"verify", path("r.mmt"), "--against"};
    verify.insert(verify.end(), inputs.begin(), inputs.end());
    verify.insert(verify.end(), jagged.begin(), jagged.end());
    const RunResult against_arrays = run_mmt(verify);
    EXPECT_EQ(against_arrays.exit_code, 0) << against_arrays.err;
    EXPECT_NE(against_arrays.out.find("1600 records (all) equal their sources byte for byte"), std::string::npos)
        << against_arrays.out;
  }
}

// A bad bool byte in a ragged field is named by its record, in a later piece of the export too;
// nothing is written.
TEST_F(MmtCli, ExportNamesABadBoolByteOfARaggedFieldByItsRecord) {
  {
    WriterOptions options;
    options.chunk_records = 100;
    DatasetWriter writer = DatasetWriter::create(path("m.mmt"), Schema({Field::ragged("mask", kBool, {kVariableDim})}),
                                                 options);
    for (int64_t i = 0; i < 5000; ++i) writer.append({zeros({4000 + i % 7}, kBool)});  // 20 MB: several pieces
    writer.finish();
  }
  const int64_t offset = Dataset::open(path("m.mmt")).get(4507)["mask"].storage_offset() + 3;  // bytes: bool
  testutil::Bytes bytes = testutil::read_file(path("m.mmt"));
  bytes[static_cast<size_t>(offset)] = std::byte{2};
  testing::reseal_payload(bytes, 45);  // record 4507's chunk
  testutil::write_file(path("m.mmt"), bytes);
  EXPECT_FAILS_WITH(run_mmt({"export", path("m.mmt"), path("out")}), "field 'mask': record 4507 holds the bool byte 2");
  EXPECT_FALSE(fs::exists(path("out")));
}

// A ragged field "x" writes x.offsets.npy: a field of that name is refused before anything is
// written, as a name too long for x.offsets.npy is.
TEST_F(MmtCli, ExportRefusesRaggedFilesThatAnotherFieldWrites) {
  {
    DatasetWriter writer = DatasetWriter::create(
        path("c.mmt"), Schema({Field::ragged("x", kInt32, {kVariableDim}), Field::fixed("x.offsets", kInt64, {})}));
    writer.append({arange(3, kInt32), scalar_tensor(int64_t{1})});
    writer.finish();
  }
  EXPECT_FAILS_WITH(run_mmt({"export", path("c.mmt"), path("out")}), "fields 'x' and 'x.offsets' would both write");
  EXPECT_FALSE(fs::exists(path("out")));
  EXPECT_EQ(run_mmt({"export", path("c.mmt"), path("out"), "--field", "x"}).exit_code, 0);
  EXPECT_TRUE(load_npy(path("out/x.npy")).equal(arange(3, kInt32)));
  {
    DatasetWriter writer =
        DatasetWriter::create(path("long.mmt"), Schema({Field::ragged(std::string(250, 'n'), kInt32, {kVariableDim})}));
    writer.append({arange(3, kInt32)});
    writer.finish();
  }
  EXPECT_FAILS_WITH(run_mmt({"export", path("long.mmt"), path("out2")}), "longer than the 255 bytes of a file name");
  EXPECT_FALSE(fs::exists(path("out2")));
}

// An earlier export's NAME.offsets.npy or NAME.shapes.npy that this one does not write would
// describe the new NAME.npy wrongly (and pack back without a word): refused, or removed with
// --force.
TEST_F(MmtCli, ExportLeavesNoEarlierCompanionFileBesideAField) {
  const auto write = [&](const std::string& name, const Field& field, const std::vector<Tensor>& records) {
    DatasetWriter writer = DatasetWriter::create(path(name), Schema({field}));
    for (const Tensor& record : records) writer.append({record});
    writer.finish();
  };
  write("images.mmt", Field::ragged("v", kFloat32, {kVariableDim, kVariableDim}),
        {zeros({2, 3}, kFloat32), zeros({3, 2}, kFloat32)});
  write("tokens.mmt", Field::ragged("v", kFloat32, {kVariableDim}), {arange(6, kFloat32), arange(6, kFloat32)});
  write("fixed.mmt", Field::fixed("v", kFloat32, {6}), {arange(6, kFloat32), arange(6, kFloat32)});
  const std::string out = path("out");
  ASSERT_EQ(run_mmt({"export", path("images.mmt"), out}).exit_code, 0);
  ASSERT_TRUE(fs::exists(out + "/v.shapes.npy"));
  fs::remove(out + "/v.npy");
  fs::remove(out + "/v.offsets.npy");
  EXPECT_FAILS_WITH(run_mmt({"export", path("tokens.mmt"), out}),
                    out + "/v.shapes.npy exists, but this export writes no such file for field 'v' (ragged in its "
                          "first dimension only)");
  EXPECT_FALSE(fs::exists(out + "/v.npy")) << "nothing written";
  const RunResult forced = run_mmt({"export", path("tokens.mmt"), out, "--force"});
  ASSERT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_NE(forced.out.find(out + "/v.shapes.npy  removed (left from an earlier export"), std::string::npos) << forced.out;
  EXPECT_FALSE(fs::exists(out + "/v.shapes.npy"));
  EXPECT_TRUE(fs::exists(out + "/v.offsets.npy"));
  // A fixed field now: the offsets go too, and v.npy alone is the field.
  const RunResult fixed = run_mmt({"export", path("fixed.mmt"), out, "--force"});
  ASSERT_EQ(fixed.exit_code, 0) << fixed.err;
  EXPECT_FALSE(fs::exists(out + "/v.offsets.npy"));
  const Tensor values = load_npy(out + "/v.npy");
  ASSERT_EQ(values.dim(), 2);
  EXPECT_EQ(values.size(0), 2);
  EXPECT_TRUE(values.select(0, 1).equal(arange(6, kFloat32)));
  // The NAME.npy of a field named "v.offsets" is that field's, exported or not this time.
  {
    DatasetWriter writer = DatasetWriter::create(
        path("named.mmt"), Schema({Field::fixed("v", kFloat32, {6}), Field::fixed("v.offsets", kInt64, {})}));
    writer.append({arange(6, kFloat32), scalar_tensor(int64_t{7})});
    writer.finish();
  }
  ASSERT_EQ(run_mmt({"export", path("named.mmt"), path("named")}).exit_code, 0);
  ASSERT_EQ(run_mmt({"export", path("named.mmt"), path("named"), "--field", "v", "--force"}).exit_code, 0);
  EXPECT_TRUE(load_npy(path("named/v.offsets.npy")).equal(arange(7, 8, 1, kInt64)));
}

TEST_F(MmtCli, InfoTextAndJson) {
  save("a.npy", records(kFloat32, 10, {3, 4}));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "a=" + path("a.npy"), "--codec", "zstd:3"}).exit_code, 0);
  RunResult text = run_mmt({"info", path("a.mmt")});
  ASSERT_EQ(text.exit_code, 0);
  for (const char* s : {"records    10", "format     version", "codec      zstd", "[3, 4]", "row-major"})
    EXPECT_NE(text.out.find(s), std::string::npos) << s << "\n" << text.out;
  nlohmann::json j = nlohmann::json::parse(run_mmt({"info", path("a.mmt"), "--json"}).out);
  EXPECT_EQ(j["records"], 10);
  EXPECT_EQ(j["codec"], "zstd:3");
  EXPECT_EQ(j["fields"][0]["dtype"], "float32");
  EXPECT_EQ(j["fields"][0]["shape"], nlohmann::json::array({3, 4}));
  EXPECT_EQ(j["file_bytes"], fs::file_size(path("a.mmt")));
  // The fingerprint a loader's saved state names, written the same way.
  char fingerprint[19];
  std::snprintf(fingerprint, sizeof fingerprint, "0x%016llx",
                static_cast<unsigned long long>(Dataset::open(path("a.mmt")).fingerprint()));
  EXPECT_EQ(j["fingerprint"], fingerprint);
  EXPECT_NE(text.out.find(std::string("fingerprint ") + fingerprint), std::string::npos) << text.out;
  EXPECT_FAILS_WITH(run_mmt({"info", path("missing.mmt")}), "missing.mmt");
  EXPECT_FAILS_WITH(run_mmt({"info", path("a.npy")}), "a.npy");
}

// Field names that are not ASCII padded by their bytes pushed the columns after them out of
// line ("é" is 2 bytes, one column; U+200B is 3 bytes, none); one key was "1 keys".
TEST_F(MmtCli, InfoAlignsColumnsByWhatTheTerminalShows) {
  // Each name with the columns a terminal gives it: "ééééé" is 10 bytes in 5 columns, the
  // zero-width space 3 bytes in none, each CJK character 3 bytes in 2 columns.
  const std::vector<std::pair<std::string, size_t>> names{
      {"ab", 2}, {"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 5}, {"z\xe2\x80\x8b", 1}, {"\xe7\x8c\xab\xe7\x8c\xab", 4}};
  std::vector<Field> fields;
  std::vector<Tensor> record;
  for (const auto& [name, columns] : names) {
    fields.push_back(Field::fixed(name, kInt32, {}));
    record.push_back(full({}, 1, kInt32));
  }
  WriterOptions options;
  options.metadata = {{"note", "x"}};
  DatasetWriter writer = DatasetWriter::create(path("u.mmt"), Schema(fields), options);
  writer.append(record);
  writer.finish();
  RunResult r = run_mmt({"info", path("u.mmt")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Every dtype starts in terminal column 2 + 5 + 2: the name column is as wide as the widest name.
  for (const auto& [name, columns] : names) {
    const std::string expected_line_start = "  " + name + std::string(5 - columns, ' ') + "  int32";
    EXPECT_NE(r.out.find("\n" + expected_line_start), std::string::npos) << name << "\n" << r.out;
  }
  EXPECT_NE(r.out.find("metadata   1 key\n"), std::string::npos) << r.out;
}

// The --json object's keys are what scripts rely on (README, "The mmt command"): each one is
// pinned here, for one file, a field of each kind, and shards read as one.
TEST_F(MmtCli, InfoJsonKeysArePinned) {
  const auto keys = [](const nlohmann::json& object) {
    std::vector<std::string> names;
    for (const auto& item : object.items()) names.push_back(item.key());
    std::sort(names.begin(), names.end());
    return names;
  };
  using Keys = std::vector<std::string>;
  const Keys dataset_keys{"alignment", "chunks",   "codec",   "decoded_bytes", "fields", "file_bytes", "fingerprint",
                          "format_version", "metadata", "path", "paths", "ratio", "records", "stored_bytes"};
  const Keys fixed_field{"dtype", "fixed", "name", "record_bytes", "shape", "storage_order"};
  const Keys ragged_field{"dtype", "fixed", "name", "shape", "storage_order"};
  const Keys part_keys{"chunks", "codec", "file_bytes", "first_record", "path", "records"};
  fs::create_directories(path("imgs/a"));
  testutil::write_file(path("imgs/a/x.bin"), testutil::to_bytes("xy"));
  ASSERT_EQ(run_mmt({"pack", path("f.mmt"), "--folder", path("imgs")}).exit_code, 0);
  ASSERT_EQ(run_mmt({"pack", path("g.mmt"), "--folder", path("imgs")}).exit_code, 0);
  RunResult one = run_mmt({"info", path("f.mmt"), "--json"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const nlohmann::json j = nlohmann::json::parse(one.out);
  EXPECT_EQ(keys(j), dataset_keys);
  ASSERT_EQ(j["fields"].size(), 2u);
  EXPECT_EQ(keys(j["fields"][0]), ragged_field);  // data: the file's bytes
  EXPECT_EQ(j["fields"][0]["shape"], nlohmann::json::array({-1}));
  EXPECT_EQ(keys(j["fields"][1]), fixed_field);  // label
  EXPECT_TRUE(j["metadata"].is_object());
  RunResult both = run_mmt({"info", path("f.mmt"), path("g.mmt"), "--json"});
  ASSERT_EQ(both.exit_code, 0) << both.err;
  const nlohmann::json shards = nlohmann::json::parse(both.out);
  Keys with_parts = dataset_keys;
  with_parts.push_back("parts");
  std::sort(with_parts.begin(), with_parts.end());
  EXPECT_EQ(keys(shards), with_parts);
  ASSERT_EQ(shards["parts"].size(), 2u);
  EXPECT_EQ(keys(shards["parts"][1]), part_keys);
  EXPECT_EQ(shards["parts"][1]["first_record"], 1);
  // "path" joins the files for display; "paths" lists them, so a name holding ", " is not split.
  EXPECT_EQ(j["paths"], nlohmann::json::array({path("f.mmt")}));
  EXPECT_EQ(shards["paths"], nlohmann::json::array({path("f.mmt"), path("g.mmt")}));
}

TEST_F(MmtCli, NamesAndMetadataCannotDriveTheTerminal) {
  // A window title, a clear screen and an 8-bit CSI (U+009B) in the metadata (field names
  // cannot hold control characters: Field::validate refuses them; JSON text is UTF-8, so no
  // byte that is not UTF-8 either, but printable() escapes those too).
  const std::string crafted = "\x1b]0;pwned\a\x1b[2J\xc2\x9b";
  const std::string escaped = "\\x1b]0;pwned\\x07\\x1b[2J\\u009b";
  WriterOptions options;
  options.metadata = {{"key" + crafted, "value" + crafted}, {"note", "caf\xc3\xa9 C:\\dir"}};
  DatasetWriter writer =
      DatasetWriter::create(path("x.mmt"), Schema({Field::fixed("x", kInt32, {}), Field::bytes("raw")}), options);
  writer.append({full({}, 7, kInt32), empty({0}, kUInt8)});
  writer.finish();
  const auto expect_no_control = [](const RunResult& r) {
    for (const std::string* text : {&r.out, &r.err})
      for (char c : *text)
        EXPECT_TRUE(c == '\n' || static_cast<unsigned char>(c) >= 0x20) << "control byte in: " << *text;
  };

  RunResult info = run_mmt({"info", path("x.mmt")});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  expect_no_control(info);
  for (const std::string& shown : {"  key" + escaped + " = value" + escaped,
                                   std::string("  note = caf\xc3\xa9 C:\\\\dir")})
    EXPECT_NE(info.out.find(shown), std::string::npos) << shown << "\n" << info.out;

  RunResult got = run_mmt({"get", path("x.mmt"), "0"});
  ASSERT_EQ(got.exit_code, 0) << got.err;
  expect_no_control(got);
  EXPECT_NE(got.out.find("'x': tensor(7"), std::string::npos) << got.out;

  RunResult exported = run_mmt({"export", path("x.mmt"), path("out")});
  expect_no_control(exported);
  RunResult unknown = run_mmt({"get", path("x.mmt"), "0", "--field", "\x1b[2J"});
  EXPECT_FAILS_WITH(unknown, "\\x1b[2J");
  expect_no_control(unknown);

  // JSON keeps the exact bytes, as JSON escapes.
  RunResult json = run_mmt({"info", path("x.mmt"), "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  expect_no_control(json);
  nlohmann::json j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["metadata"]["key" + crafted].get<std::string>(), "value" + crafted);
}

// Text from an input file reaches the message whole and escaped once: a NUL in a descr or an
// .npz member name ended the message there ("mmt pack: error: a" was all), and the tool
// doubled the backslash of an escape ("the magic \\x93NUMPY").
TEST_F(MmtCli, TextFromInputFilesIsEscapedOnceAndShownWhole) {
  using namespace std::string_literals;
  testutil::write_file(path("nul.npy"),
                       testutil::npy_with_dict("{'descr': '<i4\0', 'fortran_order': False, 'shape': (2,)}"s, Bytes(8)));
  testutil::write_file(path("nulname.npz"), testutil::zip_archive({{"a\0x.npy"s, testutil::npy_file("<i4", false, "(2,)", Bytes(8))}}));
  testutil::write_file(path("nul2.npz"), testutil::zip_archive({{"abc.npy\0.txt"s, testutil::npy_file("<i4", false, "(2,)", Bytes(8))}}));
  testutil::write_file(path("nomagic.npy"), testutil::to_bytes("NUMPY but not really"));
  EXPECT_FAILS_WITH(run_mmt({"pack", path("o.mmt"), "x=" + path("nul.npy")}),
                    "nul.npy: unsupported dtype '<i4\\x00': not a numeric type mmtensor supports; mmtensor reads a type "
                    "string of b1, u1, i1, i2, u2, i4, u4, i8, u8, f2, f4, f8, c8 or c16, after a byte order '<', '>', '=' "
                    "or '|' or alone (native order), or one of the names bool, int8, uint8, int16, uint16, int32, uint32, "
                    "int64, uint64, float16, float32, float64, complex64 and complex128\n");
  EXPECT_FAILS_WITH(run_mmt({"pack", path("o.mmt"), path("nulname.npz")}),
                    "nulname.npz:a\\x00x.npy (an array of shape [2]): field name of 3 bytes has a control character at byte 1\n");
  EXPECT_FAILS_WITH(run_mmt({"pack", path("o.mmt"), path("nul2.npz")}),
                    "nul2.npz: member 'abc.npy\\x00.txt' is not an .npy array (an .npz holds only NAME.npy members)\n");
  EXPECT_FAILS_WITH(run_mmt({"pack", path("o.mmt"), "x=" + path("nomagic.npy")}),
                    "nomagic.npy: not an .npy file: the magic \\x93NUMPY is missing\n");
  // A field name quoted by the tool itself is escaped once too.
  save("a.npy", arange(3, kInt64));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "a\\b=" + path("a.npy")}).exit_code, 0);
  EXPECT_FAILS_WITH(run_mmt({"export", path("a.mmt"), path("out"), "--field", "a\\b", "--field", "a\\b"}),
                    "--field 'a\\\\b' is given twice\n");
}

// verify --against matched fields by position ("schema differs" for the right fields in
// another order, or a subset); verify --folder "" and --against "" compared nothing (or gave
// the wrong reason); --samples without a source did nothing; a folder record that differed
// was named "data=DIR". And get --field "" printed every field.
TEST_F(MmtCli, VerifyComparesByNameAndRefusesAnEmptySource) {
  save("a.npy", records(kInt32, 5, {3}));
  save("b.npy", records(kUInt8, 5, {}));
  ASSERT_EQ(run_mmt({"pack", path("o.mmt"), "a=" + path("a.npy"), "b=" + path("b.npy")}).exit_code, 0);
  const RunResult reordered = run_mmt({"verify", path("o.mmt"), "--against", "b=" + path("b.npy"), "a=" + path("a.npy")});
  EXPECT_EQ(reordered.exit_code, 0) << reordered.err;
  EXPECT_NE(reordered.out.find("5 records (all) equal their sources byte for byte (fields b, a)"), std::string::npos)
      << reordered.out;
  const RunResult subset = run_mmt({"verify", path("o.mmt"), "--against", "a=" + path("a.npy")});
  EXPECT_EQ(subset.exit_code, 0) << subset.err;
  EXPECT_NE(subset.out.find("(field a; not compared, as the sources do not give them: b)"), std::string::npos)
      << subset.out;
  EXPECT_FAILS_WITH(run_mmt({"verify", path("o.mmt"), "--against", "c=" + path("a.npy")}),
                    "the sources give field 'c' (c=" + path("a.npy") + "), which the dataset lacks; its fields are 'a', 'b'");
  EXPECT_FAILS_WITH(run_mmt({"verify", path("o.mmt"), "--against", "b=" + path("a.npy")}),
                    "field 'b' is uint8[] in the dataset but int32[3] in its source b=");

  const std::vector<std::pair<std::vector<std::string>, std::string>> refused{
      {{"verify", path("o.mmt"), "--folder", ""}, "mmt verify: error: --folder is empty"},
      {{"verify", path("o.mmt"), "--against", ""}, "mmt verify: error: --against has an empty input"},
      {{"verify", path("o.mmt"), "--samples", "2"}, "mmt verify: error: --samples chooses the records to compare with "
                                                    "the sources: it needs --against or --folder"},
      {{"verify", path("o.mmt"), "--seed", "2"}, "mmt verify: error: --seed chooses the records"},
      {{"pack", path("p.mmt"), "--folder", ""}, "mmt pack: error: --folder is empty"},
      {{"get", path("o.mmt"), "0", "--field", ""}, "mmt get: error: --field is empty"},
      {{"get", path("o.mmt"), "0", "--field", "", "--npy", path("x.npy")}, "mmt get: error: --field is empty"},
      {{"export", path("o.mmt"), path("out"), "--field", ""}, "mmt export: error: --field is empty"},
  };
  for (const auto& [args, message] : refused) {
    const RunResult r = run_mmt(args);
    EXPECT_EQ(r.exit_code, 2) << message << "\n" << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "") << message;
  }
  EXPECT_FALSE(fs::exists(path("out")));

  fs::create_directories(path("f1/cat"));
  testutil::write_file(path("f1/cat/a.jpg"), testutil::to_bytes("meow"));
  ASSERT_EQ(run_mmt({"pack", path("f.mmt"), "--folder", path("f1")}).exit_code, 0);
  testutil::write_file(path("f1/cat/a.jpg"), testutil::to_bytes("meoW"));
  EXPECT_FAILS_WITH(run_mmt({"verify", path("f.mmt"), "--folder", path("f1")}),
                    "record 0, field 'data' differs from its source " + path("f1/cat/a.jpg") + " at byte 3 of the value");
}

// --paths keeps which file each record came from, and verify --folder then checks the names
// too (a file renamed since the pack is caught); a folder of files alone packs unlabeled.
TEST_F(MmtCli, FolderPathsAreStoredAndVerifiedAndUnlabeledFoldersPack) {
  fs::create_directories(path("imgs/cat"));
  fs::create_directories(path("imgs/dog"));
  testutil::write_file(path("imgs/cat/a.jpg"), testutil::to_bytes("meow"));
  testutil::write_file(path("imgs/dog/b.jpg"), testutil::to_bytes("woof"));
  const RunResult packed = run_mmt({"pack", path("p.mmt"), "--folder", path("imgs"), "--paths"});
  ASSERT_EQ(packed.exit_code, 0) << packed.err;
  ASSERT_EQ(run_mmt({"get", path("p.mmt"), "1", "--field", "path", "--raw", path("name.bin")}).exit_code, 0);
  EXPECT_EQ(testutil::read_file(path("name.bin")), testutil::to_bytes("dog/b.jpg"));
  const RunResult sound = run_mmt({"verify", path("p.mmt"), "--folder", path("imgs")});
  EXPECT_EQ(sound.exit_code, 0) << sound.err;
  EXPECT_NE(sound.out.find("equal their sources byte for byte (fields data, label, path)"), std::string::npos) << sound.out;
  fs::rename(path("imgs/dog/b.jpg"), path("imgs/dog/c.jpg"));  // same bytes, another name
  EXPECT_FAILS_WITH(run_mmt({"verify", path("p.mmt"), "--folder", path("imgs")}), "record 1, field 'path' differs");
  EXPECT_FAILS_WITH(run_mmt({"pack", path("q.mmt"), "--paths", "x=" + path("x.npy")}), "--paths stores the path");
  // A repack that kept some fields is checked against the folder on those.
  fs::rename(path("imgs/dog/c.jpg"), path("imgs/dog/b.jpg"));
  ASSERT_EQ(run_mmt({"pack", path("d.mmt"), path("p.mmt"), "--field", "data"}).exit_code, 0);
  const RunResult some = run_mmt({"verify", path("d.mmt"), "--folder", path("imgs")});
  EXPECT_EQ(some.exit_code, 0) << some.err;
  EXPECT_NE(some.out.find("(field data; not compared, as the dataset does not hold them: label)"),
            std::string::npos) << some.out;
  EXPECT_FALSE(fs::exists(path("q.mmt")));

  fs::create_directories(path("flat"));
  testutil::write_file(path("flat/1.txt"), testutil::to_bytes("one"));
  testutil::write_file(path("flat/2.txt"), testutil::to_bytes("two"));
  ASSERT_EQ(run_mmt({"pack", path("f.mmt"), "--folder", path("flat")}).exit_code, 0);
  const RunResult info = run_mmt({"info", path("f.mmt"), "--json"});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  const nlohmann::json j = nlohmann::json::parse(info.out);
  EXPECT_EQ(j["records"], 2);
  ASSERT_EQ(j["fields"].size(), 1u);
  EXPECT_EQ(j["fields"][0]["name"], "data");
  EXPECT_FALSE(j["metadata"].contains("classes"));
  EXPECT_EQ(run_mmt({"verify", path("f.mmt"), "--folder", path("flat")}).exit_code, 0);
}

// WebDataset shards: one record per sample, verified against the archives (keys too).
TEST_F(MmtCli, PackTakesWebDatasetShardsAndVerifiesAgainstThem) {
  for (int shard = 0; shard < 2; ++shard) {
    testutil::TarBuilder tar;
    for (int i = 0; i < 3; ++i) {
      const std::string key = "s" + std::to_string(shard) + "/" + std::to_string(i);
      tar.add(key + ".png", std::string(static_cast<size_t>(100 + i), 'p')).add(key + ".cls", std::to_string(i));
    }
    testutil::write_file(path("shard-" + std::to_string(shard) + ".tar"), tar.finish());
  }
  const RunResult packed = run_mmt({"pack", path("w.mmt"), path("shard-0.tar"), path("shard-1.tar"), "--keys",
                                    "--codec", "zstd"});
  ASSERT_EQ(packed.exit_code, 0) << packed.err;
  EXPECT_NE(packed.out.find("packed 6 records (3 fields)"), std::string::npos) << packed.out;
  const Dataset ds = Dataset::open(path("w.mmt"));
  EXPECT_EQ(ds[4]["cls"].item<int64_t>(), 1);
  const RunResult sound = run_mmt({"verify", path("w.mmt"), "--against", path("shard-0.tar"), path("shard-1.tar")});
  EXPECT_EQ(sound.exit_code, 0) << sound.err;
  EXPECT_NE(sound.out.find("equal their sources byte for byte (fields cls, png, __key__)"), std::string::npos) << sound.out;
  // The archives in another order: the first record differs, named with its member.
  EXPECT_FAILS_WITH(run_mmt({"verify", path("w.mmt"), "--against", path("shard-1.tar"), path("shard-0.tar")}),
                    "record 0, field '__key__' differs");
  EXPECT_FAILS_WITH(run_mmt({"pack", path("q.mmt"), path("shard-0.tar"), "--field", "png"}), "all are packed");
  EXPECT_FAILS_WITH(run_mmt({"pack", path("q.mmt"), "--folder", path("."), "--keys"}), "a folder has --paths");
  save("x.npy", arange(4, kInt64));
  EXPECT_FAILS_WITH(run_mmt({"pack", path("q.mmt"), "x=" + path("x.npy"), "--keys"}), "these inputs are not tar archives");
  testutil::write_file(path("gz.tar.gz"), testutil::to_bytes(std::string("\x1f\x8b\x08\x00", 4) + std::string(600, '\0')));
  EXPECT_FAILS_WITH(run_mmt({"pack", path("q.mmt"), path("gz.tar.gz")}), path("gz.tar.gz"));
  EXPECT_FALSE(fs::exists(path("q.mmt")));
}

// Tar samples of uneven members: --ext chooses the fields, --missing what a sample lacking one
// gives, and verify groups the archive as the pack did (its metadata records how).
TEST_F(MmtCli, PackChoosesTarFieldsAndSkipsSamplesLackingOne) {
  testutil::TarBuilder tar;
  tar.add("a.jpg", "J").add("a.cls", "0").add("b.png", "P").add("b.cls", "1").add("c.cls", "2").add("c.txt", "T");
  testutil::write_file(path("u.tar"), tar.finish());
  EXPECT_FAILS_WITH(run_mmt({"pack", path("x.mmt"), path("u.tar")}), "--missing skip|empty");
  const RunResult packed = run_mmt({"pack", path("u.mmt"), path("u.tar"), "--ext", "jpg;png", "--ext", "cls",
                                    "--missing", "skip"});
  ASSERT_EQ(packed.exit_code, 0) << packed.err;
  EXPECT_NE(packed.out.find("packed 2 records (2 fields)"), std::string::npos) << packed.out;
  EXPECT_NE(packed.out.find("skipped 1 sample lacking a field's member (--missing skip)"), std::string::npos) << packed.out;
  const RunResult sound = run_mmt({"verify", path("u.mmt"), "--against", path("u.tar")});
  EXPECT_EQ(sound.exit_code, 0) << sound.err;
  EXPECT_FAILS_WITH(run_mmt({"pack", path("x.mmt"), path("u.tar"), "--missing", "sometimes"}), "error, skip or empty");
  EXPECT_FAILS_WITH(run_mmt({"pack", path("x.mmt"), "--folder", path("."), "--ext", "jpg"}), "not of a folder");
  EXPECT_FALSE(fs::exists(path("x.mmt")));
}

// MosaicML Streaming (MDS) datasets: one record per sample, verified against the shards.
TEST_F(MmtCli, PackTakesMdsDatasetsAndVerifiesAgainstThem) {
  fs::create_directories(path("mds"));
  testutil::MdsBuilder builder({{"label", "int", 8}, {"text", "str"}});
  for (int64_t i = 0; i < 20; ++i)
    builder.sample({testutil::MdsBuilder::bytes_of(std::vector<int64_t>{i}), testutil::to_bytes(std::string(i, 'a'))});
  builder.flush(path("mds"), "shard.00000.mds");
  builder.write_index(path("mds"));
  const RunResult packed = run_mmt({"pack", path("m.mmt"), path("mds"), "--codec", "zstd"});
  ASSERT_EQ(packed.exit_code, 0) << packed.err;
  EXPECT_NE(packed.out.find("packed 20 records (2 fields)"), std::string::npos) << packed.out;
  EXPECT_EQ(Dataset::open(path("m.mmt"))[7]["text"].numel(), 7);
  const RunResult sound = run_mmt({"verify", path("m.mmt"), "--against", path("mds/index.json")});
  EXPECT_EQ(sound.exit_code, 0) << sound.err;
  EXPECT_FAILS_WITH(run_mmt({"pack", path("q.mmt"), path("mds"), "--field", "text"}), "all are packed");
  EXPECT_FALSE(fs::exists(path("q.mmt")));
}

// HDF5 files: a dataset a field (a plain one viewed in place, a gzip-chunked one read through
// libhdf5), verified against the file, exported back as .npy of the same values.
TEST_F(MmtCli, PackTakesHdf5FilesAndVerifiesAgainstThem) {
  std::vector<uint8_t> images(12 * 6);
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<uint8_t>(i * 3);
  std::vector<int64_t> labels(12);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 5);
  {
    const hid_t file = H5Fcreate(path("d.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hsize_t image_dims[2] = {12, 6}, label_dims[1] = {12}, chunk[1] = {5};
    const hid_t image_space = H5Screate_simple(2, image_dims, nullptr), label_space = H5Screate_simple(1, label_dims, nullptr);
    const hid_t gzip = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(gzip, 1, chunk);
    H5Pset_deflate(gzip, 6);
    const hid_t a = H5Dcreate2(file, "images", H5T_STD_U8LE, image_space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    const hid_t b = H5Dcreate2(file, "labels", H5T_STD_I64BE, label_space, H5P_DEFAULT, gzip, H5P_DEFAULT);
    H5Dwrite(a, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, images.data());
    H5Dwrite(b, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data());
    for (const hid_t id : {a, b}) H5Dclose(id);
    H5Pclose(gzip);
    for (const hid_t id : {image_space, label_space}) H5Sclose(id);
    H5Fclose(file);
  }
  const RunResult packed = run_mmt({"pack", path("h.mmt"), path("d.h5"), "--codec", "lz4"});
  ASSERT_EQ(packed.exit_code, 0) << packed.err;
  EXPECT_NE(packed.out.find("packed 12 records (2 fields)"), std::string::npos) << packed.out;
  const RunResult sound = run_mmt({"verify", path("h.mmt"), "--against", path("d.h5")});
  EXPECT_EQ(sound.exit_code, 0) << sound.out << sound.err;
  ASSERT_EQ(run_mmt({"export", path("h.mmt"), path("h-out")}).exit_code, 0);
  EXPECT_EQ(load_npy(path("h-out/images.npy")).to_vector<uint8_t>(), images);
  EXPECT_EQ(load_npy(path("h-out/labels.npy")).to_vector<int64_t>(), labels);
  const RunResult one = run_mmt({"pack", path("l.mmt"), "y=" + path("d.h5") + ":/labels"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_EQ(Dataset::open(path("l.mmt")).schema()[0].name, "y");
  EXPECT_FAILS_WITH(run_mmt({"pack", path("q.mmt"), "y=" + path("d.h5") + ":/nothing"}),
                    "no dataset 'nothing' in the file; its datasets: images, labels");
  EXPECT_FALSE(fs::exists(path("q.mmt")));
}

// Arrow files: one record per row; columns chosen with --field, a type no field holds named
// until it is left out; verified against the file.
TEST_F(MmtCli, PackTakesArrowFilesAndVerifiesAgainstThem) {
  namespace arrow = testutil::arrow;
  const std::vector<std::vector<arrow::Column>> batches = {
      {arrow::numbers("label", std::vector<int64_t>{3, 1, 4}), arrow::intervals("period", 3),
       arrow::texts("text", {"a", "bb", "ccc"})}};
  const std::vector<uint8_t> bytes = arrow::write(batches).bytes;
  std::ofstream(path("t.arrow"), std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                         static_cast<std::streamsize>(bytes.size()));
  EXPECT_FAILS_WITH(run_mmt({"pack", path("a.mmt"), path("t.arrow")}), "'period' (interval)");
  EXPECT_FALSE(fs::exists(path("a.mmt")));
  const RunResult packed =
      run_mmt({"pack", path("a.mmt"), path("t.arrow"), "--field", "text", "--field", "label", "--codec", "zstd"});
  ASSERT_EQ(packed.exit_code, 0) << packed.err;
  EXPECT_NE(packed.out.find("packed 3 records (2 fields)"), std::string::npos) << packed.out;
  EXPECT_EQ(Dataset::open(path("a.mmt"))[2]["text"].numel(), 3);
  const RunResult sound = run_mmt({"verify", path("a.mmt"), "--against", path("t.arrow")});
  EXPECT_EQ(sound.exit_code, 0) << sound.err;
  EXPECT_NE(sound.out.find("equal their sources byte for byte (fields text, label)"), std::string::npos) << sound.out;
  // A nullable integer: zeros and a mask, label.valid, which verify reads back too.
  const std::vector<uint8_t> nullable =
      arrow::write({{arrow::numbers("label", std::vector<int64_t>{3, 1, 4}, {true, false, true})}}).bytes;
  std::ofstream(path("n.arrow"), std::ios::binary).write(reinterpret_cast<const char*>(nullable.data()),
                                                         static_cast<std::streamsize>(nullable.size()));
  ASSERT_EQ(run_mmt({"pack", path("n.mmt"), path("n.arrow")}).exit_code, 0);
  EXPECT_FALSE(Dataset::open(path("n.mmt"))[1]["label.valid"].item<bool>());
  const RunResult masked = run_mmt({"verify", path("n.mmt"), "--against", path("n.arrow")});
  EXPECT_EQ(masked.exit_code, 0) << masked.err;
  EXPECT_NE(masked.out.find("(fields label, label.valid)"), std::string::npos) << masked.out;
  // A file Polars wrote (zstd; its strings string_view): packed whole, and verified.
  const std::string polars = (fs::path(MMT_SOURCE_DIR) / "tests/data/arrow/polars_zstd.arrow").string();
  const RunResult from_polars = run_mmt({"pack", path("p.mmt"), polars, "--codec", "lz4"});
  ASSERT_EQ(from_polars.exit_code, 0) << from_polars.err;
  EXPECT_NE(from_polars.out.find("packed 45 records (20 fields)"), std::string::npos) << from_polars.out;
  const RunResult polars_sound = run_mmt({"verify", path("p.mmt"), "--against", polars});
  EXPECT_EQ(polars_sound.exit_code, 0) << polars_sound.err;
  EXPECT_NE(polars_sound.out.find("equal their sources byte for byte"), std::string::npos) << polars_sound.out;
  // A dataset holding a column without its mask (packed before every column with nulls had
  // one, or repacked without it) verifies: the masks it lacks are not compared.
  ASSERT_EQ(run_mmt({"pack", path("unmasked.mmt"), path("p.mmt"), "--field", "score", "--field", "text"}).exit_code, 0);
  const RunResult unmasked = run_mmt({"verify", path("unmasked.mmt"), "--against", polars});
  EXPECT_EQ(unmasked.exit_code, 0) << unmasked.err;
  EXPECT_NE(unmasked.out.find("(fields score, text; not compared, as the dataset does not hold them: score.valid, text.valid)"),
            std::string::npos)
      << unmasked.out;
}

// TFRecord files: one record per Example; features chosen with --field by key; verified
// against the files, the lengths of a bytes_list too; a damaged record named.
TEST_F(MmtCli, PackTakesTfRecordFilesAndVerifiesAgainstThem) {
  using testutil::example_bytes;
  const std::vector<std::string> examples = {
      example_bytes({{"image/encoded", std::vector<std::string>{"jpeg-0"}},
                     {"image/class/label", std::vector<int64_t>{7}},
                     {"objects/text", std::vector<std::string>{"cat", "mat"}}}),
      example_bytes({{"image/encoded", std::vector<std::string>{"jpeg-1"}},
                     {"image/class/label", std::vector<int64_t>{2}},
                     {"objects/text", std::vector<std::string>{}}})};
  testutil::write_file(path("train.tfrecord-00000-of-00001"), testutil::tfrecord_file(examples));
  const RunResult packed = run_mmt({"pack", path("t.mmt"), path("train.tfrecord-00000-of-00001"), "--field",
                                    "image/encoded", "--field", "objects/text", "--codec", "zstd"});
  ASSERT_EQ(packed.exit_code, 0) << packed.err;
  EXPECT_NE(packed.out.find("packed 2 records (3 fields)"), std::string::npos) << packed.out;
  const Dataset dataset = Dataset::open(path("t.mmt"));
  EXPECT_EQ(testutil::text_of(dataset[1]["image.encoded"]), "jpeg-1");
  EXPECT_EQ(dataset[0]["objects.text.lengths"].numel(), 2);
  const RunResult sound = run_mmt({"verify", path("t.mmt"), "--against", path("train.tfrecord-00000-of-00001")});
  EXPECT_EQ(sound.exit_code, 0) << sound.err;
  EXPECT_NE(sound.out.find("equal their sources byte for byte (fields image.encoded, objects.text, objects.text.lengths)"),
            std::string::npos)
      << sound.out;
  // A SequenceExample's feature list sharing its key with a context feature: chosen by kind,
  // and verified against the file by the key and kind the dataset records.
  testutil::write_file(path("seq.tfrecord"),
                       testutil::tfrecord_file({testutil::sequence_example_bytes(
                           {{"len", std::vector<int64_t>{2}}}, {{"len", {std::vector<int64_t>{4}, std::vector<int64_t>{5}}}})}));
  EXPECT_FAILS_WITH(run_mmt({"pack", path("seq.mmt"), path("seq.tfrecord")}), "--field 'feature_list:len'");
  const RunResult steps = run_mmt({"pack", path("seq.mmt"), path("seq.tfrecord"), "--field", "feature_list:len"});
  ASSERT_EQ(steps.exit_code, 0) << steps.err;
  const RunResult steps_sound = run_mmt({"verify", path("seq.mmt"), "--against", path("seq.tfrecord")});
  EXPECT_EQ(steps_sound.exit_code, 0) << steps_sound.err;
  EXPECT_NE(steps_sound.out.find("byte for byte (field len)"), std::string::npos) << steps_sound.out;
  // A dataset that does not record the kinds (packed before the metadata did, or written by
  // the API): verify is refused with the pack's advice, and takes the same --field.
  {
    const Dataset recorded = Dataset::open(path("seq.mmt"));
    DatasetWriter writer = DatasetWriter::create(path("seq-bare.mmt"), recorded.schema());
    for (int64_t i = 0; i < recorded.size(); ++i) {
      const Sample sample = recorded[i];
      std::vector<Tensor> values;
      for (size_t f = 0; f < sample.size(); ++f) values.push_back(sample[f]);
      writer.append(values);
    }
    writer.finish();
  }
  EXPECT_FAILS_WITH(run_mmt({"verify", path("seq-bare.mmt"), "--against", path("seq.tfrecord")}),
                    "choose one with --field 'feature:len' or --field 'feature_list:len'");
  const RunResult bare_sound =
      run_mmt({"verify", path("seq-bare.mmt"), "--against", path("seq.tfrecord"), "--field", "feature_list:len"});
  EXPECT_EQ(bare_sound.exit_code, 0) << bare_sound.err;
  EXPECT_NE(bare_sound.out.find("byte for byte (field len)"), std::string::npos) << bare_sound.out;
  // The context feature is not what the dataset holds: a mismatch, not a pass.
  EXPECT_FAILS_WITH(
      run_mmt({"verify", path("seq-bare.mmt"), "--against", path("seq.tfrecord"), "--field", "feature:len"}),
      "field 'len' is int64[-1] in the dataset but int64[] in its source");
  EXPECT_FAILS_WITH(run_mmt({"verify", path("seq-bare.mmt"), "--field", "feature_list:len"}), "it needs --against");
  testutil::write_file(path("x.npy"), testutil::npy_file("<i8", false, "(1,)", testutil::Bytes(8)));
  EXPECT_FAILS_WITH(run_mmt({"verify", path("t.mmt"), "--against", "x=" + path("x.npy"), "--field", "x"}),
                    "arrays, tar archives, Megatron and MDS datasets give all theirs");
  EXPECT_FAILS_WITH(run_mmt({"verify", path("t.mmt"), "--against", path("missing.tfrecord"), "--field", "x"}),
                    "missing.tfrecord");
  // A damaged record: named, and nothing written.
  testutil::Bytes damaged = testutil::tfrecord_file(examples);
  damaged[damaged.size() - 10] ^= std::byte{1};
  testutil::write_file(path("bad.tfrecord"), damaged);
  EXPECT_FAILS_WITH(run_mmt({"pack", path("bad.mmt"), path("bad.tfrecord")}), "bad.tfrecord, record 1 (byte ");
  EXPECT_FALSE(fs::exists(path("bad.mmt")));
}

// Parquet files (a Hugging Face image dataset's shard, written by arrow-rs): packed, their
// class names kept, and verified against the file.
TEST_F(MmtCli, PackTakesParquetFilesAndVerifiesAgainstThem) {
  const std::string parquet = (fs::path(MMT_SOURCE_DIR) / "tests/data/parquet/pw_hf_image.parquet").string();
  const RunResult packed = run_mmt({"pack", path("p.mmt"), parquet, "--codec", "lz4"});
  ASSERT_EQ(packed.exit_code, 0) << packed.err;
  EXPECT_NE(packed.out.find("packed 6 records (4 fields)"), std::string::npos) << packed.out;
  const Dataset dataset = Dataset::open(path("p.mmt"));
  EXPECT_EQ(dataset.metadata().at("source"), "parquet");
  EXPECT_EQ(dataset.metadata().at("classes"), R"(["cat","dog"])");
  const RunResult sound = run_mmt({"verify", path("p.mmt"), "--against", parquet});
  EXPECT_EQ(sound.exit_code, 0) << sound.err;
  EXPECT_NE(sound.out.find("equal their sources byte for byte (fields image.bytes, image.path, image.path.valid, label)"), std::string::npos)
      << sound.out;
  // A chat dataset's messages, list<struct<role, content>>, chosen by the struct's name.
  const std::string chat = (fs::path(MMT_SOURCE_DIR) / "tests/data/parquet/duckdb_chat.parquet").string();
  const RunResult messages = run_mmt({"pack", path("c.mmt"), chat, "--field", "messages", "--codec", "zstd"});
  ASSERT_EQ(messages.exit_code, 0) << messages.err;
  EXPECT_NE(messages.out.find("packed 9 records (6 fields)"), std::string::npos) << messages.out;
  const RunResult chat_sound = run_mmt({"verify", path("c.mmt"), "--against", chat});
  EXPECT_EQ(chat_sound.exit_code, 0) << chat_sound.err;
  EXPECT_NE(chat_sound.out.find("(fields messages.role, messages.role.lengths, messages.role.valid, "
                                "messages.content, messages.content.lengths, messages.content.valid)"),
            std::string::npos)
      << chat_sound.out;
  // DuckDB's nullable int8 and decimal: their masks verified against the file too.
  const std::string duckdb = (fs::path(MMT_SOURCE_DIR) / "tests/data/parquet/duckdb_types.parquet").string();
  ASSERT_EQ(run_mmt({"pack", path("i.mmt"), duckdb, "--field", "i8", "--field", "dec_9_2"}).exit_code, 0);
  const RunResult i8 = run_mmt({"verify", path("i.mmt"), "--against", duckdb});
  EXPECT_EQ(i8.exit_code, 0) << i8.err;
  EXPECT_NE(i8.out.find("(fields i8, i8.valid, dec_9_2, dec_9_2.valid)"), std::string::npos) << i8.out;
  // Token windows from a list column with nulls: cut from the column, its mask left out (a null
  // row is an empty document), and verified against the file.
  const std::string nested = (fs::path(MMT_SOURCE_DIR) / "tests/data/parquet/duckdb_nested.parquet").string();
  const RunResult windows = run_mmt({"pack", path("w.mmt"), nested, "--field", "list_int32", "--window", "4"});
  ASSERT_EQ(windows.exit_code, 0) << windows.err;
  const Dataset cut = Dataset::open(path("w.mmt"));
  ASSERT_EQ(cut.schema().size(), 1u);
  ASSERT_EQ(cut.size(), 6);  // 25 tokens: [0], [], null, [3, 13, 23, 33], [4, 14, 24, 34, 44]...
  const Tensor second = cut[1]["list_int32"];
  EXPECT_EQ((std::vector<int32_t>(second.data_ptr<int32_t>(), second.data_ptr<int32_t>() + 4)),
            (std::vector<int32_t>{33, 4, 14, 24}));
  const RunResult windows_sound = run_mmt({"verify", path("w.mmt"), "--against", nested});
  EXPECT_EQ(windows_sound.exit_code, 0) << windows_sound.err;
  // Nulls among fixed values hold no tokens: refused, not cut as zeros.
  EXPECT_FAILS_WITH(run_mmt({"pack", path("z.mmt"), duckdb, "--field", "i8", "--window", "2"}),
                    "token windows: column 'i8' has nulls (its mask i8.valid), and its rows are of fixed shape []");
  // A list of strings' lengths packed without the strings: with the column's mask, and verified.
  ASSERT_EQ(run_mmt({"pack", path("l.mmt"), chat, "--field", "messages.role.lengths"}).exit_code, 0);
  const Dataset lengths = Dataset::open(path("l.mmt"));
  ASSERT_EQ(lengths.schema().size(), 2u);
  EXPECT_EQ(lengths.schema()[1].name, "messages.role.valid");
  const RunResult lengths_sound = run_mmt({"verify", path("l.mmt"), "--against", chat});
  EXPECT_EQ(lengths_sound.exit_code, 0) << lengths_sound.err;
  EXPECT_NE(lengths_sound.out.find("(fields messages.role.lengths, messages.role.valid)"), std::string::npos)
      << lengths_sound.out;
  const std::string types = (fs::path(MMT_SOURCE_DIR) / "tests/data/parquet/edge/repeated_group_with_decimal.parquet").string();
  EXPECT_FAILS_WITH(run_mmt({"pack", path("n.mmt"), types}), "'pts.d' (decimal(0, 0))");
  EXPECT_FALSE(fs::exists(path("n.mmt")));
}

// Metadata values longer than a line or two are cut in `mmt info`, whole in --json.
TEST_F(MmtCli, InfoCutsLongMetadataValues) {
  WriterOptions options;
  const std::string classes(5000, 'c');
  options.metadata["classes"] = classes;
  options.metadata["short"] = "kept";
  DatasetWriter writer = DatasetWriter::create(path("m.mmt"), Schema({Field::fixed("x", kInt32, {})}), options);
  writer.append({full({}, 1, kInt32)});
  writer.finish();
  const RunResult info = run_mmt({"info", path("m.mmt")});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("  short = kept\n"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find(" ... (5000 bytes; --json gives them all)\n"), std::string::npos) << info.out;
  EXPECT_EQ(info.out.find(classes), std::string::npos);
  const RunResult json = run_mmt({"info", path("m.mmt"), "--json"});
  EXPECT_EQ(nlohmann::json::parse(json.out)["metadata"]["classes"], classes);
}

// Megatron indexed datasets: one record per document, verified against the pair; cut into
// windows and verified again.
TEST_F(MmtCli, PackTakesMegatronDatasetsAndVerifiesAgainstThem) {
  testutil::MegatronBuilder built;
  for (int64_t d = 0; d < 50; ++d) {
    std::vector<int64_t> tokens;
    for (int64_t t = 0; t < 10 + d; ++t) tokens.push_back(d * 100 + t);
    built.document({tokens});
  }
  built.write(path("corpus_text_document"));
  const RunResult packed = run_mmt({"pack", path("m.mmt"), path("corpus_text_document"), "--codec", "lz4"});
  ASSERT_EQ(packed.exit_code, 0) << packed.err;
  EXPECT_NE(packed.out.find("packed 50 records (1 fields)"), std::string::npos) << packed.out;
  const Dataset ds = Dataset::open(path("m.mmt"));
  EXPECT_EQ(ds.schema()[0].name, "tokens");
  EXPECT_EQ(ds.schema()[0].dtype, kUInt16);
  EXPECT_EQ(ds[49]["tokens"].numel(), 59);
  const RunResult sound = run_mmt({"verify", path("m.mmt"), "--against", path("corpus_text_document.idx")});
  EXPECT_EQ(sound.exit_code, 0) << sound.err;
  EXPECT_NE(sound.out.find("50 records"), std::string::npos) << sound.out;

  const RunResult windows = run_mmt({"pack", path("w.mmt"), "ids=" + path("corpus_text_document"), "--window", "65:64",
                                     "--separator", "65535"});
  ASSERT_EQ(windows.exit_code, 0) << windows.err;
  EXPECT_EQ(run_mmt({"verify", path("w.mmt"), "--against", "ids=" + path("corpus_text_document")}).exit_code, 0);
  // A token changed in the .bin: the document that holds it is named.
  testutil::Bytes bin = built.bin();
  bin[2 * 100] = std::byte{0x7F};  // token 100, in document 7 (its tokens are 91 to 107)
  testutil::write_file(path("corpus_text_document.bin"), bin);
  EXPECT_FAILS_WITH(run_mmt({"verify", path("m.mmt"), "--against", path("corpus_text_document")}),
                    "document 7 of " + path("corpus_text_document.bin"));
  EXPECT_FAILS_WITH(run_mmt({"pack", path("q.mmt"), path("corpus_text_document"), "--field", "tokens"}),
                    "all are packed");
  EXPECT_FALSE(fs::exists(path("q.mmt")));
}

// Token windows over a 1-D array, in shards, verified against the array by the windows the
// metadata records.
TEST_F(MmtCli, PackCutsTokenWindowsAndVerifyCutsTheSourcesAlike) {
  save("tokens.npy", arange(5000, kInt32));
  for (const char* k : {"0", "1"}) {
    const RunResult packed = run_mmt({"pack", path(std::string("gpt-") + k + ".mmt"), "tokens=" + path("tokens.npy"),
                                      "--window", "129:128", "--shard", std::string(k) + "/2", "--codec", "lz4"});
    ASSERT_EQ(packed.exit_code, 0) << packed.err;
  }
  const Dataset ds = Dataset::open_concat({path("gpt-0.mmt"), path("gpt-1.mmt")});
  ASSERT_EQ(ds.size(), (5000 - 129) / 128 + 1);
  EXPECT_TRUE(ds.get(7, "tokens").equal(arange(7 * 128, 7 * 128 + 129, 1, kInt32)));  // inputs 896.., targets 897..
  const RunResult sound = run_mmt({"verify", path("gpt-0.mmt"), path("gpt-1.mmt"), "--against", "tokens=" + path("tokens.npy")});
  EXPECT_EQ(sound.exit_code, 0) << sound.err;
  save("other.npy", arange(1, 5001, 1, kInt32));
  EXPECT_FAILS_WITH(run_mmt({"verify", path("gpt-0.mmt"), "--against", "tokens=" + path("other.npy")}),
                    "record 0, field 'tokens' differs from its source tokens 0 to 128 of tokens=");
  // The shards merged: verified against the shards, whose records are those windows already.
  ASSERT_EQ(run_mmt({"pack", path("gpt.mmt"), path("gpt-0.mmt"), path("gpt-1.mmt"), "--codec", "zstd"}).exit_code, 0);
  const RunResult merged = run_mmt({"verify", path("gpt.mmt"), "--against", path("gpt-0.mmt"), path("gpt-1.mmt")});
  EXPECT_EQ(merged.exit_code, 0) << merged.err;
  // A longer stream has enough tokens for the same windows, but is not the one they came from.
  save("longer.npy", arange(5050, kInt32));
  EXPECT_FAILS_WITH(run_mmt({"verify", path("gpt.mmt"), "--against", "tokens=" + path("longer.npy")}),
                    "its windows were cut from a stream of 5000 tokens (metadata key token_windows), but these inputs make 5050");
  EXPECT_FAILS_WITH(run_mmt({"pack", path("q.mmt"), "tokens=" + path("tokens.npy"), "--separator", "0"}),
                    "--separator goes between the documents of --window's stream");
  EXPECT_FAILS_WITH(run_mmt({"pack", path("q.mmt"), "tokens=" + path("tokens.npy"), "--window", "0"}),
                    "--window's LENGTH '0' is out of range");
  EXPECT_FALSE(fs::exists(path("q.mmt")));
}

// Shards repacked into one file with another codec (and some fields left out); verify
// --against the shards compares the fields the repack kept.
TEST_F(MmtCli, PackRepacksDatasetsMergingShards) {
  save_npy(path("x.npy"), arange(40, kFloat32).view({10, 4}));
  save_npy(path("y.npy"), arange(10, kInt64));
  for (const char* k : {"0", "1"})
    ASSERT_EQ(run_mmt({"pack", path(std::string("part-") + k + ".mmt"), "x=" + path("x.npy"), "y=" + path("y.npy"),
                       "--shard", std::string(k) + "/2", "--quiet"}).exit_code, 0);
  const RunResult merged = run_mmt({"pack", path("all.mmt"), path("part-0.mmt"), path("part-1.mmt"), "--codec", "zstd"});
  ASSERT_EQ(merged.exit_code, 0) << merged.err;
  EXPECT_NE(merged.out.find("packed 10 records (2 fields)"), std::string::npos) << merged.out;
  const Dataset ds = Dataset::open(path("all.mmt"));
  EXPECT_EQ(ds.info().codec.codec, Codec::Zstd);
  EXPECT_TRUE(ds.column("x").equal(arange(40, kFloat32).view({10, 4})));
  EXPECT_EQ(run_mmt({"verify", path("all.mmt"), "--against", "x=" + path("x.npy"), "y=" + path("y.npy")}).exit_code, 0);
  EXPECT_EQ(merged.err.find("warning"), std::string::npos) << merged.err;
  // Some shards of a pack merge, with a warning: the output cannot say that others exist
  // (one shard repacked alone is still that shard, and says so).
  for (const char* k : {"0", "1", "2"})
    ASSERT_EQ(run_mmt({"pack", path(std::string("third-") + k + ".mmt"), "x=" + path("x.npy"), "--shard",
                       std::string(k) + "/3", "--quiet"}).exit_code, 0);
  const RunResult some_shards = run_mmt({"pack", path("some.mmt"), path("third-0.mmt"), path("third-2.mmt")});
  ASSERT_EQ(some_shards.exit_code, 0) << some_shards.err;
  EXPECT_NE(some_shards.err.find("mmt pack: warning: the inputs are 2 of the 3 shards of one pack; shard 1 missing. "
                                 "The output is a dataset of its own"), std::string::npos) << some_shards.err;
  const RunResult one_shard = run_mmt({"pack", path("one.mmt"), path("third-1.mmt")});
  EXPECT_EQ(one_shard.err.find("warning"), std::string::npos) << one_shard.err;

  const RunResult some = run_mmt({"pack", path("y.mmt"), path("part-0.mmt"), path("part-1.mmt"), "--field", "y"});
  ASSERT_EQ(some.exit_code, 0) << some.err;
  EXPECT_EQ(Dataset::open(path("y.mmt")).schema().size(), 1u);
  const RunResult against = run_mmt({"verify", path("y.mmt"), "--against", path("part-0.mmt"), path("part-1.mmt")});
  EXPECT_EQ(against.exit_code, 0) << against.err;
  EXPECT_NE(against.out.find("equal their sources byte for byte (field y)"), std::string::npos) << against.out;
  // The other way: datasets that hold some of the dataset's fields are compared on those.
  const RunResult fewer = run_mmt({"verify", path("all.mmt"), "--against", path("y.mmt")});
  EXPECT_EQ(fewer.exit_code, 0) << fewer.err;
  EXPECT_NE(fewer.out.find("(field y; not compared, as the sources do not give them: x)"), std::string::npos) << fewer.out;
  // Fields left out by --field are said to be so, not missing from the sources.
  const RunResult chosen = run_mmt({"verify", path("all.mmt"), "--against", path("all.mmt"), "--field", "y"});
  EXPECT_EQ(chosen.exit_code, 0) << chosen.err;
  EXPECT_NE(chosen.out.find("(field y; not compared, as --field did not choose them: x)"), std::string::npos)
      << chosen.out;
  // A missing input among datasets is named as missing.
  EXPECT_FAILS_WITH(run_mmt({"pack", path("z.mmt"), path("part-0.mmt"), path("nowhere.mmt")}), "nowhere.mmt");
  EXPECT_FAILS_WITH(run_mmt({"pack", path("z.mmt"), path("part-0.mmt"), path("nowhere.mmt"), "--field", "y"}),
                    "nowhere.mmt");

  EXPECT_FAILS_WITH(run_mmt({"pack", path("z.mmt"), path("part-0.mmt"), "--field", "nope"}), "unknown field 'nope'");
  const RunResult arrays = run_mmt({"pack", path("z.mmt"), "x=" + path("x.npy"), "--field", "x"});
  EXPECT_EQ(arrays.exit_code, 2) << arrays.err;
  EXPECT_NE(arrays.err.find("--field chooses fields of dataset inputs"), std::string::npos) << arrays.err;
  EXPECT_FAILS_WITH(run_mmt({"pack", path("z.mmt"), path("part-1.mmt"), path("part-0.mmt")}), "shards out of order");
  EXPECT_FALSE(fs::exists(path("z.mmt")));
}

// Hidden files and folders under --folder were skipped without a word; --help says so now, and
// the summary counts them.
TEST_F(MmtCli, PackSaysHowManyHiddenEntriesItSkipped) {
  EXPECT_NE(run_mmt({"pack", "--help"}).out.find("Hidden files and folders (names starting with '.', such as"),
            std::string::npos);
  fs::create_directories(path("imgs/cat/.ipynb_checkpoints"));
  testutil::write_file(path("imgs/cat/a.jpg"), testutil::to_bytes("meow"));
  testutil::write_file(path("imgs/cat/.DS_Store"), testutil::to_bytes("x"));
  testutil::write_file(path("imgs/cat/.ipynb_checkpoints/a.jpg"), testutil::to_bytes("stale"));
  const RunResult r = run_mmt({"pack", path("f.mmt"), "--folder", path("imgs")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("  skipped 2 hidden files or folders (names starting with '.') under " + path("imgs")),
            std::string::npos) << r.out;
  fs::remove_all(path("imgs/cat/.ipynb_checkpoints"));
  fs::remove(path("imgs/cat/.DS_Store"));
  const RunResult clean = run_mmt({"pack", path("g.mmt"), "--folder", path("imgs")});
  EXPECT_EQ(clean.out.find("hidden"), std::string::npos) << clean.out;
}

TEST_F(MmtCli, VerifyFindsACorruptChunk) {
  save("a.npy", records(kInt64, 2000, {16}));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "a=" + path("a.npy"), "--chunk-bytes", "64K"}).exit_code, 0);
  EXPECT_EQ(run_mmt({"verify", path("a.mmt")}).exit_code, 0);
  Dataset ds = Dataset::open(path("a.mmt"));
  ChunkInfo chunk = ds.chunk(2);
  ds = Dataset();
  Bytes bytes = testutil::read_file(path("a.mmt"));
  bytes[static_cast<size_t>(chunk.file_offset + chunk.stored_bytes / 2)] ^= std::byte{0x10};
  testutil::write_file(path("a.mmt"), bytes);
  RunResult bad = run_mmt({"verify", path("a.mmt")});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("chunk 2"), std::string::npos) << bad.err;
}

// get reads one record: its chunk is hashed, uncompressed too, so a damaged value is an error
// naming the chunk, never printed or written as if it were sound (exit 0).
TEST_F(MmtCli, GetFindsACorruptUncompressedChunk) {
  save("a.npy", records(kInt64, 2000, {16}));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "a=" + path("a.npy"), "--chunk-bytes", "64K"}).exit_code, 0);
  Dataset ds = Dataset::open(path("a.mmt"));
  const ChunkInfo chunk = ds.chunk(2);
  ds = Dataset();
  Bytes bytes = testutil::read_file(path("a.mmt"));
  bytes[static_cast<size_t>(chunk.file_offset + chunk.stored_bytes / 2)] ^= std::byte{0x10};
  testutil::write_file(path("a.mmt"), bytes);
  const std::string index = std::to_string(chunk.first_record + 1);
  for (const std::vector<std::string>& extra : {std::vector<std::string>{}, {"--npy", path("r.npy")}}) {
    std::vector<std::string> args{"get", path("a.mmt"), index};
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult bad = run_mmt(args);
    EXPECT_FAILS_WITH(bad, "chunk 2");
    EXPECT_NE(bad.err.find("checksum mismatch"), std::string::npos) << bad.err;
  }
  EXPECT_FALSE(fs::exists(path("r.npy")));
  EXPECT_EQ(run_mmt({"get", path("a.mmt"), "0"}).exit_code, 0);  // records of sound chunks still read
}

TEST_F(MmtCli, ExportFindsACorruptUncompressedChunkAndWritesNothingForIt) {
  // Uncompressed, so the reader does not hash chunks unless asked; two fields, so the export
  // has written one when it finds the fault in the other.
  save("a.npy", records(kInt64, 2000, {16}));
  save("b.npy", records(kInt32, 2000, {}));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "a=" + path("a.npy"), "b=" + path("b.npy"), "--chunk-bytes", "64K"}).exit_code, 0);
  ASSERT_TRUE(Dataset::open(path("a.mmt")).column_is_view("a")) << "the layout whose column() checks no chunk";
  ChunkInfo chunk = Dataset::open(path("a.mmt")).chunk(2);
  Bytes bytes = testutil::read_file(path("a.mmt"));
  bytes[static_cast<size_t>(chunk.file_offset + chunk.stored_bytes / 2)] ^= std::byte{0x10};
  testutil::write_file(path("a.mmt"), bytes);

  RunResult bad = run_mmt({"export", path("a.mmt"), path("out")});
  EXPECT_FAILS_WITH(bad, "chunk 2");
  EXPECT_NE(bad.err.find("checksum mismatch"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(path("out"))) << "no folder, no .npy and no temporary";
  // --field b alone fails too: the fault is in a chunk b's values share.
  EXPECT_FAILS_WITH(run_mmt({"export", path("a.mmt"), path("out"), "--field", "b"}), "chunk 2");
  EXPECT_FALSE(fs::exists(path("out")));
}

// Names up to the file system's 255-byte limit are written: the temporaries beside them take a
// shortened name (a 235-byte field name used to fail the export, and a long output name the pack
// after its inputs were loaded).
TEST_F(MmtCli, NamesUpToTheFileSystemLimitAreWritten) {
  const std::string field(251, 'f');  // field + ".npy": 255 bytes
  const std::string output(255, 'o');
  save("a.npy", records(kInt32, 10, {}));
  RunResult packed = run_mmt({"pack", path(output), field + "=" + path("a.npy"), "--codec", "lz4"});
  ASSERT_EQ(packed.exit_code, 0) << packed.err;
  RunResult exported = run_mmt({"export", path(output), path("out")});
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_TRUE(load_npy(path("out/" + field + ".npy")).equal(records(kInt32, 10, {})));
  EXPECT_EQ(std::distance(fs::directory_iterator(path("out")), fs::directory_iterator()), 1) << "no temporary is left";
}

// A failure met only while writing (here a bool byte other than 0 or 1 in the second field,
// behind a valid checksum, found as that field is written) takes back what the export wrote
// before it: the first field's .npy and the folders it made.
TEST_F(MmtCli, ExportThatFailsPartWayLeavesNothingBehind) {
  {
    WriterOptions options;
    options.chunk_records = 4;
    DatasetWriter writer = DatasetWriter::create(
        path("a.mmt"), Schema({Field::fixed("a", kInt64, {2}), Field::fixed("mask", kBool, {3})}), options);
    writer.append_batch(std::vector<Tensor>{records(kInt64, 10, {2}), zeros({10, 3}, kBool)});
    writer.finish();
  }
  const int64_t offset = Dataset::open(path("a.mmt")).get(5)["mask"].storage_offset();  // bytes: bool
  testutil::Bytes bytes = testutil::read_file(path("a.mmt"));
  bytes[static_cast<size_t>(offset)] = std::byte{2};
  testing::reseal_payload(bytes, 1);
  testutil::write_file(path("a.mmt"), bytes);
  fs::create_directory(path("kept"));
  RunResult bad = run_mmt({"export", path("a.mmt"), path("kept/new/out")});
  EXPECT_FAILS_WITH(bad, "field 'mask': record 5 holds the bool byte 2");
  EXPECT_EQ(bad.out, "") << "nothing is reported written";
  EXPECT_FALSE(fs::exists(path("kept/new"))) << bad.err;
  EXPECT_TRUE(fs::exists(path("kept"))) << "a folder that was there stays";

  // With --force over an earlier export, the files it would replace keep their old content.
  fs::create_directory(path("earlier"));
  save("earlier/a.npy", records(kInt64, 3, {2}));
  RunResult forced = run_mmt({"export", path("a.mmt"), path("earlier"), "--force"});
  EXPECT_NE(forced.exit_code, 0);
  EXPECT_TRUE(load_npy(path("earlier/a.npy")).equal(records(kInt64, 3, {2}))) << forced.err;
  EXPECT_EQ(std::distance(fs::directory_iterator(path("earlier")), fs::directory_iterator()), 1)
      << "no temporary is left";
}

// A bool byte other than 0 or 1 that a buggy writer left behind a valid checksum: verify names
// its chunk, and export refuses to write an .npy that pack would refuse, leaving nothing.
TEST_F(MmtCli, VerifyAndExportReportABoolByteOtherThanZeroAndOne) {
  {
    WriterOptions options;
    options.chunk_records = 4;
    DatasetWriter writer = DatasetWriter::create(path("b.mmt"), Schema({Field::fixed("mask", kBool, {3})}), options);
    writer.append_batch(std::vector<Tensor>{zeros({10, 3}, kBool)});
    writer.finish();
  }
  int64_t offset = 0;
  {
    Dataset ds = Dataset::open(path("b.mmt"));
    ASSERT_GT(ds.num_chunks(), 1);
    offset = ds.chunk(1).file_offset + 1;  // chunk 1, its first record's second value
  }
  testutil::Bytes bytes = testutil::read_file(path("b.mmt"));
  bytes[static_cast<size_t>(offset)] = std::byte{3};
  testing::reseal_payload(bytes, 1);
  testutil::write_file(path("b.mmt"), bytes);
  EXPECT_FAILS_WITH(run_mmt({"verify", path("b.mmt")}), "chunk 1, field 'mask': a bool value byte at decoded byte 1");
  EXPECT_FAILS_WITH(run_mmt({"export", path("b.mmt"), path("out")}), "field 'mask': record 4 holds the bool byte 3");
  EXPECT_FALSE(fs::exists(path("out")));
}

// .npy has no bfloat16: a plain export skips such a field with a note, as it skips ragged
// ones (the whole export used to fail), and naming it with --field is refused with the reason.
TEST_F(MmtCli, ExportSkipsABfloat16FieldAndRefusesItByName) {
  {
    DatasetWriter writer = DatasetWriter::create(
        path("bf.mmt"), Schema({Field::fixed("w", kBFloat16, {2}), Field::fixed("label", kInt64, {})}));
    writer.append_batch({zeros({3, 2}, kBFloat16), arange(3, kInt64)});
    writer.finish();
  }
  RunResult exported = run_mmt({"export", path("bf.mmt"), path("out")});
  EXPECT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_NE(exported.err.find("skipping field 'w': bfloat16 has no numpy dtype"), std::string::npos) << exported.err;
  EXPECT_TRUE(load_npy(path("out/label.npy")).equal(arange(3, kInt64)));
  EXPECT_FALSE(fs::exists(path("out/w.npy")));
  EXPECT_FAILS_WITH(run_mmt({"export", path("bf.mmt"), path("out2"), "--field", "w"}), "bfloat16 has no numpy dtype");
  EXPECT_FALSE(fs::exists(path("out2")));
}

TEST_F(MmtCli, GetPrintsLikePyTorch) {
  save("a.npy", arange(6, kInt64).view({3, 2}));
  save("b.npy", records(kFloat32, 3, {}));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "a=" + path("a.npy"), "b=" + path("b.npy")}).exit_code, 0);
  RunResult r = run_mmt({"get", path("a.mmt"), "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "{'a': tensor([2, 3]),\n 'b': tensor(1.)}\n");
  EXPECT_FAILS_WITH(run_mmt({"get", path("a.mmt"), "3"}), "3");
  EXPECT_FAILS_WITH(run_mmt({"get", path("a.mmt"), "0", "--field", "nope"}), "nope");
  EXPECT_FAILS_WITH(run_mmt({"get", path("a.mmt"), "0", "--npy", path("x.npy")}), "--field");
}

// An output under a missing folder is named with its folder (the error named the writer's
// temporary file, a name the user never typed); a path ending in '/' is refused as a folder's.
TEST_F(MmtCli, AnOutputWhoseFolderIsMissingIsNamedWithItsFolder) {
  save("x.npy", arange(4, kInt64));
  ASSERT_EQ(run_mmt({"pack", path("d.mmt"), "x=" + path("x.npy")}).exit_code, 0);
  EXPECT_FAILS_WITH(run_mmt({"pack", path("nodir/o.mmt"), "x=" + path("x.npy")}),
                    "cannot create " + path("nodir/o.mmt") + ": its folder " + path("nodir") + " does not exist");
  EXPECT_FAILS_WITH(run_mmt({"get", path("d.mmt"), "0", "--field", "x", "--npy", path("x.npy/y.npy")}),
                    "its folder " + path("x.npy") + " is not a folder");
  EXPECT_FAILS_WITH(run_mmt({"pack", path("new.mmt/"), "x=" + path("x.npy")}), "ends in '/', as a folder's does");
  EXPECT_FALSE(fs::exists(path("nodir")));
  EXPECT_FALSE(fs::exists(path("new.mmt")));
}

// get --npy/--raw and export write files on request; never over the dataset they read, even
// with --force (a dataset named x.npy exports its field x to x.npy).
TEST_F(MmtCli, NoOutputReplacesTheDatasetBeingRead) {
  save("x.npy", arange(10, kInt64));
  ASSERT_EQ(run_mmt({"pack", path("d.mmt"), "x=" + path("x.npy")}).exit_code, 0);
  const Bytes before = testutil::read_file(path("d.mmt"));
  fs::create_symlink(path("d.mmt"), path("link.mmt"));
  for (const char* flag : {"--npy", "--raw"})
    for (const std::string& output : {path("d.mmt"), path("link.mmt")})
      EXPECT_FAILS_WITH(run_mmt({"get", path("d.mmt"), "0", "--field", "x", flag, output, "--force"}),
                        "is the dataset being read");
  fs::create_directory(path("out"));
  fs::copy_file(path("d.mmt"), path("out/x.npy"));
  EXPECT_FAILS_WITH(run_mmt({"export", path("out/x.npy"), path("out"), "--force"}), "is the dataset being read");
  EXPECT_EQ(testutil::read_file(path("d.mmt")), before);
  EXPECT_EQ(testutil::read_file(path("out/x.npy")), before);
}

// Integer options are parsed as INDEX is: CLI11's own conversion took '' as 0 (verify
// --samples '' compared every record) and clamped values out of range.
TEST_F(MmtCli, IntegerOptionsAreParsedStrictly) {
  save("a.npy", arange(3, kInt64));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "a=" + path("a.npy")}).exit_code, 0);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"pack", path("b.mmt"), "a=" + path("a.npy"), "--threads", ""}, "--threads '' is not an integer"},
      {{"pack", path("b.mmt"), "a=" + path("a.npy"), "--threads", "5000000000"}, "--threads '5000000000' is out of range"},
      {{"verify", path("a.mmt"), "--samples", ""}, "--samples '' is not an integer"},
      {{"verify", path("a.mmt"), "--samples", "99999999999999999999"}, "--samples '99999999999999999999' is out of range"},
      {{"verify", path("a.mmt"), "--seed", "-5"}, "--seed '-5' is not a non-negative integer"},
      {{"verify", path("a.mmt"), "--seed", "18446744073709551616"}, "is out of range: it must be within [0, 18446744073709551615]"},
      {{"bench", path("a.mmt"), "--batch", "1x"}, "--batch '1x' is not an integer"},
  };
  for (const auto& [args, message] : cases) {
    RunResult r = run_mmt(args);
    EXPECT_EQ(r.exit_code, 2) << message;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
  EXPECT_FALSE(fs::exists(path("b.mmt")));
  EXPECT_EQ(run_mmt({"verify", path("a.mmt"), "--against", "a=" + path("a.npy"), "--samples", "+2", "--seed",
                     "18446744073709551615"}).exit_code, 0);
}

// A bad option value read "--threads 'abc' is not an integer (write 17 or -1 ...)" with no
// "mmt pack: error:" and status 2, while --threads 1025 had the prefix and status 1; the hint
// offered -1, which --threads refuses; a value past int64 gave int64's range, not [0, 1024];
// `bench --seconds abc` said "Could not convert: --seconds = abc". One form and one status now.
TEST_F(MmtCli, EveryBadOptionValueIsAUsageErrorInOneForm) {
  save("a.npy", arange(3, kInt64));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "a=" + path("a.npy")}).exit_code, 0);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"pack", path("b.mmt"), "a=" + path("a.npy"), "--threads", "abc"},
       "mmt pack: error: --threads 'abc' is not an integer (write 17: digits only)\n"},
      {{"pack", path("b.mmt"), "a=" + path("a.npy"), "--threads", "99999999999999999999"},
       "mmt pack: error: --threads '99999999999999999999' is out of range: it must be within [0, 1024]\n"},
      {{"pack", path("b.mmt"), "a=" + path("a.npy"), "--threads", "1025"},
       "mmt pack: error: --threads '1025' is out of range: it must be within [0, 1024]\n"},
      {{"pack", path("b.mmt"), "a=" + path("a.npy"), "--codec", "brotli"}, "mmt pack: error: --codec: unknown codec 'brotli'"},
      {{"pack", path("b.mmt"), "a=" + path("a.npy"), "--chunk-bytes", "0"}, "mmt pack: error: --chunk-bytes must be > 0"},
      {{"pack", path("b.mmt"), "a=" + path("a.npy"), "--nope"}, "mmt pack: error: The following argument was not expected: --nope"},
      {{"verify", path("a.mmt"), "--samples", "-3"},
       "mmt verify: error: --samples '-3' is out of range: it must be within [0, 9223372036854775807]\n"},
      {{"bench", path("a.mmt"), "--seconds", "abc"}, "mmt bench: error: --seconds 'abc' is not a number (write 0.5 or 2)\n"},
      {{"bench", path("a.mmt"), "--threads", "x"}, "mmt bench: error: --threads 'x' is not an integer (write 17: digits only)"},
      {{"get", path("a.mmt"), "x"}, "mmt get: error: INDEX 'x' is not an integer (write 17 or -1: an optional sign"},
  };
  for (const auto& [args, message] : cases) {
    RunResult r = run_mmt(args);
    EXPECT_EQ(r.exit_code, 2) << message;
    EXPECT_EQ(r.err.rfind(message, 0), 0u) << "expected it first: " << message << "\n" << r.err;
  }
  EXPECT_FALSE(fs::exists(path("b.mmt")));
}

// "--chunk-bytes 1.5M" and "--align 0x40" said "unknown size suffix": the suffix was fine.
TEST_F(MmtCli, ASizeThatIsNotANumberNamesTheNumber) {
  save("a.npy", arange(3, kInt64));
  const auto pack = [&](const char* option, const char* value) {
    return run_mmt({"pack", path("b.mmt"), "a=" + path("a.npy"), option, value});
  };
  EXPECT_FAILS_WITH(pack("--chunk-bytes", "1.5M"), "--chunk-bytes: '1.5M': the number '1.5' is not a whole decimal number");
  EXPECT_FAILS_WITH(pack("--chunk-bytes", "0x10"), "--chunk-bytes: '0x10': the number '0x10' is not a whole decimal number");
  EXPECT_FAILS_WITH(pack("--align", "0x40"), "--align: '0x40': the number '0x40' is not a whole decimal number");
  EXPECT_FAILS_WITH(pack("--chunk-bytes", "64X"), "--chunk-bytes: unknown size suffix 'X' in '64X' (use K, M or G)");
  EXPECT_FAILS_WITH(pack("--chunk-bytes", "lots"), "--chunk-bytes: 'lots' is not a size");
  EXPECT_FALSE(fs::exists(path("b.mmt")));
  EXPECT_EQ(pack("--chunk-bytes", "64kib").exit_code, 0);
}

TEST_F(MmtCli, GetParsesTheIndexStrictly) {
  save("a.npy", arange(3, kInt64));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "a=" + path("a.npy")}).exit_code, 0);
  // An empty index was record 0, and one past int64 was clamped to INT64_MAX.
  for (const char* bad : {"", " 1", "1 ", "1x", "0x1", "1.0", "+-1", "--1", "-"}) {
    RunResult r = run_mmt({"get", path("a.mmt"), "--", bad});
    EXPECT_FAILS_WITH(r, std::string("INDEX '") + bad + "' is not an integer");
  }
  for (const char* huge : {"99999999999999999999", "-9223372036854775809"}) {
    RunResult r = run_mmt({"get", path("a.mmt"), "--", huge});
    EXPECT_FAILS_WITH(r, std::string("INDEX '") + huge + "' is out of range");
  }
  EXPECT_FAILS_WITH(run_mmt({"get", path("a.mmt"), "9223372036854775807"}), "out of range for a dataset of 3");
  // A sign is allowed, and a negative index still counts from the end.
  EXPECT_EQ(run_mmt({"get", path("a.mmt"), "+1"}).out, "{'a': tensor(1)}\n");
  EXPECT_EQ(run_mmt({"get", path("a.mmt"), "-1"}).out, "{'a': tensor(2)}\n");
  EXPECT_EQ(run_mmt({"get", path("a.mmt"), "-03"}).out, "{'a': tensor(0)}\n");
}

TEST_F(MmtCli, GetWritesANewFileOrReplacesARegularOneWithForce) {
  save("a.npy", records(kUInt8, 3, {1000}));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "x=" + path("a.npy")}).exit_code, 0);
  const Tensor second = records(kUInt8, 3, {1000})[1];
  for (const char* option : {"--raw", "--npy"}) {
    SCOPED_TRACE(option);
    testutil::write_file(path("out"), testutil::to_bytes("precious"));
    EXPECT_FAILS_WITH(run_mmt({"get", path("a.mmt"), "1", option, path("out")}), "already exists; pass --force");
    EXPECT_EQ(slurp(path("out")), "precious");
    RunResult forced = run_mmt({"get", path("a.mmt"), "1", option, path("out"), "--force"});
    ASSERT_EQ(forced.exit_code, 0) << forced.err;
    if (std::string(option) == "--npy") EXPECT_TRUE(load_npy(path("out")).equal(second));
    else EXPECT_EQ(fs::file_size(path("out")), 1000u);
  }

  // Something that is not a regular file is never replaced, even with --force: a symlink
  // (its target is not written either) and a FIFO standing in for a device like /dev/full.
  testutil::write_file(path("target"), testutil::to_bytes("target"));
  fs::create_symlink(path("target"), path("link"));
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0644), 0);
  for (const char* option : {"--raw", "--npy"}) {
    EXPECT_FAILS_WITH(run_mmt({"get", path("a.mmt"), "1", option, path("link"), "--force"}), "a symbolic link");
    EXPECT_FAILS_WITH(run_mmt({"get", path("a.mmt"), "1", option, path("fifo"), "--force"}), "a pipe");
  }
  EXPECT_TRUE(fs::is_symlink(path("link")));
  EXPECT_EQ(slurp(path("target")), "target");
  EXPECT_TRUE(fs::is_fifo(path("fifo")));

  // A full disk leaves no file (not even an empty one), and an old file as it was; the
  // message names the reason.
  std::set<std::string> before = listing();
  RunResult full = run_mmt({"get", path("a.mmt"), "1", "--raw", path("new.raw")}, {.file_size_limit_bytes = 512});
  EXPECT_FAILS_WITH(full, "File too large");
  RunResult full_forced = run_mmt({"get", path("a.mmt"), "1", "--raw", path("out"), "--force"},
                                  {.file_size_limit_bytes = 512});
  EXPECT_FAILS_WITH(full_forced, "File too large");
  EXPECT_EQ(listing(), before) << "no output and no temporary left";
  EXPECT_TRUE(load_npy(path("out")).equal(second)) << "the old file is kept";
}

// "-" is standard output for get --npy and --raw, so values can be piped; it wrote a file
// named "-" (--npy) or was refused (--raw /dev/stdout: "a symbolic link"). Nothing but the
// field goes to standard output then.
TEST_F(MmtCli, GetWritesToStandardOutputForADash) {
  save("a.npy", records(kInt32, 3, {4}));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "x=" + path("a.npy")}).exit_code, 0);
  const Tensor second = records(kInt32, 3, {4})[1];
  const bool dash_existed = fs::exists("-");
  RunResult raw = run_mmt({"get", path("a.mmt"), "1", "--raw", "-"});
  ASSERT_EQ(raw.exit_code, 0) << raw.err;
  EXPECT_EQ(raw.out, std::string(static_cast<const char*>(second.data_ptr()), 16));
  EXPECT_EQ(raw.err, "");
  RunResult npy = run_mmt({"get", path("a.mmt"), "1", "--npy", "-"});
  ASSERT_EQ(npy.exit_code, 0) << npy.err;
  EXPECT_TRUE(parse_npy(testutil::to_bytes(npy.out), "stdout").equal(second));
  if (!dash_existed) {
    EXPECT_FALSE(fs::exists("-")) << "a file named - was written";
  }
  // One to standard output, the other to a file; a file named "-" through a path.
  RunResult both = run_mmt({"get", path("a.mmt"), "1", "--npy", "-", "--raw", path("-")});
  ASSERT_EQ(both.exit_code, 0) << both.err;
  EXPECT_TRUE(parse_npy(testutil::to_bytes(both.out), "stdout").equal(second));
  EXPECT_EQ(fs::file_size(path("-")), 16u);
  // Both to standard output would be one stream of two things.
  RunResult mixed = run_mmt({"get", path("a.mmt"), "1", "--npy", "-", "--raw", "-"});
  EXPECT_EQ(mixed.exit_code, 2);
  EXPECT_EQ(mixed.err, "mmt get: error: --npy - and --raw - would mix both into one stream; send one of them to a file\n");
  EXPECT_EQ(mixed.out, "");
  EXPECT_NE(run_mmt({"get", "--help"}).out.find("-: to standard output"), std::string::npos);
}

// A write to standard output that fails says why and exits 1: a full device, or a reader that
// stopped reading (EPIPE: mmt ignores SIGPIPE, which killed it without a word).
TEST_F(MmtCli, GetToStandardOutputReportsAFailedWrite) {
  save("a.npy", records(kUInt8, 2, {1 << 20}));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "x=" + path("a.npy")}).exit_code, 0);
  if (fs::exists("/dev/full")) {
    RunResult full = run_mmt({"get", path("a.mmt"), "0", "--raw", "-"}, {.stdout_path = "/dev/full"});
    EXPECT_EQ(full.exit_code, 1);
    EXPECT_EQ(full.err, "mmt get: error: cannot write to standard output: No space left on device (0 of 1048576 bytes "
                        "written)\n");
  }
  // The reader takes the first bytes, then goes away.
  RunResult closed = run_mmt({"get", path("a.mmt"), "0", "--npy", "-"},
                             {.with_stdout_pipe = [](int& fd, pid_t) {
                               char first[16];
                               EXPECT_EQ(::read(fd, first, sizeof first), 16);
                               ::close(fd);
                               fd = -1;
                             }});
  EXPECT_EQ(closed.exit_code, 1) << "128 + 13 is death by SIGPIPE";
  EXPECT_NE(closed.err.find("mmt get: error: cannot write to standard output: Broken pipe ("), std::string::npos)
      << closed.err;
  EXPECT_NE(closed.err.find(" of 1048704 bytes written; the program reading it stopped before the end)\n"),
            std::string::npos) << closed.err;
}

// Binary bytes are not written to a terminal unless asked (as gzip and zstd have it).
// pack draws its progress on a terminal (records, speed, time left), and clears it when done;
// into a pipe or a file it writes no bar: not one carriage return or escape.
TEST_F(MmtCli, PackDrawsProgressOnATerminalOnly) {
  save("a.npy", records(kFloat32, 2000, {64}));
  RunResult drawn = run_mmt({"pack", path("t.mmt"), "a=" + path("a.npy")}, {.stderr_is_terminal = true});
  ASSERT_EQ(drawn.exit_code, 0) << drawn.err;
  for (const char* part : {"\rpacking [", "] 100%  2000/2000 records  ", "/s  ETA ", "\x1b[K"})
    EXPECT_NE(drawn.err.find(part), std::string::npos) << part << " in " << ::testing::PrintToString(drawn.err);
  EXPECT_TRUE(drawn.err.ends_with("\r\x1b[K")) << "the bar is cleared: " << ::testing::PrintToString(drawn.err);
  RunResult piped = run_mmt({"pack", path("p.mmt"), "a=" + path("a.npy")});
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_EQ(piped.err.find_first_of("\r\x1b"), std::string::npos) << ::testing::PrintToString(piped.err);
}

TEST_F(MmtCli, GetToStandardOutputRefusesATerminalWithoutForce) {
  save("a.npy", records(kUInt8, 2, {4}));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "x=" + path("a.npy")}).exit_code, 0);
  RunResult refused = run_mmt({"get", path("a.mmt"), "0", "--raw", "-"}, {.stdout_is_terminal = true});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_EQ(refused.err, "mmt get: error: standard output is a terminal, and --raw - writes binary bytes there: redirect "
                         "it (> FILE) or pipe it (| PROGRAM), or pass --force to write them to the terminal anyway\n");
  RunResult forced = run_mmt({"get", path("a.mmt"), "0", "--raw", "-", "--force"}, {.stdout_is_terminal = true});
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
}

// Ctrl-C while the field goes to a reader that is slow to take it: stopped at the next write,
// 128 + the signal, and stderr says the field is not whole on standard output.
TEST_F(MmtCli, GetToStandardOutputStopsOnCtrlC) {
  save("one.npy", full({1, 48 << 20}, 3, kUInt8));
  ASSERT_EQ(run_mmt({"pack", path("one.mmt"), "v=" + path("one.npy"), "--quiet"}).exit_code, 0);
  RunResult stopped = run_mmt({"get", path("one.mmt"), "0", "--raw", "-"},
                              {.with_stdout_pipe = [](int& fd, pid_t pid) {
                                // Once bytes come, the write has begun, and the pipe (64 KiB)
                                // holds it up: the signal lands in it. The read end stays
                                // open until mmt has ended, so the write cannot fail first.
                                char first[4096];
                                EXPECT_GT(::read(fd, first, sizeof first), 0);
                                ::kill(pid, SIGINT);
                              }});
  EXPECT_EQ(stopped.exit_code, 128 + SIGINT) << stopped.err;
  EXPECT_EQ(stopped.err, "mmt get: interrupted: the field was not written whole to standard output\n");
}

TEST_F(MmtCli, ExportNeverReplacesANonRegularFile) {
  save("a.npy", records(kInt32, 4, {2}));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "a=" + path("a.npy")}).exit_code, 0);
  fs::create_directories(path("out"));
  ASSERT_EQ(::mkfifo(path("out/a.npy").c_str(), 0644), 0);
  EXPECT_FAILS_WITH(run_mmt({"export", path("a.mmt"), path("out"), "--force"}), "a pipe");
  EXPECT_TRUE(fs::is_fifo(path("out/a.npy")));
}

TEST_F(MmtCli, BadInputsGiveAClearMessageAndLeaveNothing) {
  save("ten.npy", records(kUInt8, 10, {2}));
  save("nine.npy", records(kUInt8, 9, {2}));
  testutil::write_file(path("complex.npy"), testutil::npy_file("<c32", false, "(2,)", Bytes(64)));
  Bytes corrupt = testutil::npy_file("<f4", false, "(2,)", Bytes(8));
  corrupt[20] = std::byte{'#'};
  testutil::write_file(path("corrupt.npy"), corrupt);
  testutil::write_file(path("wrong-idx1-ubyte"), testutil::to_bytes(std::string_view("\x01\x02\x08\x01\0\0\0\x01x", 9)));
  fs::create_directories(path("classes/a"));
  testutil::write_file(path("classes/a/ok.bin"), testutil::to_bytes("fine"));
  fs::create_symlink(path("classes/a/gone.bin"), path("classes/a/dangling.bin"));
  std::set<std::string> before = listing();
  std::string out = path("out.mmt");

  EXPECT_FAILS_WITH(run_mmt({"pack", out, "x=" + path("missing.npy")}), "missing.npy");
  EXPECT_FAILS_WITH(run_mmt({"pack", out, "x=" + path("ten.npy"), "y=" + path("nine.npy")}),
                    "record counts disagree");
  EXPECT_FAILS_WITH(run_mmt({"pack", out, "x=" + path("complex.npy")}), "unsupported dtype '<c32'");
  EXPECT_FAILS_WITH(run_mmt({"pack", out, "x=" + path("corrupt.npy")}), "corrupt.npy: corrupt .npy header");
  EXPECT_FAILS_WITH(run_mmt({"pack", out, "x=" + path("wrong-idx1-ubyte")}), "is not an IDX magic");
  EXPECT_FAILS_WITH(run_mmt({"pack", out, "--folder", path("classes")}), "dangling.bin");
  EXPECT_FAILS_WITH(run_mmt({"pack", out, path("ten.npy")}), "needs a field name");
  EXPECT_FAILS_WITH(run_mmt({"pack", out, "x=" + path("ten.npy"), "x=" + path("ten.npy")}), "given twice");
  EXPECT_FAILS_WITH(run_mmt({"pack", out, "x=" + path("ten.npy"), "--codec", "brotli"}), "brotli");
  EXPECT_FAILS_WITH(run_mmt({"pack", out}), "no inputs");
  EXPECT_EQ(run_mmt({"pack", out}).exit_code, 2) << "a command-line mistake, as the README says";
  // So are inputs that cannot be taken whatever their files hold (they exited with 1).
  testutil::write_file(path("x.npz"), testutil::zip_archive({{"x.npy", npy_bytes(arange(10))}}));
  fs::copy_file(path("x.npz"), path("zipped.npy"));
  for (const std::vector<std::string>& inputs :
       {std::vector<std::string>{path("ten.npy")}, {"x="}, {"x=" + path("ten.npy"), "x=" + path("nine.npy")}, {""},
        {"d/q=" + path("ten.npy")}, {"x=" + path("x.npz")}}) {
    std::vector<std::string> args{"pack", out};
    args.insert(args.end(), inputs.begin(), inputs.end());
    const RunResult r = run_mmt(args);
    EXPECT_EQ(r.exit_code, 2) << r.err;
  }
  EXPECT_FAILS_WITH(run_mmt({"pack", out, "x=" + path("zipped.npy")}),
                    path("zipped.npy") + " is a ZIP (.npz) archive, which names its own fields");
  // A name an archive brings is its content, not the command line's: status 1.
  const RunResult clash = run_mmt({"pack", out, path("x.npz"), "x=" + path("ten.npy")});
  EXPECT_EQ(clash.exit_code, 1) << clash.err;
  EXPECT_NE(clash.err.find("field 'x' is given twice"), std::string::npos) << clash.err;
  fs::remove(path("x.npz"));
  fs::remove(path("zipped.npy"));
  // Inputs of the wrong kind are named for what they are (a folder was "a directory, not a
  // file"; a FIFO "No such file or directory"; a /proc file, of size 0 to stat, packed no
  // records and succeeded).
  EXPECT_FAILS_WITH(run_mmt({"pack", out, path("classes")}), path("classes") + ": a folder, which is no array input");
  EXPECT_FAILS_WITH(run_mmt({"pack", out, "x=" + path("classes")}), "packs with PackSources::from_folder "
                                                                      "(mmt pack --folder DIR, mmt verify --folder DIR)");
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  EXPECT_FAILS_WITH(run_mmt({"pack", out, "x=" + path("fifo") + ":uint8"}),
                    path("fifo") + ": is not a regular file (a device, FIFO or socket)");
  EXPECT_FAILS_WITH(run_mmt({"pack", out, "x=" + path("fifo")}), path("fifo") + ": is not a regular file");
  fs::remove(path("fifo"));
  EXPECT_FAILS_WITH(run_mmt({"pack", out, "x=/proc/self/status:uint8"}),
                    "/proc/self/status: a file of a kernel filesystem (/proc, /sys), whose size reads as 0 bytes");
  EXPECT_FAILS_WITH(run_mmt({"pack", out, "x=/proc/self/status"}), "whose size reads as 0 bytes whatever it holds");
  EXPECT_FAILS_WITH(run_mmt({"pack", "/proc/out.mmt", "x=" + path("ten.npy")}),
                    "cannot create /proc/out.mmt: the folder /proc takes no new files");
  EXPECT_EQ(listing(), before) << "nothing new in the folder";

  // A file that cannot be read. Root reads anything, so as root mmt runs as nobody, in a
  // test folder opened to it (where it can reach its own binary).
  fs::permissions(path("classes/a/ok.bin"), fs::perms::none);
  fs::remove(path("classes/a/dangling.bin"));
  before = listing();
  RunOptions unprivileged;
  if (::geteuid() == 0) {
    constexpr uid_t kNobody = 65534;
    fs::permissions(dir_.path(), fs::perms::all);
    unprivileged.as_user = kNobody;
    // nobody must reach mmt, the inputs and the folder written to (not so where a folder
    // above them is closed to others, or where root's umask closed what it made).
    const std::string probe = path("probe.mmt");
    const bool reachable = run_mmt({"pack", probe, "x=" + path("ten.npy"), "--quiet"}, unprivileged).exit_code == 0;
    fs::remove(probe);
    if (!reachable) GTEST_SKIP() << "running as root, and mmt cannot run as nobody on this test's folder here";
  }
  EXPECT_FAILS_WITH(run_mmt({"pack", out, "--folder", path("classes")}, unprivileged),
                    path("classes/a/ok.bin") + ": cannot open: Permission denied");
  EXPECT_EQ(listing(), before);
}

TEST_F(MmtCli, PackOptionsAreCheckedUnderTheirFlagNames) {
  save("a.npy", records(kInt32, 4, {2}));
  std::set<std::string> before = listing();
  auto pack = [&](std::vector<std::string> options) {
    std::vector<std::string> args{"pack", path("out.mmt"), "a=" + path("a.npy")};
    args.insert(args.end(), options.begin(), options.end());
    RunResult r = run_mmt(args);
    EXPECT_EQ(r.err.find("WriterOptions"), std::string::npos) << r.err;
    return r;
  };
  EXPECT_FAILS_WITH(pack({"--chunk-bytes", "0"}), "--chunk-bytes must be > 0, got 0");
  for (const char* align : {"0", "32", "100", "32M"})
    EXPECT_FAILS_WITH(pack({"--align", align}), std::string("--align must be a power of two from 64 to 16M (16777216), got ") + align);
  // 100000 threads aborted the process in the engine's thread pool; the cap refuses it first.
  for (const char* threads : {"-1", "1025", "100000"})
    EXPECT_FAILS_WITH(pack({"--threads", threads}),
                      std::string("--threads '") + threads + "' is out of range: it must be within [0, 1024]");
  EXPECT_EQ(listing(), before);
  EXPECT_EQ(pack({"--align", "64", "--threads", "1024", "--chunk-bytes", "1"}).exit_code, 0);
  // verify --samples -3 used to mean "every record", silently.
  EXPECT_FAILS_WITH(run_mmt({"verify", path("out.mmt"), "--against", "a=" + path("a.npy"), "--samples", "-3"}),
                    "--samples '-3' is out of range: it must be within [0, ");
}

TEST_F(MmtCli, AnEmptyOutputPathIsRefusedUpFront) {
  save("a.npy", records(kInt32, 4, {2}));
  // pack loaded the inputs, then printed the writer's "empty path" and " was not created".
  RunResult packed = run_mmt({"pack", "", "a=" + path("a.npy")});
  EXPECT_FAILS_WITH(packed, "OUTPUT is empty: name the dataset file to create");
  EXPECT_EQ(packed.exit_code, 2);
  EXPECT_EQ(packed.err.find("was not created"), std::string::npos) << packed.err;
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "a=" + path("a.npy")}).exit_code, 0);
  EXPECT_FAILS_WITH(run_mmt({"export", path("a.mmt"), ""}), "DIR is empty");
  // An empty --npy or --raw printed the record as if the option had not been given.
  for (const char* option : {"--npy", "--raw"}) {
    RunResult r = run_mmt({"get", path("a.mmt"), "0", option, ""});
    EXPECT_FAILS_WITH(r, std::string(option) + ": the path is empty");
    EXPECT_EQ(r.out, "");
  }
}

TEST_F(MmtCli, ExistingOutputIsKeptWithoutForce) {
  save("a.npy", records(kInt32, 4, {2}));
  testutil::write_file(path("out.mmt"), testutil::to_bytes("precious"));
  RunResult refused = run_mmt({"pack", path("out.mmt"), "a=" + path("a.npy")});
  EXPECT_FAILS_WITH(refused, "already exists; pass --force");
  EXPECT_EQ(slurp(path("out.mmt")), "precious");
  ASSERT_EQ(run_mmt({"pack", path("out.mmt"), "a=" + path("a.npy"), "--force"}).exit_code, 0);
  EXPECT_EQ(Dataset::open(path("out.mmt")).size(), 4);

  // --force replaces a regular file only: `mmt pack /dev/null ... --force` run as root used
  // to put a regular file in the place of the device. A FIFO stands in for the device here.
  testutil::write_file(path("target"), testutil::to_bytes("target"));
  fs::create_symlink(path("target"), path("link.mmt"));
  ASSERT_EQ(::mkfifo(path("fifo.mmt").c_str(), 0644), 0);
  EXPECT_FAILS_WITH(run_mmt({"pack", path("link.mmt"), "a=" + path("a.npy"), "--force"}),
                    "is a symbolic link; only a regular file is replaced");
  EXPECT_FAILS_WITH(run_mmt({"pack", path("fifo.mmt"), "a=" + path("a.npy"), "--force"}), "is a pipe");
  EXPECT_TRUE(fs::is_symlink(path("link.mmt")));
  EXPECT_EQ(slurp(path("target")), "target");
  EXPECT_TRUE(fs::is_fifo(path("fifo.mmt")));
}

TEST_F(MmtCli, FullDiskLeavesTheOldFileOrNothing) {
  save("a.npy", records(kFloat64, 20000, {16}));  // 2.5 MB of values
  std::set<std::string> before = listing();
  RunResult full = run_mmt({"pack", path("out.mmt"), "a=" + path("a.npy")}, {.file_size_limit_bytes = 1 << 20});
  EXPECT_FAILS_WITH(full, "File too large");
  EXPECT_NE(full.err.find("was not created"), std::string::npos) << full.err;
  EXPECT_EQ(listing(), before) << "no output and no temporary left";

  testutil::write_file(path("out.mmt"), testutil::to_bytes("old"));
  before = listing();
  RunResult replaced = run_mmt({"pack", path("out.mmt"), "a=" + path("a.npy"), "--force", "--codec", "lz4"},
                               {.file_size_limit_bytes = 1 << 20});
  EXPECT_NE(replaced.exit_code, 0);
  EXPECT_EQ(listing(), before);
  EXPECT_EQ(slurp(path("out.mmt")), "old");
}

TEST_F(MmtCli, NoSpaceLeftThroughTheIoSeamLeavesNothing) {
  save("a.npy", records(kFloat32, 5000, {64}));
  PackSources sources = PackSources::from_arrays(std::vector<std::string>{"a=" + path("a.npy")});
  std::set<std::string> before = listing();
  for (int64_t nth : {1, 2, 5}) {
    io::ScopedFault fault({.step = io::Step::Write, .nth = nth, .forever = true, .errno_value = ENOSPC});
    PackOptions options;
    options.writer.chunk_bytes = 64 << 10;
    try {
      pack_dataset(path("out.mmt"), sources, options);
      ADD_FAILURE() << "expected an IoError";
    } catch (const IoError& e) {
      EXPECT_EQ(e.errno_value(), ENOSPC);
      EXPECT_NE(std::string(e.what()).find("No space left"), std::string::npos) << e.what();
    }
    EXPECT_EQ(listing(), before) << "write " << nth;
  }
}

TEST_F(MmtCli, CtrlCAndOtherStopSignalsAbortAndLeaveNothing) {
  // Slow enough to be interrupted: strong zstd on one thread over 32 MB of varied values.
  Tensor values = empty({4096, 2048}, kFloat32);
  values.copy_(arange(4096 * 2048, kFloat64).view({4096, 2048}));
  save("big.npy", values);
  std::set<std::string> before = listing();
  // HUP is an ssh disconnect; each exits with 128 + its number, as shells report it.
  for (int signal_number : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    SCOPED_TRACE(::strsignal(signal_number));
    RunResult r = run_mmt({"pack", path("out.mmt"), "x=" + path("big.npy"), "--codec", "zstd:19", "--threads", "1"},
                          {.interrupt_once_exists = path("out.mmt.tmp-"), .interrupt_signal = signal_number});
    EXPECT_EQ(r.exit_code, 128 + signal_number) << r.err;
    EXPECT_NE(r.err.find("interrupted"), std::string::npos) << r.err;
    // It said "out.mmt was left as it was" of a file that never existed.
    EXPECT_NE(r.err.find("; " + path("out.mmt") + " was not created"), std::string::npos) << r.err;
    EXPECT_EQ(listing(), before) << "no output and no temporary left";
  }
}

// A signal while the writer compressed its last chunk (one of 24 MB here, at zstd:19: some
// twenty seconds) was noticed only after finish() had published the dataset: mmt exited 0
// with the file in place. The writer now asks while it waits, and before the rename. The
// signal comes 1.5 s after the temporary appears: the record is appended by then (a copy of
// 24 MiB), and finish() is compressing.
TEST_F(MmtCli, AStopSignalWhileTheLastChunkIsCompressedLeavesNothing) {
  // One record of 24 MiB of random 4-bit values: slow for zstd:19.
  Tensor values = empty({1, 24 << 20}, kUInt8);
  auto* bytes = static_cast<uint8_t*>(values.mutable_data_ptr());
  uint64_t state = 1;
  for (int64_t i = 0; i < values.numel(); ++i) bytes[i] = static_cast<uint8_t>((state = state * 6364136223846793005u + 1) >> 60);
  save("one_chunk.npy", values);
  std::set<std::string> before = listing();
  RunResult r = run_mmt({"pack", path("out.mmt"), "x=" + path("one_chunk.npy"), "--codec", "zstd:19", "--chunk-bytes",
                         "32M", "--threads", "1"},
                        {.interrupt_once_exists = path("out.mmt.tmp-"),
                         .interrupt_signal = SIGTERM,
                         .interrupt_delay = std::chrono::milliseconds(1500)});
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_NE(r.err.find("interrupted after 1 of 1 records; " + path("out.mmt") + " was not created"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(listing(), before) << "no output and no temporary left";
}

// A signal while pack read its inputs (minutes, for a large compressed one) ended it
// without a word: its handlers were installed only for the write. Now it ends at once, as
// before, saying so. The input: an IDX file of 1 GiB of zeros in gzip members of 64 MiB.
TEST_F(MmtCli, AStopSignalWhileInputsAreReadEndsPackAtOnceSayingSo) {
  const uint8_t header[] = {0, 0, 0x08, 3, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0};  // uint8 [1024, 1024, 1024]
  Bytes compressed = testutil::gzip_bytes(Bytes(reinterpret_cast<const std::byte*>(header),
                                                reinterpret_cast<const std::byte*>(header) + sizeof header));
  const Bytes zeros_member = testutil::gzip_bytes(Bytes(64 << 20));
  for (int member = 0; member < 16; ++member) compressed.insert(compressed.end(), zeros_member.begin(), zeros_member.end());
  testutil::write_file(path("big-idx3-ubyte.gz"), compressed);
  const std::set<std::string> before = listing();
  RunResult r = run_mmt({"pack", path("out.mmt"), "x=" + path("big-idx3-ubyte.gz")},
                        {.interrupt_once_mapped = path("big-idx3-ubyte.gz")});
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  EXPECT_EQ(r.err, "mmt pack: interrupted while reading its inputs: " + path("out.mmt") + " was not written\n");
  EXPECT_EQ(listing(), before);
}

// export and get --npy/--raw died of the signal, leaving their temporary (up to the whole
// file) and the folder export had made. They stop as pack does now: at the next step of the
// write, with everything they made removed, the reason on stderr and 128 + the signal.
TEST_F(MmtCli, ExportAndGetStopCleanlyOnCtrlCAndOtherStopSignals) {
  // Two fields of 32 MB (export writes the first while the second is still to come), and a
  // record of 48 MB for get.
  save("x.npy", full({2, 16 << 20}, 1, kUInt8));
  save("y.npy", full({2, 16 << 20}, 2, kUInt8));
  ASSERT_EQ(run_mmt({"pack", path("xy.mmt"), "x=" + path("x.npy"), "y=" + path("y.npy"), "--quiet"}).exit_code, 0);
  save("one.npy", full({1, 48 << 20}, 3, kUInt8));
  ASSERT_EQ(run_mmt({"pack", path("one.mmt"), "v=" + path("one.npy"), "--quiet"}).exit_code, 0);
  std::set<std::string> before = listing();
  // The signal goes once the temporary appears; on a loaded machine the command may still end
  // first (status 0). Its output is then undone and it runs again: the test is of a stop mid-write.
  const auto interrupted = [&](const std::vector<std::string>& args, const RunOptions& options,
                               const std::function<void()>& undo) {
    RunResult r;
    for (int attempt = 0; attempt < 5; ++attempt) {
      r = run_mmt(args, options);
      if (r.exit_code != 0) break;
      undo();
    }
    return r;
  };
  const auto remove_out = [&] { fs::remove_all(path("out")); };
  const auto remove_got = [&] { fs::remove(path("got")); };
  for (int signal_number : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    SCOPED_TRACE(::strsignal(signal_number));
    const RunResult exported =
        interrupted({"export", path("xy.mmt"), path("out")},
                    {.interrupt_once_exists = path("out/x.npy.tmp-"), .interrupt_signal = signal_number}, remove_out);
    EXPECT_EQ(exported.exit_code, 128 + signal_number) << exported.err;
    EXPECT_NE(exported.err.find("mmt export: interrupted: " + path("out/x.npy") + " and " + path("out/y.npy") +
                                " were not written; the folder " + path("out") + ", which this run created, was removed"),
              std::string::npos) << exported.err;
    EXPECT_EQ(exported.out, "");
    EXPECT_EQ(listing(), before) << "no folder, no output and no temporary left";
  }
  // A field packed from a Fortran-order array is written out of order, and stops the same way.
  testutil::write_file(path("fx.npy"), testutil::npy_file("|u1", true, "(2, 16777216)", Bytes(size_t{32} << 20)));
  ASSERT_EQ(run_mmt({"pack", path("fxy.mmt"), "x=" + path("fx.npy"), "y=" + path("y.npy"), "--quiet"}).exit_code, 0);
  fs::remove(path("fx.npy"));
  before = listing();
  const RunResult fortran =
      interrupted({"export", path("fxy.mmt"), path("out")},
                  {.interrupt_once_exists = path("out/x.npy.tmp-"), .interrupt_signal = SIGINT}, remove_out);
  EXPECT_EQ(fortran.exit_code, 128 + SIGINT) << fortran.err;
  EXPECT_NE(fortran.err.find("mmt export: interrupted: " + path("out/x.npy") + " and " + path("out/y.npy") +
                             " were not written"), std::string::npos) << fortran.err;
  EXPECT_EQ(listing(), before) << "no folder, no output and no temporary left";
  for (const char* option : {"--npy", "--raw"}) {
    for (int signal_number : {SIGINT, SIGTERM}) {
      SCOPED_TRACE(option);
      const RunResult got =
          interrupted({"get", path("one.mmt"), "0", option, path("got")},
                      {.interrupt_once_exists = path("got.tmp-"), .interrupt_signal = signal_number}, remove_got);
      EXPECT_EQ(got.exit_code, 128 + signal_number) << got.err;
      EXPECT_NE(got.err.find("mmt get: interrupted: " + path("got") + " was not written"), std::string::npos) << got.err;
      EXPECT_EQ(listing(), before) << "no output and no temporary left";
    }
  }
  // Over an existing file (--force), that file keeps what it had.
  const auto precious = [&] { testutil::write_file(path("got"), testutil::to_bytes("precious")); };
  precious();
  const RunResult forced = interrupted({"get", path("one.mmt"), "0", "--raw", path("got"), "--force"},
                                       {.interrupt_once_exists = path("got.tmp-")}, precious);
  EXPECT_EQ(forced.exit_code, 128 + SIGINT) << forced.err;
  EXPECT_NE(forced.err.find(" was not written; the file already there was left as it was"), std::string::npos)
      << forced.err;
  EXPECT_EQ(slurp(path("got")), "precious");
}

// Two packs to one new path: the loser said "rename of out.mmt.tmp-... to out.mmt: File
// exists" and "out.mmt was not created", which exists (the other made it).
TEST_F(MmtCli, APackThatLosesTheRaceToItsPathSaysAnotherProcessCreatedIt) {
  Tensor values = empty({2048, 2048}, kFloat32);
  values.copy_(arange(2048 * 2048, kFloat64).view({2048, 2048}));
  save("big.npy", values);
  const RunResult r = run_mmt(
      {"pack", path("race.mmt"), "x=" + path("big.npy"), "--codec", "zstd:19", "--threads", "1"},
      {.interrupt_once_exists = path("race.mmt.tmp-"),
       .instead_of_signal = [&] { testutil::write_file(path("race.mmt"), testutil::to_bytes("the winner")); }});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("mmt pack: another process created " + path("race.mmt") +
                       " meanwhile; it was kept, and this run's dataset was not written"),
            std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("was not created"), std::string::npos) << r.err;
  EXPECT_EQ(slurp(path("race.mmt")), "the winner");
}

TEST_F(MmtCli, BenchReportsBesideMemcpy) {
  save("a.npy", records(kUInt8, 1000, {64}));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "a=" + path("a.npy"), "--codec", "lz4"}).exit_code, 0);
  RunResult r = run_mmt({"bench", path("a.mmt"), "--json", "--seconds", "0.05", "--batch", "32"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* key : {"random_get", "batch_gather", "memcpy_gather", "loader"})
    EXPECT_GT(j[key]["samples_per_second"].get<double>(), 0) << key;
  EXPECT_GT(j["batch_gather_vs_memcpy"].get<double>(), 0);
}

// The loader ran whole epochs whatever --seconds said: on a dataset of billions of records
// `mmt bench` ran for many minutes. It now stops at the time given, mid-epoch.
TEST_F(MmtCli, BenchStopsTheLoaderAtTheTimeGivenOnALongEpoch) {
  save("a.npy", records(kUInt8, 300000, {8}));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "a=" + path("a.npy")}).exit_code, 0);
  RunResult r = run_mmt({"bench", path("a.mmt"), "--json", "--seconds", "0.05", "--batch", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["loader"]["epochs"], 0) << "300,000 batches of one record do not fit 0.05 s";
  EXPECT_GT(j["loader"]["batches"].get<int64_t>(), 0);
  EXPECT_LT(j["loader"]["batches"].get<int64_t>(), 300000);
  EXPECT_GT(j["loader"]["samples_per_second"].get<double>(), 0);
}

// The loader's bytes per second counted the fixed fields only (a folder of 10 kB files read
// at "2.6 MB/s", and 0 B/s without a fixed field); the gathers, which read only those, did not
// say so, and their JSON keys were missing for a file without one.
TEST_F(MmtCli, BenchCountsTheVariableLengthBytesTheLoaderDelivers) {
  fs::create_directories(path("imgs/a"));
  for (int i = 0; i < 16; ++i)
    testutil::write_file(path("imgs/a/" + std::to_string(i)), testutil::to_bytes(std::string(10000, 'x')));
  ASSERT_EQ(run_mmt({"pack", path("f.mmt"), "--folder", path("imgs")}).exit_code, 0);
  RunResult r = run_mmt({"bench", path("f.mmt"), "--json", "--seconds", "0.05", "--batch", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  const auto bytes_per_sample = [&](const char* key) {
    return j[key]["bytes_per_second"].get<double>() / j[key]["samples_per_second"].get<double>();
  };
  EXPECT_NEAR(bytes_per_sample("loader"), 10008, 1) << r.out;  // 10,000 bytes of data and an int64 label
  EXPECT_NEAR(bytes_per_sample("random_get"), 10008, 1) << r.out;
  EXPECT_EQ(j["batch_gather"]["fields"], nlohmann::json::array({"label"}));
  EXPECT_NEAR(bytes_per_sample("batch_gather"), 8, 0.01) << r.out;
  RunResult text = run_mmt({"bench", path("f.mmt"), "--seconds", "0.05", "--batch", "4"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("(the gathers read the fixed-shape fields only: label)"), std::string::npos) << text.out;

  // Only a variable-length field: the gathers are null, not missing, and the text says why.
  WriterOptions options;
  DatasetWriter writer = DatasetWriter::create(path("r.mmt"), Schema({Field::bytes("raw")}), options);
  for (int i = 0; i < 8; ++i) writer.append({empty({100}, kUInt8)});
  writer.finish();
  RunResult ragged = run_mmt({"bench", path("r.mmt"), "--json", "--seconds", "0.05", "--batch", "4"});
  ASSERT_EQ(ragged.exit_code, 0) << ragged.err;
  j = nlohmann::json::parse(ragged.out);
  for (const char* key : {"batch_gather", "memcpy_gather", "batch_gather_vs_memcpy"}) {
    ASSERT_TRUE(j.contains(key)) << key;
    EXPECT_TRUE(j[key].is_null()) << key;
  }
  EXPECT_NEAR(bytes_per_sample("loader"), 100, 0.01) << ragged.out;
  EXPECT_EQ(j["paths"], nlohmann::json::array({path("r.mmt")}));
  text = run_mmt({"bench", path("r.mmt"), "--seconds", "0.05", "--batch", "4"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("no fixed-shape field to gather"), std::string::npos) << text.out;
}

TEST_F(MmtCli, BenchColdStartsEachMeasurementFromStorage) {
  save("a.npy", records(kUInt8, 2000, {784}));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "a=" + path("a.npy")}).exit_code, 0);
  RunResult r = run_mmt({"bench", path("a.mmt"), "--cold", "--json", "--seconds", "0.05", "--batch", "32"});
  if (r.exit_code != 0) {  // a tmpfs keeps the file in memory: said, and nothing measured
    EXPECT_FAILS_WITH(r, "--cold: ");
    GTEST_SKIP() << r.err;
  }
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["cold"].get<bool>());
  EXPECT_TRUE(j["batch_gather"]["prefetch"].get<bool>());
  EXPECT_FALSE(j["chunk_cache_warmed"].get<bool>());
  for (const char* key : {"random_get", "batch_gather", "loader"}) {
    EXPECT_GT(j[key]["samples_per_second"].get<double>(), 0) << key;
    ASSERT_TRUE(j[key].contains("storage_read_bytes")) << key;
    if (!j[key]["storage_read_bytes"].is_null()) {
      EXPECT_GE(j[key]["storage_read_bytes"].get<int64_t>(), 0) << key;
    }
  }
  RunResult text = run_mmt({"bench", path("a.mmt"), "--cold", "--seconds", "0.05"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("each measurement from a cold page cache"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("prefetch+gather"), std::string::npos) << text.out;
}

TEST_F(MmtCli, AFailedWriteToStandardOutputFailsTheCommand) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  save("a.npy", records(kInt32, 4, {2}));
  const RunOptions full{.stdout_path = "/dev/full"};
  // pack writes its output file, then its summary, which /dev/full refuses.
  RunResult packed = run_mmt({"pack", path("a.mmt"), "a=" + path("a.npy")}, full);
  // The dataset stands, and the message says so: a script sees only the failure.
  EXPECT_FAILS_WITH(packed, "mmt: cannot write to standard output: No space left on device (" + path("a.mmt") +
                                " was written and is complete)");
  ASSERT_EQ(Dataset::open(path("a.mmt")).size(), 4);
  const std::vector<std::vector<std::string>> commands{{"info", path("a.mmt")},
                                                       {"info", path("a.mmt"), "--json"},
                                                       {"get", path("a.mmt"), "0"},
                                                       {"verify", path("a.mmt")},
                                                       {"export", path("a.mmt"), path("out")},
                                                       {"--help"}};
  for (const std::vector<std::string>& args : commands) {
    SCOPED_TRACE(args[0]);
    RunResult r = run_mmt(args, full);
    EXPECT_FAILS_WITH(r, "mmt: cannot write to standard output: No space left on device");
  }
  // Nothing to print, nothing to fail.
  RunResult quiet = run_mmt({"pack", path("b.mmt"), "a=" + path("a.npy"), "--quiet"}, full);
  EXPECT_EQ(quiet.exit_code, 0) << quiet.err;
}

TEST_F(MmtCli, BenchRefusesOptionsItCannotRun) {
  save("a.npy", records(kUInt8, 8, {4096}));
  ASSERT_EQ(run_mmt({"pack", path("a.mmt"), "a=" + path("a.npy")}).exit_code, 0);
  auto bench = [&](std::vector<std::string> options) {
    std::vector<std::string> args{"bench", path("a.mmt")};
    args.insert(args.end(), options.begin(), options.end());
    return run_mmt(args);
  };
  // Each is refused at once, before a measurement (one of them would otherwise never end).
  for (const char* seconds : {"0", "-1", "nan", "inf", "1e9"})
    EXPECT_FAILS_WITH(bench({"--seconds", seconds}), "--seconds must be a time > 0");
  for (const char* threads : {"0", "-1", "100000"})
    EXPECT_FAILS_WITH(bench({"--threads", threads}), "' is out of range: it must be within [1, 1024]");
  for (const char* batch : {"0", "-5", "1000000000"})
    EXPECT_FAILS_WITH(bench({"--batch", batch}), "' is out of range: it must be within [1, 1048576]");
  // 300000 records of 4 kB: 1.2 GB a batch.
  EXPECT_FAILS_WITH(bench({"--batch", "300000"}), "--batch 300000 makes batches of 1.2 GB");
}


// ---- shards: several files read as one dataset (Dataset::open_concat) ----

// Three shards of one dataset (x int32 [3], y uint8), 10, 8 and 7 records whose values run on
// from shard to shard, stored uncompressed, lz4 and zstd, in chunks of a few records.
class MmtCliShards : public MmtCli {
 protected:
  void SetUp() override {
    MmtCli::SetUp();
    if (IsSkipped()) return;
    const int64_t counts[] = {10, 8, 7};
    const char* codecs[] = {"none", "lz4", "zstd"};
    int64_t first = 0;
    for (size_t k = 0; k < 3; ++k) {
      const std::string name(1, static_cast<char>('a' + k));
      save(name + "-x.npy", x_.slice(0, first, first + counts[k]));
      save(name + "-y.npy", y_.slice(0, first, first + counts[k]));
      shards_.push_back(path(name + ".mmt"));
      const RunResult packed = run_mmt({"pack", shards_.back(), "x=" + path(name + "-x.npy"),
                                        "y=" + path(name + "-y.npy"), "--codec", codecs[k], "--chunk-bytes", "64",
                                        "--align", "64", "--quiet"});  // compressed chunks hold >= --align bytes
      ASSERT_EQ(packed.exit_code, 0) << packed.err;
      first += counts[k];
    }
    save("x.npy", x_);
    save("y.npy", y_);
  }
  // `command`, then the shards, then `after`.
  std::vector<std::string> over_shards(const std::string& command, const std::vector<std::string>& after = {}) const {
    std::vector<std::string> args{command};
    args.insert(args.end(), shards_.begin(), shards_.end());
    args.insert(args.end(), after.begin(), after.end());
    return args;
  }

  const Tensor x_ = records(kInt32, 25, {3});
  const Tensor y_ = records(kUInt8, 25, {});
  std::vector<std::string> shards_;
};

// --shard K/N: N packs of one share each, as parallel processes would run them, read back as
// the whole inputs.
TEST_F(MmtCliShards, PackShardPacksOneShareAndTheSharesReadAsTheInputs) {
  std::vector<std::string> parts;
  const int64_t sizes[] = {6, 6, 6, 7};  // 25 records: k * 25 / 4 rounded down
  int64_t first = 0;
  for (int k = 0; k < 4; ++k) {
    parts.push_back(path("part-" + std::to_string(k) + ".mmt"));
    const std::string share = std::to_string(k) + "/4";
    const RunResult packed = run_mmt({"pack", parts.back(), "x=" + path("x.npy"), "y=" + path("y.npy"), "--shard",
                                      share, "--codec", "lz4"});
    ASSERT_EQ(packed.exit_code, 0) << packed.err;
    EXPECT_NE(packed.out.find("packed " + std::to_string(sizes[k]) + " records"), std::string::npos) << packed.out;
    EXPECT_NE(packed.out.find("shard " + std::to_string(k) + " of 4 (numbered from 0): records [" +
                              std::to_string(first) + ", " + std::to_string(first + sizes[k]) + ") of the inputs' 25"),
              std::string::npos)
        << packed.out;
    first += sizes[k];
  }
  std::vector<std::string> verify{"verify"};
  verify.insert(verify.end(), parts.begin(), parts.end());
  for (const std::string& input : {"x=" + path("x.npy"), "y=" + path("y.npy")}) verify.push_back(input);
  verify.insert(verify.end() - 2, "--against");
  const RunResult verified = run_mmt(verify);
  EXPECT_EQ(verified.exit_code, 0) << verified.out << verified.err;
  const Dataset whole = Dataset::open_concat(parts);
  ASSERT_EQ(whole.size(), 25);
  for (int64_t i = 0; i < 25; ++i) ASSERT_EQ(whole.get(i, "y").item<uint8_t>(), y_.select(0, i).item<uint8_t>());
  // Shares that are not one of the shards are usage errors, and create nothing.
  for (const auto& [share, message] : std::vector<std::pair<std::string, std::string>>{
           {"4/4", "--shard's K"}, {"-1/4", "--shard's K"}, {"0/0", "--shard's N"}, {"2", "--shard takes K/N"},
           {"a/b", "--shard's N"}}) {
    const RunResult r = run_mmt({"pack", path("bad.mmt"), "x=" + path("x.npy"), "--shard=" + share});
    EXPECT_EQ(r.exit_code, 2) << share << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << share << ": " << r.err;
    EXPECT_FALSE(fs::exists(path("bad.mmt")));
  }
}

TEST_F(MmtCliShards, HelpSaysShardsAreReadAsOne) {
  for (const char* sub : {"info", "verify", "bench"}) {
    const RunResult help = run_mmt({sub, "--help"});
    EXPECT_NE(help.out.find("FILE...\n"), std::string::npos) << sub << ": " << help.out;
    EXPECT_NE(help.out.find("several shards read as one dataset, in order"), std::string::npos) << help.out;
  }
  // The positionals' usage says which word repeats (CLI11 alone wrote "FILE... DIR...").
  EXPECT_NE(run_mmt({"export", "--help"}).out.find("Usage: mmt export [OPTIONS] FILE... DIR\n"), std::string::npos);
  EXPECT_NE(run_mmt({"get", "--help"}).out.find("Usage: mmt get [OPTIONS] FILE... INDEX\n"), std::string::npos);
}

TEST_F(MmtCliShards, InfoAddsUpThePartsAndListsThem) {
  int64_t chunks = 0, file_bytes = 0;
  for (const std::string& shard : shards_) {
    chunks += Dataset::open(shard).num_chunks();
    file_bytes += static_cast<int64_t>(fs::file_size(shard));
  }
  ASSERT_GT(chunks, 3) << "several chunks a shard";
  const RunResult text = run_mmt(over_shards("info"));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  for (const std::string& line : std::vector<std::string>{
           "files      3, read as one dataset in this order (", "records    25\n",
           "chunks     " + std::to_string(chunks) + " (", "codec      mixed: ",
           "  " + shards_[0] + "  10 records (0..9), ", "  " + shards_[1] + "  8 records (10..17), ",
           "  " + shards_[2] + "  7 records (18..24), "})
    EXPECT_NE(text.out.find(line), std::string::npos) << line << "\n" << text.out;
  EXPECT_NE(text.out.find(std::to_string(file_bytes) + " bytes in all)"), std::string::npos) << text.out;

  const RunResult json = run_mmt(over_shards("info", {"--json"}));
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const nlohmann::json j = nlohmann::json::parse(json.out);
  EXPECT_EQ(j["records"], 25);
  EXPECT_EQ(j["chunks"], chunks);
  EXPECT_EQ(j["file_bytes"], file_bytes);
  EXPECT_EQ(j["path"], shards_[0] + ", " + shards_[1] + ", " + shards_[2]);
  EXPECT_EQ(j["codec"], "mixed");
  char fingerprint[19];  // what a loader's state over these shards names
  std::snprintf(fingerprint, sizeof fingerprint, "0x%016llx",
                static_cast<unsigned long long>(Dataset::open_concat(shards_).fingerprint()));
  EXPECT_EQ(j["fingerprint"], fingerprint);
  ASSERT_EQ(j["parts"].size(), 3u);
  const int64_t first_records[] = {0, 10, 18}, counts[] = {10, 8, 7};
  const char* codecs[] = {"none", "lz4", "zstd"};
  for (size_t k = 0; k < 3; ++k) {
    const nlohmann::json& part = j["parts"][k];
    EXPECT_EQ(part["path"], shards_[k]);
    EXPECT_EQ(part["first_record"], first_records[k]);
    EXPECT_EQ(part["records"], counts[k]);
    EXPECT_EQ(part["chunks"], Dataset::open(shards_[k]).num_chunks());
    EXPECT_EQ(part["file_bytes"], fs::file_size(shards_[k]));
    EXPECT_EQ(std::string(part["codec"]).rfind(codecs[k], 0), 0u) << part["codec"];
  }
  // One file's object is what it always was.
  const nlohmann::json one = nlohmann::json::parse(run_mmt({"info", shards_[0], "--json"}).out);
  EXPECT_FALSE(one.contains("parts"));
  EXPECT_EQ(one["path"], shards_[0]);
  EXPECT_EQ(one["codec"], "none");
}

// Shards packed with --shard K/N say which they are: verify refuses them out of order, twice
// or with one missing, which all read as plausible datasets of the wrong records.
TEST_F(MmtCli, VerifyRefusesShardsOutOfOrderRepeatedOrMissing) {
  save("x.npy", records(kInt32, 30, {2}));
  std::vector<std::string> parts;
  for (int k = 0; k < 3; ++k) {
    parts.push_back(path("part-" + std::to_string(k) + ".mmt"));
    ASSERT_EQ(run_mmt({"pack", parts.back(), "x=" + path("x.npy"), "--shard", std::to_string(k) + "/3", "--quiet"})
                  .exit_code, 0);
  }
  EXPECT_EQ(run_mmt({"verify", parts[0], parts[1], parts[2], "--against", "x=" + path("x.npy")}).exit_code, 0);
  EXPECT_EQ(run_mmt({"verify", parts[1]}).exit_code, 0) << "one shard alone is sound";
  EXPECT_FAILS_WITH(run_mmt({"verify", parts[2], parts[1], parts[0]}), "shards out of order");
  EXPECT_FAILS_WITH(run_mmt({"verify", parts[0], parts[0]}), "shard 0 of 3 is given twice");
  EXPECT_FAILS_WITH(run_mmt({"verify", parts[0], parts[2]}), "these files hold shards 0,2/3 of 30 records (pack_source ");
  EXPECT_FAILS_WITH(run_mmt({"verify", parts[0], parts[2]}), "): shard 1 missing; verify checks the dataset whole");
  const RunResult info = run_mmt({"info", parts[0], parts[2]});
  EXPECT_EQ(info.exit_code, 0) << info.err;  // a subset still reads, and says what it holds
  EXPECT_NE(info.out.find("pack_shard = 0,2/3 of 30"), std::string::npos) << info.out;

  // The inputs changed between pack runs (a record more): the shards of each run read (they
  // are two packs to a reader, as one rank's shards of two corpora are), but verify names
  // what is missing from each, and why that may be.
  save("x.npy", records(kInt32, 31, {2}));
  const std::string changed = path("part-1-of-31.mmt");
  ASSERT_EQ(run_mmt({"pack", changed, "x=" + path("x.npy"), "--shard", "1/3", "--quiet"}).exit_code, 0);
  EXPECT_EQ(run_mmt({"info", parts[0], changed, parts[2]}).exit_code, 0);
  const RunResult mixed = run_mmt({"verify", parts[0], changed, parts[2]});
  EXPECT_FAILS_WITH(mixed, "these files hold shards 0,2/3 of 30 records");
  EXPECT_FAILS_WITH(mixed, "shard 1 missing; the other files hold the other shards of as many, cut from other "
                           "inputs: were the inputs changed between pack runs");
  // Another corpus cut as alike as can be (same name, size and shape, other values) is
  // another pack, which pack_source's sampled bytes tell: a rank's shard of each reads and
  // verifies as two datasets' shards would.
  save("x.npy", arange(1000, 1060, 1, kInt32).view({30, 2}));
  const std::string other = path("other-1.mmt");
  ASSERT_EQ(run_mmt({"pack", other, "x=" + path("x.npy"), "--shard", "1/3", "--quiet"}).exit_code, 0);
  EXPECT_EQ(run_mmt({"info", parts[1], other}).exit_code, 0);
  const RunResult rank_1 = run_mmt({"verify", parts[1], other});
  EXPECT_FAILS_WITH(rank_1, "shards 0, 2 missing; verify checks the dataset whole");
  EXPECT_EQ(rank_1.err.find("changed"), std::string::npos) << rank_1.err;
  EXPECT_FAILS_WITH(run_mmt({"verify", parts[0], parts[1], parts[2], other, parts[1]}), "shard 1 of 3 is given twice");

  // Class folders are told by their files' names only (a shard's packer reads its own files
  // alone): two corpora whose files have the same names read as packs of inputs alike, told
  // apart by the shards' own bytes.
  fs::create_directories(path("imgs/a"));
  fs::create_directories(path("imgs/b"));
  for (const char* file : {"imgs/a/1", "imgs/a/2", "imgs/b/3"}) testutil::write_file(path(file), testutil::to_bytes(file));
  std::vector<std::string> folder_parts;
  for (int k = 0; k < 3; ++k) {
    folder_parts.push_back(path("folder-" + std::to_string(k) + ".mmt"));
    ASSERT_EQ(run_mmt({"pack", folder_parts.back(), "--folder", path("imgs"), "--shard", std::to_string(k) + "/3",
                       "--quiet"}).exit_code, 0);
  }
  // The same shard packed again with another codec: the same records (bytes fields), in
  // other bytes.
  const std::string zstd_folder_1 = path("zstd-folder-1.mmt");
  ASSERT_EQ(run_mmt({"pack", zstd_folder_1, "--folder", path("imgs"), "--shard", "1/3", "--codec", "zstd", "--quiet"})
                .exit_code, 0);
  EXPECT_FAILS_WITH(run_mmt({"verify", folder_parts[0], folder_parts[1], zstd_folder_1}),
                    "hold the same records (the first, middle and last compared) in other bytes");
  testutil::write_file(path("imgs/a/2"), testutil::to_bytes("IMGS/A/2"));  // as long
  const std::string other_folder_1 = path("other-folder-1.mmt");
  ASSERT_EQ(run_mmt({"pack", other_folder_1, "--folder", path("imgs"), "--shard", "1/3", "--quiet"}).exit_code, 0);
  const RunResult folder_rank_1 = run_mmt({"verify", folder_parts[1], other_folder_1});
  EXPECT_FAILS_WITH(folder_rank_1, "shards 0, 2 missing (from one of 2 packs cut from inputs alike)");
  EXPECT_EQ(folder_rank_1.err.find("changed"), std::string::npos) << folder_rank_1.err;
  // A shard given again after another pack of inputs alike is still the same shard twice.
  EXPECT_FAILS_WITH(run_mmt({"verify", folder_parts[0], folder_parts[1], folder_parts[2], other_folder_1,
                             folder_parts[1]}),
                    "shard 1 of 3 is given twice");

  // A pack's N is the metadata's word, not a bound on verify's work: a file that claims to be
  // shard 0 of 2^63 - 1 has its missing shards named at once (verify walked all N, for ever).
  const std::string huge_n = path("huge-n.mmt");
  {
    auto writer = DatasetWriter::create(huge_n, Schema({Field::fixed("x", kInt32, {2})}));
    writer.append_batch({records(kInt32, 10, {2})});
    writer.set_metadata("pack_shard", "0/9223372036854775807 of 100");
    writer.finish();
  }
  EXPECT_FAILS_WITH(run_mmt({"verify", huge_n, parts[1]}),
                    "shards 0/9223372036854775807 of 100 records: shards 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, "
                    "14, 15, 16, 17, 18, 19, 20... missing");
}

// A shard checked alone against the pack's inputs was refused ("holds 10 records but the
// sources have 30"): it is compared with its own share of them, and a difference is named
// with the input's row.
TEST_F(MmtCli, VerifyComparesAShardWithItsShareOfTheSources) {
  Tensor x = records(kInt32, 30, {2});
  save("x.npy", x);
  std::vector<std::string> parts;
  for (int k = 0; k < 3; ++k) {
    parts.push_back(path("part-" + std::to_string(k) + ".mmt"));
    ASSERT_EQ(run_mmt({"pack", parts.back(), "x=" + path("x.npy"), "--shard", std::to_string(k) + "/3", "--quiet"})
                  .exit_code, 0);
  }
  for (const std::string& part : parts) {
    const RunResult r = run_mmt({"verify", part, "--against", "x=" + path("x.npy")});
    EXPECT_EQ(r.exit_code, 0) << part << ": " << r.err;
    EXPECT_NE(r.out.find("10 records (all) equal their sources"), std::string::npos) << r.out;
  }
  const RunResult sampled = run_mmt({"verify", parts[2], "--against", "x=" + path("x.npy"), "--samples", "4"});
  EXPECT_EQ(sampled.exit_code, 0) << sampled.err;

  // Inputs that differ in shard 1's share: record 5 of the shard is row 15 of the input.
  Tensor changed = x.clone();
  changed.select(0, 15).fill_(-1);
  save("changed.npy", changed);
  EXPECT_EQ(run_mmt({"verify", parts[0], "--against", "x=" + path("changed.npy")}).exit_code, 0);
  EXPECT_FAILS_WITH(run_mmt({"verify", parts[1], "--against", "x=" + path("changed.npy")}),
                    "record 5 (source record 15), field 'x' differs from its source x=" + path("changed.npy"));
  // Inputs of another size: not the ones the shard was cut from.
  save("short.npy", x.slice(0, 0, 20));
  EXPECT_FAILS_WITH(run_mmt({"verify", parts[1], "--against", "x=" + path("short.npy")}),
                    "holds shard 1/3 of 30 (pack_shard), a share of sources of 30 records, but these sources "
                    "have 20");
}

TEST_F(MmtCliShards, VerifyChecksEveryPartAndNamesADamagedOne) {
  const RunResult sound = run_mmt(over_shards("verify"));
  ASSERT_EQ(sound.exit_code, 0) << sound.err;
  const int64_t chunks = Dataset::open_concat(shards_).num_chunks();
  EXPECT_NE(sound.out.find(": sound: 3 files, 25 records in " + std::to_string(chunks) +
                           " chunks, every structure and checksum checked\n"),
            std::string::npos) << sound.out;
  // The concatenation's records are those of the arrays the shards were cut from.
  const RunResult compared = run_mmt(over_shards("verify", {"--against", "x=" + path("x.npy"), "y=" + path("y.npy")}));
  EXPECT_EQ(compared.exit_code, 0) << compared.err;
  EXPECT_NE(compared.out.find("25 records (all) equal their sources byte for byte"), std::string::npos)
      << compared.out;
  const RunResult sampled = run_mmt(over_shards("verify", {"--against", "x=" + path("x.npy"), "--samples", "5"}));
  EXPECT_EQ(sampled.exit_code, 0) << sampled.err;
  EXPECT_NE(sampled.out.find("5 random records equal their sources"), std::string::npos) << sampled.out;

  // A byte flipped in the middle shard's second chunk: the fault is named with that shard.
  const ChunkInfo chunk = Dataset::open(shards_[1]).chunk(1);
  Bytes bytes = testutil::read_file(shards_[1]);
  bytes[static_cast<size_t>(chunk.file_offset + chunk.stored_bytes / 2)] ^= std::byte{0x10};
  testutil::write_file(shards_[1], bytes);
  const RunResult bad = run_mmt(over_shards("verify"));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("mmt verify: error: " + shards_[1] + ": chunk 1 "), std::string::npos) << bad.err;
  EXPECT_EQ(bad.out.find("sound"), std::string::npos) << bad.out;
}

TEST_F(MmtCliShards, ExportAndGetReadTheConcatenation) {
  const RunResult exported = run_mmt(over_shards("export", {path("out")}));
  ASSERT_EQ(exported.exit_code, 0) << exported.err;
  EXPECT_TRUE(load_npy(path("out/x.npy")).equal(x_));
  EXPECT_TRUE(load_npy(path("out/y.npy")).equal(y_));
  // Two shards, one field; --field takes one name each time, so before the files too.
  const RunResult one_field = run_mmt({"export", shards_[0], shards_[1], path("out-x"), "--field", "x"});
  ASSERT_EQ(one_field.exit_code, 0) << one_field.err;
  EXPECT_TRUE(load_npy(path("out-x/x.npy")).equal(x_.slice(0, 0, 18)));
  EXPECT_FALSE(fs::exists(path("out-x/y.npy")));
  const RunResult fields_first =
      run_mmt({"export", "--field", "y", "--field", "x", shards_[0], shards_[1], shards_[2], path("out-yx")});
  ASSERT_EQ(fields_first.exit_code, 0) << fields_first.err;
  EXPECT_TRUE(load_npy(path("out-yx/x.npy")).equal(x_));
  EXPECT_TRUE(load_npy(path("out-yx/y.npy")).equal(y_));

  // Records are numbered across the shards: 12 is the second shard's third.
  const RunResult got = run_mmt(over_shards("get", {"12", "--field", "x", "--npy", path("12.npy")}));
  ASSERT_EQ(got.exit_code, 0) << got.err;
  EXPECT_TRUE(load_npy(path("12.npy")).equal(x_[12]));
  EXPECT_EQ(run_mmt(over_shards("get", {"-1", "--field", "y"})).out,
            run_mmt({"get", shards_[2], "6", "--field", "y"}).out);
  EXPECT_FAILS_WITH(run_mmt(over_shards("get", {"25"})), "out of range for a dataset of 25 records in 3 parts");
  // Only the last word is the index: a second one is said to be taken for a file.
  const RunResult two = run_mmt({"get", shards_[0], "0", "1"});
  EXPECT_EQ(two.exit_code, 2);
  EXPECT_NE(two.err.find("'0' is taken for a dataset file, and there is none of that name"), std::string::npos)
      << two.err;
  // No output replaces any of the shards being read.
  const Bytes before = testutil::read_file(shards_[2]);
  EXPECT_FAILS_WITH(run_mmt(over_shards("get", {"0", "--field", "x", "--npy", shards_[2], "--force"})),
                    "is the dataset being read (" + shards_[2] + ")");
  EXPECT_EQ(testutil::read_file(shards_[2]), before);
}

TEST_F(MmtCliShards, BenchMeasuresTheConcatenation) {
  const RunResult r = run_mmt(over_shards("bench", {"--json", "--seconds", "0.02", "--batch", "8"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["records"], 25);
  EXPECT_EQ(j["file"], shards_[0] + ", " + shards_[1] + ", " + shards_[2]);
  ASSERT_EQ(j["parts"].size(), 3u);
  EXPECT_EQ(j["parts"][1]["path"], shards_[1]);
  EXPECT_EQ(j["parts"][1]["records"], 8);
  for (const char* key : {"random_get", "batch_gather", "loader"})
    EXPECT_GT(j[key]["samples_per_second"].get<double>(), 0) << key;
  EXPECT_GE(j["loader"]["epochs"].get<int64_t>(), 1);
  const RunResult one = run_mmt({"bench", shards_[0], "--json", "--seconds", "0.02"});
  EXPECT_FALSE(nlohmann::json::parse(one.out).contains("parts")) << "a single file's report is unchanged";

  const RunResult cold = run_mmt(over_shards("bench", {"--cold", "--seconds", "0.02", "--batch", "8"}));
  if (cold.exit_code != 0) {  // a tmpfs keeps the files in memory: said, and nothing measured
    EXPECT_FAILS_WITH(cold, "--cold: ");
    return;
  }
  EXPECT_NE(cold.out.find(": 25 records in 3 files, "), std::string::npos) << cold.out;
  EXPECT_NE(cold.out.find("each measurement from a cold page cache"), std::string::npos) << cold.out;
}

TEST_F(MmtCliShards, PartsThatDisagreeAreRefusedNamingThePart) {
  // Another dtype for x in a fourth file.
  save("z-x.npy", records(kFloat32, 4, {3}));
  save("z-y.npy", records(kUInt8, 4, {}));
  const RunResult packed = run_mmt({"pack", path("z.mmt"), "x=" + path("z-x.npy"), "y=" + path("z-y.npy"), "--quiet"});
  ASSERT_EQ(packed.exit_code, 0) << packed.err;
  const std::vector<std::string> mixed{shards_[0], path("z.mmt")};
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"info"}, {"verify"}, {"bench", "--seconds", "0.02"}, {"export", path("out")},
        {"get", "0"}}) {
    std::vector<std::string> command{args[0]};
    command.insert(command.end(), mixed.begin(), mixed.end());
    command.insert(command.end(), args.begin() + 1, args.end());
    const RunResult r = run_mmt(command);
    EXPECT_EQ(r.exit_code, 1) << args[0];
    EXPECT_NE(r.err.find("mmt " + args[0] + ": error: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("part 1 (" + path("z.mmt") + ") has other fields than part 0 (" + shards_[0] + ")"),
              std::string::npos) << r.err;
    EXPECT_EQ(r.out, "") << args[0];
  }
  EXPECT_FALSE(fs::exists(path("out")));

  // Metadata that disagrees (the class names of folder shards, say) names the key and both parts.
  const std::pair<const char*, const char*> labelled[] = {{"cats-first.mmt", "cat,dog"}, {"dogs-first.mmt", "dog,cat"}};
  for (const auto& [name, classes] : labelled) {
    WriterOptions options;
    options.metadata = {{"classes", classes}};
    DatasetWriter writer = DatasetWriter::create(path(name), Schema({Field::fixed("label", kInt64, {})}), options);
    writer.append({full({}, 1, kInt64)});
    writer.finish();
  }
  EXPECT_FAILS_WITH(run_mmt({"info", path("cats-first.mmt"), path("dogs-first.mmt")}),
                    "metadata 'classes' is \"cat,dog\" in part 0 (" + path("cats-first.mmt") +
                        ") but \"dog,cat\" in part 1 (" + path("dogs-first.mmt") + ")");

  // A missing shard is named.
  EXPECT_FAILS_WITH(run_mmt({"info", shards_[0], path("missing.mmt")}), "missing.mmt");
  EXPECT_FAILS_WITH(run_mmt({"verify", shards_[0], path("missing.mmt")}), "missing.mmt");
}

}  // namespace
}  // namespace mmt
