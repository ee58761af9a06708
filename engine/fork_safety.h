// fork() copies only the thread that calls it. Whatever the process's other threads were
// doing stays half done in the child: a lock they held stays locked, a chunk they were
// decoding never arrives, a pool's or a loader's workers are simply not there. Python's
// multiprocessing and PyTorch's DataLoader workers fork by default on Linux, so a process
// using mmtensor on several threads is forked in the middle of its work as a matter of course.
//
// What the library does about it:
// - State shared by every object of a kind (each chunk cache's map, the shared thread pool)
//   is made whole for the child by pthread_atfork handlers: its lock is taken before the fork
//   and given back on both sides, and the child drops what only the parent's threads could
//   finish (decodes in flight; the pool and its workers).
// - A Loader and a DatasetWriter (which own threads) record the generation they were made
//   in. Used in a child, they throw ValueError saying so; destroyed there, they are let go
//   (abandon_after_fork) without waiting for threads that are not there, taking their locks
//   or removing the parent's temporary file. A Batch of such a loader stays readable in the
//   child when it is in ordinary host memory; pinned and device memory are not in the child
//   (CUDA keeps pinned pages out of children), and the Batch then refuses with ValueError.
//   Tensors taken from such a batch before the fork cannot be guarded: touching them in the
//   child faults.
// - A Dataset needs nothing: its mapping, views and cached chunks are as good in the child.
// - No worker thread (a loader's, a pool's) may be the first to initialise a function-local
//   static: a thread inside that first initialisation at the fork leaves the static's guard
//   taken in the child, whose first use then waits for ever. Values the workers need are
//   asked for each time (page_bytes()), made when the library is loaded, or made on the
//   caller's thread before any worker starts (the CUDA device count, when a loader is made).
//   A static whose own fork handler uses it (the shared pool's holder, the chunk caches'
//   registry) is safe too: the handler, run before every fork, waits out its first
//   initialisation.
#pragma once

#include <cstdint>
#include <string_view>

namespace mmt::detail {

// How many fork()s separate the calling process from the one that loaded the library: 0
// there, one more in each child (a pthread_atfork child handler, registered at load). An
// object records it when made; another value later means it came through fork().
uint64_t fork_generation() noexcept;

inline bool inherited_through_fork(uint64_t generation) noexcept { return generation != fork_generation(); }

// In the child of a fork: lets `object` (the parent's: a loader, a writer, the shared pool)
// go without destroying it, since its destructor would wait for threads that are not here,
// yet keeps it reachable so that a leak checker does not report it. Its memory is a copy of
// the parent's.
void abandon_after_fork(const void* object) noexcept;

// Throws ValueError: `what` (a "Loader", a "DatasetWriter") was made before this process was
// forked from its parent, and its threads stayed there; `remedy` says what to do instead.
[[noreturn]] void throw_inherited_through_fork(std::string_view what, std::string_view remedy);

}  // namespace mmt::detail
