// Helpers for the importer tests (npy, npz, idx, mmt): a temporary folder, and hand-built
// .npy, ZIP and gzip bytes, so the tests need no numpy; plus a way to run numpy when present.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "mmtensor/dataset_writer.h"
#include "mmtensor/error.h"
#include "mmtensor/packer.h"
#include "mmtensor/tensor.h"

namespace mmt::testutil {

using Bytes = std::vector<std::byte>;

// A fresh folder under the test temp dir, removed with everything in it.
class TempFolder {
 public:
  TempFolder() {
    static int counter = 0;
    std::string base = ::testing::TempDir();
    if (base.empty() || base.back() != '/') base += '/';
    path_ = base + "mmt-importers-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline Bytes to_bytes(std::string_view s) {
  Bytes out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

// A tensor of bytes (a bytes field's value) as text.
inline std::string text_of(const Tensor& bytes) {
  const Tensor c = bytes.contiguous();
  return std::string(reinterpret_cast<const char*>(c.data_ptr()), static_cast<size_t>(c.numel()));
}

inline void append(Bytes& out, const Bytes& more) { out.insert(out.end(), more.begin(), more.end()); }
inline void append(Bytes& out, std::string_view more) { append(out, to_bytes(more)); }

inline void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

inline Bytes read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return to_bytes(s);
}

// An .npy file with the given header dict text (as numpy writes it, without padding) and data.
inline Bytes npy_with_dict(const std::string& dict, const Bytes& data, int major = 1) {
  std::string prefix = "\x93NUMPY";
  prefix += static_cast<char>(major);
  prefix += '\0';
  size_t len_bytes = major == 1 ? 2 : 4;
  size_t total = (prefix.size() + len_bytes + dict.size() + 1 + 63) / 64 * 64;
  size_t header_len = total - prefix.size() - len_bytes;
  for (size_t i = 0; i < len_bytes; ++i) prefix += static_cast<char>((header_len >> (8 * i)) & 0xFF);
  std::string header = dict + std::string(header_len - dict.size() - 1, ' ') + "\n";
  Bytes out = to_bytes(prefix + header);
  append(out, data);
  return out;
}

inline Bytes npy_file(const std::string& descr, bool fortran, const std::string& shape,
                      const Bytes& data, int major = 1) {
  return npy_with_dict("{'descr': '" + descr + "', 'fortran_order': " +
                           (fortran ? "True" : "False") + ", 'shape': " + shape + ", }",
                       data, major);
}

// Element values as bytes in the given order.
template <typename T>
Bytes element_bytes(const std::vector<T>& values, bool big_endian) {
  Bytes out(values.size() * sizeof(T));
  for (size_t i = 0; i < values.size(); ++i) {
    std::memcpy(out.data() + i * sizeof(T), &values[i], sizeof(T));
    if (big_endian) std::reverse(out.begin() + i * sizeof(T), out.begin() + (i + 1) * sizeof(T));
  }
  return out;
}

inline void put16(Bytes& b, uint16_t v) {
  for (int i = 0; i < 2; ++i) b.push_back(std::byte((v >> (8 * i)) & 0xFF));
}
inline void put32(Bytes& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(std::byte((v >> (8 * i)) & 0xFF));
}
inline void put64(Bytes& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(std::byte((v >> (8 * i)) & 0xFF));
}

// Raw deflate (no zlib wrapper), as ZIP stores it; windowBits 31 gives gzip instead.
inline Bytes deflate_bytes(const Bytes& in, int window_bits = -15) {
  z_stream zs{};
  deflateInit2(&zs, 6, Z_DEFLATED, window_bits, 8, Z_DEFAULT_STRATEGY);
  Bytes out(deflateBound(&zs, in.size()) + 64);
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}
inline Bytes gzip_bytes(const Bytes& in) { return deflate_bytes(in, 31); }
// A zlib stream (RFC 1950), as TensorFlow's ZLIB TFRecord writer makes.
inline Bytes zlib_bytes(const Bytes& in) { return deflate_bytes(in, 15); }

struct ZipEntry {
  std::string name;
  Bytes content;
  bool deflate = false;
  uint16_t method_override = 0xFFFF;  // write this method code instead (for refusal tests)
  uint16_t flags = 0;
  std::optional<Bytes> data_override;  // these bytes as the member's data (CRC and size stay content's)
};

// A ZIP archive as Python's zipfile writes it; with zip64, sizes and offsets go in ZIP64
// extra fields and a ZIP64 end-of-central-directory record is written.
inline Bytes zip_archive(const std::vector<ZipEntry>& entries, bool zip64 = false) {
  Bytes out, central;
  for (const ZipEntry& e : entries) {
    Bytes data = e.data_override ? *e.data_override : e.deflate ? deflate_bytes(e.content) : e.content;
    uint16_t method = e.method_override != 0xFFFF ? e.method_override : (e.deflate ? 8 : 0);
    uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(e.content.data()), static_cast<uInt>(e.content.size())));
    uint64_t offset = out.size();
    put32(out, 0x04034b50);
    put16(out, zip64 ? 45 : 20);
    put16(out, e.flags);
    put16(out, method);
    put16(out, 0);
    put16(out, 0x21);
    put32(out, crc);
    put32(out, zip64 ? 0xFFFFFFFF : static_cast<uint32_t>(data.size()));
    put32(out, zip64 ? 0xFFFFFFFF : static_cast<uint32_t>(e.content.size()));
    put16(out, static_cast<uint16_t>(e.name.size()));
    put16(out, zip64 ? 20 : 0);
    append(out, e.name);
    if (zip64) {
      put16(out, 1);
      put16(out, 16);
      put64(out, e.content.size());
      put64(out, data.size());
    }
    append(out, data);

    put32(central, 0x02014b50);
    put16(central, 45);
    put16(central, zip64 ? 45 : 20);
    put16(central, e.flags);
    put16(central, method);
    put16(central, 0);
    put16(central, 0x21);
    put32(central, crc);
    put32(central, zip64 ? 0xFFFFFFFF : static_cast<uint32_t>(data.size()));
    put32(central, zip64 ? 0xFFFFFFFF : static_cast<uint32_t>(e.content.size()));
    put16(central, static_cast<uint16_t>(e.name.size()));
    put16(central, zip64 ? 28 : 0);
    put16(central, 0);
    put16(central, 0);
    put16(central, 0);
    put32(central, 0);
    put32(central, zip64 ? 0xFFFFFFFF : static_cast<uint32_t>(offset));
    append(central, e.name);
    if (zip64) {
      put16(central, 1);
      put16(central, 24);
      put64(central, e.content.size());
      put64(central, data.size());
      put64(central, offset);
    }
  }
  uint64_t cd_offset = out.size();
  append(out, central);
  if (zip64) {
    uint64_t record = out.size();
    put32(out, 0x06064b50);
    put64(out, 44);
    put16(out, 45);
    put16(out, 45);
    put32(out, 0);
    put32(out, 0);
    put64(out, entries.size());
    put64(out, entries.size());
    put64(out, central.size());
    put64(out, cd_offset);
    put32(out, 0x07064b50);
    put32(out, 0);
    put64(out, record);
    put32(out, 1);
  }
  put32(out, 0x06054b50);
  put16(out, 0);
  put16(out, 0);
  put16(out, zip64 ? 0xFFFF : static_cast<uint16_t>(entries.size()));
  put16(out, zip64 ? 0xFFFF : static_cast<uint16_t>(entries.size()));
  put32(out, zip64 ? 0xFFFFFFFF : static_cast<uint32_t>(central.size()));
  put32(out, zip64 ? 0xFFFFFFFF : static_cast<uint32_t>(cd_offset));
  put16(out, 0);
  return out;
}

// A python3 that can import numpy, or "" (tests that need one skip).
inline std::string python_with_numpy() {
  for (const char* candidate : {"python3", "/usr/bin/python3"}) {
    std::string cmd = std::string(candidate) + " -c 'import numpy' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return candidate;
  }
  return "";
}

// Runs a Python script (with numpy) in `folder`; returns its exit status.
inline int run_python(const std::string& python, const std::string& folder, const std::string& script) {
  std::string path = folder + "/script.py";
  {
    std::ofstream f(path);
    f << "import numpy as np, os\nos.chdir(" << '"' << folder << '"' << ")\n" << script;
  }
  return std::system((python + " " + path).c_str());
}

// The message of the FormatError fn() throws; a test failure when it throws none.
template <typename Fn>
std::string expect_format_error(Fn&& fn) {
  try {
    fn();
  } catch (const mmt::FormatError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a FormatError";
  return "";
}

// Record `index`'s value of the field called `name` (a pack's fields are found by name: masks
// such as NAME.valid sit among them where a column has nulls).
inline Tensor field_value(const PackSources& sources, int64_t index, std::string_view name) {
  return sources.record(index)[sources.schema().index_of(name)];
}

// Writes `sources` to `path` one record at a time (append(record(i))), with `options` and the
// sources' metadata: the file pack_dataset() must write byte for byte, however it batches.
inline void pack_record_by_record(const std::string& path, const PackSources& sources, WriterOptions options) {
  options.metadata = sources.metadata();
  DatasetWriter writer = DatasetWriter::create(path, sources.schema(), options);
  for (int64_t i = 0; i < sources.records(); ++i) writer.append(sources.record(i));
  writer.finish();
}

// Packs `sources` with pack_dataset() (which batches) into FOLDER/batched.mmt and record by
// record into FOLDER/records.mmt, for lz4 and none, each chunk size and 64-byte alignment, and
// expects the two files byte for byte the same; FOLDER/batched.mmt is left as the last made.
inline void expect_batches_pack_as_records(const std::filesystem::path& folder, const PackSources& sources,
                                           std::initializer_list<int64_t> chunk_bytes, const std::string& note = "") {
  const std::string batched = folder / "batched.mmt", records = folder / "records.mmt";
  for (const char* codec : {"none", "lz4"}) {
    for (const int64_t bytes : chunk_bytes) {
      PackOptions options;
      options.writer.codec = CodecSpec::parse(codec);
      options.writer.chunk_bytes = bytes;
      options.writer.alignment = 64;
      options.writer.overwrite = true;
      pack_dataset(batched, sources, options);
      pack_record_by_record(records, sources, options.writer);
      const auto bytes_of = [](const std::string& path) {
        std::ifstream in(path, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
      };
      if (bytes_of(batched) != bytes_of(records)) {
        ADD_FAILURE() << "batched and record by record differ: " << codec << ", chunk_bytes " << bytes << note;
        return;
      }
    }
  }
}

}  // namespace mmt::testutil
