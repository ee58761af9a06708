// mmtensor's one error hierarchy.
//
// Every failure the library reports is an exception derived from mmt::Error. Messages say
// what was asked, what was found, and where (file, byte offset, chunk, record, field), so a
// user can act on them without a debugger. No function in mmtensor aborts or crashes on bad
// input; it throws one of these.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace mmt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An argument is wrong: a shape that does not fit, an unknown name, a negative size.
class ValueError : public Error {
 public:
  using Error::Error;
};

// An index or dimension is out of range.
class IndexError : public Error {
 public:
  using Error::Error;
};

// The operating system refused an operation (open, write, fsync, rename, mmap...).
// errno_value() is the errno seen, or 0 when there was none (a short write, say).
class IoError : public Error {
 public:
  IoError(const std::string& message, int errno_value = 0)
      : Error(message), errno_value_(errno_value) {}
  int errno_value() const noexcept { return errno_value_; }

 private:
  int errno_value_;
};

// A file's bytes are not what the format promises: truncated, corrupt, or of another kind.
class FormatError : public Error {
 public:
  using Error::Error;
};

// A chunk's or structure's checksum does not match its bytes.
class ChecksumError : public FormatError {
 public:
  using FormatError::FormatError;
};

// A CUDA runtime call failed, or CUDA was asked for where it is not available.
class CudaError : public Error {
 public:
  using Error::Error;
};

namespace detail {
// Concatenates anything streamable: detail::str("chunk ", 17, " is truncated").
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace mmt

// MMT_CHECK(cond, ErrorType, parts...) throws ErrorType(parts...) when cond is false.
#define MMT_CHECK(cond, ErrorType, ...)                        \
  do {                                                         \
    if (!(cond)) [[unlikely]]                                  \
      throw ErrorType(::mmt::detail::str(__VA_ARGS__));        \
  } while (0)
