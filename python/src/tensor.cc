// mmtensor.Tensor: an mmt::Tensor seen from Python, and how it reaches NumPy and PyTorch
// without a copy: NumPy's array protocol (numpy(), np.asarray), DLPack (torch.from_dlpack,
// np.from_dlpack) and, for CUDA tensors, __cuda_array_interface__ (CuPy, Numba).
#include <dlpack/dlpack.h>

#include <cstring>

#include "bindings.h"

namespace mmt::python {

namespace {

// DLPack 0.8 added a code for bool; the 0.6 header Debian 12 ships predates it. PyTorch 2
// and NumPy 1.25 read it.
constexpr uint8_t kDLBoolCode = 6;

DLDataType dlpack_dtype(ScalarType type) {
  const auto bits = static_cast<uint8_t>(element_size(type) * 8);
  switch (type) {
    case ScalarType::Bool: return {kDLBoolCode, 8, 1};
    case ScalarType::Float16: case ScalarType::Float32: case ScalarType::Float64: return {kDLFloat, bits, 1};
    case ScalarType::BFloat16: return {kDLBfloat, 16, 1};
    case ScalarType::UInt8: case ScalarType::UInt16: case ScalarType::UInt32: case ScalarType::UInt64:
      return {kDLUInt, bits, 1};
    default: return {kDLInt, bits, 1};
  }
}

// What a DLPack capsule owns: a copy of the Python tensor (its storage and batch) and the
// shape and strides the DLTensor points at.
struct DLPackContext {
  DLManagedTensor managed{};
  PyTensor owner;
  std::vector<int64_t> shape, strides;
};

void delete_dlpack_context(DLManagedTensor* managed) {
  delete static_cast<DLPackContext*>(managed->manager_ctx);  // needs no GIL: C++ handles only
}

// The capsule's own destructor: frees the tensor unless a consumer took it (and renamed the
// capsule "used_dltensor", as the protocol says).
void capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed && managed->deleter) managed->deleter(managed);
}

py::capsule to_dlpack(const PyTensor& self, const py::object& stream) {
  const Tensor& t = self.tensor;
  if (t.device().is_cuda() && !stream.is_none()) {
    // The consumer's stream must wait for the batch's copy to the device. An int: 1 is the
    // legacy default stream, 2 the per-thread one, anything else a cudaStream_t; -1 asks
    // for no ordering. A loader batch orders its copy before that stream (and the slot's
    // reuse after it); other device tensors (clone(), to()) are complete already.
    const auto handle = stream.cast<int64_t>();
    if (handle == 0) throw py::value_error("__dlpack__: stream 0 is ambiguous for CUDA; pass 1 for the legacy default stream");
    if (handle != -1 && self.batch) self.batch->wait(reinterpret_cast<CUstream_st*>(static_cast<intptr_t>(handle)));
  }
  auto context = std::make_unique<DLPackContext>();
  context->owner = self;
  context->shape.assign(t.sizes().begin(), t.sizes().end());
  context->strides.assign(t.strides().begin(), t.strides().end());
  DLTensor& dl = context->managed.dl_tensor;
  dl.data = const_cast<void*>(t.data_ptr());
  dl.device = t.device().is_cuda() ? DLDevice{kDLCUDA, t.device().index} : DLDevice{kDLCPU, 0};
  dl.ndim = static_cast<int32_t>(t.dim());
  dl.dtype = dlpack_dtype(t.dtype());
  dl.shape = context->shape.data();
  dl.strides = context->strides.data();
  dl.byte_offset = 0;
  context->managed.manager_ctx = context.get();
  context->managed.deleter = delete_dlpack_context;
  DLManagedTensor* managed = &context->managed;
  py::capsule capsule(managed, "dltensor", capsule_destructor);
  context.release();  // the capsule (or its consumer) owns it now
  return capsule;
}

py::array to_numpy(const py::object& self_object) {
  const PyTensor& self = self_object.cast<const PyTensor&>();
  const Tensor& t = self.tensor;
  if (t.device().is_cuda())
    throw py::type_error("Tensor.numpy(): the tensor is on " + t.device().str() +
                         "; use cpu() first, or torch.from_dlpack() / CuPy for a device view");
  std::vector<py::ssize_t> shape(t.sizes().begin(), t.sizes().end());
  std::vector<py::ssize_t> strides;
  for (int64_t s : t.strides()) strides.push_back(static_cast<py::ssize_t>(s * t.element_size()));
  // The base is the Python tensor, so the array keeps the storage (and a batch) alive.
  py::array array(numpy_dtype(t.dtype()), std::move(shape), std::move(strides), t.data_ptr(), self_object);
  if (t.untyped_storage().is_read_only()) array.attr("setflags")(py::arg("write") = false);
  return array;
}

const char* typestr(ScalarType type) {
  switch (type) {
    case ScalarType::Bool: return "|b1";
    case ScalarType::UInt8: return "|u1";
    case ScalarType::Int8: return "|i1";
    case ScalarType::Int16: return "<i2";
    case ScalarType::UInt16: return "<u2";
    case ScalarType::Int32: return "<i4";
    case ScalarType::UInt32: return "<u4";
    case ScalarType::Int64: return "<i8";
    case ScalarType::UInt64: return "<u8";
    case ScalarType::Float16: return "<f2";
    case ScalarType::Float32: return "<f4";
    case ScalarType::Float64: return "<f8";
    case ScalarType::BFloat16: break;
  }
  throw py::type_error("bfloat16 has no NumPy type; use torch.from_dlpack(t), or t.float()");
}

py::tuple int_tuple(IntArrayRef values) {
  py::tuple out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = py::int_(values[i]);
  return out;
}

}  // namespace

py::object wrap(Tensor tensor, std::shared_ptr<Batch> batch) {
  return py::cast(PyTensor{std::move(tensor), std::move(batch)});
}

py::dtype numpy_dtype(ScalarType type) { return py::dtype(std::string(typestr(type))); }

ScalarType scalar_type_of(const py::dtype& dtype) {
  const char kind = dtype.kind();
  const auto size = dtype.itemsize();
  if (dtype.byteorder() == '>') throw py::type_error("big-endian arrays are not taken; use array.astype(array.dtype.newbyteorder('<'))");
  if (kind == 'b' && size == 1) return kBool;
  if (kind == 'u') {
    if (size == 1) return kUInt8;
    if (size == 2) return kUInt16;
    if (size == 4) return kUInt32;
    if (size == 8) return kUInt64;
  }
  if (kind == 'i') {
    if (size == 1) return kInt8;
    if (size == 2) return kInt16;
    if (size == 4) return kInt32;
    if (size == 8) return kInt64;
  }
  if (kind == 'f') {
    if (size == 2) return kFloat16;
    if (size == 4) return kFloat32;
    if (size == 8) return kFloat64;
  }
  throw py::type_error("mmtensor has no type for NumPy's " + py::str(static_cast<const py::object&>(dtype)).cast<std::string>() +
                       " (it takes bool, integers of 8 to 64 bits, float16, float32, float64)");
}

ScalarType parse_dtype(const py::handle& dtype) {
  if (py::isinstance<py::str>(dtype)) {
    const auto name = dtype.cast<std::string>();
    if (auto type = scalar_type_from_string(name)) return *type;
    throw py::value_error("unknown dtype '" + name + "' (mmtensor has bool, uint8, int8, int16, uint16, int32, "
                          "uint32, int64, uint64, float16, bfloat16, float32, float64)");
  }
  return scalar_type_of(py::dtype::from_args(py::reinterpret_borrow<py::object>(dtype)));
}

Tensor tensor_of_array(const py::array& array, bool writable) {
  if (writable && !array.writeable()) throw py::value_error("the output array is read-only");
  const ScalarType type = scalar_type_of(array.dtype());
  DimVector sizes, strides;
  for (py::ssize_t i = 0; i < array.ndim(); ++i) {
    sizes.push_back(array.shape(i));
    if (array.strides(i) % array.itemsize() != 0)
      throw py::value_error("an array whose strides are not whole elements is not taken; pass np.ascontiguousarray(a)");
    strides.push_back(array.strides(i) / array.itemsize());
  }
  // The storage spans the elements the strides reach; it starts at the lowest one.
  int64_t low = 0, high = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) { low = high = 0; break; }
    (strides[i] < 0 ? low : high) += strides[i] * (sizes[i] - 1);
  }
  const auto element = static_cast<int64_t>(array.itemsize());
  auto* first = static_cast<std::byte*>(const_cast<void*>(array.data())) + low * element;
  const int64_t nbytes = (high - low + 1) * element;
  // The deleter drops the array's reference; it may run on a thread without the GIL.
  auto* reference = new py::object(array);
  UntypedStorage storage = UntypedStorage::from_blob(
      first, nbytes,
      [reference](void*) {
        py::gil_scoped_acquire gil;
        delete reference;
      },
      kCPU, /*read_only=*/!array.writeable());
  return Tensor(std::move(storage), type, sizes, strides, -low);
}

Tensor tensor_of_value(const py::handle& value, ScalarType dtype, const std::string& what) {
  if (py::isinstance<PyTensor>(value)) return value.cast<const PyTensor&>().tensor;
  if (py::isinstance<py::array>(value)) {
    auto array = py::reinterpret_borrow<py::array>(value);
    if (scalar_type_of(array.dtype()) != dtype)
      throw py::value_error(what + ": expected dtype " + std::string(to_string(dtype)) + ", got " +
                            py::str(static_cast<const py::object&>(array.dtype())).cast<std::string>() +
                            " (cast it with astype() if that is meant)");
    return tensor_of_array(array, false);
  }
  if (dtype == kBFloat16) throw py::type_error(what + ": a bfloat16 value must be an mmtensor Tensor");
  py::module_ np = py::module_::import("numpy");
  // Raw bytes (an encoded image read from a file) for a bytes field, as they are.
  if (dtype == kUInt8 && (py::isinstance<py::bytes>(value) || py::isinstance<py::bytearray>(value) ||
                          py::isinstance<py::memoryview>(value)))
    return tensor_of_array(np.attr("frombuffer")(value, np.attr("uint8")), false);
  return tensor_of_array(np.attr("asarray")(value, numpy_dtype(dtype)), false);
}

std::vector<int64_t> indices_of(const py::handle& indices) {
  py::module_ np = py::module_::import("numpy");
  py::array array = np.attr("asarray")(indices);
  if (array.ndim() != 1) throw py::value_error("indices must be one-dimensional");
  if (array.size() > 0 && array.dtype().kind() != 'i' && array.dtype().kind() != 'u')
    throw py::type_error("indices must be integers, got " +
                         py::str(static_cast<const py::object&>(array.dtype())).cast<std::string>());
  auto as_int64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(array);
  return std::vector<int64_t>(as_int64.data(), as_int64.data() + as_int64.size());
}

void bind_tensor(py::module_& m) {
  py::class_<PyTensor>(m, "Tensor", R"doc(
A strided view of typed memory: a dataset's mapping, a decoded chunk, a loader batch.

It reaches NumPy and PyTorch without a copy: t.numpy() or np.asarray(t) (read-only when it
views a dataset file), torch.from_dlpack(t) (also for CUDA tensors and bfloat16), and for
CUDA tensors __cuda_array_interface__. Every such view keeps the memory alive. A view into
a file mapped read-only must not be written through DLPack: clone() it first.)doc")
      .def_property_readonly("shape", [](const PyTensor& s) { return int_tuple(s.tensor.sizes()); })
      .def("size", [](const PyTensor& s) { return int_tuple(s.tensor.sizes()); })
      .def("stride", [](const PyTensor& s) { return int_tuple(s.tensor.strides()); },
           "Strides in elements, as torch.Tensor.stride()")
      .def_property_readonly("dtype", [](const PyTensor& s) { return std::string(to_string(s.tensor.dtype())); })
      .def_property_readonly("device", [](const PyTensor& s) { return s.tensor.device().str(); })
      .def_property_readonly("ndim", [](const PyTensor& s) { return s.tensor.dim(); })
      .def("dim", [](const PyTensor& s) { return s.tensor.dim(); })
      .def("numel", [](const PyTensor& s) { return s.tensor.numel(); })
      .def_property_readonly("nbytes", [](const PyTensor& s) { return s.tensor.nbytes(); })
      .def("element_size", [](const PyTensor& s) { return s.tensor.element_size(); })
      .def("storage_offset", [](const PyTensor& s) { return s.tensor.storage_offset(); })
      .def_property_readonly("filename", [](const PyTensor& s) { return s.tensor.untyped_storage().filename(); },
                             "The mapped file the tensor views, or '' (a copy, a decoded chunk, a batch)")
      .def_property_readonly("is_read_only", [](const PyTensor& s) { return s.tensor.untyped_storage().is_read_only(); })
      .def("is_contiguous", [](const PyTensor& s) { return s.tensor.is_contiguous(); })
      .def("is_pinned", [](const PyTensor& s) { return s.tensor.untyped_storage().is_pinned(); })
      .def("data_ptr", [](const PyTensor& s) { return reinterpret_cast<uintptr_t>(s.tensor.data_ptr()); })
      .def("__len__", [](const PyTensor& s) {
        if (s.tensor.dim() == 0) throw py::type_error("len() of a 0-d tensor");
        return s.tensor.sizes()[0];
      })
      .def("clone", [](const PyTensor& s) { return wrap(s.tensor.clone()); },
           "A copy in memory of its own (contiguous, or the layout kept), writable")
      .def("contiguous", [](const PyTensor& s) {
        return s.tensor.is_contiguous() ? py::cast(s) : wrap(s.tensor.contiguous(), s.batch);
      })
      .def("cpu", [](const PyTensor& s) {
        return s.tensor.device().is_cpu() ? py::cast(s) : wrap(s.tensor.cpu());
      })
      .def("float", [](const PyTensor& s) {
        Tensor out = empty(s.tensor.sizes(), kFloat32);
        out.copy_(s.tensor.cpu());
        return wrap(std::move(out));
      }, "A float32 copy on the host (how a bfloat16 value reaches NumPy)")
      .def("item", [](const PyTensor& s) -> py::object {
        if (s.tensor.numel() != 1) throw py::value_error("item(): the tensor has " + std::to_string(s.tensor.numel()) + " elements, not 1");
        if (is_floating_point(s.tensor.dtype())) return py::float_(s.tensor.item<double>());
        if (s.tensor.dtype() == kBool) return py::bool_(s.tensor.item<int64_t>() != 0);
        if (s.tensor.dtype() == kUInt64) return py::int_(s.tensor.item<uint64_t>());
        return py::int_(s.tensor.item<int64_t>());
      })
      .def("__int__", [](const PyTensor& s) { return s.tensor.item<int64_t>(); })
      .def("__float__", [](const PyTensor& s) { return s.tensor.item<double>(); })
      .def("__index__", [](const PyTensor& s) {
        if (is_floating_point(s.tensor.dtype())) throw py::type_error("a floating-point tensor is not an index");
        return s.tensor.item<int64_t>();
      })
      .def("tolist", [](const py::object& self) { return to_numpy(self).attr("tolist")(); })
      .def("numpy", &to_numpy, "A NumPy array viewing the same memory (read-only for a file mapped read-only)")
      .def("__array__", [](const py::object& self, const py::object& dtype, const py::object& copy) {
        py::object array = to_numpy(self);
        if (!dtype.is_none()) array = array.attr("astype")(dtype, py::arg("copy") = false);
        if (!copy.is_none() && copy.cast<bool>()) array = array.attr("copy")();
        return array;
      }, py::arg("dtype") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack__", &to_dlpack, py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const PyTensor& s) {
        return s.tensor.device().is_cuda() ? py::make_tuple(static_cast<int>(kDLCUDA), s.tensor.device().index)
                                           : py::make_tuple(static_cast<int>(kDLCPU), 0);
      })
      .def_property_readonly("__cuda_array_interface__", [](const PyTensor& s) {
        const Tensor& t = s.tensor;
        if (!t.device().is_cuda()) throw py::attribute_error("__cuda_array_interface__: the tensor is on the host");
        py::dict interface;
        interface["shape"] = int_tuple(t.sizes());
        interface["typestr"] = typestr(t.dtype());
        interface["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(t.data_ptr()), t.untyped_storage().is_read_only());
        py::tuple strides(t.dim());
        for (int64_t i = 0; i < t.dim(); ++i) strides[i] = py::int_(t.strides()[i] * t.element_size());
        interface["strides"] = strides;
        interface["version"] = 3;
        // The loader ordered the copy before the legacy default stream (next() does, unless
        // the loader was given a consumer stream, which then is the one to name here).
        interface["stream"] = 1;
        return interface;
      })
      .def("__repr__", [](const PyTensor& s) {
        if (s.tensor.device().is_cuda()) return "<mmtensor.Tensor shape=" + py::repr(int_tuple(s.tensor.sizes())).cast<std::string>() +
                                                " dtype=" + std::string(to_string(s.tensor.dtype())) + " device=" + s.tensor.device().str() + ">";
        return s.tensor.to_string();
      });
}

}  // namespace mmt::python
