// The writer's temporary files: their names, and the removal of those a killed writer left.
//
// A dataset is written to `<target>.tmp-<pid>-<host>-<16 hex digits>` in the target's folder
// and renamed onto the target by finish(). A writer that fails removes its temporary; one
// killed by SIGKILL (or a power cut) cannot. The next writer of the same target removes them:
// a temporary of that target whose process is gone. The name carries the host so that, in a
// folder shared between machines (NFS), a writer never judges another machine's process by
// its own process table: only temporaries of this host are considered. A process id reused
// by a live process keeps its temporary (it is kept, never wrongly removed). A target whose
// name is too long to take the suffix within NAME_MAX goes in as its first 100 bytes, "~" and a
// hash of the whole name: any name the target itself may have can be written.
#pragma once

#include <cstddef>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "file_io.h"

namespace mmt::detail {

// A fresh temporary name for `target`, in the target's folder.
std::string temporary_path_for(const std::string& target);

// Creates a fresh temporary for `target` (temporary_path_for) and sets `temp_path` to it. A
// missing folder is reported by the target's name ("cannot create out/x.mmt: its folder out
// does not exist"), not by the temporary's.
io::WritableFile create_temporary(const std::string& target, std::string& temp_path);

// Removes the temporaries of `target` left by dead processes of this host; returns how many.
// Best effort: a folder that cannot be listed or a file that cannot be removed is skipped,
// never an error (housekeeping must not fail a write).
int remove_dead_temporaries(const std::string& target);

// Called between the steps of a write below: after each kCheckpointBytes written, and before
// the rename that publishes (before the first, for StagedFiles). A caller that must stop (mmt
// on Ctrl-C) throws from it; the write then undoes itself as after any failure: the
// temporary is removed and the target keeps what it had. Empty: no checkpoints.
using WriteCheckpoint = std::function<void()>;
inline constexpr int64_t kCheckpointBytes = int64_t{16} << 20;

// Writes `pieces`, in order, to a fresh temporary beside `target`, fsyncs and closes it, and
// returns its path: the first half of write_file_atomically, for a caller that puts several
// files in place together. On failure the temporary is removed. Removes the dead temporaries
// of `target` first.
std::string write_temporary(const std::string& target, std::initializer_list<std::span<const std::byte>> pieces,
                            const WriteCheckpoint& checkpoint = {});
// The same for bytes made while they are written, so that a file larger than memory needs
// none of it at once: next() gives the next bytes (valid until it is called again; never
// empty before the end), and an empty span once there are no more. What next() throws undoes
// the write as any failure.
using NextBytes = std::function<std::span<const std::byte>()>;
std::string write_temporary_streamed(const std::string& target, const NextBytes& next,
                                     const WriteCheckpoint& checkpoint = {});

// The same for a file written out of order: its `nbytes` are reserved on the disk, then
// fill(write_at) writes each of them once, write_at(offset, bytes) putting bytes at that
// offset, in any order (ValueError for bytes past the end, or, after fill(), a total other
// than nbytes); a checkpoint comes after each kCheckpointBytes written. What fill() throws
// undoes the write as any failure.
using WriteAt = std::function<void(int64_t offset, std::span<const std::byte> bytes)>;
std::string write_temporary_positioned(const std::string& target, int64_t nbytes,
                                       const std::function<void(const WriteAt&)>& fill,
                                       const WriteCheckpoint& checkpoint = {});

// Writes `pieces`, in order, to a temporary beside `target`, fsyncs it and renames it onto
// `target` (replacing an existing regular file only when `replace`; a device, pipe, folder
// or symbolic link there is refused whatever `replace` says): the file appears complete or
// not at all. Removes the dead temporaries of `target` first, as DatasetWriter does. On
// failure the temporary is removed, `target` keeps what it had, and the IoError names the
// step, the file and the system's reason. For files written whole (.npy files, raw values);
// datasets go through DatasetWriter.
void write_file_atomically(const std::string& target, std::initializer_list<std::span<const std::byte>> pieces,
                           bool replace, const WriteCheckpoint& checkpoint = {});

// Files that change together, all or none (`mmt export`'s .npy files). stage() writes each to
// a temporary beside its target and fsyncs it; until publish() no target has changed, so a
// failure while writing (a damaged chunk, a full disk) leaves every target as it was. publish()
// renames them into place in the order staged. If a rename fails, the ones already in place are
// taken back before the IoError goes on: a created file is removed, and a replaced one gets its
// old content back from a hard link made just before its rename (on a file system without hard
// links that one cannot be restored, and the error says so). Destroyed before publish(), it
// removes its temporaries.
class StagedFiles {
 public:
  // With `replace`, existing regular files are replaced; without it, a target that exists
  // (even one that appeared after stage()) is refused by the rename.
  explicit StagedFiles(bool replace, WriteCheckpoint checkpoint = {})
      : replace_(replace), checkpoint_(std::move(checkpoint)) {}
  ~StagedFiles();
  StagedFiles(const StagedFiles&) = delete;
  StagedFiles& operator=(const StagedFiles&) = delete;

  void stage(const std::string& target, std::initializer_list<std::span<const std::byte>> pieces);
  // The same, the bytes made while they are written (write_temporary_streamed).
  void stage_streamed(const std::string& target, const NextBytes& next);
  // The same, the bytes written out of order (write_temporary_positioned).
  void stage_positioned(const std::string& target, int64_t nbytes, const std::function<void(const WriteAt&)>& fill);
  void publish();

 private:
  struct Staged {
    std::string target;
    std::string temporary;  // empty once renamed onto the target
  };
  bool replace_;
  WriteCheckpoint checkpoint_;
  std::vector<Staged> staged_;
};

}  // namespace mmt::detail
