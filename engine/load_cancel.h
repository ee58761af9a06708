// Giving up a load of pack inputs that takes minutes (an HDF5 dataset decoded, a .tar.gz or a
// compressed MDS shard decompressed, a deflated .npz member inflated, a Fortran-order array
// converted) from the thread that runs it. While a LoadCancelScope lives on a thread, the
// loaders' long loops on that thread call check_load_cancelled() between their steps (a slab,
// a piece of at most 16 MiB), which throws PackCancelled once the scope's function says true.
//
// Python's pack() opens one that runs the interpreter's signal handlers, so Ctrl-C raises
// KeyboardInterrupt within a step instead of after the whole load. `mmt pack` needs none: a
// stop signal while it reads its inputs ends the process at once (tools/interrupt.h).
#pragma once

#include <functional>

namespace mmt::detail {

class LoadCancelScope {
 public:
  // `cancelled` is called on the scope's thread, at most every 20 ms.
  explicit LoadCancelScope(std::function<bool()> cancelled);
  ~LoadCancelScope();
  LoadCancelScope(const LoadCancelScope&) = delete;
  LoadCancelScope& operator=(const LoadCancelScope&) = delete;

 private:
  std::function<bool()> cancelled_;
  LoadCancelScope* outer_;
  friend void check_load_cancelled();
};

// Throws PackCancelled ("reading the inputs was interrupted") when the calling thread's
// innermost LoadCancelScope says so (the innermost decides alone: one with no function never
// cancels); nothing without one. Only the scope's thread asks: work a loader hands to other
// threads (an HDF5 slab's chunks) runs to the end of its step.
void check_load_cancelled();

}  // namespace mmt::detail
