// The state of PackSources::token_windows (packer.h), shared by the packer's dispatch and
// pack_windows.cc.
#pragma once

#include <cstdint>
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

  int64_t document_tokens(size_t d) const {
    return document_start[d + 1] - document_start[d] - (options.separator ? 1 : 0);
  }
};

}  // namespace detail

}  // namespace mmt
