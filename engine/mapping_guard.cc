#include "mapping_guard.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <mutex>

#include "mmtensor/error.h"

namespace mmt::detail {
namespace {

// The signal handler reads this, and a read must not allocate there. Linked into a program,
// the linker puts it in the static TLS block (no allocation ever). Loaded with dlopen (the
// Python module), a thread's block for it is allocated on the thread's first access, and a
// guard writes it before its guarded reads, so a fault that is ours finds it allocated. It
// is not declared initial-exec: that would force the whole module's TLS, the CUDA runtime's
// 4 KiB page-aligned block included, into the few static bytes glibc keeps for dlopen,
// and the module would not load ("cannot allocate memory in static TLS block").
thread_local GuardFrame* t_guard_frame = nullptr;

std::atomic<bool> g_installed{false};
std::mutex g_install_mutex;
struct sigaction g_previous_action {};

// fork() in the middle of the first installation would leave the child a locked mutex and
// no handler (fork_safety.h): the lock is held across fork() and given back on both sides.
// Registered when the library is loaded, as the other fork handlers are.
[[maybe_unused]] const bool g_install_fork_handlers = pthread_atfork(
    [] { g_install_mutex.lock(); }, [] { g_install_mutex.unlock(); }, [] { g_install_mutex.unlock(); }) == 0;

// Hands a fault we do not own to the handler that was installed before ours.
void chain_to_previous(int signal_number, siginfo_t* info, void* context) {
  const struct sigaction& previous = g_previous_action;
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction != nullptr) {
      previous.sa_sigaction(signal_number, info, context);
      return;
    }
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(signal_number);
    return;
  }
  // Default action (SIGBUS cannot meaningfully be ignored after a memory fault): restore it
  // and let the signal take the process as it would have without mmtensor. A fault re-raises
  // itself when the handler returns and the instruction runs again; a signal sent with
  // kill() does not, so send it again.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(signal_number, &default_action, nullptr);
  if (info == nullptr || info->si_code <= 0) raise(signal_number);
}

void on_sigbus(int signal_number, siginfo_t* info, void* context) {
  if (info != nullptr && info->si_code > 0) {  // a fault raised by the kernel, not kill()
    const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
    for (GuardFrame* frame = t_guard_frame; frame != nullptr; frame = frame->previous) {
      if (address - frame->begin < frame->nbytes) {  // unsigned: below begin wraps to huge
        frame->fault_address = address;
        siglongjmp(frame->jump, 1);
      }
    }
  }
  chain_to_previous(signal_number, info, context);
}

}  // namespace

void install_sigbus_handler() {
  if (g_installed.load(std::memory_order_acquire)) return;
  std::lock_guard lock(g_install_mutex);
  if (g_installed.load(std::memory_order_relaxed)) return;
  struct sigaction action {};
  action.sa_sigaction = on_sigbus;
  // SA_NODEFER: SIGBUS stays unblocked in the handler, so a siglongjmp out of it needs no
  // mask restore. SA_ONSTACK: a thread that set up an alternate stack gets to use it.
  action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  // The previous action is saved before ours goes in, so a fault arriving in between still
  // finds somewhere to chain to.
  if (sigaction(SIGBUS, nullptr, &g_previous_action) != 0) return;  // no guard: faults stay fatal
  if (sigaction(SIGBUS, &action, nullptr) != 0) return;
  g_installed.store(true, std::memory_order_release);
}

GuardFrame* current_guard_frame() noexcept { return t_guard_frame; }
void set_current_guard_frame(GuardFrame* frame) noexcept { t_guard_frame = frame; }

void throw_mapping_fault(const MappedRegion& region, uintptr_t fault_address) {
  const int64_t byte = static_cast<int64_t>(fault_address - reinterpret_cast<uintptr_t>(region.base));
  throw IoError(str(region.path ? *region.path : std::string("<mapped file>"),
                    ": the file was truncated or changed while mapped (SIGBUS reading byte ", byte,
                    " of the ", region.nbytes, " bytes mapped at open); reopen it"),
                EFAULT);
}

void throw_fault_in_regions(std::span<const MappedRegion> regions, uintptr_t fault_address) {
  for (const MappedRegion& region : regions) {
    const auto begin = reinterpret_cast<uintptr_t>(region.base);
    if (fault_address >= begin && fault_address - begin < static_cast<uintptr_t>(region.nbytes))
      throw_mapping_fault(region, fault_address);
  }
  char address[32];
  std::snprintf(address, sizeof address, "0x%llx", static_cast<unsigned long long>(fault_address));
  throw IoError(str("SIGBUS reading address ", address, ", in none of the dataset's ", regions.size(),
                    " mapped files (a file-backed buffer given to the reader was truncated?)"),
                EFAULT);
}

}  // namespace mmt::detail
