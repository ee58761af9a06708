// Every worked example of the background texts (../shared/seeds/) holds for mmtensor's own
// storage and tensor types, with the same numbers.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "mmtensor/mmtensor.h"
#include "test_util.h"

namespace mmt {
namespace {

std::vector<int64_t> storage_as_int64(const Tensor& t) {
  const auto* p = reinterpret_cast<const int64_t*>(t.untyped_storage().data());
  return {p, p + t.untyped_storage().nbytes() / 8};
}

// 16.1: x = torch.tensor([[1, 2], [3, 4]]); list(x.storage()) == [1, 2, 3, 4]
TEST(SeedExamples, StorageOfTwoByTwoIsFlat) {
  Tensor x = tensor2d<int64_t>({{1, 2}, {3, 4}});
  EXPECT_EQ(storage_as_int64(x), (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(x.at<int64_t>({0, 1}), 2);  // x[0][1] is flat element 1
}

// 16.2: b = a.view(2, 2); b[0][0] = 99 changes a; a.clone() does not share.
TEST(SeedExamples, ViewSharesStorageCloneDoesNot) {
  Tensor a = tensor<int64_t>({1, 2, 3, 4});
  Tensor b = a.view({2, 2});
  b.set<int64_t>({0, 0}, 99);
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{99, 2, 3, 4}));
  Tensor c = a.clone();
  c.set<int64_t>({0}, 7);
  EXPECT_EQ(a.at<int64_t>({0}), 99);
  EXPECT_FALSE(c.is_same_storage(a));
  EXPECT_TRUE(b.is_same_storage(a));
  EXPECT_EQ(a.to_string(), "tensor([99,  2,  3,  4])");
}

// 16.3 and "Noncontiguous Tensors": x = randn(2, 3); x.t() is not contiguous, strides (1, 3);
// x.t().contiguous() is.
TEST(SeedExamples, TransposeBreaksContiguity) {
  Tensor x = empty({2, 3});
  EXPECT_TRUE(x.is_contiguous());
  EXPECT_EQ(x.strides(), IntArrayRef({3, 1}));
  Tensor y = x.t();
  EXPECT_EQ(y.sizes(), IntArrayRef({3, 2}));
  EXPECT_EQ(y.strides(), IntArrayRef({1, 3}));
  EXPECT_FALSE(y.is_contiguous());
  EXPECT_TRUE(y.is_same_storage(x));  // "same storage, different strides"
  Tensor z = y.contiguous();
  EXPECT_TRUE(z.is_contiguous());
  EXPECT_FALSE(z.is_same_storage(x));
  // contiguous() of what already is contiguous is the tensor itself, no copy.
  EXPECT_TRUE(x.contiguous().is_same_storage(x));
  EXPECT_EQ(x.contiguous().data_ptr(), x.data_ptr());
}

// x = torch.arange(12).reshape(3, 4): contiguous; x.t() is not; x.t().contiguous() is.
TEST(SeedExamples, ContiguityOfAReshapedRange) {
  Tensor x = arange(12).reshape({3, 4});
  EXPECT_TRUE(x.is_contiguous());
  EXPECT_FALSE(x.t().is_contiguous());
  EXPECT_TRUE(x.t().contiguous().is_contiguous());
  EXPECT_EQ(x.t().contiguous().to_vector<int64_t>(), (std::vector<int64_t>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
}

// The HDF5 example: images stored in chunks of 100 records, compressed; reading image 1000
// decodes only the chunk that holds it (chunk 10), not the dataset.
TEST(SeedExamples, ReadingOneRecordDecodesOnlyItsChunk) {
  testing::TempDir dir;
  const std::string path = dir.file("images.mmt");
  WriterOptions options;
  options.codec = CodecSpec::parse("zstd");
  options.chunk_records = 100;
  {
    DatasetWriter writer = DatasetWriter::create(path, Schema({Field::fixed("images", kUInt8, {3, 8, 8})}), options);
    for (int64_t i = 0; i < 1100; ++i) writer.append({full({3, 8, 8}, static_cast<double>(i % 251), kUInt8)});
    writer.finish();
  }
  Dataset ds = Dataset::open(path);
  ASSERT_EQ(ds.num_chunks(), 11);
  EXPECT_EQ(ds.chunk_of(1000), 10);
  const Tensor image = ds.get(1000)["images"];
  EXPECT_EQ(ds.cache_stats().misses, 1);  // one chunk decoded
  EXPECT_TRUE(image.equal(full({3, 8, 8}, 1000 % 251, kUInt8)));
}

// A float32 tensor of shape (3, 4) on the CPU: strides (16, 4) in bytes, (4, 1) in elements.
TEST(SeedExamples, Float32MatrixStridesInBytes) {
  Tensor a = arange(1, 13, 1, kFloat32).view({3, 4});
  EXPECT_EQ(a.strides(), IntArrayRef({4, 1}));
  EXPECT_EQ(a.stride(0) * a.element_size(), 16);
  EXPECT_EQ(a.stride(1) * a.element_size(), 4);
  EXPECT_EQ(a.device(), kCPU);
  EXPECT_EQ(a.at<float>({2, 3}), 12.0f);
}

// torch.zeros(3).untyped_storage(): 12 zero bytes.
TEST(SeedExamples, StorageOfZerosIsTwelveZeroBytes) {
  Tensor t = zeros({3});
  ASSERT_EQ(t.untyped_storage().nbytes(), 12);
  const auto* bytes = reinterpret_cast<const uint8_t*>(t.untyped_storage().data());
  EXPECT_EQ(std::vector<uint8_t>(bytes, bytes + 12), std::vector<uint8_t>(12, 0));
}

// t.to("cpu") of a tensor already on the CPU is the tensor itself (no copy).
TEST(SeedExamples, ToTheDeviceItIsOnDoesNotCopy) {
  Tensor h = arange(6);
  EXPECT_TRUE(h.to(kCPU).is_same_storage(h));
  EXPECT_TRUE(h.cpu().is_same_storage(h));
}

// Allocations are aligned (64 bytes here), whatever their size.
TEST(SeedExamples, AllocationsAreAligned) {
  for (int64_t n : {1, 3, 1000, 4097})
    EXPECT_EQ(reinterpret_cast<uintptr_t>(empty({n}).data_ptr()) % 64, 0u) << n;
}

// 16.4: x = randn(1, 3, 224, 224).to(memory_format=channels_last) is channels-last contiguous.
TEST(SeedExamples, ChannelsLastConversion) {
  Tensor x = arange(3 * 224 * 224, kFloat32).view({1, 3, 224, 224});
  Tensor x_cl = x.to(MemoryFormat::ChannelsLast);
  EXPECT_EQ(x_cl.sizes(), IntArrayRef({1, 3, 224, 224}));  // the logical shape stays NCHW
  EXPECT_TRUE(x_cl.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_FALSE(x_cl.is_contiguous());
  EXPECT_TRUE(x_cl.equal(x));
  EXPECT_EQ(x_cl.at<float>({0, 2, 10, 20}), 2 * 224 * 224 + 10 * 224 + 20);
  EXPECT_FALSE(x.is_contiguous(MemoryFormat::ChannelsLast));
  // In memory, channels are innermost: pixel (0, 0)'s three channels, then pixel (0, 1)'s.
  const auto* stored = reinterpret_cast<const float*>(x_cl.untyped_storage().data());
  EXPECT_EQ(std::vector<float>(stored, stored + 4), (std::vector<float>{0, 50176, 100352, 1}));
}

// The same for a batch of 32: the channels-last copy has strides (150528, 1, 672, 3).
TEST(SeedExamples, ChannelsLastConversionOfABatch) {
  Tensor x = arange(32 * 3 * 224 * 224, kFloat32).view({32, 3, 224, 224});
  Tensor cl = x.to(MemoryFormat::ChannelsLast);
  EXPECT_EQ(cl.sizes(), IntArrayRef({32, 3, 224, 224}));
  EXPECT_EQ(cl.strides(), IntArrayRef({150528, 1, 672, 3}));
  EXPECT_TRUE(cl.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_TRUE(cl.equal(x));
  const auto* stored = reinterpret_cast<const float*>(cl.untyped_storage().data());
  EXPECT_EQ(std::vector<float>(stored, stored + 4), (std::vector<float>{0, 50176, 100352, 1}));
  EXPECT_EQ(stored[150528], 150528.0f);  // image 1 starts one batch stride in
}

// torch.Storage text: t = torch.ones(3); its untyped storage is 12 bytes 0 0 128 63 x 3;
// s1 = s0.clone(); s1.fill_(0); a tensor set on s1 with t's metadata reads zeros.
TEST(SeedExamples, UntypedStorageOfOnes) {
  Tensor t = full({3}, 1.0);
  UntypedStorage s0 = t.untyped_storage();
  ASSERT_EQ(s0.nbytes(), 12);
  const auto* bytes = reinterpret_cast<const uint8_t*>(s0.data());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(bytes[4 * i + 0], 0);
    EXPECT_EQ(bytes[4 * i + 1], 0);
    EXPECT_EQ(bytes[4 * i + 2], 128);
    EXPECT_EQ(bytes[4 * i + 3], 63);
  }
  UntypedStorage s1 = s0.clone();
  s1.fill_(0);
  EXPECT_FALSE(s1.is_same(s0));
  // t.set_(s1, storage_offset=t.storage_offset(), stride=t.stride(), size=t.size())
  Tensor view_of_ones = t;
  t.set_(s1, t.storage_offset(), t.sizes(), t.strides());
  EXPECT_EQ(t.to_string(), "tensor([0., 0., 0.])");
  EXPECT_TRUE(t.untyped_storage().is_same(s1));
  EXPECT_EQ(view_of_ones.to_string(), "tensor([1., 1., 1.])");  // other handles keep s0
  // A geometry that does not fit the storage is refused, and t is left as it was.
  EXPECT_THROW(t.set_(s0, 1, t.sizes(), t.strides()), ValueError);
  EXPECT_TRUE(t.untyped_storage().is_same(s1));
  EXPECT_EQ(t.storage_offset(), 0);
  EXPECT_EQ(t.to_string(), "tensor([0., 0., 0.])");
}

// "Tensor Storage" text: a float32 [2, 3] has strides (12, 4) bytes = (3, 1) elements, and
// a[1, 2] sits at byte offset 1*12 + 2*4 = 20, element 5, value 6.
TEST(SeedExamples, RowMajorStridesAndOffset) {
  Tensor a = tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(a.sizes(), IntArrayRef({2, 3}));
  EXPECT_EQ(a.strides(), IntArrayRef({3, 1}));
  EXPECT_EQ(a.stride(0) * a.element_size(), 12);
  EXPECT_EQ(a.stride(1) * a.element_size(), 4);
  const int64_t byte_offset = (1 * a.stride(0) + 2 * a.stride(1)) * a.element_size();
  EXPECT_EQ(byte_offset, 20);
  EXPECT_EQ(byte_offset / a.element_size(), 5);
  EXPECT_EQ(a.at<float>({1, 2}), 6.0f);
  float from_storage;
  std::memcpy(&from_storage, a.untyped_storage().data() + byte_offset, 4);
  EXPECT_EQ(from_storage, 6.0f);
}

// Column-major (Fortran) layout of [[1,2,3],[4,5,6]]: memory 1 4 2 5 3 6, strides (4, 8)
// bytes = (1, 2) elements.
TEST(SeedExamples, ColumnMajorLayout) {
  Tensor rows = tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor fortran = rows.t().contiguous().t();
  EXPECT_EQ(fortran.strides(), IntArrayRef({1, 2}));
  EXPECT_EQ(fortran.stride(0) * 4, 4);
  EXPECT_EQ(fortran.stride(1) * 4, 8);
  const auto* mem = reinterpret_cast<const float*>(fortran.untyped_storage().data());
  EXPECT_EQ(std::vector<float>(mem, mem + 6), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_TRUE(fortran.equal(rows));
}

// np: b = a.reshape(2, 3) is a view (b[0,0] = 99 changes a); .copy() is not.
TEST(SeedExamples, ReshapeIsAViewWhenPossible) {
  Tensor a = tensor<int64_t>({1, 2, 3, 4, 5, 6});
  Tensor b = a.reshape({2, 3});
  b.set<int64_t>({0, 0}, 99);
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{99, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(b.is_same_storage(a));
  Tensor a2 = tensor<int64_t>({1, 2, 3, 4, 5, 6});
  Tensor c = a2.reshape({2, 3}).clone();
  c.set<int64_t>({0, 0}, 99);
  EXPECT_EQ(a2.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
}

// np: b = a.T of a float32 [2, 3]: strides (4, 12) bytes; b[0] reads 1, 4.
TEST(SeedExamples, TransposeSwapsStrides) {
  Tensor a = tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = a.t();
  EXPECT_EQ(b.stride(0) * 4, 4);
  EXPECT_EQ(b.stride(1) * 4, 12);
  EXPECT_FALSE(b.is_contiguous());
  EXPECT_EQ(b[0].to_vector<float>(), (std::vector<float>{1, 4}));
}

// np: a = arange(12).reshape(3, 4); b = a[:, ::2] is [[0,2],[4,6],[8,10]] with strides
// (4, 2) elements (int64), not contiguous.
TEST(SeedExamples, SliceWithStep) {
  Tensor a = arange(12).reshape({3, 4});
  Tensor b = a.slice(1, 0, kSliceEnd, 2);
  EXPECT_EQ(b.sizes(), IntArrayRef({3, 2}));
  EXPECT_EQ(b.strides(), IntArrayRef({4, 2}));
  EXPECT_FALSE(b.is_contiguous());
  EXPECT_EQ(b.contiguous().to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(b.to_string(), "tensor([[ 0,  2],\n        [ 4,  6],\n        [ 8, 10]])");
  // The text's numbers are for 4-byte elements: byte strides (16, 8).
  Tensor a32 = arange(12, kInt32).reshape({3, 4});
  Tensor b32 = a32.slice(1, 0, kSliceEnd, 2);
  EXPECT_EQ(b32.stride(0) * b32.element_size(), 16);
  EXPECT_EQ(b32.stride(1) * b32.element_size(), 8);
  EXPECT_FALSE(b32.is_contiguous());
}

// X = randn(32, 3, 224, 224): strides (150528, 50176, 224, 1); channels-last
// (150528, 1, 672, 3); copying it moves about 18.4 MiB.
TEST(SeedExamples, ImageBatchStrides) {
  Tensor x = empty({32, 3, 224, 224});
  EXPECT_EQ(x.strides(), IntArrayRef({150528, 50176, 224, 1}));
  Tensor cl = empty({32, 3, 224, 224}, kFloat32, kCPU, MemoryFormat::ChannelsLast);
  EXPECT_EQ(cl.strides(), IntArrayRef({150528, 1, 672, 3}));
  EXPECT_EQ(strides_for({32, 3, 224, 224}, MemoryFormat::ChannelsLast),
            DimVector({150528, 1, 672, 3}));
  EXPECT_EQ(x.numel() * x.element_size(), 19267584);
  EXPECT_NEAR(x.nbytes() / 1e6, 19.27, 0.01);  // "about 18.4 MiB"
  EXPECT_NEAR(x.nbytes() / 1048576.0, 18.4, 0.05);
}

// x = arange(10); y = x[3:8] is tensor([3, 4, 5, 6, 7]) with storage_offset 3.
TEST(SeedExamples, SliceStorageOffset) {
  Tensor x = arange(10);
  Tensor y = x.slice(0, 3, 8);
  EXPECT_EQ(y.to_string(), "tensor([3, 4, 5, 6, 7])");
  EXPECT_EQ(y.storage_offset(), 3);
  EXPECT_TRUE(y.is_same_storage(x));
}

// X = arange(12).view(3, 4) works; X.T.view(12) fails (use reshape); X.T.reshape(12) works
// and copies; y.contiguous().view(12) works.
TEST(SeedExamples, ViewAfterTransposeFails) {
  Tensor x = arange(12).view({3, 4});
  EXPECT_EQ(x.sizes(), IntArrayRef({3, 4}));
  Tensor y = x.t();
  try {
    y.view({12});
    FAIL() << "view() of a transposed tensor must fail";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("view size is not compatible"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("Use .reshape(...) instead"), std::string::npos);
  }
  Tensor z = y.reshape({12});
  EXPECT_FALSE(z.is_same_storage(x));
  EXPECT_EQ(z.to_vector<int64_t>(), (std::vector<int64_t>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_TRUE(y.contiguous().view({12}).equal(z));
  // The same for randn(3, 4).t() in float32.
  EXPECT_THROW(empty({3, 4}).t().view({12}), ValueError);
}

// Y = X.permute(0, 2, 1).contiguous(); Y.view(Y.shape[0], -1)
TEST(SeedExamples, PermuteContiguousThenView) {
  Tensor x = arange(24).view({2, 3, 4});
  Tensor y = x.permute({0, 2, 1});
  EXPECT_FALSE(y.is_contiguous());
  Tensor flat = y.contiguous().view({y.size(0), -1});
  EXPECT_EQ(flat.sizes(), IntArrayRef({2, 12}));
  EXPECT_EQ(flat.at<int64_t>({0, 1}), 4);
}

// X = randn(32, 224, 224, 3) (NHWC); X.permute(0, 3, 1, 2) is [32, 3, 224, 224] and not
// contiguous: permute changes strides, not data.
TEST(SeedExamples, PermuteNhwcToNchw) {
  Tensor x = empty({32, 224, 224, 3});
  Tensor y = x.permute({0, 3, 1, 2});
  EXPECT_EQ(y.sizes(), IntArrayRef({32, 3, 224, 224}));
  EXPECT_EQ(y.strides(), IntArrayRef({150528, 1, 672, 3}));
  EXPECT_FALSE(y.is_contiguous());
  EXPECT_TRUE(y.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_TRUE(y.is_same_storage(x));
}

// x = tensor([[1,2,3],[4,5,6]]): storage [1..6], offset 0, stride (3, 1), and
// tensor[i, j] = storage[offset + i*stride[0] + j*stride[1]].
TEST(SeedExamples, StorageFormula) {
  Tensor x = tensor2d<int64_t>({{1, 2, 3}, {4, 5, 6}});
  EXPECT_EQ(storage_as_int64(x), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(x.strides(), IntArrayRef({3, 1}));
  EXPECT_EQ(x.storage_offset(), 0);
  auto storage = storage_as_int64(x);
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      EXPECT_EQ(x.at<int64_t>({i, j}), storage[x.storage_offset() + i * x.stride(0) + j * x.stride(1)]);
}

// y = x[1:3, 1:3] of arange(12).reshape(3, 4); y[0, 0] = 100 makes x[1, 1] == 100.
TEST(SeedExamples, SubBlockViewWritesThrough) {
  Tensor x = arange(12).reshape({3, 4});
  Tensor y = x.slice(0, 1, 3).slice(1, 1, 3);
  EXPECT_TRUE(y.is_same_storage(x));
  EXPECT_NE(y.data_ptr(), x.data_ptr());  // "may differ due to offset"
  y.set<int64_t>({0, 0}, 100);
  EXPECT_EQ(x.at<int64_t>({1, 1}), 100);
}

// y = x[0, :] keeps x's storage alive; x[0, :].clone() does not share it.
TEST(SeedExamples, HiddenReferences) {
  Tensor y;
  UntypedStorage observed;
  {
    Tensor x = arange(100).view({10, 10});
    y = x.select(0, 0);
    observed = x.untyped_storage();
  }
  EXPECT_EQ(y.to_vector<int64_t>()[9], 9);  // still valid: the view owns the storage
  EXPECT_GE(observed.use_count(), 2);
  Tensor c = y.clone();
  EXPECT_FALSE(c.is_same_storage(y));
  // The clone holds the row's 80 bytes only; once the view goes, nothing else keeps the
  // 800-byte storage alive.
  EXPECT_EQ(c.untyped_storage().nbytes(), 80);
  y = Tensor();
  EXPECT_EQ(observed.use_count(), 1);
}

// Write raw bytes (tensor.numpy().tobytes()) and read them back as a tensor over a file
// (torch.frombuffer / UntypedStorage.from_file), with the filename attribute.
TEST(SeedExamples, RawBytesRoundTripThroughAFile) {
  testing::TempDir dir;
  const std::string path = dir.file("my_tensor.bin");
  Tensor t = tensor<float>({1.5f, -2.0f, 3.25f});
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  UntypedStorage s = UntypedStorage::from_file(path, /*shared=*/false, t.nbytes());
  EXPECT_EQ(s.filename(), path);
  Tensor back(s, kFloat32, {3});
  EXPECT_TRUE(back.equal(t));
}

// from_file(shared=true) maps the file shared: two mappings see each other's writes and
// the file holds them.
TEST(SeedExamples, SharedFileMappingsShareData) {
  testing::TempDir dir;
  const std::string path = dir.file("shared.bin");
  UntypedStorage a = UntypedStorage::from_file(path, /*shared=*/true, 16);
  UntypedStorage b = UntypedStorage::from_file(path, /*shared=*/true, 16);
  EXPECT_EQ(a.filename(), path);
  EXPECT_EQ(a.nbytes(), 16);
  a.mutable_data()[3] = std::byte{42};
  EXPECT_EQ(b.data()[3], std::byte{42});
  UntypedStorage private_view = UntypedStorage::from_file(path, /*shared=*/false, 16);
  EXPECT_EQ(private_view.data()[3], std::byte{42});
  private_view.mutable_data()[3] = std::byte{7};  // copy-on-write: never reaches the file
  EXPECT_EQ(a.data()[3], std::byte{42});
}

// num_bytes = X.numel() * X.element_size(); contiguous layout is [C*H*W, H*W, W, 1].
TEST(SeedExamples, ContiguousStridesFormula) {
  const int64_t B = 8, C = 3, H = 5, W = 7;
  Tensor x = empty({B, C, H, W});
  EXPECT_EQ(x.strides(), IntArrayRef({C * H * W, H * W, W, 1}));
  EXPECT_EQ(x.numel() * x.element_size(), B * C * H * W * 4);
}

}  // namespace
}  // namespace mmt
