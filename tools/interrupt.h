// Ctrl-C and the other signals that ask `mmt` to stop, while a subcommand writes files
// (pack's dataset, get's --npy/--raw file, export's .npy files).
//
// INT (Ctrl-C), TERM, HUP (the terminal or ssh connection went away) and QUIT set a flag
// that the writing code checks between its steps; the step that sees it throws Interrupted,
// and the write cleans up as after any failure: its temporaries are removed and the output
// paths keep what they had. A second such signal, of any of the four, kills at once: the outputs
// are untouched then too, only a temporary may remain (the next writer of its target removes
// it). A signal the parent set to be ignored (nohup, a background job) stays ignored: the user
// asked for the command to survive it.
#pragma once

#include <array>
#include <atomic>
#include <csignal>
#include <string>
#include <vector>

#include "mmtensor/error.h"

namespace mmt::tool {

// Thrown by StopSignals::check() once a stop signal came.
class Interrupted : public Error {
 public:
  explicit Interrupted(int signal_number);
  int signal_number() const { return signal_number_; }

 private:
  int signal_number_;
};

// Catches the stop signals for its lifetime (one at a time in a process), then restores what
// was there before.
class StopSignals {
 public:
  static constexpr std::array<int, 4> kSignals{SIGINT, SIGTERM, SIGHUP, SIGQUIT};

  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // Becomes true at the first stop signal (PackOptions::cancel watches it).
  static const std::atomic<bool>& flag();
  // The first stop signal's number, or 0 while none came.
  static int signal_number();
  // Throws Interrupted when a stop signal came: a checkpoint between the steps of a write.
  static void check();

 private:
  std::array<struct sigaction, kSignals.size()> old_{};
};

// For a step that has written nothing yet (pack reading its inputs, which may take minutes:
// an HDF5 file decoded, an .npz inflated): a stop signal ends the process at once, as it would
// without a handler, but first says `message` on stderr ("mmt pack: interrupted while reading
// its inputs; out.mmt was not written"), so a Ctrl-C is never silent. What the step made is
// scratch the kernel removes with the process (unlinked temporaries). Ignored signals stay
// ignored. One at a time in a process, and not together with StopSignals.
class QuitSignals {
 public:
  explicit QuitSignals(const std::string& message);  // up to 4 KiB of it
  ~QuitSignals();
  QuitSignals(const QuitSignals&) = delete;
  QuitSignals& operator=(const QuitSignals&) = delete;

 private:
  std::array<struct sigaction, StopSignals::kSignals.size()> old_{};
};

// "out.npy was not written", "a.npy and b.npy were not written", then "; the file already
// there was left as it was" when one is there: what an interrupted write left at its outputs.
std::string not_written(const std::vector<std::string>& paths);

// Ends `command` ("mmt get") after an interruption: says on stderr what was not written
// ("mmt get: interrupted: out.npy was not written") and throws ExitStatus with 128 + the
// signal's number, as shells report a process a signal stopped.
[[noreturn]] void exit_interrupted(const std::string& command, int signal_number, const std::string& what);

}  // namespace mmt::tool
