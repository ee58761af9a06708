// mmt export FILE... DIR: each field back as .npy files (of all the records, for shards read
// as one dataset). A fixed-shape field is DIR/NAME.npy of shape [records, ...], so `pack` then
// `export` gives the original arrays byte for byte: a field packed from a Fortran-order .npy
// (listed in the metadata key "npy_fortran_order") is written back in Fortran order (unless
// --c-order); a big-endian source comes back with the same values in native order. A ragged
// field is written in PyTorch's jagged layout (stage_ragged_field()), its values in C order
// (pack records no ragged field as Fortran-order: its records are runs of the values' rows).
// A field is written a piece of records at a time, so a field larger than memory exports too.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "mmt_commands.h"
#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include <nlohmann/json.hpp>

#include "fortran_order.h"
#include "import_util.h"
#include "mmtensor/packer.h"
#include "interrupt.h"
#include "npy_format.h"
#include "mmtensor/numpy_io.h"
#include "output_file.h"

namespace mmt::tool {
namespace {

namespace fs = std::filesystem;

struct ExportArgs {
  std::vector<std::string> files;
  std::string dir;
  std::vector<std::string> fields;
  bool force = false;
  bool c_order = false;
};

// How many bytes of a field an export holds in memory at once: its records are read, checked
// and written this many at a time (at least one record).
constexpr int64_t kExportPieceBytes = int64_t{16} << 20;

// An export reads every byte and promises them exactly, so every chunk's checksum is checked,
// uncompressed ones too (by default the reader skips those: random access reads one record,
// and hashing would read its whole chunk). column() checks the chunks under it, also when it
// is one view over a contiguous file.
// Every chunk is read once a pass, in order, so cached chunks are never read again: the
// cache is kept to a piece's worth, and memory stays a few pieces whatever the file's size.
Dataset open_for_export(const std::vector<std::string>& files) {
  ReaderOptions options;
  options.verify_uncompressed = true;
  options.cache_bytes = kExportPieceBytes;
  return Dataset::open_concat(files, options);
}

// A bool byte other than 0 or 1 is damage (FORMAT.md) that the checksums cannot see when the
// writer put it there; an .npy of it would be refused by `mmt pack` and read by numpy as a
// value no bool holds. Named with its file and record there, as `mmt verify` names its chunk.
[[noreturn]] void throw_non_bool_byte(const Dataset& ds, int64_t record, const std::string& field, std::byte value) {
  const Dataset::Location where = ds.locate(record);
  const std::vector<Dataset> parts = ds.parts();
  const std::string in_concatenation =
      parts.size() > 1 ? detail::str(" (record ", record, " of the ", parts.size(), " files)") : std::string();
  throw FormatError(detail::str(parts[where.part].path(), ": field '", printable(field), "': record ", where.index,
                                in_concatenation, " holds the bool byte ", static_cast<int>(static_cast<uint8_t>(value)),
                                " (bool values are 0 or 1); mmt verify reports its chunk"));
}

// `values`: records [first_record, ...) of a fixed field, contiguous.
void refuse_non_bool_bytes(const Dataset& ds, const Tensor& values, int64_t first_record, const std::string& field) {
  const auto* bytes = static_cast<const std::byte*>(values.data_ptr());
  const int64_t at = detail::first_invalid_bool(bytes, values.numel());
  if (at < 0) return;
  const int64_t per_record = values.numel() / std::max<int64_t>(values.size(0), 1);
  throw_non_bool_byte(ds, first_record + at / per_record, field, bytes[at]);
}

// A Fortran-order field is read this many bytes of records at a time: each read becomes one
// write per position within a record, a run of that read's records, so larger reads make
// fewer, longer writes (runs of 445 bytes for a 3x224x224 uint8 image field, 150,528 writes
// a read; one write for a whole MNIST-sized field).
constexpr int64_t kFortranReadBytes = int64_t{64} << 20;

// Whether `text` nests no array or object inside another: the most a list of names holds.
// Checked before parsing: the value comes from the file, and a parser builds (and some
// nlohmann versions destroy, recursively) one node per level of a deep one.
bool is_flat_json(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char ch : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (ch == '\\') escaped = true;
      else if (ch == '"') in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > 1) return false;
    } else if (ch == ']' || ch == '}') {
      if (--depth < 0) return false;
    }
  }
  return true;
}

// The fields packed from a Fortran-order .npy (pack's metadata). The value comes from the
// file: one that is not a JSON list of names is reported and read as none, so the export
// still runs, in C order.
std::vector<std::string> fortran_order_fields(const Dataset& ds) {
  const auto it = ds.metadata().find(std::string(kFortranOrderMetadataKey));
  if (it == ds.metadata().end()) return {};
  nlohmann::json names;
  if (is_flat_json(it->second)) names = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  std::vector<std::string> out;
  if (names.is_array())
    for (const auto& name : names)
      if (name.is_string()) out.push_back(name.get<std::string>());
  if (!names.is_array() || out.size() != names.size()) {
    std::cerr << "mmt export: metadata '" << kFortranOrderMetadataKey
              << "' is not a list of field names; every field is written in C order\n";
    return {};
  }
  return out;
}

// Writes field `field` of every record of `ds` as an .npy file to a temporary of `files`, to
// be put at `path` by its publish(): the header, then pieces of records (column(field, first,
// stop), each checked: every chunk under it, and bool bytes), so that memory holds one piece,
// never the whole field. Returns the array's shape.
DimVector stage_field(detail::StagedFiles& files, const Dataset& ds, const std::string& field,
                      const std::string& path, bool fortran_order) {
  const Field& f = ds.schema()[ds.schema().index_of(field)];
  const int64_t records = ds.size();
  DimVector sizes{records};
  int64_t record_bytes = element_size(f.dtype);
  for (int64_t s : f.shape) {
    sizes.push_back(s);
    record_bytes *= s;
  }
  // Sized by what reading a record costs too: a small field of a compressed file decodes
  // whole records' worth of chunks (an int64 label beside a 150 KB image), and Ctrl-C is
  // answered between pieces.
  const DatasetInfo info = ds.info();
  const int64_t decoded_per_record = records > 0 ? info.decoded_bytes / records : 0;
  const int64_t piece_cost_per_record = std::max<int64_t>({record_bytes, decoded_per_record, 1});
  const int64_t records_per_piece = std::max<int64_t>(1, kExportPieceBytes / piece_cost_per_record);
  const std::string header = detail::npy_header_bytes(f.dtype, sizes, fortran_order);
  // Records [first, stop), checked: every chunk under them (column() hashes them), and bool bytes.
  auto read_records = [&](int64_t first, int64_t stop) {
    Tensor values = ds.column(field, first, stop).contiguous();
    if (f.dtype == kBool) refuse_non_bool_bytes(ds, values, first, field);
    return values;
  };
  if (fortran_order) {  // written out of order: each read's records go to every column they touch
    int64_t nbytes = 0;
    MMT_CHECK(!__builtin_mul_overflow(records, record_bytes, &nbytes) &&
                  !__builtin_add_overflow(nbytes, static_cast<int64_t>(header.size()), &nbytes),
              ValueError, "field '", printable(field), "': ", records, " records of ", record_bytes,
              " bytes overflow a 64-bit file size");
    const int64_t records_per_read = std::max<int64_t>(1, kFortranReadBytes / piece_cost_per_record);
    files.stage_positioned(path, nbytes, [&](const detail::WriteAt& write_at) {
      write_at(0, std::as_bytes(std::span(header)));
      // A stop is answered between reads too: a small field beside large ones writes little a read.
      auto read_or_stop = [&](int64_t first, int64_t stop) {
        StopSignals::check();
        return read_records(first, stop);
      };
      detail::write_fortran_order(write_at, static_cast<int64_t>(header.size()), read_or_stop, records, f.shape,
                                  f.dtype, records_per_read);
    });
    return sizes;
  }
  bool header_written = false;
  int64_t next_record = 0;
  Tensor piece;  // the bytes handed out last, alive until the next call
  files.stage_streamed(path, [&]() -> std::span<const std::byte> {
    if (!header_written) {
      header_written = true;
      return std::as_bytes(std::span(header));
    }
    while (next_record < records) {
      const int64_t first = next_record;
      next_record = std::min(records, first + records_per_piece);
      piece = read_records(first, next_record);
      if (piece.nbytes() > 0) return {static_cast<const std::byte*>(piece.data_ptr()), static_cast<size_t>(piece.nbytes())};
    }
    return {};
  });
  return sizes;
}

// The files an export writes for one field, in the order they are staged.
struct FieldFiles {
  std::string field;
  bool ragged = false;
  bool with_shapes = false;        // ragged, a dimension after the first varying
  std::vector<std::string> paths;  // NAME.npy; then, ragged, NAME.offsets.npy (and NAME.shapes.npy)
};

FieldFiles files_of(const Field& f, const std::string& dir) {
  FieldFiles out{f.name, !f.is_fixed(), false, {}};
  out.with_shapes = out.ragged && std::find(f.shape.begin() + 1, f.shape.end(), kVariableDim) != f.shape.end();
  out.paths.push_back((fs::path(dir) / (f.name + ".npy")).string());
  if (out.ragged) out.paths.push_back((fs::path(dir) / (f.name + ".offsets.npy")).string());
  if (out.with_shapes) out.paths.push_back((fs::path(dir) / (f.name + ".shapes.npy")).string());
  return out;
}

// A ragged field in PyTorch's jagged layout (the values and offsets of
// torch.nested.nested_tensor_from_jagged; Arrow's lists and Megatron's .bin/.idx are laid out
// so): NAME.npy holds the records' values back to back along its first dimension and
// NAME.offsets.npy (int64 [records + 1], from 0) where each starts, so that record i is
// values[offsets[i]:offsets[i + 1]]. Where only a record's first dimension varies (tokens
// [*], bytes [*], boxes [*, 4]), NAME.npy is [rows, ...the fixed dimensions] and that slice
// is the record. Where a later one varies (images [*, *, 3]), NAME.npy is 1-D, the slice is
// the record's values in row-major order, and NAME.shapes.npy (int64 [records, ndim]) gives
// the shape to reshape it to.
// Two passes of pieces of records (ragged_column(), which checks every chunk under them):
// the first finds the offsets (an .npy header states its length before the values) and
// checks bool bytes; the second writes the values. The offsets (and shapes) are held in
// memory, 8 bytes a record (and a dimension); the values a piece at a time, of whole chunks
// (ragged_piece_ends()). Returns each file's dtype and shape, in the order of files.paths.
// Where the pieces of a ragged field's export end: runs of whole chunks of at most
// kExportPieceBytes decoded (or one chunk, when it alone is larger). A chunk's decoded bytes
// bound what its records' field holds, so a piece never holds more, however unevenly the
// records are sized; pieces of an average record's count held a skewed field's every large
// record at once. Reads the chunk table, O(chunks).
std::vector<int64_t> ragged_piece_ends(const Dataset& ds) {
  std::vector<int64_t> ends;
  int64_t piece_bytes = 0;
  for (int64_t c = 0, chunks = ds.num_chunks(); c < chunks; ++c) {
    const ChunkInfo chunk = ds.chunk(c);
    if (piece_bytes > 0 && piece_bytes + chunk.decoded_bytes > kExportPieceBytes) {
      ends.push_back(chunk.first_record);
      piece_bytes = 0;
    }
    piece_bytes += chunk.decoded_bytes;
  }
  if (ds.size() > 0) ends.push_back(ds.size());
  return ends;
}

std::vector<std::pair<ScalarType, DimVector>> stage_ragged_field(detail::StagedFiles& files, const Dataset& ds,
                                                                 const FieldFiles& out) {
  const std::string& field = out.field;
  const Field& f = ds.schema()[ds.schema().index_of(field)];
  const int64_t records = ds.size();
  const int64_t ndim = static_cast<int64_t>(f.shape.size());
  const std::vector<int64_t> piece_ends = ragged_piece_ends(ds);

  std::vector<int64_t> offsets{0};  // in elements, then in rows of NAME.npy
  std::vector<int64_t> shapes;
  offsets.reserve(static_cast<size_t>(records) + 1);
  if (out.with_shapes) shapes.reserve(static_cast<size_t>(records * ndim));
  for (int64_t first = 0; const int64_t stop : piece_ends) {
    StopSignals::check();
    const RaggedBatch piece = ds.ragged_column(field, first, stop);
    const int64_t* ends = piece.offsets.data_ptr<int64_t>();
    const int64_t base = offsets.back();
    for (int64_t i = 1; i <= stop - first; ++i) offsets.push_back(base + ends[i]);  // a mapped file's elements: no overflow
    if (out.with_shapes) {
      const int64_t* s = piece.shapes.data_ptr<int64_t>();
      shapes.insert(shapes.end(), s, s + (stop - first) * ndim);
    }
    if (f.dtype == kBool) {
      const auto* bytes = static_cast<const std::byte*>(piece.values.contiguous().data_ptr());
      const int64_t at = detail::first_invalid_bool(bytes, piece.values.numel());
      if (at >= 0) {
        const int64_t record = first + (std::upper_bound(ends, ends + (stop - first) + 1, at) - ends) - 1;
        throw_non_bool_byte(ds, record, field, bytes[at]);
      }
    }
    first = stop;
  }

  // Rows of NAME.npy: a record's values when a later dimension varies, else its first index.
  DimVector values_shape;
  int64_t row_elements = 1;
  if (!out.with_shapes)
    for (int64_t d = 1; d < ndim; ++d) row_elements *= f.shape[static_cast<size_t>(d)];
  for (int64_t& offset : offsets) offset /= row_elements;  // whole rows: the reader checked each record's extents
  values_shape.push_back(offsets.back());
  if (!out.with_shapes)
    for (int64_t d = 1; d < ndim; ++d) values_shape.push_back(f.shape[static_cast<size_t>(d)]);

  const std::string values_header = detail::npy_header_bytes(f.dtype, values_shape);
  bool header_written = false;
  size_t next_piece = 0;
  Tensor piece_values;  // the bytes handed out last, alive until the next call
  files.stage_streamed(out.paths[0], [&]() -> std::span<const std::byte> {
    if (!header_written) {
      header_written = true;
      return std::as_bytes(std::span(values_header));
    }
    while (next_piece < piece_ends.size()) {
      const int64_t first = next_piece > 0 ? piece_ends[next_piece - 1] : 0;
      const int64_t next_record = piece_ends[next_piece++];
      piece_values = ds.ragged_column(field, first, next_record).values.contiguous();
      // The file was read once already: what it holds now must be what the header says.
      const int64_t expected = (offsets[static_cast<size_t>(next_record)] - offsets[static_cast<size_t>(first)]) * row_elements;
      MMT_CHECK(piece_values.numel() == expected, FormatError, ds.path(), ": field '", printable(field), "': records [",
                first, ", ", next_record, ") hold ", piece_values.numel(), " values, where they held ", expected,
                " a moment before; the file changed while it was exported");
      if (piece_values.nbytes() > 0)
        return {static_cast<const std::byte*>(piece_values.data_ptr()), static_cast<size_t>(piece_values.nbytes())};
    }
    return {};
  });

  std::vector<std::pair<ScalarType, DimVector>> written{{f.dtype, values_shape}};
  const DimVector offsets_shape{records + 1};
  const std::string offsets_header = detail::npy_header_bytes(kInt64, offsets_shape);
  files.stage(out.paths[1], {std::as_bytes(std::span(offsets_header)), std::as_bytes(std::span(offsets))});
  written.emplace_back(kInt64, offsets_shape);
  if (out.with_shapes) {
    const DimVector shapes_shape{records, ndim};
    const std::string shapes_header = detail::npy_header_bytes(kInt64, shapes_shape);
    files.stage(out.paths[2], {std::as_bytes(std::span(shapes_header)), std::as_bytes(std::span(shapes))});
    written.emplace_back(kInt64, shapes_shape);
  }
  return written;
}

// Removes the folders an export made (deepest first), each only if empty; whether it
// removed the first of them, the folder the export wrote into.
bool remove_made_folders(const std::vector<fs::path>& made_folders) {
  bool removed_first = false;
  std::error_code ignored;
  for (size_t i = 0; i < made_folders.size(); ++i) {
    const bool removed = fs::remove(made_folders[i], ignored);
    if (i == 0) removed_first = removed;
  }
  return removed_first;
}

void run_export(const ExportArgs& args) {
  MMT_CHECK(!args.dir.empty(), ValueError, "DIR is empty: name the folder to write the .npy files into");
  Dataset ds = open_for_export(args.files);
  // Every refusal before any write (the folder included), so an export either runs or leaves
  // the file system as it was.
  std::vector<std::string> names;
  for (const std::string& name : args.fields) {
    if (name.empty()) throw UsageError("--field is empty: name a field to export");
    (void)ds.schema().index_of(name);  // an unknown name lists the known ones
    MMT_CHECK(std::find(names.begin(), names.end(), name) == names.end(), UsageError, "--field '", printable(name),
              "' is given twice");
    names.push_back(name);
  }
  if (args.fields.empty()) {
    for (const Field& f : ds.schema()) {
      if (f.dtype == kBFloat16)  // named with --field, it is refused below with the reason
        std::cerr << "mmt export: skipping field '" << printable(f.name)
                  << "': bfloat16 has no numpy dtype, so it cannot be written to .npy\n";
      else
        names.push_back(f.name);
    }
    MMT_CHECK(!names.empty(), ValueError, ds.path(), ": no field to export; each is bfloat16, which .npy cannot "
              "hold (use mmt get --raw for one record)");
  }
  std::vector<FieldFiles> fields;
  std::vector<std::string> paths;  // every file, in the order staged
  std::map<std::string, std::string> writer_of;  // file -> the field that writes it
  for (const std::string& name : names) {
    const Field& f = ds.schema()[ds.schema().index_of(name)];
    (void)npy_descr(f.dtype);  // bfloat16 has no numpy dtype
    fields.push_back(files_of(f, args.dir));
    for (const std::string& file : fields.back().paths) {
      const std::string file_name = fs::path(file).filename().string();
      MMT_CHECK(file_name.size() <= 255, ValueError, "field '", printable(name), "' (", name.size(), " bytes): ",
                fields.back().ragged ? "its files (NAME.npy, NAME.offsets.npy" : "NAME.npy",
                fields.back().with_shapes ? ", NAME.shapes.npy)" : fields.back().ragged ? ")" : "",
                " would have a name longer than the 255 bytes of a file name; export the other fields with --field");
      // A ragged field "x" writes x.offsets.npy, the file of a field named "x.offsets".
      const auto [other, first_to_write_it] = writer_of.emplace(file, name);
      MMT_CHECK(first_to_write_it, ValueError, "fields '", printable(other->second), "' and '", printable(name),
                "' would both write ", printable(file), "; export one of them with --field");
      check_output_path(file, args.force, args.files);
      paths.push_back(file);
    }
  }
  // A companion file this export does not write (NAME.offsets.npy or NAME.shapes.npy of an
  // earlier export, when the field is now fixed, or ragged in its first dimension only) would
  // be read beside the new NAME.npy as describing it, and packed back wrongly without a word:
  // refused, or with --force removed once the new files stand.
  std::vector<std::pair<std::string, std::string>> stale;  // the file, the NAME.npy it would mislabel
  for (const FieldFiles& field : fields) {
    for (const char* companion : {".offsets", ".shapes"}) {
      const std::string file = (fs::path(args.dir) / (field.field + companion + ".npy")).string();
      // Also the NAME.npy of a field named "x.offsets" (written now, or by another export).
      if (writer_of.contains(file) || ds.schema().find(field.field + companion)) continue;
      std::error_code ec;
      if (!fs::exists(fs::symlink_status(file, ec))) continue;
      MMT_CHECK(args.force, ValueError, printable(file), " exists, but this export writes no such file for field '",
                printable(field.field), "' (", field.ragged ? "ragged in its first dimension only" : "not ragged",
                "): left from an earlier export, it would describe the new ", printable(field.paths[0]),
                " wrongly; pass --force to remove it, or remove it");
      check_output_path(file, /*force=*/true, args.files);  // a regular file, and not the dataset read
      stale.emplace_back(file, field.paths[0]);
    }
  }
  // What cannot be known before writing (a damaged chunk met by column(), a name the file
  // system finds too long, a full disk) undoes the export. Every .npy is written to a
  // temporary first and put in place only once all are written, so no existing file is
  // replaced by a failed export; the folders it made go too.
  std::vector<fs::path> made_folders;
  std::error_code unknown;  // a folder that cannot be looked at is not counted as made here
  for (fs::path folder = fs::absolute(args.dir); !folder.empty() && !fs::exists(folder, unknown) && !unknown;
       folder = folder.parent_path()) {
    made_folders.push_back(folder);
    if (folder == folder.parent_path()) break;
  }
  std::ostringstream written;  // printed once the whole export stands
  StopSignals stop_signals;  // Ctrl-C undoes the export as a failure does
  try {
    std::error_code ec;
    fs::create_directories(args.dir, ec);
    MMT_CHECK(!ec && fs::is_directory(args.dir), IoError, "cannot create folder ", args.dir, ": ",
              ec ? ec.message() : "a file is in the way");
    detail::StagedFiles files(args.force, StopSignals::check);
    const std::vector<std::string> fortran = args.c_order ? std::vector<std::string>{} : fortran_order_fields(ds);
    for (const FieldFiles& field : fields) {
      const ScalarType dtype = ds.schema()[ds.schema().index_of(field.field)].dtype;
      if (!field.ragged) {
        const bool fortran_order = std::find(fortran.begin(), fortran.end(), field.field) != fortran.end();
        const DimVector sizes = stage_field(files, ds, field.field, field.paths[0], fortran_order);
        written << printable(field.paths[0]) << "  " << to_string(dtype) << " " << sizes
                << (fortran_order ? " (Fortran order, as packed)" : "") << "\n";
        continue;
      }
      const auto shapes = stage_ragged_field(files, ds, field);
      for (size_t k = 0; k < shapes.size(); ++k)
        written << printable(field.paths[k]) << "  " << to_string(shapes[k].first) << " " << shapes[k].second
                << (k == 0 ? " (the values of a ragged field)" : k == 1 ? " (where each record starts)" : " (each record's shape)")
                << "\n";
    }
    files.publish();
    for (const auto& [file, values] : stale) {
      std::error_code ec;
      fs::remove(file, ec);
      MMT_CHECK(!ec, IoError, "the new files were written, but ", printable(file), ", left from an earlier export, ",
                "could not be removed (", ec.message(), "); remove it: it does not describe the new ", printable(values));
      written << printable(file) << "  removed (left from an earlier export; this one writes none)\n";
    }
    note_published(paths.size() == 1 ? detail::str(paths[0], " was written and is complete")
                                     : detail::str("the ", paths.size(), " files were written and are complete"));
  } catch (const Interrupted& e) {
    std::string what = not_written(paths);
    if (remove_made_folders(made_folders))
      what.append(detail::str("; the folder ", args.dir, ", which this run created, was removed"));
    exit_interrupted("mmt export", e.signal_number(), what);
  } catch (...) {
    remove_made_folders(made_folders);
    throw;
  }
  std::cout << written.str();
}

}  // namespace

void add_export_command(CLI::App& app) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* cmd = app.add_subcommand("export", "Write each field to DIR/NAME.npy (a ragged one with NAME.offsets.npy, as PyTorch's jagged layout)");
  add_files_then_option(cmd, "DIR", args->files, args->dir,
                        "The dataset file (or several shards read as one dataset, in order), then the folder to "
                        "write into (created if missing)");
  // One name per --field: a repeated option must not take the files that follow it.
  cmd->add_option("--field", args->fields, "Only this field (repeat for several)")
      ->allow_extra_args(false);
  cmd->add_flag("--force", args->force,
                "Replace existing .npy files, and remove a NAME.offsets.npy or NAME.shapes.npy an earlier export "
                "left that this one does not write");
  cmd->add_flag("--c-order", args->c_order,
                "Write every field in C order, also those packed from Fortran-order arrays (which are otherwise "
                "written back in Fortran order, as they came)");
  cmd->callback([args] { run_export(*args); });
}

}  // namespace mmt::tool
