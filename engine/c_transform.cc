// SampleTransform::from_c: a per-sample transform given as a C function (loader.h).
#include <array>
#include <vector>

#include "mmtensor/error.h"
#include "mmtensor/loader.h"

namespace mmt {

SampleTransform SampleTransform::from_c(std::string name, std::vector<std::string> inputs, ScalarType dtype,
                                        DimVector shape, mmt_transform_fn fn) {
  MMT_CHECK(fn != nullptr, ValueError, "SampleTransform::from_c: transform '", name, "' has no function (a null pointer)");
  SampleTransform transform{.name = name, .inputs = std::move(inputs), .dtype = dtype, .shape = std::move(shape)};
  transform.fn = [fn, name](const Input& in, const Tensor& out) {
    // Per sample, so no allocation for the pointer tables (a transform reads a few fields),
    // and the inputs as they are unless one is stored strided (copied then, contiguous).
    constexpr size_t kInline = 8;
    const size_t count = in.fields.size();
    std::array<const uint8_t*, kInline> inline_pointers{};
    std::array<const int64_t*, kInline> inline_shapes{};
    std::array<int32_t, kInline> inline_ndims{};
    std::vector<const uint8_t*> more_pointers;
    std::vector<const int64_t*> more_shapes;
    std::vector<int32_t> more_ndims;
    const uint8_t** pointers = inline_pointers.data();
    const int64_t** shapes = inline_shapes.data();
    int32_t* ndims = inline_ndims.data();
    if (count > kInline) {
      more_pointers.resize(count);
      more_shapes.resize(count);
      more_ndims.resize(count);
      pointers = more_pointers.data();
      shapes = more_shapes.data();
      ndims = more_ndims.data();
    }
    std::vector<Tensor> copies;  // reserved whole before the first: pointers into it stay valid
    for (size_t i = 0; i < count; ++i) {
      const Tensor* value = &in.fields[i];
      if (!value->is_contiguous()) {
        if (copies.empty()) copies.reserve(count);
        copies.push_back(value->contiguous());
        value = &copies.back();
      }
      pointers[i] = static_cast<const uint8_t*>(value->data_ptr());
      shapes[i] = value->sizes().data();
      ndims[i] = static_cast<int32_t>(value->dim());
    }
    const int32_t status = fn(pointers, shapes, ndims, static_cast<int32_t>(count),
                              static_cast<uint8_t*>(out.mutable_data_ptr()), in.seed, in.index);
    MMT_CHECK(status == 0, ValueError, "the C function of transform '", name, "' returned ", status);
  };
  return transform;
}

}  // namespace mmt
