// Tensor views, layouts, copies and errors behave as PyTorch's do.
#include <gtest/gtest.h>

#include <cmath>
#include <complex>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "mmtensor/mmtensor.h"
#include "strided_copy.h"
#include "tensor_geometry.h"
#include "test_util.h"

namespace mmt {
namespace {

using testing::error_of;

TEST(Tensor, MetadataOfAFreshTensor) {
  Tensor t = empty({2, 3, 4}, kInt16);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.element_size(), 2);
  EXPECT_EQ(t.nbytes(), 48);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.stride(0), 12);
  EXPECT_EQ(t.dtype(), kInt16);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);
  EXPECT_FALSE(Tensor().defined());
}

TEST(Tensor, EveryDtypeHasItsSizeAndName) {
  struct Case { ScalarType t; int64_t size; const char* name; };
  for (Case c : {Case{kBool, 1, "bool"}, {kUInt8, 1, "uint8"}, {kInt8, 1, "int8"},
                 {kInt16, 2, "int16"}, {kUInt16, 2, "uint16"}, {kInt32, 4, "int32"},
                 {kUInt32, 4, "uint32"}, {kInt64, 8, "int64"}, {kUInt64, 8, "uint64"},
                 {kFloat16, 2, "float16"}, {kBFloat16, 2, "bfloat16"}, {kFloat32, 4, "float32"},
                 {kFloat64, 8, "float64"}, {kComplex64, 8, "complex64"}, {kComplex128, 16, "complex128"}}) {
    EXPECT_EQ(element_size(c.t), c.size);
    EXPECT_EQ(to_string(c.t), c.name);
    EXPECT_EQ(scalar_type_from_string(c.name), c.t);
    EXPECT_EQ(scalar_type_from_string(std::string("torch.") + c.name), c.t);
  }
  EXPECT_EQ(scalar_type_from_string("half"), kFloat16);
  EXPECT_EQ(scalar_type_from_string("cfloat"), kComplex64);
  EXPECT_EQ(scalar_type_from_string("torch.cdouble"), kComplex128);
  EXPECT_EQ(scalar_type_from_string("byte"), kUInt8);  // torch.byte, torch.char
  EXPECT_EQ(scalar_type_from_string("torch.char"), kInt8);
  EXPECT_FALSE(scalar_type_from_string("complex32").has_value());  // torch.chalf: no numpy type, not stored
  // PyTorch's classification: complex is signed, and not floating point.
  EXPECT_TRUE(is_complex(kComplex64) && is_signed(kComplex64) && !is_floating_point(kComplex64));
  EXPECT_EQ(to_real_value_type(kComplex128), kFloat64);
  EXPECT_EQ(to_real_value_type(kInt8), kInt8);
}

TEST(Tensor, HalfAndBFloat16Conversions) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.1f}) {
    EXPECT_NEAR(static_cast<float>(Half(v)), v, std::fabs(v) * 1e-3f + 1e-12f) << v;
    EXPECT_NEAR(static_cast<float>(BFloat16(v)), v, std::fabs(v) * 1e-2f) << v;
  }
  EXPECT_EQ(Half(1.0f).bits, 0x3c00);
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3f80);
  EXPECT_TRUE(std::isinf(static_cast<float>(Half(70000.0f))));
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(NAN))));
  Tensor h = arange(5, kFloat16);
  EXPECT_EQ(h.to_double_vector(), (std::vector<double>{0, 1, 2, 3, 4}));
}

TEST(Tensor, ViewBoundsAreCheckedAtConstruction) {
  UntypedStorage s = UntypedStorage::allocate(24);
  EXPECT_NO_THROW(Tensor(s, kFloat32, {2, 3}));
  std::string msg = error_of([&] { Tensor(s, kFloat32, {2, 4}); });
  EXPECT_NE(msg.find("reaches outside the storage of 24 bytes"), std::string::npos) << msg;
  EXPECT_THROW(Tensor(s, kFloat32, {3}, {1}, 4), ValueError);
  EXPECT_THROW(Tensor(s, kFloat32, {2}, {-1}, 0), ValueError);  // reaches element -1
  EXPECT_NO_THROW(Tensor(s, kFloat32, {2}, {-1}, 1));
  EXPECT_THROW(Tensor(s, kFloat32, {-1}), ValueError);
  EXPECT_THROW(Tensor(s, kFloat32, {1}, {1}, -1), ValueError);
  EXPECT_THROW(Tensor(s, kFloat32, {INT64_MAX, 2}), ValueError);  // element count overflows
  EXPECT_THROW(Tensor(s, kFloat32, {2, 2}, {INT64_MAX, 1}), ValueError);
  EXPECT_THROW(s.allocate(-3), ValueError);
  EXPECT_NO_THROW(Tensor(s, kFloat32, {0, 100}));  // empty views address nothing
  // numel is 0, but contiguous strides of this shape would overflow.
  EXPECT_THROW(empty({0, INT64_MAX / 2, 4}), ValueError);
}

TEST(Tensor, OutOfRangeDimensionsAndIndices) {
  Tensor t = arange(6).view({2, 3});
  std::string msg = error_of([&] { t.size(2); });
  EXPECT_NE(msg.find("Dimension out of range (expected to be in range of [-2, 1], but got 2)"),
            std::string::npos) << msg;
  EXPECT_THROW(t.select(0, 2), IndexError);
  EXPECT_EQ(t.select(0, -1).to_vector<int64_t>(), (std::vector<int64_t>{3, 4, 5}));
  msg = error_of([&] { t.at<int64_t>({0, 3}); });
  EXPECT_NE(msg.find("index 3 is out of bounds for dimension 1 with size 3"), std::string::npos);
  EXPECT_THROW(t.at<int64_t>({0}), IndexError);
  EXPECT_THROW(t.at<float>({0, 0}), ValueError);  // dtype mismatch
  EXPECT_THROW(t.narrow(1, 2, 2), IndexError);
  // Negative indices count from the end, as t[-1][-2] does in PyTorch; past -size is out.
  EXPECT_EQ(t.at<int64_t>({-1, -2}), 4);
  t.set<int64_t>({-2, -1}, 20);
  EXPECT_EQ(t.at<int64_t>({0, 2}), 20);
  msg = error_of([&] { t.at<int64_t>({0, -4}); });
  EXPECT_NE(msg.find("index -4 is out of bounds for dimension 1 with size 3"), std::string::npos) << msg;
  msg = error_of([&] { t.narrow(1, 0, -1); });
  EXPECT_NE(msg.find("narrow(): length must be non-negative."), std::string::npos) << msg;
  EXPECT_THROW(t.permute({0, 0}), ValueError);
  EXPECT_THROW(t.permute({0}), ValueError);
  EXPECT_THROW(t.view({4, -1}), ValueError);
  EXPECT_THROW(t.view({-1, -1}), ValueError);
  EXPECT_THROW(t.expand({3, 3}), ValueError);
  EXPECT_THROW(t.slice(0, 0, 2, 0), ValueError);
  EXPECT_THROW(t.unsqueeze(4), IndexError);
  EXPECT_THROW(empty({2, 2, 2}).t(), ValueError);
}

// A 0-d tensor has no dimension to ask about: size(0) used to return a stale size (5 for
// arange(5)[2]). PyTorch raises IndexError too. Views still wrap a scalar's dimension 0.
TEST(Tensor, AScalarHasNoSizeOrStride) {
  const Tensor scalar = arange(5)[2];
  ASSERT_EQ(scalar.dim(), 0);
  for (int64_t d : {0, -1}) {
    EXPECT_THROW_WITH(scalar.size(d), IndexError, "the tensor has no dimensions");
    EXPECT_THROW_WITH(scalar.stride(d), IndexError, "the tensor has no dimensions");
  }
  EXPECT_EQ(scalar.unsqueeze(0).sizes(), IntArrayRef({1}));
  EXPECT_EQ(scalar.sizes(), IntArrayRef({}));
}

// expand() refuses a negative size on an existing dimension as on a new one: it used to make
// a tensor of negative numel from expand({-2}) of a size-1 tensor.
TEST(Tensor, ExpandRefusesNegativeSizes) {
  const Tensor one = arange(1);
  EXPECT_THROW_WITH(one.expand({-2}), ValueError, "is negative");
  EXPECT_THROW_WITH(one.expand({-3, 1}), ValueError, "not allowed in a leading, non-existing dimension");
  EXPECT_EQ(one.expand({-1}).sizes(), IntArrayRef({1}));
  EXPECT_EQ(one.expand({4}).sizes(), IntArrayRef({4}));
}

// MemoryFormat::Preserve says how a copy keeps its input's layout; asked of a layout check,
// contiguous() or a new tensor it names no layout, and PyTorch refuses it there too.
TEST(Tensor, PreserveIsForCopiesOnly) {
  const Tensor t = arange(24).view({1, 2, 3, 4}).contiguous(MemoryFormat::ChannelsLast);
  EXPECT_THROW_WITH((void)t.is_contiguous(MemoryFormat::Preserve), ValueError, "preserve memory format");
  EXPECT_THROW_WITH((void)t.contiguous(MemoryFormat::Preserve), ValueError, "preserve memory format");
  EXPECT_THROW_WITH((void)empty({2, 3}, kFloat32, kCPU, MemoryFormat::Preserve), ValueError, "preserve memory format");
  EXPECT_TRUE(t.clone(MemoryFormat::Preserve).is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_TRUE(t.to(MemoryFormat::Preserve).is_same_storage(t));  // to()'s default in PyTorch
  EXPECT_THROW((void)strides_for({2, 3}, MemoryFormat::Preserve), ValueError);
  EXPECT_TRUE(empty_like(t, MemoryFormat::Preserve).is_contiguous(MemoryFormat::ChannelsLast));
}

// A bool byte from a file may be 2..255 (FORMAT.md: readers take any nonzero byte as true).
// Every way of reading elements reads it as true: loading it as a C++ bool is undefined
// behaviour (UBSan's -fsanitize=bool flags it), and gave 2.0 from to_double_vector().
TEST(Tensor, BoolBytesOtherThanZeroAndOneAreTrueEverywhere) {
  Tensor flags = empty({4}, kBool);
  const uint8_t bytes[4] = {0, 2, 1, 255};
  std::memcpy(flags.mutable_data_ptr(), bytes, 4);
  EXPECT_EQ(flags.to_vector<bool>(), (std::vector<bool>{false, true, true, true}));
  EXPECT_EQ(flags.to_double_vector(), (std::vector<double>{0, 1, 1, 1}));
  Tensor as_float = empty({4}, kFloat32), as_byte = empty({4}, kUInt8);
  as_float.copy_(flags);
  as_byte.copy_(flags);
  EXPECT_EQ(as_float.to_vector<float>(), (std::vector<float>{0, 1, 1, 1}));
  EXPECT_EQ(as_byte.to_vector<uint8_t>(), (std::vector<uint8_t>{0, 1, 1, 1}));
  Tensor canonical = empty({4}, kBool);
  const uint8_t ones[4] = {0, 1, 1, 1};
  std::memcpy(canonical.mutable_data_ptr(), ones, 4);
  EXPECT_TRUE(flags.equal(canonical));
  // at<bool>() reads through load_element too: the byte 2 is true, and a valid bool.
  EXPECT_TRUE(flags.at<bool>({1}));
  EXPECT_FALSE(!flags.at<bool>({1}));
  EXPECT_TRUE(flags.at<bool>({3}));
}

// A storage mapped at any byte offset may leave elements unaligned: at() and set() still
// read and write them (through memcpy, not a misaligned load).
TEST(Tensor, ElementAccessAtAnUnalignedAddress) {
  UntypedStorage bytes = UntypedStorage::allocate(1 + 3 * sizeof(float));
  const float values[3] = {1.5f, -2.0f, 3.25f};
  std::memcpy(bytes.mutable_data() + 1, values, sizeof values);
  // Bytes 1..12 as float32, as a mapping made at an odd offset would give them.
  const UntypedStorage odd = UntypedStorage::from_blob(bytes.mutable_data() + 1, sizeof values, [](void*) {});
  const Tensor unaligned(odd, kFloat32, {3});
  EXPECT_EQ(unaligned.at<float>({1}), -2.0f);
  unaligned.set<float>({2}, 7.0f);
  EXPECT_EQ(unaligned.at<float>({2}), 7.0f);
  EXPECT_EQ(unaligned.at<float>({0}), 1.5f);
}

// Every operation on an undefined Tensor() says so: views of it used to come back defined,
// over no storage, and reading them crashed.
TEST(Tensor, AnUndefinedTensorIsRefusedByEveryView) {
  const Tensor undefined;
  EXPECT_FALSE(undefined.defined());
  EXPECT_EQ(undefined.numel(), 0);
  EXPECT_EQ(undefined.nbytes(), 0);
  EXPECT_THROW_WITH((void)undefined.unsqueeze(0), ValueError, "unsqueeze() of an undefined tensor");
  EXPECT_THROW_WITH((void)undefined.squeeze(), ValueError, "squeeze() of an undefined tensor");
  EXPECT_THROW_WITH((void)undefined.squeeze(0), ValueError, "squeeze() of an undefined tensor");
  EXPECT_THROW_WITH((void)undefined.expand({3}), ValueError, "expand() of an undefined tensor");
  EXPECT_THROW_WITH((void)undefined.permute({}), ValueError, "permute() of an undefined tensor");
  EXPECT_THROW_WITH((void)undefined.transpose(0, 0), ValueError, "transpose() of an undefined tensor");
  EXPECT_THROW_WITH((void)undefined.t(), ValueError, "t() of an undefined tensor");
  EXPECT_THROW_WITH((void)undefined.flatten(), ValueError, "flatten() of an undefined tensor");
  EXPECT_THROW_WITH((void)undefined.select(0, 0), ValueError, "select() of an undefined tensor");
  EXPECT_THROW_WITH((void)undefined.narrow(0, 0, 0), ValueError, "narrow() of an undefined tensor");
  EXPECT_THROW_WITH((void)undefined.slice(0, 0, 1), ValueError, "slice() of an undefined tensor");
  EXPECT_THROW_WITH((void)undefined.as_strided({}, {}, 0), ValueError, "as_strided() of an undefined tensor");
  EXPECT_THROW_WITH((void)undefined.view({1}), ValueError, "view() of an undefined tensor");
  EXPECT_THROW_WITH((void)undefined.is_contiguous(), ValueError, "is_contiguous() of an undefined tensor");
  EXPECT_THROW((void)undefined.item<float>(), ValueError);
  EXPECT_THROW((void)undefined.at<float>({}), ValueError);
}

// Where PyTorch refuses a view or sizes it without overflow, so does mmtensor.
TEST(Tensor, ViewsAtTheLimitsOfInt64) {
  const Tensor seven = full({}, 7.0f);
  // torch: "numel: integer multiplication overflow"; the count used to wrap to 2^32 or 0.
  EXPECT_THROW_WITH((void)seven.expand({int64_t{1} << 32, (int64_t{1} << 32) + 1}), ValueError,
                    "more elements than fit in int64");
  EXPECT_EQ(seven.expand({int64_t{1} << 31, 4}).numel(), int64_t{1} << 33);
  // A step past the size: one element (or none), and no overflow on the way.
  const Tensor x = arange(10);
  const Tensor every_max = x.slice(0, 0, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(every_max.sizes(), IntArrayRef({1}));
  EXPECT_EQ(every_max.item<int64_t>(), 0);
  EXPECT_EQ(x.slice(0, 3, 4, std::numeric_limits<int64_t>::max()).item<int64_t>(), 3);
  EXPECT_EQ(x.slice(0, 5, 5, std::numeric_limits<int64_t>::max()).numel(), 0);
  EXPECT_EQ(x.slice(0, 1, 10, 3).to_vector<int64_t>(), (std::vector<int64_t>{1, 4, 7}));
  // An empty tensor's strides are still computed; past int64 they are refused, not wrapped.
  EXPECT_THROW_WITH((void)empty({0}).view({0, int64_t{1} << 62, 4}), ValueError, "overflow int64");
  EXPECT_THROW_WITH((void)empty({0, 4, int64_t{1} << 62, 4}, kUInt8, kCPU, MemoryFormat::ChannelsLast), ValueError,
                    "overflow int64");
  EXPECT_EQ(strides_for({2, 3, 4, 5}, MemoryFormat::ChannelsLast), DimVector({60, 1, 15, 3}));
  EXPECT_EQ(strides_for({2, 3, 4, 5, 6}, MemoryFormat::ChannelsLast3d), DimVector({360, 1, 90, 18, 3}));
  EXPECT_EQ(strides_for({2, 3, 0, 5}, MemoryFormat::ChannelsLast), DimVector({0, 1, 15, 3}));  // as PyTorch
  // flatten(start, end) of a 0-d tensor takes the dims of a 1-d one (0 and -1), as PyTorch.
  EXPECT_EQ(seven.flatten().sizes(), IntArrayRef({1}));
  EXPECT_EQ(seven.flatten(-1, 0).sizes(), IntArrayRef({1}));
  EXPECT_THROW((void)seven.flatten(1), IndexError);
}

TEST(Tensor, ViewOperations) {
  Tensor x = arange(24).view({2, 3, 4});
  EXPECT_EQ(x.view({-1, 4}).sizes(), IntArrayRef({6, 4}));
  EXPECT_EQ(x.transpose(0, 2).sizes(), IntArrayRef({4, 3, 2}));
  EXPECT_EQ(x.transpose(0, 2).strides(), IntArrayRef({1, 4, 12}));
  EXPECT_EQ(x.narrow(2, 1, 2).at<int64_t>({1, 2, 1}), 1 * 12 + 2 * 4 + 2);
  EXPECT_EQ(x.unsqueeze(1).sizes(), IntArrayRef({2, 1, 3, 4}));
  EXPECT_EQ(x.unsqueeze(1).strides(), IntArrayRef({12, 12, 4, 1}));
  EXPECT_EQ(x.unsqueeze(-1).strides(), IntArrayRef({12, 4, 1, 1}));
  EXPECT_EQ(x.unsqueeze(1).squeeze().sizes(), IntArrayRef({2, 3, 4}));
  EXPECT_EQ(x.unsqueeze(0).squeeze(0).sizes(), IntArrayRef({2, 3, 4}));
  EXPECT_EQ(x.squeeze(1).sizes(), IntArrayRef({2, 3, 4}));  // size 3: unchanged
  EXPECT_EQ(x.flatten().sizes(), IntArrayRef({24}));
  EXPECT_EQ(x.flatten(1).sizes(), IntArrayRef({2, 12}));
  EXPECT_TRUE(x.flatten(1).is_same_storage(x));
  Tensor row = arange(3).view({1, 3});
  Tensor wide = row.expand({4, 3});
  EXPECT_EQ(wide.strides(), IntArrayRef({0, 1}));
  EXPECT_EQ(wide.at<int64_t>({3, 2}), 2);
  EXPECT_EQ(row.expand({2, -1, 3}).sizes(), IntArrayRef({2, 1, 3}));
  // Slicing clamps like Python.
  Tensor v = arange(10);
  EXPECT_EQ(v.slice(0, -3).to_vector<int64_t>(), (std::vector<int64_t>{7, 8, 9}));
  EXPECT_EQ(v.slice(0, 8, 100).numel(), 2);
  EXPECT_EQ(v.slice(0, 5, 2).numel(), 0);
  EXPECT_EQ(v.slice(0, 1, 10, 3).to_vector<int64_t>(), (std::vector<int64_t>{1, 4, 7}));
  EXPECT_EQ(v[4].item<int64_t>(), 4);
  // An empty slice starts where its start is, as in PyTorch 2 (torch.arange(12).view(3, 4)
  // gives 5 7 10 4 12 8 for these): code that locates a view by its offset finds it there.
  Tensor m = arange(12).view({3, 4});
  EXPECT_EQ(v.slice(0, 5, 5).storage_offset(), 5);
  EXPECT_EQ(v.slice(0, 7, 3).storage_offset(), 7);
  EXPECT_EQ(v.slice(0, 20, 30).storage_offset(), 10);
  EXPECT_EQ(m.slice(1, 5).storage_offset(), 4);
  EXPECT_EQ(m.slice(0, 3).storage_offset(), 12);
  EXPECT_EQ(m.narrow(0, -1, 0).storage_offset(), 8);
  // Where no element could start (a negative stride, or past int64) the offset stays put.
  Tensor backwards = m.as_strided({0, 4}, {-4, 1}, 8);
  EXPECT_EQ(backwards.slice(0, 0, 0).storage_offset(), 8);
  Tensor far = empty({0}).as_strided({2, 0}, {std::numeric_limits<int64_t>::max(), 1}, 3);
  EXPECT_EQ(far.slice(0, 1).storage_offset(), 3);
  EXPECT_EQ(far.select(0, 1).storage_offset(), 3);  // select() follows the same rule
  EXPECT_EQ(empty({0, 4}).select(1, 3).storage_offset(), 3);
  // A dimension of size 0 takes start 0 only (PyTorch 2's rule: [-size, size]).
  EXPECT_THROW_WITH((void)empty({0, 2}).narrow(0, 1, 0), IndexError,
                    "start out of range (expected to be in range of [0, 0], but got 1)");
  // An empty view may start past the storage, but not past any address: data_ptr() adds the
  // offset in bytes to the storage's address.
  EXPECT_EQ(empty({4}).as_strided({0}, {1}, 100).storage_offset(), 100);
  EXPECT_THROW_WITH((void)empty({4}).as_strided({0}, {1}, std::numeric_limits<int64_t>::max() / 2),
                    ValueError, "is past any address");
  EXPECT_EQ(v[4].dim(), 0);
  EXPECT_EQ(arange(4).t().sizes(), IntArrayRef({4}));
}

TEST(Tensor, ReshapeCopiesOnlyWhenItMust) {
  Tensor x = arange(12).view({3, 4});
  EXPECT_TRUE(x.reshape({4, 3}).is_same_storage(x));
  EXPECT_TRUE(x.slice(0, 0, 2).reshape({8}).is_same_storage(x));   // rows are contiguous
  EXPECT_FALSE(x.slice(1, 0, 2).reshape({6}).is_same_storage(x));  // columns are not
  EXPECT_TRUE(x.slice(1, 0, 2).view({3, 2, 1}).is_same_storage(x));
  // A view that splits and merges over size-1 dimensions, as PyTorch allows.
  Tensor y = arange(6).view({2, 1, 3}).transpose(0, 1);
  EXPECT_TRUE(y.view({1, 2, 3}).is_same_storage(y));
  // Views of empty tensors.
  EXPECT_EQ(empty({0, 4}).view({4, 0}).sizes(), IntArrayRef({4, 0}));
  EXPECT_EQ(empty({}).view({1, 1}).sizes(), IntArrayRef({1, 1}));
}

TEST(Tensor, ContiguityRules) {
  EXPECT_TRUE(empty({0, 3}).t().is_contiguous());  // empty is contiguous
  EXPECT_TRUE(empty({0, 4}).slice(1, 0, kSliceEnd, 2).is_contiguous());  // whatever its strides
  // ...but a copy keeps its strides, as PyTorch's empty_like does (every empty tensor is
  // "non-overlapping and dense"); suggest_memory_format, by PyTorch's rule, never says
  // channels-last for an empty tensor.
  const Tensor empty_cl = empty({0, 3, 4, 4}, kFloat32, kCPU, MemoryFormat::ChannelsLast);
  EXPECT_EQ(empty_cl.suggest_memory_format(), MemoryFormat::Contiguous);
  EXPECT_EQ(empty_like(empty_cl).strides(), empty_cl.strides());
  EXPECT_TRUE(empty_like(empty_cl).is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_TRUE(empty({3, 1}).t().is_contiguous());  // size-1 dims are skipped
  Tensor nchw = empty({2, 3, 4, 5});
  EXPECT_FALSE(nchw.is_contiguous(MemoryFormat::ChannelsLast));
  Tensor nhwc = nchw.contiguous(MemoryFormat::ChannelsLast);
  EXPECT_EQ(nhwc.strides(), IntArrayRef({60, 1, 15, 3}));
  EXPECT_EQ(nhwc.suggest_memory_format(), MemoryFormat::ChannelsLast);
  EXPECT_EQ(nhwc.clone().strides(), nhwc.strides());  // Preserve keeps the layout
  EXPECT_EQ(nhwc.clone(MemoryFormat::Contiguous).strides(), IntArrayRef({60, 20, 5, 1}));
  Tensor ndhwc = empty({2, 3, 4, 5, 6}, kUInt8, kCPU, MemoryFormat::ChannelsLast3d);
  EXPECT_EQ(ndhwc.strides(), IntArrayRef({360, 1, 90, 18, 3}));
  EXPECT_TRUE(ndhwc.is_contiguous(MemoryFormat::ChannelsLast3d));
  EXPECT_THROW(empty({2, 3, 4}, kFloat32, kCPU, MemoryFormat::ChannelsLast), ValueError);
  // A channels-last tensor with C == 1 is both contiguous and channels-last, as in PyTorch.
  Tensor c1 = empty({2, 1, 4, 4});
  EXPECT_TRUE(c1.is_contiguous(MemoryFormat::ChannelsLast));
}

// Channels-last strides of a shape with a zero-size C, H, W or D were built as if that size
// were 1 ([2,0,4,5] got [20,1,5,1]; PyTorch gives [0,1,0,0]), so the tensor failed its own
// is_contiguous(ChannelsLast), and contiguous(ChannelsLast) copied on every call.
TEST(Tensor, ChannelsLastStridesOfAnEmptyShapeAreThoseOfPyTorch) {
  const Tensor nhwc = empty({2, 0, 4, 5}, kFloat32, kCPU, MemoryFormat::ChannelsLast);
  EXPECT_EQ(nhwc.strides(), IntArrayRef({0, 1, 0, 0}));
  EXPECT_TRUE(nhwc.is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_TRUE(nhwc.contiguous(MemoryFormat::ChannelsLast).is_same_storage(nhwc));
  EXPECT_EQ(empty({2, 3, 4, 0}, kFloat32, kCPU, MemoryFormat::ChannelsLast).strides(), IntArrayRef({0, 1, 0, 3}));
  EXPECT_EQ(empty({2, 3, 0, 5}, kFloat32, kCPU, MemoryFormat::ChannelsLast).strides(), IntArrayRef({0, 1, 15, 3}));
  const Tensor ndhwc = empty({2, 0, 4, 5, 6}, kUInt8, kCPU, MemoryFormat::ChannelsLast3d);
  EXPECT_EQ(ndhwc.strides(), IntArrayRef({0, 1, 0, 0, 0}));
  EXPECT_TRUE(ndhwc.is_contiguous(MemoryFormat::ChannelsLast3d));
  EXPECT_EQ(empty({0, 3, 4, 5}, kFloat32, kCPU, MemoryFormat::ChannelsLast).strides(), IntArrayRef({60, 1, 15, 3}));
}

// suggest_memory_format() asked for a dense channels-last tensor; PyTorch reads the order of
// the strides, so a slice of a channels-last batch, or a channels-last tensor of 1x1 images,
// still suggests channels-last, and an empty one never does.
TEST(Tensor, SuggestMemoryFormatReadsTheOrderOfTheStridesAsPyTorch) {
  const Tensor cl = empty({4, 3, 8, 8}, kFloat32, kCPU, MemoryFormat::ChannelsLast);
  EXPECT_EQ(cl.suggest_memory_format(), MemoryFormat::ChannelsLast);
  EXPECT_EQ(cl.slice(0, 0, 4, 2).suggest_memory_format(), MemoryFormat::ChannelsLast);
  EXPECT_EQ(cl.slice(2, 0, 8, 2).suggest_memory_format(), MemoryFormat::ChannelsLast);
  EXPECT_EQ(empty({2, 3, 1, 1}, kFloat32, kCPU, MemoryFormat::ChannelsLast).suggest_memory_format(),
            MemoryFormat::ChannelsLast);  // strides [3, 1, 3, 3]
  EXPECT_EQ(empty({0, 3, 4, 5}, kFloat32, kCPU, MemoryFormat::ChannelsLast).suggest_memory_format(),
            MemoryFormat::Contiguous);
  // Ambiguous layouts read as row-major: N111, and C == 1 (contiguous either way).
  EXPECT_EQ(empty({5, 1, 1, 1}).suggest_memory_format(), MemoryFormat::Contiguous);
  EXPECT_EQ(empty({2, 1, 4, 4}).suggest_memory_format(), MemoryFormat::Contiguous);
  EXPECT_EQ(empty({2, 3, 4, 5}).suggest_memory_format(), MemoryFormat::Contiguous);
  EXPECT_EQ(empty({2, 3, 4, 5}).permute({0, 2, 3, 1}).suggest_memory_format(), MemoryFormat::Contiguous);
  const Tensor cl3d = empty({4, 3, 4, 6, 6}, kUInt8, kCPU, MemoryFormat::ChannelsLast3d);
  EXPECT_EQ(cl3d.suggest_memory_format(), MemoryFormat::ChannelsLast3d);
  EXPECT_EQ(cl3d.slice(0, 0, 4, 2).slice(2, 0, 4, 2).suggest_memory_format(), MemoryFormat::ChannelsLast3d);
}

// A new leading dimension of size 1 got stride 0 from expand(); PyTorch steps it over the
// next dimension, as unsqueeze() does, and gives 0 only to one that broadcasts.
TEST(Tensor, ExpandGivesANewSizeOneDimensionPyTorchsStride) {
  EXPECT_EQ(arange(3).expand({1, 3}).strides(), IntArrayRef({3, 1}));
  EXPECT_EQ(arange(6).view({2, 3}).expand({2, 1, 2, 3}).strides(), IntArrayRef({0, 6, 3, 1}));
  EXPECT_EQ(full({}, 7, kInt64).expand({1}).strides(), IntArrayRef({0}));  // a 0-d tensor's: all 0
  EXPECT_EQ(full({}, 7, kInt64).expand({2, 3}).strides(), IntArrayRef({0, 0}));
}

// A copy of an empty view (clone, empty_like, pin_memory) kept dense row-major strides;
// PyTorch keeps the view's own. A view walking every dimension backwards was cloned
// column-major: dimensions are ranked by |stride|.
TEST(Tensor, CopiesKeepTheLayoutOfEmptyAndReversedViews) {
  const Tensor x = empty({3, 4}).slice(0, 0, 0).slice(1, 0, 4, 2);  // [0, 2], strides [4, 2]
  EXPECT_EQ(x.clone().strides(), IntArrayRef({4, 2}));
  EXPECT_EQ(empty_like(x).strides(), IntArrayRef({4, 2}));
  const Tensor reversed = arange(6).as_strided({2, 3}, {-3, -1}, 5);
  EXPECT_EQ(reversed.clone().strides(), IntArrayRef({3, 1}));
  EXPECT_TRUE(reversed.clone().equal(reversed));
  // A size-1 dimension walked backwards is no reason to refuse a copy (its stride is not kept).
  const Tensor one_row = arange(3).as_strided({1, 3}, {-3, 1}, 0);
  EXPECT_EQ(one_row.clone().strides(), IntArrayRef({3, 1}));
  EXPECT_TRUE(one_row.clone().equal(one_row));
}

// torch's x.to(dtype): the same tensor for its own dtype, else a converted copy in the same
// layout (a channels-last uint8 image to float32 stays channels-last).
TEST(Tensor, ToADtypeConvertsAndKeepsTheLayout) {
  const Tensor image = arange(24, kUInt8).view({1, 2, 3, 4}).contiguous(MemoryFormat::ChannelsLast);
  const Tensor as_float = image.to(kFloat32);
  EXPECT_EQ(as_float.dtype(), kFloat32);
  EXPECT_EQ(as_float.strides(), image.strides());
  EXPECT_TRUE(as_float.equal(arange(24, kFloat32).view({1, 2, 3, 4})));
  EXPECT_EQ(image.to(kUInt8).data_ptr(), image.data_ptr());
  EXPECT_TRUE(full({2}, 300, kInt32).to(kUInt8).equal(full({2}, 44, kUInt8)));  // wraps, as PyTorch casts
  // A float out of an integer type's range was a bare static_cast: undefined (UBSan's
  // float-cast-overflow). Now what PyTorch gives on x86-64 for signed types and uint8, and a
  // defined value (tensor_copy.cc) for the other unsigned ones.
  EXPECT_EQ(full({1}, 300.0, kFloat32).to(kUInt8).item<uint8_t>(), 44);
  EXPECT_EQ(full({1}, 2147483649.0, kFloat64).to(kUInt8).item<uint8_t>(), 1);  // through int64, as PyTorch
  EXPECT_EQ(full({1}, -1.5, kFloat32).to(kUInt8).item<uint8_t>(), 255);
  EXPECT_EQ(full({1}, -3.7, kFloat64).to(kInt8).item<int8_t>(), -3);
  EXPECT_EQ(full({1}, 3e9, kFloat64).to(kInt32).item<int32_t>(), INT32_MIN);
  EXPECT_EQ(full({1}, 3e9, kFloat64).to(kUInt32).item<uint32_t>(), 3000000000u);
  EXPECT_EQ(full({1}, std::nan(""), kFloat64).to(kInt64).item<int64_t>(), INT64_MIN);
  EXPECT_EQ(full({1}, 1e30, kFloat32).to(kInt64).item<int64_t>(), INT64_MIN);
  EXPECT_EQ(full({1}, -1.0, kFloat64).to(kUInt64).item<uint64_t>(), UINT64_MAX);
  EXPECT_EQ(full({1}, 1e19, kFloat64).to(kUInt64).item<uint64_t>(), 10000000000000000000ull);
  EXPECT_EQ(full({1}, 1e30, kFloat64).to(kUInt64).item<uint64_t>(), uint64_t{1} << 63);  // defined; not PyTorch's
  EXPECT_EQ(full({1}, INFINITY, kFloat16).to(kInt16).item<int16_t>(), static_cast<int16_t>(INT32_MIN));
  // contiguous(Preserve) names itself, not is_contiguous.
  EXPECT_THROW_WITH(image.contiguous(MemoryFormat::Preserve), ValueError,
                    "contiguous: preserve memory format is unsupported");
}

// Strides past int64 were computed with signed overflow (undefined behaviour): unsqueeze and
// real() over a huge stride of an empty or one-element dimension, flatten of an empty tensor
// whose other sizes multiply past int64.
TEST(Tensor, ViewsOfHugeStridesOrSizesDoNotOverflow) {
  const Tensor base = empty({4});
  const Tensor unsqueezed = base.as_strided({2, 0}, {INT64_MAX, 1}, 0).unsqueeze(0);
  EXPECT_EQ(unsqueezed.sizes(), IntArrayRef({1, 2, 0}));
  EXPECT_EQ(unsqueezed.strides(), IntArrayRef({0, INT64_MAX, 1}));  // 2 * INT64_MAX wrapped to -2
  EXPECT_THROW_WITH(base.as_strided({0, INT64_MAX / 2, 4}, {1, 1, 1}, 0).flatten(1, 2), ValueError,
                    "the merged size overflows int64");
  const Tensor c = empty({2}, kComplex64).as_strided({1}, {INT64_MAX}, 0);
  EXPECT_EQ(c.real().sizes(), IntArrayRef({1}));
  EXPECT_EQ(c.real().strides(), IntArrayRef({0}));  // 2 * INT64_MAX wrapped to -2
  EXPECT_EQ(c.imag().storage_offset(), 1);
}

TEST(Tensor, CopyBetweenLayoutsAndDtypes) {
  Tensor src = arange(2 * 3 * 4 * 5, kFloat32).view({2, 3, 4, 5});
  Tensor cl = src.contiguous(MemoryFormat::ChannelsLast);
  EXPECT_TRUE(cl.equal(src));
  Tensor back = empty({2, 3, 4, 5});
  back.copy_(cl);
  EXPECT_TRUE(back.equal(src));
  Tensor as_int = empty({2, 3, 4, 5}, kInt32);
  as_int.copy_(src);
  EXPECT_EQ(as_int.at<int32_t>({1, 2, 3, 4}), 119);
  Tensor as_half = empty({2, 3, 4, 5}, kFloat16);
  as_half.copy_(src);
  EXPECT_EQ(as_half.to_double_vector()[119], 119.0);
  Tensor as_bool = empty({3}, kBool);
  as_bool.copy_(tensor<float>({0.0f, 0.5f, -2.0f}));
  EXPECT_EQ(as_bool.to_string(), "tensor([False,  True,  True])");
  // Broadcasting source.
  Tensor grid = zeros({3, 4}, kInt64);
  grid.copy_(arange(4));
  EXPECT_EQ(grid.at<int64_t>({2, 3}), 3);
  // Writing into an expanded tensor is refused, as in PyTorch.
  EXPECT_THROW(arange(3).view({1, 3}).expand({2, 3}).copy_(zeros({2, 3}, kInt64)), ValueError);
  // Overlapping source and destination in one storage are staged, not corrupted.
  Tensor seq = arange(10);
  seq.slice(0, 1, 10).copy_(seq.slice(0, 0, 9));
  EXPECT_EQ(seq.to_vector<int64_t>(), (std::vector<int64_t>{0, 0, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_THROW_WITH(empty({2, 3}).copy_(empty({3, 2})), ValueError,
                    "a source of shape [3, 2] does not broadcast to the output's shape [2, 3]");
  EXPECT_THROW_WITH(empty({3}).copy_(zeros({2, 3})), ValueError, "a source of shape [2, 3] does not broadcast");
  // Two storages over one buffer alias: the copy is staged by address, not by storage. The
  // destination lies ahead of the source by `shift` elements, so copying in order unstaged
  // would read elements it had already overwritten (the strided case every one of them).
  for (const int64_t step : {1, 2}) {
    const int64_t shift = step;
    std::vector<int32_t> buffer(2048 + 2);
    for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<int32_t>(i);
    const auto noop = [](void*) {};
    const UntypedStorage low = UntypedStorage::from_blob(buffer.data(), 2048 * 4, noop);
    const UntypedStorage high = UntypedStorage::from_blob(buffer.data() + shift, 2048 * 4, noop);
    const Tensor src = Tensor(low, kInt32, {2048}).slice(0, 0, 2048, step);
    const Tensor dst = Tensor(high, kInt32, {2048}).slice(0, 0, 2048, step);
    dst.copy_(src);
    for (int64_t i = 0; i < 2048; i += step)
      ASSERT_EQ(buffer[static_cast<size_t>(i + shift)], i) << "element " << i << ", step " << step;
  }
}

// What a dtype cannot hold is refused, as PyTorch refuses it (c10::checked_convert), rather
// than wrapped or converted with undefined behaviour.
TEST(Tensor, ValuesADtypeCannotHoldAreRefused) {
  EXPECT_THROW_WITH(empty({1}, kUInt8).fill_(300), ValueError, "300 cannot be converted to type uint8");
  EXPECT_THROW_WITH(empty({1}, kUInt8).fill_(300.5), ValueError, "without overflow");
  EXPECT_THROW(empty({1}, kInt32).fill_(int64_t{1} << 40), ValueError);
  EXPECT_THROW(full({1}, 300, kUInt8), ValueError);
  EXPECT_THROW(empty({1}, kFloat16).fill_(1e6), ValueError);
  EXPECT_THROW(empty({1}, kFloat32).fill_(1e300), ValueError);
  EXPECT_THROW(empty({1}, kInt64).fill_(std::nan("")), ValueError);
  // What PyTorch lets through: -1 into uint8 (255), inf and nan into floats, a truncated float.
  EXPECT_EQ(full({1}, -1, kUInt8).item<int64_t>(), 255);
  EXPECT_TRUE(std::isinf(full({1}, std::numeric_limits<double>::infinity(), kFloat16).item<double>()));
  EXPECT_EQ(full({1}, 255.0, kUInt8).item<int64_t>(), 255);
  EXPECT_EQ(full({1}, -0.5, kInt8).item<int64_t>(), 0);
  EXPECT_THROW(full({1}, 255.9, kUInt8), ValueError);  // [lowest, max], as torch: not [lowest, max + 1)
  EXPECT_THROW(empty({1}, kInt8).fill_(127.5), ValueError);
  EXPECT_THROW(full({1}, -0.5, kUInt8), ValueError);
  EXPECT_EQ(full({1}, 65504.0, kFloat16).item<double>(), 65504.0);
  EXPECT_EQ(full({1}, std::numeric_limits<uint64_t>::max(), kUInt64).item<uint64_t>(),
            std::numeric_limits<uint64_t>::max());

  EXPECT_THROW_WITH((void)full({}, int64_t{300}, kInt64).item<uint8_t>(), ValueError, "without overflow");
  EXPECT_THROW((void)full({}, int64_t{1} << 40, kInt64).item<int32_t>(), ValueError);
  EXPECT_THROW((void)full({}, 1e30f, kFloat32).item<int64_t>(), ValueError);
  EXPECT_THROW((void)full({}, std::nan(""), kFloat64).item<int64_t>(), ValueError);
  EXPECT_THROW((void)full({}, 1e300, kFloat64).item<float>(), ValueError);
  EXPECT_THROW_WITH((void)full({}, int64_t{300}, kInt64).item<uint8_t>(), ValueError, "to uint8 without overflow");
  EXPECT_THROW((void)full({}, 1e30, kComplex128).item_as_int64(), ValueError);  // the real part, checked too
  EXPECT_THROW((void)full({}, std::nan(""), kComplex128).item<uint64_t>(), ValueError);
  EXPECT_EQ(full({}, -3.0, kComplex64).item<int64_t>(), -3);
  EXPECT_THROW((void)full({}, 9.3e18, kFloat64).item_as_int64(), ValueError);  // past 2^63
  EXPECT_THROW((void)full({}, std::numeric_limits<uint64_t>::max(), kUInt64).item<int64_t>(), ValueError);
  EXPECT_EQ(full({}, 9.3e18, kFloat64).item<uint64_t>(), uint64_t{9300000000000000000u});
  EXPECT_EQ(full({}, int64_t{-1}, kInt64).item<uint8_t>(), 255);  // wraps, as PyTorch lets it
  EXPECT_EQ(full({}, -2.75, kFloat64).item<int8_t>(), -2);
  EXPECT_TRUE(std::isnan(full({}, std::nan(""), kFloat64).item<float>()));
  EXPECT_EQ(full({}, int64_t{1} << 62, kInt64).item<double>(), 4.611686018427387904e18);

  static_assert(!detail::overflows<int64_t>(-9.2233720368547758e18));  // -2^63 exactly
  static_assert(detail::overflows<int64_t>(9.2233720368547758e18));    // 2^63
  static_assert(!detail::overflows<uint8_t>(int64_t{-255}) && detail::overflows<uint8_t>(int64_t{-256}));
  static_assert(!detail::overflows<bool>(1e300) && !detail::overflows<int8_t>(true));
}

// clone(), to() and pin_memory() of a view that is not dense keep its order of strides, as
// PyTorch's infer_dense_strides does; fill_ and zero_ write an expanded tensor's memory.
TEST(Tensor, ClonesOfSparseViewsKeepTheirLayout) {
  const Tensor transposed_rows = arange(24).view({4, 6}).t().slice(0, 0, 6, 2);  // [3, 4], strides [2, 6]
  EXPECT_EQ(transposed_rows.clone().strides(), IntArrayRef({1, 3}));  // torch: (1, 3)
  EXPECT_TRUE(transposed_rows.clone().equal(transposed_rows));
  const Tensor channels_last = empty({2, 3, 5, 5}, kFloat32, kCPU, MemoryFormat::ChannelsLast).fill_(1.0);
  const Tensor cropped = channels_last.slice(2, 0, 2);  // [2, 3, 2, 5]
  EXPECT_EQ(cropped.clone().strides(), IntArrayRef({30, 1, 15, 3}));  // torch: (30, 1, 15, 3)
  EXPECT_TRUE(cropped.clone().is_contiguous(MemoryFormat::ChannelsLast));
  // Stride 0 stays where row-major order puts it; equal strides put the smaller size inside.
  EXPECT_EQ(detail::dense_strides_like({2, 3}, {0, 1}), DimVector({3, 1}));
  EXPECT_EQ(detail::dense_strides_like({2, 3}, {1, 1}), DimVector({1, 2}));
  EXPECT_EQ(detail::dense_strides_like({}, {}), DimVector({}));

  Tensor row = arange(3, kFloat32);
  Tensor grid = row.expand({2, 3});
  grid.fill_(1.5);
  EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{1.5f, 1.5f, 1.5f}));
  grid.zero_();
  EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{0, 0, 0}));
}

// torch.equal of different dtypes compares after promotion (torch 1.13 on the CPU).
TEST(Tensor, EqualAcrossDtypesComparesPromotedValues) {
  EXPECT_TRUE(arange(3).equal(arange(3, kFloat32)));
  EXPECT_FALSE(arange(3).equal(full({3}, 1.0f)));
  EXPECT_TRUE(arange(3, kUInt8).equal(arange(3, kInt16)));
  EXPECT_TRUE(full({1}, true, kBool).equal(full({1}, 1, kInt32)));
  EXPECT_TRUE(full({1}, int64_t{(1 << 24) + 1}, kInt64).equal(full({1}, 16777216.0f)));  // in float32, as torch
  EXPECT_FALSE(full({1}, -1, kInt8).equal(full({1}, std::numeric_limits<uint64_t>::max(), kUInt64)));
  EXPECT_TRUE(full({1}, 7, kInt8).equal(full({1}, uint64_t{7}, kUInt64)));
  EXPECT_TRUE(full({1}, 2.5, kFloat64).equal(full({1}, 2.5, kComplex64)));
  EXPECT_TRUE(full({1}, int64_t{(1 << 24) + 1}, kInt64).equal(full({1}, 16777216.0, kComplex64)));  // in complex64
  EXPECT_FALSE(arange(3).equal(arange(4, kFloat32)));
}

TEST(Tensor, ArangeAndDeviceNamesAsPyTorch) {
  EXPECT_THROW_WITH(arange(0, 10, -1), ValueError, "upper bound and larger bound inconsistent with step sign");
  EXPECT_THROW_WITH(arange(3, kBool), ValueError, "not implemented for 'Bool'");
  EXPECT_EQ(arange(5, 5).numel(), 0);
  EXPECT_EQ(arange(10, 0, -3).to_vector<int64_t>(), (std::vector<int64_t>{10, 7, 4, 1}));
  const int64_t lowest = std::numeric_limits<int64_t>::min(), highest = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(arange(lowest, highest, highest).to_vector<int64_t>(), (std::vector<int64_t>{lowest, -1, highest - 1}));
  EXPECT_EQ(arange(298, 300, 1, kUInt8).to_vector<uint8_t>(), (std::vector<uint8_t>{42, 43}));  // wraps, as torch
  EXPECT_EQ(Device::parse("cpu:0"), kCPU);
  EXPECT_EQ(Device::parse("cuda:10").index, 10);
  EXPECT_THROW(Device::parse("cuda:01"), ValueError);
  EXPECT_THROW(Device::parse("cuda:"), ValueError);
  EXPECT_THROW(Device::parse("cuda:+1"), ValueError);
  EXPECT_THROW(Device::parse("cuda:-0"), ValueError);
  EXPECT_THROW(Device::parse("cpu:-0"), ValueError);
  EXPECT_THROW_WITH(arange(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()), ValueError,
                    "invalid size, possible overflow?");
  EXPECT_THROW(Device::parse("cpu:"), ValueError);
}

TEST(Tensor, FillAndFactories) {
  EXPECT_EQ(full({2}, 2.5).to_string(), "tensor([2.5000, 2.5000])");
  EXPECT_EQ(zeros({2}, kInt32).to_string(), "tensor([0, 0], dtype=torch.int32)");
  EXPECT_EQ(arange(2, 11, 4).to_vector<int64_t>(), (std::vector<int64_t>{2, 6, 10}));
  EXPECT_EQ(arange(5, 0, -2).to_vector<int64_t>(), (std::vector<int64_t>{5, 3, 1}));
  EXPECT_EQ(arange(0).numel(), 0);
  Tensor t = arange(6).view({2, 3}).t();
  t.fill_(7);
  EXPECT_EQ(t.contiguous().to_vector<int64_t>(), std::vector<int64_t>(6, 7));
  EXPECT_THROW(tensor<int>({1, 2, 3}, {2, 2}), ValueError);
  EXPECT_EQ(tensor<float>({3.0f}, {}).dim(), 1);
  // Integers stay exact: through a double, 2^60 + 1 became 2^60 (an id, a hash).
  const int64_t big = (int64_t{1} << 60) + 1;
  EXPECT_EQ(full({}, big, kInt64).item<int64_t>(), big);
  EXPECT_EQ(full({2}, UINT64_MAX, kUInt64).to_vector<uint64_t>(), (std::vector<uint64_t>(2, UINT64_MAX)));
  EXPECT_EQ(zeros({1}, kInt64).fill_(-big).item<int64_t>(), -big);
  EXPECT_EQ(full({1}, 3, kFloat32).item<float>(), 3.0f);  // converted, as before
  EXPECT_EQ(full({1}, true, kInt32).item<int32_t>(), 1);
  const Tensor id = scalar_tensor(big);
  EXPECT_EQ(id.dim(), 0);
  EXPECT_EQ(id.dtype(), kInt64);
  EXPECT_EQ(id.item<int64_t>(), big);
  EXPECT_EQ(scalar_tensor<uint8_t>(7).to_string(), "tensor(7, dtype=torch.uint8)");
}

TEST(TensorGeometry, NonOverlapIsProvenForViewsOfDenseTensorsOnly) {
  using detail::is_provably_non_overlapping;
  EXPECT_TRUE(is_provably_non_overlapping({3, 2}, {2, 1}));    // contiguous
  EXPECT_TRUE(is_provably_non_overlapping({3, 2}, {1, 3}));    // transposed
  EXPECT_TRUE(is_provably_non_overlapping({3, 2}, {-6, 2}));   // rows reversed, every other column
  EXPECT_TRUE(is_provably_non_overlapping({1, 5}, {0, 1}));    // a size-1 dimension's stride is moot
  EXPECT_TRUE(is_provably_non_overlapping({0, 3}, {0, 0}));    // no elements
  EXPECT_FALSE(is_provably_non_overlapping({3}, {0}));         // expanded
  EXPECT_FALSE(is_provably_non_overlapping({3, 2}, {1, 1}));   // rows overlap
  EXPECT_FALSE(is_provably_non_overlapping({3, 2}, {2, 3}));   // distinct offsets, interleaved: not proven
}

TEST(TensorGeometry, DisjointnessOfTwoTensorsIsProvenByExtentsOrByRows) {
  using detail::is_provably_disjoint;
  const Tensor a = zeros({4, 6}, kInt32), b = zeros({4, 6}, kInt32);
  EXPECT_TRUE(is_provably_disjoint(a, b));                                      // separate buffers
  EXPECT_FALSE(is_provably_disjoint(a, a));                                     // the same tensor
  EXPECT_FALSE(is_provably_disjoint(a[1], a.narrow(1, 2, 1)));                  // one shared element
  EXPECT_TRUE(is_provably_disjoint(a.narrow(0, 0, 2), a.narrow(0, 2, 2)));      // halves
  EXPECT_FALSE(is_provably_disjoint(a.narrow(0, 0, 3), a.narrow(0, 2, 2)));     // a shared row
  EXPECT_TRUE(is_provably_disjoint(a.narrow(1, 0, 2), a.narrow(1, 2, 4)));      // columns: rows take turns
  EXPECT_TRUE(is_provably_disjoint(a.narrow(1, 4, 2), a.narrow(1, 0, 4)));      // the same, either order
  EXPECT_TRUE(is_provably_disjoint(a.select(1, 5), a.narrow(1, 0, 5)));         // a 1-d column
  EXPECT_FALSE(is_provably_disjoint(a.narrow(1, 0, 3), a.narrow(1, 2, 3)));     // columns that overlap
  EXPECT_TRUE(is_provably_disjoint(a.slice(0, 0, 4, 2), a.slice(0, 1, 4, 2)));  // even and odd rows
  EXPECT_TRUE(is_provably_disjoint(a.slice(0, 0, 4, 2).narrow(1, 0, 3),         // rows 2 apart and 1 apart
                                   a.narrow(0, 1, 1).narrow(1, 0, 3)));
  // Reversed rows (a negative stride) take turns too.
  EXPECT_TRUE(is_provably_disjoint(a.as_strided({4, 2}, {-6, 1}, 18), a.narrow(1, 2, 4)));
  // Interleaved within a row (columns 0, 2, 4 against 1, 3, 5): disjoint, but not proven.
  EXPECT_FALSE(is_provably_disjoint(a.slice(1, 0, 6, 2), a.slice(1, 1, 6, 2)));
  // Fields of an array of 16-byte records: an int32 pair at byte 0, an int64 at byte 8.
  const UntypedStorage records = UntypedStorage::allocate(4 * 16);
  const Tensor pairs(records, kInt32, {4, 2}, {4, 1}, 0), labels(records, kInt64, {4}, {2}, 1);
  EXPECT_TRUE(is_provably_disjoint(pairs, labels));
  EXPECT_FALSE(is_provably_disjoint(Tensor(records, kInt32, {4, 3}, {4, 1}, 0), labels));  // a pair and a half
  // Two storages over one buffer alias: addresses are compared, not storages.
  const UntypedStorage alias = UntypedStorage::from_blob(a.mutable_data_ptr(), a.nbytes(), [](void*) {});
  EXPECT_FALSE(is_provably_disjoint(Tensor(alias, kInt32, {6}, 6), a[1]));
  EXPECT_TRUE(is_provably_disjoint(Tensor(alias, kInt32, {6}, 6), a[2]));
  // Nothing to share: empty tensors; 0-d tensors compare by their one element.
  EXPECT_TRUE(is_provably_disjoint(a.narrow(0, 0, 0), a));
  EXPECT_FALSE(is_provably_disjoint(a[0][0], a[0].narrow(0, 0, 1)));
  EXPECT_TRUE(is_provably_disjoint(a[0][0], a[0][1]));
  EXPECT_TRUE(is_provably_disjoint(a[0][0], a.narrow(1, 1, 1)));  // one element beside a column
  EXPECT_FALSE(is_provably_disjoint(a[2][1], a.narrow(1, 1, 1)));
}

TEST(Tensor, DtypesAndDevicesPrintByName) {
  std::ostringstream out;
  out << arange(3).dtype() << " " << kBFloat16 << " " << arange(3).device() << " " << Device::parse("cuda:1");
  EXPECT_EQ(out.str(), "int64 bfloat16 cpu cuda:1");
}

TEST(Tensor, EqualComparesValues) {
  EXPECT_TRUE(arange(6).view({2, 3}).equal(tensor2d<int64_t>({{0, 1, 2}, {3, 4, 5}})));
  EXPECT_FALSE(arange(6).view({2, 3}).equal(arange(6).view({3, 2})));
  EXPECT_FALSE(full({1}, NAN).equal(full({1}, NAN)));
  EXPECT_TRUE(arange(3).equal(arange(3, kInt32)));  // compared after promotion, as torch 1.13 does
}

TEST(TensorPrint, LikePyTorch) {
  EXPECT_EQ(tensor2d<float>({{1, 2}, {3, 4}}).to_string(), "tensor([[1., 2.],\n        [3., 4.]])");
  EXPECT_EQ(tensor<float>({1.5f, 2.25f}).to_string(), "tensor([1.5000, 2.2500])");
  EXPECT_EQ(arange(3, kUInt8).to_string(), "tensor([0, 1, 2], dtype=torch.uint8)");
  EXPECT_EQ(full({}, 3.0).to_string(), "tensor(3.)");
  EXPECT_EQ(tensor<bool>({true, false}).to_string(), "tensor([ True, False])");
  EXPECT_EQ(empty({0}).to_string(), "tensor([])");
  EXPECT_EQ(empty({0, 3}).to_string(), "tensor([], size=(0, 3))");
  EXPECT_EQ(empty({0}, kInt64).to_string(), "tensor([], dtype=torch.int64)");
  EXPECT_EQ(tensor<float>({1e-5f, 1.0f}).to_string(), "tensor([1.0000e-05, 1.0000e+00])");
  EXPECT_EQ(tensor<double>({-1.0, 0.5}).to_string(), "tensor([-1.0000,  0.5000], dtype=torch.float64)");
  EXPECT_EQ(arange(2000).to_string(), "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])");
  // At the 80-column edge PyTorch counts a one-line tensor's line as two longer than it is
  // (torch/_tensor_str.py _add_suffixes: len(s) - s.rfind("\n") + 1), so the dtype moves to a
  // line of its own one column early; so does ours.
  Tensor digits = empty({1, 17}, kUInt8);
  for (int64_t i = 0; i < 17; ++i) digits.mutable_data_ptr<uint8_t>()[i] = static_cast<uint8_t>(i % 10);
  EXPECT_EQ(digits.to_string(),
            "tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5, 6]],\n       dtype=torch.uint8)");
  EXPECT_EQ(digits.narrow(1, 0, 16).to_string(),
            "tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5]], dtype=torch.uint8)");
  std::string big = arange(30 * 40).view({30, 40}).to_string();
  EXPECT_NE(big.find("[   0,    1,    2,  ...,   37,   38,   39]"), std::string::npos) << big;
  EXPECT_NE(big.find("        ...,\n"), std::string::npos) << big;
  // Long rows wrap at 80 columns with the continuation indented under the bracket.
  std::string row = arange(30).to_string();
  EXPECT_EQ(row, "tensor([ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15, 16, 17,\n"
                 "        18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29])");
  std::ostringstream out;
  out << arange(2);
  EXPECT_EQ(out.str(), "tensor([0, 1])");
}

// A bool byte read from a file may be neither 0 nor 1 (a damaged or foreign file): it reads,
// and prints, as true, as numpy and PyTorch take any nonzero byte. Loading it as a C++ bool
// was undefined behaviour (UBSan flagged `mmt get` on such a file).
TEST(TensorPrint, BoolBytesOtherThanZeroAndOneReadAsTrue) {
  Tensor flags = empty({3}, kBool);
  const uint8_t bytes[3] = {0, 2, 1};
  std::memcpy(flags.mutable_data_ptr(), bytes, 3);
  EXPECT_FALSE(flags.select(0, 0).item<bool>());
  EXPECT_TRUE(flags.select(0, 1).item<bool>());
  EXPECT_EQ(flags.select(0, 1).item_as_double(), 1.0);
  EXPECT_EQ(flags.to_string(), "tensor([False,  True,  True])");
}

// 64-bit integers print, and come back from item<T>(), exactly: they used to go through a
// double, which printed 2^53 + 1 as 2^53, 2^63 - 1 as 2^63, and 2^64 - 1 as 0.
TEST(TensorPrint, SixtyFourBitIntegersExactly) {
  const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  const Tensor ints = tensor<int64_t>({(int64_t{1} << 53) + 1, lo, hi});
  EXPECT_EQ(ints.to_string(), "tensor([    9007199254740993, -9223372036854775808,  9223372036854775807])");
  EXPECT_EQ(ints.select(0, 0).item<int64_t>(), (int64_t{1} << 53) + 1);
  EXPECT_EQ(ints.select(0, 2).item<int64_t>(), hi);
  const uint64_t top = std::numeric_limits<uint64_t>::max();
  const Tensor unsigned_ints = tensor<uint64_t>({(uint64_t{1} << 63) + 1, top});
  EXPECT_EQ(unsigned_ints.to_string(), "tensor([ 9223372036854775809, 18446744073709551615], dtype=torch.uint64)");
  EXPECT_EQ(unsigned_ints.select(0, 1).item<uint64_t>(), top);
  EXPECT_EQ(full({}, 2.75).item<int32_t>(), 2);  // a float converts as static_cast does
  EXPECT_TRUE(full({}, 0.5).item<bool>());
}

using Complex = std::complex<float>;

// Complex tensors print as PyTorch 1.13 prints them (each string below is torch's own output):
// real and imaginary parts formatted apart, each with the width and mode its own values need.
TEST(TensorPrint, ComplexLikePyTorch) {
  EXPECT_EQ(tensor<Complex>({{1, 2}, {3, -4}}).to_string(), "tensor([1.+2.j, 3.-4.j])");
  EXPECT_EQ(tensor<std::complex<double>>({{1.5, 2}, {-3.25, -4}}).to_string(),
            "tensor([ 1.5000+2.j, -3.2500-4.j], dtype=torch.complex128)");
  EXPECT_EQ(scalar_tensor(Complex(1, 2)).to_string(), "tensor(1.+2.j)");
  EXPECT_EQ(tensor<Complex>({{1e10f, 1}, {0, 2}, {0, 0}, {-1, -1}}, {2, 2}).to_string(),
            "tensor([[ 1.0000e+10+1.j,  0.0000e+00+2.j],\n"
            "        [ 0.0000e+00+0.j, -1.0000e+00-1.j]])");
  EXPECT_EQ(zeros({2}, kComplex128).to_string(), "tensor([0.+0.j, 0.+0.j], dtype=torch.complex128)");
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(tensor<Complex>({{std::nanf(""), 1}, {inf, -inf}}).to_string(), "tensor([nan+1.j, inf-infj])");
  EXPECT_EQ(empty({0}, kComplex64).to_string(), "tensor([], dtype=torch.complex64)");
  Tensor grid = empty({3, 4}, kComplex64);
  for (int64_t i = 0; i < 12; ++i) grid.view({12}).set<Complex>({i}, Complex(1.5f * i, 0.25f));
  EXPECT_EQ(grid.to_string(),
            "tensor([[ 0.0000+0.2500j,  1.5000+0.2500j,  3.0000+0.2500j,  4.5000+0.2500j],\n"
            "        [ 6.0000+0.2500j,  7.5000+0.2500j,  9.0000+0.2500j, 10.5000+0.2500j],\n"
            "        [12.0000+0.2500j, 13.5000+0.2500j, 15.0000+0.2500j, 16.5000+0.2500j]])");
  EXPECT_EQ(tensor<Complex>({{6, -3}, {7, -3.5f}}).to_string(), "tensor([6.-3.0000j, 7.-3.5000j])");
  EXPECT_EQ(tensor<Complex>({{1e-5f, 1}, {1, 0}}).to_string(), "tensor([1.0000e-05+1.j, 1.0000e+00+0.j])");
  EXPECT_EQ(tensor<Complex>({{0.1f, 100000}, {1, 0}}).to_string(), "tensor([0.1000+100000.j, 1.0000+0.j])");
  EXPECT_EQ(tensor<Complex>({{std::nanf(""), std::nanf("")}}).to_string(), "tensor([nan+nanj])");
  // Ten to a line: each element counts both widths, the "j" and the separator.
  const std::string ten = "1.+1.j, 1.+1.j, 1.+1.j, 1.+1.j, 1.+1.j, 1.+1.j, 1.+1.j, 1.+1.j, 1.+1.j, 1.+1.j";
  const Tensor ones = full({2, 30}, 1.0, kComplex64);
  ones.imag().fill_(1.0);
  const std::string row = "[" + ten + ",\n         " + ten + ",\n         " + ten + "]";
  EXPECT_EQ(ones.to_string(), "tensor([" + row + ",\n        " + row + "])");
  Tensor many = empty({2000}, kComplex64);
  for (int64_t i = 0; i < 2000; ++i) many.set<Complex>({i}, Complex(i, i));
  EXPECT_EQ(many.to_string(),
            "tensor([0.0000e+00+0.0000e+00j, 1.0000e+00+1.0000e+00j, 2.0000e+00+2.0000e+00j,\n"
            "         ..., 1.9970e+03+1.9970e+03j, 1.9980e+03+1.9980e+03j,\n"
            "        1.9990e+03+1.9990e+03j])");
}

// Conversions to and from complex follow PyTorch's casts; real() and imag() are views.
TEST(Tensor, ComplexConversionsAndParts) {
  const Tensor z = tensor<Complex>({{1, 2}, {3, -4}, {0, 5}});
  Tensor as_double = empty({3}, kComplex128);
  as_double.copy_(z);
  EXPECT_EQ(as_double.to_vector<std::complex<double>>(),
            (std::vector<std::complex<double>>{{1, 2}, {3, -4}, {0, 5}}));
  Tensor reals = empty({3}, kFloat32);
  reals.copy_(z);  // the imaginary part is dropped, as PyTorch's copy_ drops it
  EXPECT_EQ(reals.to_vector<float>(), (std::vector<float>{1, 3, 0}));
  Tensor flags = empty({3}, kBool);
  flags.copy_(z);  // nonzero in either part, as numpy and Python's bool(5j) read it
  EXPECT_EQ(flags.to_double_vector(), (std::vector<double>{1, 1, 1}));
  Tensor from_ints = empty({3}, kComplex64);
  from_ints.copy_(arange(3));
  EXPECT_EQ(from_ints.to_vector<Complex>(), (std::vector<Complex>{{0, 0}, {1, 0}, {2, 0}}));
  EXPECT_EQ(full({2}, 2.5, kComplex64).to_vector<Complex>(), (std::vector<Complex>{{2.5, 0}, {2.5, 0}}));
  EXPECT_TRUE(z.equal(z.clone()));
  EXPECT_FALSE(z.equal(from_ints));

  EXPECT_EQ(z.select(0, 1).item<std::complex<double>>(), std::complex<double>(3, -4));
  EXPECT_EQ(scalar_tensor(Complex(2.5f, 0)).item<double>(), 2.5);
  EXPECT_TRUE(scalar_tensor(Complex(0, 5)).item<bool>());
  EXPECT_NE(error_of([&] { z.select(0, 1).item<double>(); })
                .find("value (3-4j) cannot be converted to type double without losing its imaginary part"),
            std::string::npos);
  EXPECT_THROW(z.to_double_vector(), ValueError);
  EXPECT_THROW(scalar_tensor(Complex(1, std::nanf(""))).item<double>(), ValueError);  // as PyTorch: NaN is not 0

  // The parts are views of the same storage, strides counted in the parts' dtype.
  const Tensor column = tensor<Complex>({{1, 2}, {3, 4}, {5, 6}, {7, 8}}, {2, 2}).select(1, 1);
  EXPECT_EQ(column.real().dtype(), kFloat32);
  EXPECT_EQ(column.real().strides(), IntArrayRef({4}));
  EXPECT_EQ(column.real().storage_offset(), 2);
  EXPECT_EQ(column.imag().storage_offset(), 3);
  EXPECT_EQ(column.real().to_vector<float>(), (std::vector<float>{3, 7}));
  EXPECT_EQ(column.imag().to_vector<float>(), (std::vector<float>{4, 8}));
  EXPECT_TRUE(column.imag().is_same_storage(column));
  column.imag().fill_(-1.0);
  EXPECT_EQ(column.to_vector<Complex>(), (std::vector<Complex>{{3, -1}, {7, -1}}));
  const Tensor pairs = column.view_as_real();
  EXPECT_EQ(pairs.sizes(), IntArrayRef({2, 2}));
  EXPECT_EQ(pairs.strides(), IntArrayRef({4, 1}));
  EXPECT_EQ(pairs.to_vector<float>(), (std::vector<float>{3, -1, 7, -1}));
  const Tensor ints = arange(3);
  EXPECT_TRUE(ints.real().is_same_storage(ints));  // real() of a real tensor is itself
  EXPECT_EQ(ints.real().dtype(), kInt64);
  EXPECT_NE(error_of([] { arange(3).imag(); }).find("imag() is not implemented for tensors with non-complex dtypes"),
            std::string::npos);
  EXPECT_THROW(arange(3).view_as_real(), ValueError);
}

// Every element of `t` in row-major order, read by walking its strides by hand: a reference
// that does not go through the strided-copy routine under test.
std::vector<double> reference_values(const Tensor& t) {
  std::vector<double> out;
  std::vector<int64_t> index(t.dim(), 0);
  const char* base = static_cast<const char*>(t.data_ptr());
  for (int64_t k = 0; k < t.numel(); ++k) {
    int64_t offset = 0;
    for (int64_t d = 0; d < t.dim(); ++d) offset += index[d] * t.stride(d);
    dispatch_scalar_type(t.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T v;
      std::memcpy(&v, base + offset * sizeof(T), sizeof(T));
      if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>)
        out.push_back(static_cast<float>(v));
      else if constexpr (is_complex_type_v<T>)
        out.push_back(v.real()), out.push_back(v.imag());
      else
        out.push_back(static_cast<double>(v));
    });
    for (int64_t d = t.dim() - 1; d >= 0; --d) {
      if (++index[d] < t.size(d)) break;
      index[d] = 0;
    }
  }
  return out;
}

// The one strided-copy routine against a per-element reference on random layouts.
TEST(StridedCopy, MatchesReferenceOnRandomLayouts) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    const int ndim = 1 + static_cast<int>(rng() % 5);
    std::vector<int64_t> sizes;
    for (int d = 0; d < ndim; ++d) sizes.push_back(1 + static_cast<int64_t>(rng() % 5));
    const ScalarType dtype = std::array{kUInt8, kInt16, kFloat32, kFloat64}[rng() % 4];
    Tensor src = empty(sizes, dtype);
    int64_t n = src.numel();
    {
      Tensor filler = arange(n, kInt64).view(sizes);
      src.copy_(filler);
    }
    // A random permutation and random slicing make an arbitrary strided source.
    std::vector<int64_t> perm(ndim);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    Tensor view = src.permute(perm);
    if (rng() % 2) view = view.slice(0, 0, kSliceEnd, 1 + static_cast<int64_t>(rng() % 2));
    Tensor dst = empty(view.sizes(), dtype, kCPU);
    if (view.dim() == 4 && rng() % 2) dst = empty(view.sizes(), dtype, kCPU, MemoryFormat::ChannelsLast);
    dst.copy_(view);
    EXPECT_EQ(reference_values(dst), reference_values(view)) << "trial " << trial;
  }
}

// Channels-first to channels-last for 1 to 5 channels and every element size: the few-plane
// interleave (2 to 4 channels) and the general transpose must agree with the reference.
TEST(StridedCopy, NchwToChannelsLastForEveryChannelCount) {
  for (ScalarType dtype : {kUInt8, kInt16, kFloat32, kFloat64}) {
    for (int64_t channels = 1; channels <= 5; ++channels) {
      Tensor src = empty({2, channels, 7, 9}, dtype);
      src.copy_(arange(2 * channels * 7 * 9, kInt64).view({2, channels, 7, 9}));
      Tensor dst = empty(src.sizes(), dtype, kCPU, MemoryFormat::ChannelsLast);
      dst.copy_(src);
      EXPECT_EQ(reference_values(dst), reference_values(src)) << to_string(dtype) << ", " << channels << " channels";
      // And back, and from a view that starts inside a plane.
      Tensor back = empty(src.sizes(), dtype);
      back.copy_(dst);
      EXPECT_EQ(reference_values(back), reference_values(src));
      Tensor window = src.narrow(3, 1, 7);
      Tensor window_last = empty(window.sizes(), dtype, kCPU, MemoryFormat::ChannelsLast);
      window_last.copy_(window);
      EXPECT_EQ(reference_values(window_last), reference_values(window));
    }
  }
}

}  // namespace
}  // namespace mmt
