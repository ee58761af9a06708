// mmtensor.DatasetWriter: builds a dataset file from Python values (NumPy arrays, lists,
// numbers, torch CPU tensors, mmtensor Tensors).
//
// Used as a context manager, the file is published by a clean exit and discarded by an
// exception, so a failed script leaves the target path as it was.
#include <pybind11/stl.h>

#include <optional>

#include "bindings.h"

namespace mmt::python {

namespace {

// The C++ writer (move-only), and whether finish() or abort() has been called, so that a
// context manager's exit after an explicit finish() does nothing more.
struct PyWriter {
  std::optional<DatasetWriter> writer;
  bool closed = false;

  DatasetWriter& get() {
    if (!writer) throw py::value_error("DatasetWriter: closed");
    return *writer;
  }
};

// One record's or batch's values in schema order, from a dict by field name or a sequence
// in schema order. The tensors view the Python values (converted first when they are not
// arrays) and hold references to them.
std::vector<Tensor> values_in_schema_order(const Schema& schema, const py::handle& record, const std::string& what) {
  std::vector<Tensor> values;
  if (py::isinstance<py::dict>(record)) {
    auto dict = py::reinterpret_borrow<py::dict>(record);
    for (const auto& item : dict) {
      const auto name = py::str(item.first).cast<std::string>();
      if (!schema.find(name)) schema.index_of(name);  // throws ValueError listing the fields
    }
    for (const Field& f : schema) {
      if (!dict.contains(f.name)) throw py::value_error(what + ": field '" + f.name + "' is missing");
      values.push_back(tensor_of_value(dict[py::str(f.name)], f.dtype, what + ", field '" + f.name + "'"));
    }
    return values;
  }
  auto sequence = py::reinterpret_borrow<py::sequence>(record);
  if (sequence.size() != schema.size())
    throw py::value_error(what + ": " + std::to_string(sequence.size()) + " values for " + std::to_string(schema.size()) +
                          " fields (give them in schema order, or as a dict by name)");
  for (size_t i = 0; i < schema.size(); ++i)
    values.push_back(tensor_of_value(sequence[i], schema[i].dtype, what + ", field '" + schema[i].name + "'"));
  return values;
}

py::dict stats_dict(const WriteStats& s) {
  py::dict d;
  d["records"] = s.records;
  d["chunks"] = s.chunks;
  d["bytes_in"] = s.bytes_in;
  d["bytes_out"] = s.bytes_out;
  d["seconds"] = s.seconds;
  return d;
}

}  // namespace

void bind_writer(py::module_& m) {
  py::class_<PyWriter>(m, "DatasetWriter", R"doc(
Builds a dataset file record by record; finish() publishes it atomically.

    fields = [mmtensor.Field("image", "uint8", [28, 28]), mmtensor.Field("label", "int64")]
    with mmtensor.DatasetWriter("train.mmt", fields, codec="lz4") as w:
        w.append_batch({"image": images, "label": labels})   # [N, 28, 28] and [N]
    # a clean exit calls finish(); an exception calls abort(): no file appears

A value is a NumPy array of the field's dtype (any strides), or anything NumPy converts (a
list, a number); an array of another dtype is refused rather than cast. Chunks are
compressed on `threads` threads (0: one per core).)doc")
      .def(py::init([](const std::string& path, std::vector<Field> fields, const std::string& codec,
                       int64_t chunk_bytes, int64_t chunk_records, int64_t alignment, int threads, bool overwrite,
                       const Metadata& metadata) {
             WriterOptions options;
             options.codec = CodecSpec::parse(codec);
             options.chunk_bytes = chunk_bytes;
             options.chunk_records = chunk_records;
             options.alignment = alignment;
             options.threads = threads;
             options.overwrite = overwrite;
             options.metadata = metadata;
             Schema schema(std::move(fields));
             py::gil_scoped_release nogil;
             return PyWriter{DatasetWriter::create(path, std::move(schema), std::move(options))};
           }),
           py::arg("path"), py::arg("fields"), py::kw_only(), py::arg("codec") = "none",
           py::arg("chunk_bytes") = WriterOptions{}.chunk_bytes, py::arg("chunk_records") = 0,
           py::arg("alignment") = WriterOptions{}.alignment, py::arg("threads") = 0, py::arg("overwrite") = false,
           py::arg("metadata") = Metadata{})
      .def("append", [](PyWriter& self, const py::object& record) {
        DatasetWriter& w = self.get();
        const std::vector<Tensor> values = values_in_schema_order(w.schema(), record, "record " + std::to_string(w.size()));
        py::gil_scoped_release nogil;
        w.append(values);
      }, py::arg("record"), "Appends one record: a dict by field name, or a sequence in schema order")
      .def("append_batch", [](PyWriter& self, const py::object& batch) {
        DatasetWriter& w = self.get();
        const std::vector<Tensor> values = values_in_schema_order(w.schema(), batch, "batch from record " + std::to_string(w.size()));
        py::gil_scoped_release nogil;
        w.append_batch(values);
      }, py::arg("batch"), "Appends B records at once: each field's value is [B, ...field shape]")
      .def("set_metadata", [](PyWriter& self, std::string key, std::string value) {
        self.get().set_metadata(std::move(key), std::move(value));
      })
      .def("finish", [](PyWriter& self) {
        WriteStats stats;
        DatasetWriter& w = self.get();
        self.closed = true;  // finish() aborts on failure: either way the writer is done
        {
          py::gil_scoped_release nogil;
          stats = w.finish();
        }
        return stats_dict(stats);
      }, "Publishes the file (fsync, rename, fsync of the folder) and returns the figures")
      .def("abort", [](PyWriter& self) {
        if (self.writer) self.writer->abort();
        self.closed = true;
      }, "Discards everything written; the target path is left as it was")
      .def("stats", [](PyWriter& self) { return stats_dict(self.get().stats()); })
      .def_property_readonly("path", [](PyWriter& self) { return self.get().path(); })
      .def("__len__", [](PyWriter& self) { return self.get().size(); })
      .def("__enter__", [](const py::object& self) { return self; })
      .def("__exit__", [](PyWriter& self, const py::object& type, const py::object&, const py::object&) {
        if (!self.writer || self.closed) return false;
        self.closed = true;
        if (type.is_none()) {
          py::gil_scoped_release nogil;
          self.writer->finish();
        } else {
          self.writer->abort();
        }
        return false;  // an exception goes on
      });
}

}  // namespace mmt::python
