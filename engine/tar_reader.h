// The regular files of an uncompressed tar archive, as byte ranges of its mapping: what
// PackSources::from_tars packs WebDataset shards from, record values viewing the archive
// (zero-copy; a streaming tar library would hand over copies, one member after another).
//
// Reads POSIX ustar, pax (per-file "x" headers: path and size) and GNU tar (long names, 'L';
// base-256 sizes), the formats Python's tarfile, GNU tar and WebDataset's writers make.
// Every header's checksum is checked, and every size against the file's: a damaged or
// truncated archive is a FormatError naming the file, the header's byte offset and what is
// wrong. Directories and pax global headers are passed over; links, devices, sparse files
// (GNU's 'S' type, and its pax GNU.sparse.* members) and other member types are refused (a WebDataset shard holds regular files only). The
// archive ends at its first all-zero header block (the end-of-archive marker, two such blocks,
// which tar, tarfile and WebDataset's TarWriter all write; tar reads one); bytes after it are
// passed over. A file that ends before it (inside a header, a member's data or padding, or
// between members) is refused as truncated: samples after a cut would be lost without a word.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "mmtensor/storage.h"

namespace mmt::detail {

struct TarMember {
  std::string name;         // the member's path in the archive, as stored (pax path wins)
  int64_t header_offset = 0;  // of its first header block (a pax or GNU long-name one, if any)
  int64_t data_offset = 0;    // of its bytes
  int64_t size = 0;
};

// Whether `path` begins with a ustar header whose checksum holds, or with an all-zero block
// (an archive of no members): a tar archive this reader takes.
bool is_tar_file(const std::string& path);
// The same for the first bytes of an archive (at least 512 of them for a yes).
bool is_tar_start(const std::byte* bytes, int64_t n);

// Calls on_member for each regular file of `archive` (a mapping of the whole file, whose
// filename() names it in errors), in archive order.
void for_each_tar_member(const UntypedStorage& archive, const std::function<void(const TarMember&)>& on_member);

}  // namespace mmt::detail
