// The state of PackSources::token_windows (packer.h), shared by the packer's dispatch and
// pack_windows.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "mmtensor/packer.h"

namespace mmt {

namespace detail {

struct TokenWindows {
  PackSources tokens;      // the stream's source: one field
  WindowOptions options;   // stride resolved (never 0)
  ScalarType dtype = kInt64;
  bool documents = false;  // the records hold 1-D values (else one value each: a 1-D array)
  // Documents: where each document begins in the stream (documents + 1 entries: the last is
  // the stream's size). Each occupies its tokens, then the separator when there is one.
  std::vector<int64_t> document_start;
  int64_t stream_tokens = 0;
  int64_t windows = 0;

  // Windows are read in ascending order (packing, verifying), and each overlaps the last: a
  // source read front to back (a deflated .npz member) would start over at every window, so
  // the last run of tokens read (a 1-D array converted as it is read) and the last document
  // are kept, and a window reads only what is new. Under a mutex: sources are read from any
  // thread.
  struct Held {
    std::mutex mutex;
    int64_t run_first = 0;   // the stream position of run's first token
    Tensor run;              // empty: none
    int64_t document = -1;   // which document `values` holds; -1: none
    Tensor values;
  };
  std::shared_ptr<Held> held = std::make_shared<Held>();
  bool converted_array = false;  // a 1-D array whose values are converted as they are read

  int64_t document_tokens(size_t d) const {
    return document_start[d + 1] - document_start[d] - (options.separator ? 1 : 0);
  }
};

}  // namespace detail

}  // namespace mmt
