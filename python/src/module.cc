// The _mmtensor extension module: the classes, and mmtensor's errors as Python exceptions.
//
// Errors follow Python's conventions, as NumPy's and h5py's do: a bad index raises
// IndexError, a bad argument ValueError, a refused system call OSError with its errno (so a
// loader's timeout is a TimeoutError and a missing file a FileNotFoundError). A damaged or
// foreign file raises mmtensor.FormatError (mmtensor.ChecksumError when a checksum does not
// match), and CUDA failures mmtensor.CudaError; all three derive from mmtensor.Error.
#include <cerrno>
#include <string_view>

#include "bindings.h"

namespace mmt::python {
namespace {

PyObject* new_exception(py::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("mmtensor.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (!type) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(type));
  return type;
}

}  // namespace
}  // namespace mmt::python

using namespace mmt::python;

PYBIND11_MODULE(_mmtensor, m) {
  m.doc() = "mmtensor: memory-mapped datasets for ML training (the C++ engine's Python API)";
  m.attr("__version__") = std::string(mmt::version());

  static PyObject* error = new_exception(m, "Error", PyExc_Exception, "Base of mmtensor's own errors.");
  static PyObject* format_error = new_exception(m, "FormatError", error,
                                                "A file's bytes are not what the format promises: truncated, corrupt, foreign.");
  static PyObject* checksum_error = new_exception(m, "ChecksumError", format_error,
                                                  "A chunk's or structure's checksum does not match its bytes.");
  static PyObject* cuda_error = new_exception(m, "CudaError", py::make_tuple(py::handle(error), py::handle(PyExc_RuntimeError)).release().ptr(),
                                              "A CUDA runtime call failed, or CUDA is not available.");

  py::register_exception_translator([](std::exception_ptr p) {
    // A message naming a file whose name is not UTF-8 shows those bytes as \xNN: PyErr_SetString
    // would fail to decode it and raise a UnicodeDecodeError in the error's place.
    const auto raise = [](PyObject* type, const char* what) { PyErr_SetObject(type, lenient_text(what).ptr()); };
    try {
      if (p) std::rethrow_exception(p);
    } catch (const mmt::IndexError& e) {
      raise(PyExc_IndexError, e.what());
    } catch (const mmt::ValueError& e) {
      raise(PyExc_ValueError, e.what());
    } catch (const mmt::IoError& e) {
      // OSError(errno, message) picks the subclass: FileNotFoundError, TimeoutError...
      py::object args = e.errno_value() ? py::make_tuple(e.errno_value(), lenient_text(e.what()))
                                        : py::make_tuple(lenient_text(e.what()));
      PyErr_SetObject(PyExc_OSError, args.ptr());
    } catch (const mmt::ChecksumError& e) {
      raise(checksum_error, e.what());
    } catch (const mmt::FormatError& e) {
      raise(format_error, e.what());
    } catch (const mmt::CudaError& e) {
      raise(cuda_error, e.what());
    } catch (const mmt::Error& e) {
      // The engine reports a failed allocation as an Error that starts so; Python's word for
      // it is MemoryError.
      if (std::string_view(e.what()).starts_with("out of memory")) raise(PyExc_MemoryError, e.what());
      else raise(error, e.what());
    }
  });

  bind_tensor(m);
  bind_dataset(m);
  bind_writer(m);
  bind_loader(m);
  bind_pack(m);

  m.def("cuda_is_available", &mmt::cuda_is_available, "Whether a CUDA device is present and mmtensor was built with CUDA");
}
