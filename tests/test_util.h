// Helpers shared by the tests: temporary folders that clean up after themselves.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "mmtensor/device.h"
#include "mmtensor/error.h"

// Expects `statement` to throw `type` with `text` in its message.
#define EXPECT_THROW_WITH(statement, type, text)                                        \
  do {                                                                                  \
    try {                                                                               \
      statement;                                                                        \
      ADD_FAILURE() << #statement " did not throw";                                     \
    } catch (const type& e) {                                                           \
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();       \
    }                                                                                   \
  } while (0)

// Skips a GPU test when no CUDA device can be used, giving the runtime's reason. With
// MMT_REQUIRE_CUDA=1 in the environment it fails instead: on a machine with a GPU, a driver
// too old for this build's runtime must not pass as "skipped".
#define MMT_SKIP_WITHOUT_CUDA()                                                                 \
  do {                                                                                          \
    if (::mmt::cuda_device_count() == 0) {                                                      \
      if (::mmt::testing::cuda_required())                                                      \
        FAIL() << "MMT_REQUIRE_CUDA is set, but " << ::mmt::cuda_unavailable_reason();         \
      GTEST_SKIP() << ::mmt::cuda_unavailable_reason();                                         \
    }                                                                                           \
  } while (0)

namespace mmt::testing {

// Which sanitizer the tests were built with: GCC says so with __SANITIZE_*__, clang with
// __has_feature (which GCC 12 lacks).
#if defined(__has_feature)
#define MMT_TEST_HAS_FEATURE(feature) __has_feature(feature)
#else
#define MMT_TEST_HAS_FEATURE(feature) 0
#endif

// ThreadSanitizer runs signal handlers its own way (deferred, from its runtime): the SIGBUS
// guard's siglongjmp out of a handler does not work under it, so the guard's tests skip there
// (the release and AddressSanitizer builds run them).
#if defined(__SANITIZE_THREAD__) || MMT_TEST_HAS_FEATURE(thread_sanitizer)
inline constexpr bool kThreadSanitizer = true;
#else
inline constexpr bool kThreadSanitizer = false;
#endif

// AddressSanitizer's allocator, as GCC 12 ships it, takes no lock across fork() (LLVM added
// that in 2023, llvm-project#75290): a child forked while another thread is inside malloc
// can wait for ever on that thread's allocator lock at its first allocation. Tests that fork
// a busy process skip there; the release build runs them.
#if defined(__SANITIZE_ADDRESS__) || MMT_TEST_HAS_FEATURE(address_sanitizer)
inline constexpr bool kAddressSanitizer = true;
#else
inline constexpr bool kAddressSanitizer = false;
#endif

inline bool cuda_required() {
  const char* value = std::getenv("MMT_REQUIRE_CUDA");
  return value != nullptr && *value != '\0' && std::string_view(value) != "0";
}

// A fresh folder under the system's temporary directory, removed with everything in it when
// the object goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// The message of the mmt::Error that fn() throws, or "" when it throws none.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The names in a folder, sorted (to see what a writer left behind).
inline std::vector<std::string> folder_entries(const TempDir& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A whole file's bytes ("" for a missing file).
inline std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Sets an environment variable for a scope, and puts back what was there on every way out.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) ::setenv(name_, old_.c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace mmt::testing
