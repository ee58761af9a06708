#include "fork_safety.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <new>

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

namespace {
// What abandon_after_fork() keeps reachable: a list pushed onto without a lock, since it is
// called from a fork handler (the shared pool's), and a lock there could be one that a thread
// of a process forked again held at that fork. Zero-initialised: no guard to take either.
struct Abandoned {
  const void* object;
  Abandoned* next;
};
std::atomic<Abandoned*> g_abandoned{nullptr};
}  // namespace

void abandon_after_fork(const void* object) noexcept {
  auto* node = new (std::nothrow) Abandoned{object, g_abandoned.load(std::memory_order_relaxed)};
  if (node == nullptr) return;  // out of memory: then it is merely unreachable, which is still safe
  while (!g_abandoned.compare_exchange_weak(node->next, node, std::memory_order_release, std::memory_order_relaxed)) {
  }
}

void throw_inherited_through_fork(std::string_view what, std::string_view remedy) {
  throw ValueError(str(what, " was made before this process (pid ", ::getpid(),
                       ") was forked from its parent; its threads stayed in the parent, so it cannot be used "
                       "here. ", remedy));
}

}  // namespace mmt::detail
