// write_fortran_order: a field's [records, ...] array written in column-major order, whatever
// the reads' size, equals the whole array's column-major bytes, and reads each record once.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "fortran_order.h"
#include "mmtensor/tensor.h"
#include "test_util.h"

namespace mmt::detail {
namespace {

// The column-major bytes of `values` [N, d1, ..., dk]: its dimensions reversed, row-major.
std::vector<std::byte> column_major_bytes(const Tensor& values) {
  DimVector reversed;
  for (int64_t d = values.dim() - 1; d >= 0; --d) reversed.push_back(d);
  const Tensor c = values.permute(reversed).contiguous();
  const auto* p = static_cast<const std::byte*>(c.data_ptr());
  return {p, p + c.nbytes()};
}

TEST(FortranOrder, ReadsOfAnySizeWriteTheWholeArraysColumnMajorBytes) {
  constexpr int64_t kRecords = 37, kHeader = 5;
  for (ScalarType dtype : {kUInt8, kInt32, kComplex128}) {
    for (const DimVector& record_shape : {DimVector{}, DimVector{5}, DimVector{3, 4}, DimVector{2, 3, 2}}) {
      DimVector sizes{kRecords};
      for (int64_t s : record_shape) sizes.push_back(s);
      Tensor values = empty(sizes, dtype);
      values.view({-1}).copy_(arange(values.numel(), kInt64));
      if (dtype == kComplex128) values.imag().view({-1}).copy_(arange(0, -values.numel(), -1, kInt64));
      // Read through a transposed copy, so the reads hand back views with other strides.
      const Tensor strided = values.dim() >= 3 ? values.transpose(1, 2).contiguous().transpose(1, 2) : values;
      ASSERT_TRUE(strided.equal(values));
      const std::vector<std::byte> expected = column_major_bytes(values);
      for (int64_t records_per_read : {1, 7, 36, 37, 100}) {
        SCOPED_TRACE(::testing::Message() << to_string(dtype) << " record shape " << IntArrayRef(record_shape)
                                          << " records per read " << records_per_read);
        std::vector<std::byte> file(kHeader + expected.size(), std::byte{0x5A});
        std::vector<int64_t> times_read(kRecords, 0);
        write_fortran_order(
            [&](int64_t offset, std::span<const std::byte> bytes) {
              ASSERT_GE(offset, kHeader);
              ASSERT_LE(offset + static_cast<int64_t>(bytes.size()), static_cast<int64_t>(file.size()));
              std::memcpy(file.data() + offset, bytes.data(), bytes.size());
            },
            kHeader,
            [&](int64_t first, int64_t stop) {
              EXPECT_LE(stop - first, records_per_read);
              for (int64_t r = first; r < stop; ++r) ++times_read[r];
              return strided.narrow(0, first, stop - first);
            },
            kRecords, record_shape, dtype, records_per_read);
        EXPECT_EQ(std::vector<std::byte>(file.begin(), file.begin() + kHeader), std::vector<std::byte>(kHeader, std::byte{0x5A}))
            << "nothing before the data is touched";
        EXPECT_EQ(std::vector<std::byte>(file.begin() + kHeader, file.end()), expected);
        EXPECT_EQ(times_read, std::vector<int64_t>(kRecords, 1)) << "each record is read once";
      }
    }
  }
}

// Through a real file, as export writes one: many reads, each a run per position, by pwrite.
TEST(FortranOrder, ThroughAPositionedTemporaryTheFileHoldsTheColumnMajorBytes) {
  testing::TempDir dir;
  Tensor values = empty({50, 3, 7}, kFloat64);
  values.view({-1}).copy_(arange(values.numel(), kInt64));
  const std::vector<std::byte> expected = column_major_bytes(values);
  const std::string header = "header";
  const std::string target = dir.file("f.npy");
  detail::StagedFiles files(/*replace=*/false);
  files.stage_positioned(target, static_cast<int64_t>(header.size() + expected.size()), [&](const WriteAt& write_at) {
    write_at(0, std::as_bytes(std::span(header)));
    write_fortran_order(write_at, static_cast<int64_t>(header.size()),
                        [&](int64_t first, int64_t stop) { return values.narrow(0, first, stop - first); }, 50, {3, 7},
                        kFloat64, 8);
  });
  files.publish();
  const std::string bytes = testing::file_bytes(target);
  EXPECT_EQ(bytes.substr(0, header.size()), header);
  const std::string data = bytes.substr(header.size());
  ASSERT_EQ(data.size(), expected.size());
  EXPECT_EQ(std::memcmp(data.data(), expected.data(), expected.size()), 0);
}

TEST(FortranOrder, NoRecordsOrNoValuesWriteNothing) {
  write_fortran_order([](int64_t, std::span<const std::byte>) { ADD_FAILURE() << "nothing to write"; },
                      0, [](int64_t, int64_t) -> Tensor { ADD_FAILURE() << "nothing to read"; return {}; }, 0, {3},
                      kFloat32, 16);
  // Records whose shape holds a 0: nothing to write, but each record is still read (the
  // reads are what check the chunks under them).
  int reads = 0;
  const Tensor none = empty({10, 0, 2}, kFloat32);
  write_fortran_order([](int64_t, std::span<const std::byte>) { ADD_FAILURE() << "nothing to write"; }, 0,
                      [&](int64_t first, int64_t stop) { ++reads; return none.narrow(0, first, stop - first); }, 10,
                      {0, 2}, kFloat32, 4);
  EXPECT_EQ(reads, 3);
  // A read that comes back as other values than the field's is refused, not trusted.
  EXPECT_THROW(write_fortran_order([](int64_t, std::span<const std::byte>) {}, 0,
                                   [](int64_t first, int64_t stop) { return empty({stop - first, 3}, kFloat64); }, 4,
                                   {3}, kFloat32, 4),
               ValueError);
}

}  // namespace
}  // namespace mmt::detail
