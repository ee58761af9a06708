// A one-line progress bar on stderr (records, MB/s, ETA), drawn only when stderr is a
// terminal, so logs and pipes stay clean.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace mmt::tool {

class ProgressBar {
 public:
  // total_bytes drives the bar and the ETA (records alone can differ widely in size).
  ProgressBar(std::string label, int64_t total_records, int64_t total_bytes);
  ~ProgressBar() { finish(); }
  bool enabled() const { return enabled_; }
  void update(int64_t records, int64_t bytes_in);
  // Erases the bar so the summary starts on a clean line.
  void finish();

 private:
  std::string label_;
  int64_t total_records_;
  int64_t total_bytes_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace mmt::tool
