#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "mmt_commands.h"

namespace mmt::tool {

ProgressBar::ProgressBar(std::string label, int64_t total_records, int64_t total_bytes)
    : label_(std::move(label)),
      total_records_(total_records),
      total_bytes_(total_bytes),
      enabled_(::isatty(STDERR_FILENO) == 1) {}

void ProgressBar::update(int64_t records, int64_t bytes_in) {
  if (!enabled_) return;
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double fraction = total_bytes_ > 0 ? static_cast<double>(bytes_in) / static_cast<double>(total_bytes_)
                    : total_records_ > 0 ? static_cast<double>(records) / static_cast<double>(total_records_)
                                         : 1.0;
  fraction = std::clamp(fraction, 0.0, 1.0);
  constexpr int kWidth = 28;
  int filled = static_cast<int>(fraction * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), ' ');
  double rate = seconds > 0 ? static_cast<double>(bytes_in) / seconds : 0;
  double eta = fraction > 0 ? seconds * (1 - fraction) / fraction : -1;
  std::fprintf(stderr, "\r%s [%s] %3.0f%%  %lld/%lld records  %s/s  ETA %s\033[K", label_.c_str(),
               bar.c_str(), fraction * 100, static_cast<long long>(records),
               static_cast<long long>(total_records_), human_bytes(rate).c_str(),
               human_seconds(eta).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace mmt::tool
