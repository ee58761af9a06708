#include "decompressed_file.h"

#include <sys/statvfs.h>
#include <zstd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "checksum.h"
#include "gzip_reader.h"
#include "import_util.h"
#include "mapping_guard.h"
#include "mmtensor/error.h"
#include "scratch_file.h"
#include "utf8.h"

namespace mmt::detail {

const char* compressor_of(const std::byte* head, size_t n) {
  const auto* b = reinterpret_cast<const unsigned char*>(head);
  if (n >= 2 && b[0] == 0x1f && b[1] == 0x8b) return "gzip";
  // A zstd frame, or a skippable frame (magic 0x184D2A5?, little-endian), which pzstd puts
  // before each of its frames.
  if (n >= 4 && (std::memcmp(b, "\x28\xb5\x2f\xfd", 4) == 0 || ((b[0] & 0xF0) == 0x50 && std::memcmp(b + 1, "\x2a\x4d\x18", 3) == 0)))
    return "zstd";
  if (n >= 3 && std::memcmp(b, "BZh", 3) == 0) return "bzip2";
  if (n >= 6 && std::memcmp(b, "\xfd" "7zXZ\0", 6) == 0) return "xz";
  return nullptr;
}

UntypedStorage decompressed_file(const std::string& path, FileCompression compression, int64_t head_bytes,
                                 const std::function<void(const std::byte*, int64_t)>& check_head) {
  const InputFile input = map_input_file(path);
  return decompressed_file(path, input.mapping, compression, head_bytes, check_head);
}

UntypedStorage decompressed_file(const std::string& path, const UntypedStorage& mapping, FileCompression compression,
                                 int64_t head_bytes, const std::function<void(const std::byte*, int64_t)>& check_head) {
  const struct {
    const UntypedStorage& mapping;
    std::span<const std::byte> bytes;
  } compressed{mapping, std::span<const std::byte>(mapping.data(), static_cast<size_t>(mapping.nbytes()))};
  ScratchFile file(path, "to decompress this file into");
  std::vector<std::byte> block(size_t{1} << 20);
  std::vector<std::byte> head;
  bool head_checked = !check_head;
  const auto take = [&](int64_t n) {
    if (!head_checked) {
      const int64_t more = std::min<int64_t>(head_bytes - static_cast<int64_t>(head.size()), n);
      head.insert(head.end(), block.data(), block.data() + more);
      if (static_cast<int64_t>(head.size()) == head_bytes) {
        head_checked = true;
        check_head(head.data(), head_bytes);
      }
    }
    file.append(block.data(), n);
  };
  if (compression == FileCompression::Gzip || compression == FileCompression::Zlib) {
    // FormatError naming the file for a bad stream.
    GzipReader reader(compressed.bytes, path,
                      compression == FileCompression::Gzip ? GzipReader::Wrapper::Gzip : GzipReader::Wrapper::Zlib);
    guard_storage_reads(compressed.mapping, [&] {
      for (size_t got; (got = reader.read(block.data(), block.size())) > 0;) take(static_cast<int64_t>(got));
    });
  } else {
    std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)> context{ZSTD_createDCtx(), ZSTD_freeDCtx};
    MMT_CHECK(context != nullptr, IoError, path, ": cannot allocate a zstd decompression context");
    // Any window the format allows (`zstd --long=31` writes 2 GiB ones): the output goes to a
    // file, and the window is the decoder's memory, which such a stream needs.
    ZSTD_DCtx_setParameter(context.get(), ZSTD_d_windowLogMax, ZSTD_dParam_getBounds(ZSTD_d_windowLogMax).upperBound);
    ZSTD_inBuffer in{compressed.bytes.data(), compressed.bytes.size(), 0};
    size_t frame_left = 0;  // ZSTD_decompressStream's hint: 0 once a frame is whole
    guard_storage_reads(compressed.mapping, [&] {
      for (;;) {
        ZSTD_outBuffer out{block.data(), block.size(), 0};
        frame_left = ZSTD_decompressStream(context.get(), &out, &in);
        MMT_CHECK(!ZSTD_isError(frame_left), FormatError, path, ": a corrupt zstd stream near compressed byte ", in.pos,
                  ": ", ZSTD_getErrorName(frame_left));
        take(static_cast<int64_t>(out.pos));
        // Done when the input is used up and nothing is held back: a frame ended, or the
        // output was not filled. (A call after a frame ended on a full output, with no input
        // left, would begin a frame that never comes.)
        if (in.pos == in.size && (frame_left == 0 || out.pos < out.size)) break;
      }
    });
    MMT_CHECK(frame_left == 0, FormatError, path, ": the zstd stream is cut short (its last frame is incomplete, after ",
              file.size(), " decompressed bytes)");
  }
  if (!head_checked && file.size() > 0) check_head(head.data(), static_cast<int64_t>(head.size()));
  return file.map(str(path, " (decompressed into a temporary file in ", file.folder().string(), ")"));
}

namespace {

uint64_t hash_of(const UntypedStorage& bytes) {
  if (bytes.nbytes() == 0) return 0;
  return guard_storage_reads(bytes, [&] { return checksum64(bytes.data(), static_cast<size_t>(bytes.nbytes())); });
}

}  // namespace

int64_t DecompressedFiles::scratch_budget() {
  if (const char* text = std::getenv("MMT_SCRATCH_BYTES"); text != nullptr && *text != '\0') {
    // from_chars: no locale, no leading blanks, no hex.
    const char* end = text + std::strlen(text);
    double value = -1;
    const auto [rest, error] = std::from_chars(text, end, value);
    double scale = 1;
    const char* tail = rest;
    if (error == std::errc() && tail != end) {
      switch (*tail) {
        case 'K': case 'k': scale = 1024.0; ++tail; break;
        case 'M': case 'm': scale = 1024.0 * 1024; ++tail; break;
        case 'G': case 'g': scale = 1024.0 * 1024 * 1024; ++tail; break;
        case 'T': case 't': scale = 1024.0 * 1024 * 1024 * 1024; ++tail; break;
        default: break;
      }
    }
    MMT_CHECK(error == std::errc() && tail == end && value >= 0 && value * scale < 9.0e18, ValueError,
              "MMT_SCRATCH_BYTES is '", cut_for_message(text, 40), "', not a number of bytes (such as 20G)");
    return static_cast<int64_t>(value * scale);
  }
  const char* tmpdir = std::getenv("TMPDIR");
  struct statvfs fs {};
  if (::statvfs(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp", &fs) != 0)
    return int64_t{1} << 62;  // unknown: ScratchFile names the folder when it is used
  return static_cast<int64_t>(static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize) / 2);
}

size_t DecompressedFiles::add(const std::string& path, FileCompression compression, UntypedStorage bytes) {
  // Mapped again now, just after it was decompressed, and kept: what a second decompression
  // reads. The hash tells if it is not the file the copy was made from.
  Entry entry{path, compression, map_input_file(path).mapping, bytes.nbytes(), hash_of(bytes), {}, 0, false};
  std::lock_guard lock(mutex_);
  if (budget_ < 0) budget_ = scratch_budget();  // only when a compressed input needs it
  entry.last_use = ++clock_;
  // Kept while they fit: the first inputs, which packing reads first.
  if (kept_bytes_ + entry.size <= budget_) {
    kept_bytes_ += entry.size;
    entry.kept = std::move(bytes);
  }
  entries_.push_back(std::move(entry));
  return entries_.size() - 1;
}

UntypedStorage DecompressedFiles::get(size_t index) const {
  std::unique_lock lock(mutex_);
  MMT_CHECK(index < entries_.size(), IndexError, "decompressed file ", index, " of ", entries_.size());
  // entries_ does not grow once the sources are made (add() runs only then), so the reference
  // holds while the lock is let go below.
  Entry& entry = entries_[index];
  done_.wait(lock, [&] { return !entry.in_flight; });
  entry.last_use = ++clock_;
  if (entry.kept.nbytes() > 0 || entry.size == 0) return entry.kept;
  entry.in_flight = true;
  const std::string path = entry.path;
  const UntypedStorage compressed = entry.compressed;
  const FileCompression compression = entry.compression;
  lock.unlock();
  UntypedStorage bytes;
  uint64_t hash = 0;
  try {
    bytes = decompressed_file(path, compressed, compression);
    hash = hash_of(bytes);
  } catch (...) {
    lock.lock();
    entry.in_flight = false;
    done_.notify_all();
    throw;
  }
  lock.lock();
  entry.in_flight = false;
  done_.notify_all();
  MMT_CHECK(bytes.nbytes() == entry.size && hash == entry.hash, IoError, entry.path,
            ": decompresses to other bytes than when it was first read (", bytes.nbytes(), " bytes, where it gave ",
            entry.size, "): it changed while it was being packed");
  ++again_;
  entry.kept = bytes;
  kept_bytes_ += entry.size;
  drop_past_budget(index);
  return bytes;
}

void DecompressedFiles::drop_past_budget(size_t keep) const {
  while (kept_bytes_ > budget_) {
    size_t oldest = entries_.size();
    for (size_t i = 0; i < entries_.size(); ++i)
      if (i != keep && entries_[i].kept.nbytes() > 0 &&
          (oldest == entries_.size() || entries_[i].last_use < entries_[oldest].last_use))
        oldest = i;
    if (oldest == entries_.size()) return;  // only the one in use: kept whatever its size
    kept_bytes_ -= entries_[oldest].size;
    entries_[oldest].kept = UntypedStorage();  // its scratch file goes once no view holds it
  }
}

int64_t DecompressedFiles::decompressed_again() const {
  std::lock_guard lock(mutex_);
  return again_;
}

}  // namespace mmt::detail
