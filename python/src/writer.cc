// mmtensor.DatasetWriter: builds a dataset file from Python values (NumPy arrays, lists,
// numbers, torch CPU tensors, mmtensor Tensors).
//
// Used as a context manager, the file is published by a clean exit and discarded by an
// exception, so a failed script leaves the target path as it was.
#include <pybind11/stl.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <optional>

#include "bindings.h"
#include "utf8.h"  // engine/, for escaped()

namespace mmt::python {

void rethrow_create_error(const IoError& e, const std::string& path, bool overwrite) {
  if (e.errno_value() != EEXIST || overwrite) throw;
  throw IoError(path + " already exists; pass overwrite=True to replace it", EEXIST);
}

namespace {

// The C++ writer (move-only) and what the Python side needs without touching it. One thread
// drives a C++ writer: the mutex makes Python threads that share one take turns. It is taken
// with the GIL released and held only around calls into the writer, never while Python code
// runs (values are converted before), so neither another thread nor this one (a signal
// handler, a __del__) can wait on it forever.
struct PyWriter {
  std::optional<DatasetWriter> writer;  // used under `mutex` only
  bool closed = false;                  // finish() or abort() called; under `mutex`
  Schema schema;                        // the writer's, immutable
  std::atomic<int64_t> appended{0};     // records appended, for messages
  ForkAwareMutex mutex;  // see bindings.h
  const uint64_t made_in_generation = detail::fork_generation();  // a forked child's copy says nothing

  DatasetWriter& get() {
    if (!writer) throw py::value_error("DatasetWriter: closed");
    return *writer;
  }

  // A writer dropped without finish() or abort() publishes nothing (its temporary file is
  // removed): a ResourceWarning says so, as Python says of a file left unclosed, since a
  // script that forgot finish() otherwise ends as if it had written its dataset. Run by
  // pybind11's dealloc, with the GIL held (no other reference exists: no lock needed).
  ~PyWriter() {
    // A writer that failed (an I/O error in append) has nothing to finish: its error said so.
    if (!writer || closed || !writer->is_open() || interpreter_finalizing() ||
        detail::inherited_through_fork(made_in_generation))
      return;
    // Escaped: PyErr_WarnEx decodes the text as UTF-8, which a path need not be.
    const std::string message = "DatasetWriter for '" + detail::escaped(writer->path()) +
                                "' was dropped without finish() or abort(): nothing was published there (call "
                                "finish(), or write in a with block)";
    if (PyErr_WarnEx(PyExc_ResourceWarning, message.c_str(), 1) != 0)
      PyErr_WriteUnraisable(nullptr);  // warnings made errors: a destructor cannot raise
  }
  PyWriter() = default;
  PyWriter(const PyWriter&) = delete;
  PyWriter& operator=(const PyWriter&) = delete;
};

// fn() under the writer's mutex, with the GIL released.
template <typename Fn>
auto locked(PyWriter& self, Fn&& fn) {
  return without_gil([&] {
    std::lock_guard lock(self.mutex);
    return fn();
  });
}

// One record's or batch's values in schema order, from a dict by field name or a sequence
// in schema order. The tensors view the Python values (converted first when they are not
// arrays) and hold references to them.
// Whether a value gives fields by name: a dict, or any mapping (a Sample, a Batch).
bool is_by_name(const py::handle& value) {
  return py::isinstance<py::dict>(value) || (py::hasattr(value, "keys") && !py::isinstance<py::array>(value));
}

std::vector<py::object> objects_in_schema_order(const Schema& schema, const py::handle& record, const std::string& what) {
  std::vector<py::object> objects;
  if (is_by_name(record)) {
    py::dict dict(py::reinterpret_borrow<py::object>(record));
    for (const auto& item : dict) {
      const std::string name = name_text(py::str(item.first));  // a key 1 is looked up as '1'
      if (!schema.find(name)) schema.index_of(name);  // throws ValueError listing the fields
    }
    for (const Field& f : schema) {
      if (!dict.contains(f.name)) throw py::value_error(what + ": field '" + f.name + "' is missing");
      objects.push_back(dict[py::str(f.name)]);
    }
    return objects;
  }
  if (!PySequence_Check(record.ptr()) || py::isinstance<py::str>(record) || py::isinstance<py::bytes>(record))
    throw py::type_error(what + ": expected a dict of field name to value, or a sequence of values in schema order; "
                         "got " + std::string(Py_TYPE(record.ptr())->tp_name));
  auto sequence = py::reinterpret_borrow<py::sequence>(record);
  if (sequence.size() != schema.size())
    throw py::value_error(what + ": " + std::to_string(sequence.size()) + " values for " + std::to_string(schema.size()) +
                          " fields (give them in schema order, or as a dict by name)");
  for (size_t i = 0; i < schema.size(); ++i) objects.push_back(sequence[i]);
  return objects;
}

std::vector<Tensor> values_in_schema_order(const Schema& schema, const py::handle& record, const std::string& what) {
  const std::vector<py::object> objects = objects_in_schema_order(schema, record, what);
  std::vector<Tensor> values;
  for (size_t i = 0; i < schema.size(); ++i)
    values.push_back(tensor_of_value(objects[i], schema[i].dtype, what + ", field '" + schema[i].name + "'"));
  return values;
}

// Whether a field's records may come jagged: it varies in its first dimension alone.
bool takes_offsets(const Field& field) { return field.variable_dims() == 1 && field.shape[0] == kVariableDim; }

// A ragged field's records given jagged, as PyTorch's nested tensors of jagged layout and
// mmtensor's RaggedBatch hold them: an object with `values` and `offsets` (attributes, or
// methods as torch's), record i being values[offsets[i]:offsets[i+1]].
bool is_jagged(const py::handle& value) {
  return !py::isinstance<py::dict>(value) && py::hasattr(value, "values") && py::hasattr(value, "offsets");
}

// Its values ([N, ...the field's shape after its first dimension]) and offsets ([B+1]).
// A RaggedBatch (it has `shapes`) holds its values flat, its offsets counted in elements:
// regrouped into rows for a field of more dimensions ([-1, 4]: values [N, 4], offsets / 4),
// each record's shape checked against the field's. A torch nested tensor is taken only when
// its records lie back to back along its one ragged dimension, the first of a record.
std::pair<Tensor, Tensor> jagged_parts(const py::handle& value, const Field& field, const std::string& what) {
  if (py::hasattr(value, "is_nested") && py::bool_(value.attr("is_nested"))) {
    if (py::hasattr(value, "lengths") && !value.attr("lengths")().is_none())
      throw py::value_error(what + ": a nested tensor with holes between its records (lengths() is set); "
                            "pass nt.contiguous()");
    if (py::hasattr(value, "_ragged_idx") && value.attr("_ragged_idx").cast<int64_t>() != 1)
      throw py::value_error(what + ": a nested tensor ragged in dimension " +
                            py::str(value.attr("_ragged_idx")).cast<std::string>() +
                            "; a record's first dimension must be the ragged one");
  }
  py::object values = value.attr("values"), offsets = value.attr("offsets");
  if (PyCallable_Check(values.ptr())) values = values();
  if (PyCallable_Check(offsets.ptr())) offsets = offsets();
  const auto host_tensor = [&](const py::handle& object, const std::string& name) {
    if (py::isinstance<PyTensor>(object)) return object.cast<const PyTensor&>().tensor;
    if (py::isinstance<py::array>(object)) return tensor_of_array(py::reinterpret_borrow<py::array>(object), false);
    if (py::hasattr(object, "__dlpack__")) return tensor_of_dlpack(object);
    return tensor_of_value(object, kInt64, what + " " + name);
  };
  Tensor v = tensor_of_value(values, field.dtype, what + " values");
  Tensor o = host_tensor(offsets, "offsets");
  if (!py::hasattr(value, "shapes") || field.shape.size() == 1) return {v, o};
  // A RaggedBatch of a field of more dimensions: its records' shapes say how its flat values
  // make rows.
  const Tensor shapes = host_tensor(value.attr("shapes"), "shapes").cpu().to(kInt64).contiguous();
  const Tensor counted = o.cpu().to(kInt64).contiguous();
  const int64_t records = counted.numel() - 1, rank = static_cast<int64_t>(field.shape.size());
  if (v.dim() != 1 || shapes.dim() != 2 || shapes.size(0) != records || shapes.size(1) != rank)
    throw py::value_error(what + ": a RaggedBatch of flat values and [B, " + std::to_string(rank) +
                          "] shapes is expected, for records of shape " + detail::str(field.shape));
  const int64_t* shape = shapes.data_ptr<int64_t>();
  const int64_t* at = counted.data_ptr<int64_t>();
  int64_t inner = 1;
  for (int64_t d = 1; d < rank; ++d) inner *= field.shape[static_cast<size_t>(d)];
  Tensor rows_at = empty({records + 1}, kInt64);
  int64_t* out = rows_at.mutable_data_ptr<int64_t>();
  if (inner == 0 || at[0] % inner != 0)
    throw py::value_error(what + ": the RaggedBatch's first offset, " + std::to_string(at[0]) +
                          ", falls inside a row of " + std::to_string(inner) + " values");
  out[0] = at[0] / inner;
  for (int64_t i = 0; i < records; ++i) {
    for (int64_t d = 1; d < rank; ++d)
      if (shape[i * rank + d] != field.shape[static_cast<size_t>(d)]) {
        DimVector got(IntArrayRef(shape + i * rank, static_cast<size_t>(rank)));
        throw py::value_error(what + ": record " + std::to_string(i) + " of the RaggedBatch has shape " +
                              detail::str(got) + ", not one of " + detail::str(field.shape));
      }
    if (at[i + 1] - at[i] != shape[i * rank] * inner)
      throw py::value_error(what + ": record " + std::to_string(i) + " of the RaggedBatch holds " +
                            std::to_string(at[i + 1] - at[i]) + " values, not the " +
                            std::to_string(shape[i * rank] * inner) + " its shape says");
    out[i + 1] = out[i] + shape[i * rank];
  }
  if (v.numel() % inner != 0)
    throw py::value_error(what + ": the RaggedBatch's " + std::to_string(v.numel()) + " values do not make rows of " +
                          std::to_string(inner));
  DimVector row_shape{v.numel() / inner};
  for (int64_t d = 1; d < rank; ++d) row_shape.push_back(field.shape[static_cast<size_t>(d)]);
  return {v.reshape(row_shape), rows_at};
}

// Values and offsets given for a field the jagged layout cannot hold ([-1, -1, 3] images);
// a RaggedBatch of one is taken, its records indexed.
void refuse_jagged_unless_taken(const Field& field, const py::handle& value) {
  if (!takes_offsets(field) && is_jagged(value) && !py::hasattr(value, "__len__"))
    throw py::value_error("append_batch: field '" + field.name + "' is " + detail::str(field.shape) +
                          ": values and offsets (the jagged layout) hold a field that varies in its first "
                          "dimension alone; give its records as a list of arrays");
}

// The rows of a batch whose ragged fields are given as lists (or tuples) of values, one per
// record; std::nullopt when every field is one array (append_batch's own form).
std::optional<py::ssize_t> ragged_rows(const Schema& schema, const py::handle& batch) {
  const bool by_name = is_by_name(batch);
  if (!by_name && !py::isinstance<py::sequence>(batch)) return std::nullopt;
  if (!by_name && py::len(batch) != schema.size()) return std::nullopt;  // values_in_schema_order says so
  for (size_t f = 0; f < schema.size(); ++f) {
    if (schema[f].is_fixed()) continue;
    if (by_name && !py::dict(py::reinterpret_borrow<py::object>(batch)).contains(schema[f].name)) continue;
    py::object value = by_name ? py::object(batch[py::str(schema[f].name)]) : py::object(batch[py::int_(f)]);
    // A list or tuple of values; a RaggedBatch (a loader batch's, being copied) of a field
    // the jagged layout cannot hold ([-1, -1, 3] images), whose records are indexed.
    refuse_jagged_unless_taken(schema[f], value);
    if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value) ||
        (py::hasattr(value, "offsets") && !takes_offsets(schema[f])))
      return static_cast<py::ssize_t>(py::len(value));
  }
  return std::nullopt;
}


}  // namespace

py::dict stats_dict(const WriteStats& s) {
  py::dict d;
  d["records"] = s.records;
  d["chunks"] = s.chunks;
  d["bytes_in"] = s.bytes_in;
  d["bytes_out"] = s.bytes_out;
  d["seconds"] = s.seconds;
  return d;
}

void bind_writer(py::module_& m) {
  py::class_<PyWriter>(m, "DatasetWriter", R"doc(
Builds a dataset file record by record; finish() publishes it atomically.

    fields = [mmtensor.Field("image", "uint8", [28, 28]), mmtensor.Field("label", "int64")]
    with mmtensor.DatasetWriter("train.mmt", fields, codec="lz4") as w:
        w.append_batch({"image": images, "label": labels})   # [N, 28, 28] and [N]
    # a clean exit calls finish(); an exception calls abort(): no file appears
    # (a writer dropped without finish() or abort() publishes nothing, with a ResourceWarning)

A value is a NumPy array or a torch CPU tensor (any DLPack producer) of the field's dtype,
any strides; bytes for a uint8 field; or a list or number, which an integer field takes only
as integers in its range and a float field rounds (refusing overflow). An array of another
dtype is refused rather than cast. A record may be a dict by name (or any mapping: a Sample,
a Batch) or a sequence in schema order. Chunks are compressed on `threads` threads (0: one
per CPU the process may use: its affinity, within a cgroup CPU quota).)doc")
      .def(py::init([](const py::object& path, std::vector<Field> fields, const std::string& codec,
                       const py::object& chunk_bytes, const py::object& chunk_records, const py::object& alignment,
                       const py::object& threads, bool overwrite, const py::object& metadata) {
             WriterOptions options;
             options.codec = CodecSpec::parse(codec);
             options.chunk_bytes = integer_argument<int64_t>(chunk_bytes, "chunk_bytes");
             options.chunk_records = integer_argument<int64_t>(chunk_records, "chunk_records");
             options.alignment = integer_argument<int64_t>(alignment, "alignment");
             options.threads = integer_argument<int>(threads, "threads");
             options.overwrite = overwrite;
             options.metadata = metadata_argument(metadata);
             Schema schema(std::move(fields));
             const std::string file = path_of(path);
             auto self = std::make_unique<PyWriter>();
             self->schema = schema;
             try {
               self->writer.emplace(without_gil([&] { return DatasetWriter::create(file, std::move(schema), std::move(options)); }));
             } catch (const IoError& e) {
               rethrow_create_error(e, file, overwrite);
             }
             return self;
           }),
           py::arg("path"), py::arg("fields"), py::kw_only(), py::arg("codec") = "none",
           py::arg("chunk_bytes") = WriterOptions{}.chunk_bytes, py::arg("chunk_records") = 0,
           py::arg("alignment") = WriterOptions{}.alignment, py::arg("threads") = 0, py::arg("overwrite") = false,
           py::arg("metadata") = py::none())
      .def("append", [](PyWriter& self, const py::object& record) {
        const std::vector<Tensor> values = values_in_schema_order(self.schema, record, "record " + std::to_string(self.appended));
        locked(self, [&] {
          self.get().append(values);
          self.appended = self.get().size();
        });
      }, py::arg("record"), "Appends one record: a dict by field name, or a sequence in schema order")
      .def("append_batch", [](PyWriter& self, const py::object& batch) {
        const Schema& schema = self.schema;
        if (const auto rows = ragged_rows(schema, batch)) {
          // A ragged field given as a list of values, each its own extent: record by record.
          // Another ragged field may come jagged beside it (values and offsets): its records
          // are slices of its values.
          const bool by_name = is_by_name(batch);
          std::vector<py::object> columns(schema.size());
          std::vector<std::pair<Tensor, Tensor>> jagged(schema.size());  // values, int64 offsets
          for (size_t f = 0; f < schema.size(); ++f) {
            const std::string& name = schema[f].name;
            if (by_name && !py::dict(batch).contains(name))
              throw py::value_error("append_batch: field '" + name + "' is missing");
            columns[f] = by_name ? py::object(batch[py::str(name)]) : py::object(batch[py::int_(f)]);
            if (takes_offsets(schema[f]) && is_jagged(columns[f])) {
              auto [v, o] = jagged_parts(columns[f], schema[f], "append_batch: field '" + name + "'");
              const Tensor at = o.cpu().to(kInt64).contiguous();
              const int64_t* offset = at.data_ptr<int64_t>();
              bool ordered = at.dim() == 1 && at.numel() == *rows + 1 && v.dim() >= 1;
              for (int64_t i = 0; ordered && i < *rows; ++i)
                ordered = offset[i] >= 0 && offset[i] <= offset[i + 1] && offset[i + 1] <= v.size(0);
              if (!ordered)
                throw py::value_error("append_batch: field '" + name + "': its offsets must be " +
                                      std::to_string(*rows + 1) + " values, not decreasing, within its " +
                                      (v.dim() >= 1 ? std::to_string(v.size(0)) : std::string("no")) + " rows");
              jagged[f] = {std::move(v), at};
              continue;
            }
            refuse_jagged_unless_taken(schema[f], columns[f]);
            if (py::len(columns[f]) != static_cast<size_t>(*rows))
              throw py::value_error("append_batch: field '" + name + "' has " + std::to_string(py::len(columns[f])) +
                                    " values for a batch of " + std::to_string(*rows) + " records");
          }
          for (py::ssize_t i = 0; i < *rows; ++i) {
            const std::string what = "record " + std::to_string(self.appended);
            std::vector<Tensor> values;
            for (size_t f = 0; f < schema.size(); ++f) {
              if (jagged[f].first.defined()) {
                const int64_t* offset = jagged[f].second.data_ptr<int64_t>();
                values.push_back(jagged[f].first.narrow(0, offset[i], offset[i + 1] - offset[i]));
                continue;
              }
              values.push_back(tensor_of_value(columns[f][py::int_(i)], schema[f].dtype,
                                               what + ", field '" + schema[f].name + "'"));
            }
            locked(self, [&] {
              self.get().append(values);
              self.appended = self.get().size();
            });
          }
          return;
        }
        const std::string what = "batch from record " + std::to_string(self.appended);
        const std::vector<py::object> objects = objects_in_schema_order(schema, batch, what);
        std::vector<Tensor> values, offsets(schema.size());
        for (size_t f = 0; f < schema.size(); ++f) {
          const std::string field_what = what + ", field '" + schema[f].name + "'";
          if (takes_offsets(schema[f]) && is_jagged(objects[f])) {
            auto [v, o] = jagged_parts(objects[f], schema[f], field_what);
            values.push_back(std::move(v));
            offsets[f] = std::move(o);
            continue;
          }
          values.push_back(tensor_of_value(objects[f], schema[f].dtype, field_what));
        }
        locked(self, [&] {
          self.get().append_batch(values, offsets);
          self.appended = self.get().size();
        });
      }, py::arg("batch"), R"doc(
Appends B records at once: each field's value is [B, ...field shape]. A ragged field's
value may instead be its B records in PyTorch's jagged layout, one copy for the batch: a
nested tensor of jagged layout (torch.nested.nested_tensor_from_jagged(values, offsets)),
an mmtensor RaggedBatch, or any object with `values` ([N, ...], the records back to back)
and `offsets` ([B+1] int64 or int32; record i is values[offsets[i]:offsets[i+1]]). Or a list
of B values of their own extents (token lists of different lengths): the batch is then
appended record by record (a field given jagged beside it gives each record its slice), a bad
record stops it there, after the records before it, and another thread appending to the same
writer meanwhile may put its records between them (a batch of arrays goes in whole).
Arrays of any strides and byte order are taken (copied, as every value is).)doc")
      .def("set_metadata", [](PyWriter& self, std::string key, std::string value) {
        locked(self, [&] { self.get().set_metadata(std::move(key), std::move(value)); });
      })
      .def("finish", [](PyWriter& self) {
        return stats_dict(locked(self, [&] {
          DatasetWriter& w = self.get();
          self.closed = true;  // finish() aborts on failure: either way the writer is done
          return w.finish();
        }));
      }, "Publishes the file (fsync, rename, fsync of the folder) and returns the figures")
      .def("abort", [](PyWriter& self) {
        locked(self, [&] {
          if (self.writer) self.writer->abort();
          self.closed = true;
        });
      }, "Discards everything written; the target path is left as it was")
      .def("stats", [](PyWriter& self) { return stats_dict(locked(self, [&] { return self.get().stats(); })); })
      .def_property_readonly("path", [](PyWriter& self) { return path_object(locked(self, [&] { return self.get().path(); })); })
      .def("__len__", [](PyWriter& self) { return locked(self, [&] { return self.get().size(); }); })
      .def("__enter__", [](const py::object& self) { return self; })
      .def("__exit__", [](PyWriter& self, const py::object& type, const py::object&, const py::object&) {
        const bool clean = type.is_none();
        locked(self, [&] {
          if (!self.writer || self.closed) return;
          self.closed = true;
          if (clean) self.writer->finish();
          else self.writer->abort();
        });
        return false;  // an exception goes on
      });
}

}  // namespace mmt::python
