#include "temp_files.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string_view>
#include <utility>

#include "checksum.h"
#include "file_io.h"
#include "mmtensor/error.h"

namespace mmt::detail {
namespace {

namespace fs = std::filesystem;

constexpr size_t kRandomDigits = 16;
// A file name is at most 255 bytes (NAME_MAX on Linux's file systems). A temporary's name adds
// ".tmp-<pid>-<host>-<16 hex digits>": at most 5 + 10 + 1 + kMaxHostTag + 1 + 16 = 97 bytes.
// A target name longer than kMaxNameKept is cut to that, plus "~" and a hash of the whole name
// (so the temporaries of two long names that share a beginning stay apart): 117 + 97 < 255.
constexpr size_t kMaxHostTag = 64;  // HOST_NAME_MAX on Linux
constexpr size_t kMaxNameKept = 100;

std::string random_suffix() {
  std::random_device device;
  uint64_t bits = (static_cast<uint64_t>(device()) << 32) ^ device();
  char text[kRandomDigits + 1];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(bits));
  return text;
}

// The host name as it goes into a file name: letters, digits, '.' and '-' (others as '_').
const std::string& host_tag() {
  static const std::string tag = [] {
    char name[256] = {};
    if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return std::string("localhost");
    std::string text(name, ::strnlen(name, kMaxHostTag));
    for (char& c : text)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') c = '_';
    return text;
  }();
  return tag;
}

// The target's folder (with its trailing '/', or empty) and file name.
std::pair<std::string, std::string> split_path(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return {"", path};
  return {path.substr(0, slash + 1), path.substr(slash + 1)};
}

// The part of a temporary's name that stands for its target: the target's file name, or for a
// name that would take the temporary past NAME_MAX, its first kMaxNameKept bytes (not cutting a
// UTF-8 sequence) and "~<16 hex digits of its hash>". The same target always gives the same
// stem, so remove_dead_temporaries finds what an earlier writer of that target left.
std::string temporary_stem(const std::string& name) {
  if (name.size() <= kMaxNameKept + 1 + kRandomDigits) return name;
  size_t kept = kMaxNameKept;
  while (kept > 0 && (static_cast<unsigned char>(name[kept]) & 0xC0) == 0x80) --kept;
  char hash[kRandomDigits + 1];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(checksum64(name.data(), name.size())));
  return str(std::string_view(name).substr(0, kept), "~", hash);
}

// The pid of a temporary of `prefix` ("<target name>.tmp-") made on this host, or -1 for any
// other name.
long temporary_owner(std::string_view name, std::string_view prefix) {
  if (name.substr(0, prefix.size()) != prefix) return -1;
  name.remove_prefix(prefix.size());
  long pid = 0;
  size_t digits = 0;
  while (digits < name.size() && digits < 10 && std::isdigit(static_cast<unsigned char>(name[digits])))
    pid = pid * 10 + (name[digits++] - '0');
  if (digits == 0 || digits >= name.size() || name[digits] != '-') return -1;
  name.remove_prefix(digits + 1);
  const std::string& host = host_tag();
  if (name.size() != host.size() + 1 + kRandomDigits || name.substr(0, host.size()) != host ||
      name[host.size()] != '-')
    return -1;
  for (char c : name.substr(host.size() + 1))
    if (!std::isxdigit(static_cast<unsigned char>(c))) return -1;
  return pid;
}

// Removes a temporary on a path that already failed: the first failure is the one to report,
// and one left behind is swept by the next writer of its target.
void remove_quietly(const std::string& path) noexcept {
  try {
    io::remove_file(path);
  } catch (...) {
  }
}

}  // namespace

std::string temporary_path_for(const std::string& target) {
  const auto [folder, name] = split_path(target);
  return str(folder, temporary_stem(name), ".tmp-", ::getpid(), "-", host_tag(), "-", random_suffix());
}

io::WritableFile create_temporary(const std::string& target, std::string& temp_path) {
  temp_path = temporary_path_for(target);
  try {
    return io::WritableFile::create(temp_path);
  } catch (const IoError& e) {
    if (e.errno_value() != ENOENT && e.errno_value() != ENOTDIR) throw;
    const std::string folder = io::parent_dir(target);
    std::error_code error;
    // A folder that exists yet answers ENOENT to a new file: /proc or /sys, say.
    if (e.errno_value() == ENOENT && fs::is_directory(folder, error))
      throw IoError(str("cannot create ", target, ": the folder ", folder, " takes no new files (", e.what(), ")"),
                    e.errno_value());
    throw IoError(str("cannot create ", target, ": its folder ", folder,
                      e.errno_value() == ENOENT ? " does not exist" : " is not a folder"),
                  e.errno_value());
  }
}

int remove_dead_temporaries(const std::string& target) {
  const std::string prefix = temporary_stem(split_path(target).second) + ".tmp-";
  const fs::path folder = io::parent_dir(target);
  std::error_code error;
  fs::directory_iterator it(folder, error);
  if (error) return 0;
  int removed = 0;
  for (; it != fs::directory_iterator(); it.increment(error)) {
    if (error) break;
    const long pid = temporary_owner(it->path().filename().native(), prefix);
    if (pid <= 0 || pid == ::getpid()) continue;
    // ESRCH: no such process. EPERM means a live process of another user: keep its file.
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    if (::unlink(it->path().c_str()) == 0) ++removed;
  }
  return removed;
}

namespace {

// `pieces` one after another, as a streamed write asks for them; empty ones skipped (an
// empty span is the end). The list must outlive the write.
NextBytes each_piece(std::initializer_list<std::span<const std::byte>> pieces) {
  return [next_piece = pieces.begin(), end = pieces.end()]() mutable {
    while (next_piece != end && next_piece->empty()) ++next_piece;
    return next_piece == end ? std::span<const std::byte>() : *next_piece++;
  };
}

}  // namespace

std::string write_temporary(const std::string& target, std::initializer_list<std::span<const std::byte>> pieces,
                            const WriteCheckpoint& checkpoint) {
  return write_temporary_streamed(target, each_piece(pieces), checkpoint);
}

namespace {

// A fresh temporary beside `target` (the dead ones of `target` removed first), written by
// write(file), then fsynced and closed; removed if anything fails. Returns its path.
std::string write_temporary_with(const std::string& target, const std::function<void(io::WritableFile&)>& write) {
  remove_dead_temporaries(target);  // what writers of this target killed earlier left
  std::string temp;
  io::WritableFile file = create_temporary(target, temp);
  try {
    write(file);
    file.fsync();
    file.close();
  } catch (...) {
    file = io::WritableFile();
    remove_quietly(temp);
    throw;
  }
  return temp;
}

}  // namespace

std::string write_temporary_streamed(const std::string& target, const NextBytes& next,
                                     const WriteCheckpoint& checkpoint) {
  return write_temporary_with(target, [&](io::WritableFile& file) {
    for (std::span<const std::byte> piece = next(); !piece.empty(); piece = next()) {
      for (size_t done = 0; done < piece.size();) {
        const size_t n = checkpoint ? std::min<size_t>(piece.size() - done, kCheckpointBytes) : piece.size() - done;
        file.write(piece.data() + done, static_cast<int64_t>(n));
        done += n;
        if (checkpoint) checkpoint();
      }
    }
  });
}

std::string write_temporary_positioned(const std::string& target, int64_t nbytes,
                                       const std::function<void(const WriteAt&)>& fill,
                                       const WriteCheckpoint& checkpoint) {
  return write_temporary_with(target, [&](io::WritableFile& file) {
    file.reserve(nbytes);
    int64_t since_checkpoint = 0, written = 0;
    fill([&](int64_t offset, std::span<const std::byte> bytes) {
      MMT_CHECK(offset >= 0 && static_cast<int64_t>(bytes.size()) <= nbytes - offset, ValueError,
                "write_temporary_positioned: ", bytes.size(), " bytes at offset ", offset, " go past the file's ",
                nbytes, " bytes");
      file.write_at(offset, bytes.data(), static_cast<int64_t>(bytes.size()));
      written += static_cast<int64_t>(bytes.size());
      since_checkpoint += static_cast<int64_t>(bytes.size());
      if (checkpoint && since_checkpoint >= kCheckpointBytes) {
        since_checkpoint = 0;
        checkpoint();
      }
    });
    MMT_CHECK(written == nbytes, ValueError, "write_temporary_positioned: ", written, " bytes written of ", target,
              "'s ", nbytes, ": the rest would be left as zeros");
  });
}

void write_file_atomically(const std::string& target, std::initializer_list<std::span<const std::byte>> pieces,
                           bool replace, const WriteCheckpoint& checkpoint) {
  io::check_output_target(target, true, "");  // never a device, pipe, folder or link
  const std::string temp = write_temporary(target, pieces, checkpoint);
  try {
    if (checkpoint) checkpoint();
    io::rename_file(temp, target, replace);
  } catch (...) {
    remove_quietly(temp);
    throw;
  }
}

// ---------------------------------------------------------------------------------------------
StagedFiles::~StagedFiles() {
  for (const Staged& s : staged_)
    if (!s.temporary.empty()) remove_quietly(s.temporary);
}

void StagedFiles::stage(const std::string& target, std::initializer_list<std::span<const std::byte>> pieces) {
  stage_streamed(target, each_piece(pieces));
}

void StagedFiles::stage_streamed(const std::string& target, const NextBytes& next) {
  io::check_output_target(target, replace_, "it is kept (this write replaces no file)");  // nor a device or link
  staged_.push_back({target, ""});  // reserved first: the push cannot fail after the write
  try {
    staged_.back().temporary = write_temporary_streamed(target, next, checkpoint_);
  } catch (...) {
    staged_.pop_back();
    throw;
  }
}

void StagedFiles::stage_positioned(const std::string& target, int64_t nbytes,
                                   const std::function<void(const WriteAt&)>& fill) {
  io::check_output_target(target, replace_, "it is kept (this write replaces no file)");
  staged_.push_back({target, ""});
  try {
    staged_.back().temporary = write_temporary_positioned(target, nbytes, fill, checkpoint_);
  } catch (...) {
    staged_.pop_back();
    throw;
  }
}

void StagedFiles::publish() {
  if (checkpoint_) checkpoint_();  // the last moment to stop with every target as it was
  struct Placed {
    std::string target;
    std::string previous;  // a hard link to the file it replaced; empty if it created one
    bool previous_lost = false;
  };
  std::vector<Placed> placed;
  placed.reserve(staged_.size());
  try {
    for (Staged& s : staged_) {
      Placed p{s.target, "", false};
      struct stat st {};
      if (replace_ && ::lstat(s.target.c_str(), &st) == 0) {
        p.previous = temporary_path_for(s.target);
        if (::link(s.target.c_str(), p.previous.c_str()) != 0) {
          p.previous.clear();
          p.previous_lost = true;
        }
      }
      try {
        io::rename_file(s.temporary, s.target, replace_);
      } catch (...) {
        if (!p.previous.empty()) remove_quietly(p.previous);
        throw;
      }
      s.temporary.clear();
      placed.push_back(std::move(p));
    }
  } catch (...) {
    // Taken back newest first; what cannot be taken back is named in the error.
    std::string lost;
    for (auto it = placed.rbegin(); it != placed.rend(); ++it) {
      if (!it->previous.empty()) {
        if (::rename(it->previous.c_str(), it->target.c_str()) != 0)
          lost += str("; ", it->target, " keeps its new content (its old one is at ", it->previous, ")");
      } else if (it->previous_lost) {
        lost += str("; ", it->target, " keeps its new content (no hard link could keep the old one)");
      } else {
        remove_quietly(it->target);
      }
    }
    if (lost.empty()) throw;
    try {
      throw;
    } catch (const IoError& e) {
      throw IoError(str(e.what(), lost), e.errno_value());
    }
  }
  for (const Placed& p : placed)
    if (!p.previous.empty()) remove_quietly(p.previous);
  // The renames survive a power cut: each folder fsynced once.
  std::vector<std::string> folders_synced;
  for (const Placed& p : placed) {
    std::string folder = io::parent_dir(p.target);
    if (std::find(folders_synced.begin(), folders_synced.end(), folder) != folders_synced.end()) continue;
    io::fsync_parent_dir(p.target);
    folders_synced.push_back(std::move(folder));
  }
}

}  // namespace mmt::detail
