// Internal pieces of the .npy reader and writer shared with the .npz reader.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mmtensor/numpy_io.h"
#include "mmtensor/storage.h"
#include "mmtensor/tensor.h"

namespace mmt::detail {

// The first bytes of every .npy file (and .npz member).
inline constexpr char kNpyMagic[] = "\x93NUMPY";
inline constexpr size_t kNpyMagicBytes = 6;

// The preamble and the header dict of an array (C order, or Fortran order: its data then
// follows column-major), padded with spaces and a newline so the data starts on a 64-byte
// boundary, as numpy writes it.
std::string npy_header_bytes(ScalarType dtype, IntArrayRef shape, bool fortran_order = false);

// Where an .npy's bytes came from, for the advice on bytes after the data.
enum class NpySource { File, ArchiveMember, Buffer };

// Throws FormatError unless `available_bytes`, what follows the header in the file (or the
// .npz member, or the caller's buffer), are exactly the data the header declares. Bytes after
// the data are refused although np.load ignores them (why: check_npy_data_size in npy.cc);
// the message counts them and says how to remove them from that source.
void check_npy_data_size(const NpyHeader& header, uint64_t available_bytes, std::string_view what,
                         NpySource source = NpySource::File);

// The tensor described by `header` whose data starts at byte `data_offset` of `storage`
// (which must hold header.data_nbytes bytes from there). A view over `storage` when the data
// is in native byte order and aligned for its dtype; otherwise a host copy in native order.
// Bool data is checked to hold only 0 and 1.
Tensor npy_tensor_over(const UntypedStorage& storage, int64_t data_offset,
                       const NpyHeader& header, std::string_view what);

// A host copy of the elements at `data`, in native order, with the header's layout.
Tensor npy_tensor_copy(const std::byte* data, const NpyHeader& header, std::string_view what);

// Whether npy_tensor_over() gives a view (rather than a copy) of the data at `data`, which
// lies at byte `data_offset` of its storage: native byte order, aligned for the dtype, and
// not empty.
bool npy_viewable(const std::byte* data, int64_t data_offset, const NpyHeader& header);

// A deflated .npz member read front to back, a piece at a time, for a caller that must not
// inflate it whole into memory (the packer). Reads are serialised; one that starts before the
// previous one ended inflates again from the member's start. The member's size and CRC-32 are
// checked as its last byte is read: FormatError, or ChecksumError, naming the member.
class DeflatedMember {
 public:
  DeflatedMember(UntypedStorage archive, std::span<const std::byte> deflated, uint64_t inflated_bytes,
                 uint32_t crc32, std::string what);
  ~DeflatedMember();
  DeflatedMember(const DeflatedMember&) = delete;
  DeflatedMember& operator=(const DeflatedMember&) = delete;

  // Inflated bytes [offset, offset + n) of the member, into `dst`.
  void read(int64_t offset, std::byte* dst, int64_t n);
  // Inflates (and drops) what the reads so far left after their end, so that the member's
  // size and CRC-32 are checked: for a reader that stops short of the end (a pack of one
  // shard), which would otherwise never check them.
  void check_rest();

 private:
  struct Stream;
  void skip_to(uint64_t offset);  // mutex_ held; inflates and drops up to `offset`
  std::mutex mutex_;
  std::unique_ptr<Stream> stream_;
};

// An array's values where they lie, before any copy: header.data_nbytes bytes from byte
// `data_offset` of `storage`, in the header's byte order, aligned for the dtype or not; or,
// for a deflated member given to the packer, from byte `data_offset` of `deflated`. A caller
// too short of memory to copy a large array whole (the packer) converts it a few records at
// a time; npy_tensor_over() makes it a tensor.
struct NpyValues {
  std::string name;  // an .npz member's array name; empty for an .npy file
  std::string what;  // the source in error messages: a path, or "archive.npz:x.npy"
  NpyHeader header;
  UntypedStorage storage;  // the file's mapping, or an inflated member's host buffer
  std::shared_ptr<DeflatedMember> deflated;  // instead of `storage`, when set
  int64_t data_offset = 0;
};

// A Fortran-order array's values that cannot be used where they lie (deflated in an .npz,
// big-endian, or unaligned), converted to native byte order in an unnamed temporary file
// ($TMPDIR, or /tmp) that is mapped read-only. `read(offset, dst, n)` gives bytes
// [offset, offset + n) of the values as they are. Why a file: in Fortran order a record's
// values lie across the whole array, so they cannot be converted a batch of records at a
// time, and an array larger than memory must still pack. On a tmpfs (/tmp on some systems)
// the file is in memory after all: set TMPDIR to a folder on a disk. The space is reserved
// first (fallocate). IoError naming `what`, the folder and the size where the file cannot be
// made, reserved or written (a full disk).
UntypedStorage fortran_values_in_temporary_file(const NpyHeader& header, const std::string& what,
                                                const std::function<void(int64_t, std::byte*, int64_t)>& read);

// The .npy file at `path`, mapped; the file must hold exactly the data its header declares.
NpyValues map_npy_values(const std::string& path);

// The arrays of the .npz at `path`, in member order: stored members within the archive's
// mapping; deflated ones read through a DeflatedMember (the packer inflates C-order values a
// batch of records at a time, Fortran-order ones into fortran_values_in_temporary_file). Every check of load_npz()
// is made here, CRC-32s included, but for a DeflatedMember's size and CRC-32 (checked as its
// last byte is read) and bool values (npy_tensor_over() checks them; the packer, as it reads).
std::vector<NpyValues> map_npz_values(const std::string& path);

}  // namespace mmt::detail
