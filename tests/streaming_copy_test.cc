// Gathers of large values use non-temporal stores (engine/streaming_copy.h): the bytes must
// be memcpy's, at every length and alignment, and a batch gathered that way equals get().
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "streaming_copy.h"
#include "test_util.h"

namespace mmt {
namespace {

using testing::TempDir;

TEST(StreamingCopy, CopiesMemcpysBytesAtEveryLengthAndAlignment) {
  std::vector<uint8_t> source(512 + 64);
  std::iota(source.begin(), source.end(), uint8_t{1});
  for (size_t src_offset = 0; src_offset < 17; ++src_offset) {
    for (size_t dst_offset = 0; dst_offset < 17; ++dst_offset) {
      for (size_t n = 0; n <= 512; n += (n < 200 ? 1 : 37)) {
        std::vector<uint8_t> expected(n + 64, 0xEE), got(n + 64, 0xEE);
        std::memcpy(expected.data() + dst_offset, source.data() + src_offset, n);
        detail::streaming_copy(got.data() + dst_offset, source.data() + src_offset, n);
        detail::streaming_copy_fence();
        ASSERT_EQ(got, expected) << "n " << n << ", source offset " << src_offset << ", destination offset "
                                 << dst_offset;  // bytes around the copy untouched too
      }
    }
  }
}

TEST(StreamingCopy, TheDefaultStreamsLargeValuesBoundForADeviceOrBeyondTheCache) {
  const detail::ScopedStreamingStores automatic(detail::StreamingStores::Auto);
  const int64_t large = detail::kStreamingMinValueBytes, small = large - 1;
  const int64_t cache = detail::streaming_min_batch_bytes();
  EXPECT_GE(cache, int64_t{32} << 20);
  // A host batch that fits in the last-level cache keeps ordinary stores; one beyond it streams.
  EXPECT_FALSE(detail::use_streaming_copy(large, 16 * large));
  EXPECT_TRUE(detail::use_streaming_copy(large, cache));
  EXPECT_FALSE(detail::use_streaming_copy(small, 4 * cache));  // lines filled in part
  {
    const detail::GatherDestination bound(/*device_bound=*/true, 0);  // the loader's ring for cuda:N
    EXPECT_TRUE(detail::use_streaming_copy(large, large));
    EXPECT_FALSE(detail::use_streaming_copy(small, large));
    {
      const detail::GatherDestination not_bound(false, 0);
      EXPECT_FALSE(detail::use_streaming_copy(large, large));
    }
    EXPECT_TRUE(detail::use_streaming_copy(large, large));
  }
  EXPECT_FALSE(detail::use_streaming_copy(large, large));
  {
    // A piece of a host batch: what counts is what is written before the CPU reads it (the
    // loader's ring), not the piece.
    const detail::GatherDestination host_ring(false, cache);
    EXPECT_TRUE(detail::use_streaming_copy(large, large));
    EXPECT_FALSE(detail::use_streaming_copy(small, large));
  }
  EXPECT_FALSE(detail::use_streaming_copy(large, large));
  {
    const detail::ScopedStreamingStores never(detail::StreamingStores::Never);
    const detail::GatherDestination bound(true, cache);
    EXPECT_FALSE(detail::use_streaming_copy(large, cache));
  }
  const detail::ScopedStreamingStores always(detail::StreamingStores::Always);
  EXPECT_TRUE(detail::use_streaming_copy(1, 1));
}

TEST(StreamingCopy, BatchesGatheredWithStreamingStoresEqualGet) {
  TempDir dir;
  const std::string path = dir.file("large.mmt");
  constexpr int64_t kRecords = 40, kValueBytes = 20000 + 3;  // not a multiple of 16 or 64
  {
    DatasetWriter writer = DatasetWriter::create(
        path, Schema({Field::fixed("small", kInt32, {3}), Field::fixed("image", kUInt8, {kValueBytes})}));
    Tensor image = empty({kValueBytes}, kUInt8);
    for (int64_t i = 0; i < kRecords; ++i) {
      for (int64_t k = 0; k < kValueBytes; ++k) image.mutable_data_ptr<uint8_t>()[k] = static_cast<uint8_t>(i * 13 + k);
      writer.append({tensor(std::vector<int32_t>{int32_t(i), 1, 2}), image});
    }
    writer.finish();
  }
  Dataset dataset = Dataset::open(path);
  const std::vector<int64_t> indices = {39, 0, 7, 7, 22, 13, 1, 38, 5};
  for (const auto mode : {detail::StreamingStores::Always, detail::StreamingStores::Auto, detail::StreamingStores::Never}) {
    const detail::ScopedStreamingStores streaming(mode);
    const int64_t min_bytes = static_cast<int64_t>(mode);  // for the messages
    for (const int threads : {1, 2}) {
      Tensor images = empty({static_cast<int64_t>(indices.size()), kValueBytes}, kUInt8);
      Tensor small = empty({static_cast<int64_t>(indices.size()), 3}, kInt32);
      const std::vector<std::string> fields = {"image", "small"};
      const std::vector<Tensor> outs = {images, small};
      dataset.get_batch(indices, fields, outs, threads);
      for (size_t row = 0; row < indices.size(); ++row) {
        const auto r = static_cast<int64_t>(row);
        EXPECT_TRUE(images[r].equal(dataset.get(indices[row], "image")))
            << "mode " << min_bytes << ", " << threads << " threads, row " << row;
        EXPECT_TRUE(small[r].equal(dataset.get(indices[row], "small")));
      }
    }
  }
}

}  // namespace
}  // namespace mmt
