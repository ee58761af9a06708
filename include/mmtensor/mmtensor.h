// mmtensor: a memory-mapped dataset storage engine for ML training.
//
// Include this one header. It brings:
//   storage.h         UntypedStorage: bytes in host, pinned, CUDA or memory-mapped file memory
//   tensor.h          Tensor: strided views with PyTorch's semantics
//   schema.h          the fields of a dataset's records
//   dataset_writer.h  DatasetWriter: builds a dataset file atomically
//   dataset.h         Dataset: zero-copy random access by record index
// and, where present, the importers and the loader.
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
#include "mmtensor/schema.h"
#include "mmtensor/storage.h"
#include "mmtensor/tensor.h"

namespace mmt {
// The library's version at run time ("0.1.0"), to compare with the MMT_VERSION_* macros.
const char* version();
}  // namespace mmt
