// FortranOrderPieces: a field's [records, ...] array in column-major order, made in bounded
// segments, equals the whole array's column-major bytes whatever the segment budget.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "fortran_order.h"
#include "mmtensor/tensor.h"

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

// Every segment `pieces` makes, concatenated; checks no segment exceeds what the budget allows.
std::vector<std::byte> all_pieces(FortranOrderPieces& pieces, int64_t largest_allowed, int* segments) {
  std::vector<std::byte> out;
  *segments = 0;
  for (auto piece = pieces.next(); !piece.empty(); piece = pieces.next()) {
    EXPECT_LE(static_cast<int64_t>(piece.size()), largest_allowed);
    out.insert(out.end(), piece.begin(), piece.end());
    ++*segments;
  }
  return out;
}

TEST(FortranOrder, SegmentsOfAnyBudgetMakeTheWholeArraysColumnMajorBytes) {
  constexpr int64_t kRecords = 37;
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
      const int64_t element = element_size(dtype), column = kRecords * element;
      for (int64_t budget : {element, 5 * element, column - element, column, column * 5 / 2, int64_t{1} << 20}) {
        for (int64_t records_per_read : {1, 7, 100}) {
          SCOPED_TRACE(::testing::Message() << to_string(dtype) << " record shape " << IntArrayRef(record_shape)
                                            << " budget " << budget << " records per read " << records_per_read);
          int reads = 0;
          FortranOrderPieces pieces(
              [&](int64_t first, int64_t stop) {
                ++reads;
                EXPECT_LE(stop - first, records_per_read);
                return strided.narrow(0, first, stop - first);
              },
              kRecords, record_shape, dtype, records_per_read, budget);
          int segments = 0;
          EXPECT_EQ(all_pieces(pieces, std::max(budget, element), &segments), expected);
          EXPECT_TRUE(pieces.next().empty()) << "the end stays the end";
          if (budget >= static_cast<int64_t>(expected.size()))  // it all fits: one segment, one pass
            EXPECT_EQ(segments, 1);
          EXPECT_LE(reads, segments * ((kRecords + records_per_read - 1) / records_per_read));
        }
      }
    }
  }
}

TEST(FortranOrder, NoRecordsOrNoValuesMakeNoBytes) {
  FortranOrderPieces none([](int64_t, int64_t) -> Tensor { ADD_FAILURE() << "nothing to read"; return {}; }, 0,
                          {3}, kFloat32, 16, 1 << 20);
  EXPECT_TRUE(none.next().empty());
}

}  // namespace
}  // namespace mmt::detail
