#include "interrupt.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>

#include <unistd.h>

#include "mmt_commands.h"

namespace mmt::tool {
namespace {

// Touched by the signal handler: lock-free atomics, which are async-signal-safe.
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free);
std::atomic<bool> g_interrupted{false};
std::atomic<int> g_stop_signal{0};  // the first signal that asked to stop
// Which of StopSignals::kSignals the handler is installed for (set before installing it).
std::array<std::atomic<bool>, StopSignals::kSignals.size()> g_caught{};

extern "C" void on_stop_signal(int signal_number) {
  int none = 0;
  g_stop_signal.compare_exchange_strong(none, signal_number);
  g_interrupted.store(true);
  // A second stop signal of any kind kills at once (SA_RESETHAND resets only this one):
  // signal() is async-signal-safe.
  for (size_t i = 0; i < StopSignals::kSignals.size(); ++i)
    if (g_caught[i].load()) std::signal(StopSignals::kSignals[i], SIG_DFL);
}

// QuitSignals' message, in storage never freed (a handler on another thread may still be
// writing it when QuitSignals is destroyed), and whether it is still to be said: the first
// handler to run takes it, so a second signal, or two at once on two threads, say it once.
std::array<char, 4096> g_quit_message{};
size_t g_quit_message_size = 0;
std::atomic<bool> g_quit_message_due{false};

extern "C" void on_quit_signal(int signal_number) {
  // The default action back for all four: a signal pending behind this one (delivered lowest
  // number first as the handler returns) ends the process too, instead of running it again.
  for (const int stop_signal : StopSignals::kSignals) std::signal(stop_signal, SIG_DFL);  // async-signal-safe
  if (g_quit_message_due.exchange(false)) {
    for (size_t done = 0; done < g_quit_message_size;) {  // write() is async-signal-safe; iostreams are not
      const ssize_t wrote = ::write(STDERR_FILENO, g_quit_message.data() + done, g_quit_message_size - done);
      if (wrote <= 0) break;
      done += static_cast<size_t>(wrote);
    }
  }
  // Raised again, the signal is delivered as the handler returns, and ends the process as if
  // no handler had been there (the shell reports it).
  std::raise(signal_number);
}

}  // namespace

Interrupted::Interrupted(int signal_number)
    : Error(detail::str("interrupted by signal ", signal_number)), signal_number_(signal_number) {}

StopSignals::StopSignals() {
  g_interrupted.store(false);  // a new write starts uninterrupted
  g_stop_signal.store(0);
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  action.sa_flags = SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < kSignals.size(); ++i) {
    sigaction(kSignals[i], nullptr, &old_[i]);
    g_caught[i].store(old_[i].sa_handler != SIG_IGN);
    if (g_caught[i].load()) sigaction(kSignals[i], &action, nullptr);
  }
}

StopSignals::~StopSignals() {
  for (size_t i = 0; i < kSignals.size(); ++i) {
    sigaction(kSignals[i], &old_[i], nullptr);
    g_caught[i].store(false);
  }
}

QuitSignals::QuitSignals(const std::string& message) {
  assert(!g_quit_message_due.load());  // one at a time
  g_quit_message_size = std::min(message.size(), g_quit_message.size());
  std::memcpy(g_quit_message.data(), message.data(), g_quit_message_size);
  g_quit_message_due.store(true);  // after the text: a handler that sees it due reads all of it
  struct sigaction action {};
  action.sa_handler = on_quit_signal;
  action.sa_flags = SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  for (int signal_number : StopSignals::kSignals) sigaddset(&action.sa_mask, signal_number);  // one message
  for (size_t i = 0; i < StopSignals::kSignals.size(); ++i) {
    sigaction(StopSignals::kSignals[i], nullptr, &old_[i]);
    if (old_[i].sa_handler != SIG_IGN) sigaction(StopSignals::kSignals[i], &action, nullptr);
  }
}

QuitSignals::~QuitSignals() {
  for (size_t i = 0; i < StopSignals::kSignals.size(); ++i) sigaction(StopSignals::kSignals[i], &old_[i], nullptr);
  g_quit_message_due.store(false);
}

const std::atomic<bool>& StopSignals::flag() { return g_interrupted; }

int StopSignals::signal_number() { return g_stop_signal.load(); }

void StopSignals::check() {
  if (g_interrupted.load(std::memory_order_relaxed)) throw Interrupted(g_stop_signal.load());
}

std::string not_written(const std::vector<std::string>& paths) {
  std::string text;
  int existing = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    if (i > 0) text.append(i + 1 == paths.size() ? " and " : ", ");
    text.append(paths[i]);
    std::error_code ec;
    if (std::filesystem::exists(std::filesystem::symlink_status(paths[i], ec))) ++existing;
  }
  text.append(paths.size() == 1 ? " was not written" : " were not written");
  if (existing == 1) text.append("; the file already there was left as it was");
  if (existing > 1) text.append("; the files already there were left as they were");
  return text;
}

void exit_interrupted(const std::string& command, int signal_number, const std::string& what) {
  std::cerr << command << ": interrupted: " << printable_message(what) << "\n";
  throw ExitStatus{exit_status_for_signal(signal_number)};
}

}  // namespace mmt::tool
