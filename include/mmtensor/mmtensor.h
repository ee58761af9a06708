// mmtensor: a memory-mapped dataset storage engine for ML training.
//
// Include this one header. It brings:
//   storage.h         UntypedStorage: bytes in host, pinned, CUDA or memory-mapped file memory
//   tensor.h          Tensor: strided views with PyTorch's semantics
//   schema.h          the fields of a dataset's records
//   dataset_writer.h  DatasetWriter: builds a dataset file atomically
//   dataset.h         Dataset: zero-copy random access by record index
//   loader.h          Loader: batches through a pinned staging ring to host or GPU
//   sampler.h         the index orders a loader draws (sequential, random, quasi-random, distributed)
//   numpy_io.h        .npy / .npz reading (zero-copy where possible) and .npy writing
//   idx_io.h          MNIST-style IDX files, plain or gzip'd
//   packer.h          building a dataset from such files (what `mmt pack` does)
//
// Everything is in namespace mmt. Errors are exceptions derived from mmt::Error (error.h).
#pragma once

#define MMT_VERSION_MAJOR 0
#define MMT_VERSION_MINOR 1
#define MMT_VERSION_PATCH 0

#include "mmtensor/codec.h"
#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "mmtensor/device.h"
#include "mmtensor/dims.h"
#include "mmtensor/dtype.h"
#include "mmtensor/error.h"
#include "mmtensor/idx_io.h"
#include "mmtensor/loader.h"
#include "mmtensor/numpy_io.h"
#include "mmtensor/packer.h"
#include "mmtensor/sampler.h"
#include "mmtensor/schema.h"
#include "mmtensor/storage.h"
#include "mmtensor/tensor.h"

namespace mmt {
// The library's version at run time ("0.1.0"), to compare with the MMT_VERSION_* macros.
const char* version();
}  // namespace mmt
