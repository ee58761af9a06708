// mmtensor.pack(): the packer `mmt pack` runs (.npy, .npz, IDX files, folders, datasets), from
// Python, with Ctrl-C honoured: the packing thread looks at Python's signals with each
// progress report, and between the steps of reading its inputs, and cancels, leaving the
// output path as it was.
#include <pybind11/stl.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "bindings.h"
#include "load_cancel.h"  // engine/

namespace mmt::python {

namespace {

// "NAME=PATH" specs from a dict {name: path} or a list of specs (and "PATH.npz").
std::vector<std::string> array_specs(const py::handle& inputs) {
  std::vector<std::string> specs;
  if (py::isinstance<py::dict>(inputs)) {
    for (const auto& item : inputs.cast<py::dict>()) {
      if (!py::isinstance<py::str>(item.first)) throw py::type_error("pack: a field name must be a str, not " +
                                                                    std::string(Py_TYPE(item.first.ptr())->tp_name));
      const std::string name = name_text(item.first);
      // Joined into "NAME=PATH", a name with '=' or '/' (or none) would be read as part of a path.
      if (name.empty() || name.find_first_of("=/") != std::string::npos)
        throw py::value_error("pack: field name " + py::repr(item.first).cast<std::string>() +
                              " is empty or holds '=' or '/'; a field name is written to NAME.npy by export");
      specs.push_back(name + "=" + path_of(item.second));
    }
    return specs;
  }
  if (py::isinstance<py::str>(inputs) || !py::isinstance<py::iterable>(inputs))
    throw py::type_error("pack: inputs must be a dict {field: path} or a list of 'NAME=PATH', 'PATH.npz' or dataset paths"
                         " (a list of one for a single path)");
  for (const py::handle& spec : inputs) specs.push_back(path_of(spec));
  return specs;
}

// {name: path} of offsets= or shapes= (pack's jagged arrays).
std::map<std::string, std::string, std::less<>> jagged_paths(const py::object& given, const char* argument) {
  std::map<std::string, std::string, std::less<>> out;
  if (given.is_none()) return out;
  if (!py::isinstance<py::dict>(given))
    throw py::type_error(std::string("pack: ") + argument + "= must be a dict {field: path to an .npy}");
  for (const auto& item : given.cast<py::dict>()) {
    if (!py::isinstance<py::str>(item.first))
      throw py::type_error(std::string("pack: a field name of ") + argument + "= must be a str, not " +
                           Py_TYPE(item.first.ptr())->tp_name);
    // The arrays travel as files (the packer maps them): an array given here is a mistake
    // worth naming, where os.fspath's TypeError says nothing of offsets=.
    if (!py::isinstance<py::str>(item.second) && !py::isinstance<py::bytes>(item.second) &&
        !py::hasattr(item.second, "__fspath__"))
      throw py::type_error(std::string("pack: ") + argument + "= maps field names to paths of .npy files, not " +
                           Py_TYPE(item.second.ptr())->tp_name + " (np.save an array first)");
    out.emplace(name_text(item.first), path_of(item.second));
  }
  return out;
}

}  // namespace

void bind_pack(py::module_& m) {
  m.def("pack", [](const py::object& output, const py::object& inputs, const py::object& folder, const std::string& codec,
                   const py::object& chunk_bytes, const py::object& chunk_records, const py::object& alignment,
                   const py::object& threads, bool overwrite, const py::object& metadata,
                   std::optional<std::pair<int64_t, int64_t>> shard, bool paths,
                   const py::object& field_names, bool keys, std::optional<int64_t> window, int64_t window_stride,
                   std::optional<int64_t> separator, const py::object& extensions, const std::string& missing,
                   const py::object& offsets, const py::object& shapes) {
    const std::vector<std::string> fields = field_names_of(field_names);  // fields="x" names one, as Loader's
    if (inputs.is_none() == folder.is_none()) throw py::value_error("pack: give inputs= (arrays or datasets) or folder= (a folder), one of them");
    const std::string path = path_of(output);
    const std::vector<std::string> specs = inputs.is_none() ? std::vector<std::string>{} : array_specs(inputs);
    const std::string dir = folder.is_none() ? std::string() : path_of(folder);
    if (paths && dir.empty()) throw py::value_error("pack: paths=True stores the path of each file of a folder; give folder=");
    if ((window_stride != 0 || separator) && !window)
      throw py::value_error("pack: window_stride= and separator= shape the windows of window=; give window= too");
    if (keys && !dir.empty()) throw py::value_error("pack: keys=True stores the key of each sample of tar archives; a folder has paths=True");
    const JaggedArrays jagged{jagged_paths(offsets, "offsets"), jagged_paths(shapes, "shapes")};
    if (!jagged.empty() && !dir.empty())
      throw py::value_error("pack: offsets= and shapes= give ragged fields of array inputs, not of a folder");
    TarOptions tar{.keys = keys, .extensions = extensions.is_none() ? std::vector<std::string>{} : field_names_of(extensions)};
    const std::optional<MissingMember> missing_member = missing_member_from_string(missing);
    if (!missing_member) throw py::value_error("pack: missing= takes 'error', 'skip' or 'empty', got '" + missing + "'");
    tar.missing = *missing_member;
    if ((!tar.extensions.empty() || tar.missing != MissingMember::Error) && !dir.empty())
      throw py::value_error("pack: extensions= and missing= choose the fields of tar archives' samples, not of a folder");
    if (!fields.empty() && !dir.empty()) throw py::value_error("pack: fields= chooses fields of datasets given as inputs, not of a folder");
    PackOptions options;
    options.writer.codec = CodecSpec::parse(codec);
    options.writer.chunk_bytes = integer_argument<int64_t>(chunk_bytes, "chunk_bytes");
    options.writer.chunk_records = integer_argument<int64_t>(chunk_records, "chunk_records");
    options.writer.alignment = integer_argument<int64_t>(alignment, "alignment");
    options.writer.threads = integer_argument<int>(threads, "threads");
    options.writer.overwrite = overwrite;
    options.writer.metadata = metadata_argument(metadata);
    if (shard) {
      std::tie(options.shard, options.shards) = *shard;
      (void)shard_records(0, options.shard, options.shards);  // a bad shard fails before inputs load
    }
    // Python's signal handlers run only between bytecodes; the packing thread checks them at
    // each progress report (every 0.1 s) and cancels on an exception (KeyboardInterrupt).
    std::atomic<bool> cancel{false};
    std::optional<py::error_already_set> interrupted;
    options.cancel = &cancel;
    if (on_main_thread()) {  // signals reach Python there only (bindings.h)
      const auto check_signals = [&] {
        py::gil_scoped_acquire gil;
        if (!interrupted && PyErr_CheckSignals() != 0) {
          interrupted.emplace();  // takes the pending exception
          cancel = true;
        }
        return cancel.load();
      };
      options.on_progress = [check_signals](const WriteStats&) { check_signals(); };
      // Also while the last chunks are compressed and just before the file is published, so a
      // Ctrl-C of the last 0.1 s is not taken after the rename.
      options.cancelled = check_signals;
    }
    try {
      const WriteStats stats = without_gil([&] {
        // Reading the inputs may take minutes (an HDF5 dataset decoded, a .tar.gz decompressed):
        // the loaders ask between their steps too.
        std::optional<detail::LoadCancelScope> load_cancel;
        if (options.cancelled) load_cancel.emplace(options.cancelled);
        PackSources sources = dir.empty() ? PackSources::from_inputs(specs, fields, tar, jagged) : PackSources::from_folder(dir, {.paths = paths});
        if (window) sources = PackSources::token_windows(std::move(sources), {.length = *window, .stride = window_stride, .separator = separator});
        return pack_dataset(path, sources, options);
      });
      // Progress reports go on while finish() compresses the last chunks, and it asks once
      // more before it renames the file into place; a Ctrl-C taken after that (by the report
      // after finish()) is not lost: the dataset is published whole, and the
      // KeyboardInterrupt raised as Python raises one after a call returns.
      if (interrupted) throw *interrupted;
      return stats_dict(stats);
    } catch (const PackCancelled&) {
      if (interrupted) throw *interrupted;
      throw;
    } catch (const IoError& e) {
      rethrow_create_error(e, path, overwrite);
    }
  }, py::arg("output"), py::arg("inputs") = py::none(), py::kw_only(), py::arg("folder") = py::none(),
     py::arg("codec") = "none", py::arg("chunk_bytes") = WriterOptions{}.chunk_bytes, py::arg("chunk_records") = 0,
     py::arg("alignment") = WriterOptions{}.alignment, py::arg("threads") = 0, py::arg("overwrite") = false,
     py::arg("metadata") = py::none(), py::arg("shard") = py::none(), py::arg("paths") = false,
     py::arg("fields") = py::none(), py::arg("keys") = false, py::arg("window") = py::none(),
     py::arg("window_stride") = 0, py::arg("separator") = py::none(), py::arg("extensions") = py::none(),
     py::arg("missing") = "error", py::arg("offsets") = py::none(), py::arg("shapes") = py::none(), R"doc(
Packs files into a dataset at `output`, as `mmt pack` does, and returns the figures.

    mmtensor.pack("train.mmt", {"images": "train-images-idx3-ubyte.gz",
                                "labels": "train-labels-idx1-ubyte.gz"}, codec="lz4")
    mmtensor.pack("x.mmt", ["x=features.npy", "arrays.npz"])
    mmtensor.pack("svhn.mmt", {"x": "svhn.h5:train/X", "y": "svhn.h5:train/y"})  # HDF5 datasets
    mmtensor.pack("photos.mmt", folder="photos/", codec="zstd")   # DIR/CLASS/FILE
    mmtensor.pack("all.mmt", ["part-0.mmt", "part-1.mmt"], codec="zstd")  # repack datasets
    mmtensor.pack("laion.mmt", ["shard-0000.tar", "shard-0001.tar"], keys=True)  # WebDataset
    mmtensor.pack("gpt.mmt", {"tokens": "train.npy"}, window=2049, window_stride=2048)
    mmtensor.pack("pile.mmt", ["pile_text_document"], window=2049, window_stride=2048, separator=0)  # Megatron
    mmtensor.pack("docs.mmt", {"tokens": "tokens.npy"}, offsets={"tokens": "doc_offsets.npy"})  # documents

inputs: a dict {field: path} or a list of "NAME=PATH" and "PATH.npz" (.npy, .npz and IDX
files, gzipped or not; "PATH.h5", every dataset of an HDF5 file a field, or "NAME=PATH.h5:DATASET"
one, of numbers, h5py's bools or complex numbers); offsets={name: path} makes a field ragged, its array the records' values
back to back and the .npy at path (records + 1 integers from 0) where each starts: record i is
values[offsets[i]:offsets[i + 1]], PyTorch's jagged layout (what `mmt export` writes of a ragged
field); shapes={name: path} adds each record's shape ([records, ndim]) for records that vary after
their first dimension, the values then 1-D; folder: a class folder instead, one record per file (field "data",
its bytes; "label", its class's index; the class names in metadata["classes"]), or a folder
of files alone ("data" only); paths=True adds field "path", each file's path under the
folder (bytes, as the file system gives them: os.fsdecode(bytes(ds[i]["path"]))). inputs may instead be mmtensor datasets, all
of them, read as one and repacked (another codec, chunk size or alignment; shards merged);
fields=[...] keeps only those of their fields. inputs may instead be WebDataset shards (tar
archives, all of them; .tar.gz and .tar.zst are decompressed into a temporary file first): one record per sample, one field per extension (the member's bytes;
"cls" as int64), keys=True adding "__key__"; extensions=["jpg;png", "cls"] chooses the fields
(the first alternative listed that a sample has, as WebDataset's to_tuple takes them; other
members passed over)
and missing="skip" or "empty" what a sample lacking one gives (default "error"). inputs may instead be Megatron-LM indexed
datasets (PREFIX, PREFIX.idx or PREFIX.bin; {"ids": PREFIX} names the field, else "tokens"):
one record per document, its tokens in the index's dtype. inputs may instead be MosaicML
Streaming datasets (a folder holding index.json): one record per sample, a field per column. inputs may
instead be Apache Arrow files (.arrow, .arrows, .feather, .ipc) or a folder that Hugging Face datasets'
save_to_disk wrote (pack one split's): one record per row, a field per column (structs flattened:
"image.bytes"), lists of numbers as N-d arrays, fields=[...] choosing the columns; or Parquet files
(.parquet), packed as Arrow columns are. inputs may instead be TensorFlow TFRecord files of
tf.train.Example records (.tfrecord, .tfrecords, GZIP or ZLIB or not): one record per Example, a field per
feature ("image/encoded" as "image.encoded"), fields=[...] choosing them; a SequenceExample's feature lists
are fields of the record's steps ([steps, n] numbers, uint8 [steps, W] frames), "feature:KEY" and
"feature_list:KEY" choosing one where the context and feature lists share KEY. window=L cuts the one field given
(a 1-D array, Megatron documents, or fields=[name] of datasets whose records are documents) into records of L tokens starting every
window_stride (default L) over its values as one stream, separator=T after each document
(metadata["token_windows"] records how). Large
arrays are read where they lie, not into memory. The file appears complete or not at all:
an error or Ctrl-C (KeyboardInterrupt) leaves `output` as it was (a Ctrl-C that comes while
the file is being finished, its last chunks compressed and synced, is raised once it is
published whole). shard=(k, n) packs only
share k of n (k from 0), so n processes pack in parallel; Dataset([the n files]) reads
them as one, in order.)doc");
}

}  // namespace mmt::python
