// mmtensor.Field, mmtensor.Dataset, its Sample and RaggedBatch, from Python.
//
// The GIL is released while the engine reads (get_batch, column, verify, prefetch...), so
// Python threads that read one Dataset do so in parallel, as C++ threads do.
#include <pybind11/stl.h>

#include "bindings.h"
#include "utf8.h"  // engine/, for escaped()

namespace mmt::python {

namespace {

std::string field_repr(const Field& f) {
  std::string text = "Field('" + f.name + "', '" + std::string(to_string(f.dtype)) + "', " +
                     py::repr(int_tuple(f.shape)).cast<std::string>();
  if (!f.stored_in_logical_order()) text += ", storage_order=" + py::repr(int_tuple(f.storage_order)).cast<std::string>();
  return text + ")";
}

AccessAdvice parse_advice(const std::string& text) {
  if (text == "normal") return AccessAdvice::Normal;
  if (text == "random") return AccessAdvice::Random;
  if (text == "sequential") return AccessAdvice::Sequential;
  if (text == "will_need") return AccessAdvice::WillNeed;
  if (text == "dont_need") return AccessAdvice::DontNeed;
  throw py::value_error("advice must be 'normal', 'random', 'sequential', 'will_need' or 'dont_need', not '" + text + "'");
}

// A sample's field by name, as a mapping does it: KeyError (listing the fields) for a name
// the record lacks.
const Tensor& sample_field(const Sample& sample, const std::string& name) {
  if (!sample.schema().find(name)) {
    try {
      (void)sample.schema().index_of(name);  // the engine's message, which lists the fields
    } catch (const ValueError& e) {
      throw py::key_error(e.what());
    }
  }
  return sample[name];
}

py::dict chunk_dict(const ChunkInfo& c) {
  py::dict d;
  d["index"] = c.index;
  d["first_record"] = c.first_record;
  d["record_count"] = c.record_count;
  d["part"] = c.part;
  d["file_offset"] = c.file_offset;
  d["stored_bytes"] = c.stored_bytes;
  d["decoded_bytes"] = c.decoded_bytes;
  d["codec"] = std::string(to_string(c.codec));
  d["checksum"] = c.checksum;
  return d;
}

// The values of one ragged record, shaped: what batch.values[offsets[i]:offsets[i+1]] holds.
py::object ragged_item(const RaggedBatch& batch, int64_t i, const std::shared_ptr<Batch>& owner) {
  const int64_t n = batch.offsets.numel() - 1;
  if (i < 0) i += n;
  if (i < 0 || i >= n) throw py::index_error("RaggedBatch: index out of range for " + std::to_string(n) + " records");
  Tensor offsets = batch.offsets.cpu();
  Tensor shapes = batch.shapes.cpu();
  const int64_t start = offsets.at<int64_t>({i}), stop = offsets.at<int64_t>({i + 1});
  DimVector shape;
  for (int64_t d = 0; d < shapes.sizes()[1]; ++d) shape.push_back(shapes.at<int64_t>({i, d}));
  return wrap(batch.values.narrow(0, start, stop - start).view(shape), owner);
}

// Field names given as one str or an iterable of them; TypeError otherwise.
std::vector<std::string> field_names_of(const py::handle& fields, const std::string& what) {
  if (py::isinstance<py::str>(fields)) return {name_text(fields)};
  if (fields.is_none() || !py::isinstance<py::iterable>(fields) || py::isinstance<py::bytes>(fields))
    throw py::type_error(what + ": fields must be a field name or a list of them");
  std::vector<std::string> names;
  for (const py::handle& name : fields) {
    if (!py::isinstance<py::str>(name)) throw py::type_error(what + ": a field name must be a str, not " +
                                                             py::repr(name).cast<std::string>());
    names.push_back(name_text(name));
  }
  return names;
}

// A range bound as Python slices take it: negative counts from the end, None is `fallback`.
int64_t python_bound(std::optional<int64_t> bound, int64_t fallback, int64_t size) {
  if (!bound) return fallback;
  return *bound < 0 ? *bound + size : *bound;
}

// Records [start, stop) of `size`, negative bounds counted from the end; IndexError naming the
// bounds as given when they fall outside (the engine's message would show them counted).
// A slice bound: None, or an index argument.
std::optional<int64_t> optional_index(const py::object& bound, const char* name) {
  if (bound.is_none()) return std::nullopt;
  return index_argument(bound, name);
}

std::pair<int64_t, int64_t> python_range(const char* method, const std::string& field, std::optional<int64_t> start,
                                         std::optional<int64_t> stop, int64_t size) {
  const int64_t begin = python_bound(start, 0, size), end = python_bound(stop, size, size);
  if (begin < 0 || begin > end || end > size) {
    const auto text = [](std::optional<int64_t> bound) { return bound ? std::to_string(*bound) : std::string("None"); };
    throw py::index_error(std::string(method) + "('" + field + "', " + text(start) + ", " + text(stop) +
                          "): records [" + std::to_string(begin) + ", " + std::to_string(end) +
                          ") once negative bounds count from the end, outside [0, " + std::to_string(size) +
                          "] or reversed (a slice would clip; this refuses)");
  }
  return {begin, end};
}

}  // namespace

ReadAhead parse_read_ahead(const std::string& text) {
  if (text == "auto") return ReadAhead::Auto;
  if (text == "always") return ReadAhead::Always;
  if (text == "never") return ReadAhead::Never;
  throw py::value_error("read_ahead must be 'auto', 'always' or 'never', not '" + text + "'");
}

// A ragged field's values for several records, packed; shared with the loader's batches.
struct PyRaggedBatch {
  RaggedBatch batch;
  std::shared_ptr<Batch> owner;
};

void bind_ragged(py::module_& m) {
  py::class_<PyRaggedBatch>(m, "RaggedBatch", R"doc(
A ragged field's values for several records, packed: values (1-d, each record's values in
row-major order, one after the other), offsets (int64 [B+1]: record i is
values[offsets[i]:offsets[i+1]]) and shapes (int64 [B, ndim]). rb[i] is record i's value,
shaped.)doc")
      .def_property_readonly("values", [](const PyRaggedBatch& r) { return wrap(r.batch.values, r.owner); })
      .def_property_readonly("offsets", [](const PyRaggedBatch& r) { return wrap(r.batch.offsets, r.owner); })
      .def_property_readonly("shapes", [](const PyRaggedBatch& r) { return wrap(r.batch.shapes, r.owner); })
      .def("__len__", [](const PyRaggedBatch& r) { return r.batch.offsets.numel() - 1; })
      .def("__getitem__", [](const PyRaggedBatch& r, const py::object& i) {
        return ragged_item(r.batch, index_argument(i, "index"), r.owner);
      })
      .def("__repr__", [](const PyRaggedBatch& r) {
        return "<mmtensor.RaggedBatch of " + std::to_string(r.batch.offsets.numel() - 1) + " records, " +
               std::to_string(r.batch.values.numel()) + " " + std::string(to_string(r.batch.values.dtype())) + " values>";
      });
}

py::object wrap_ragged(RaggedBatch batch, std::shared_ptr<Batch> owner) {
  return py::cast(PyRaggedBatch{std::move(batch), std::move(owner)});
}

void bind_dataset(py::module_& m) {
  bind_ragged(m);

  py::class_<Field>(m, "Field", R"doc(
A named field of every record: a dtype and a per-record shape, with -1 for a variable
extent (a ragged field: token sequences [-1], raw bytes Field.bytes(name)). storage_order
stores the dimensions in another physical order (channels_last=True stores [C, H, W] as HWC);
values still read back in the logical shape, with strides to match.)doc")
      .def(py::init([](std::string name, const py::object& dtype, std::vector<int64_t> shape,
                       std::optional<std::vector<int64_t>> storage_order, bool channels_last) {
             const ScalarType type = parse_dtype(dtype);
             const bool fixed = std::find(shape.begin(), shape.end(), kVariableDim) == shape.end();
             Field f = fixed ? Field::fixed(std::move(name), type, shape) : Field::ragged(std::move(name), type, shape);
             if (storage_order) f.with_storage_order(*storage_order);
             if (channels_last) f.stored_channels_last();
             f.validate();
             return f;
           }),
           py::arg("name"), py::arg("dtype"), py::arg("shape") = std::vector<int64_t>{}, py::kw_only(),
           py::arg("storage_order") = py::none(), py::arg("channels_last") = false)
      .def_static("bytes", &Field::bytes, py::arg("name"), "A uint8 [-1] field: raw bytes such as an encoded JPEG")
      .def_readonly("name", &Field::name)
      .def_property_readonly("dtype", [](const Field& f) { return std::string(to_string(f.dtype)); })
      .def_property_readonly("shape", [](const Field& f) { return int_tuple(f.shape); })
      .def_property_readonly("storage_order", [](const Field& f) { return int_tuple(f.storage_order); })
      .def_property_readonly("is_fixed", &Field::is_fixed)
      .def("__eq__", [](const Field& a, const py::object& b) -> py::object {
        if (!py::isinstance<Field>(b)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
        return py::bool_(a == b.cast<const Field&>());
      })
      .def("__hash__", [](const Field& f) {
        return py::hash(py::make_tuple(f.name, static_cast<int>(f.dtype), int_tuple(f.shape),
                                       int_tuple(f.storage_order)));
      })
      .def(py::pickle(
          [](const Field& f) {
            return py::make_tuple(f.name, std::string(to_string(f.dtype)), int_tuple(f.shape), int_tuple(f.storage_order));
          },
          [](const py::tuple& t) {
            Field f;
            f.name = t[0].cast<std::string>();
            f.dtype = parse_dtype(t[1]);
            f.shape = t[2].cast<std::vector<int64_t>>();
            f.storage_order = t[3].cast<std::vector<int64_t>>();
            f.validate();
            return f;
          }))
      .def("__repr__", &field_repr);

  py::class_<Sample>(m, "Sample", R"doc(
One record: a read-only mapping from field name to Tensor (views into the file, zero-copy,
when its chunk is uncompressed). sample.index is the record's index. It pickles as a dict of
its tensors, their values copied (for DataLoader worker processes).)doc")
      .def_property_readonly("index", &Sample::index)
      .def_property_readonly("fields", [](const Sample& s) { return s.schema().fields(); },
                             "The record's fields (Field: name, dtype, shape, is_fixed), in schema order")
      .def("__getitem__", [](const Sample& s, const py::object& name) { return wrap(sample_field(s, name_text(name))); })
      .def("__len__", &Sample::size)
      .def("__contains__", [](const Sample& s, const py::object& name) {
        return py::isinstance<py::str>(name) && s.schema().find(name_text(name)).has_value();
      })
      .def("get", [](const Sample& s, const py::object& field, const py::object& fallback) -> py::object {
        const std::string name = name_text(field);
        if (!s.schema().find(name)) return fallback;
        return wrap(s[name]);
      }, py::arg("field"), py::arg("default") = py::none())
      .def("keys", [](const Sample& s) {
        py::list names;
        for (const Field& f : s.schema()) names.append(f.name);
        return names;
      })
      .def("__iter__", [](const Sample& s) {
        py::list names;
        for (const Field& f : s.schema()) names.append(f.name);
        return py::iter(names);
      })
      .def("values", [](const Sample& s) {
        py::list out;
        for (size_t i = 0; i < s.size(); ++i) out.append(wrap(s[i]));
        return out;
      })
      .def("items", [](const Sample& s) {
        py::list out;
        for (size_t i = 0; i < s.size(); ++i) out.append(py::make_tuple(s.schema()[i].name, wrap(s[i])));
        return out;
      })
      .def("__reduce__", [](const Sample& s) {
        // As a dict of its tensors (their values copied, as Tensor pickles): what a DataLoader
        // worker process sends back, for a collate function that takes any mapping.
        py::dict fields;
        for (const Field& field : s.schema().fields()) fields[py::str(field.name)] = wrap(sample_field(s, field.name));
        return py::make_tuple(py::type::of(fields), py::make_tuple(fields));
      })
      .def("__repr__", [](const Sample& s) {
        std::string text = "<mmtensor.Sample " + std::to_string(s.index()) + ":";
        for (const Field& f : s.schema()) text += " " + f.name;
        return text + ">";
      });

  py::class_<Dataset>(m, "Dataset", R"doc(
A dataset file opened for random access by record index.

    ds = mmtensor.Dataset("train.mmt")
    image = ds[17]["image"].numpy()      # a read-only view into the file, no copy
    batch = ds.get_batch(indices, "image", threads=2)

A list of paths opens shards as one dataset, in that order (as torch's ConcatDataset):
record i is in the shard that holds it (ds.locate(i) says which), every method works across
them, and the shards share one cache_bytes budget. Their fields must be equal and their
metadata must agree (but pack's npy_fortran_order, kept only where all agree);
mmtensor.concat() joins Datasets already open.

    ds = mmtensor.Dataset(sorted(glob.glob("train-*.mmt")))

Opening reads the preamble, footer and schema only (milliseconds for any size); nothing in the
file is trusted: offsets and sizes are checked before use, and a compressed chunk's checksum
before it is decoded. An uncompressed chunk's values are hashed only with
verify_uncompressed=True (hashing a 1 MiB chunk to serve one record would cost more than the
read), so damage inside them is found by verify() or `mmt verify`. Views outlive the
Dataset; it pickles as its path and options (opened again where it is unpickled). Every
method may be called from many threads.)doc")
      .def(py::init([](const py::object& path, const py::object& cache_bytes, bool verify_checksums,
                       bool verify_uncompressed, const std::string& advice, const std::string& read_ahead) {
             ReaderOptions options;
             options.cache_bytes = integer_argument<int64_t>(cache_bytes, "cache_bytes");
             options.verify_checksums = verify_checksums;
             options.verify_uncompressed = verify_uncompressed;
             options.advice = parse_advice(advice);
             options.read_ahead = parse_read_ahead(read_ahead);
             if (py::isinstance<py::list>(path) || py::isinstance<py::tuple>(path)) {
               std::vector<std::string> files;
               for (const py::handle& item : path) files.push_back(path_of(item));
               return without_gil([&] { return Dataset::open_concat(files, options); });
             }
             const std::string file = path_of(path);
             return without_gil([&] { return Dataset::open(file, options); });
           }),
           py::arg("path"), py::kw_only(), py::arg("cache_bytes") = ReaderOptions{}.cache_bytes,
           py::arg("verify_checksums") = true, py::arg("verify_uncompressed") = false, py::arg("advice") = "normal",
           py::arg("read_ahead") = "auto")
      .def("__len__", &Dataset::size)
      // Pickled as its path and options, and opened again where it is unpickled: what a torch
      // DataLoader's worker processes need under "spawn" (a mapping cannot be sent).
      .def(py::pickle(
          [](const Dataset& ds) {
            // The absolute path as of open() (a worker may run elsewhere, and the working
            // folder may have changed since) and the fingerprint, so that a file replaced in
            // between is refused rather than read as the one pickled. Shards as the list of
            // their paths.
            const ReaderOptions& o = ds.options();
            const std::vector<Dataset> parts = ds.parts();
            py::object path;
            if (parts.size() == 1) {
              path = path_object(ds.absolute_path());
            } else {
              py::list paths;
              for (const Dataset& part : parts) paths.append(path_object(part.absolute_path()));
              path = std::move(paths);
            }
            return py::make_tuple(path, o.cache_bytes, o.verify_checksums, o.verify_uncompressed,
                                  static_cast<int>(o.advice), static_cast<int>(o.read_ahead), ds.fingerprint());
          },
          [](const py::tuple& t) {
            ReaderOptions o;
            o.cache_bytes = t[1].cast<int64_t>();
            o.verify_checksums = t[2].cast<bool>();
            o.verify_uncompressed = t[3].cast<bool>();
            o.advice = static_cast<AccessAdvice>(t[4].cast<int>());
            o.read_ahead = static_cast<ReadAhead>(t[5].cast<int>());
            const auto fingerprint = t[6].cast<uint64_t>();
            Dataset ds;
            if (py::isinstance<py::list>(t[0])) {
              std::vector<std::string> paths;
              for (const py::handle& item : t[0]) paths.push_back(path_of(item));
              ds = without_gil([&] { return Dataset::open_concat(paths, o); });
            } else {
              const std::string path = path_of(t[0]);
              ds = without_gil([&] { return Dataset::open(path, o); });
            }
            if (without_gil([&] { return ds.fingerprint(); }) != fingerprint)
              throw py::value_error("unpickling a Dataset: " + detail::escaped(ds.path()) + " is no longer what was pickled "
                                    "(its chunks differ); open it anew if that is meant");
            return ds;
          }))
      .def("__getitem__", [](const Dataset& ds, const py::object& key) -> py::object {
        // One index: an int, an integer scalar (np.int64) or a 0-d integer array or tensor.
        // Arrays and tensors of one element define __index__ too; with a dimension they are
        // lists of indices here, as NumPy reads a[np.array([3])].
        py::module_ np = py::module_::import("numpy");
        const bool one_index = py::isinstance<py::int_>(key) || py::isinstance(key, np.attr("integer")) ||
                               (PyIndex_Check(key.ptr()) && np.attr("ndim")(key).cast<int>() == 0);
        if (one_index) {
          int overflow = 0;
          const long long index = index_value(key, overflow);
          if (overflow) throw py::index_error("record index " + py::str(key).cast<std::string>() + " is out of range");
          return py::cast(without_gil([&] { return ds.get(index); }));
        }
        // A slice, a list of indices, an index array or a boolean mask: a list of samples.
        // Anything else is refused as a list refuses it (ds[2.0], ds["3"], ds[None]).
        if (PyFloat_Check(key.ptr()) || PyComplex_Check(key.ptr()) || py::isinstance<py::str>(key) ||
            py::isinstance<py::bytes>(key) || key.is_none() || key.ptr() == Py_Ellipsis ||
            (PyIndex_Check(key.ptr()) == 0 && py::isinstance(key, np.attr("generic"))))
          throw py::type_error(std::string("Dataset indices must be integers, slices, integer sequences or boolean "
                                           "masks, not ") + Py_TYPE(key.ptr())->tp_name);
        std::vector<int64_t> indices;
        if (py::isinstance<py::slice>(key)) {
          py::ssize_t start, stop, step, length;
          if (!key.cast<py::slice>().compute(static_cast<py::ssize_t>(ds.size()), &start, &stop, &step, &length))
            throw py::error_already_set();
          for (py::ssize_t k = 0; k < length; ++k) indices.push_back(start + k * step);
        } else {
          indices = indices_of(key, ds.size());
        }
        std::vector<Sample> samples(indices.size());
        without_gil([&] {
          for (size_t k = 0; k < indices.size(); ++k) samples[k] = ds.get(indices[k]);
        });
        return py::cast(std::move(samples));
      }, py::arg("index"), "ds[i]: a Sample; ds[a:b], ds[[i, j]], ds[mask]: a list of them (get_batch() stacks a field)")
      .def("__iter__", [](const Dataset& ds) { return py::make_iterator(ds.begin(), ds.end()); }, py::keep_alive<0, 1>())
      .def("get", [](const Dataset& ds, const py::object& index, const py::object& field_name) {
        const int64_t i = index_argument(index, "index");
        const std::string field = name_text(field_name);
        return wrap(without_gil([&] { return ds.get(i, field); }));
      }, py::arg("index"), py::arg("field"))
      .def_property_readonly("path", [](const Dataset& ds) { return path_object(ds.path()); },
                             "The file's path; for shards, their paths joined by ', ' (see paths)")
      .def_property_readonly("paths", [](const Dataset& ds) {
        py::list paths;
        for (const Dataset& part : ds.parts()) paths.append(path_object(part.path()));
        return paths;
      }, "The files read, in order: [path] for one file")
      .def_property_readonly("parts", &Dataset::parts, "The files read, as Datasets, in order: [self] for one file")
      .def("locate", [](const Dataset& ds, const py::object& index) {
        const Dataset::Location at = ds.locate(index_argument(index, "index"));
        return py::make_tuple(at.part, at.index);
      }, py::arg("index"), "(part, index in that part) of record `index` (negative counts from the end)")
      .def_property_readonly("fields", [](const Dataset& ds) { return ds.schema().fields(); })
      .def_property_readonly("metadata", [](const Dataset& ds) { return ds.metadata(); })
      .def_property_readonly("num_chunks", &Dataset::num_chunks)
      .def("chunk", [](const Dataset& ds, const py::object& i) { return chunk_dict(ds.chunk(index_argument(i, "chunk"))); })
      .def("chunk_of", [](const Dataset& ds, const py::object& index) { return ds.chunk_of(index_argument(index, "index")); })
      .def("fingerprint", &Dataset::fingerprint)
      .def("info", [](const Dataset& ds) {
        const DatasetInfo info = ds.info();
        py::dict d;
        d["format_version"] = info.format_version;
        d["records"] = info.records;
        d["chunks"] = info.chunks;
        d["file_bytes"] = info.file_bytes;
        d["alignment"] = info.alignment;
        d["codec"] = info.codecs_differ ? std::string("mixed") : info.codec.str();  // as `mmt info`
        d["stored_bytes"] = info.stored_bytes;
        d["decoded_bytes"] = info.decoded_bytes;
        d["part_count"] = info.part_count;  // "parts" is the property listing them
        return d;
      })
      .def("column", [](const Dataset& ds, const py::object& field_name, const py::object& start_arg,
                        const py::object& stop_arg) {
        const std::string field = name_text(field_name);
        const std::optional<int64_t> start = optional_index(start_arg, "start"), stop = optional_index(stop_arg, "stop");
        if (!start && !stop) return wrap(without_gil([&] { return ds.column(field); }));
        const auto [begin, end] = python_range("column", field, start, stop, ds.size());
        return wrap(without_gil([&, begin = begin, end = end] { return ds.column(field, begin, end); }));
      }, py::arg("field"), py::arg("start") = py::none(), py::arg("stop") = py::none(),
         "A fixed field of records [start, stop) (negative from the end, as in a slice) as one [N, ...] tensor: "
         "a view when the chunks allow (column_is_view)")
      .def("column_is_view", [](const Dataset& ds, const py::object& field) { return ds.column_is_view(name_text(field)); },
           py::arg("field"))
      .def("ragged_column", [](const Dataset& ds, const py::object& field_name, const py::object& start_arg,
                               const py::object& stop_arg) {
        const std::string field = name_text(field_name);
        const std::optional<int64_t> start = optional_index(start_arg, "start"), stop = optional_index(stop_arg, "stop");
        const auto [begin, end] = python_range("ragged_column", field, start, stop, ds.size());
        return wrap_ragged(without_gil([&, begin = begin, end = end] { return ds.ragged_column(field, begin, end); }),
                           nullptr);
      }, py::arg("field"), py::arg("start") = py::none(), py::arg("stop") = py::none())
      .def("get_ragged_batch", [](const Dataset& ds, const py::object& indices, const py::object& field_name) {
        const std::string field = name_text(field_name);
        const std::vector<int64_t> idx = indices_of(indices, ds.size());
        return wrap_ragged(without_gil([&] { return ds.get_ragged_batch(idx, field); }), nullptr);
      }, py::arg("indices"), py::arg("field"))
      .def("get_batch", [](const Dataset& ds, const py::object& indices, const py::object& fields,
                           const py::object& out, const py::object& threads_arg) -> py::object {
        const int threads = integer_argument<int>(threads_arg, "threads");
        const std::vector<int64_t> idx = indices_of(indices, ds.size());
        const bool one = py::isinstance<py::str>(fields);
        const std::vector<std::string> names = field_names_of(fields, "get_batch");
        std::vector<Tensor> outs;
        if (out.is_none()) {
          for (const std::string& name : names) {
            const Field& f = ds.schema()[ds.schema().index_of(name)];
            if (!f.is_fixed()) throw py::value_error("get_batch: field '" + name + "' is ragged; use get_ragged_batch()");
            DimVector shape{static_cast<int64_t>(idx.size())};
            for (int64_t d : f.shape) shape.push_back(d);
            outs.push_back(empty(shape, f.dtype));
          }
        } else {
          // Outputs the caller gives: one array (or Tensor) per field, written in place.
          std::vector<py::object> given;
          if (one) {
            given.push_back(out);
          } else if (py::isinstance<py::dict>(out)) {  // by field name, as get_batch returns them
            auto by_name = out.cast<py::dict>();
            for (const std::string& name : names) {
              (void)ds.schema().index_of(name);  // a name no field has (not UTF-8, say) is refused here
              if (!by_name.contains(name)) throw py::key_error("get_batch: out= has no array for field '" + name + "'");
              given.push_back(by_name[py::str(name)]);
            }
            // An array for a field not asked for would silently stay as it was.
            for (const auto& [key, value] : by_name)
              if (!py::isinstance<py::str>(key) ||
                  std::find(names.begin(), names.end(), name_text(key)) == names.end())
                throw py::key_error("get_batch: out= has an array for " + py::repr(key).cast<std::string>() +
                                    ", which is not among the fields gathered");
          } else if (py::isinstance<py::list>(out) || py::isinstance<py::tuple>(out)) {
            for (const py::handle& o : out) given.push_back(py::reinterpret_borrow<py::object>(o));
          } else {
            // One array for a list of fields: iterating it would take its rows for outputs.
            throw py::type_error("get_batch: for a list of fields, out= is a list (one array a field, in order) or a "
                                 "dict by field name, not " + std::string(Py_TYPE(out.ptr())->tp_name));
          }
          if (given.size() != names.size())
            throw py::value_error("get_batch: " + std::to_string(names.size()) + " fields but " + std::to_string(given.size()) + " outputs");
          for (const py::object& o : given) {
            // Only an array written in place: NumPy would copy anything else into a temporary,
            // and the gathered values would be lost with it.
            if (py::isinstance<PyTensor>(o)) outs.push_back(o.cast<const PyTensor&>().tensor);
            else if (py::isinstance<py::array>(o)) outs.push_back(tensor_of_array(py::reinterpret_borrow<py::array>(o), true));
            else if (py::hasattr(o, "__dlpack__")) outs.push_back(tensor_of_dlpack(o));  // a torch CPU tensor
            else throw py::type_error("get_batch: out= takes NumPy arrays, torch CPU tensors or mmtensor Tensors, not " +
                                      py::str(py::type::of(o).attr("__name__")).cast<std::string>());
          }
        }
        without_gil([&] { ds.get_batch(idx, names, outs, threads); });
        if (!out.is_none()) return out;
        if (one) return wrap(outs[0]);
        py::dict result;
        for (size_t k = 0; k < names.size(); ++k) result[py::str(names[k])] = wrap(outs[k]);
        return result;
      }, py::arg("indices"), py::arg("fields"), py::kw_only(), py::arg("out") = py::none(), py::arg("threads") = 1,
         R"doc(
Gathers fixed fields of records `indices` (any order, repeats, negative from the end).
Indices may also be a boolean mask of len(ds). One field name: a [B, ...] Tensor. A list of
names: a dict of them. out= writes into arrays you give (a writable NumPy array of the
field's dtype and shape, any strides; for several fields a list in their order or a dict by
name) and returns `out`. threads: threads to gather with, the calling one counted.)doc")
      .def("prefetch", [](const Dataset& ds, const py::object& indices, const py::object& fields) {
        const std::vector<int64_t> idx = indices_of(indices, ds.size());
        if (fields.is_none()) {
          without_gil([&] { ds.prefetch(idx); });
        } else {
          const std::vector<std::string> names = field_names_of(fields, "prefetch");
          without_gil([&] { ds.prefetch(idx, names); });
        }
      }, py::arg("indices"), py::arg("fields") = py::none())
      .def("advise", [](const Dataset& ds, const std::string& advice) { ds.advise(parse_advice(advice)); })
      .def("verify", [](const Dataset& ds) { without_gil([&] { ds.verify(); }); },
           "Checks every chunk's entry, checksum and decoding; raises the first problem found")
      .def("cache_stats", [](const Dataset& ds) {
        const CacheStats s = ds.cache_stats();
        py::dict d;
        d["hits"] = s.hits;
        d["misses"] = s.misses;
        d["evictions"] = s.evictions;
        d["bytes_cached"] = s.bytes_cached;
        d["budget_bytes"] = s.budget_bytes;
        d["decoded_bytes_live"] = s.decoded_bytes_live;
        d["decoded_bytes_peak"] = s.decoded_bytes_peak;
        return d;
      })
      .def("__repr__", [](const Dataset& ds) {
        const std::vector<Dataset> parts = ds.parts();
        std::string text =
            parts.size() == 1
                ? detail::str("<mmtensor.Dataset '", ds.path(), "': ", ds.size(), " records;")
                : detail::str("<mmtensor.Dataset of ", parts.size(), " parts ('", parts.front().path(), "' .. '",
                              parts.back().path(), "'): ", ds.size(), " records;");
        for (const Field& f : ds.schema()) text.append(" ").append(field_repr(f));
        return lenient_text(text + ">");
      });

  m.def("concat", [](const std::vector<Dataset>& datasets) { return Dataset::concat(datasets); },
        py::arg("datasets"), R"doc(
Datasets read as one, in the order given (as torch.utils.data.ConcatDataset): record i is in
the dataset that holds it. Each keeps its own options and cache, but get_batch over the
whole follows the first's read_ahead (one decision for a batch, whatever parts it falls
in); Dataset([paths]) opens shards with one shared cache budget instead. Fields must be equal and metadata must agree
(ValueError naming the part and the difference; pack's npy_fortran_order is kept only where all agree); concatenations given are flattened, and one
dataset is given back as it is.)doc");
}

}  // namespace mmt::python
