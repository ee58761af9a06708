// DatasetWriter: builds an mmtensor dataset file (docs/FORMAT.md) record by record.
//
// Records are appended in order; the writer groups them into chunks, compresses full chunks
// on worker threads (when a codec is set) and writes them to a temporary file in the target's
// folder. finish() writes the schema, chunk table and footer, fsyncs the file, renames it onto
// the target path and fsyncs the folder: the dataset appears at its path complete or not at
// all. A writer destroyed, aborted or failing before finish() returns leaves the target path
// as it was (the old file, or nothing) and removes its temporary file.
//
// Thread safety: one thread drives a writer; stats() may be read from another thread.
// Errors name the record and field ("record 17, field 'image': expected shape [1, 28, 28],
// got [28, 28]"); I/O errors name the step and path ("fsync of /data/x.mmt.tmp-1234: ...").
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "mmtensor/codec.h"
#include "mmtensor/schema.h"
#include "mmtensor/tensor.h"

namespace mmt {

inline constexpr int kMaxWriterThreads = 1024;
// The longest field name a writer writes: NAME.npy (what `mmt export` writes) must fit a file
// name, 255 bytes on Linux's file systems. Readers open names up to 1024 bytes (FORMAT.md).
inline constexpr size_t kMaxWrittenFieldNameBytes = 251;

struct WriterOptions {
  CodecSpec codec{};                  // per-chunk codec, none by default
  // Target decoded bytes per chunk. For an uncompressed file of fixed fields only, rounded to
  // whole multiples of the alignment (records back to back: column() is then one view), when
  // such a multiple holds at most 64 MiB of records. With a codec, at least the alignment:
  // every chunk starts on an alignment boundary, so smaller targets would pad the file with
  // more zeros than data.
  int64_t chunk_bytes = 1 << 20;
  // > 0: this many records per chunk (overrides chunk_bytes). Taken as given, but for the
  // limits of a compressed chunk: with a codec, fixed fields get at most 1 GiB of records a
  // chunk, and a record or batch that would take a chunk with a ragged field past 1 GiB
  // decoded is a ValueError (nothing of it written). An uncompressed file of fixed fields keeps
  // its records back to back (one column view, the gather's fastest path) only when count *
  // record stride is a multiple of the alignment and such a run is at most 64 MiB; otherwise
  // column() of many chunks is a copy (Dataset::column_is_view() tells).
  int64_t chunk_records = 0;
  int64_t alignment = 4096;           // chunk data alignment in the file; a power of two, 64 to 16 MiB
  int threads = 0;                    // compression threads (<= kMaxWriterThreads); 0 = one per
                                      // CPU the process may use (affinity, cgroup CPU quota)
  bool overwrite = false;             // replace an existing file at the path (atomically)
  Metadata metadata{};                // stored with the dataset
  // When set, asked by the thread in append() or finish() about every 0.1 s while it waits
  // for chunks being compressed, and once more just before finish() publishes the file; true
  // stops the writer: it is aborted (the path keeps what it had; a large chunk being
  // compressed is given up within a MiB of its input) and the call throws WriteCancelled.
  // How `mmt pack` and mmtensor.pack() act on a Ctrl-C that comes while the last chunks are
  // compressed.
  std::function<bool()> cancelled{};
};

// Thrown by DatasetWriter's append and finish when WriterOptions::cancelled said to stop.
class WriteCancelled : public Error {
 public:
  using Error::Error;
};

struct WriteStats {
  int64_t records = 0;
  int64_t chunks = 0;
  int64_t bytes_in = 0;   // bytes of record values appended (decoded)
  int64_t bytes_out = 0;  // bytes written to the file so far
  double seconds = 0;     // since the writer was created
};

class DatasetWriter {
 public:
  // Checks the schema and options and creates the temporary file. Throws ValueError for bad
  // options, IoError when the folder is not writable, and IoError when the target exists and
  // options.overwrite is false.
  static DatasetWriter create(const std::string& path, Schema schema, WriterOptions options = {});

  DatasetWriter(DatasetWriter&&) noexcept;
  DatasetWriter& operator=(DatasetWriter&&) noexcept;
  ~DatasetWriter();  // abort() unless finish() succeeded

  // Appends one record: one tensor per field, in schema order, of the field's dtype and
  // shape (any strides; written in the field's storage order).
  void append(std::span<const Tensor> values);
  void append(std::initializer_list<Tensor> values) { append(std::span<const Tensor>(values.begin(), values.size())); }
  // Appends one record given by field name; every field must be present, and a name the
  // schema lacks is refused (the message lists the fields it has).
  void append(const std::map<std::string, Tensor, std::less<>>& values);
  // Appends B records at once: one tensor per field, in schema order, each [B, ...field
  // shape] (any strides), the same B for every field. The same file as B calls of append()
  // with values[f].select(0, i), made with one validation and one copy per field and chunk
  // instead of per record: for small records (a 28x28 image) the per-record work is most
  // of an uncompressed pack. A bad batch (wrong dtype, shape or B) throws ValueError naming
  // the field before anything is appended, and leaves the writer usable; an empty batch (B is
  // 0) is checked as well, and a good one appends nothing.
  // A ragged field's tensor is [B, ...] too, so every record of the batch gets the same
  // extents (a [B, L] tensor for a [-1] field: B values of length L); records of different
  // extents need append().
  void append_batch(std::span<const Tensor> values);
  void append_batch(std::initializer_list<Tensor> values) {
    append_batch(std::span<const Tensor>(values.begin(), values.size()));
  }
  // Appends B records at once, ragged fields in PyTorch's jagged layout (the values and
  // offsets of torch.nested.nested_tensor_from_jagged; Arrow's and Parquet's strings and lists
  // are laid out so): where offsets[f] is defined, values[f] holds field f's records back to
  // back along dimension 0, [N, ...shape[1:]], and offsets[f] ([B + 1], int64 or int32, not
  // decreasing, within [0, N]; it need not start at 0) says where each lies: record i is
  // values[f][offsets[f][i] : offsets[f][i + 1]]. Only a field whose one variable dimension
  // is its first may be given so (tokens [-1], bytes [-1], boxes [-1, 4]). A field whose
  // offsets[f] is undefined is given as for append_batch(values): [B, ...]. `offsets` has one
  // tensor per field, or none at all (every field then [B, ...]).
  // The same file as B calls of append(), made with one validation and one copy per field and
  // chunk: a million short strings pack as a few large copies. A bad batch (a wrong dtype,
  // shape or B, offsets out of order or past their values) throws ValueError naming the field
  // before anything is appended, and leaves the writer usable.
  void append_batch(std::span<const Tensor> values, std::span<const Tensor> offsets);
  void append_batch(std::initializer_list<Tensor> values, std::initializer_list<Tensor> offsets) {
    append_batch(std::span<const Tensor>(values.begin(), values.size()),
                 std::span<const Tensor>(offsets.begin(), offsets.size()));
  }

  // Sets (or replaces) a metadata entry; key and value must be valid UTF-8. An entry that
  // would take the schema block past what readers open (64 MiB of JSON, or 2^20 JSON values;
  // docs/FORMAT.md) throws ValueError here, naming the key, and is not kept.
  void set_metadata(std::string key, std::string value);
  int64_t size() const;  // records appended so far
  // Whether records may still be appended and finish() called: false once finished, aborted,
  // failed (past validation: a full disk, say) or moved from.
  bool is_open() const;
  const Schema& schema() const;
  const std::string& path() const;
  WriteStats stats() const;

  // Publishes the file atomically and returns the final figures. Should the schema block
  // still be one a reader would refuse (set_metadata checks each entry as it comes), finish()
  // throws ValueError first and leaves the writer open: remove or shorten metadata and call
  // finish() again. On any later failure the writer is aborted (the path keeps what it had: the old
  // file, or nothing; the temporary is removed) and the error is rethrown.
  WriteStats finish();
  // Discards everything written; the target path is left as it was. Never throws. After
  // finish() it does nothing (the published file stays).
  void abort() noexcept;
  // After finish(), abort(), or a failure past validation (a full disk, say), append,
  // append_batch, set_metadata and finish throw ValueError saying that the writer is
  // finished, or aborted and why; the writer is then only good for size(), schema(), path()
  // and stats().

  struct Impl;

 private:
  explicit DatasetWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mmt
