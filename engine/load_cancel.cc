#include "load_cancel.h"

#include <chrono>
#include <utility>

#include "mmtensor/packer.h"

namespace mmt::detail {
namespace {

thread_local LoadCancelScope* t_innermost = nullptr;
thread_local std::chrono::steady_clock::time_point t_last_asked{};

// The function may take a lock (Python's GIL); asked at a loop's every step it would cost
// more than the step.
constexpr std::chrono::milliseconds kAskEvery{20};

}  // namespace

LoadCancelScope::LoadCancelScope(std::function<bool()> cancelled)
    : cancelled_(std::move(cancelled)), outer_(std::exchange(t_innermost, this)) {
  t_last_asked = {};  // a new scope's first check asks
}

LoadCancelScope::~LoadCancelScope() { t_innermost = outer_; }

void check_load_cancelled() {
  LoadCancelScope* scope = t_innermost;
  if (scope == nullptr || !scope->cancelled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - t_last_asked < kAskEvery) return;
  t_last_asked = now;
  if (scope->cancelled_()) throw PackCancelled("reading the inputs was interrupted");
}

}  // namespace mmt::detail
