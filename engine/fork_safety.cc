#include "fork_safety.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "mmtensor/error.h"

namespace mmt::detail {
namespace {

std::atomic<uint64_t> g_fork_generation{0};

void count_fork_in_child() { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }

// Registered when the library is loaded, not on first use: a fork racing a first use could
// otherwise leave the registration's guard taken in the child.
[[maybe_unused]] const bool g_counting_forks = pthread_atfork(nullptr, nullptr, count_fork_in_child) == 0;

}  // namespace

uint64_t fork_generation() noexcept { return g_fork_generation.load(std::memory_order_relaxed); }

void abandon_after_fork(const void* object) noexcept {
  static std::mutex* const mutex = new std::mutex;
  static std::vector<const void*>* const abandoned = new std::vector<const void*>;
  std::lock_guard lock(*mutex);
  try {
    abandoned->push_back(object);
  } catch (...) {  // out of memory: then it is merely unreachable, which is still safe
  }
}

void throw_inherited_through_fork(std::string_view what, std::string_view remedy) {
  throw ValueError(str(what, " was made before this process (pid ", ::getpid(),
                       ") was forked from its parent; its threads stayed in the parent, so it cannot be used "
                       "here. ", remedy));
}

}  // namespace mmt::detail
