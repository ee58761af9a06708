// .npz: a ZIP archive of .npy members, as np.savez / np.savez_compressed write it.
//
// The reader follows the central directory (the archive's table of contents at its end), not
// a scan of local headers, and checks each member's local header against it. ZIP64 is
// handled where numpy produces it: the ZIP64 end-of-central-directory record and the ZIP64
// extra field carrying 64-bit sizes and offsets. Bytes around the archive are allowed where
// Python's zipfile allows them (find_end_of_central_directory, find_archive_start).
#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "import_util.h"
#include "load_cancel.h"
#include "mapping_guard.h"
#include "mmtensor/numpy_io.h"
#include "npy_format.h"
#include "utf8.h"

namespace mmt {
namespace {

using detail::load_le16;
using detail::load_le32;
using detail::load_le64;
using detail::check_load_cancelled;
using detail::str;

constexpr uint32_t kEndOfCentralDirSignature = 0x06054b50;
constexpr uint32_t kZip64EndOfCentralDirSignature = 0x06064b50;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr uint32_t kCentralHeaderSignature = 0x02014b50;
constexpr uint32_t kLocalHeaderSignature = 0x04034b50;
constexpr size_t kEndOfCentralDirBytes = 22;
constexpr size_t kZip64LocatorBytes = 20;
constexpr size_t kZip64EndOfCentralDirBytes = 56;
constexpr size_t kCentralHeaderBytes = 46;
constexpr size_t kLocalHeaderBytes = 30;
// Inflated at most this much a zlib call: zlib counts in 32-bit ints, and a long inflation asks
// between steps whether its load was given up (load_cancel.h).
constexpr uint64_t kInflateStepBytes = uint64_t{16} << 20;
// The most bytes after the end-of-central-directory record that Python's zipfile looks
// through for it (a 65535-byte comment and then some).
constexpr size_t kMaxBytesAfterEndOfCentralDir = 65536;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint16_t kMethodStored = 0;
constexpr uint16_t kMethodDeflated = 8;
constexpr uint16_t kFlagEncrypted = 0x0001;
// Deflate cannot expand data by more than about 1032:1; a member claiming more is corrupt,
// and refusing it up front keeps a forged size from driving a huge allocation.
constexpr uint64_t kMaxDeflateRatio = 1032;

constexpr uint16_t kFlagUtf8Name = 0x0800;

// Bytes 0x80-0xFF of code page 437 as Unicode code points: a ZIP member name without the
// UTF-8 flag (bit 11) is in CP437 (APPNOTE.TXT, appendix D), as Python's zipfile, and so
// np.load, reads it.
constexpr uint16_t kCp437High[128] = {
    0x00C7, 0x00FC, 0x00E9, 0x00E2, 0x00E4, 0x00E0, 0x00E5, 0x00E7, 0x00EA, 0x00EB, 0x00E8, 0x00EF, 0x00EE,
    0x00EC, 0x00C4, 0x00C5, 0x00C9, 0x00E6, 0x00C6, 0x00F4, 0x00F6, 0x00F2, 0x00FB, 0x00F9, 0x00FF, 0x00D6,
    0x00DC, 0x00A2, 0x00A3, 0x00A5, 0x20A7, 0x0192, 0x00E1, 0x00ED, 0x00F3, 0x00FA, 0x00F1, 0x00D1, 0x00AA,
    0x00BA, 0x00BF, 0x2310, 0x00AC, 0x00BD, 0x00BC, 0x00A1, 0x00AB, 0x00BB, 0x2591, 0x2592, 0x2593, 0x2502,
    0x2524, 0x2561, 0x2562, 0x2556, 0x2555, 0x2563, 0x2551, 0x2557, 0x255D, 0x255C, 0x255B, 0x2510, 0x2514,
    0x2534, 0x252C, 0x251C, 0x2500, 0x253C, 0x255E, 0x255F, 0x255A, 0x2554, 0x2569, 0x2566, 0x2560, 0x2550,
    0x256C, 0x2567, 0x2568, 0x2564, 0x2565, 0x2559, 0x2558, 0x2552, 0x2553, 0x256B, 0x256A, 0x2518, 0x250C,
    0x2588, 0x2584, 0x258C, 0x2590, 0x2580, 0x03B1, 0x00DF, 0x0393, 0x03C0, 0x03A3, 0x03C3, 0x00B5, 0x03C4,
    0x03A6, 0x0398, 0x03A9, 0x03B4, 0x221E, 0x03C6, 0x03B5, 0x2229, 0x2261, 0x00B1, 0x2265, 0x2264, 0x2320,
    0x2321, 0x00F7, 0x2248, 0x00B0, 0x2219, 0x00B7, 0x221A, 0x207F, 0x00B2, 0x25A0, 0x00A0};

// A member's name as text (UTF-8): as stored when flagged UTF-8, else decoded from CP437
// (ASCII names are the same either way).
std::string member_name_text(std::string_view stored, uint16_t flags) {
  if (flags & kFlagUtf8Name) return std::string(stored);
  std::string text;
  text.reserve(stored.size() * 3);
  for (char c : stored) {
    const auto byte = static_cast<unsigned char>(c);
    const uint32_t code = byte < 0x80 ? byte : kCp437High[byte - 0x80];
    if (code < 0x80) {
      text.push_back(static_cast<char>(code));
    } else if (code < 0x800) {
      text.push_back(static_cast<char>(0xC0 | (code >> 6)));
      text.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    } else {
      text.push_back(static_cast<char>(0xE0 | (code >> 12)));
      text.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
      text.push_back(static_cast<char>(0x80 | (code & 0x3F)));
    }
  }
  return text;
}

struct Member {
  std::string name;         // as text (UTF-8)
  std::string stored_name;  // the bytes the headers hold
  uint16_t flags = 0;
  uint16_t method = 0;
  uint32_t crc32 = 0;
  uint64_t compressed_bytes = 0;
  uint64_t uncompressed_bytes = 0;
  uint64_t local_header_offset = 0;
};

// "member 'NAME'" for a message: the name comes from the archive, so it is escaped (a NUL in
// it would end the message, a control character would reach the terminal) and cut (a ZIP name
// may take 64 KiB, six times that escaped).
std::string member_label(const Member& m) {
  return str("member '", detail::cut_for_message(detail::escaped(m.name), 200), "'");
}

class ZipReader {
 public:
  ZipReader(std::span<const std::byte> bytes, std::string_view what) : bytes_(bytes), what_(what) {}

  std::vector<Member> read_central_directory() {
    const size_t eocd = find_end_of_central_directory();
    const std::byte* p = bytes_.data() + eocd;
    uint64_t disk = load_le16(p + 4), cd_disk = load_le16(p + 6);
    uint64_t entries = load_le16(p + 10);
    uint64_t cd_bytes = load_le32(p + 12);
    uint64_t cd_offset = load_le32(p + 16);
    // Where the central directory ends: at the end record, or at the ZIP64 one before it.
    size_t directory_end = eocd;
    if (eocd >= kZip64LocatorBytes &&
        load_le32(bytes_.data() + eocd - kZip64LocatorBytes) == kZip64LocatorSignature) {
      const size_t record = find_zip64_end_of_central_directory(eocd - kZip64LocatorBytes);
      const std::byte* z = bytes_.data() + record;
      disk = load_le32(z + 16);
      cd_disk = load_le32(z + 20);
      entries = load_le64(z + 32);
      cd_bytes = load_le64(z + 40);
      cd_offset = load_le64(z + 48);
      directory_end = record;
    }
    if (disk != 0 || cd_disk != 0) fail("multi-volume ZIP archives are not supported");
    const size_t archive_start = find_archive_start(eocd, directory_end, entries, cd_bytes, cd_offset);
    if (entries > cd_bytes / kCentralHeaderBytes)
      fail(str("central directory claims ", entries, " entries but holds only ", cd_bytes,
               " bytes"));

    std::vector<Member> members;
    members.reserve(static_cast<size_t>(entries));
    std::set<std::string> seen;
    // find_archive_start() checked that the directory lies within the file.
    size_t pos = archive_start + static_cast<size_t>(cd_offset);
    const size_t end = pos + static_cast<size_t>(cd_bytes);
    for (uint64_t i = 0; i < entries; ++i) {
      if (kCentralHeaderBytes > end - pos) fail(str("central directory entry ", i, " is truncated"));
      const std::byte* h = bytes_.data() + pos;
      if (load_le32(h) != kCentralHeaderSignature)
        fail(str("central directory entry ", i, " at offset ", pos, " has a bad signature"));
      Member m;
      m.flags = load_le16(h + 8);
      m.method = load_le16(h + 10);
      m.crc32 = load_le32(h + 16);
      m.compressed_bytes = load_le32(h + 20);
      m.uncompressed_bytes = load_le32(h + 24);
      size_t name_len = load_le16(h + 28), extra_len = load_le16(h + 30),
             comment_len = load_le16(h + 32);
      uint32_t disk_start = load_le16(h + 34);
      m.local_header_offset = load_le32(h + 42);
      size_t variable = name_len + extra_len + comment_len;
      if (variable > end - pos - kCentralHeaderBytes)
        fail(str("central directory entry ", i, " is truncated"));
      m.stored_name.assign(reinterpret_cast<const char*>(h + kCentralHeaderBytes), name_len);
      m.name = member_name_text(m.stored_name, m.flags);
      apply_zip64_extra(m, disk_start, h + kCentralHeaderBytes + name_len, extra_len);
      // Offsets count from the archive's start; from here on they are offsets in the file.
      if (m.local_header_offset > bytes_.size() - archive_start)
        fail(str(member_label(m), ": local header offset ", m.local_header_offset, " is past the end of the file"));
      m.local_header_offset += archive_start;
      if (!seen.insert(m.name).second) fail(str(member_label(m), " appears twice"));
      members.push_back(std::move(m));
      pos += kCentralHeaderBytes + variable;
    }
    return members;
  }

  // A member's bytes after CRC check: a span of the archive for a stored member, or of
  // `inflated`, a new host storage, for a deflated one.
  struct MemberBytes {
    std::span<const std::byte> bytes;
    UntypedStorage inflated;
  };

  // The member's stored bytes (deflated or not), after checking its method and local header.
  std::span<const std::byte> locate_member(const Member& m) {
    std::string where = member_label(m);
    if (m.flags & kFlagEncrypted) fail(str(where, " is encrypted"));
    if (m.method != kMethodStored && m.method != kMethodDeflated)
      fail(str(where, " uses compression method ", m.method,
               "; only stored (0) and deflated (8) are supported"));
    uint64_t lh = m.local_header_offset;
    if (lh > bytes_.size() || kLocalHeaderBytes > bytes_.size() - lh)
      fail(str(where, ": local header offset ", lh, " is past the end of the file"));
    const std::byte* h = bytes_.data() + lh;
    if (load_le32(h) != kLocalHeaderSignature)
      fail(str(where, ": no local header at offset ", lh));
    if (load_le16(h + 8) != m.method)
      fail(str(where, ": local header and central directory disagree on the compression method"));
    size_t name_len = load_le16(h + 26), extra_len = load_le16(h + 28);
    uint64_t data_offset = lh + kLocalHeaderBytes + name_len + extra_len;
    if (data_offset > bytes_.size() || m.compressed_bytes > bytes_.size() - data_offset)
      fail(str(where, ": ", m.compressed_bytes, " bytes of data at offset ", data_offset,
               " run past the end of the file (", bytes_.size(), " bytes); is it truncated?"));
    std::string_view local_name(reinterpret_cast<const char*>(h + kLocalHeaderBytes), name_len);
    if (local_name != m.stored_name)
      fail(str(where, ": the local header names it '", detail::escaped(member_name_text(local_name, load_le16(h + 6))), "'"));
    if (m.method == kMethodDeflated) check_deflate_ratio(m, where);
    return {bytes_.data() + data_offset, static_cast<size_t>(m.compressed_bytes)};
  }

  MemberBytes read_member(const Member& m) {
    std::string where = member_label(m);
    const std::byte* data = locate_member(m).data();
    MemberBytes out;
    if (m.method == kMethodStored) {
      if (m.compressed_bytes != m.uncompressed_bytes)
        fail(str(where, " is stored but its sizes differ (", m.compressed_bytes, " vs ",
                 m.uncompressed_bytes, ")"));
      out.bytes = {data, static_cast<size_t>(m.compressed_bytes)};
    } else {
      out.inflated = inflate_member(m, data, where);
      out.bytes = {out.inflated.data(), static_cast<size_t>(out.inflated.nbytes())};
    }
    uint32_t crc = static_cast<uint32_t>(
        crc32_z(0, reinterpret_cast<const Bytef*>(out.bytes.data()), out.bytes.size()));
    if (crc != m.crc32)
      throw ChecksumError(str(what_, ": ", where, ": CRC-32 mismatch (stored ", std::hex, m.crc32,
                              ", computed ", crc, "); the archive is corrupt"));
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw FormatError(str(what_, ": ", why));
  }

  // The end-of-central-directory record (EOCD). The format puts it last, followed only by its
  // comment, so the record whose comment length reaches exactly the end of the file is the
  // one. Failing that, the last record signature whose 22 bytes are all there, within the
  // last 64 KiB + 22 bytes: what Python's zipfile (and so np.load) takes, so that bytes
  // appended after an archive (`cat x.npz more > y.npz`) or a comment length that runs past
  // the end of the file do not hide an archive numpy reads. Such a record is trusted no more
  // than the exact one: the central directory it points to must be there, signatures and all.
  size_t find_end_of_central_directory() const {
    if (bytes_.size() < kEndOfCentralDirBytes)
      fail(str("not a ZIP archive: ", bytes_.size(), " bytes is too short"));
    const size_t last = bytes_.size() - kEndOfCentralDirBytes;
    const size_t first = last > kMaxBytesAfterEndOfCentralDir ? last - kMaxBytesAfterEndOfCentralDir : 0;
    std::optional<size_t> last_signature;
    for (size_t pos = last + 1; pos-- > first;) {
      const std::byte* p = bytes_.data() + pos;
      if (load_le32(p) != kEndOfCentralDirSignature) continue;
      if (load_le16(p + 20) == last - pos) return pos;
      if (!last_signature) last_signature = pos;
    }
    if (last_signature) return *last_signature;
    const size_t searched = bytes_.size() - first;
    if (load_le32(bytes_.data()) == kLocalHeaderSignature)
      fail(str("no end-of-central-directory record in the last ", searched, " bytes, though the file starts as a ZIP ",
               "archive does: it is truncated, or more than 64 KiB of other bytes follow the archive"));
    if (std::memcmp(bytes_.data(), detail::kNpyMagic, detail::kNpyMagicBytes) == 0)
      fail("not a ZIP archive: no end-of-central-directory record; it is an .npy file, not an .npz");
    fail(str("not a ZIP archive: no end-of-central-directory record in its last ", searched, " bytes"));
  }

  // The ZIP64 end-of-central-directory record of the locator at `locator`: where the locator
  // says; or, as zipfile reads it, just before the locator, where writers put it: in an
  // archive that follows other bytes (below), the locator's offset counts from the
  // archive's start, not the file's.
  size_t find_zip64_end_of_central_directory(size_t locator) const {
    const uint64_t declared = load_le64(bytes_.data() + locator + 8);
    const auto holds_record = [&](uint64_t at) {
      return at <= locator && kZip64EndOfCentralDirBytes <= locator - at &&
             load_le32(bytes_.data() + at) == kZip64EndOfCentralDirSignature;
    };
    if (holds_record(declared)) return static_cast<size_t>(declared);
    if (locator >= kZip64EndOfCentralDirBytes && holds_record(locator - kZip64EndOfCentralDirBytes))
      return locator - kZip64EndOfCentralDirBytes;
    fail(str("the ZIP64 end-of-central-directory locator at offset ", locator, " points to offset ", declared,
             ", but no ZIP64 end-of-central-directory record is there or just before the locator; the "
             "archive is truncated or corrupt"));
  }

  // How many bytes precede the archive in the file (a self-extractor's stub, a file it was
  // appended to): the archive's offsets count from its own start. Found as zipfile finds it,
  // from where the central directory actually lies: it ends where the (ZIP64) end record
  // begins, at `directory_end`, so it starts `cd_bytes` before; the difference from
  // `cd_offset`, its offset in the archive, is the prefix. Failing that, the directory may
  // lie where `cd_offset` says with a gap before the end record (the format allows it;
  // zipfile does not read it). Either way, the directory lies within the file and starts
  // with a central header's signature (when it holds any entry).
  size_t find_archive_start(size_t eocd, size_t directory_end, uint64_t entries, uint64_t cd_bytes,
                            uint64_t cd_offset) const {
    const auto holds_directory = [&](uint64_t at) {
      return entries == 0 || (at <= bytes_.size() && kCentralHeaderBytes <= bytes_.size() - at &&
                              load_le32(bytes_.data() + at) == kCentralHeaderSignature);
    };
    const std::string record = str("the end-of-central-directory record at offset ", eocd);
    if (cd_bytes > directory_end)
      fail(str(record, " gives a central directory of ", cd_bytes, " bytes, more than the ", directory_end,
               " bytes before it; the archive is truncated at its start or corrupt"));
    const size_t located = directory_end - static_cast<size_t>(cd_bytes);
    if (located >= cd_offset && holds_directory(located)) return located - static_cast<size_t>(cd_offset);
    if (cd_offset <= directory_end && cd_bytes <= directory_end - cd_offset && holds_directory(cd_offset)) return 0;
    if (located < cd_offset && holds_directory(located))
      fail(str(record, " places the central directory at offset ", cd_offset, ", but it lies at offset ", located,
               ", before it: ", cd_offset - located, " bytes are missing from the archive's start, or it is corrupt"));
    fail(str(record, " gives a central directory of ", cd_bytes, " bytes at offset ", cd_offset,
             ", but none is there, nor just before the record (offset ", located,
             "); the archive is truncated or corrupt"));
  }

  // Fields saturated at 0xFFFF... in the fixed header are carried in the ZIP64 extra field,
  // in this order: uncompressed size, compressed size, local header offset, disk number.
  void apply_zip64_extra(Member& m, uint32_t disk_start, const std::byte* extra, size_t extra_len) {
    bool need_uncompressed = m.uncompressed_bytes == 0xFFFFFFFF;
    bool need_compressed = m.compressed_bytes == 0xFFFFFFFF;
    bool need_offset = m.local_header_offset == 0xFFFFFFFF;
    bool need_disk = disk_start == 0xFFFF;
    size_t pos = 0;
    while (extra_len - pos >= 4) {
      uint16_t id = load_le16(extra + pos), size = load_le16(extra + pos + 2);
      pos += 4;
      if (size > extra_len - pos) fail(str(member_label(m), ": extra field runs past its entry"));
      if (id == kZip64ExtraId) {
        const std::byte* f = extra + pos;
        size_t left = size;
        auto take64 = [&](uint64_t& out) {
          if (left < 8) fail(str(member_label(m), ": ZIP64 extra field is too short"));
          out = load_le64(f);
          f += 8;
          left -= 8;
        };
        if (need_uncompressed) take64(m.uncompressed_bytes), need_uncompressed = false;
        if (need_compressed) take64(m.compressed_bytes), need_compressed = false;
        if (need_offset) take64(m.local_header_offset), need_offset = false;
        if (need_disk) {
          if (left < 4) fail(str(member_label(m), ": ZIP64 extra field is too short"));
          disk_start = load_le32(f);
          need_disk = false;
        }
      }
      pos += size;
    }
    if (need_uncompressed || need_compressed || need_offset)
      fail(str(member_label(m), " needs a ZIP64 extra field but has none"));
    if (disk_start != 0) fail("multi-volume ZIP archives are not supported");
  }

  void check_deflate_ratio(const Member& m, const std::string& where) {
    if (m.uncompressed_bytes / kMaxDeflateRatio > m.compressed_bytes + 1)
      fail(str(where, " claims ", m.uncompressed_bytes, " bytes from ", m.compressed_bytes,
               " deflated bytes, more than deflate can produce"));
    if (m.uncompressed_bytes > static_cast<uint64_t>(INT64_MAX))
      fail(str(where, ": size ", m.uncompressed_bytes, " is too large"));
  }

  // The member inflated whole. Its messages are DeflatedMember's (the packer's streaming
  // path), so one archive gets the same verdict either way.
  UntypedStorage inflate_member(const Member& m, const std::byte* data, const std::string& where) {
    UntypedStorage out = UntypedStorage::allocate(static_cast<int64_t>(m.uncompressed_bytes));
    z_stream zs{};
    if (inflateInit2(&zs, -MAX_WBITS) != Z_OK)  // raw deflate: ZIP has no zlib wrapper
      throw Error(str(what_, ": zlib inflateInit2 failed"));
    uint64_t in_left = m.compressed_bytes, out_left = m.uncompressed_bytes;
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(data));
    zs.next_out = reinterpret_cast<Bytef*>(out.mutable_data());  // zlib advances it slice by slice
    // Once the declared bytes are out, one spare byte tells a stream that ends there from one
    // that would give more (and zlib needs somewhere to write even for a 0-byte member).
    std::byte spare{};
    bool probing = false;
    int rc = Z_OK;
    for (;;) {
      check_load_cancelled();
      // zlib counts in 32-bit unsigned ints; feed it in slices.
      if (zs.avail_in == 0 && in_left > 0) {
        zs.avail_in = static_cast<uInt>(std::min<uint64_t>(in_left, UINT_MAX));
        in_left -= zs.avail_in;
      }
      if (zs.avail_out == 0) {
        if (out_left > 0) {
          zs.avail_out = static_cast<uInt>(std::min<uint64_t>(out_left, kInflateStepBytes));
          out_left -= zs.avail_out;
        } else if (!probing) {
          probing = true;
          zs.next_out = reinterpret_cast<Bytef*>(&spare);
          zs.avail_out = 1;
        } else {
          break;  // the spare byte was written
        }
      }
      rc = inflate(&zs, Z_NO_FLUSH);
      if (rc != Z_OK) break;  // Z_STREAM_END, or no progress possible (Z_BUF_ERROR), or corrupt
    }
    const uint64_t produced = zs.total_out;
    const std::string zmsg = zs.msg ? zs.msg : "zlib error";
    inflateEnd(&zs);
    if (produced > m.uncompressed_bytes)
      fail(str(where, ": inflates to more than the ", m.uncompressed_bytes, " bytes declared"));
    if (rc == Z_MEM_ERROR) throw Error(str(what_, ": ", where, ": out of memory while inflating it"));
    if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT || rc == Z_STREAM_ERROR)
      fail(str(where, ": corrupt deflate data (", zmsg, ")"));
    if (produced < m.uncompressed_bytes)
      fail(str(where, ": deflate data ends after ", produced, " of ", m.uncompressed_bytes,
               " bytes; the archive is truncated or corrupt"));
    if (rc != Z_STREAM_END)
      fail(str(where, ": deflate data does not end after the ", m.uncompressed_bytes, " bytes declared"));
    return out;
  }

  std::span<const std::byte> bytes_;
  std::string what_;
};

}  // namespace

// ---- DeflatedMember ----
namespace detail {

struct DeflatedMember::Stream {
  UntypedStorage archive;  // keeps `deflated` mapped
  std::span<const std::byte> deflated;
  uint64_t inflated_bytes = 0;
  uint32_t expected_crc = 0;
  std::string what;
  z_stream zs{};
  uint64_t in_fed = 0;    // deflated bytes handed to zlib
  uint64_t position = 0;  // inflated bytes produced
  uLong crc = 0;
  bool open = false;

  [[noreturn]] void fail(const std::string& message) const { throw FormatError(str(what, ": ", message)); }

  // inflate() reads the archive's mapping: a file shrunk by another program while it is
  // packed fails the read with IoError instead of killing the process with SIGBUS.
  int guarded_inflate() {
    return guard_mapped_reads(MappedRegion{&archive.filename(), archive.data(), archive.nbytes()},
                              [&] { return inflate(&zs, Z_NO_FLUSH); });
  }

  // Hands zlib the next slice of the deflated bytes once it has used the last: it counts in
  // 32-bit unsigned ints.
  void feed() {
    if (zs.avail_in != 0 || in_fed >= deflated.size()) return;
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(deflated.data() + in_fed));
    zs.avail_in = static_cast<uInt>(std::min<uint64_t>(deflated.size() - in_fed, UINT_MAX));
    in_fed += zs.avail_in;
  }

  void start() {
    if (open) inflateEnd(&zs);
    zs = z_stream{};
    open = false;
    if (inflateInit2(&zs, -MAX_WBITS) != Z_OK) throw Error(str(what, ": zlib inflateInit2 failed"));
    open = true;
    in_fed = position = 0;
    crc = crc32_z(0, nullptr, 0);
  }

  // Inflates the next `n` bytes into `dst`; at the member's end, checks that nothing follows
  // and the CRC-32.
  void inflate_into(std::byte* dst, uint64_t n) {
    if (n > inflated_bytes - position)
      fail(str("reading past the ", inflated_bytes, " bytes the member inflates to"));
    uint64_t out_left = n;
    zs.next_out = reinterpret_cast<Bytef*>(dst);
    zs.avail_out = 0;
    while (out_left > 0 || zs.avail_out > 0) {
      check_load_cancelled();
      feed();
      if (zs.avail_out == 0) {
        zs.avail_out = static_cast<uInt>(std::min<uint64_t>(out_left, kInflateStepBytes));
        out_left -= zs.avail_out;
      }
      const uInt before = zs.avail_out;
      const int rc = guarded_inflate();
      position += before - zs.avail_out;
      if (rc == Z_MEM_ERROR) throw Error(str(what, ": out of memory while inflating it"));
      if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT)
        fail(str("corrupt deflate data (", zs.msg ? zs.msg : "zlib error", ")"));
      if ((rc == Z_STREAM_END || rc == Z_BUF_ERROR) && zs.avail_out > 0)
        fail(str("deflate data ends after ", position, " of ", inflated_bytes,
                 " bytes; the archive is truncated or corrupt"));
    }
    // (crc32_z of a null buffer is the initial value: a read of nothing, as an empty record
    // makes, must leave the running CRC alone.)
    if (n > 0) crc = crc32_z(crc, reinterpret_cast<const Bytef*>(dst), n);
    if (position == inflated_bytes) finish();
  }

  void finish() {
    std::byte extra{};
    zs.next_out = reinterpret_cast<Bytef*>(&extra);
    zs.avail_out = 1;
    int rc = Z_OK;
    while (rc == Z_OK && zs.avail_out == 1) {
      feed();
      rc = guarded_inflate();
      if (rc == Z_BUF_ERROR) break;
    }
    if (zs.avail_out == 0) fail(str("inflates to more than the ", inflated_bytes, " bytes declared"));
    if (rc != Z_STREAM_END) fail(str("deflate data does not end after the ", inflated_bytes, " bytes declared"));
    if (crc != expected_crc)
      throw ChecksumError(str(what, ": CRC-32 mismatch (stored ", std::hex, expected_crc, ", computed ", crc,
                              "); the archive is corrupt"));
  }
};

DeflatedMember::DeflatedMember(UntypedStorage archive, std::span<const std::byte> deflated, uint64_t inflated_bytes,
                               uint32_t crc32, std::string what)
    : stream_(std::make_unique<Stream>()) {
  stream_->archive = std::move(archive);
  stream_->deflated = deflated;
  stream_->inflated_bytes = inflated_bytes;
  stream_->expected_crc = crc32;
  stream_->what = std::move(what);
  stream_->start();
}

DeflatedMember::~DeflatedMember() {
  if (stream_->open) inflateEnd(&stream_->zs);
}

void DeflatedMember::read(int64_t offset, std::byte* dst, int64_t n) {
  std::lock_guard lock(mutex_);
  Stream& s = *stream_;
  MMT_CHECK(offset >= 0 && n >= 0, ValueError, s.what, ": read of ", n, " bytes at ", offset);
  try {
    if (static_cast<uint64_t>(offset) < s.position) s.start();
    skip_to(static_cast<uint64_t>(offset));
    s.inflate_into(dst, static_cast<uint64_t>(n));
  } catch (...) {
    s.start();  // a later read starts over instead of resuming a stream left part-way
    throw;
  }
}

void DeflatedMember::check_rest() {
  std::lock_guard lock(mutex_);
  // At the end already: the read that got there checked it.
  if (stream_->position == stream_->inflated_bytes) return;
  try {
    skip_to(stream_->inflated_bytes);  // the last piece checks the size and the CRC-32
  } catch (...) {
    stream_->start();
    throw;
  }
}

void DeflatedMember::skip_to(uint64_t offset) {
  Stream& s = *stream_;
  std::vector<std::byte> skipped;
  while (s.position < offset) {
    skipped.resize(static_cast<size_t>(std::min<uint64_t>(offset - s.position, 1 << 16)));
    s.inflate_into(skipped.data(), skipped.size());
  }
}

}  // namespace detail

namespace {

// A deflated member as a DeflatedMember, its header read from the first bytes inflated: the
// packer inflates C-order values a batch of records at a time, and Fortran-order ones into a
// temporary file (fortran_values_in_temporary_file). nullopt for a member that holds nothing.
std::optional<detail::NpyValues> stream_member(ZipReader& zip, const Member& m, std::string_view what,
                                               const UntypedStorage& archive) {
  detail::NpyValues values;
  values.name = m.name.substr(0, m.name.size() - 4);  // without ".npy"
  values.what = str(what, ":", detail::escaped(m.name));
  auto deflated = std::make_shared<detail::DeflatedMember>(archive, zip.locate_member(m), m.uncompressed_bytes,
                                                           m.crc32, str(what, ": ", member_label(m)));
  std::vector<std::byte> prefix(static_cast<size_t>(std::min<uint64_t>(m.uncompressed_bytes, 12 + kMaxNpyHeaderBytes)));
  deflated->read(0, prefix.data(), static_cast<int64_t>(prefix.size()));
  values.header = parse_npy_header(prefix, values.what);
  detail::check_npy_data_size(values.header, m.uncompressed_bytes - static_cast<uint64_t>(values.header.data_offset),
                              values.what, detail::NpySource::ArchiveMember);
  if (values.header.data_nbytes == 0) return std::nullopt;
  values.deflated = std::move(deflated);
  values.data_offset = values.header.data_offset;
  return values;
}

// `backing`, when given, owns `bytes` (the archive's mapping): a stored member's values then
// stay where they lie in it, so a large stored .npz is not held in memory twice. Without it,
// a stored member's bytes are copied out of the caller's buffer.
std::vector<detail::NpyValues> parse_npz_values(std::span<const std::byte> bytes, std::string_view what,
                                                const UntypedStorage* backing, bool stream_deflated = false) {
  ZipReader zip(bytes, what);
  std::vector<detail::NpyValues> out;
  // The members of a ZIP never share bytes, so their stored sizes add up to less than the
  // archive. Members whose data overlap (a zip bomb: many headers over one deflate stream)
  // would each inflate within deflate's ratio and together to many times the archive.
  uint64_t member_bytes_total = 0;
  for (const Member& m : zip.read_central_directory()) {
    if (m.compressed_bytes > bytes.size())  // alone: locate_member would say it, too late
      throw FormatError(str(what, ": ", member_label(m), ": ", m.compressed_bytes, " bytes of data run past the end "
                            "of the file (", bytes.size(), " bytes); is it truncated?"));
    if (m.compressed_bytes > bytes.size() - member_bytes_total)
      throw FormatError(str(what, ": ", member_label(m), " brings the members' stored bytes past the ",
                            bytes.size(), " bytes of the archive: members overlap, which a ZIP file never does"));
    member_bytes_total += m.compressed_bytes;
    constexpr std::string_view kSuffix = ".npy";
    if (m.name.size() <= kSuffix.size() || !m.name.ends_with(kSuffix))
      throw FormatError(str(what, ": ", member_label(m),
                            " is not an .npy array (an .npz holds only NAME.npy members)"));
    if (stream_deflated && backing && m.method == kMethodDeflated) {
      if (auto streamed = stream_member(zip, m, what, *backing)) {
        out.push_back(std::move(*streamed));
        continue;
      }
    }
    auto member = zip.read_member(m);
    detail::NpyValues values;
    values.name = m.name.substr(0, m.name.size() - kSuffix.size());
    values.what = str(what, ":", detail::escaped(m.name));
    values.header = parse_npy_header(member.bytes, values.what);
    detail::check_npy_data_size(values.header, member.bytes.size() - static_cast<size_t>(values.header.data_offset),
                                values.what, detail::NpySource::ArchiveMember);
    const std::byte* data = member.bytes.data() + values.header.data_offset;
    if (member.inflated.nbytes() != 0) {
      values.storage = std::move(member.inflated);
      values.data_offset = values.header.data_offset;
    } else if (backing) {
      values.storage = *backing;
      values.data_offset = data - backing->data();
    } else if (values.header.data_nbytes > 0) {
      values.storage = UntypedStorage::allocate(values.header.data_nbytes);
      std::memcpy(values.storage.mutable_data(), data, static_cast<size_t>(values.header.data_nbytes));
    }
    out.push_back(std::move(values));
  }
  return out;
}

std::vector<NpzMember> arrays_of(std::vector<detail::NpyValues> members) {
  std::vector<NpzMember> out;
  out.reserve(members.size());
  for (detail::NpyValues& m : members)
    out.push_back({std::move(m.name), detail::npy_tensor_over(m.storage, m.data_offset, m.header, m.what)});
  return out;
}

}  // namespace

namespace detail {
std::vector<NpyValues> map_npz_values(const std::string& path) {
  detail::InputFile file = detail::map_input_file(path);
  return parse_npz_values(file.bytes, path, &file.mapping, /*stream_deflated=*/true);
}
}  // namespace detail

std::vector<NpzMember> parse_npz(std::span<const std::byte> bytes, std::string_view what) {
  return arrays_of(parse_npz_values(bytes, what, nullptr));
}

std::vector<NpzMember> load_npz(const std::string& path, bool mmap) {
  detail::InputFile file = detail::map_input_file(path);
  return arrays_of(parse_npz_values(file.bytes, path, mmap ? &file.mapping : nullptr));
}

}  // namespace mmt
