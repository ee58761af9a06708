// Reading a chunked HDF5 dataset by its chunks' stored bytes, its filters undone here on
// several threads. libhdf5 undoes filters on the calling thread only (and serialises callers
// in a thread-safe build), so a gzip-compressed dataset (h5py's compression="gzip", with or
// without shuffle=True) was read at one core's inflate speed. Here the library reads each
// chunk's stored bytes (H5Dread_chunk, a copy from the page cache) on the calling thread, and
// the pool's threads inflate and unshuffle the chunks of a slab at once.
//
// Only storage this engine undoes exactly as libhdf5 does takes this path: the deflate and
// shuffle filters, values stored as they are read (no conversion), and chunks never written
// read as zeros (the default fill value). Anything else (szip, fletcher32, a plugin filter, a
// fill value other than zeros, partial edge chunks left unfiltered) is for H5Dread, and so are
// chunks too small or too many for their bytes (under 1 KiB; over 4,096 or 128 MB a chunk row)
// to gain from threads, or to be held a slab at a time.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "scratch_file.h"

namespace mmt::detail {

struct ChunkedDataset {
  hid_t dataset = -1;
  hid_t create_plist = -1;
  hid_t file_type = -1;    // as stored
  hid_t memory_type = -1;  // as read
  std::vector<hsize_t> dims;
  std::vector<hsize_t> chunk;  // a chunk's extent in each dimension
  int64_t element_bytes = 0;
  int64_t file_bytes = 0;  // the file's size: a chunk's stored size is checked against it
};

// True when `dataset` is stored so that read_chunks_here() reads it (see above). Asks the
// library only; the calling thread's HDF5 error stack is cleared.
bool chunks_read_here(const ChunkedDataset& dataset);

// Appends the dataset's values to `out` in C order, `slab_bytes` of whole chunk rows (the
// chunks that share their first-dimension offset) at a time, at least one row. FormatError
// naming `what` and the chunk (its first element's coordinates) for a chunk that cannot be
// read or does not decode to its size, and naming `what` when the chunks found inside the
// extent do not add up to what the index counts (chunks it lost would read as zeros).
void read_chunks_here(const ChunkedDataset& dataset, int64_t slab_bytes, ScratchFile& out, const std::string& what);

}  // namespace mmt::detail
