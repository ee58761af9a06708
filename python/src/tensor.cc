// mmtensor.Tensor: an mmt::Tensor seen from Python, and how it reaches NumPy and PyTorch
// without a copy: NumPy's array protocol (numpy(), np.asarray), DLPack (torch.from_dlpack,
// np.from_dlpack) and, for CUDA tensors, __cuda_array_interface__ (CuPy, Numba).
#include <dlpack/dlpack.h>

#include <cstring>
#include <functional>
#include <optional>
#include <utility>

#include "bindings.h"
#include "cuda_memory.h"      // engine/
#include "cuda_stream.h"      // engine/
#include "tensor_geometry.h"  // engine/

namespace mmt::python {

py::object python_complex(std::complex<double> v);  // below

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
    case ScalarType::ComplexFloat: case ScalarType::ComplexDouble: return {kDLComplex, bits, 1};
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

// A tensor of a released batch views a slot the loader may be refilling: refuse to hand it on.
void check_live(const PyTensor& self) {
  if (self.batch && !self.batch->valid())
    throw py::value_error("the batch this tensor views was released; its slot may hold another batch now");
}

// The DLPack protocol's producer side (the unversioned capsule, which every consumer takes).
// A tensor over a read-only mapping (a dataset file) is handed on as a copy: DLPack before
// 1.0 has no read-only flag, so a consumer (torch.from_dlpack) would get a writable tensor,
// and writing it (an in-place x.div_(255)) would crash the process. copy=False asks for the
// view anyway and is refused for such a tensor; NumPy (numpy()) shares it read-only.
py::capsule to_dlpack(const PyTensor& self, const py::object& stream, const py::object& max_version,
                      const py::object& dl_device, const py::object& copy) {
  (void)max_version;  // a producer without versioned capsules answers with the old kind
  check_live(self);
  Tensor t = self.tensor;
  if (!dl_device.is_none()) {
    // (device_type, device_id), as __dlpack_device__ gives it.
    if (!py::isinstance<py::tuple>(dl_device) || py::len(dl_device) != 2 || !is_integer(dl_device[py::int_(0)]) ||
        !is_integer(dl_device[py::int_(1)]))
      throw py::type_error("__dlpack__: dl_device must be a (device_type, device_id) tuple of ints, as "
                           "__dlpack_device__() gives, not " + py::repr(dl_device).cast<std::string>());
    const auto wanted = dl_device.cast<py::tuple>();
    const int type = integer_argument<int>(wanted[0], "dl_device[0]"), index = integer_argument<int>(wanted[1], "dl_device[1]");
    const bool same = t.device().is_cuda() ? type == kDLCUDA && index == t.device().index : type == kDLCPU;
    if (!same) throw py::buffer_error("__dlpack__: the tensor is on " + t.device().str() + "; copy it there first");
  }
  if (t.device().is_cuda() && !stream.is_none()) {
    // The consumer's stream must wait for the batch's copy to the device. An int: 1 is the
    // legacy default stream, anything else a cudaStream_t; -1 asks for no ordering. A loader
    // batch orders its copy before that stream (and the slot's reuse after it); other device
    // tensors (clone(), to()) are complete already.
    if (!py::isinstance<py::int_>(stream)) throw py::type_error("__dlpack__: stream must be an int (a cudaStream_t), or None");
    const auto handle = stream.cast<int64_t>();
    if (handle == 0) throw py::value_error("__dlpack__: stream 0 is ambiguous for CUDA; pass 1 for the legacy default stream");
    // The per-thread default stream means "the releasing thread's", and a batch may be
    // released on another thread (a garbage-collected torch tensor): its reuse could not be
    // ordered after the consumer's work.
    if (handle == 2 && self.batch)
      throw py::buffer_error("__dlpack__: a loader batch cannot be ordered before the per-thread default stream; "
                             "use the legacy default stream or a stream of your own");
    if (handle != -1 && self.batch) self.batch->wait(reinterpret_cast<CUstream_st*>(static_cast<intptr_t>(handle)));
  }
  const bool read_only = t.untyped_storage().is_read_only();
  if (!copy.is_none() && !copy.cast<bool>() && read_only)
    throw py::buffer_error("__dlpack__: this tensor views a file mapped read-only, which DLPack cannot mark as such; "
                           "take a copy (copy=True), or share it read-only with numpy()");
  if ((!copy.is_none() && copy.cast<bool>()) || read_only) t = without_gil([&] { return t.clone(); });
  auto context = std::make_unique<DLPackContext>();
  context->owner = PyTensor{t, t.untyped_storage().is_same(self.tensor.untyped_storage()) ? self.batch : nullptr};
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
  check_live(self);
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

// NumPy's (and __cuda_array_interface__'s) type string: "<f4", "|u1"... as in .npy headers.
std::string typestr(ScalarType type) {
  if (type == kBFloat16) throw py::type_error("bfloat16 has no NumPy type; use torch.from_dlpack(t), or t.float()");
  return npy_descr(type);
}


// Python's int(value): ValueError for nan, OverflowError for inf, exact for any integer.
py::object python_int(const py::object& value) {
  PyObject* result = PyNumber_Long(value.ptr());
  if (result == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(result);
}

// A dimension argument, negative from the end, as torch reads it; IndexError out of range.
size_t wrapped_dim(const Tensor& t, const py::object& dim_object) {
  if (!PyIndex_Check(dim_object.ptr()))
    throw py::type_error("a dimension must be an integer, not " + std::string(Py_TYPE(dim_object.ptr())->tp_name));
  const int64_t rank = t.dim(), dim = PyNumber_AsSsize_t(dim_object.ptr(), nullptr);  // clamps huge values
  if (dim == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (rank == 0) throw py::index_error("Dimension specified as " + std::to_string(dim) + " but tensor has no dimensions");
  return static_cast<size_t>(detail::wrap_dim(dim, rank));  // the engine's IndexError, torch's words
}

// t.item(): the one element as a Python bool, int, float or complex, as torch gives it.
py::object item_object(const PyTensor& s) {
  check_live(s);
  if (s.tensor.numel() != 1) throw py::value_error("item(): the tensor has " + std::to_string(s.tensor.numel()) + " elements, not 1");
  const ScalarType dtype = s.tensor.dtype();
  if (is_complex(dtype)) return python_complex(s.tensor.item<std::complex<double>>());
  if (is_floating_point(dtype)) return py::float_(s.tensor.item<double>());
  if (dtype == kBool) return py::bool_(s.tensor.item<int64_t>() != 0);
  if (dtype == kUInt64) return py::int_(s.tensor.item<uint64_t>());
  return py::int_(s.tensor.item<int64_t>());
}

// `self`, or a copy of it when it views a file's mapping: NumPy's own reads (tolist, tobytes)
// run outside the engine's SIGBUS guard, so a file cut short under the reader would end the
// process there; the engine's copy raises OSError naming the file instead.
py::object own_copy_if_mapped(const py::object& self) {
  const PyTensor& s = self.cast<const PyTensor&>();
  if (s.tensor.untyped_storage().filename().empty()) return self;
  check_live(s);
  return wrap(without_gil([&] { return s.tensor.clone(); }));
}

// `self OP other` for OP one of operator's comparisons, through NumPy, on copies of mapped
// tensors on either side (as tolist): NumPy reading a mapping of a file cut short under the
// reader would end the process with SIGBUS, where the engine's copy raises OSError.
py::object compare(const py::object& self, const py::object& other, const char* op) {
  const py::object right = py::isinstance<PyTensor>(other) ? py::object(to_numpy(own_copy_if_mapped(other))) : other;
  return py::module_::import("operator").attr(op)(to_numpy(own_copy_if_mapped(self)), right);
}

// t.clone() and copy.deepcopy(t): memory of its own, the layout kept, no batch slot held.
py::object clone_of(const PyTensor& s) {
  check_live(s);
  return wrap(without_gil([&] { return s.tensor.clone(); }));
}

// A tensor rebuilt by pickle from Tensor.__reduce__: its values in row-major order, dtype,
// shape and device. Memory of its own (host memory, then copied to the device).
py::object tensor_from_bytes(const py::bytes& data, const py::object& dtype, const py::tuple& sizes,
                             const std::string& device) {
  const ScalarType type = parse_dtype(dtype);
  const Device target = Device::parse(device);
  DimVector shape;
  for (const py::handle size : sizes) {
    shape.push_back(size.cast<int64_t>());
    if (shape.back() < 0) throw py::value_error("_tensor_from_bytes: a negative size in shape");
  }
  // The size the shape needs, checked against the bytes given before anything is allocated:
  // a hostile pickle may name a shape of terabytes.
  const std::string_view bytes = data;
  int64_t nbytes = element_size(type);
  for (int64_t size : shape)
    if (__builtin_mul_overflow(nbytes, size, &nbytes))
      throw py::value_error("_tensor_from_bytes: a shape of more bytes than fit in int64");
  if (static_cast<int64_t>(bytes.size()) != nbytes)
    throw py::value_error("_tensor_from_bytes: " + std::to_string(bytes.size()) + " bytes for a tensor of " +
                          std::to_string(nbytes));
  // A bool is one byte, 0 or 1: any other value read as a C++ bool is undefined behaviour.
  if (type == kBool && bytes.find_first_not_of(std::string_view("\0\1", 2)) != std::string_view::npos)
    throw py::value_error("_tensor_from_bytes: a bool tensor's bytes must be 0 or 1");
  Tensor host = empty(shape, type);
  if (!bytes.empty()) std::memcpy(host.mutable_data_ptr(), bytes.data(), bytes.size());
  if (target.is_cpu()) return wrap(std::move(host));
  return wrap(without_gil([&] { return host.to(target); }));
}

// The buffer protocol's view of a host tensor (memoryview(t), np.asarray(t), hashlib). Throws
// for a released batch, a CUDA tensor or bfloat16, which have none.
py::buffer_info buffer_of(const PyTensor& s) {
  check_live(s);
  const Tensor& t = s.tensor;
  if (t.device().is_cuda()) throw py::buffer_error("a CUDA tensor has no host buffer; use cpu() first");
  std::vector<py::ssize_t> shape(t.sizes().begin(), t.sizes().end()), strides;
  for (int64_t stride : t.strides()) strides.push_back(static_cast<py::ssize_t>(stride * t.element_size()));
  // NumPy's one-letter codes are PEP 3118's, but for complex, which PEP 3118 spells "Zf", "Zd".
  std::string format = t.dtype() == kComplex64    ? "Zf"
                       : t.dtype() == kComplex128 ? "Zd"
                                                  : numpy_dtype(t.dtype()).attr("char").cast<std::string>();
  return py::buffer_info(const_cast<void*>(t.data_ptr()), t.element_size(), format, t.dim(), shape, strides,
                         t.untyped_storage().is_read_only());
}

// Tensor's bf_getbuffer, in place of pybind11's. pybind11 2.10 (Debian 12's) lets an
// exception from a def_buffer callback run out through C, into std::terminate: np.asarray of
// a bfloat16 or CUDA tensor ended the process. Here a refusal becomes a BufferError, which
// memoryview(t) raises and NumPy takes as "no buffer", going on to __array__ and its message.
// The view is filled as pybind11 fills it, and pybind11's bf_releasebuffer deletes the
// buffer_info kept in view->internal.
extern "C" int tensor_getbuffer(PyObject* obj, Py_buffer* view, int flags) {
  if (view == nullptr) {
    PyErr_SetString(PyExc_BufferError, "mmtensor.Tensor: no view to fill");
    return -1;
  }
  std::memset(view, 0, sizeof(Py_buffer));
  std::unique_ptr<py::buffer_info> info;
  try {
    info = std::make_unique<py::buffer_info>(buffer_of(py::handle(obj).cast<const PyTensor&>()));
  } catch (py::error_already_set& e) {
    e.restore();
    return -1;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_BufferError, e.what());
    return -1;
  }
  if ((flags & PyBUF_WRITABLE) == PyBUF_WRITABLE && info->readonly) {
    PyErr_SetString(PyExc_BufferError, "mmtensor.Tensor: a writable buffer was asked of read-only memory (a "
                                       "dataset file mapped read-only); clone() it first");
    return -1;
  }
  // A consumer that takes no strides (or asks for C order) reads the bytes as one row-major
  // run: only a C-contiguous tensor is that. (pybind11's slot handed such a consumer the
  // first len bytes of any view, in whatever order they lay.)
  bool c_contiguous = true;
  for (py::ssize_t d = info->ndim - 1, expected = info->itemsize; d >= 0; --d) {
    const auto k = static_cast<size_t>(d);
    if (info->shape[k] != 1 && info->strides[k] != expected) c_contiguous = false;
    expected *= info->shape[k];
  }
  const bool wants_strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES;
  const bool wants_c_order = (flags & PyBUF_C_CONTIGUOUS) == PyBUF_C_CONTIGUOUS ||
                             (flags & PyBUF_ANY_CONTIGUOUS) == PyBUF_ANY_CONTIGUOUS ||
                             (flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS;
  if (!c_contiguous && (!wants_strides || wants_c_order)) {
    PyErr_SetString(PyExc_BufferError, "mmtensor.Tensor: a contiguous buffer was asked of a strided view; "
                                       "contiguous() or np.asarray(t) first");
    return -1;
  }
  view->buf = info->ptr;
  view->itemsize = info->itemsize;
  view->len = info->itemsize;
  for (py::ssize_t extent : info->shape) view->len *= extent;
  view->readonly = info->readonly ? 1 : 0;
  view->ndim = 1;
  if ((flags & PyBUF_FORMAT) == PyBUF_FORMAT) view->format = const_cast<char*>(info->format.c_str());
  if ((flags & PyBUF_ND) == PyBUF_ND) {
    view->ndim = static_cast<int>(info->ndim);
    view->shape = info->shape.data();
    if (wants_strides) view->strides = info->strides.data();
  }
  view->internal = info.release();
  view->obj = obj;
  Py_INCREF(obj);
  return 0;
}

}  // namespace

py::tuple int_tuple(IntArrayRef values) {
  py::tuple out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = py::int_(values[i]);
  return out;
}

py::object wrap(Tensor tensor, std::shared_ptr<Batch> batch) {
  return py::cast(PyTensor{std::move(tensor), std::move(batch)});
}

py::dtype numpy_dtype(ScalarType type) { return py::dtype(typestr(type)); }

// A Python complex number (pybind11 2.10 casts std::complex only with pybind11/complex.h).
py::object python_complex(std::complex<double> v) {
  return py::reinterpret_steal<py::object>(PyComplex_FromDoubles(v.real(), v.imag()));
}

py::ssize_t itemsize_of(const py::dtype& dtype) { return dtype.attr("itemsize").cast<py::ssize_t>(); }

ScalarType scalar_type_of(const py::dtype& dtype) {
  const char kind = dtype.kind();  // kind and byteorder sit where they did in NumPy 1
  const auto size = itemsize_of(dtype);
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
  if (kind == 'c') {
    if (size == 8) return kComplex64;
    if (size == 16) return kComplex128;
  }
  throw py::type_error("mmtensor has no type for NumPy's " + py::str(static_cast<const py::object&>(dtype)).cast<std::string>() +
                       " (it takes bool, integers of 8 to 64 bits, float16, float32, float64, complex64, complex128)");
}

ScalarType parse_dtype(const py::handle& dtype) {
  if (dtype.is_none()) throw py::type_error("a dtype is needed (NumPy would read None as float64)");
  std::string name = py::isinstance<py::str>(dtype) ? dtype.cast<std::string>() : std::string();
  // A torch.dtype prints as "torch.float32".
  if (name.empty() && !py::isinstance<py::dtype>(dtype) && !py::isinstance<py::type>(dtype)) {
    const auto text = py::str(dtype).cast<std::string>();
    if (text.rfind("torch.", 0) == 0) name = text.substr(6);
  }
  if (!name.empty()) {
    // mmtensor's own names (PyTorch's, without "torch."): float32, uint8, bfloat16...
    for (int code = 0; code < kNumScalarTypes; ++code)
      if (to_string(static_cast<ScalarType>(code)) == name) return static_cast<ScalarType>(code);
    // Names that PyTorch and NumPy read differently ("float": float32 in PyTorch, float64 in
    // NumPy and Python; "byte": uint8 in PyTorch, int8 in NumPy) are refused rather than guessed.
    for (const char* ambiguous : {"float", "double", "half", "int", "long", "short", "cfloat", "byte"})
      if (name == ambiguous)
        throw py::value_error("dtype '" + name + "' is ambiguous (PyTorch and NumPy read it differently); "
                              "name the size: float32, float64, int32, int64, complex64, complex128...");
  }
  try {
    return scalar_type_of(py::dtype::from_args(py::reinterpret_borrow<py::object>(dtype)));  // "f4", "<i8", np.uint8
  } catch (const py::error_already_set&) {
    throw py::value_error("unknown dtype " + py::repr(dtype).cast<std::string>() +
                          " (mmtensor has bool, uint8, int8, int16, uint16, int32, uint32, int64, uint64, "
                          "float16, bfloat16, float32, float64, complex64, complex128; NumPy's dtypes and names are "
                          "taken too)");
  }
}

// The lowest and highest element offsets that sizes and strides reach (0 and 0 when empty):
// a storage over foreign memory starts at the lowest and spans high - low + 1 elements.
static std::pair<int64_t, int64_t> element_span(IntArrayRef sizes, IntArrayRef strides) {
  int64_t low = 0, high = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) return {0, 0};
    (strides[i] < 0 ? low : high) += strides[i] * (sizes[i] - 1);
  }
  return {low, high};
}

static std::optional<ScalarType> scalar_type_of(DLDataType type) {
  if (type.lanes != 1) return std::nullopt;
  const int bits = type.bits;
  switch (type.code) {
    case kDLBoolCode: if (bits == 8) return kBool; break;
    case kDLFloat:
      if (bits == 16) return kFloat16;
      if (bits == 32) return kFloat32;
      if (bits == 64) return kFloat64;
      break;
    case kDLBfloat: if (bits == 16) return kBFloat16; break;
    case kDLComplex:
      if (bits == 64) return kComplex64;
      if (bits == 128) return kComplex128;
      break;
    case kDLInt:
      if (bits == 8) return kInt8;
      if (bits == 16) return kInt16;
      if (bits == 32) return kInt32;
      if (bits == 64) return kInt64;
      break;
    case kDLUInt:
      if (bits == 8) return kUInt8;
      if (bits == 16) return kUInt16;
      if (bits == 32) return kUInt32;
      if (bits == 64) return kUInt64;
      break;
    default: break;
  }
  return std::nullopt;
}

Tensor tensor_of_array(const py::array& array, bool writable) {
  if (writable && !array.writeable()) throw py::value_error("the output array is read-only");
  const ScalarType type = scalar_type_of(array.dtype());
  const auto element = static_cast<int64_t>(itemsize_of(array.dtype()));
  DimVector sizes, strides;
  for (py::ssize_t i = 0; i < array.ndim(); ++i) {
    sizes.push_back(array.shape(i));
    if (array.strides(i) % element != 0)
      throw py::value_error("an array whose strides are not whole elements is not taken; pass np.ascontiguousarray(a)");
    strides.push_back(array.strides(i) / element);
  }
  const auto [low, high] = element_span(sizes, strides);
  auto* first = static_cast<std::byte*>(const_cast<void*>(array.data())) + low * element;
  const int64_t nbytes = (high - low + 1) * element;
  // The deleter drops the array's reference, taking the GIL (it runs where the tensor's last
  // handle goes, so far always a thread that holds it). Once the interpreter is finalizing
  // the GIL cannot be taken, and the reference is left: the process is ending.
  auto reference = std::make_unique<py::object>(array);
  py::object* held = reference.get();
  UntypedStorage storage = UntypedStorage::from_blob(
      first, nbytes,
      [held](void*) {
        if (interpreter_finalizing()) return;
        const AcquireGil gil;  // parks this thread if finalizing began meanwhile
        delete held;
      },
      kCPU, /*read_only=*/!array.writeable());
  reference.release();  // the storage's deleter owns it now
  return Tensor(std::move(storage), type, sizes, strides, -low);
}

Tensor tensor_of_dlpack(const py::handle& producer) {
  py::object capsule = producer.attr("__dlpack__")();
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor"))
    throw py::type_error("__dlpack__ did not give a DLPack capsule (or gave one already used)");
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");  // ours now: the capsule will not free it
  // Until the storage owns it, an error frees it here.
  std::unique_ptr<DLManagedTensor, void (*)(DLManagedTensor*)> owner(managed, [](DLManagedTensor* m) {
    if (m->deleter) m->deleter(m);
  });
  const DLTensor& dl = managed->dl_tensor;
  if (dl.device.device_type != kDLCPU && dl.device.device_type != kDLCUDAHost)
    throw py::type_error("a tensor on a device is not taken here; pass a host tensor (.cpu())");
  const std::optional<ScalarType> type = scalar_type_of(dl.dtype);
  if (!type) throw py::type_error("mmtensor has no type for DLPack's type code " + std::to_string(dl.dtype.code) + ", " +
                                  std::to_string(dl.dtype.bits) + " bits, " + std::to_string(dl.dtype.lanes) + " lanes");
  if (dl.ndim < 0 || dl.ndim > 64) throw py::value_error("a DLPack tensor of " + std::to_string(dl.ndim) + " dimensions");
  DimVector sizes, strides;
  for (int d = 0; d < dl.ndim; ++d) sizes.push_back(dl.shape[d]);
  if (dl.strides) {
    for (int d = 0; d < dl.ndim; ++d) strides.push_back(dl.strides[d]);
  } else {  // compact row-major, as the protocol says a null strides means
    strides.resize(sizes.size());
    int64_t step = 1;
    for (int d = dl.ndim - 1; d >= 0; --d) {
      strides[d] = step;
      step *= std::max<int64_t>(sizes[d], 1);
    }
  }
  int64_t numel = 1;
  for (int64_t size : sizes) numel *= size;
  if (numel == 0) return empty(sizes, *type);  // no elements: the producer may give no pointer (torch does not)
  if (dl.data == nullptr) throw py::value_error("a DLPack tensor with elements and no data pointer");
  const auto [low, high] = element_span(sizes, strides);
  const int64_t element = element_size(*type);
  auto* first = static_cast<std::byte*>(dl.data) + dl.byte_offset + low * element;
  UntypedStorage storage = UntypedStorage::from_blob(
      first, (high - low + 1) * element,
      [managed](void*) {
        if (interpreter_finalizing()) return;  // the producer's deleter may need the interpreter
        const AcquireGil gil;  // parks this thread if finalizing began meanwhile
        if (managed->deleter) managed->deleter(managed);
      },
      kCPU);
  owner.release();  // the storage's deleter frees it now
  return Tensor(std::move(storage), *type, sizes, strides, -low);
}

// NumPy's floating-point warnings off for a scope (np.errstate(all="ignore")).
class NumpyErrorsIgnored {
 public:
  explicit NumpyErrorsIgnored(const py::module_& np) : state_(np.attr("errstate")(py::arg("all") = "ignore")) {
    state_.attr("__enter__")();
  }
  ~NumpyErrorsIgnored() {
    try {
      state_.attr("__exit__")(py::none(), py::none(), py::none());
    } catch (...) {  // a destructor must not throw; the settings stay changed at worst
    }
  }

 private:
  py::object state_;
};

namespace {

// Numbers NumPy made floats (`natural`, float64 for a list mixing ints and floats) for an
// integer field, taken element by element as Python holds them: an int as it is, a float
// when it is a whole number. NumPy's float64 had rounded every int past 2^53 (2**53 + 1 beside
// 2.0 became 2**53), and its casts would truncate fractions; `refuse` is called for a value
// that is no whole number or lies past the dtype's range.
Tensor integers_of_numbers(const py::handle& value, const py::array& natural, ScalarType dtype,
                           const std::function<void()>& refuse) {
  py::module_ np = py::module_::import("numpy"), math = py::module_::import("math");
  const py::object as_objects = np.attr("asarray")(value, py::arg("dtype") = py::dtype("O"));
  const py::object info = np.attr("iinfo")(numpy_dtype(dtype));
  const py::object lowest = info.attr("min"), highest = info.attr("max");
  py::list exact;
  for (const py::handle element : as_objects.attr("flat")) {
    py::object integer;
    if (PyFloat_Check(element.ptr()) || py::isinstance(element, np.attr("floating"))) {
      const py::object as_float = py::float_(py::reinterpret_borrow<py::object>(element));
      if (!math.attr("isfinite")(as_float).cast<bool>() || !as_float.attr("is_integer")().cast<bool>()) refuse();
      integer = py::int_(as_float);  // the float's value, exactly
    } else {
      integer = py::reinterpret_steal<py::object>(PyNumber_Index(element.ptr()));  // int, bool, NumPy's integers
      if (!integer) throw py::error_already_set();
    }
    if (integer < lowest || integer > highest) refuse();
    exact.append(integer);
  }
  py::array converted = np.attr("array")(exact, numpy_dtype(dtype)).attr("reshape")(natural.attr("shape"));
  return tensor_of_array(converted, false);
}

}  // namespace

Tensor tensor_of_value(const py::handle& value, ScalarType dtype, const std::string& what) {
  if (py::isinstance<PyTensor>(value)) return value.cast<const PyTensor&>().tensor;
  if (py::isinstance<py::array>(value)) {
    auto array = py::reinterpret_borrow<py::array>(value);
    // The writer copies values into the file, so an array no tensor views (the other byte
    // order; strides of no whole element, as a field of a packed structured array has) is
    // made native and contiguous first: the copy the writer makes anyway, made here.
    bool viewable = array.dtype().byteorder() != '>';
    for (py::ssize_t i = 0; i < array.ndim(); ++i)
      viewable = viewable && array.strides(i) % static_cast<py::ssize_t>(itemsize_of(array.dtype())) == 0;
    if (!viewable) {
      py::module_ np = py::module_::import("numpy");
      array = np.attr("ascontiguousarray")(array, array.dtype().attr("newbyteorder")("="));
    }
    ScalarType given = dtype;
    try {
      given = scalar_type_of(array.dtype());
    } catch (py::type_error& e) {  // an object array, a structured one...: named where it was given
      throw py::type_error(what + ": " + e.what());
    }
    if (given != dtype)
      throw py::value_error(what + ": expected dtype " + std::string(to_string(dtype)) + ", got " +
                            py::str(static_cast<const py::object&>(array.dtype())).cast<std::string>() +
                            " (cast it with astype() if that is meant)");
    return tensor_of_array(array, false);
  }
  if (py::hasattr(value, "__dlpack__")) {  // a torch tensor, or any DLPack producer
    Tensor t = tensor_of_dlpack(value);
    if (t.dtype() != dtype)
      throw py::value_error(what + ": expected dtype " + std::string(to_string(dtype)) + ", got " +
                            std::string(to_string(t.dtype())) + " (convert it if that is meant)");
    return t;
  }
  if (dtype == kBFloat16) throw py::type_error(what + ": a bfloat16 value must be a DLPack tensor (torch.bfloat16)");
  py::module_ np = py::module_::import("numpy");
  // Raw bytes (an encoded image read from a file) for a bytes field, as they are.
  if (dtype == kUInt8 && (py::isinstance<py::bytes>(value) || py::isinstance<py::bytearray>(value) ||
                          py::isinstance<py::memoryview>(value)))
    return tensor_of_array(np.attr("frombuffer")(value, np.attr("uint8")), false);
  if (py::isinstance<py::str>(value))
    throw py::type_error(what + ": a str is not a value of dtype " + std::string(to_string(dtype)) +
                         (dtype == kUInt8 ? " (for a bytes field, pass s.encode())" : ""));
  // Lists, numbers, NumPy scalars. An integer field takes them only when every value is an
  // integer in its range (300 does not fit uint8, -1 not uint64, 3.7 is not an int64): NumPy's
  // casts would wrap or truncate. A floating field takes any finite number, rounded to its
  // precision as every float is (0.1 into float32), but not one it cannot hold (1e40 into
  // float32 would become inf).
  py::array natural;
  try {
    natural = np.attr("asarray")(value);
  } catch (py::error_already_set& e) {  // uneven nested lists: NumPy's message, named here
    if (!e.matches(PyExc_ValueError)) throw;
    throw py::value_error(what + ": " + py::str(e.value()).cast<std::string>());
  }
  const char kind = natural.dtype().kind();
  const bool inexact = is_floating_point(dtype) || is_complex(dtype);
  if (kind != 'b' && kind != 'i' && kind != 'u' && kind != 'f' && !(kind == 'c' && is_complex(dtype)))
    throw py::type_error(what + ": expected numbers of dtype " + std::string(to_string(dtype)) + ", got " +
                         py::str(static_cast<const py::object&>(natural.dtype())).cast<std::string>() + " values");
  const auto refuse = [&] {
    throw py::value_error(what + ": " + py::repr(value).cast<std::string>().substr(0, 80) + " does not fit dtype " +
                          std::string(to_string(dtype)) + (inexact ? "" : " exactly") +
                          " (convert it yourself if that is meant)");
  };
  const NumpyErrorsIgnored quiet(np);  // a refused conversion prints no NumPy warning
  if (!inexact && dtype != kBool && kind == 'f') return integers_of_numbers(value, natural, dtype, refuse);
  py::array converted = natural.attr("astype")(numpy_dtype(dtype));
  bool fits = true;
  if (natural.size() > 0) {
    if (inexact) {
      // Finite values stay finite (an inf or nan given stays what it is); a complex value is
      // finite when both its parts are.
      fits = np.attr("array_equal")(np.attr("isfinite")(converted), np.attr("isfinite")(natural)).cast<bool>();
    } else if (dtype == kBool) {
      fits = np.attr("array_equal")(converted.attr("astype")(natural.dtype()), natural).cast<bool>();
    } else {
      if (kind == 'f')
        fits = np.attr("all")(np.attr("isfinite")(natural)).cast<bool>() &&
               np.attr("array_equal")(np.attr("floor")(natural), natural).cast<bool>();
      // Compared as Python ints, exact at any size, not in NumPy's mixed-sign arithmetic.
      py::object info = np.attr("iinfo")(numpy_dtype(dtype));
      fits = fits && py::int_(natural.attr("min")()) >= info.attr("min") &&
             py::int_(natural.attr("max")()) <= info.attr("max");
    }
  }
  if (!fits) refuse();
  return tensor_of_array(converted, false);
}

long long index_value(const py::handle& value, int& overflow) {
  const py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!index) throw py::error_already_set();
  overflow = 0;
  const long long result = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (result == -1 && PyErr_Occurred()) throw py::error_already_set();
  return result;
}

std::vector<std::string> field_names_of(const py::handle& fields) {
  if (py::isinstance<py::str>(fields)) return {name_text(fields)};
  std::vector<std::string> names;
  if (fields.is_none()) return names;
  for (const py::handle name : py::iter(fields)) {
    if (!py::isinstance<py::str>(name))
      throw py::type_error(std::string("fields must be field names (str), got ") + Py_TYPE(name.ptr())->tp_name);
    names.push_back(name_text(name));
  }
  return names;
}

std::vector<int64_t> indices_of(const py::handle& indices, int64_t mask_length) {
  // Text, sets, dicts, iterators and single numbers are no sequence of indices: NumPy would
  // make a 0-d or object array of them, and the message would be about dimensions.
  const std::string type_name = Py_TYPE(indices.ptr())->tp_name;
  // bytes, bytearray and a memoryview of them are text as far as indices go: b"ab" is no list
  // of the records 97 and 98.
  // (A memoryview a C extension made of raw memory has no base object.)
  PyObject* const view_base = PyMemoryView_Check(indices.ptr()) ? PyMemoryView_GET_BASE(indices.ptr()) : nullptr;
  const bool byte_string = py::isinstance<py::bytes>(indices) || PyByteArray_Check(indices.ptr()) ||
                           (view_base != nullptr && (PyBytes_Check(view_base) || PyByteArray_Check(view_base)));
  if (py::isinstance<py::str>(indices) || byte_string || PyAnySet_Check(indices.ptr()) ||
      PyDict_Check(indices.ptr()) || PyIter_Check(indices.ptr()) || indices.is_none())
    throw py::type_error("indices must be a sequence of integers (a list, a range or an array), not " + type_name);
  py::module_ np = py::module_::import("numpy");
  py::array array = np.attr("asarray")(indices);
  if (array.ndim() == 0)
    throw py::type_error("indices must be a sequence of integers (a list, a range or an array), not one " + type_name +
                         "; for one record, pass [i]");
  if (array.ndim() != 1) throw py::value_error("indices must be one-dimensional, got " + std::to_string(array.ndim()) + " dimensions");
  // NumPy makes float64 of a list mixing np.uint64 and int ([np.uint64(1), 2]): the items
  // themselves are integers, so they are read one by one, as a list past int64 is.
  if (array.dtype().kind() == 'f' && !py::isinstance<py::array>(indices))
    array = np.attr("asarray")(indices, "object");
  if (array.dtype().kind() == 'O') {
    // Python ints past int64 (2**70), or objects that are no integers at all.
    for (const py::handle item : array.attr("tolist")()) {
      // Python ints, and NumPy integers kept as objects beside them ([np.int64(1), 2**70]).
      if (py::isinstance<py::bool_>(item) || !PyIndex_Check(item.ptr()))
        throw py::type_error(std::string("indices must be integers, got ") + Py_TYPE(item.ptr())->tp_name);
      int overflow = 0;
      (void)index_value(item, overflow);
      if (overflow) throw py::index_error("index " + py::str(item).cast<std::string>() + " is out of range");
    }
    array = np.attr("asarray")(indices, "int64");
  }
  if (array.dtype().kind() == 'b') {
    // A boolean mask, as NumPy takes one: the positions where it is true.
    if (mask_length < 0) throw py::type_error("a boolean mask is not taken here; pass np.flatnonzero(mask)");
    if (array.size() != mask_length)
      throw py::index_error("a boolean mask of " + std::to_string(array.size()) + " entries for " +
                            std::to_string(mask_length) + " records");
    array = np.attr("flatnonzero")(array);
  }
  if (array.size() > 0 && array.dtype().kind() != 'i' && array.dtype().kind() != 'u')
    throw py::type_error("indices must be integers, got " +
                         py::str(static_cast<const py::object&>(array.dtype())).cast<std::string>());
  if (array.dtype().kind() == 'u' && itemsize_of(array.dtype()) == 8 && array.size() > 0 &&
      array.attr("max")().cast<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    throw py::index_error("index " + py::str(array.attr("max")()).cast<std::string>() + " is out of range");
  auto as_int64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(array);
  return std::vector<int64_t>(as_int64.data(), as_int64.data() + as_int64.size());
}

std::string path_of(const py::handle& path) {
  py::module_ os = py::module_::import("os");
  auto text = os.attr("fsencode")(os.attr("fspath")(path)).cast<std::string>();
  if (text.find('\0') != std::string::npos) throw py::value_error("embedded null byte in path");  // as open() says
  return text;
}

std::string name_text(const py::handle& name) {
  if (!py::isinstance<py::str>(name))
    throw py::type_error(std::string("a field name must be a str, not ") + Py_TYPE(name.ptr())->tp_name);
  const auto encoded = py::reinterpret_steal<py::object>(PyUnicode_AsEncodedString(name.ptr(), "utf-8", "surrogatepass"));
  if (!encoded) throw py::error_already_set();
  return std::string(PyBytes_AS_STRING(encoded.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(encoded.ptr())));
}

Metadata metadata_argument(const py::object& value) {
  Metadata out;
  if (value.is_none()) return out;
  if (!py::hasattr(value, "items"))
    throw py::type_error(std::string("metadata must be a dict of str to str, got ") + Py_TYPE(value.ptr())->tp_name);
  // str, or bytes as they are (the writer refuses text that is not UTF-8, naming the key).
  const auto text = [](const py::handle& object) {
    return py::isinstance<py::bytes>(object) ? object.cast<std::string>() : name_text(object);
  };
  const auto is_text = [](const py::handle& object) {
    return py::isinstance<py::str>(object) || py::isinstance<py::bytes>(object);
  };
  for (const py::handle item : value.attr("items")()) {
    const py::tuple pair = py::reinterpret_borrow<py::tuple>(item);
    if (!is_text(pair[0]) || !is_text(pair[1]))
      throw py::type_error("metadata must map str to str; " + py::repr(pair[0]).cast<std::string>().substr(0, 80) +
                           " maps to " + Py_TYPE(pair[1].ptr())->tp_name + " " +
                           py::repr(pair[1]).cast<std::string>().substr(0, 80) + " (json.dumps it, or str() it)");
    out[text(pair[0])] = text(pair[1]);
  }
  return out;
}

py::object path_object(const std::string& path) {
  return py::module_::import("os").attr("fsdecode")(py::bytes(path));
}

py::str lenient_text(const std::string& text) {
  PyObject* decoded = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "backslashreplace");
  if (decoded == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(decoded);
}

void bind_tensor(py::module_& m) {
  m.def("_tensor_from_bytes", &tensor_from_bytes, py::arg("data"), py::arg("dtype"), py::arg("shape"),
        py::arg("device"), "Rebuilds a pickled Tensor (Tensor.__reduce__)");
  py::class_<PyTensor> tensor_class(m, "Tensor", py::buffer_protocol(), R"doc(
A strided view of typed memory: a dataset's mapping, a decoded chunk, a loader batch.

It reaches NumPy and PyTorch without a copy: t.numpy() or np.asarray(t) (read-only when it
views a dataset file), torch.from_dlpack(t) (also for CUDA tensors and bfloat16), and for
CUDA tensors __cuda_array_interface__; the buffer protocol gives memoryview(t) and bytes(t).
Every such view keeps the memory alive. A view into a file mapped read-only must not be
written through DLPack: clone() it first. Indexing (t[0], t[:, 3]) and iteration go through
NumPy and give NumPy arrays; for arithmetic, convert first.)doc");
  tensor_class
      .def("__getitem__", [](const py::object& self, const py::object& key) -> py::object {
        py::array array = to_numpy(self);  // named: an accessor of a temporary would dangle
        return array[key];
      })
      .def_property_readonly("shape", [](const PyTensor& s) { return int_tuple(s.tensor.sizes()); })
      .def("size", [](const PyTensor& s, const py::object& dim) -> py::object {
        if (dim.is_none()) return int_tuple(s.tensor.sizes());
        return py::int_(s.tensor.sizes()[wrapped_dim(s.tensor, dim)]);
      }, py::arg("dim") = py::none(), "The sizes as a tuple, or one dimension's (negative from the end), as torch.Tensor.size()")
      .def("stride", [](const PyTensor& s, const py::object& dim) -> py::object {
        if (dim.is_none()) return int_tuple(s.tensor.strides());
        return py::int_(s.tensor.strides()[wrapped_dim(s.tensor, dim)]);
      }, py::arg("dim") = py::none(), "Strides in elements, or one dimension's, as torch.Tensor.stride()")
      .def_property_readonly("dtype", [](const PyTensor& s) { return std::string(to_string(s.tensor.dtype())); })
      .def_property_readonly("device", [](const PyTensor& s) { return s.tensor.device().str(); })
      .def_property_readonly("real", [](const PyTensor& s) {
        check_live(s);
        return wrap(s.tensor.real(), s.batch);
      }, "torch's t.real: a complex tensor's real parts as a view (float32 for complex64); a real tensor itself")
      .def_property_readonly("imag", [](const PyTensor& s) {
        check_live(s);
        return wrap(s.tensor.imag(), s.batch);
      }, "torch's t.imag: a complex tensor's imaginary parts as a view; ValueError for a real tensor")
      .def("is_complex", [](const PyTensor& s) { return s.tensor.is_complex(); })
      .def_property_readonly("ndim", [](const PyTensor& s) { return s.tensor.dim(); })
      .def("dim", [](const PyTensor& s) { return s.tensor.dim(); })
      .def("numel", [](const PyTensor& s) { return s.tensor.numel(); })
      .def_property_readonly("nbytes", [](const PyTensor& s) { return s.tensor.nbytes(); })
      .def("element_size", [](const PyTensor& s) { return s.tensor.element_size(); })
      .def("storage_offset", [](const PyTensor& s) { return s.tensor.storage_offset(); })
      .def_property_readonly("filename", [](const PyTensor& s) { return path_object(s.tensor.untyped_storage().filename()); },
                             "The mapped file the tensor views, or '' (a copy, a decoded chunk, a batch)")
      .def_property_readonly("is_read_only", [](const PyTensor& s) { return s.tensor.untyped_storage().is_read_only(); })
      .def("is_contiguous", [](const PyTensor& s) { return s.tensor.is_contiguous(); })
      .def("is_pinned", [](const PyTensor& s) { return s.tensor.untyped_storage().is_pinned(); })
      .def("data_ptr", [](const PyTensor& s) { return reinterpret_cast<uintptr_t>(s.tensor.data_ptr()); })
      .def("__len__", [](const PyTensor& s) {
        if (s.tensor.dim() == 0) throw py::type_error("len() of a 0-d tensor");
        return s.tensor.sizes()[0];
      })
      .def("clone", &clone_of, "A copy in memory of its own (the layout kept), writable; it holds no batch slot")
      .def("__reduce__", [](const py::object& self) {
        // Its values travel, not its memory: a view into a file or a loader batch pickles as
        // a copy, and comes back as a tensor of its own on the same device.
        // The values are copied once, straight into the bytes object pickle keeps.
        const PyTensor& s = self.cast<const PyTensor&>();
        check_live(s);
        const int64_t nbytes = s.tensor.nbytes();
        auto data = py::reinterpret_steal<py::bytes>(PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(nbytes)));
        if (!data) throw py::error_already_set();
        void* buffer = PyBytes_AS_STRING(data.ptr());
        without_gil([&] {
          const Tensor values(UntypedStorage::from_blob(buffer, nbytes, [](void*) {}), s.tensor.dtype(), s.tensor.sizes());
          values.copy_(s.tensor);
          // A bool byte of a file other than 0 or 1 reads as true (docs/FORMAT.md); it travels
          // as 1, which _tensor_from_bytes takes, rather than failing in the unpickling process.
          if (s.tensor.dtype() == kBool) {
            auto* bytes = static_cast<unsigned char*>(buffer);
            for (int64_t i = 0; i < nbytes; ++i) bytes[i] = bytes[i] != 0;
          }
        });
        return py::make_tuple(py::module_::import("mmtensor").attr("_rebuild_tensor"),
                              py::make_tuple(data, std::string(to_string(s.tensor.dtype())), int_tuple(s.tensor.sizes()),
                                             s.tensor.device().str()));
      })
      .def("__copy__", [](const PyTensor& s) { return wrap(s.tensor, s.batch); },
           "copy.copy(t): another tensor object over the same memory, as a view is")
      .def("__deepcopy__", [](const PyTensor& s, const py::object&) { return clone_of(s); }, py::arg("memo"),
           "copy.deepcopy(t): clone()")
      .def("contiguous", [](const py::object& self) -> py::object {
        const PyTensor& s = self.cast<const PyTensor&>();
        if (s.tensor.is_contiguous()) return self;
        check_live(s);
        return wrap(without_gil([&] { return s.tensor.contiguous(); }));  // a copy: it holds no batch slot
      })
      .def("cpu", [](const py::object& self) -> py::object {
        const PyTensor& s = self.cast<const PyTensor&>();
        if (s.tensor.device().is_cpu()) return self;
        check_live(s);
        return wrap(without_gil([&] { return s.tensor.cpu(); }));
      })
      .def("float", [](const PyTensor& s) {
        check_live(s);
        return wrap(without_gil([&] {
          Tensor out = empty(s.tensor.sizes(), kFloat32);
          out.copy_(s.tensor.cpu());
          return out;
        }));
      }, "A float32 copy on the host (how a bfloat16 value reaches NumPy)")
      .def("item", &item_object)
      // int() and index() go through item(), so that they agree with it: Python's int() of a
      // float (ValueError for nan, OverflowError for inf, exact for 1e30), the whole range of
      // uint64.
      .def("__int__", [](const PyTensor& s) { return python_int(item_object(s)); })
      .def("__float__", [](const PyTensor& s) { return s.tensor.item<double>(); })
      .def("__complex__", [](const PyTensor& s) { return python_complex(s.tensor.item<std::complex<double>>()); })
      .def("__index__", [](const PyTensor& s) {
        if (is_floating_point(s.tensor.dtype()) || is_complex(s.tensor.dtype()) || s.tensor.numel() != 1)
          throw py::type_error("only integer tensors of a single element can be converted to an index");
        return python_int(item_object(s));
      })
      // As torch: one element is true or false by its value, more (or none) are ambiguous.
      .def("__bool__", [](const PyTensor& s) {
        if (s.tensor.numel() != 1)
          throw py::value_error(std::string("Boolean value of Tensor with ") + (s.tensor.numel() == 0 ? "no values" : "more than one value") +
                                " is ambiguous");
        return item_object(s).cast<bool>();
      })
      // Comparisons by value, element by element, as NumPy and torch compare (the result is a
      // NumPy array, or np.bool_ for one element): without them `t == 5` fell back to
      // identity and was False for a tensor holding 5. A CUDA tensor is refused (cpu() first),
      // as numpy() refuses it. Hashing stays by identity, as torch's.
      .def("__eq__", [](const py::object& self, const py::object& other) { return compare(self, other, "eq"); })
      .def("__ne__", [](const py::object& self, const py::object& other) { return compare(self, other, "ne"); })
      .def("__lt__", [](const py::object& self, const py::object& other) { return compare(self, other, "lt"); })
      .def("__le__", [](const py::object& self, const py::object& other) { return compare(self, other, "le"); })
      .def("__gt__", [](const py::object& self, const py::object& other) { return compare(self, other, "gt"); })
      .def("__ge__", [](const py::object& self, const py::object& other) { return compare(self, other, "ge"); })
      .def("__hash__", [](const py::object& self) { return py::hash(py::module_::import("builtins").attr("id")(self)); })
      .def("__iter__", [](const py::object& self) {
        if (self.cast<const PyTensor&>().tensor.dim() == 0) throw py::type_error("iteration over a 0-d tensor");
        return py::iter(to_numpy(self));
      }, "Iterates over the first dimension through NumPy, as indexing does")
      .def("tolist", [](const py::object& self) { return to_numpy(own_copy_if_mapped(self)).attr("tolist")(); })
      // Before __index__, which bytes() would otherwise take as a length.
      .def("__bytes__", [](const py::object& self) { return to_numpy(own_copy_if_mapped(self)).attr("tobytes")(); },
           "The elements' bytes in row-major order")
      .def("_copy_into", [](const PyTensor& s, const py::object& out_object) {
        // An array only: anything NumPy would convert is a temporary, and the copy lost with it.
        if (!py::isinstance<py::array>(out_object)) throw py::type_error("_copy_into: out must be a NumPy array");
        const auto out = py::reinterpret_borrow<py::array>(out_object);
        check_live(s);
        Tensor destination = tensor_of_array(out, /*writable=*/true);
        MMT_CHECK(destination.sizes() == s.tensor.sizes() && destination.dtype() == s.tensor.dtype(), ValueError,
                  "_copy_into: the output is ", to_string(destination.dtype()), destination.sizes(), ", the tensor ",
                  to_string(s.tensor.dtype()), s.tensor.sizes());
        without_gil([&] { destination.copy_(s.tensor.cpu()); });
      }, py::arg("out"),
         "Copies the values into a NumPy array of the same shape and dtype; a view into a file cut short under "
         "the reader raises OSError there, where NumPy's own copy would die of SIGBUS (collate uses it)")
      .def("numpy", &to_numpy, "A NumPy array viewing the same memory (read-only for a file mapped read-only)")
      .def("__array__", [](const py::object& self, const py::object& dtype, const py::object& copy) {
        py::object array = to_numpy(self);
        const bool never_copy = !copy.is_none() && !copy.cast<bool>();
        if (!dtype.is_none() && !py::dtype::from_args(dtype).equal(array.attr("dtype").cast<py::dtype>())) {
          if (never_copy) throw py::value_error("__array__: a dtype conversion needs a copy, and copy=False was asked");
          return array.attr("astype")(dtype);
        }
        if (!copy.is_none() && copy.cast<bool>()) array = array.attr("copy")();
        return array;
      }, py::arg("dtype") = py::none(), py::arg("copy") = py::none())
      .def("__dlpack__", &to_dlpack, py::kw_only(), py::arg("stream") = py::none(), py::arg("max_version") = py::none(),
           py::arg("dl_device") = py::none(), py::arg("copy") = py::none(),
           "DLPack export (torch.from_dlpack, np.from_dlpack): the same memory, or a copy for a view into a "
           "read-only file mapping, which DLPack cannot mark read-only. bool goes as DLPack's bool, which torch 1.x "
           "refuses ('Unsupported code 6'): there, use torch.from_numpy(np.array(t)), a copy (torch.from_numpy of "
           "t.numpy(), read-only, only warns, and an in-place op on it would crash the process)")
      .def("__dlpack_device__", [](const PyTensor& s) {
        return s.tensor.device().is_cuda() ? py::make_tuple(static_cast<int>(kDLCUDA), s.tensor.device().index)
                                           : py::make_tuple(static_cast<int>(kDLCPU), 0);
      })
      .def_property_readonly("__cuda_array_interface__", [](const PyTensor& s) {
        const Tensor& t = s.tensor;
        if (!t.device().is_cuda()) throw py::attribute_error("__cuda_array_interface__: the tensor is on the host");
        if (t.dtype() == kBFloat16) throw py::attribute_error("__cuda_array_interface__ has no bfloat16; use DLPack");
        check_live(s);
        py::dict interface;
        interface["shape"] = int_tuple(t.sizes());
        interface["typestr"] = typestr(t.dtype());
        // The interface's rule: 0 for an array of no elements (whose offset may lie past its storage).
        const uintptr_t data = t.numel() == 0 ? 0 : reinterpret_cast<uintptr_t>(t.data_ptr());
        interface["data"] = py::make_tuple(data, t.untyped_storage().is_read_only());
        py::tuple strides(t.dim());
        for (int64_t i = 0; i < t.dim(); ++i) strides[i] = py::int_(t.strides()[i] * t.element_size());
        interface["strides"] = strides;
        interface["version"] = 3;
        // next() ordered the copy before the legacy default stream of the batch's device. A
        // consumer reads "stream": 1 as its current device's legacy stream (CuPy synchronizes
        // it): right when that is the batch's device. With another device current it would
        // wait on the wrong device, so the copy is waited for here, on the host, and no
        // stream is named. A consumer on another stream must call batch.wait(stream) too, so
        // that the slot's reuse waits for it.
        if (cuda::current_device() == t.device().index) {
          interface["stream"] = 1;
        } else {
          if (s.batch) without_gil([&] {
            const cuda::ScopedRelaxedStreamCapture relaxed;  // another thread may be capturing a graph
            s.batch->synchronize();
          });
          interface["stream"] = py::none();
        }
        return interface;
      })
      .def("__repr__", [](const PyTensor& s) {
        if (s.tensor.device().is_cuda()) return "<mmtensor.Tensor shape=" + py::repr(int_tuple(s.tensor.sizes())).cast<std::string>() +
                                                " dtype=" + std::string(to_string(s.tensor.dtype())) + " device=" + s.tensor.device().str() + ">";
        // The C++ printout is PyTorch's, dtype=torch.uint8 included; here there is no torch.
        std::string text = s.tensor.to_string();
        for (size_t at; (at = text.find("torch.")) != std::string::npos;) text.erase(at, 6);
        return text;
      });
  // py::buffer_protocol() gave the type pybind11's two buffer slots. The get slot is ours;
  // pybind11's release slot stays, and deletes the buffer_info tensor_getbuffer keeps.
  reinterpret_cast<PyTypeObject*>(tensor_class.ptr())->tp_as_buffer->bf_getbuffer = &tensor_getbuffer;
}

}  // namespace mmt::python
