// Packing: building a dataset from the files users already have, and checking a dataset
// against them. This is what `mmt pack` and `mmt verify --against` run; it is a library API
// so a program can do the same without the command.
//
// Sources. Either named arrays whose first dimension is the record dimension:
//   "NAME=PATH.npy"   one field (mapped, not read, when the file allows it)
//   "PATH.npz"        one field per array of the archive, named as in it (stored members
//                     mapped; deflated ones inflated a batch of records at a time as they
//                     are packed, their CRC-32 checked at their end)
//   "NAME=PATH"       an IDX file, gzip-compressed or not (MNIST's train-images-idx3-ubyte.gz)
//   "NAME=PATH:DTYPE[:D1xD2...]"  a raw file of DTYPE values in native byte order with no
//                     header (nanoGPT's train.bin: "tokens=train.bin:uint16"), one value a
//                     record or records of shape [D1, D2, ...]; mapped, not read. Its size
//                     must be a whole number of records (ValueError says what is left over)
// whose record counts must agree. An array may also hold a ragged field's records back to
// back, in PyTorch's jagged layout (JaggedArrays below: what `mmt export` writes of a ragged
// field, and how tokenized documents are kept as a token array and its document offsets).
// Values that cannot be used where they lie (big-endian, or
// a stored member unaligned for its dtype, as numpy's ZIP headers leave most) are converted a
// batch of records at a time: a large .npy or .npz array is never copied into memory whole.
// A Fortran-order array's records are not contiguous bytes, so one that cannot be used where
// it lies (deflated, big-endian, unaligned) is converted once, when the sources are loaded
// (after the checks below), into an unnamed temporary file in $TMPDIR (or /tmp) that is
// mapped: it needs that much free space there, not memory (on a tmpfs, that is memory: set
// TMPDIR to a folder on a disk). The fields whose .npy was in Fortran order are listed in the
// metadata key "npy_fortran_order" (kFortranOrderMetadataKey) as a JSON list, so that `mmt
// export` writes them back in that order. An IDX file that is gzipped or holds multi-byte values
// (stored big-endian) is read into memory whole: IDX datasets are MNIST-sized. Or a class
// folder (ImageFolder's convention): one record
// per file under DIR/CLASS/..., field "data" holding the file's bytes (uint8, variable
// length) and field "label" (int64) the index of CLASS among the sorted class names, which
// are stored in the metadata key "classes" as a JSON list. Or a folder of files alone, no
// subfolder (unlabeled data): one record per file, field "data" only, no "classes". Either
// folder's records come in the order of their paths (sorted by class, then by name), and
// FolderOptions::paths adds each one's path. Or mmtensor datasets, to repack them: another
// codec, chunk size or alignment, shards merged into one file, some fields left out. Or
// WebDataset shards: tar archives (uncompressed, or gzip- or zstd-compressed: .tar.gz, .tgz,
// .tar.zst, decompressed first into an unnamed file in $TMPDIR, or /tmp: see "Scratch" below)
// whose members are grouped into samples by key
// (the member's path up to the first '.' of its file name: "000/x.jpg" and "000/x.cls" are
// sample "000/x"), one record per sample, in archive order, the archives one after another.
// Each extension (the rest of the name, lower-cased: "jpg", "seg.png") is a field holding the
// member's bytes (uint8, variable length; a view into the mapped archive), but for "cls",
// WebDataset's class number in decimal text, stored as int64. Fields come in name order;
// every sample must have the same extensions, unless TarOptions chooses the fields and what a
// sample lacking one gives. TarOptions::keys adds field "__key__", each sample's key. Members
// whose file name has no '.' or starts with one are skipped. Or
// Megatron-LM indexed datasets ("[NAME=]PREFIX", PREFIX.idx or PREFIX.bin: the pair that
// Megatron, NeMo and GPT-NeoX preprocess text into): one record per document, in order, the
// datasets one after another, field NAME ("tokens" unless named) holding its tokens (ragged,
// the index's dtype; a view into the mapped .bin, the document's sequences joined). Or
// MosaicML Streaming datasets (a folder holding index.json, or that file; MDS shards,
// uncompressed or zstd/gz, the latter each decompressed when the sources are made into an
// unnamed file in $TMPDIR: see "Scratch"): one record per sample, one field
// per column (pack_mds.cc says how each encoding is stored; the encodings are in the
// metadata key "mds_encodings"). Or Apache Arrow IPC files and streams (".arrow", ".arrows",
// ".feather", ".ipc", or any file beginning with "ARROW1"), or a folder that Hugging Face
// datasets' save_to_disk wrote (its state.json lists the .arrow files): one record per row,
// the files one after another, one field per column (a struct's columns flattened as
// "image.bytes"); pack_arrow.cc says how each Arrow type is stored. Numbers, bools, byte
// strings, lists of numbers (nested: N-d arrays) and lists of strings (NAME, their bytes
// joined, and NAME.lengths) are packed; other types are refused by
// name unless the fields chosen leave them out. The Arrow type of each field is in the
// metadata key "arrow_types", Hugging Face's features in "huggingface" (and the class names of
// a ClassLabel column in "classes"). Compressed record batches (Feather's lz4, zstd) are
// decompressed when the sources are made into an unnamed file in $TMPDIR. Parquet files
// (".parquet", ".pq", or any file beginning with "PAR1"), and folders of .parquet files (in
// name order), are Arrow inputs too: the columns chosen are decoded, a row group at a time,
// into Arrow's layout (parquet.h) in an unnamed file in $TMPDIR, and packed as above.
//
// Scratch. Decompressed tar archives, MDS shards and TFRecord files are kept within a budget of $TMPDIR
// (MMT_SCRATCH_BYTES, such as "20G"; half the folder's free space by default): those past it
// are dropped once the sources have read them and decompressed again when their records are
// read (record() then pays that decompression; the bytes are checked to be the same), so the
// folder needs room for the budget and the archive in use, not for every input.
//
// Failure. Loading sources throws the importers' errors (IoError, FormatError) naming the
// file, and ValueError for sources that do not fit together (record counts, duplicate names,
// 0-d arrays, names that cannot be field names) or a folder with no file in any class.
// pack_dataset() writes through DatasetWriter, so an error or a cancellation leaves the
// output path as it was (the old file, or nothing).
//
// Thread safety: a PackSources may be read from many threads once built.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <optional>

#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "mmtensor/schema.h"
#include "mmtensor/tensor.h"

namespace mmt {

// The metadata key that lists, as a JSON list of names, the fields packed from a Fortran-order
// .npy (their values are stored as every field's, record by record).
inline constexpr std::string_view kFortranOrderMetadataKey = "npy_fortran_order";
// The metadata key of a shard packed with PackOptions::shards > 1: "K/N of R", share K (from
// 0) of N of sources of R records. Dataset::concat reads it to refuse a pack's shards given
// twice or out of order; a concatenation of only some of one pack's shards carries
// "K1,K2,.../N of R" under it, and `mmt verify` of several files refuses a pack incomplete.
inline constexpr std::string_view kShardMetadataKey = "pack_shard";
// Beside it, which sources the shard was cut from: 16 hex digits hashing the sources' record
// count, bytes of values, fields, class names and input files (base names, sizes, and bytes
// sampled from each: its first and last 64 KiB, which hold an .npz's member CRC-32s and a
// .gz's, and 64 blocks of 4 KiB between; for a class folder, its files' names), so that
// processes packing shards of the same inputs apart (on other machines too) write the same
// value, and shards of other inputs, or of inputs that changed between the runs, write
// another (but for a change to a raw .npy or IDX file that no sampled block sees, or to a
// class file that keeps its name). One pack's shards are those with equal N, R and this
// value (N and R alone for shards written before it existed).
inline constexpr std::string_view kShardSourceMetadataKey = "pack_source";

// The shards a kShardMetadataKey value names, or nullopt for text of another form (the key
// may be a user's own).
struct ShardList {
  std::vector<int64_t> shards;  // ascending, each in [0, count)
  int64_t count = 0;            // N
  int64_t records = 0;          // R, the records of the sources the shards were cut from
};
std::optional<ShardList> parse_shard_list(std::string_view text);
std::string to_string(const ShardList& list);

// A file's place in a pack, as its metadata gives it; nullopt when it is not one shard (no
// kShardMetadataKey, a subset's list, or a user's own value under the key).
struct PackedShard {
  int64_t index = 0;    // K
  int64_t count = 0;    // N
  int64_t records = 0;  // R
  std::string source;   // kShardSourceMetadataKey's value; empty for shards written before it
  // Shards of one pack have equal N, R and sources.
  bool same_pack(const PackedShard& other) const {
    return count == other.count && records == other.records && source == other.source;
  }
};
std::optional<PackedShard> packed_shard(const Metadata& metadata);
namespace detail {
class DeflatedMember;
}

// Raised by pack_dataset() when its cancel flag is set; the output path is left as it was.
class PackCancelled : public Error {
 public:
  using Error::Error;
};

// Raised by PackSources::from_arrays for a spec that the command line must change: an empty
// one, no path after '=', a field name with '/', the same NAME= twice, a NAME= missing for an
// .npy or IDX file or given to an .npz. `mmt` reports it as a bad command line, with status 2.
// (Names that archives bring, clashing, are their content: ValueError.)
class InputSpecError : public ValueError {
 public:
  using ValueError::ValueError;
};

struct FolderOptions {
  // Adds field "path" (uint8, variable length): each record's file path under the folder,
  // '/'-separated ("dog/001.jpg"), its bytes as the file system gives them (UTF-8 on most
  // systems): which file a record came from, once the folder is gone.
  bool paths = false;
};

// What a tar sample lacking a field's member gives (DALI's missing_component_behavior).
enum class MissingMember : uint8_t {
  Error,  // ValueError naming the sample and the member (the default)
  Skip,   // the sample is left out (PackSources::samples_skipped() counts them)
  Empty,  // an empty value (0 bytes); refused for "cls", whose class number cannot be empty. A
          // sample with none of the fields (a stray member) is left out, and counted, all the same
};

struct TarOptions {
  // Adds field "__key__" (uint8, variable length): each sample's key, as WebDataset names it.
  bool keys = false;
  // The fields, in this order, each an extension or alternatives joined by ';' ("jpg;png;jpeg":
  // the first of them, in the order listed, that a sample has, as WebDataset's to_tuple()
  // takes them; DALI's ext= takes the first in archive order), named after its first
  // extension (lower-case, as extensions are compared; blanks and a leading '.' dropped).
  // Members of other extensions are passed over. "cls" cannot have alternatives, and
  // "__key__" is the key's field (keys). Empty: the first sample's extensions, in name
  // order, and a later sample with another extension is refused.
  std::vector<std::string> extensions{};
  MissingMember missing = MissingMember::Error;  // DALI's default is empty; here, the strict one
};
// The metadata key under which a pack of tars with extensions or `missing` given records them
// (JSON {"extensions": [...], "missing": "error"|"skip"|"empty"}), so that `mmt verify
// --against` the archives groups them alike.
inline constexpr std::string_view kTarOptionsMetadataKey = "webdataset_options";
std::string_view to_string(MissingMember missing);
std::optional<MissingMember> missing_member_from_string(std::string_view name);
// TarOptions as a pack's metadata records them (kTarOptionsMetadataKey; keys are not: they are
// the field "__key__"); nullopt without the key. FormatError naming `where` when malformed.
std::optional<TarOptions> tar_options_of(const Metadata& metadata, const std::string& where);

// The metadata key of a dataset of token windows (PackSources::token_windows): a JSON object
// {"field", "length", "stride", "separator" (absent without one), "tokens" (the stream's),
// "dropped" (its tail that fills no window)}, from which `mmt verify --against` cuts the
// sources into the same windows.
inline constexpr std::string_view kTokenWindowsMetadataKey = "token_windows";

// Fixed-length windows over a stream of tokens, for language-model pretraining as llm-foundry's
// concat_tokens and nanoGPT's train.bin prepare it: the values of the sources' one field, in
// record order, concatenated into a stream (a 1-D array's values; a dataset's documents, each
// followed by `separator` when one is given), cut into records of `length` tokens that start
// every `stride` tokens. With stride = length the windows tile the stream; length = L + 1 with
// stride = L gives each record a model's L inputs and, shifted by one, its L targets. A tail
// that fills no window is dropped (its size is in the metadata).
struct WindowOptions {
  int64_t length = 0;                  // tokens a record holds, >= 1
  int64_t stride = 0;                  // tokens from one record's start to the next's, >= 1; 0: length
  std::optional<int64_t> separator{};  // after every document (an end-of-text token); must fit the dtype
};

// Ragged fields given as arrays in PyTorch's jagged layout (the values and offsets of
// torch.nested.nested_tensor_from_jagged; `mmt export` writes a ragged field so): the field's
// "NAME=..." input (an .npy, an IDX or a raw file, or an .npz member) holds the records'
// values back to back along its first dimension, and offsets[NAME] is the path of an .npy of
// records + 1 integers, from 0 to that dimension's size and never decreasing: record i is
// values[offsets[i] : offsets[i + 1]], of shape [offsets[i + 1] - offsets[i], ...the values'
// other dimensions] (tokens [*], boxes [*, 4]), and the field's shape is [-1, ...those].
// Records that vary in a later dimension (images [*, *, 3]) need shapes[NAME] too: an .npy of
// integers [records, ndim], each record's shape; the values are then 1-D, each record's in
// row-major order, and offsets count them. The field's dimensions are then variable where the
// records' extents differ, and the first always. InputSpecError for a NAME no input gives,
// shapes without offsets, or jagged arrays given with inputs other than arrays; ValueError
// naming the file and the entry for offsets or shapes that do not fit their values. The offsets
// (and shapes) are read into memory, 8 bytes a record (and a dimension); the values are mapped
// and read a batch at a time, as other arrays are.
struct JaggedArrays {
  std::map<std::string, std::string, std::less<>> offsets{};
  std::map<std::string, std::string, std::less<>> shapes{};
  bool empty() const { return offsets.empty() && shapes.empty(); }
};

namespace detail {
struct TarSamples;
struct TokenWindows;
struct MegatronDocuments;
struct MdsShards;
struct ArrowColumns;
struct TfRecordExamples;
}

class PackSources {
 public:
  // Arrays given as "NAME=PATH" or "PATH.npz" specs (see above); InputSpecError for a spec
  // that cannot be taken, ValueError for arrays that cannot be packed together.
  static PackSources from_arrays(std::span<const std::string> specs, const JaggedArrays& jagged = {});
  // A class folder, or a folder of files alone; files and folders whose names start with '.'
  // (".DS_Store", ".ipynb_checkpoints") are skipped, folders with everything under them. A
  // folder holding both files and subfolders is refused: its files would have no class.
  static PackSources from_folder(const std::string& dir, FolderOptions options = {});
  // mmtensor datasets, read as one as Dataset::open_concat reads shards, in that order: each
  // record as the reader gives it, every chunk's checksum checked (uncompressed ones too). `fields`: the fields kept,
  // in that order; empty, all of them. The metadata is the datasets' as open_concat gives it:
  // one shard of a pack (or some of its shards) keeps its shard keys, so that a shard
  // repacked alone is still that shard; a pack's shards whole carry none. Throws what
  // open_concat throws, and ValueError for an unknown field (listing the known ones) or one
  // named twice.
  static PackSources from_datasets(const std::vector<std::string>& paths, std::span<const std::string> fields = {});
  // What `mmt pack` and mmtensor.pack() take: datasets (from_datasets) when
  // are_dataset_inputs(specs), arrays (from_arrays) otherwise, which refuses a dataset among them.
  // `fields` is for datasets: InputSpecError with arrays, whose fields are the arrays given.
  // `jagged` is for arrays too: InputSpecError with other inputs.
  static PackSources from_inputs(std::span<const std::string> specs, std::span<const std::string> fields = {},
                                 TarOptions tar_options = {}, const JaggedArrays& jagged = {});
  // WebDataset shards (above), read in the order given. FormatError naming the archive and the
  // byte for a damaged or truncated one, or a corrupt or cut compressed stream; ValueError
  // for a bzip2 or xz archive (decompress it first), ValueError naming the sample for one whose extensions differ from the first
  // sample's, an extension given twice in a sample, a "cls" that is not an integer, or no
  // samples at all. An input that is not a tar archive is refused (tars are packed alone).
  static PackSources from_tars(const std::vector<std::string>& paths, TarOptions options = {});
  // Megatron indexed datasets (above), read in the order given. FormatError naming the index,
  // the entry and its byte for a damaged one (megatron_index.h says what is checked) or a
  // multimodal one; IoError for a missing .bin; ValueError for datasets of different dtypes
  // or an input of another kind (they are packed alone); InputSpecError for two field names.
  static PackSources from_megatron(std::span<const std::string> specs);
  // MosaicML Streaming datasets (above), read in the order given, their shards in the index's
  // order. FormatError naming the index or the shard, the sample and the column for a damaged
  // one; ValueError for an encoding or compression this packer does not read, shards of
  // other columns, or an input of another kind (MDS datasets are packed alone).
  static PackSources from_mds(std::span<const std::string> specs);
  // Arrow IPC files and streams, Parquet files, or folders of them (above), read in the order
  // given. `fields`: the columns packed, in that order (flattened names: "image.bytes",
  // "messages.role" of a list of structs; a struct's own name stands for all its columns);
  // empty, all of them.
  // FormatError naming the file, the message's byte and what is wrong for a damaged one
  // (arrow_ipc.h), or the row group, column and page (parquet.h); ValueError naming the column for one of a type no field holds (unless
  // `fields` leaves it out), a null where a field cannot store one, a jagged list, files of
  // other columns, a DatasetDict folder (pack one split), or an input of another kind.
  static PackSources from_arrow(std::span<const std::string> specs, std::span<const std::string> fields = {});
  // TensorFlow TFRecord files of tf.train.Example records (".tfrecord", ".tfrecords", TFDS'
  // "NAME.tfrecord-00000-of-00008", gzip- or zlib-compressed (TFRecordOptions' GZIP, ZLIB) or
  // not, or any file beginning with a record header), read in the order given: one record per Example, one field per feature
  // (pack_tfrecord.cc says how each list is stored; "image/encoded" is field "image.encoded").
  // `fields`: the features packed, in that order, by field name or key; empty, all of them, in
  // name order. A SequenceExample's context and feature lists may share a key: "feature:KEY"
  // and "feature_list:KEY" choose one of the two (one field cannot hold both). FormatError naming the file, the record and its byte for a damaged one (a
  // length's CRC, a record cut short, bytes that are no tf.train.Example: tfrecord.h), or,
  // for a file that begins as a compressed stream, what each reading of it finds; and
  // ChecksumError for a record whose data's CRC fails (checked as it is read); ValueError for
  // a feature whose records hold lists of two kinds, one with no list in any record (unless
  // `fields` leaves it out), a file compressed another way, or an input of another kind.
  static PackSources from_tfrecord(std::span<const std::string> specs, std::span<const std::string> fields = {});
  // The `fields` that choose again, from its TFRecord sources, the features a dataset packed
  // from them holds: by key, qualified (above), as its metadata key "tfrecord_features"
  // records them; a field that key does not describe by its name. FormatError naming `where`
  // when the entry is malformed.
  static std::vector<std::string> tfrecord_fields_of(const Schema& schema, const Metadata& metadata,
                                                     const std::string& where);
  // `tokens` cut into windows (WindowOptions above): one field of the same name and dtype,
  // shape [length]. `tokens` must have one field whose records hold one value each (a 1-D
  // array's) or a 1-D value each (documents: ragged, or fixed [n]), and may have beside it
  // its null mask when ragged (an Arrow or Parquet list column's: a null is an empty
  // document); a separator needs
  // documents. Documents are read once here, to count their tokens (8 bytes of memory a
  // document), and again as the windows are written. ValueError for other sources, bad
  // options, or a separator that the dtype does not hold exactly.
  static PackSources token_windows(PackSources tokens, WindowOptions options);
  // The windows `metadata` records (kTokenWindowsMetadataKey: a dataset's, or token_windows'
  // own), or nullopt when it has none; FormatError naming `where` when the entry is malformed.
  struct RecordedWindows {
    WindowOptions options;
    int64_t stream_tokens = 0;  // of the stream they were cut from
  };
  static std::optional<RecordedWindows> windows_of(const Metadata& metadata, const std::string& where);

  int64_t records() const { return records_; }
  const Schema& schema() const { return schema_; }
  const Metadata& metadata() const { return metadata_; }
  // Whether field `name` is the null mask of an Arrow or Parquet column (NAME.valid, marked
  // "(valid)" in the metadata key "arrow_types"), not a column of its own.
  bool is_null_mask(std::string_view name) const;
  // Bytes of all record values, for progress and throughput figures.
  int64_t total_bytes() const { return total_bytes_; }
  // Hidden files and folders from_folder() skipped (a skipped folder counts once), or tar
  // members from_tars() skipped (no '.' in the file name, or a leading one); 0 for arrays.
  int64_t hidden_skipped() const { return hidden_skipped_; }
  // Tar samples left out for a missing member (MissingMember::Skip); 0 otherwise.
  int64_t samples_skipped() const { return samples_skipped_; }
  // Where each field comes from, in schema order: the input as given
  // ("images=train-images-idx3-ubyte.gz"), "PATH.npz:NAME.npy" for an .npz member (its name
  // escaped), "data=DIR", "label=DIR (class folders)" and "path=DIR (file paths)" for a folder,
  // "EXT=A.tar, B.tar (tar members)" for tars, "NAME=A.bin, B.bin (Megatron documents)",
  // "NAME=DIR/index.json (MDS column, encoding E)" for MDS datasets.
  const std::vector<std::string>& origins() const { return origins_; }
  // Where record `index` of `field` comes from: for a folder, the record's file ("data"),
  // "the class folder of FILE" ("label") or "the path of FILE" ("path"); for datasets, the
  // record's file and index there; for tars, the member and its archive; for Megatron
  // datasets, the document, its .bin and its sequences; for MDS, the sample and its shard;
  // for arrays,
  // origins()[field].
  std::string record_origin(size_t field, int64_t index) const;
  // The files (arrays) or the folder (a class folder) the sources read: pack_dataset refuses
  // an output that is one of them or lies inside the folder, which would replace an input.
  const std::vector<std::string>& input_paths() const { return input_paths_; }
  // ValueError when writing `path` would replace one of the sources or land among them: it
  // is an input file (or a hard link to one), it lies inside the input folder, in a folder the
  // class folders reach through links, or it is a file a linked class file leads to.
  void check_output(const std::string& path) const;
  // The values of record `index`, one per field in schema order (views of the sources for
  // arrays and datasets; the file's bytes, read now, for a folder). Throws IoError for an
  // unreadable file.
  std::vector<Tensor> record(int64_t index) const;
  // The same into `values` (resized to the field count), reusing its memory across records.
  void record(int64_t index, std::vector<Tensor>& values) const;
  // Records [start, start + count) as one [count, ...] view per field, for
  // DatasetWriter::append_batch. Arrays, and datasets whose fields kept are all fixed:
  // returns false (and leaves `values` alone) for a folder, whose records are separate
  // files, and for ragged fields, which are read a record at a time.
  bool record_batch(int64_t start, int64_t count, std::vector<Tensor>& values) const;
  // Records from `start` (at most `count`) as one batch for DatasetWriter::append_batch(values,
  // offsets): what record_batch() gives (every offsets[f] undefined), and for Arrow and
  // Parquet inputs the rows of one record batch or row group, strings and lists in their
  // jagged layout (offsets[f] defined) and numbers as views of the file; for TFRecord inputs
  // records of one file under 64 KiB each, their values copied into one buffer a field (a
  // larger record goes alone, -1, its bytes a view of the file); for MDS inputs whose columns
  // are all of fixed size, samples of one shard lying back to back as its offsets say, each
  // column a strided view of the shard (a copy where its values are unaligned); for MDS inputs
  // with bytes columns (str, jpeg...) or arrays of alike rows ([-1] tokens, [-1, 4] boxes),
  // samples of one shard under 64 KiB each copied into one buffer a column (a larger one
  // alone, -1; with a column of arrays whose dimensions after the first vary, one at a time).
  // Returns how many
  // records it gave, fewer than `count` where a record batch ends or its strings and lists
  // pass a few MiB. Columns whose rows must be converted one by one (dictionaries, string
  // views, lists of strings) are, into one buffer, with record()'s values and refusals.
  // Where records go one at a time (record(); values and offsets are left alone), 0 for the
  // one at `start` (a folder's file), or -k for the k from `start` (Arrow rows of a field
  // whose shape varies in a dimension after its first: the jagged layout cannot hold it).
  int64_t jagged_record_batch(int64_t start, int64_t count, std::vector<Tensor>& values,
                              std::vector<Tensor>& offsets) const;
  // Reads what the reads so far left unread of each deflated .npz member, so that its CRC-32
  // is checked even when only some records were read (pack_dataset of a shard calls it):
  // ChecksumError or FormatError naming the member.
  void check_unread_inputs() const;

 private:
  int64_t records_ = 0;
  int64_t total_bytes_ = 0;
  int64_t hidden_skipped_ = 0;
  int64_t samples_skipped_ = 0;
  Schema schema_;
  Metadata metadata_;
  std::vector<std::string> origins_;
  std::vector<std::string> input_paths_;
  // Arrays whose values must be converted (see above): the bytes they lie in, from record 0
  // at `offset`: a mapping, or a deflated .npz member, inflated as it is read.
  struct ConvertedColumn {
    UntypedStorage bytes;  // the file's mapping; empty (and no `deflated`): columns_ has it
    std::shared_ptr<detail::DeflatedMember> deflated;
    int64_t offset = 0;
    bool big_endian = false;
  };
  // Folder: files_[index] under the folder, '/'-separated ("dog/001.jpg").
  std::string_view relative_path(size_t index) const;
  // Token windows: records [start, start + count) into `out` ([count, length]), and where
  // window `index` comes from.
  void fill_windows(int64_t start, int64_t count, const Tensor& out) const;
  bool window_batch(int64_t start, int64_t count, std::vector<Tensor>& values) const;
  std::string window_origin(int64_t index) const;
  // Arrow rows: record `index`'s values, and where a field of it comes from.
  void arrow_record(int64_t index, std::vector<Tensor>& values) const;
  int64_t arrow_batch(int64_t start, int64_t count, std::vector<Tensor>& values, std::vector<Tensor>& offsets) const;
  std::string arrow_origin(size_t field, int64_t index) const;
  // TFRecord Examples: record `index`'s values, and where a field of it comes from.
  void tfrecord_record(int64_t index, std::vector<Tensor>& values) const;
  int64_t tfrecord_batch(int64_t start, int64_t count, std::vector<Tensor>& values, std::vector<Tensor>& offsets) const;
  std::string tfrecord_origin(size_t field, int64_t index) const;
  // MDS samples: record `index`'s values, and where a field of it comes from.
  void mds_record(int64_t index, std::vector<Tensor>& values) const;
  int64_t mds_batch(int64_t start, int64_t count, std::vector<Tensor>& values, std::vector<Tensor>& offsets) const;
  std::string mds_origin(size_t field, int64_t index) const;
  // Megatron documents: record `index`'s tokens, and where they come from.
  void megatron_record(int64_t index, std::vector<Tensor>& values) const;
  std::string megatron_origin(int64_t index) const;
  // Tars: record `index`'s values, and where a field of it comes from.
  void tar_record(int64_t index, std::vector<Tensor>& values) const;
  std::string tar_origin(size_t field, int64_t index) const;
  // Rows [start, start + count) of converted field `f` (its records, or a jagged field's
  // values along their first dimension), in native order in new memory.
  Tensor converted_records(size_t f, int64_t start, int64_t count) const;
  // Rows [start, start + count) of array field `f`: a view of the array, or converted.
  Tensor array_rows(size_t f, int64_t start, int64_t count) const;
  // Arrays with jagged fields: records from `start` as jagged_record_batch() gives them.
  int64_t jagged_arrays_batch(int64_t start, int64_t count, std::vector<Tensor>& values,
                              std::vector<Tensor>& offsets) const;

  std::vector<Tensor> columns_;        // arrays: [records, ...field shape]; undefined if converted
  std::vector<ConvertedColumn> converted_;  // arrays: one per field
  // Arrays given in the jagged layout (JaggedArrays), one per field; `offsets` is undefined
  // for a field whose records are the array's rows.
  struct JaggedColumn {
    Tensor offsets;       // int64 [records + 1]: rows of the values
    Tensor shapes;        // int64 [records, ndim], where a later dimension varies; else undefined
    DimVector row_shape;  // the values' dimensions after the first
  };
  std::vector<JaggedColumn> jagged_;
  std::optional<Dataset> dataset_;      // datasets: the inputs, read as one
  std::shared_ptr<const detail::TarSamples> tar_;  // tars: the archives and where each value lies
  std::shared_ptr<const detail::MegatronDocuments> megatron_;  // Megatron: the pairs mapped, their indexes
  std::shared_ptr<const detail::MdsShards> mds_;  // MDS: the shards mapped, their columns
  std::shared_ptr<const detail::ArrowColumns> arrow_;  // Arrow: the files mapped, their columns and batches
  std::shared_ptr<const detail::TfRecordExamples> tfrecord_;  // TFRecord: the files, their records and features
  std::shared_ptr<const detail::TokenWindows> windows_;  // token windows: the stream's sources and layout
  std::vector<std::string> dataset_fields_;  // datasets: the fields kept, in schema order
  std::vector<std::string> files_;     // folder: one path per record
  std::vector<int64_t> labels_;        // class folder: the class index of each file
  std::string folder_;                 // folder: as given, which every path in files_ begins with
  bool paths_ = false;                 // folder: field "path" (FolderOptions::paths)
  // Folder: (device, inode) of every folder walked (through links too) and of every file
  // reached through a link, sorted: for check_output.
  std::vector<std::pair<uint64_t, uint64_t>> input_folders_;
  std::vector<std::pair<uint64_t, uint64_t>> linked_input_files_;
};

// Whether `path` is an mmtensor dataset file (it begins with the format's magic); false for
// any other file, and for one that cannot be read (its reader says why).
bool is_dataset_file(const std::string& path);
// Whether pack inputs are datasets: at least one is a dataset file, and no spec names an
// existing file of another kind, whole or after "NAME=" (missing files and folders are left
// to the reader to name).
bool are_dataset_inputs(std::span<const std::string> specs);
// Whether pack inputs are arrays (.npy, .npz, IDX, raw files): none is of the kinds below, and
// a spec names an existing file that is no dataset, whole or after "NAME=" (or a raw input,
// NAME=PATH:DTYPE).
bool are_array_inputs(std::span<const std::string> specs);
// Whether pack inputs are tar archives: one of them is a tar archive, or is named like one
// (".tar", ".tar.gz", ".tgz"...: from_inputs then refuses a compressed one as such).
bool are_tar_inputs(std::span<const std::string> specs);
// Whether pack inputs are Megatron indexed datasets: one of them (after any "NAME=") is
// PREFIX, PREFIX.idx or PREFIX.bin where PREFIX.idx begins with the index's magic, or where
// PREFIX.idx and PREFIX.bin both exist (an index of another kind is then refused as such).
bool are_megatron_inputs(std::span<const std::string> specs);
// Whether pack inputs are MosaicML Streaming datasets: one of them is a folder holding
// index.json, or such a file.
bool are_mds_inputs(std::span<const std::string> specs);
// Whether pack inputs are Arrow IPC or Parquet files: one of them begins with "ARROW1" or
// "PAR1", or is named .arrow/.arrows/.feather/.ipc (and begins as a stream) or
// .parquet/.pq/.parq (or is missing), or is a folder holding state.json or dataset_dict.json
// (Hugging Face's save_to_disk) or .parquet files.
bool are_arrow_inputs(std::span<const std::string> specs);
// Whether pack inputs are TFRecord files: one of them is a file whose name holds ".tfrecord"
// or that begins with a TFRecord header (a length and its CRC-32C).
bool are_tfrecord_inputs(std::span<const std::string> specs);

// The records of shard `shard` of `shards` of a set of `records`: [begin, end) with begin =
// shard * records / shards (rounded down), so the shards tile the records in order and differ
// in size by at most one. ValueError unless 0 <= shard < shards.
struct RecordRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
RecordRange shard_records(int64_t records, int64_t shard, int64_t shards);

struct PackOptions {
  WriterOptions writer{};
  // Packs only shard `shard` of `shards` (shard_records()). Each shard is a dataset of its
  // own with the whole sources' schema and metadata (a class folder's full class list), so
  // the shards, packed in parallel (processes or machines), read as the dataset one pack of
  // everything makes: Dataset::open_concat of the files in shard order, or `mmt info A B...`.
  // With shards > 1 the metadata records "K/N of R" under kShardMetadataKey.
  int64_t shard = 0;
  int64_t shards = 1;
  // Called from the packing thread about every progress_interval_seconds, and once at the end.
  std::function<void(const WriteStats&)> on_progress{};
  double progress_interval_seconds = 0.1;
  // When set and it becomes true, packing stops, the writer is aborted and PackCancelled thrown.
  const std::atomic<bool>* cancel = nullptr;
  // A cancel that takes a call to find (Python's signal handlers): asked, as `cancel` is read,
  // while the writer waits for chunks being compressed (about every 0.1 s) and just before it
  // publishes the file; true stops the pack as `cancel` does. Between records only `cancel`
  // is read, which on_progress may set.
  std::function<bool()> cancelled{};
};

// Writes every record of `sources` (or of options' shard of them) to a new dataset at `path`
// and returns the writer's final figures. The sources' metadata is stored with options.writer.metadata added over it.
// ValueError, before anything is written, when sources.check_output(path) refuses it or the
// shard is not one of the shards.
WriteStats pack_dataset(const std::string& path, const PackSources& sources, PackOptions options);

// Compares records of `dataset` with `sources`; `indices` empty means every record. Fields
// are matched by name, in any order, and only those the sources give are compared (the
// sources may give a subset of the dataset's fields). A pack's shard (or shards read as one,
// kShardMetadataKey) is compared with its share of the sources. Throws FormatError naming the
// field when one the sources give is missing from the dataset or has another dtype or shape,
// when the record counts differ, and for the first record that differs (in ascending order): its
// field, its source (for a folder, the file) and the first byte that differs; IndexError for
// an index outside [0, dataset.size()). Returns the number of records compared.
// With SourceFields::Shared, the fields the sources give that the dataset lacks are not
// compared (a folder's "label", packed and then left out by a repack); at least one must be
// shared, else FormatError.
enum class SourceFields : uint8_t { AllGiven, Shared };
int64_t compare_with_sources(const Dataset& dataset, const PackSources& sources,
                             std::span<const int64_t> indices = {}, SourceFields fields = SourceFields::AllGiven);

}  // namespace mmt
