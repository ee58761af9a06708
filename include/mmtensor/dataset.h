// Dataset: random access by record index into an mmtensor dataset file (docs/FORMAT.md).
//
// open() maps the file read-only and reads only its fixed-size preamble, footer, schema and
// last chunk-table entry: opening costs the same for a thousand records as for a hundred
// million. Nothing in the file is trusted: every offset, size and count is checked against the
// real file size before use, and each chunk's table entry is verified the first time the
// chunk is used; compressed chunks' checksums are verified before they are decoded
// (ReaderOptions says which).
//
// A sample's fields come back as Tensor views:
//   - uncompressed chunks: views straight into the mapping (zero-copy); their storage's
//     filename() is the dataset's path;
//   - lz4/zstd chunks: views into the decoded chunk, held in an LRU chunk cache with a byte
//     budget; a view keeps its decoded chunk alive after eviction.
//
// Lifetime: Dataset is a handle; copies share one mapping and one cache. Views outlive the
// Dataset they came from.
// Iteration: a Dataset is a random-access range of its samples in index order
// (Dataset::iterator): `for (Sample s : ds)`, `ds | std::views::drop(10)`.
// Thread safety: every const method may be called from many threads at once.
// Errors: IndexError for an index out of range; ValueError for an unknown field (the message
// lists the known ones) or a dtype/shape mismatch; FormatError / ChecksumError for a damaged
// file, naming the chunk, byte offset and field.
#pragma once

#include <compare>
#include <cstdint>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "mmtensor/codec.h"
#include "mmtensor/schema.h"
#include "mmtensor/storage.h"
#include "mmtensor/tensor.h"

namespace mmt {

// When the kernel is asked to read a batch's pages before the batch is gathered
// (ReaderOptions::read_ahead for get_batch, LoaderOptions::read_ahead for a loader).
enum class ReadAhead : uint8_t { Auto, Always, Never };

struct ReaderOptions {
  int64_t cache_bytes = int64_t{256} << 20;  // decoded-chunk cache budget
  // Each compressed chunk's checksum is verified before the chunk is first decoded (it is
  // read in full to be decoded anyway). false skips that too.
  bool verify_checksums = true;
  // Also hash each uncompressed chunk on its first use. Off by default: hashing reads the whole
  // chunk (1 MiB by default) to serve one zero-copy record, a 1000x read amplification for
  // random access to a cold file. Structure (offsets, sizes, ragged extents) is always
  // checked; Dataset::verify() and `mmt verify` hash every chunk.
  bool verify_uncompressed = false;
  // madvise for the whole mapping, from the end of the open (whose own few reads at either end
  // of the file are made without read-around, whatever this says). Normal keeps the kernel's
  // adaptive readahead: Random would make a cold sequential scan fault one page at a time
  // (about 10 MB/s where Normal reads at disk speed); choose Random only for a cold file read
  // at random.
  AccessAdvice advice = AccessAdvice::Normal;
  // Whether get_batch() first hints its batch (prefetch() of the fields it gathers), so that
  // a cold batch's reads are in flight together instead of one page fault at a time, each of
  // which the kernel reads around (bench/RESULTS.md: about 5x faster for random 784-byte
  // records from disk, an eighth of the bytes read). A hint costs about a microsecond a
  // record, many times a warm gather, so Auto hints only while the page cache misses:
  //   - hints are off at open;
  //   - a batch is checked when it is the dataset's first, or when this dataset's previous
  //     gather on the same thread was slow (or was the last hinted one; each thread keeps
  //     such marks for eight datasets at once): mincore() of the pages of the largest
  //     field's value (up to 64 pages; else the first, middle and last) of four of its
  //     records. A missing page turns hints on, for this batch too. Slow is 100 us or more
  //     with a major page fault taken (by the thread, or by the process when pool threads
  //     gather too) since the thread's last slow gather: a warm gather pays for no check,
  //     whether it takes 13 us (256 784-byte records back to back) or 100 us (the same
  //     records scattered over shards read part by part). read_ahead_stats() counts the
  //     checks;
  //   - where mincore does not tell this user (a file the user neither owns nor may write),
  //     the check hints eight of the batch's records and looks at what that read (Linux's
  //     per-thread read_bytes; without it, the gather's major faults turn hints on for the
  //     next batch), and after a slow gather only when it took 500 us or more;
  //   - a batch of neighbouring records (within twice the pages its records would fill
  //     alone: a sequential scan, a shard read in order) is never hinted, and uses up its
  //     check (the dataset's first one too): the kernel's own readahead runs ahead of such a
  //     reader, and a hint just before the gather would stop it;
  //   - hints go off after eight in a row found their batch cached: they made the kernel read
  //     nothing (without read_bytes: mincore found the batch cached before the hint, or,
  //     where mincore does not tell, the gather took no major fault).
  // Always hints every batch of two or more records; Never none. A Loader's gathers follow
  // LoaderOptions::read_ahead instead, which hints batches ahead of their gathers.
  ReadAhead read_ahead = ReadAhead::Auto;
};

// What get_batch()'s read-ahead has done (ReaderOptions::read_ahead).
struct ReadAheadStats {
  int64_t batches_read_ahead = 0;  // batches hinted
  bool reading_ahead = false;      // whether hints are on (Auto: a checked batch may turn them on)
  int64_t batches_checked = 0;     // Dataset::get_batch's Auto: batches checked for missing pages
};

struct ChunkInfo {
  int64_t index = 0;
  int64_t first_record = 0;
  int64_t record_count = 0;
  int64_t part = 0;           // which of parts() holds it: 0 for one file
  int64_t file_offset = 0;    // bytes, in that part's file
  int64_t stored_bytes = 0;   // bytes in the file
  int64_t decoded_bytes = 0;  // bytes after decoding
  Codec codec = Codec::None;
  uint64_t checksum = 0;
};

struct DatasetInfo {
  uint32_t format_version = 0;
  int64_t records = 0;
  int64_t chunks = 0;
  int64_t file_bytes = 0;
  int64_t alignment = 0;
  CodecSpec codec;             // the codec the writer was asked for (the schema block's key);
                               // for a file without it, its chunks' codec, level 0
  int64_t stored_bytes = 0;    // sum of chunks' stored bytes
  int64_t decoded_bytes = 0;   // sum of chunks' decoded bytes
  int64_t part_count = 1;      // files: more than one for a concatenation (parts())
  // A concatenation whose parts were written with different codecs (codec is then the first
  // part's; each part's own info() tells its own), or a file without the schema's codec key
  // whose chunks use several (codec is then chunk 0's).
  bool codecs_differ = false;
};

struct CacheStats {
  int64_t hits = 0;
  int64_t misses = 0;       // decodes
  int64_t evictions = 0;
  int64_t bytes_cached = 0;
  int64_t budget_bytes = 0;
  // Decoded chunks alive now, cached or not (views and batches in progress keep evicted ones
  // alive), and the most there ever were at once: what decoding costs in memory.
  int64_t decoded_bytes_live = 0;
  int64_t decoded_bytes_peak = 0;
};

// One record: a Tensor view per field, in schema order. Holds no heap allocation of its own
// for up to kInlineFields fields.
class Sample {
 public:
  static constexpr size_t kInlineFields = 4;

  Sample();
  Sample(const Sample&);
  Sample(Sample&&) noexcept;
  Sample& operator=(const Sample&);
  Sample& operator=(Sample&&) noexcept;
  ~Sample();

  int64_t index() const { return index_; }
  size_t size() const { return count_; }
  // The record's fields; no fields for a default-constructed or moved-from Sample.
  const Schema& schema() const;
  // The field's view; throws ValueError listing the known fields. On a Sample about to go
  // (`ds[5]["image"]`, one line), the view comes by value: it keeps the record's memory
  // alive, where a reference into the Sample would dangle.
  const Tensor& operator[](std::string_view field) const&;
  const Tensor& operator[](size_t i) const&;
  Tensor operator[](std::string_view field) const&& { return static_cast<const Sample&>(*this)[field]; }
  Tensor operator[](size_t i) const&& { return static_cast<const Sample&>(*this)[i]; }
  const Tensor& field(std::string_view name) const& { return (*this)[name]; }
  Tensor field(std::string_view name) const&& { return static_cast<const Sample&>(*this)[name]; }

  // For the engine: a sample of `schema` with `count` undefined tensors.
  Sample(std::shared_ptr<const Schema> schema, int64_t index);
  Tensor& mutable_field(size_t i);

 private:
  std::shared_ptr<const Schema> schema_;
  int64_t index_ = -1;
  size_t count_ = 0;
  Tensor inline_[kInlineFields];
  std::unique_ptr<Tensor[]> overflow_;
  friend class Dataset;  // a concatenation renumbers its parts' samples
};

// Values of a ragged field for several samples, packed: what Dataset::ragged_column returns
// and what a Loader batch holds for each ragged field.
struct RaggedBatch {
  Tensor values;   // 1-d: the samples' values one after the other, each in logical row-major order
  Tensor offsets;  // int64 [B+1]: sample i is values[offsets[i] : offsets[i+1]]
  Tensor shapes;   // int64 [B, ndim]: sample i's shape
};

class Dataset {
 public:
  class iterator;
  using const_iterator = iterator;

  // Opens and validates the preamble, footer, schema and last chunk-table entry. Throws IoError (missing file, no
  // permission), FormatError (not an mmtensor file, unknown version, truncated, corrupt).
  static Dataset open(const std::string& path, ReaderOptions options = {});

  // Several dataset files read as one, in the order given, as torch.utils.data.ConcatDataset
  // reads its datasets: record i of the concatenation is record i - (records of the parts
  // before it) of its part. Shards packed in parallel, by several processes or machines, are
  // read (and loaded, sampled, resumed) as one dataset without being merged into one file.
  //   - Every part must have the same fields (names, dtypes, shapes and storage orders), else
  //     ValueError naming the first part that differs and how. The metadata is the union of
  //     the parts'; a key whose value differs between two parts (class names of folder shards
  //     packed from different class lists, say) is a ValueError naming the key and both parts.
  //     Two exceptions: pack's "npy_fortran_order" (how the sources were laid out, a hint for
  //     `mmt export`) is kept when every part has the same value, and dropped otherwise; and
  //     pack's "pack_shard" ("K/N of R", kShardMetadataKey in packer.h) and "pack_source"
  //     are each part's own: one pack's shards (equal N, R and sources) must come in order,
  //     each once (else ValueError naming the parts), and a concatenation of only some of one
  //     pack's carries the ones it holds ("0,2/3 of R"). Shards of several packs may follow
  //     one another or interleave (one rank's shards of several corpora). A shard number its
  //     pack holds already is the same shard given twice unless the two files' fingerprints
  //     and records (the first, middle and last; read only then) differ: inputs alike in
  //     name, size and sampled bytes (a class folder: in file names) that hold other data.
  //     (The same shard packed again with another codec or chunk size has the same records.)
  //   - open_concat() opens every path with `options` and gives the parts one chunk cache, of
  //     options.cache_bytes in all. concat() takes handles already open (their caches stay
  //     theirs); parts that are concatenations themselves are flattened. One part gives that
  //     part back. An empty list is a ValueError. Opening stays O(1) per part.
  //   - Each part stays a file of its own: get() of a record in an uncompressed part is a view
  //     into that part's mapping; get_batch() writes each output row once, straight from its
  //     part (over uncompressed fixed-field parts, the whole batch as one run, as from one
  //     file; otherwise part by part); column() or ragged_column() of a range inside one part
  //     is whatever that part gives (a view, when it can). A range spanning parts is copied.
  //     Chunks are numbered across the parts in order (chunk(c).first_record counts across
  //     parts too; chunk(c).part names the part whose file its file_offset is in).
  //     Errors about a part's bytes name that part's path.
  //   - path() is the parts' paths joined by ", "; parts() gives them as handles. info() adds
  //     up the parts (file_bytes, chunks, records, stored and decoded bytes) and counts them;
  //     its alignment, codec and format_version are the first part's (codecs_differ says
  //     when another part's codec is not). options() are those given to
  //     open_concat() (concat(): the first part's). fingerprint() hashes the parts' sizes and
  //     fingerprints, in order: a loader state resumes only on the same parts in the same
  //     order. cache_stats() is the shared cache's; after concat(), the counts of the parts'
  //     caches added up (each cache once), and budget_bytes the smallest part's budget (what
  //     the quasi-random sampler can count on keeping cached).
  //   - ReaderOptions::read_ahead (concat(): the first part's) decides for get_batch's whole
  //     batch, whatever parts it falls in, by the rules of one file: Always hints it over all
  //     its parts at once; Auto checks it as one file's batch (mincore() telling only where
  //     it tells this user about every part), and hints it over all its parts at once. The
  //     parts' own read-ahead stays out of it (their get_batch still follows it).
  //     read_ahead_stats() counts these batches with the parts' own. A Loader hints its
  //     batches itself (prefetch() over the parts), whatever the number of parts. A batch
  //     gathered on several threads may hold each part's decoded chunks (a quarter of its
  //     cache budget) on each thread.
  static Dataset open_concat(const std::vector<std::string>& paths, ReaderOptions options = {});
  static Dataset concat(const std::vector<Dataset>& parts);

  Dataset();  // an empty handle; every accessor throws ValueError until assigned from open()
  bool is_open() const { return impl_ != nullptr || concat_ != nullptr; }
  // The files this dataset reads, as handles in order: {*this} for one file.
  std::vector<Dataset> parts() const;
  // The whole file's read-only mapping: the storage every zero-copy view of this dataset
  // shares (its filename() is the file's), alive as long as a handle or a view holds it. For
  // page-locking it, say (cudaHostRegister with cudaHostRegisterReadOnly). ValueError for a
  // concatenation: each of parts() has its own.
  UntypedStorage file_storage() const;
  // Which part holds record `index` (negative counts from the end), and its index there.
  struct Location {
    size_t part = 0;
    int64_t index = 0;
  };
  Location locate(int64_t index) const;

  int64_t size() const;
  const Schema& schema() const;
  const Metadata& metadata() const;
  const std::string& path() const;
  // The path made absolute against the working folder at open() (path() is as given), so
  // that a later chdir does not change which file it names: what reopens the dataset in
  // another process (a pickled Dataset in a worker). A concatenation joins its parts' as
  // path() does.
  const std::string& absolute_path() const;
  const ReaderOptions& options() const;  // as given to open()
  DatasetInfo info() const;
  int64_t num_chunks() const;
  // A 64-bit hash of the file's chunk table and footer, which hold every chunk's place, sizes,
  // codec and payload checksum, the record count and the schema's checksum: equal for
  // byte-identical files, different (but for a hash collision) when any record's stored bytes,
  // the schema or the chunking differ. Never 0. Reads the table once (O(chunks)), then cached.
  // The loader uses it to refuse a resume on another dataset of the same size.
  uint64_t fingerprint() const;
  ChunkInfo chunk(int64_t chunk_index) const;  // validates the entry
  // The chunk that holds a record (negative counts from the end); IndexError for a bad index,
  // FormatError when the chunk table disagrees with itself.
  int64_t chunk_of(int64_t record_index) const;

  // The record at `index` (negative counts from the end, as in Python).
  Sample get(int64_t index) const;
  Sample operator[](int64_t index) const { return get(index); }
  Tensor get(int64_t index, std::string_view field) const;
  // The samples in index order, get(0) to get(size() - 1): see Dataset::iterator. ValueError
  // for an empty handle, as every accessor.
  iterator begin() const;
  iterator end() const;

  // A fixed field of every record as one [N, ...] tensor. A zero-copy view when the file's
  // chunks for that field are laid out contiguously (uncompressed, fixed-shape schema) or
  // the file has one chunk; otherwise a copy, gathered chunk by chunk (column_is_view()
  // tells which, for the whole column).
  Tensor column(std::string_view field) const;
  // Records [start, stop) of a fixed field (0 <= start <= stop <= N: ranges take no
  // negative bounds, unlike the indices of get() and get_batch()), with the same rule; and a
  // range inside one chunk is always a view, into the mapping or into the decoded chunk
  // (lz4/zstd): reading a compressed column chunk by chunk (chunk(c).first_record,
  // + record_count) decodes each chunk once and copies nothing. Such a view keeps its chunk
  // alive.
  Tensor column(std::string_view field, int64_t start, int64_t stop) const;
  bool column_is_view(std::string_view field) const;
  // Records [start, stop) of a ragged field, packed (a token stream read in order, say). When
  // the range lies inside one chunk and the field is stored in its logical order, `values`
  // is a zero-copy view into that chunk (the mapping, or the decoded chunk), as for column();
  // otherwise the values are copied, chunk by chunk. `offsets` and `shapes` are always new
  // tensors. ValueError for a fixed field (use column()), IndexError for a bad range.
  RaggedBatch ragged_column(std::string_view field, int64_t start, int64_t stop) const;
  // A ragged field of records `indices` (any order, repeats and negative indices as in
  // get_batch), packed as ragged_column() packs a range: the batch a custom loop over token
  // documents needs. Always a copy. ValueError for a fixed field (use get_batch()),
  // IndexError for a bad index.
  RaggedBatch get_ragged_batch(std::span<const int64_t> indices, std::string_view field) const;

  // Gathers a fixed field of records `indices` into `out`, a [B, ...field shape] tensor of the
  // field's dtype on the host (ordinary or pinned; any strides, contiguous is fastest), using
  // up to `threads` threads (>= 1; the calling thread counts as one). Indices may be negative,
  // counting from the end as in get(). An output whose elements may share memory (expanded,
  // say) is refused with ValueError: strides that cannot be shown disjoint are refused, a
  // stricter test than copy_()'s (clone() such an output, or pass a contiguous one). From a
  // cold file, the batch's pages are first hinted to the kernel as ReaderOptions::read_ahead
  // says.
  void get_batch(std::span<const int64_t> indices, std::string_view field, const Tensor& out,
                 int threads = 1) const;
  Tensor get_batch(std::span<const int64_t> indices, std::string_view field, int threads = 1) const;
  // Several fixed fields of the same records at once: outs[k] receives fields[k], each as
  // above. Faster than one call per field over compressed or ragged-schema files, where a
  // shuffled batch is sorted and its chunks looked up once for all the fields. Outputs that
  // may share memory with each other (one tensor given twice, overlapping views of one
  // buffer) are refused with ValueError naming both fields, nothing written, by a sufficient
  // test as above: outputs whose bytes [lowest, highest] do not meet pass (separate tensors,
  // the halves of one buffer); so do views that take turns row by row, each row's bytes
  // apart from the other's (the columns of one [B, K] buffer, the fields of an array of
  // records); views interleaved more finely within a row are refused even when disjoint.
  void get_batch(std::span<const int64_t> indices, std::span<const std::string> fields,
                 std::span<const Tensor> outs, int threads = 1) const;

  // Checks every chunk: table entry, checksum, decoding, the structure of ragged fields and
  // that bool bytes are 0 or 1; that the chunks cover the records in order without overlap,
  // as the footer counts them; and that the padding around them is zero (FORMAT.md, "What a
  // reader MUST check"). Throws FormatError/ChecksumError naming the first bad chunk.
  void verify() const;

  // advise(): madvise for the whole mapping.
  // prefetch(): will-need hints for the records of `indices` (of every field, or of `fields`):
  // call it for a batch about to be read from a cold file, so that its reads are in flight
  // together instead of one page fault at a time (the Loader does: LoaderOptions::read_ahead).
  // Uncompressed, a record's own bytes are hinted, and a ragged value's where its chunk's
  // value ends say: those ends (and the entries that locate each ragged section) are hinted
  // for all the batch's chunks together, then read, one round a ragged field up to the last
  // one asked for, so a call waits for the disk about that many times, however many chunks
  // the batch touches. Compressed, whole chunks, each once, unless the chunk cache holds it
  // decoded (or is decoding it). Reading compressed chunks in order also hints the next chunk
  // by itself. An empty `fields` hints nothing (the indices are still checked). Throws
  // IndexError for an index out of range, ValueError for an unknown field, FormatError for a
  // damaged chunk entry, chunk table or ragged section, IoError for a file cut short under
  // the reader.
  void advise(AccessAdvice advice) const;
  void prefetch(std::span<const int64_t> indices) const;
  void prefetch(std::span<const int64_t> indices, std::span<const std::string> fields) const;
  CacheStats cache_stats() const;
  ReadAheadStats read_ahead_stats() const;

  struct Impl;
  struct Concat;

 private:
  explicit Dataset(std::shared_ptr<const Impl> impl);
  explicit Dataset(std::shared_ptr<const Concat> concat);
  std::shared_ptr<const Impl> impl_;      // one file
  std::shared_ptr<const Concat> concat_;  // or several (then impl_ is null)
};

// A position among a Dataset's samples: a pointer to the Dataset and an index, nothing more.
// It models std::random_access_iterator with Sample, a value, as its reference type: *it is
// get(it.index()) (views into the mapping when uncompressed, as get() gives; no allocation
// beyond get()'s) and it[n] is get(it.index() + n). Moving it is integer arithmetic on the
// index, unchecked; dereferencing checks the position: IndexError outside [begin(), end())
// (get() alone would take -1 as the last record). As with std::views::iota's iterators,
// which also yield values, C++17 algorithms see an input iterator (iterator_category),
// std::ranges ones a random-access one (iterator_concept); it is not writable, so
// std::ranges::sort and the like do not take it.
//
// Lifetime, as with a std container's iterators: an iterator refers to the Dataset object it
// came from (not to the file, nor to copies of that handle). Destroying that Dataset, moving
// from it or assigning to it invalidates its iterators; using one after that is undefined.
// The Samples they gave are unaffected: a Sample holds its storage (shared ownership) and
// outlives every iterator and every Dataset handle. Iterators of different Dataset objects
// must not be compared or subtracted.
// Thread safety: a value type; dereferencing calls get(), which many threads may call at once.
class Dataset::iterator {
 public:
  using value_type = Sample;
  using reference = Sample;
  using difference_type = int64_t;
  using iterator_concept = std::random_access_iterator_tag;
  using iterator_category = std::input_iterator_tag;

  iterator() = default;  // a singular iterator: it may be assigned, compared with another singular one

  Sample operator*() const;
  Sample operator[](difference_type n) const;
  int64_t index() const { return index_; }

  iterator& operator++() {
    ++index_;
    return *this;
  }
  iterator operator++(int) {
    iterator old = *this;
    ++index_;
    return old;
  }
  iterator& operator--() {
    --index_;
    return *this;
  }
  iterator operator--(int) {
    iterator old = *this;
    --index_;
    return old;
  }
  iterator& operator+=(difference_type n) {
    index_ += n;
    return *this;
  }
  iterator& operator-=(difference_type n) {
    index_ -= n;
    return *this;
  }
  friend iterator operator+(iterator it, difference_type n) { return it += n; }
  friend iterator operator+(difference_type n, iterator it) { return it += n; }
  friend iterator operator-(iterator it, difference_type n) { return it -= n; }
  friend difference_type operator-(const iterator& a, const iterator& b) { return a.index_ - b.index_; }
  // By index alone: iterators of one Dataset (see above).
  friend bool operator==(const iterator& a, const iterator& b) { return a.index_ == b.index_; }
  friend std::strong_ordering operator<=>(const iterator& a, const iterator& b) { return a.index_ <=> b.index_; }

 private:
  friend class Dataset;
  iterator(const Dataset* dataset, int64_t index) : dataset_(dataset), index_(index) {}

  const Dataset* dataset_ = nullptr;
  int64_t index_ = 0;
};

}  // namespace mmt
