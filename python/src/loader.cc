// mmtensor.Loader and its Batch, from Python.
//
// The loader's workers are C++ threads that never take the GIL; next() releases it while it
// waits, so a training loop's other Python threads run meanwhile. A batch's tensors hold the
// batch: its ring slot is refilled only once every Python object viewing it is gone (or
// release() is called), so a NumPy array or torch tensor made from a batch never sees the
// next batch's bytes. Per-sample transforms come as C functions (mmtensor.Transform): a Python
// function called from the workers would serialise them on the GIL.
#include <pybind11/stl.h>

#include <cmath>
#include <atomic>
#include <csignal>
#include <limits>
#include <mutex>
#include <thread>

#include "bindings.h"

namespace mmt::python {

namespace {

// One thread drives a C++ Loader; the mutex makes calls from several Python threads take
// turns instead of racing. It is taken with the GIL released, so a thread waiting for it
// never holds up the thread inside next().
struct PyLoader {
  // What keeps the transforms' C functions alive (numba CFuncs, ctypes functions and their
  // libraries): declared before `loader`, so the workers that call them are joined first.
  std::vector<py::object> transform_owners;
  std::unique_ptr<Loader> loader;
  std::optional<Dataset> dataset;  // what load_state_dict() makes its new loader over
  ForkAwareMutex mutex;  // see bindings.h
  // The thread running Python signal handlers from inside this loader's next() (its poll),
  // which holds `mutex` already: its handlers may read the loader without taking it again.
  // A thread id, not a thread_local pointer: a handler may drive another loader, whose own
  // handlers may then read this one.
  std::atomic<std::thread::id> polling_thread{};
  // set_epoch() and load_state_dict() calls: a loop under way ends at either (_EpochIterator).
  std::atomic<uint64_t> moves{0};
  // A batch next() took, whose return a Python signal handler's exception cut off (a signal
  // that came after the engine's last poll ran its handler as next() was returning): the next
  // call hands it out, and until then state() and epoch stand before it, so that a checkpoint
  // written where that exception is caught loses nothing. Read and written with the GIL held.
  py::object pending;  // the Batch object; empty when none
  LoaderState state_before_pending;
  // The thread running Python signal handlers as its next() returns a batch (which is pending
  // meanwhile, see next_batch), without `mutex`: its handlers may read the loader, as any
  // reader does, but not move it.
  std::atomic<std::thread::id> returning_thread{};

  bool polled_by_this_thread() const { return polling_thread.load() == std::this_thread::get_id(); }
  bool in_signal_handler_of_next() const {
    return polled_by_this_thread() || returning_thread.load() == std::this_thread::get_id();
  }

  Loader& get() {
    if (!loader) throw py::value_error("Loader: closed");
    return *loader;
  }

  // Destroyed by Python with the GIL held: the workers are joined without it, as close() does,
  // so that joining them never waits on the GIL this thread holds (Transform refuses ctypes
  // callbacks into Python, but a C function may still take the GIL). Not while the
  // interpreter shuts down, when no other thread may take the GIL.
  ~PyLoader() {
    if (interpreter_finalizing() || !PyGILState_Check()) pending.release();  // no reference to drop without the GIL
    pending = py::object();
    if (!loader) return;
    if (interpreter_finalizing() || !PyGILState_Check()) {
      loader.reset();
      return;
    }
    py::gil_scoped_release release;
    loader.reset();
  }
};

// The Python Batch holds one reference to the C++ batch; every tensor taken from it holds
// another, and the ring slot goes back to the loader when the last of them goes. release()
// drops the Batch object's own reference only, so arrays still viewing the slot keep it:
// the workers never refill memory a NumPy array or torch tensor still shows.
struct PyBatch {
  std::shared_ptr<Batch> batch;

  const Batch& get() const {
    if (!batch || !batch->valid()) throw py::value_error("Batch: this batch was released");
    return *batch;
  }
};

struct PyEpochIterator {
  py::object loader;  // the Python Loader, kept alive
  int64_t epoch = 0;  // the epoch it runs through
  uint64_t moves = 0;  // the loader's set_epoch() and load_state_dict() calls when it began
  bool done = false;
};

// A handler run from a loader's next() may read the loader (state() for a checkpoint on
// SIGTERM, say) on its own thread, but not move it.
void refuse_in_signal_handler(const PyLoader& self, const char* what) {
  if (self.in_signal_handler_of_next())
    throw py::value_error(std::string("Loader.") + what + ": called from a signal handler while next() waits for "
                          "a batch; a handler may read the loader (state(), state_dict(), epoch, len()) but not move "
                          "it: raise from the handler, and call " + what + " once next() has left");
}

// Thrown by next()'s poll when a Python signal handler raised: the engine leaves next() with
// the batch still first in line, and the handler's exception is raised in its place.
struct SignalHandlerRaised {};

py::object next_batch(PyLoader& self) {
  refuse_in_signal_handler(self, "next");
  // Signals are answered while next() waits: their Python handlers run then, so that next()
  // neither waits for a slow gather before a handler's exception (Ctrl-C's KeyboardInterrupt,
  // a SIGALRM timeout, a SIGTERM of preemption) nor loses the batch. Run only once next() had
  // returned, a handler that raised dropped the batch that state() already counted. Only on
  // the main thread: handlers run there, and a daemon thread taking the GIL while the
  // interpreter exits is ended by it, which without_gil cannot let through. (A signal that
  // comes after the engine's last poll is answered below, before the batch is returned.)
  const bool answer_signals = on_main_thread();
  std::optional<py::error_already_set> handler_error;
  const std::function<void()> poll = [&] {
    py::gil_scoped_acquire gil;
    self.polling_thread.store(std::this_thread::get_id());
    const int raised = PyErr_CheckSignals();
    self.polling_thread.store(std::thread::id());
    if (raised != 0) {
      handler_error.emplace();  // fetches the handler's exception
      throw SignalHandlerRaised{};
    }
  };
  // Taken by the call a handler's exception cut off; not while a thread's handlers run as its
  // next() returns it (one that sleeps lets this thread in).
  if (self.pending && self.returning_thread.load() == std::thread::id()) {
    return std::move(self.pending);  // leaves it empty
  }
  LoaderState state_before;
  const auto take = [&] {
    return without_gil([&] {
      std::lock_guard lock(self.mutex);
      state_before = self.get().state();
      return answer_signals ? self.get().next(poll) : self.get().next();
    });
  };
  const auto every_slot_held = [](const ValueError& e) {
    return std::string_view(e.what()).find("slots are held") != std::string_view::npos;
  };
  std::optional<Batch> batch;
  for (bool collected = false;;) {
    try {
      batch = take();
      break;
    } catch (const SignalHandlerRaised&) {
      // A handler that does not raise lets next() go on waiting.
      throw std::move(*handler_error);
    } catch (const ValueError& e) {
      if (!every_slot_held(e)) throw;
      // Every slot held. A batch's tensors caught in a reference cycle (a traceback kept in a
      // local, say) hold their slot until the cycle collector runs: run it, and try again.
      if (!collected) {
        collected = true;
        py::module_::import("gc").attr("collect")();
        continue;
      }
      // Still every slot held: from Python that is tensors (or arrays made from them) kept from
      // earlier batches, which the C++ advice (release a batch) does not cover.
      throw py::value_error(std::string(e.what()) +
                            ". From Python: tensors, NumPy arrays and torch tensors viewing earlier batches hold "
                            "their slots; keep copies (np.array(t), t.clone()) of what you keep across steps");
    }
  }
  if (!batch) return py::none();
  // A signal that came after the engine's last poll (a batch ready at once is taken without
  // one; and the GIL is taken back after) is answered here, before the batch is returned: a
  // handler raising once it had been would drop a batch state() already counted. Kept for the
  // next call instead. (What comes in the few microseconds left until the caller has it is
  // Python's to answer, as for any call that returns a value.)
  // The Python object is made first, so that nothing is left to do after the check; and it is
  // pending while the handlers run, so that one saving state() (a checkpoint, then raise) saves
  // the state before it, as the next call will hand it out.
  py::object result = py::cast(PyBatch{std::make_shared<Batch>(std::move(*batch))});
  if (answer_signals) {
    self.pending = result;
    self.state_before_pending = state_before;
    self.returning_thread.store(std::this_thread::get_id());
    const int raised = PyErr_CheckSignals();
    self.returning_thread.store(std::thread::id());
    if (raised != 0) throw py::error_already_set();  // the batch stays pending
    if (self.pending.is(result)) self.pending = py::object();
  }
  return result;
}

py::object batch_field(const PyBatch& self, const std::string& name) {
  const Batch& b = self.get();
  const auto& names = b.field_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    try {
      (void)b[name];  // the engine's message, which lists the batch's fields
    } catch (const ValueError& e) {
      throw py::key_error(e.what());
    }
  }
  if (b.is_ragged(name)) return wrap_ragged(b.ragged(name), self.batch);
  return wrap(b[name], self.batch);
}

// fn(loader) under the loader's mutex, taken with the GIL released.
template <typename Fn>
auto with_lock(PyLoader& self, Fn&& fn) {
  if (self.polled_by_this_thread()) return fn(self.get());  // a signal handler's read: the lock is this thread's
  return without_gil([&] {
    std::lock_guard lock(self.mutex);
    return fn(self.get());
  });
}

// Where the loader stands for Python: before a pending batch (see PyLoader::pending).
LoaderState python_state(PyLoader& self) {
  if (self.pending) return self.state_before_pending;
  return with_lock(self, [](Loader& l) { return l.state(); });
}
int64_t python_epoch(PyLoader& self) {
  if (self.pending) return self.state_before_pending.epoch;
  return with_lock(self, [](Loader& l) { return l.epoch(); });
}

// A saved state as Loader(state=) and load_state_dict() take it: the JSON text state() gives,
// or the dict state_dict() gives (or json.loads made of the text).
LoaderState state_of(const py::object& state) {
  if (py::isinstance<py::str>(state)) return LoaderState::parse(state.cast<std::string>());
  if (!py::isinstance<py::dict>(state))
    throw py::type_error(std::string("a loader state is the text state() returns or the dict state_dict() returns, not ") +
                         Py_TYPE(state.ptr())->tp_name);
  return LoaderState::parse(py::module_::import("json").attr("dumps")(state).cast<std::string>());
}

// mmtensor.Transform: a SampleTransform whose fn is a C function (loader.h, mmt_transform_fn),
// and the Python object that owns that function's code.
struct PyTransform {
  SampleTransform transform;
  py::object owner;
};

// The address a Transform's fn= gives: an int, a numba CFunc (its .address), or a ctypes
// function (a library's symbol, or a CFUNCTYPE object).
mmt_transform_fn c_function_of(const py::object& fn) {
  py::object address = fn;
  const py::module_ ctypes = py::module_::import("ctypes");
  if (py::hasattr(fn, "address") && py::hasattr(fn, "native_name")) {  // numba.core.ccallback.CFunc
    address = fn.attr("address");
  } else if (py::isinstance(fn, ctypes.attr("_CFuncPtr"))) {
    // A CFUNCTYPE around a Python function (its _objects hold the thunk) takes the GIL on
    // every call: the workers would run one at a time, and wait on a thread that holds the
    // GIL while it waits for them.
    const py::object objects = py::getattr(fn, "_objects", py::none());
    if (py::isinstance<py::dict>(objects))
      for (const auto& [key, value] : objects.cast<py::dict>())
        if (std::string_view(Py_TYPE(value.ptr())->tp_name).ends_with("CThunkObject"))
          throw py::type_error("Transform: fn is a ctypes callback around a Python function, which would take the "
                               "GIL on the loader's threads; give a compiled function (numba @cfunc, a shared "
                               "library's symbol)");
    address = ctypes.attr("cast")(fn, ctypes.attr("c_void_p")).attr("value");
  }
  if (PyBool_Check(address.ptr()) || !PyIndex_Check(address.ptr()))
    throw py::type_error(std::string("Transform: fn must be a C function: a numba @cfunc, a ctypes function or an "
                                     "address (int), not ") + Py_TYPE(fn.ptr())->tp_name);
  uint64_t value = 0;
  try {
    value = address.cast<uint64_t>();
  } catch (const py::cast_error&) {
    throw py::value_error("Transform: fn's address " + py::str(address).cast<std::string>() + " is not in [1, 2**64)");
  }
  if (value == 0) throw py::value_error("Transform: fn is a null function pointer");
  return reinterpret_cast<mmt_transform_fn>(static_cast<uintptr_t>(value));
}

// Loader(mixture=...): one weight per part of the dataset ([0.3, 0.7]), or sources as
// (start, stop, weight) record ranges ([(0, 500, 1.0), (500, 800, 2.0)]).
Mixture mixture_of(const py::object& mixture, const Dataset& dataset, int64_t epoch_size) {
  const auto refuse = [](const std::string& what) {
    throw py::type_error("mixture must be a list of weights, one per part of the dataset, or of (start, stop, weight) "
                         "record ranges; " + what);
  };
  if (!py::isinstance<py::sequence>(mixture) || py::isinstance<py::str>(mixture))
    refuse(std::string("got ") + Py_TYPE(mixture.ptr())->tp_name);
  // A bool (Python's or NumPy's) is a number to Python, but not a weight anyone means.
  const auto is_bool = [](const py::handle& value) {
    const std::string_view type = Py_TYPE(value.ptr())->tp_name;
    return PyBool_Check(value.ptr()) || type == "numpy.bool_" || type == "numpy.bool";
  };
  const auto weight_of = [&](const py::handle& value, size_t i) {
    if (!PyNumber_Check(value.ptr()) || is_bool(value) || PyComplex_Check(value.ptr()))
      refuse("entry " + std::to_string(i) + " has a " + Py_TYPE(value.ptr())->tp_name + ", not a weight");
    const double weight = PyFloat_AsDouble(value.ptr());
    if (weight == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      throw py::value_error("mixture entry " + std::to_string(i) + ": the weight " + py::str(value).cast<std::string>() +
                            " is not a finite number");
    }
    return weight;
  };
  const auto record_of = [&](const py::handle& value, size_t i) {
    if (is_bool(value) || !PyIndex_Check(value.ptr()))
      refuse("entry " + std::to_string(i) + " has a " + Py_TYPE(value.ptr())->tp_name + " where a record number goes");
    try {
      return value.cast<int64_t>();
    } catch (const py::cast_error&) {
      throw py::value_error("mixture entry " + std::to_string(i) + ": record " + py::str(value).cast<std::string>() +
                            " is out of range");
    }
  };
  const auto entries = mixture.cast<py::sequence>();
  const bool ranges = entries.size() > 0 && py::isinstance<py::sequence>(entries[0]) && !py::isinstance<py::str>(entries[0]);
  std::vector<double> weights;
  Mixture out{.epoch_size = epoch_size};
  for (size_t i = 0; i < entries.size(); ++i) {
    const py::object entry = entries[i];
    if (!ranges) {
      weights.push_back(weight_of(entry, i));
      continue;
    }
    if (!py::isinstance<py::sequence>(entry) || py::isinstance<py::str>(entry) || py::len(entry) != 3)
      refuse("entry " + std::to_string(i) + " is not a (start, stop, weight) triple");
    const auto triple = entry.cast<py::sequence>();
    const int64_t start = record_of(triple[0], i), stop = record_of(triple[1], i);
    if (start < 0 || stop < start)
      throw py::value_error("mixture entry " + std::to_string(i) + ": records [" + std::to_string(start) + ", " +
                            std::to_string(stop) + ") are not a range of records");
    out.sources.push_back({.first_record = start, .num_records = stop - start, .weight = weight_of(triple[2], i)});
  }
  return ranges ? out : Mixture::of_parts(dataset, std::move(weights), epoch_size);
}

}  // namespace

void bind_loader(py::module_& m) {
  py::class_<PyBatch>(m, "Batch", R"doc(
A batch on loan from its loader: a mapping from field name to a [B, ...] Tensor (fixed
fields) or a RaggedBatch (ragged fields), in host memory or on the loader's CUDA device.
Tensors taken from it (and NumPy arrays or torch tensors made from those) keep its ring slot:
the loader refills a slot only when nothing views it. release(), or the end of
`with loader.next() as batch:`, lets the Batch object go; the slot follows with its last
tensor. Keeping tensors of many batches runs the ring out of slots: copy what you keep
(np.array(t), t.clone()).)doc")
      .def("__getitem__", [](const PyBatch& self, const py::object& field) { return batch_field(self, name_text(field)); },
           py::arg("field"))
      .def("__contains__", [](const PyBatch& self, const py::object& name) {
        if (!py::isinstance<py::str>(name)) return false;
        const auto& names = self.get().field_names();
        return std::find(names.begin(), names.end(), name_text(name)) != names.end();
      })
      .def("get", [](const PyBatch& self, const py::object& field, const py::object& fallback) -> py::object {
        const std::string name = name_text(field);
        const auto& names = self.get().field_names();
        if (std::find(names.begin(), names.end(), name) == names.end()) return fallback;
        return batch_field(self, name);
      }, py::arg("field"), py::arg("default") = py::none())
      .def("keys", [](const PyBatch& self) { return self.get().field_names(); })
      .def("__iter__", [](const PyBatch& self) { return py::iter(py::cast(self.get().field_names())); })
      .def("__len__", [](const PyBatch& self) { return self.get().field_names().size(); })
      .def("values", [](const PyBatch& self) {
        py::list out;
        for (const std::string& name : self.get().field_names()) out.append(batch_field(self, name));
        return out;
      })
      .def("items", [](const PyBatch& self) {
        py::list out;
        for (const std::string& name : self.get().field_names()) out.append(py::make_tuple(name, batch_field(self, name)));
        return out;
      })
      .def_property_readonly("size", [](const PyBatch& self) { return self.get().size(); }, "Rows: batch_size, or fewer")
      .def_property_readonly("epoch", [](const PyBatch& self) { return self.get().epoch(); })
      .def_property_readonly("number", [](const PyBatch& self) { return self.get().number(); },
                             "The batch's number in this rank's epoch, counted from where the loader started it "
                             "(0 for the epoch's first batch, or for the first batch after a resume)")
      .def_property_readonly("device", [](const PyBatch& self) { return self.get().device().str(); })
      .def_property_readonly("indices", [](const PyBatch& self) {
        // A copy: the indices live in the loader, which may be gone before this tensor.
        const std::span<const int64_t> indices = self.get().indices();
        Tensor out = empty({static_cast<int64_t>(indices.size())}, kInt64);
        std::copy(indices.begin(), indices.end(), out.mutable_data_ptr<int64_t>());
        return wrap(std::move(out));
      }, "The record index of each row (int64 [B])")
      .def("state", [](const PyBatch& self) { return self.get().state().to_string(); },
           "The loader's state just after this batch (JSON): Loader(..., state=...) continues after it")
      .def("synchronize", [](const PyBatch& self) {
        self.get();
        std::shared_ptr<Batch> batch = self.batch;  // alive even if another thread releases meanwhile
        without_gil([&] { batch->synchronize(); });
      }, "CUDA: waits until the batch is on the device")
      .def("wait", [](PyBatch& self, int64_t stream) {
        self.get();
        self.batch->wait(reinterpret_cast<CUstream_st*>(static_cast<intptr_t>(stream)));
      }, py::arg("stream"), R"doc(
CUDA: makes `stream` (a cudaStream_t as an int: torch's stream.cuda_stream) wait for the
batch's copy, and the slot's reuse wait for the work queued on it. DLPack consumers
(torch.from_dlpack) do this by themselves; __cuda_array_interface__ ones (CuPy, Numba) on a
stream of their own must call it. A no-op for a cpu batch: a pinned cpu batch copied to a
GPU with non_blocking=True must be kept until that copy is done (or use device="cuda:N",
where the loader makes the copies and orders the slot's reuse itself).)doc")
      .def("release", [](PyBatch& self) { self.batch.reset(); },
           "Lets the batch go: its slot returns to the loader now, or when the last tensor taken from it goes")
      .def("__enter__", [](const py::object& self) { return self; })
      .def("__exit__", [](PyBatch& self, const py::object&, const py::object&, const py::object&) {
        self.batch.reset();
        return false;
      })
      .def("__repr__", [](const PyBatch& self) {
        if (!self.batch || !self.batch->valid()) return std::string("<mmtensor.Batch (released)>");
        std::string text = "<mmtensor.Batch " + std::to_string(self.batch->number()) + " of epoch " +
                           std::to_string(self.batch->epoch()) + ": " + std::to_string(self.batch->size()) + " rows;";
        for (const std::string& name : self.batch->field_names()) text += " " + name;
        return text + ">";
      });

  py::class_<PyEpochIterator>(m, "_EpochIterator")
      .def("__iter__", [](const py::object& self) { return self; })
      .def("__next__", [](PyEpochIterator& self) {
        PyLoader& loader = self.loader.cast<PyLoader&>();
        // Its epoch ended some other way (an inner loop over the loader ran it out), or
        // set_epoch() or load_state_dict() moved the loader: this loop is over, rather than
        // running on into the next epoch or through a restarted one.
        if (!self.done && (loader.moves != self.moves || python_epoch(loader) != self.epoch))
          self.done = true;
        if (self.done) throw py::stop_iteration();
        py::object batch = next_batch(loader);
        if (batch.is_none()) {
          self.done = true;
          throw py::stop_iteration();
        }
        return batch;
      });

  py::class_<PyTransform>(m, "Transform", R"doc(
A per-sample transform the loader's threads run, without the GIL: a C function that fills one
batch field from a record's fields, compiled by numba or loaded from a shared library.

    from numba import cfunc, carray, types
    sig = types.int32(types.CPointer(types.CPointer(types.uint8)),   # inputs
                      types.CPointer(types.CPointer(types.int64)),   # their shapes
                      types.CPointer(types.int32), types.int32,      # their ndims, how many
                      types.CPointer(types.uint8), types.uint64, types.int64)  # output, seed, index
    @cfunc(sig)
    def normalise(inputs, shapes, ndims, count, output, seed, index):
        pixels = carray(inputs[0], (784,))
        values = carray(output, (784 * 4,)).view(np.float32)
        for k in range(784):
            values[k] = pixels[k] / 255.0
        return 0                                 # any other value fails the sample
    t = mmtensor.Transform("image", inputs=["image"], dtype="float32", shape=[1, 28, 28],
                           fn=normalise)         # or a ctypes function, or an address
    loader = mmtensor.Loader(ds, batch_size=256, transforms=[t], num_workers=4)

inputs are the record's fields, contiguous in row-major order; output the sample's `shape`
values of `dtype`. seed is fixed by (sampler seed, epoch, position): augmentations seeded by it
do not depend on the number of workers. fn runs on several threads at once and must not call
into Python (a ctypes callback around a Python function would take the GIL). The Transform
keeps fn's owner (the numba function, the ctypes library) alive while a loader uses it.)doc")
      .def(py::init([](const std::string& name, const py::object& inputs, const py::object& dtype,
                       const std::vector<int64_t>& shape, const py::object& fn) {
             PyTransform out;
             out.transform = SampleTransform::from_c(name, field_names_of(inputs), parse_dtype(dtype),
                                                     DimVector(shape), c_function_of(fn));
             out.owner = fn;
             return out;
           }),
           py::arg("name"), py::kw_only(), py::arg("inputs"), py::arg("dtype"), py::arg("shape"), py::arg("fn"))
      .def_property_readonly("name", [](const PyTransform& t) { return t.transform.name; })
      .def_property_readonly("inputs", [](const PyTransform& t) { return t.transform.inputs; })
      .def_property_readonly("shape", [](const PyTransform& t) {
        return std::vector<int64_t>(t.transform.shape.begin(), t.transform.shape.end());
      })
      .def("__repr__", [](const PyTransform& t) {
        return detail::str("<mmtensor.Transform '", t.transform.name, "' ", to_string(t.transform.dtype),
                           IntArrayRef(t.transform.shape), ">");
      });

  py::class_<PyLoader>(m, "Loader", R"doc(
Batches of a Dataset, gathered by worker threads into a pinned staging ring and, with
device="cuda:N", copied to the GPU asynchronously.

    loader = mmtensor.Loader(ds, batch_size=256, sampler="random", seed=7, num_workers=4)
    for epoch in range(10):
        loader.set_epoch(epoch)
        for batch in loader:                         # one epoch
            x = torch.from_dlpack(batch["image"])    # no copy; on the GPU with device="cuda:0"

sampler: "sequential", "random" or "quasi_random" (chunk-aware: each compressed chunk is
decoded once an epoch). rank/world_size split each epoch as DistributedSampler does; subset
limits it to a list of records (negative from the end, as ds[i] takes them; or a boolean
mask). mixture draws each epoch from several sources in proportion to weights, as MosaicML
Streaming's Stream(proportion=) and LitData's CombinedStreamingDataset(weights=) do: one
weight per part of a concatenation (Dataset([a, b]) with mixture=[0.3, 0.7]), or
(start, stop, weight) record ranges; epoch_size sets the positions an epoch has (default:
the sources' records added up). A source given more positions than it has records repeats
each of them evenly; one given fewer draws that many distinct records, others each epoch
with sampler="random" (and "quasi_random", which takes them chunk by chunk and keeps its
locality). state() after any batch (JSON text; state_dict() gives it as a dict) resumes exactly
there: Loader(ds, ..., state=text), or load_state_dict() on this loader. timeout (seconds):
how long next() waits before TimeoutError (None or math.inf: for ever). pin_memory: pinned host batches; by default when
a CUDA device exists. pin_mapping=True (device="cuda:N" only): uncompressed fixed fields of
16 KB or more a record go from the page-locked file mapping straight to the device, with no
gather on the host; the files are read into memory and locked there while the loader lives, so
they must fit in RAM, and one cut short under it kills the process (SIGBUS, as a memmap). num_workers: threads, not processes; next() gathers rows of the batch
it waits for too, so on C cores C - 1 workers keep every core busy for warm, uncompressed
data.

window_chunks (quasi_random): chunks whose records are shuffled together; 0 chooses as many
as the chunk cache holds decoded, or a resumed state's. drop_tail (with world_size): drop the
epoch's last positions that do not divide among the ranks, where by default the first ones
are repeated to fill them, as DistributedSampler's drop_last. drop_last: leave out a last
batch shorter than batch_size. prefetch_batches (1 to 1024): batches gathered ahead; the
pinned ring has one slot more. read_ahead: "auto" (the default) asks the kernel for a batch's
pages ahead of its gather while the page cache misses, "always" for every batch, "never" not
(a cold file read at random is several times faster with it).

transforms=[mmtensor.Transform(...)] fill batch fields on the workers with C functions (numba
@cfunc or a shared library's), per sample and without the GIL; help(mmtensor.Transform).

`for batch in loader` runs through the rest of the current epoch: after a break, the next
loop picks up where that one stopped; set_epoch(e) starts an epoch over. A cpu batch copied
to a GPU with non_blocking=True must be kept until the copy is done; device="cuda:N" makes
the copies on the loader's side and orders the slot's reuse after them. close() (or a with
block) stops the workers.)doc")
      .def(py::init([](const Dataset& dataset, const py::object& batch_size, const py::object& fields,
                       const std::string& sampler, const py::object& seed, const py::object& window_chunks,
                       const py::object& rank, const py::object& world_size,
                       bool drop_tail, const py::object& subset, const py::object& mixture, const py::object& epoch_size,
                       const py::object& epoch, bool drop_last, const py::object& num_workers,
                       const py::object& prefetch_batches, const std::string& device, std::optional<bool> pin_memory, const std::string& read_ahead,
                       std::optional<double> timeout, const py::object& state, const py::object& transforms, bool pin_mapping) {
             LoaderOptions options;
             std::vector<py::object> transform_owners;
             if (!transforms.is_none()) {
               for (const py::handle& item : transforms) {
                 if (!py::isinstance<PyTransform>(item))
                   throw py::type_error(std::string("transforms must be mmtensor.Transform objects, not ") +
                                        Py_TYPE(item.ptr())->tp_name);
                 const auto& transform = item.cast<const PyTransform&>();
                 options.transforms.push_back(transform.transform);
                 transform_owners.push_back(transform.owner);
               }
             }
             options.batch_size = integer_argument<int64_t>(batch_size, "batch_size");
             options.fields = field_names_of(fields);  // fields="image" names one
             const auto kind = sampler_kind_from_string(sampler);
             if (!kind) throw py::value_error("sampler must be 'sequential', 'random' or 'quasi_random', not '" + sampler + "'");
             options.sampler.kind = *kind;
             // An int (or np.int64) in [0, 2**64); pybind11 would refuse -1 with its whole
             // overload text.
             if (!is_integer(seed))
               throw py::type_error(std::string("seed must be an int, got ") + Py_TYPE(seed.ptr())->tp_name);
             const py::object seed_int = py::reinterpret_steal<py::object>(PyNumber_Index(seed.ptr()));
             if (!seed_int) throw py::error_already_set();
             const unsigned long long seed_value = PyLong_AsUnsignedLongLong(seed_int.ptr());
             if (seed_value == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
               PyErr_Clear();
               throw py::value_error("seed must be in [0, 2**64), got " + py::str(seed).cast<std::string>());
             }
             options.sampler.seed = seed_value;
             options.sampler.window_chunks = integer_argument<int64_t>(window_chunks, "window_chunks");
             options.sampler.rank = integer_argument<int>(rank, "rank");
             options.sampler.world_size = integer_argument<int>(world_size, "world_size");
             options.sampler.drop_tail = drop_tail;
             if (!subset.is_none()) {
               // Negative from the end, as ds[i] and get_batch take them (torch's Subset too);
               // the rest of the checks are the sampler's, naming the entry.
               std::vector<int64_t> records;
               try {
                 records = indices_of(subset, dataset.size());
               } catch (const py::index_error& error) {
                 // Past int64 (2**63) is as far outside the records as 5 of 3 is: one kind of error.
                 throw py::value_error(std::string("subset: ") + error.what() + " (the dataset has " +
                                       std::to_string(dataset.size()) + " records)");
               }
               for (int64_t& record : records)
                 if (record < 0 && record >= -dataset.size()) record += dataset.size();
               options.sampler.subset = IndexList(std::move(records));
             }
             const int64_t positions = integer_argument<int64_t>(epoch_size, "epoch_size");
             if (!mixture.is_none()) options.sampler.mixture = mixture_of(mixture, dataset, positions);
             else if (positions != 0) throw py::value_error("epoch_size is the size of a mixture's epoch: give mixture= too");
             options.epoch = integer_argument<int64_t>(epoch, "epoch");
             options.drop_last = drop_last;
             options.num_workers = integer_argument<int>(num_workers, "num_workers");
             options.prefetch_batches = integer_argument<int>(prefetch_batches, "prefetch_batches");
             options.device = Device::parse(device);
             // Unsaid: pinned where pinning means something (a CUDA device is present), so a
             // CPU-only machine gets no note about falling back.
             options.pin_memory = pin_memory.value_or(options.device.is_cuda() || cuda_is_available());
             options.pin_mapping = pin_mapping;
             options.read_ahead = parse_read_ahead(read_ahead);
             if (timeout && std::isinf(*timeout) && *timeout > 0) timeout.reset();  // wait for ever, as None
             if (timeout) {
               if (!(*timeout >= 0) || *timeout > 1e9)
                 throw py::value_error("timeout must be a number of seconds >= 0 and at most 1e9, or None (or "
                                       "math.inf) to wait for ever, got " + py::repr(py::float_(*timeout)).cast<std::string>());
               options.timeout = std::chrono::milliseconds(static_cast<int64_t>(*timeout * 1000.0 + 0.5));
               if (*timeout > 0 && options.timeout.count() == 0) options.timeout = std::chrono::milliseconds(1);
             }
             std::optional<LoaderState> resume;
             if (!state.is_none()) resume = state_of(state);
             auto self = std::make_unique<PyLoader>();
             self->transform_owners = std::move(transform_owners);
             self->dataset = dataset;
             self->loader = without_gil([&] {
               return resume ? std::make_unique<Loader>(dataset, std::move(options), *resume)
                             : std::make_unique<Loader>(dataset, std::move(options));
             });
             return self;
           }),
           py::arg("dataset"), py::kw_only(), py::arg("batch_size") = 1, py::arg("fields") = py::none(),
           py::arg("sampler") = "sequential", py::arg("seed") = 0, py::arg("window_chunks") = 0, py::arg("rank") = 0,
           py::arg("world_size") = 1, py::arg("drop_tail") = false, py::arg("subset") = py::none(),
           py::arg("mixture") = py::none(), py::arg("epoch_size") = 0, py::arg("epoch") = 0,
           py::arg("drop_last") = false, py::arg("num_workers") = 1, py::arg("prefetch_batches") = 3,
           py::arg("device") = "cpu", py::arg("pin_memory") = py::none(), py::arg("read_ahead") = "auto",
           py::arg("timeout") = py::none(), py::arg("state") = py::none(), py::arg("transforms") = py::none(),
           py::arg("pin_mapping") = false)
      .def("next", &next_batch, "The next batch of the epoch, or None at its end (the loader then moves to the next epoch). "
           "Signals are answered while it waits: Ctrl-C raises KeyboardInterrupt without waiting for the whole "
           "batch, and a handler of your own (SIGALRM, SIGTERM) runs then too, and once more before the batch "
           "is returned; one that raises loses nothing: state() stands before the batch, and the next call "
           "returns it. (A signal in the last microsecond, as the call returns, is Python's to answer once it "
           "has: a handler raising then drops the batch, as it drops any call's result.) A handler may read the "
           "loader (state(), state_dict()) but not move it (next, set_epoch, load_state_dict, close)")
      .def("__iter__", [](const py::object& self) {
             PyLoader& loader = self.cast<PyLoader&>();
             return PyEpochIterator{self, python_epoch(loader), loader.moves.load()};
           }, "The rest of the current epoch, batch by batch; it ends with that epoch even when another loop over "
              "the loader (an inner one) took the epoch's last batch, instead of running on into the next")
      .def("__len__", [](PyLoader& self) { return with_lock(self, [](Loader& l) { return l.batches_in_epoch(); }); },
           "Batches this rank yields in the current epoch from where it was started: the whole epoch, "
           "or after a resume the batches left (as batch.number counts from there)")
      .def("set_epoch", [](PyLoader& self, const py::object& epoch_argument) {
        refuse_in_signal_handler(self, "set_epoch");
        const int64_t epoch = integer_argument<int64_t>(epoch_argument, "epoch");
        self.pending = py::object();  // a move: a batch kept for the next call is given up, as others queued are
        with_lock(self, [&](Loader& loader) { loader.set_epoch(epoch); });
        ++self.moves;
      }, py::arg("epoch"), R"doc(
Restarts at the beginning of `epoch` (as DistributedSampler.set_epoch before each epoch). It
does nothing when the loader is there already with no batch taken since it was made: so a
loader resumed mid-epoch from a state keeps its place through the set_epoch(state's epoch)
an epoch loop begins with, while on a loader that has taken batches it restarts the epoch. A
state taken on an epoch's last batch stands at that epoch's end: resumed, set_epoch(that
epoch) gives no batch, and the loop goes on with the next epoch.)doc")
      .def("close", [](PyLoader& self) {
        refuse_in_signal_handler(self, "close");
        self.pending = py::object();
        without_gil([&] {
          std::lock_guard lock(self.mutex);
          self.loader.reset();  // stops and joins the workers; batches still held stay valid
        });
      }, "Stops and joins the workers now (the loader is unusable after); batches still held stay valid")
      .def("__enter__", [](const py::object& self) { return self; })
      .def("__exit__", [](const py::object& self, const py::object&, const py::object&, const py::object&) {
        self.attr("close")();
        return false;
      })
      .def("__repr__", [](PyLoader& self) {
        // Read with the GIL, before it is released: the epoch before a pending batch, as .epoch.
        const std::optional<int64_t> pending_epoch =
            self.pending ? std::optional<int64_t>(self.state_before_pending.epoch) : std::nullopt;
        const auto text = [&] {
          if (!self.loader) return std::string("<mmtensor.Loader (closed)>");
          const LoaderOptions& o = self.loader->options();
          return detail::str("<mmtensor.Loader batch_size=", o.batch_size, " sampler=", to_string(o.sampler.kind),
                             " epoch=", pending_epoch.value_or(self.loader->epoch()), " workers=", o.num_workers,
                             " device=", o.device.str(), ">");
        };
        if (self.polled_by_this_thread()) return text();  // a signal handler's: the lock is this thread's
        return without_gil([&] {
          std::lock_guard lock(self.mutex);  // close() on another thread waits for this
          return text();
        });
      })
      .def_property_readonly("epoch", [](PyLoader& self) { return python_epoch(self); })
      .def("state", [](PyLoader& self) { return python_state(self).to_string(); },
           "Where the loader stands after the last batch next() returned, as JSON text")
      .def("state_dict", [](PyLoader& self) {
        const std::string text = python_state(self).to_string();
        return py::module_::import("json").attr("loads")(text);
      }, "state() as a dict, for checkpoints that collect state_dict()s (torchdata's StatefulDataLoader, "
         "Lightning): load_state_dict() or Loader(state=) resumes it")
      .def("load_state_dict", [](PyLoader& self, const py::object& state) {
        refuse_in_signal_handler(self, "load_state_dict");
        const LoaderState resume = state_of(state);
        without_gil([&] {
          std::lock_guard lock(self.mutex);
          // The new loader first: a state of another dataset or order is refused with this
          // loader untouched. The old one's workers stop as it goes; its batches stay valid.
          auto replacement = std::make_unique<Loader>(*self.dataset, self.get().options(), resume);
          self.loader = std::move(replacement);
          ++self.moves;
        });
        self.pending = py::object();  // with the GIL, once the new loader stands
      }, py::arg("state_dict"), R"doc(
Moves this loader to where `state_dict` (from state_dict(), or the text state() gives) was
taken, as Loader(ds, ..., state=...) with this loader's options would start: the next batch is
the one that followed it. ValueError, and the loader unchanged, when the state belongs to
another dataset or order (records, fingerprint, sampler, seed, subset, window). Batches taken
before stay valid. The new loader is made before the old one stops, so for a moment both
rings (pinned and device memory) exist.)doc")
      .def_property_readonly("ring_slots", [](PyLoader& self) { return with_lock(self, [](Loader& l) { return l.ring_slots(); }); })
      .def_property_readonly("ring_bytes", [](PyLoader& self) { return with_lock(self, [](Loader& l) { return l.ring_bytes(); }); })
      .def("stats", [](PyLoader& self) {
        const LoaderStats s = with_lock(self, [](Loader& l) { return l.stats(); });
        py::dict d;
        d["batches_read_ahead"] = s.batches_read_ahead;
        d["reading_ahead"] = s.reading_ahead;
        return d;
      });
}

}  // namespace mmt::python
