// Helpers shared by the tests: temporary folders that clean up after themselves.
#pragma once

#include <filesystem>
#include <string>

namespace mmt::testing {

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

}  // namespace mmt::testing
