// .npz: stored and deflated members, ZIP64 fields, numpy's own archives (when numpy is
// installed), CRC checks and refusals of damaged or foreign archives.
#include <gtest/gtest.h>

#include <functional>

#include "importer_test_util.h"
#include "mmtensor/numpy_io.h"

namespace mmt {
namespace {

using testutil::Bytes;
using testutil::TempFolder;
using testutil::zip_archive;
using testutil::ZipEntry;

Bytes npy_of(const Tensor& t) { return npy_bytes(t); }

std::vector<ZipEntry> two_arrays(bool deflate) {
  return {{"images.npy", npy_of(arange(24, kUInt8).view({2, 3, 4})), deflate},
          {"labels.npy", npy_of(arange(2, kInt64)), deflate}};
}

using testutil::expect_format_error;

void expect_two_arrays(const std::vector<NpzMember>& members) {
  ASSERT_EQ(members.size(), 2u);
  EXPECT_EQ(members[0].name, "images");
  EXPECT_EQ(members[1].name, "labels");
  EXPECT_TRUE(members[0].array.equal(arange(24, kUInt8).view({2, 3, 4})));
  EXPECT_TRUE(members[1].array.equal(arange(2, kInt64)));
}

TEST(Npz, StoredMembersInArchiveOrder) {
  expect_two_arrays(parse_npz(zip_archive(two_arrays(false)), "a.npz"));
}

TEST(Npz, DeflatedMembers) {
  expect_two_arrays(parse_npz(zip_archive(two_arrays(true)), "a.npz"));
}

TEST(Npz, MixedAndZip64Members) {
  std::vector<ZipEntry> entries = two_arrays(false);
  entries[1].deflate = true;
  expect_two_arrays(parse_npz(zip_archive(entries), "mixed.npz"));
  expect_two_arrays(parse_npz(zip_archive(two_arrays(true), /*zip64=*/true), "z64.npz"));
  expect_two_arrays(parse_npz(zip_archive(two_arrays(false), /*zip64=*/true), "z64.npz"));
}

// A name without the UTF-8 flag is CP437, as Python's zipfile (and np.load) reads it; with
// the flag it is UTF-8. Both give the same field name.
TEST(Npz, MemberNamesAreCp437UnlessFlaggedUtf8) {
  const Bytes values = npy_of(arange(3, kInt32));
  ZipEntry cp437{"\x81" "ber_\xE1\xEE.npy", values, false};  // "über_ßε" in code page 437
  ZipEntry utf8{"\xC3\xA9t\xC3\xA9.npy", values, true};    // "été", flagged
  utf8.flags = 0x0800;
  ZipEntry ascii{"plain.npy", values, false};
  const std::vector<NpzMember> members = parse_npz(zip_archive({cp437, utf8, ascii}), "names.npz");
  ASSERT_EQ(members.size(), 3u);
  EXPECT_EQ(members[0].name, "\xC3\xBC" "ber_\xC3\x9F\xCE\xB5");
  EXPECT_EQ(members[1].name, "\xC3\xA9t\xC3\xA9");
  EXPECT_EQ(members[2].name, "plain");
  for (const NpzMember& member : members) EXPECT_TRUE(member.array.equal(arange(3, kInt32)));
}

TEST(Npz, LoadsFromDiskAndOutlivesTheMapping) {
  TempFolder dir;
  testutil::write_file(dir / "a.npz", zip_archive(two_arrays(false)));
  std::vector<NpzMember> members = load_npz(dir / "a.npz");
  std::filesystem::remove(dir / "a.npz");
  expect_two_arrays(members);
  EXPECT_THROW(load_npz(dir / "a.npz"), IoError);
}

// A stored byte array is a view into the archive's mapping (a large stored .npz is not held
// in memory twice); with mmap=false, or where its data is unaligned for its dtype, a copy.
TEST(Npz, StoredByteArraysAreViewsOfTheFile) {
  TempFolder dir;
  testutil::write_file(dir / "a.npz", zip_archive(two_arrays(false)));
  std::vector<NpzMember> mapped = load_npz(dir / "a.npz");
  expect_two_arrays(mapped);
  EXPECT_EQ(mapped[0].array.untyped_storage().filename(), dir / "a.npz");
  const bool labels_aligned = reinterpret_cast<uintptr_t>(mapped[1].array.data_ptr()) % 8 == 0;
  EXPECT_EQ(mapped[1].array.untyped_storage().filename().empty(), !labels_aligned);
  std::vector<NpzMember> copied = load_npz(dir / "a.npz", /*mmap=*/false);
  expect_two_arrays(copied);
  EXPECT_TRUE(copied[0].array.untyped_storage().filename().empty());
}

TEST(Npz, EmptyArchiveHasNoMembers) {
  EXPECT_TRUE(parse_npz(zip_archive({}), "empty.npz").empty());
}

TEST(Npz, CrcMismatchIsAChecksumError) {
  for (bool deflate : {false, true}) {
    Bytes archive = zip_archive({{"x.npy", npy_of(arange(100)), deflate}});
    // Central directory entry CRC field: flip one bit.
    size_t cd = archive.size() - 22 - 46 - 5;
    archive[cd + 16] ^= std::byte{1};
    EXPECT_THROW(parse_npz(archive, "crc.npz"), ChecksumError);
  }
  // Corrupting the stored data itself is caught by the same check.
  Bytes archive = zip_archive({{"x.npy", npy_of(arange(100)), false}});
  archive[30 + 5 + 200] ^= std::byte{0x40};
  EXPECT_THROW(parse_npz(archive, "crc.npz"), ChecksumError);
}

TEST(Npz, EveryTruncationIsRefusedCleanly) {
  for (bool deflate : {false, true}) {
    Bytes archive = zip_archive(two_arrays(deflate));
    for (size_t n = 0; n < archive.size(); ++n) {
      Bytes cut(archive.begin(), archive.begin() + static_cast<std::ptrdiff_t>(n));
      EXPECT_THROW(parse_npz(cut, "cut.npz"), FormatError) << n << " bytes";
    }
  }
}

TEST(Npz, CorruptDeflateDataIsRefused) {
  Bytes archive = zip_archive({{"x.npy", npy_of(arange(1000)), true}});
  for (size_t i = 40; i < 60; ++i) archive[i] = std::byte{0xFF};
  EXPECT_THROW(parse_npz(archive, "bad.npz"), FormatError);
}

TEST(Npz, RefusesWhatIsNotANumpyArchive) {
  auto refused = [](const Bytes& archive, const std::string& fragment) {
    std::string message = expect_format_error([&] { parse_npz(archive, "odd.npz"); });
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
    EXPECT_EQ(message.rfind("odd.npz", 0), 0u) << message;
  };
  refused(testutil::to_bytes("PK not really a zip file at all, no"), "no end-of-central-directory");
  refused(testutil::to_bytes("tiny"), "too short");
  refused(zip_archive({{"notes.txt", testutil::to_bytes("hello"), false}}), "not an .npy array");
  refused(zip_archive({{"x.npy", npy_of(arange(3)), false, /*method=*/12}}), "compression method 12");
  refused(zip_archive({{"x.npy", npy_of(arange(3)), false, 0xFFFF, /*flags=*/1}}), "encrypted");
  refused(zip_archive({{"x.npy", npy_of(arange(3))}, {"x.npy", npy_of(arange(3))}}), "appears twice");
  refused(zip_archive({{"x.npy", testutil::to_bytes("not an npy")}}), "odd.npz:x.npy: not an .npy");
}

// A NUL in a member name ended the message there: "member 'abc.npy" looked like a valid name,
// and a name "a\0x.npy" became a message of one letter. Names are escaped as they are quoted.
TEST(Npz, ControlBytesInMemberNamesAreEscapedInTheMessage) {
  using namespace std::string_literals;
  const auto refused = [](const Bytes& archive, const std::string& fragment) {
    std::string message = expect_format_error([&] { parse_npz(archive, "odd.npz"); });
    EXPECT_EQ(std::string(message.c_str()), message) << "what() is cut short";
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
  };
  refused(zip_archive({{"abc.npy\0.txt"s, npy_of(arange(3))}}),
          "odd.npz: member 'abc.npy\\x00.txt' is not an .npy array");
  refused(zip_archive({{"a\x1b[2J.npy"s, testutil::to_bytes("not an npy")}}),
          "odd.npz:a\\x1b[2J.npy: not an .npy file");
  refused(zip_archive({{"a\0.npy"s, npy_of(arange(3))}, {"a\0.npy"s, npy_of(arange(3))}}),
          "member 'a\\x00.npy' appears twice");
  // A member's own header is quoted with the escaped member name in front.
  refused(zip_archive({{"x.npy", testutil::npy_with_dict("{'descr': '<i4\0', 'fortran_order': False, 'shape': (2,)}"s,
                                                         Bytes(8))}}),
          "odd.npz:x.npy: unsupported dtype '<i4\\x00': not a numeric type");
}

// Layouts Python's zipfile opens (np.load through it, but for the stub: np.load sniffs the
// first bytes for "PK"): bytes appended after the archive, an end record whose comment length
// runs past the end of the file, and bytes before the archive (a self-extractor's stub),
// whose offsets then count from the archive's start. They were refused as "no
// end-of-central-directory record".
TEST(Npz, ReadsArchivesWithBytesAroundThemAsZipfileDoes) {
  for (bool zip64 : {false, true}) {
    for (bool deflate : {false, true}) {
      SCOPED_TRACE(testing::Message() << "zip64 " << zip64 << ", deflate " << deflate);
      const Bytes archive = zip_archive(two_arrays(deflate), zip64);
      Bytes appended = archive;
      testutil::append(appended, "garbage after the archive");
      expect_two_arrays(parse_npz(appended, "appended.npz"));
      Bytes overshoot = archive;  // the comment length is the end record's last field
      overshoot[overshoot.size() - 2] = std::byte{100};
      expect_two_arrays(parse_npz(overshoot, "overshoot.npz"));
      Bytes prefixed = testutil::to_bytes("#!/bin/sh\nexec unzip \"$0\"\n");
      testutil::append(prefixed, archive);
      expect_two_arrays(parse_npz(prefixed, "prefixed.npz"));
      testutil::append(prefixed, "and after");
      expect_two_arrays(parse_npz(prefixed, "both.npz"));
      // The packer's way in: mapped, deflated members inflated in pieces.
      TempFolder dir;
      testutil::write_file(dir / "p.npz", prefixed);
      std::vector<NpzMember> mapped = load_npz(dir / "p.npz");
      expect_two_arrays(mapped);
    }
  }
  // Up to 64 KiB after the end record, as zipfile looks; beyond, the record is not found.
  Bytes far = zip_archive(two_arrays(false));
  far.resize(far.size() + 65536, std::byte{'x'});
  expect_two_arrays(parse_npz(far, "far.npz"));
  far.push_back(std::byte{'x'});
  EXPECT_EQ(expect_format_error([&] { parse_npz(far, "far.npz"); }),
            "far.npz: no end-of-central-directory record in the last 65558 bytes, though the file starts as a ZIP "
            "archive does: it is truncated, or more than 64 KiB of other bytes follow the archive");
}

// An end record whose comment reaches the end of the file exactly is the archive's, even when
// its comment holds another record's signature (zipfile would take that one).
TEST(Npz, AnEndRecordThatFitsExactlyWinsOverASignatureInItsComment) {
  Bytes archive = zip_archive(two_arrays(false));
  Bytes comment = testutil::to_bytes("PK\x05\x06 is in this comment, and 22 bytes after it.");
  archive[archive.size() - 2] = std::byte{static_cast<unsigned char>(comment.size())};
  testutil::append(archive, comment);
  expect_two_arrays(parse_npz(archive, "comment.npz"));
}

// Where an end record is found but what it describes is not there, the message says so and
// where, instead of "no end-of-central-directory record".
TEST(Npz, AnEndRecordThatPointsNowhereIsNamedWithWhatIsMissing) {
  const Bytes archive = zip_archive(two_arrays(false));
  const size_t eocd = archive.size() - 22;
  const size_t cd_bytes = 2 * 46 + 10 + 10, cd_offset = eocd - cd_bytes;
  const std::string record = "odd.npz: the end-of-central-directory record at offset ";
  // Bytes cut from the front: the directory lies before where the record says.
  const Bytes cut(archive.begin() + 10, archive.end());
  EXPECT_EQ(expect_format_error([&] { parse_npz(cut, "odd.npz"); }),
            record + std::to_string(eocd - 10) + " places the central directory at offset " +
                std::to_string(cd_offset) + ", but it lies at offset " + std::to_string(cd_offset - 10) +
                ", before it: 10 bytes are missing from the archive's start, or it is corrupt");
  // A directory larger than everything before the record.
  Bytes huge = archive;
  huge[eocd + 15] = std::byte{0x7F};  // the directory's size, its high byte
  EXPECT_EQ(expect_format_error([&] { parse_npz(huge, "odd.npz"); }),
            record + std::to_string(eocd) + " gives a central directory of " +
                std::to_string(0x7F000000u + cd_bytes) + " bytes, more than the " + std::to_string(eocd) +
                " bytes before it; the archive is truncated at its start or corrupt");
  // No directory where it says nor just before the record.
  Bytes damaged = archive;
  damaged[cd_offset] = std::byte{'X'};
  EXPECT_EQ(expect_format_error([&] { parse_npz(damaged, "odd.npz"); }),
            record + std::to_string(eocd) + " gives a central directory of " + std::to_string(cd_bytes) +
                " bytes at offset " + std::to_string(cd_offset) + ", but none is there, nor just before the record (offset " +
                std::to_string(cd_offset) + "); the archive is truncated or corrupt");
  // A ZIP64 locator with no record where it points nor before it.
  Bytes zip64 = zip_archive(two_arrays(false), /*zip64=*/true);
  const size_t locator = zip64.size() - 22 - 20, zip64_record = locator - 56;
  zip64[zip64_record] = std::byte{'X'};
  EXPECT_EQ(expect_format_error([&] { parse_npz(zip64, "odd.npz"); }),
            "odd.npz: the ZIP64 end-of-central-directory locator at offset " + std::to_string(locator) +
                " points to offset " + std::to_string(zip64_record) +
                ", but no ZIP64 end-of-central-directory record is there or just before the locator; the archive "
                "is truncated or corrupt");
  // A member's offset past the end of the file, once shifted by the bytes before the archive.
  Bytes far = archive;
  far[eocd - 10 - 4 + 3] = std::byte{0x7F};  // the last entry's local header offset, its high byte
  EXPECT_NE(expect_format_error([&] { parse_npz(far, "odd.npz"); }).find("member 'labels.npy': local header offset "),
            std::string::npos);
}

TEST(Npz, AnNpyFileIsNotTakenForAnArchive) {
  EXPECT_EQ(expect_format_error([&] { parse_npz(npy_of(arange(3)), "x.npz"); }),
            "x.npz: not a ZIP archive: no end-of-central-directory record; it is an .npy file, not an .npz");
}

// A member with bytes after its array is refused as an .npy file is (np.load ignores them),
// with the advice for an archive: save the member again.
TEST(Npz, AMemberWithBytesAfterItsArrayIsRefusedAndCounted) {
  for (bool deflate : {false, true}) {
    const Bytes member = testutil::npy_file("<i8", false, "(2,)", Bytes(16 + 8));
    EXPECT_EQ(expect_format_error([&] { parse_npz(zip_archive({{"x.npy", member, deflate}}), "a.npz"); }),
              "a.npz:x.npy: header declares shape (2,) of <i8 = 16 bytes but the member holds 24 bytes after the "
              "header: 8 bytes follow the array, as many as 1 more row along the first dimension. np.load ignores "
              "such bytes; mmtensor refuses them, as they usually mean a shape out of date (rows appended without "
              "rewriting the header), which packing would silently cut short. If they are data, save the array "
              "again with its whole shape; if not, save the member again without them (np.savez)");
  }
}

TEST(Npz, ForgedHugeSizeIsRefusedBeforeAllocating) {
  Bytes archive = zip_archive({{"x.npy", npy_of(arange(10)), true}}, /*zip64=*/true);
  // The ZIP64 extra field of the central directory entry: uncompressed size first.
  size_t cd = archive.size() - 22 - 20 - 56 - (46 + 5 + 28);
  size_t extra = cd + 46 + 5 + 4;
  for (int i = 0; i < 8; ++i) archive[extra + i] = std::byte{0xFF};
  archive[extra + 7] = std::byte{0x7F};
  std::string message = expect_format_error([&] { parse_npz(archive, "bomb.npz"); });
  EXPECT_NE(message.find("more than deflate can produce"), std::string::npos) << message;
}

// A zip bomb made of overlap: `members` local headers whose extra fields run on to one shared
// deflate stream, so each member is within deflate's ratio and all of them together inflate
// to `members` times the array from an archive of about one.
Bytes overlapping_members(int members, const Bytes& content) {
  const Bytes deflated = testutil::deflate_bytes(content);
  const uint32_t crc =
      static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(content.data()), static_cast<uInt>(content.size())));
  using testutil::put16;
  using testutil::put32;
  const auto name = [](int i) { return "m" + std::to_string(1000 + i) + ".npy"; };
  const size_t header_bytes = 30 + name(0).size(), data_start = members * header_bytes;
  Bytes out, central;
  for (int i = 0; i < members; ++i) {
    const size_t at = out.size();
    put32(out, 0x04034b50), put16(out, 20), put16(out, 0), put16(out, 8), put32(out, 0);
    put32(out, crc), put32(out, static_cast<uint32_t>(deflated.size())), put32(out, static_cast<uint32_t>(content.size()));
    put16(out, static_cast<uint16_t>(name(i).size())), put16(out, static_cast<uint16_t>(data_start - at - header_bytes));
    for (char c : name(i)) out.push_back(static_cast<std::byte>(c));
    put32(central, 0x02014b50), put16(central, 20), put16(central, 20), put16(central, 0), put16(central, 8);
    put32(central, 0), put32(central, crc), put32(central, static_cast<uint32_t>(deflated.size()));
    put32(central, static_cast<uint32_t>(content.size())), put16(central, static_cast<uint16_t>(name(i).size()));
    for (int k = 0; k < 4; ++k) put16(central, 0);
    put32(central, 0), put32(central, static_cast<uint32_t>(at));
    for (char c : name(i)) central.push_back(static_cast<std::byte>(c));
  }
  out.insert(out.end(), deflated.begin(), deflated.end());
  const size_t central_at = out.size();
  out.insert(out.end(), central.begin(), central.end());
  put32(out, 0x06054b50), put16(out, 0), put16(out, 0), put16(out, static_cast<uint16_t>(members));
  put16(out, static_cast<uint16_t>(members)), put32(out, static_cast<uint32_t>(central.size()));
  put32(out, static_cast<uint32_t>(central_at)), put16(out, 0);
  return out;
}

TEST(Npz, MembersThatShareTheirDataAreRefused) {
  const Bytes array = npy_of(zeros({100000}, kUInt8));
  // One member over the stream is an ordinary archive: the builder makes valid members.
  std::vector<NpzMember> one = parse_npz(overlapping_members(1, array), "one.npz");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_TRUE(one[0].array.equal(zeros({100000}, kUInt8)));
  const std::string message = expect_format_error([&] { parse_npz(overlapping_members(8, array), "bomb.npz"); });
  EXPECT_NE(message.find("members overlap"), std::string::npos) << message;
}

// Deflate streams that end wrong get the message the packer's streaming reader gives for them.
// A stream that stops (no final block) right after the declared bytes used to be told it
// "inflates to more than" them, and so did any deflated member of 0 bytes.
TEST(Npz, DeflateStreamsAreJudgedByWhereTheyEnd) {
  const Bytes array = npy_of(arange(6, kInt32));
  Bytes unterminated;
  {
    z_stream zs{};
    deflateInit2(&zs, 6, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
    unterminated.assign(deflateBound(&zs, array.size()) + 64, std::byte{0});
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(array.data()));
    zs.avail_in = static_cast<uInt>(array.size());
    zs.next_out = reinterpret_cast<Bytef*>(unterminated.data());
    zs.avail_out = static_cast<uInt>(unterminated.size());
    deflate(&zs, Z_SYNC_FLUSH);  // every byte out, but no final block
    unterminated.resize(zs.total_out);
    deflateEnd(&zs);
  }
  std::string message = expect_format_error(
      [&] { parse_npz(zip_archive({{"a.npy", array, true, 0xFFFF, 0, unterminated}}), "open.npz"); });
  EXPECT_NE(message.find("deflate data does not end after the " + std::to_string(array.size()) + " bytes declared"),
            std::string::npos) << message;
  // A valid, empty deflate stream: nothing inflated, so not an array, and said so.
  message = expect_format_error([&] { parse_npz(zip_archive({{"a.npy", Bytes{}, true}}), "empty.npz"); });
  EXPECT_NE(message.find("empty.npz:a.npy: not an .npy"), std::string::npos) << message;
  // Longer than declared, shorter than declared.
  Bytes more = array;
  more.push_back(std::byte{1});
  message = expect_format_error(
      [&] { parse_npz(zip_archive({{"a.npy", array, true, 0xFFFF, 0, testutil::deflate_bytes(more)}}), "more.npz"); });
  EXPECT_NE(message.find("inflates to more than the"), std::string::npos) << message;
  const Bytes less(array.begin(), array.end() - 1);
  message = expect_format_error(
      [&] { parse_npz(zip_archive({{"a.npy", array, true, 0xFFFF, 0, testutil::deflate_bytes(less)}}), "less.npz"); });
  EXPECT_NE(message.find("deflate data ends after " + std::to_string(less.size()) + " of"), std::string::npos)
      << message;
}

// One member whose size runs past the end of the file is a truncated file, not an overlap.
TEST(Npz, AMemberPastTheEndOfTheFileIsCalledThat) {
  Bytes archive = zip_archive({{"a.npy", npy_of(arange(6, kInt32))}});
  const size_t central = archive.size() - 22 - (46 + 5);
  for (size_t at : {central + 20, central + 24}) {  // compressed and uncompressed sizes
    const uint32_t past = static_cast<uint32_t>(archive.size() + 1000);
    for (int i = 0; i < 4; ++i) archive[at + i] = std::byte((past >> (8 * i)) & 0xFF);
  }
  const std::string message = expect_format_error([&] { parse_npz(archive, "cut.npz"); });
  EXPECT_NE(message.find("run past the end of the file"), std::string::npos) << message;
  EXPECT_EQ(message.find("overlap"), std::string::npos) << message;
}

// Each field of a damaged directory entry or local header is named in the message (all of
// these were untested: only truncation and fuzzing reached them, which check for no crash).
TEST(Npz, DamagedDirectoryEntriesAndLocalHeadersAreNamed) {
  const Bytes archive = zip_archive({{"a.npy", npy_of(arange(6, kInt32)), false}});
  const size_t central = archive.size() - 22 - (46 + 5);
  const auto refused = [&](const std::function<void(Bytes&)>& damage, const std::string& fragment) {
    Bytes damaged = archive;
    damage(damaged);
    const std::string message = expect_format_error([&] { parse_npz(damaged, "d.npz"); });
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
  };
  const auto store_le32 = [](Bytes& bytes, size_t at, uint32_t value) {
    for (int i = 0; i < 4; ++i) bytes[at + i] = std::byte((value >> (8 * i)) & 0xFF);
  };
  refused([&](Bytes& b) { b[central] = std::byte{'X'}; },
          "gives a central directory of 51 bytes at offset " + std::to_string(central) + ", but none is there");
  refused([&](Bytes& b) { store_le32(b, central + 42, 0xFFFFFF00u); },
          "d.npz: member 'a.npy': local header offset 4294967040 is past the end of the file");
  refused([&](Bytes& b) { store_le32(b, central + 42, 1); }, "d.npz: member 'a.npy': no local header at offset 1");
  refused([&](Bytes& b) { b[8] = std::byte{8}; },
          "d.npz: member 'a.npy': local header and central directory disagree on the compression method");
  refused([&](Bytes& b) { b[30] = std::byte{'b'}; }, "d.npz: member 'a.npy': the local header names it 'b.npy'");
  refused([&](Bytes& b) { store_le32(b, central + 24, 7); }, "d.npz: member 'a.npy' is stored but its sizes differ (152 vs 7)");
}

// A ZIP name may take 64 KiB (six times that escaped): quoted, it is cut.
TEST(Npz, LongMemberNamesAreCutInMessages) {
  const std::string name(65000, 'n');
  const std::string message =
      expect_format_error([&] { parse_npz(zip_archive({{name + ".txt", testutil::to_bytes("x")}}), "long.npz"); });
  EXPECT_LT(message.size(), 1000u) << message.substr(0, 300);
  EXPECT_NE(message.find("... (65004 bytes)' is not an .npy array"), std::string::npos) << message.substr(0, 400);
}

TEST(Npz, ReadsNumpysSavezAndSavezCompressed) {
  std::string python = testutil::python_with_numpy();
  if (python.empty()) GTEST_SKIP() << "python3 with numpy not available";
  TempFolder dir;
  ASSERT_EQ(testutil::run_python(python, dir.path(), R"(
a = np.arange(60000, dtype='<f4').reshape(100, 600)
b = np.asfortranarray(np.arange(12, dtype='>i2').reshape(3, 4))
np.savez('plain.npz', a=a, b=b, c=np.array(True))
np.savez_compressed('small.npz', a=a, b=b, c=np.array(True))
import zipfile
with zipfile.ZipFile('forced64.npz', 'w', compression=zipfile.ZIP_DEFLATED) as z:
    with z.open('a.npy', 'w', force_zip64=True) as f:
        np.lib.format.write_array(f, a)
# What numpy and zipfile read around an archive: bytes after it (np.load too), bytes before
# it (zipfile; np.load looks for "PK" at the start and refuses).
raw = open('small.npz', 'rb').read()
open('appended.npz', 'wb').write(raw + b'garbage')
open('prefixed.npz', 'wb').write(b'#!/bin/sh\n' + raw)
assert np.array_equal(np.load('appended.npz')['a'], a)
assert np.array_equal(np.lib.npyio.NpzFile(open('prefixed.npz', 'rb'))['a'], a)
)"), 0);
  for (const char* name : {"plain.npz", "small.npz", "appended.npz", "prefixed.npz"}) {
    SCOPED_TRACE(name);
    std::vector<NpzMember> members = load_npz(dir / name);
    ASSERT_EQ(members.size(), 3u);
    EXPECT_EQ(members[0].name, "a");
    EXPECT_TRUE(members[0].array.equal(arange(60000, kFloat32).view({100, 600})));
    EXPECT_EQ(members[1].name, "b");
    EXPECT_FALSE(members[1].array.is_contiguous());
    EXPECT_TRUE(members[1].array.equal(arange(12, kInt16).view({3, 4})));
    EXPECT_EQ(members[2].array.dtype(), kBool);
    EXPECT_EQ(members[2].array.dim(), 0);
  }
  std::vector<NpzMember> forced = load_npz(dir / "forced64.npz");
  ASSERT_EQ(forced.size(), 1u);
  EXPECT_TRUE(forced[0].array.equal(arange(60000, kFloat32).view({100, 600})));
}

}  // namespace
}  // namespace mmt
