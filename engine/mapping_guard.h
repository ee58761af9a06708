// MappingGuard: turns a SIGBUS inside a mapped dataset into an IoError, for the engine's own
// reads of mapped bytes.
//
// Why: a file that another program truncates while it is mapped makes every access to the
// pages past its new end raise SIGBUS, which kills the process. mmtensor never truncates or
// rewrites a published file in place (the writer replaces files by rename), and Dataset::open
// checks every size against the real file, so this only happens when something outside
// mmtensor shrinks a file under a reader. When it does, the engine's own reads (get_batch
// copies, column copies, chunk decoding, checksum hashing, verify) fail with
//   IoError "<path>: the file was truncated or changed while mapped (SIGBUS reading byte N)"
// instead of killing the process. Zero-copy views handed to the user are read by user code,
// outside any guard: touching one after an external truncation still raises SIGBUS
// (docs/RELIABILITY.md).
//
// How: a process-wide SIGBUS handler, installed once on first use, that chains to whatever
// handler was there before. A guarded section pushes a frame (jump buffer + address range) on
// a thread-local stack; the handler siglongjmp's to the innermost frame whose range holds the
// faulting address, and passes every other fault on to the previous handler (by default:
// the process dies of SIGBUS, as it would without mmtensor).
//
// Rules for guarded code (siglongjmp skips destructors): the section must hold no lock, and
// own no object with a non-trivial destructor that a fault could skip. Keep sections to raw
// reads: memcpy loops, decoders over a caller's buffer, hashing. Exceptions thrown inside a
// section unwind normally and pop its frame.
//
// Cost: one setjmp (no system call: the signal mask is not saved) and two thread-local
// stores per section.
#pragma once

#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

namespace mmt::detail {

// One mapped range that a fault may be reported against.
struct MappedRegion {
  const std::string* path = nullptr;  // for the message; outlives every guarded section
  const std::byte* base = nullptr;
  int64_t nbytes = 0;
};

// A guarded section's record, linked into the calling thread's stack of sections.
struct GuardFrame {
  sigjmp_buf jump;
  uintptr_t begin = 0;
  uintptr_t nbytes = 0;
  volatile uintptr_t fault_address = 0;  // written by the signal handler
  GuardFrame* previous = nullptr;
};

// Installs the process-wide SIGBUS handler the first time it is called; thread-safe.
void install_sigbus_handler();
// The calling thread's innermost frame, and the push/pop the guard uses.
GuardFrame* current_guard_frame() noexcept;
void set_current_guard_frame(GuardFrame* frame) noexcept;
// The IoError for a fault at `fault_address` inside `region`.
[[noreturn]] void throw_mapping_fault(const MappedRegion& region, uintptr_t fault_address);

// Runs fn() with a SIGBUS raised by a read inside [begin, begin + nbytes) turned into
// on_fault(fault_address), which must throw. Returns what fn returns; exceptions from fn pass
// through unchanged.
template <typename Fn, typename OnFault>
decltype(auto) guard_reads(uintptr_t begin, uintptr_t nbytes, Fn&& fn, const OnFault& on_fault) {
  install_sigbus_handler();
  GuardFrame frame;
  frame.begin = begin;
  frame.nbytes = nbytes;
  frame.previous = current_guard_frame();
  // savemask 0: no sigprocmask call per section. The handler runs with SA_NODEFER, so the
  // thread's mask is already right when siglongjmp lands here.
  if (sigsetjmp(frame.jump, 0) != 0) {
    set_current_guard_frame(frame.previous);
    on_fault(frame.fault_address);
  }
  set_current_guard_frame(&frame);
  // try/catch rather than an RAII pop: nothing with a destructor lives between the setjmp and
  // a fault, so the siglongjmp skips none.
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<Fn>>) {
      std::forward<Fn>(fn)();
      set_current_guard_frame(frame.previous);
    } else {
      decltype(auto) result = std::forward<Fn>(fn)();
      set_current_guard_frame(frame.previous);
      return result;
    }
  } catch (...) {
    set_current_guard_frame(frame.previous);
    throw;
  }
}

// Runs fn() with a SIGBUS raised by a read inside `region` turned into IoError.
template <typename Fn>
decltype(auto) guard_mapped_reads(const MappedRegion& region, Fn&& fn) {
  return guard_reads(reinterpret_cast<uintptr_t>(region.base), static_cast<uintptr_t>(region.nbytes),
                     std::forward<Fn>(fn), [&](uintptr_t fault_address) { throw_mapping_fault(region, fault_address); });
}

// The same for reads from any of several mappings (the parts of a concatenation): one guard
// over the range from the lowest to the highest of them. A fault in one of them is that
// file's IoError; a fault between them (in memory the guarded code also touches, a caller's
// output mapped from a file, say) is an IoError too, rather than the death of the process.
// `regions` must not be empty.
[[noreturn]] void throw_fault_in_regions(std::span<const MappedRegion> regions, uintptr_t fault_address);
template <typename Fn>
decltype(auto) guard_mapped_reads(std::span<const MappedRegion> regions, uintptr_t lowest, uintptr_t end, Fn&& fn) {
  return guard_reads(lowest, end - lowest, std::forward<Fn>(fn),
                     [&](uintptr_t fault_address) { throw_fault_in_regions(regions, fault_address); });
}

// Runs fn() under the guard when `storage` (an UntypedStorage) is a file's mapping, so that a
// file cut short under the reader is an IoError naming it; memory of the process's own is
// read unguarded. For the engine's copies out of any tensor a user hands it (clone, item,
// equal...), which may view a mapping.
template <typename Storage, typename Fn>
decltype(auto) guard_storage_reads(const Storage& storage, Fn&& fn) {
  if (storage.filename().empty()) return std::forward<Fn>(fn)();
  return guard_mapped_reads(MappedRegion{&storage.filename(), storage.data(), storage.nbytes()}, std::forward<Fn>(fn));
}

}  // namespace mmt::detail
