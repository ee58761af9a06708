#include "tar_reader.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string_view>

#include "mapping_guard.h"
#include "mmtensor/error.h"
#include "utf8.h"

namespace mmt::detail {

namespace {

constexpr int64_t kBlock = 512;
// A pax header holds a few key=value records; a GNU long name, one path. Far above any real
// one, and low enough that a damaged size field cannot make the reader allocate gigabytes.
constexpr int64_t kMaxExtendedHeaderBytes = int64_t{1} << 20;

using Block = std::array<char, kBlock>;

// Header fields (POSIX ustar): offset and width.
struct FieldAt {
  size_t offset, width;
};
constexpr FieldAt kName{0, 100}, kSize{124, 12}, kChecksum{148, 8}, kTypeFlag{156, 1}, kMagic{257, 6},
    kPrefix{345, 155};

std::string_view text_of(const Block& block, FieldAt field) {
  const char* begin = block.data() + field.offset;
  return {begin, strnlen(begin, field.width)};
}

// A numeric field: octal digits, optionally led by spaces and ended by spaces or NULs; or
// (GNU, for values past 8 GiB) base-256, marked by the top bit of its first byte. nullopt
// for anything else, and for a value past int64.
std::optional<int64_t> number_of(const Block& block, FieldAt field) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(block.data() + field.offset);
  if (bytes[0] & 0x80) {
    if (bytes[0] != 0x80) return std::nullopt;  // negative, or past int64 in its first byte
    uint64_t value = 0;
    for (size_t i = 1; i < field.width; ++i) {
      if (value > (UINT64_MAX >> 8)) return std::nullopt;
      value = (value << 8) | bytes[i];
    }
    if (value > static_cast<uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<int64_t>(value);
  }
  size_t i = 0;
  while (i < field.width && bytes[i] == ' ') ++i;
  uint64_t value = 0;
  size_t digits = 0;
  for (; i < field.width && bytes[i] >= '0' && bytes[i] <= '7'; ++i, ++digits) {
    if (value > (static_cast<uint64_t>(INT64_MAX) >> 3)) return std::nullopt;
    value = (value << 3) | (bytes[i] - '0');
  }
  for (; i < field.width; ++i)
    if (bytes[i] != ' ' && bytes[i] != '\0') return std::nullopt;
  if (digits == 0) return std::nullopt;
  return static_cast<int64_t>(value);
}

bool is_zero_block(const Block& block) {
  return std::all_of(block.begin(), block.end(), [](char c) { return c == 0; });
}

// The checksum field holds the sum of the header's bytes with the field itself taken as
// spaces; historic writers summed signed chars, so either sum is accepted.
bool checksum_holds(const Block& block) {
  const std::optional<int64_t> stored = number_of(block, kChecksum);
  if (!stored) return false;
  int64_t unsigned_sum = 0, signed_sum = 0;
  for (size_t i = 0; i < block.size(); ++i) {
    const bool in_field = i >= kChecksum.offset && i < kChecksum.offset + kChecksum.width;
    const char c = in_field ? ' ' : block[i];
    unsigned_sum += static_cast<unsigned char>(c);
    signed_sum += static_cast<signed char>(c);
  }
  return *stored == unsigned_sum || *stored == signed_sum;
}

const char* member_kind(char type) {
  switch (type) {
    case '1': return "a hard link";
    case '2': return "a symbolic link";
    case '3': return "a character device";
    case '4': return "a block device";
    case '6': return "a FIFO";
    case 'S': return "a GNU sparse file";
    case 'M': return "a GNU multi-volume continuation";
    default: return nullptr;
  }
}

class TarWalk {
 public:
  explicit TarWalk(const UntypedStorage& archive)
      : archive_(archive),
        region_{&archive.filename(), archive.data(), archive.nbytes()},
        file_bytes_(archive.nbytes()) {}

  void run(const std::function<void(const TarMember&)>& on_member) {
    int64_t offset = 0;
    std::optional<std::string> long_name;  // from a pax path= or a GNU 'L' header, for the next member
    int64_t pax_size = -1;                 // from a pax size=, for the next member; -1: none
    int64_t extended_header_at = -1;       // where the pending long name or size was read
    int64_t members = 0;
    bool marked_end = false;
    while (offset < file_bytes_) {
      MMT_CHECK(file_bytes_ - offset >= kBlock, FormatError, where(offset), "the archive ends ", file_bytes_ - offset,
                " bytes into a header block (it is truncated)");
      const Block block = read_block(offset);
      if (is_zero_block(block)) {  // the end-of-archive marker (two blocks; tar takes one)
        marked_end = true;
        break;
      }
      MMT_CHECK(checksum_holds(block), FormatError, where(offset), "the header's checksum does not hold",
                members == 0 ? " (not a tar archive)" : " (damaged)");
      const std::optional<int64_t> header_size = number_of(block, kSize);
      MMT_CHECK(header_size.has_value(), FormatError, where(offset), "the size field is not a number");
      const char type = block[kTypeFlag.offset];
      const bool regular = type == '0' || type == '\0' || type == '7';
      const int64_t size = regular && pax_size >= 0 ? pax_size : *header_size;
      const int64_t data_offset = offset + kBlock;
      MMT_CHECK(size <= file_bytes_ - data_offset, FormatError, where(offset), "a member of ", size,
                " bytes runs past the end of the file (", file_bytes_ - data_offset, " bytes left: truncated)");
      // The next header: past the data, padded to a block. A file that ends inside the
      // padding was cut short (after this member, or in the middle of a sample), as tar says.
      const int64_t padded = size + (kBlock - size % kBlock) % kBlock;
      MMT_CHECK(padded <= file_bytes_ - data_offset, FormatError, where(file_bytes_), "the archive ends inside the ",
                "padding after the data of the member whose header is at byte ", offset, " (it is truncated)");
      const int64_t next = data_offset + padded;
      if (type == 'x' || type == 'L') {
        MMT_CHECK(size <= kMaxExtendedHeaderBytes, FormatError, where(offset), "an extended header of ", size,
                  " bytes (more than ", kMaxExtendedHeaderBytes, ")");
        const std::string data = read_bytes(data_offset, size);
        if (type == 'L') {
          long_name = std::string(data.c_str());  // NUL-terminated
        } else {
          read_pax(data, offset, long_name, pax_size);
        }
        if (extended_header_at < 0) extended_header_at = offset;
        offset = next;
        continue;
      }
      if (type == 'g' || type == 'K' || type == '5' || type == 'V') {  // global pax, link name, folder, label
        if (type == '5' || type == 'V') {
          long_name.reset();
          pax_size = -1;
          extended_header_at = -1;
        }
        offset = next;
        continue;
      }
      std::string name = long_name ? *long_name : header_name(block);
      if (const char* kind = member_kind(type))
        throw FormatError(str(where(offset), "member '", cut_for_message(name, 200), "' is ", kind,
                              "; only regular files can be packed"));
      MMT_CHECK(regular, FormatError, where(offset), "member '", cut_for_message(name, 200), "' has type '",
                printable_char(type), "', not a regular file's");
      MMT_CHECK(!name.empty(), FormatError, where(offset), "a member has an empty name");
      TarMember member{.name = std::move(name),
                       .header_offset = extended_header_at >= 0 ? extended_header_at : offset,
                       .data_offset = data_offset,
                       .size = size};
      on_member(member);
      ++members;
      long_name.reset();
      pax_size = -1;
      extended_header_at = -1;
      offset = next;
    }
    MMT_CHECK(extended_header_at < 0, FormatError, where(extended_header_at),
              "an extended header is followed by no member (the archive is truncated)");
    // Without the marker, the file may end anywhere between members: samples after a cut on a
    // block boundary would be lost without a word (an interrupted download, a full disk).
    MMT_CHECK(marked_end, FormatError, where(file_bytes_), "the archive ends without its end-of-archive marker (a ",
              "zero block) after ", members, " members (it is truncated)");
  }

 private:
  std::string where(int64_t offset) const { return str(archive_.filename(), ": byte ", offset, ": "); }

  static std::string printable_char(char c) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f) return std::string(1, c);
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", byte);
    return hex;
  }

  Block read_block(int64_t offset) const {
    Block block;
    guard_mapped_reads(region_, [&] { std::memcpy(block.data(), archive_.data() + offset, kBlock); });
    return block;
  }

  std::string read_bytes(int64_t offset, int64_t size) const {
    std::string out(static_cast<size_t>(size), '\0');
    guard_mapped_reads(region_, [&] { std::memcpy(out.data(), archive_.data() + offset, static_cast<size_t>(size)); });
    return out;
  }

  // POSIX ustar splits a long path into prefix and name; GNU's magic ("ustar  ") uses that
  // room for other fields.
  static std::string header_name(const Block& block) {
    const std::string_view name = text_of(block, kName);
    const bool posix = std::memcmp(block.data() + kMagic.offset, "ustar\0", 6) == 0;
    const std::string_view prefix = posix ? text_of(block, kPrefix) : std::string_view();
    return prefix.empty() ? std::string(name) : str(prefix, "/", name);
  }

  // Records "LENGTH KEY=VALUE\n", LENGTH counting the whole record. path= names the next
  // member, size= sizes it (past what an octal field holds); the other keys (times, owners)
  // say nothing a dataset keeps.
  void read_pax(std::string_view data, int64_t offset, std::optional<std::string>& name,
                int64_t& size) const {
    while (!data.empty() && data.front() != '\0') {
      const size_t space = data.find(' ');
      int64_t length = 0;
      // At most 18 digits: the length is below 10^18 and cannot overflow as it is read.
      bool well_formed = space != std::string_view::npos && space > 0 && space <= 18;
      for (size_t i = 0; well_formed && i < space; ++i) {
        well_formed = data[i] >= '0' && data[i] <= '9';
        length = length * 10 + (data[i] - '0');
      }
      well_formed = well_formed && length > static_cast<int64_t>(space) + 1 &&
                    length <= static_cast<int64_t>(data.size()) && data[static_cast<size_t>(length) - 1] == '\n';
      MMT_CHECK(well_formed, FormatError, where(offset), "a pax header record is malformed");
      const std::string_view record = data.substr(space + 1, static_cast<size_t>(length) - space - 2);
      const size_t equals = record.find('=');
      MMT_CHECK(equals != std::string_view::npos, FormatError, where(offset), "a pax header record has no '='");
      const std::string_view key = record.substr(0, equals), value = record.substr(equals + 1);
      // GNU tar's pax sparse files (--sparse --format=pax) are type '0' members whose data
      // begins with a map of the holes: read as a file, they would be packed as wrong bytes.
      MMT_CHECK(!key.starts_with("GNU.sparse."), FormatError, where(offset),
                "the next member is a GNU sparse file (pax key ", key, "); only regular files can be packed (pack it "
                "with tar's --sparse off)");
      if (key == "path") name = std::string(value);
      if (key == "size") {
        // Decimal digits only (from_chars would take a sign), and at most 18: below 10^18.
        int64_t parsed = 0;
        const bool digits_only = !value.empty() && value.size() <= 18 &&
                                 std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (digits_only) std::from_chars(value.data(), value.data() + value.size(), parsed);
        MMT_CHECK(digits_only, FormatError, where(offset), "the pax size '", cut_for_message(std::string(value), 40),
                  "' is not a size");
        size = parsed;
      }
      data.remove_prefix(static_cast<size_t>(length));
    }
  }

  const UntypedStorage& archive_;
  MappedRegion region_;
  int64_t file_bytes_;
};

}  // namespace

bool is_tar_start(const std::byte* bytes, int64_t n) {
  if (n < kBlock) return false;
  Block block{};
  std::memcpy(block.data(), bytes, block.size());
  // An archive of no members (what tar writes for an empty list, or a shard writer for an
  // empty shard) is its end-of-archive marker alone.
  return is_zero_block(block) || (std::memcmp(block.data() + kMagic.offset, "ustar", 5) == 0 && checksum_holds(block));
}

bool is_tar_file(const std::string& path) {
  Block block{};
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  const size_t got = std::fread(block.data(), 1, block.size(), f);
  std::fclose(f);
  return is_tar_start(reinterpret_cast<const std::byte*>(block.data()), static_cast<int64_t>(got));
}

void for_each_tar_member(const UntypedStorage& archive, const std::function<void(const TarMember&)>& on_member) {
  TarWalk(archive).run(on_member);
}

}  // namespace mmt::detail
