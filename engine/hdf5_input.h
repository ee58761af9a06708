// HDF5 files as pack inputs (what h5py, Keras, PyTables and MATLAB v7.3 write): each dataset
// of numbers is an array whose first dimension is the record dimension, as an .npy's is.
//
//   "PATH"          every dataset in the file, a field each, named by its path (a dataset
//                   in a group must then be named: NAME=PATH:GROUP/DATASET);
//   "PATH:DATASET"  that dataset ("/images", "train/images"), for a NAME=... input.
//
// A contiguous dataset stored unfiltered in little-endian order is a view of the file's
// mapping (no copy, as .npy inputs are); any other (chunked, compressed with gzip, szip or
// shuffle, big-endian) is read into a scratch file, a slab of whole chunks at a time, and
// packed from there: gzip and shuffle chunks decoded by this engine on every CPU
// (hdf5_chunks.h), the rest by the HDF5 library. The HDF5 library (libhdf5, the Debian package)
// parses the file; this engine checks what it reports (sizes against the file, bools'
// bytes) and turns its errors into FormatError/IoError naming the file and the dataset.
// Values never written read as the dataset's fill value, and as zeros where it has none or
// its fill time is NEVER (h5py's fill_time='never'), whichever path reads them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mmtensor/tensor.h"

namespace mmt::detail {

// The most specific reason on the calling thread's HDF5 error stack ("unable to open file
// (file signature not found)"), which is then cleared.
std::string hdf5_reason();

// True when `path` is a file that starts with HDF5's signature ("\x89HDF\r\n\x1a\n"), at byte 0
// or after a user block (512, 1024, 2048... bytes).
bool is_hdf5_file(const std::string& path);

struct Hdf5Input {
  std::string path;     // the file
  std::string dataset;  // empty: every dataset in the file
};

// "PATH" naming an HDF5 file, or "PATH:DATASET" where PATH (the longest part before a ':'
// that is a file) is one; nullopt otherwise.
std::optional<Hdf5Input> hdf5_input_of(const std::string& spec_path);

class Hdf5File;

struct Hdf5Array {
  std::string name;  // the dataset's path in the file, without the leading '/'
  std::string what;  // "PATH:/NAME", for messages and origins
  ScalarType dtype = kUInt8;
  std::vector<int64_t> sizes;  // [records, ...]
  // The values, C order, when they are viewed in the file's mapping (or hold none); else
  // undefined until read_hdf5_values(), which reads them through the library.
  Tensor values;
  std::shared_ptr<Hdf5File> file;  // open until the values are read
};

// The dataset named, or every dataset of the file in name order, described (and viewed in
// place where they can be; the others are read by read_hdf5_values(), so that a long read
// comes after every input is checked). ValueError for a dataset that is not an array of
// numbers or bools of rank >= 1 (naming its type), a dataset name the file lacks (naming
// those it has), a file of no datasets; FormatError/IoError for what the HDF5 library cannot
// read, with its reason.
std::vector<Hdf5Array> load_hdf5(const Hdf5Input& input);

// The values of an array load_hdf5() left undefined, read into a scratch file (the file's
// filters and byte order undone). FormatError/IoError naming the dataset and the records.
Tensor read_hdf5_values(const Hdf5Array& array);

}  // namespace mmt::detail
