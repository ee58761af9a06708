// What the pieces of the Python module share: the Tensor wrapper, conversions between NumPy
// arrays and mmt::Tensor, and the functions that add each class to the module.
//
// Ownership. A Python Tensor holds an mmt::Tensor, whose storage is shared: a view into a
// dataset's mapping keeps the mapping alive however long Python keeps the object (or a NumPy
// array or torch tensor made from it, whose base is that object). A tensor taken from a
// loader's batch also holds the batch, so the ring slot it views is not refilled while any
// Python object still views it.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cxxabi.h>
#include <unistd.h>

#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <string>
#include <vector>

#include "fork_safety.h"  // engine/, for ForkAwareMutex
#include "mmtensor/mmtensor.h"

namespace mmt::python {

namespace py = pybind11;

// Whether the interpreter is shutting down, when a thread other than the main one can no
// longer take the GIL.
inline bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// A daemon thread that wants the GIL back once the interpreter is finalizing is ended by
// Python with pthread_exit, a forced unwind. Through pybind11's noexcept destructors that is
// std::terminate (the whole process aborts at exit); through pybind11's dispatcher it drops
// references to Python objects without the GIL, deallocating some with no thread state: under
// Python 3.12 and NumPy 2 that crashed at exit (SIGSEGV in 13 of 15 runs of the GPU machine's
// diagnosis). The GIL is taken back through the two classes below, which stop such a thread
// where it is instead, holding nothing of the engine's, until the process ends: what Python
// 3.14 itself does with such threads. A cancellation (pthread_cancel) is not parked: it
// unwinds on, and ends the process where pybind11's or a deleter's noexcept frames meet it,
// as it did before. (An application that embeds Python and runs on after Py_Finalize keeps
// a parked thread parked.)
[[noreturn]] inline void park_until_exit() {
  for (;;) ::pause();  // a forced unwind may not be swallowed: leaving the handler is std::terminate
}

// Releases the GIL for engine work, as py::gil_scoped_release, with the difference above.
class ReleaseGil {
 public:
  ReleaseGil() : state_(PyEval_SaveThread()) {}
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;
  ~ReleaseGil() noexcept(false) {  // lets a cancellation's unwind go on
    try {
      PyEval_RestoreThread(state_);
    } catch (abi::__forced_unwind&) {
      if (!interpreter_finalizing()) throw;
      park_until_exit();
    }
  }

 private:
  PyThreadState* state_;
};

// Holds the GIL, as py::gil_scoped_acquire, on any thread (a storage's deleter runs where the
// last handle goes), with the difference above.
class AcquireGil {
 public:
  AcquireGil() {
    try {
      state_ = PyGILState_Ensure();
    } catch (abi::__forced_unwind&) {
      if (!interpreter_finalizing()) throw;
      park_until_exit();
    }
  }
  AcquireGil(const AcquireGil&) = delete;
  AcquireGil& operator=(const AcquireGil&) = delete;
  ~AcquireGil() { PyGILState_Release(state_); }

 private:
  PyGILState_STATE state_;
};

// A Python object's lock that the child of a fork() never takes. torch DataLoader workers
// and multiprocessing fork by default, and a thread of the parent (another Python thread in
// loader.next(), the GIL released) may hold it at that moment and for ever after in the
// child. The engine's Loader and DatasetWriter refuse to be used in the child and say why
// (fork_safety.h), so there is nothing left there for the lock to protect. The process is
// told by its fork generation, not its pid: a descendant may be given a pid that was the
// owner's.
class ForkAwareMutex {
 public:
  void lock() {
    if (in_owner_process()) mutex_.lock();
  }
  void unlock() {
    if (in_owner_process()) mutex_.unlock();
  }

 private:
  bool in_owner_process() const { return !detail::inherited_through_fork(made_in_generation_); }
  std::mutex mutex_;
  const uint64_t made_in_generation_ = detail::fork_generation();
};

// fn() with the GIL released; its exception, if any, is thrown once the GIL is back.
template <typename Fn>
auto without_gil(Fn&& fn) -> decltype(fn()) {
  using Result = decltype(fn());
  std::exception_ptr error;
  if constexpr (std::is_void_v<Result>) {
    {
      ReleaseGil nogil;
      try {
        fn();
      } catch (abi::__forced_unwind&) {
        throw;  // a cancellation is not an error to report: swallowing it is std::terminate
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
  } else {
    std::optional<Result> result;
    {
      ReleaseGil nogil;
      try {
        result.emplace(fn());
      } catch (abi::__forced_unwind&) {
        throw;  // as above
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (error) std::rethrow_exception(error);
    return std::move(*result);
  }
}

// Whether the calling thread (holding the GIL) is Python's main thread, the one signal
// handlers run on. Engine work on another thread must not take the GIL back to look at
// signals: at interpreter exit, a daemon thread taking it is ended there, by a forced unwind
// that without_gil's catch would turn into std::terminate.
inline bool on_main_thread() {
  return PyThread_get_thread_ident() ==
         py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
}

struct PyTensor {
  Tensor tensor;
  std::shared_ptr<Batch> batch;  // the loader batch the tensor views, if any
};

// Sizes, strides or a shape as a Python tuple of ints.
py::tuple int_tuple(IntArrayRef values);

// A Python Tensor for `tensor` (holding `batch` too, when given).
py::object wrap(Tensor tensor, std::shared_ptr<Batch> batch = nullptr);

// A Python RaggedBatch (values, offsets, shapes), holding `batch` too, when given.
py::object wrap_ragged(RaggedBatch ragged, std::shared_ptr<Batch> batch = nullptr);

// NumPy's dtype for a ScalarType; TypeError for bfloat16, which NumPy lacks.
py::dtype numpy_dtype(ScalarType type);
// A dtype's element size in bytes. Not pybind11's dtype::itemsize() or array::itemsize():
// before pybind11 2.12 they read the element size at NumPy 1's place in PyArray_Descr, which
// NumPy 2 moved, and got garbage there (every array was "no type for NumPy's float32").
py::ssize_t itemsize_of(const py::dtype& dtype);
// The ScalarType of a NumPy dtype; TypeError naming it for one mmtensor has no type for.
ScalarType scalar_type_of(const py::dtype& dtype);
ScalarType parse_dtype(const py::handle& dtype);  // "float32", np.float32, np.dtype(...)

// A view of a NumPy array (any strides, host memory) as an mmt::Tensor; the tensor's storage
// holds a reference to the array, so it stays valid as long as the tensor. `writable` refuses
// a read-only array.
Tensor tensor_of_array(const py::array& array, bool writable);
// A view of a host tensor of another library (a torch CPU tensor) through its __dlpack__;
// the tensor's storage holds the producer's memory until it goes.
Tensor tensor_of_dlpack(const py::handle& producer);
// A field's value for the writer: an mmtensor Tensor, a NumPy array of `dtype`, a DLPack
// producer of `dtype` (a torch CPU tensor, bfloat16 included), bytes, bytearray or memoryview
// for a uint8 field (an encoded image as read), or numbers NumPy turns into an array (a list,
// a number), converted to `dtype` only when every value survives exactly. An array or tensor
// of another dtype is refused: a silent cast could lose data.
Tensor tensor_of_value(const py::handle& value, ScalarType dtype, const std::string& what);
// The integer an object's __index__ gives (an int, np.int64, a 0-d integer array), with its
// overflow past int64 reported in `overflow`; __index__'s own error (a 0-d float array, an
// object whose __index__ raises) is raised as it is.
long long index_value(const py::handle& value, int& overflow);
// Field names as `fields=` takes them: None (none named), one str alone (a list of one:
// pybind11 would refuse a str for a list with its whole overload text), or an iterable of
// str; TypeError for anything else, naming its type.
std::vector<std::string> field_names_of(const py::handle& fields);
// Record indices from any integer sequence or array, as int64; also a boolean mask of
// `mask_length` entries (the records), where one is taken (mask_length >= 0).
std::vector<int64_t> indices_of(const py::handle& indices, int64_t mask_length = -1);

// Whether `value` is an int or numpy integer. A bool is not, numpy's neither (numpy 1.x gives
// np.bool_ an __index__): batch_size=True is a mistake, not 1.
inline bool is_integer(const py::object& value) {
  const std::string_view type_name = Py_TYPE(value.ptr())->tp_name;
  return !PyBool_Check(value.ptr()) && type_name != "numpy.bool_" && type_name != "numpy.bool" &&
         PyIndex_Check(value.ptr());
}

// An int argument (or np.int64) into T, by name: pybind11 would answer a value out of T's range
// (epoch=2**63, world_size=2**31) with its whole overload text. The loader checks the meaning.
template <typename T>
T integer_argument(const py::object& value, const char* name) {
  if (!is_integer(value))
    throw py::type_error(std::string(name) + " must be an int, got " + Py_TYPE(value.ptr())->tp_name);
  const py::object number = py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (!number) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(number.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow != 0 || v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max())
    throw py::value_error(std::string(name) + " = " + py::str(number).cast<std::string>() + " is out of range (" +
                          std::to_string(std::numeric_limits<T>::min()) + " to " +
                          std::to_string(std::numeric_limits<T>::max()) + ")");
  return static_cast<T>(v);
}

// A record or chunk index argument (an int or numpy integer; negative ones are the callee's to
// read) as int64: TypeError for other types, IndexError past int64 (ds[2**63] says so too),
// where pybind11 would answer with its whole overload text.
inline int64_t index_argument(const py::object& value, const char* name) {
  if (!is_integer(value))
    throw py::type_error(std::string(name) + " must be an int, got " + Py_TYPE(value.ptr())->tp_name);
  int overflow = 0;
  const long long v = index_value(value, overflow);
  if (overflow) throw py::index_error(std::string(name) + " " + py::str(value).cast<std::string>() + " is out of range");
  return static_cast<int64_t>(v);
}

// A writer's figures as a dict: records, chunks, bytes_in, bytes_out, seconds.
py::dict stats_dict(const WriteStats& stats);

// ReadAhead from its Python spelling: "auto", "always" or "never".
ReadAhead parse_read_ahead(const std::string& text);

// A file path from a str, bytes or any os.PathLike (pathlib.Path), as the file system's bytes
// (os.fsencode): a name that is not UTF-8 (b'caf\xe9.mmt', or its str with surrogate escapes)
// opens as open() would open it.
std::string path_of(const py::handle& path);
// A path back to Python as os.fsdecode gives it: a str, its non-UTF-8 bytes as surrogate
// escapes, so that path_of(path_object(p)) == p.
py::object path_object(const std::string& path);
// A field name (a str) as the UTF-8 the schema holds. A lone surrogate ('\udcff', what
// os.fsdecode makes of a byte that is not UTF-8) is kept as surrogatepass encodes it, bytes no
// field of a file is named: the lookup then says "unknown field", where a cast raised
// "Unable to cast Python instance".
std::string name_text(const py::handle& name);
// A metadata= argument: a mapping of str to str (None: none), its text as UTF-8 (a lone
// surrogate passed through, for the writer to refuse naming the key); TypeError naming the
// entry that is not, where pybind11 would answer with its whole overload text.
Metadata metadata_argument(const py::object& value);
// Text for Python that may hold bytes that are not UTF-8 (a path in a message, a repr): those
// shown as \xNN, where a plain cast would raise UnicodeDecodeError instead.
py::str lenient_text(const std::string& text);

// Inside a catch of the engine's IoError from creating `path` (a writer, a pack): an existing
// target (EEXIST, overwrite not asked for) in this API's words, since the engine's advice
// names the C++ option; anything else as it was.
[[noreturn]] void rethrow_create_error(const IoError& e, const std::string& path, bool overwrite);

void bind_tensor(py::module_& m);
void bind_dataset(py::module_& m);
void bind_writer(py::module_& m);
void bind_loader(py::module_& m);
void bind_pack(py::module_& m);

}  // namespace mmt::python
