// mmt export FILE... DIR: each fixed-shape field back as DIR/NAME.npy of shape [records, ...]
// (of all the records, for shards read as one dataset),
// so `pack` then `export` gives the original arrays byte for byte: a field packed from a
// Fortran-order .npy (listed in the metadata key "npy_fortran_order") is written back in
// Fortran order (unless --c-order); a big-endian source comes back with the same values in
// native order.
// A field is written a piece of records at a time, so a field larger than memory exports too.
#include <algorithm>
#include <filesystem>
#include <iostream>
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

// An export reads every byte and promises them exactly, so every chunk's checksum is checked,
// uncompressed ones too (by default the reader skips those: random access reads one record,
// and hashing would read its whole chunk). column() checks the chunks under it, also when it
// is one view over a contiguous file.
Dataset open_for_export(const std::vector<std::string>& files) {
  ReaderOptions options;
  options.verify_uncompressed = true;
  return Dataset::open_concat(files, options);
}

// A bool byte other than 0 or 1 is damage (FORMAT.md) that the checksums cannot see when the
// writer put it there; an .npy of it would be refused by `mmt pack` and read by numpy as a
// value no bool holds. Named with its file and record there, as `mmt verify` names its chunk.
// `values`: records [first_record, ...) of the field, contiguous.
void refuse_non_bool_bytes(const Dataset& ds, const Tensor& values, int64_t first_record, const std::string& field) {
  const auto* bytes = static_cast<const std::byte*>(values.data_ptr());
  const int64_t at = detail::first_invalid_bool(bytes, values.numel());
  if (at < 0) return;
  const int64_t per_record = values.numel() / std::max<int64_t>(values.size(0), 1);
  const int64_t record = first_record + at / per_record;
  const Dataset::Location where = ds.locate(record);
  const std::vector<Dataset> parts = ds.parts();
  const std::string in_concatenation =
      parts.size() > 1 ? detail::str(" (record ", record, " of the ", parts.size(), " files)") : std::string();
  throw FormatError(detail::str(parts[where.part].path(), ": field '", printable(field), "': record ", where.index,
                                in_concatenation, " holds the bool byte ",
                                static_cast<int>(static_cast<uint8_t>(bytes[at])),
                                " (bool values are 0 or 1); mmt verify reports its chunk"));
}

// How many bytes of a field an export holds in memory at once: its records are read, checked
// and written this many at a time (at least one record).
constexpr int64_t kExportPieceBytes = int64_t{16} << 20;
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
    const Field& f = ds.schema()[ds.schema().index_of(name)];  // an unknown name lists the known ones
    MMT_CHECK(std::find(names.begin(), names.end(), name) == names.end(), UsageError, "--field '", printable(name),
              "' is given twice");
    MMT_CHECK(f.is_fixed(), ValueError, "field '", printable(name), "' varies in shape from record to record (",
              f.shape, "); export writes fixed-shape fields, one .npy each (use mmt get --raw for one record)");
    names.push_back(name);
  }
  if (args.fields.empty()) {
    for (const Field& f : ds.schema()) {
      if (!f.is_fixed())
        std::cerr << "mmt export: skipping field '" << printable(f.name)
                  << "': its records vary in shape (use mmt get --raw for one record)\n";
      else if (f.dtype == kBFloat16)  // named with --field, it is refused below with the reason
        std::cerr << "mmt export: skipping field '" << printable(f.name)
                  << "': bfloat16 has no numpy dtype, so it cannot be written to .npy\n";
      else
        names.push_back(f.name);
    }
    MMT_CHECK(!names.empty(), ValueError, ds.path(), ": no field to export; each varies in shape from record to "
              "record or is bfloat16, which .npy cannot hold (use mmt get --raw for one record)");
  }
  std::vector<std::string> paths;
  for (const std::string& name : names) {
    (void)npy_descr(ds.schema()[ds.schema().index_of(name)].dtype);  // bfloat16 has no numpy dtype
    MMT_CHECK(name.size() <= kMaxWrittenFieldNameBytes, ValueError, "field '", printable(name), "' (", name.size(),
              " bytes): NAME.npy would be longer than the 255 bytes of a file name (writers now cap names at ",
              kMaxWrittenFieldNameBytes, " bytes); export the other fields with --field");
    paths.push_back((fs::path(args.dir) / (name + ".npy")).string());
    check_output_path(paths.back(), args.force, args.files);
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
    for (size_t k = 0; k < names.size(); ++k) {
      const bool fortran_order = std::find(fortran.begin(), fortran.end(), names[k]) != fortran.end();
      const DimVector sizes = stage_field(files, ds, names[k], paths[k], fortran_order);
      written << printable(paths[k]) << "  " << to_string(ds.schema()[ds.schema().index_of(names[k])].dtype) << " "
              << sizes << (fortran_order ? " (Fortran order, as packed)" : "") << "\n";
    }
    files.publish();
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
  CLI::App* cmd = app.add_subcommand("export", "Write each fixed-shape field to DIR/NAME.npy");
  add_files_then_option(cmd, "DIR", args->files, args->dir,
                        "The dataset file (or several shards read as one dataset, in order), then the folder to "
                        "write into (created if missing)");
  // One name per --field: a repeated option must not take the files that follow it.
  cmd->add_option("--field", args->fields, "Only this field (repeat for several)")
      ->allow_extra_args(false);
  cmd->add_flag("--force", args->force, "Replace existing .npy files");
  cmd->add_flag("--c-order", args->c_order,
                "Write every field in C order, also those packed from Fortran-order arrays (which are otherwise "
                "written back in Fortran order, as they came)");
  cmd->callback([args] { run_export(*args); });
}

}  // namespace mmt::tool
