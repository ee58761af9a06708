// A mapped file shrunk by another program: mmtensor's decision (docs/RELIABILITY.md,
// "Truncation under a live reader") and its proof.
//   1. mmtensor never shrinks or rewrites a published file in place: an overwrite is a
//      rename, so a reader of the old file keeps reading it, intact.
//   2. The engine's own reads of mapped bytes (get_batch, column copies, chunk decoding,
//      checksums, verify) turn the SIGBUS of a truncated mapping into an IoError naming the
//      file and the byte; the dataset handle stays usable for what is still there.
//   3. A fault outside the engine's guarded reads (user code touching a zero-copy view, or
//      a mapping mmtensor does not know) is not swallowed: the process dies of SIGBUS as it
//      would without mmtensor. Those cases run in a forked child.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <thread>

#include "format.h"
#include "importer_test_util.h"
#include "mapping_guard.h"
#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "mmtensor/loader.h"
#include "mmtensor/numpy_io.h"
#include "mmtensor/packer.h"
#include "streaming_copy.h"
#include "test_util.h"

namespace mmt {
namespace {

using testing::ScopedEnv;
using testing::TempDir;
namespace fs = std::filesystem;

constexpr int64_t kRecords = 4096;
constexpr int64_t kValues = 256;  // float32 per record: 1 KiB records, a 4 MiB file

// "x": float32 [kValues] = i + k/1000; "label": int64 = i. With `ragged`, a ragged field
// makes the layout chunked (not contiguous), so reads go through chunk references.
std::string write_dataset(const TempDir& dir, const std::string& name, const std::string& codec,
                          bool ragged = false) {
  std::vector<Field> fields{Field::fixed("x", kFloat32, {kValues}), Field::fixed("label", kInt64, {})};
  if (ragged) fields.push_back(Field::ragged("tokens", kInt32, {kVariableDim}));
  WriterOptions options;
  options.codec = CodecSpec::parse(codec);
  options.chunk_records = 64;
  options.threads = 1;
  const std::string path = dir.file(name);
  DatasetWriter writer = DatasetWriter::create(path, Schema(fields), options);
  std::vector<float> x(kValues);
  for (int64_t i = 0; i < kRecords; ++i) {
    for (int64_t k = 0; k < kValues; ++k) x[k] = static_cast<float>(i) + static_cast<float>(k) / 1000.0f;
    std::vector<Tensor> record{tensor(x), full({}, static_cast<double>(i), kInt64)};
    if (ragged) record.push_back(full({i % 3}, static_cast<double>(i), kInt32));
    writer.append(std::span<const Tensor>(record));
  }
  writer.finish();
  return path;
}

void truncate_to(const std::string& path, int64_t nbytes) {
  ASSERT_EQ(::truncate(path.c_str(), nbytes), 0) << path << ": " << std::strerror(errno);
}

std::vector<int64_t> all_indices() {
  std::vector<int64_t> indices(kRecords);
  std::iota(indices.begin(), indices.end(), 0);
  return indices;
}

using testing::kAddressSanitizer;
using testing::kThreadSanitizer;

// Runs `fn` in a forked child; returns the signal that ended it (0 for a normal exit).
// AddressSanitizer reports a SIGBUS it did not expect and ends the process its own way
// (exit code or abort); that still is the process dying of the fault, so it reads as SIGBUS.
template <typename Fn>
int signal_ending_child(Fn fn) {
  pid_t pid = ::fork();
  if (pid == 0) {
    fn();
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) return kAddressSanitizer && WTERMSIG(status) == SIGABRT ? SIGBUS : WTERMSIG(status);
  return kAddressSanitizer && WEXITSTATUS(status) != 0 ? SIGBUS : 0;
}

#define EXPECT_TRUNCATION_ERROR(statement, path)                                            \
  do {                                                                                      \
    try {                                                                                   \
      statement;                                                                            \
      ADD_FAILURE() << #statement " did not throw";                                         \
    } catch (const IoError& e) {                                                            \
      const std::string message = e.what();                                                 \
      EXPECT_NE(message.find(path), std::string::npos) << message;                          \
      EXPECT_NE(message.find("truncated or changed while mapped (SIGBUS reading byte "),    \
                std::string::npos) << message;                                              \
    }                                                                                       \
  } while (0)

// ---- the guard itself ----

TEST(ReliabilityTruncation, GuardTurnsAFaultInItsRegionIntoIoErrorNamingTheByte) {
  TempDir dir;
  const std::string path = dir.file("plain.bin");
  {
    std::vector<char> bytes(64 << 10, 'a');
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
  UntypedStorage mapping = UntypedStorage::map_file(path, MapMode::ReadOnly);
  const detail::MappedRegion region{&path, mapping.data(), mapping.nbytes()};
  auto read_byte = [&](int64_t offset) {
    return detail::guard_mapped_reads(region, [&] {
      return static_cast<int>(*reinterpret_cast<const volatile char*>(mapping.data() + offset));
    });
  };
  EXPECT_EQ(read_byte(40000), 'a');
  truncate_to(path, 8192);
  EXPECT_EQ(read_byte(100), 'a') << "pages before the new end stay readable";
  for (int attempt = 0; attempt < 3; ++attempt) {  // the handler and signal mask survive a fault
    try {
      read_byte(40000);
      ADD_FAILURE() << "no error";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find(path + ": the file was truncated or changed while mapped "
                                                  "(SIGBUS reading byte 40000 of the 65536 bytes"),
                std::string::npos) << e.what();
    }
  }
  // Another thread has its own guard stack.
  std::string from_thread;
  std::thread([&] {
    try {
      read_byte(60000);
    } catch (const IoError& e) {
      from_thread = e.what();
    }
  }).join();
  EXPECT_NE(from_thread.find("byte 60000"), std::string::npos) << from_thread;
  EXPECT_EQ(detail::current_guard_frame(), nullptr) << "every section popped its frame";
}

// The storage's own copies (clone, copy_, fill_) and Tensor::to_vector, whose loop runs in the
// caller's code, are the engine's reads of the mapping as Tensor::clone is: a file another
// program cut short is an IoError naming it, not the death of the process.
TEST(ReliabilityTruncation, StorageCopiesOfAFileCutShortFailWithIoError) {
  TempDir dir;
  const std::string path = dir.file("storage.bin");
  { UntypedStorage::from_file(path, /*shared=*/true, 64 << 10).fill_(7); }
  const UntypedStorage read_only = UntypedStorage::map_file(path);
  UntypedStorage shared = UntypedStorage::from_file(path, /*shared=*/true, 0);
  const Tensor view(read_only, kUInt8, {64 << 10});
  truncate_to(path, 100);
  const std::string named = path + ": the file was truncated or changed while mapped";
  EXPECT_THROW_WITH(read_only.clone(), IoError, named);
  EXPECT_THROW_WITH(UntypedStorage::allocate(64 << 10).copy_(read_only), IoError, named);
  EXPECT_THROW_WITH(view.to_vector<uint8_t>(), IoError, named);
  EXPECT_EQ(view.narrow(0, 0, 100).to_vector<uint8_t>(), std::vector<uint8_t>(100, 7)) << "before the cut";
  EXPECT_THROW_WITH(shared.copy_(UntypedStorage::allocate(64 << 10)), IoError, named);
  EXPECT_THROW_WITH(shared.fill_(1), IoError, named);
}

TEST(ReliabilityTruncation, NestedGuardsAndExceptionsPopTheirFrames) {
  TempDir dir;
  const std::string path = dir.file("nested.bin");
  {
    std::vector<char> bytes(3 * 4096, 'b');
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
  UntypedStorage mapping = UntypedStorage::map_file(path, MapMode::ReadOnly);
  const std::string inner_name = "inner", outer_name = "outer";
  const detail::MappedRegion outer{&outer_name, mapping.data(), mapping.nbytes()};
  const detail::MappedRegion inner{&inner_name, mapping.data(), 4096};  // the first page only
  EXPECT_THROW(detail::guard_mapped_reads(outer, [] { throw ValueError("from inside"); }), ValueError);
  EXPECT_EQ(detail::current_guard_frame(), nullptr);
  truncate_to(path, 4096);
  // A fault outside the inner section's range is reported by the outer section.
  try {
    detail::guard_mapped_reads(outer, [&] {
      detail::guard_mapped_reads(inner, [&] { (void)*reinterpret_cast<const volatile char*>(mapping.data() + 8192); });
    });
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("outer: ", 0), 0u) << e.what();
  }
  EXPECT_EQ(detail::current_guard_frame(), nullptr);
}

TEST(ReliabilityTruncation, FaultsOutsideAGuardedRegionStillKillTheProcess) {
  TempDir dir;
  const std::string path = dir.file("foreign.bin");
  {
    std::vector<char> bytes(4 * 4096, 'c');
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
  detail::install_sigbus_handler();  // as after any dataset read
  UntypedStorage mapping = UntypedStorage::map_file(path, MapMode::ReadOnly);
  truncate_to(path, 4096);
  const std::string name = "guarded";
  // No guard at all: user code touching a view past the new end.
  EXPECT_EQ(signal_ending_child([&] { (void)*reinterpret_cast<const volatile char*>(mapping.data() + 3 * 4096); }),
            SIGBUS);
  // Inside a guard, but the fault is in a mapping that guard does not cover.
  UntypedStorage other = UntypedStorage::map_file(path, MapMode::ReadOnly);  // a second mapping, 4 KiB now
  const detail::MappedRegion region{&name, other.data(), other.nbytes()};
  EXPECT_EQ(signal_ending_child([&] {
              detail::guard_mapped_reads(region, [&] {
                (void)*reinterpret_cast<const volatile char*>(mapping.data() + 3 * 4096);
              });
            }),
            SIGBUS);
  // A SIGBUS sent with kill() is not a fault in a mapping: it keeps its default action.
  EXPECT_EQ(signal_ending_child([] { ::raise(SIGBUS); }), SIGBUS);
}

// ---- datasets truncated under a live reader ----

struct Case {
  const char* codec;
  bool ragged;
};

class TruncatedUnderReader : public ::testing::TestWithParam<Case> {};

TEST_P(TruncatedUnderReader, EngineReadsFailWithIoErrorAndTheHandleSurvives) {
  TempDir dir;
  const std::string path = write_dataset(dir, "data.mmt", GetParam().codec, GetParam().ragged);
  for (bool verify_checksums : {true, false}) {
    SCOPED_TRACE(verify_checksums ? "checksums verified on first use" : "checksums off");
    const std::string copy = dir.file(verify_checksums ? "a.mmt" : "b.mmt");
    fs::copy_file(path, copy);
    ReaderOptions options;
    options.verify_checksums = verify_checksums;
    options.cache_bytes = 64 << 10;  // smaller than the data: decoding goes back to the file
    Dataset ds = Dataset::open(copy, options);
    const std::vector<int64_t> indices = all_indices();
    const std::vector<int64_t> head(indices.begin(), indices.begin() + 16);
    ASSERT_EQ(ds.get_batch(head, "label").to_vector<int64_t>()[15], 15);

    // The last record's chunk is validated (and, compressed, decoded) before the truncation.
    ASSERT_EQ(ds.get(kRecords - 1, "label").item<int64_t>(), kRecords - 1);
    // Keep the header and the first chunks, lose the rest of the data, the schema and the table
    // (already read at open).
    const int64_t kept_bytes = ds.chunk(2).file_offset;
    const auto opened_bytes = std::filesystem::file_size(copy);
    truncate_to(copy, kept_bytes);

    EXPECT_TRUNCATION_ERROR(ds.get_batch(indices, "x"), copy);
    EXPECT_TRUNCATION_ERROR(ds.get_batch(indices, "label", /*threads=*/2), copy);
    {  // the same through streaming stores, the way large values are gathered
      const detail::ScopedStreamingStores streaming(detail::StreamingStores::Always);
      EXPECT_TRUNCATION_ERROR(ds.get_batch(indices, "x"), copy);
      EXPECT_TRUNCATION_ERROR(ds.get_batch(indices, "x", /*threads=*/2), copy);
    }
    // verify() looks at the file's size first: a cut inside a page reads as zeros, not a fault.
    EXPECT_THROW_WITH(ds.verify(), IoError,
                      copy + ": the file is " + std::to_string(kept_bytes) + " bytes now, " +
                          std::to_string(opened_bytes) +
                          " when it was opened: it was truncated or changed while mapped");
    if (!ds.column_is_view("x")) EXPECT_TRUNCATION_ERROR(ds.column("x"), copy);
    if (std::string(GetParam().codec) != "none") EXPECT_TRUNCATION_ERROR(ds.get(kRecords - 2000), copy);
    // A ragged value's view is built from offsets read out of the chunk: in the mapping for
    // an uncompressed chunk, so that read must be guarded too.
    if (GetParam().ragged && std::string(GetParam().codec) == "none")
      EXPECT_TRUNCATION_ERROR(ds.get(kRecords - 1, "tokens"), copy);
    // The ragged copies read values out of the mapping (or decode chunks from it) under the
    // guard as well.
    if (GetParam().ragged) {
      EXPECT_TRUNCATION_ERROR(ds.get_ragged_batch(indices, "tokens"), copy);
      EXPECT_TRUNCATION_ERROR(ds.ragged_column("tokens", 0, kRecords), copy);
    }
    // prefetch reads the chunk table, and where a ragged value lies, from the file: guarded
    // too. Over one contiguous column it reads nothing (pages past the end are only hinted).
    if (GetParam().ragged || std::string(GetParam().codec) != "none") EXPECT_TRUNCATION_ERROR(ds.prefetch(indices), copy);
    else ds.prefetch(indices);
    // The engine's own copies out of a zero-copy view are guarded too: clone(), a cast,
    // item(), equal(), to_double_vector() and printing raise IoError (the Python module's
    // clone, int(), repr and collate go through them).
    if (std::string(GetParam().codec) == "none") {
      const Tensor lost = ds.get(kRecords - 1, "x"), lost_label = ds.get(kRecords - 1, "label");
      EXPECT_TRUNCATION_ERROR(lost.clone(), copy);
      EXPECT_TRUNCATION_ERROR(empty(lost.sizes(), kFloat64).copy_(lost), copy);
      EXPECT_TRUNCATION_ERROR(lost_label.item<int64_t>(), copy);
      EXPECT_TRUNCATION_ERROR((void)lost.equal(lost), copy);
      EXPECT_TRUNCATION_ERROR(lost.to_double_vector(), copy);
      EXPECT_TRUNCATION_ERROR(lost.to_string(), copy);
    }
    // What is still in the file still reads.
    EXPECT_EQ(ds.get_batch(head, "label").to_vector<int64_t>()[15], 15);
    EXPECT_FLOAT_EQ(ds.get(3, "x").to_vector<float>()[1], 3.001f);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, TruncatedUnderReader,
                         ::testing::Values(Case{"none", false}, Case{"none", true}, Case{"lz4", false},
                                           Case{"zstd", true}),
                         [](const auto& info) {
                           return std::string(info.param.codec) + (info.param.ragged ? "_chunked" : "_fixed");
                         });

// A file of 8 records of the one field `field`, four to a chunk, record i of shape `sizes` all i.
std::string write_eight_records(const std::string& path, const Field& field, IntArrayRef sizes) {
  WriterOptions options;
  options.chunk_records = 4;
  DatasetWriter writer = DatasetWriter::create(path, Schema({field}), options);
  for (int64_t i = 0; i < 8; ++i) writer.append({full(sizes, static_cast<double>(i), field.dtype)});
  writer.finish();
  return path;
}

// The loader packs ragged values by copying from views into the mapping (uncompressed
// chunks): a value whose bytes were cut off after its offsets fails the batch with IoError.
TEST(ReliabilityTruncation, LoaderPackingRaggedValuesOfATruncatedFileFailsWithIoError) {
  if (kThreadSanitizer) GTEST_SKIP() << "the SIGBUS guard does not work under ThreadSanitizer";
  TempDir dir;
  const std::string path = write_eight_records(dir.file("ragged.mmt"), Field::ragged("tokens", kInt32, {kVariableDim}),
                                               {16384});  // 64 KiB each
  Dataset ds = Dataset::open(path);
  ASSERT_EQ(ds.get(0, "tokens").size(0), 16384);  // chunk 0's table entry is validated and kept
  // The loaders are made before the cut: the first loader of a dataset reads its chunk table
  // (Dataset::fingerprint(), then kept). Without workers, so that nothing is read before the cut.
  LoaderOptions loader_options;
  loader_options.batch_size = 4;
  loader_options.pin_memory = false;
  loader_options.num_workers = 0;
  Loader loader(ds, loader_options);
  loader_options.sampler.kind = SamplerKind::Sequential;
  Loader in_order(ds, loader_options);
  // Keep the chunk's first page, which holds its value offsets and extents; lose the values.
  truncate_to(path, ds.chunk(0).file_offset + 4096);
  ASSERT_EQ(ds.get(1, "tokens").size(0), 16384);  // the view is still made (offsets are there)
  EXPECT_TRUNCATION_ERROR(loader.next(), path);
  // In order, batch 0 is chunk 0's four records, read as one run (finding the run asks for
  // chunk 0's extent: the remembered entry, not the lost table). The copy of the run fails;
  // the message still names the sample whose values are lost, and its chunk.
  EXPECT_THROW_WITH(in_order.next(), IoError, "Loader: epoch 0, batch 0, sample 0 (row 0), chunk 0, field 'tokens'");
}

// When a batch fails, the loader reads its samples again one by one to name the one at fault.
// That second read of a field stored in another order (channels-last) made a copy outside
// the SIGBUS guard, so naming the error killed the process instead.
TEST(ReliabilityTruncation, LoaderNamingTheSampleOfATruncatedChannelsLastFileFailsWithIoError) {
  if (kThreadSanitizer) GTEST_SKIP() << "the SIGBUS guard does not work under ThreadSanitizer";
  TempDir dir;
  const std::string path = write_eight_records(
      dir.file("images.mmt"), Field::fixed("image", kUInt8, {3, 64, 64}).stored_channels_last(), {3, 64, 64});  // 12 KiB
  Dataset ds = Dataset::open(path);
  // Both chunks' table entries are validated (and kept) before the cut, which loses the table.
  ASSERT_EQ(ds.get(0, "image").to_vector<uint8_t>()[0], 0);
  ASSERT_EQ(ds.get(5, "image").to_vector<uint8_t>()[0], 5);
  LoaderOptions loader_options;
  loader_options.batch_size = 4;
  loader_options.pin_memory = false;
  loader_options.sampler.kind = SamplerKind::Sequential;
  loader_options.num_workers = 0;     // so that nothing is read before the cut
  Loader loader(ds, loader_options);  // before the cut: a loader reads the chunk table when made
  truncate_to(path, ds.chunk(1).file_offset);
  ASSERT_TRUE(loader.next());  // chunk 0 is whole
  EXPECT_TRUNCATION_ERROR(loader.next(), path);
}

// A ragged value whose bytes fail only as they are copied (the file truncated by another
// program inside a chunk's values, after the chunk's entry and value ends were read): the error
// still names the sample and its chunk, for a sequential batch read as one run too.
TEST(ReliabilityTruncation, LoaderNamesTheSampleAndChunkOfARaggedValueThatFailsWhileCopied) {
  if (kThreadSanitizer) GTEST_SKIP() << "the SIGBUS guard does not work under ThreadSanitizer";
  TempDir dir;
  const std::string path = dir.file("cut.mmt");
  {
    WriterOptions options;
    options.chunk_records = 16;
    DatasetWriter writer = DatasetWriter::create(path, Schema({Field::ragged("tokens", kInt32, {kVariableDim})}), options);
    for (int32_t i = 0; i < 64; ++i) writer.append({full({2048}, i, kInt32)});  // 8 KiB a record
    writer.finish();
  }
  Dataset dataset = Dataset::open(path);
  const ChunkInfo chunk = dataset.chunk(2);  // records 32..47, values after 256 bytes of ends and extents
  for (int64_t c = 0; c < dataset.num_chunks(); ++c) (void)dataset.get(dataset.chunk(c).first_record, "tokens");
  // Made before the cut (a dataset's first loader reads its chunk table), without workers so
  // that nothing is read before it.
  std::vector<Loader> loaders;
  for (SamplerKind kind : {SamplerKind::Sequential, SamplerKind::Random}) {
    LoaderOptions options;
    options.batch_size = 16;
    options.num_workers = 0;
    options.pin_memory = false;
    options.sampler.kind = kind;
    options.sampler.seed = 1234;
    loaders.emplace_back(dataset, options);
  }
  // Page-aligned: the page holding record 39's last 256 bytes, and all after, is gone.
  truncate_to(path, chunk.file_offset + 65536);
  for (Loader& loader : loaders) {
    const SamplerKind kind = loader.options().sampler.kind;
    try {
      while (loader.next()) {
      }
      ADD_FAILURE() << "a truncated file went unnoticed";
    } catch (const IoError& e) {
      const std::string message = e.what();
      // Sequential: record 39 is the first that fails. Random: whichever of 39..63 comes first.
      const std::string expected =
          kind == SamplerKind::Sequential ? "sample 39 (row 7), chunk 2, field 'tokens'" : "), chunk ";
      EXPECT_NE(message.find(expected), std::string::npos) << message;
    }
  }
}

// The packer reads .npy and .npz arrays through a mapping. Another program rewriting an input
// in place (numpy.save over it truncates first) while it is packed: the pack fails with
// IoError naming the input, leaves no output and no temporary, and the process lives. For a
// native .npy the writer copies out of the mapping; a big-endian .npy and an np.savez member
// (unaligned) are converted a batch at a time, and a deflated member inflated as it is read:
// each read of the mapping is guarded (the conversions were not, and died of SIGBUS).
TEST(ReliabilityTruncation, AnInputTruncatedWhileItIsPackedFailsThePackWithIoError) {
  if (kThreadSanitizer) GTEST_SKIP() << "the SIGBUS guard does not work under ThreadSanitizer";
  std::vector<float> values(4096 * 256);  // 4 MiB that deflate cannot shrink much
  std::minstd_rand random(7);
  for (float& v : values) v = static_cast<float>(random()) / 1024.0f;
  const std::string shape = "(4096, 256)";
  const testutil::Bytes native = testutil::npy_file("<f4", false, shape, testutil::element_bytes(values, false));
  const std::vector<std::pair<std::string, testutil::Bytes>> inputs{
      {"x.npy", native},
      {"big-endian.npy", testutil::npy_file(">f4", false, shape, testutil::element_bytes(values, true))},
      {"stored.npz", testutil::zip_archive({{"x.npy", native}})},
      {"deflated.npz", testutil::zip_archive({{"x.npy", native, /*deflate=*/true}})},
  };
  for (const auto& [name, bytes] : inputs) {
    SCOPED_TRACE(name);
    TempDir dir;
    const std::string input = dir.file(name), output = dir.file("out.mmt");
    testutil::write_file(input, bytes);
    const std::vector<std::string> specs{name.ends_with(".npz") ? input : "x=" + input};
    const PackSources sources = PackSources::from_arrays(specs);  // maps the input
    truncate_to(input, 8192);
    EXPECT_TRUNCATION_ERROR(pack_dataset(output, sources, PackOptions{}), input);
    EXPECT_FALSE(fs::exists(output));
    int entries = 0;
    for (const auto& entry : fs::directory_iterator(dir.path())) entries += entry.path() != input;
    EXPECT_EQ(entries, 0) << "the writer's temporary is removed";
  }
}

// The mapping of /proc/self/maps that holds `address`, opened for writing through
// /proc/self/map_files (which needs the right to ptrace oneself with the file's owner's
// rights); -1 where the kernel refuses.
int open_mapping_holding(const void* address) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  for (std::string line; std::getline(maps, line);) {
    const std::string range = line.substr(0, line.find(' '));
    const size_t dash = range.find('-');
    const uintptr_t begin = std::stoull(range.substr(0, dash), nullptr, 16);
    const uintptr_t end = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (at >= begin && at < end) return ::open(("/proc/self/map_files/" + range).c_str(), O_RDWR | O_CLOEXEC);
  }
  return -1;
}

// The temporary file a Fortran-order array is converted into is read back through a
// mapping while the pack runs; the page cache may have written it out and dropped its pages
// by then. A failure to read them back (here: the file cut short, as a disk error would
// leave the pages unreadable) fails the pack with an IoError naming the array, never SIGBUS.
TEST(ReliabilityTruncation, AConversionFileThatCannotBeReadBackFailsThePackWithIoError) {
  if (kThreadSanitizer) GTEST_SKIP() << "the SIGBUS guard does not work under ThreadSanitizer";
  TempDir dir;
  constexpr int64_t kRecords = 4096;
  std::vector<int32_t> wide(kRecords * 8);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = static_cast<int32_t>(i);
  testutil::write_file(dir.file("wide.npy"), testutil::npy_file(">i4", true, "(" + std::to_string(kRecords) + ", 8)",
                                                                testutil::element_bytes(wide, true)));
  const ScopedEnv tmpdir("TMPDIR", dir.path());
  const PackSources sources = PackSources::from_arrays(std::vector<std::string>{"wide=" + dir.file("wide.npy")});
  std::vector<Tensor> batch;
  ASSERT_TRUE(sources.record_batch(0, 1, batch));
  const std::string& name = batch[0].untyped_storage().filename();
  EXPECT_NE(name.find("temporary file in " + dir.path().string()), std::string::npos) << name;
  EXPECT_NE(name.find(dir.file("wide.npy") + " converted from Fortran order"), std::string::npos) << name;

  const int fd = open_mapping_holding(batch[0].untyped_storage().data());
  if (fd < 0) GTEST_SKIP() << "/proc/self/map_files refused the temporary file: " << std::strerror(errno);
  ASSERT_EQ(::ftruncate(fd, 0), 0) << std::strerror(errno);
  ::close(fd);
  batch.clear();
  EXPECT_TRUNCATION_ERROR(pack_dataset(dir.file("out.mmt"), sources, {}), dir.file("wide.npy") + " converted from Fortran order");
  EXPECT_FALSE(fs::exists(dir.file("out.mmt")));
}

TEST(ReliabilityTruncation, UserCodeTouchingAZeroCopyViewAfterTruncationGetsSigbus) {
  TempDir dir;
  const std::string path = write_dataset(dir, "data.mmt", "none");
  Dataset ds = Dataset::open(path);
  Tensor last = ds.get(kRecords - 1, "x");  // a view into the mapping, near the end of the data
  ASSERT_EQ(last.untyped_storage().filename(), path);
  truncate_to(path, 4096);
  // The documented limit: the view is read by user code, outside the engine's guard (as
  // to_vector, which copies a mapping's view by the engine's guarded copy first, is not).
  EXPECT_EQ(signal_ending_child([&] {
              volatile float first = *static_cast<const float*>(last.data_ptr());
              (void)first;
            }),
            SIGBUS);
  EXPECT_THROW_WITH(last.to_vector<float>(), IoError, path + ": the file was truncated or changed while mapped");
}

TEST(ReliabilityTruncation, OverwriteNeverShrinksTheOldFileUnderItsReader) {
  TempDir dir;
  const std::string path = write_dataset(dir, "data.mmt", "none");
  Dataset old_reader = Dataset::open(path);
  Tensor old_view = old_reader.get(kRecords - 1, "x");
  struct stat before {};
  ASSERT_EQ(::stat(path.c_str(), &before), 0);

  WriterOptions options;
  options.overwrite = true;
  DatasetWriter writer = DatasetWriter::create(path, Schema({Field::fixed("y", kUInt8, {})}), options);
  writer.append({full({}, 7, kUInt8)});
  writer.finish();

  struct stat after {};
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_NE(after.st_ino, before.st_ino) << "replaced by rename: a new inode at the path";
  // The old inode, unlinked but mapped, keeps every byte.
  EXPECT_FLOAT_EQ(old_view.to_vector<float>()[5], static_cast<float>(kRecords - 1) + 0.005f);
  old_reader.verify();
  EXPECT_EQ(old_reader.size(), kRecords);
  Dataset new_reader = Dataset::open(path);
  EXPECT_EQ(new_reader.size(), 1);
  EXPECT_EQ(new_reader.get(0, "y").item<uint8_t>(), 7);
}

// ---- sweeps over a realistic file (images, labels, ragged tokens; lz4; many chunks) ----

// Opens `bytes` as a dataset (through a memory file, no disk traffic) and reads everything:
// returns normally, or throws what the reader throws.
class MemoryFile {
 public:
  MemoryFile() : fd_(::memfd_create("mmt-sweep", 0)), path_("/proc/self/fd/" + std::to_string(fd_)) {}
  ~MemoryFile() { ::close(fd_); }
  const std::string& put(const std::vector<char>& bytes, size_t length) {
    EXPECT_EQ(::ftruncate(fd_, 0), 0);
    EXPECT_EQ(::pwrite(fd_, bytes.data(), length, 0), static_cast<ssize_t>(length));
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

void read_all(const std::string& path, bool verify_checksums) {
  ReaderOptions options;
  options.verify_checksums = verify_checksums;
  options.cache_bytes = 32 << 10;
  Dataset ds = Dataset::open(path, options);
  std::vector<int64_t> indices(static_cast<size_t>(ds.size()));
  std::iota(indices.rbegin(), indices.rend(), 0);
  for (int64_t i = 0; i < ds.size(); ++i) (void)ds.get(i, "tokens").contiguous();
  (void)ds.get_batch(indices, "image", 2);
  (void)ds.column("label");
  ds.verify();
}

TEST(ReliabilityCorruptionSweep, RealPackedFileTruncatedAndFlippedEverywhereThatMatters) {
  TempDir dir;
  const std::string path = dir.file("real.mmt");
  {
    WriterOptions options;
    options.codec = CodecSpec::parse("lz4");
    options.chunk_bytes = 8 << 10;
    options.alignment = 512;
    DatasetWriter writer = DatasetWriter::create(
        path,
        Schema({Field::fixed("image", kUInt8, {28, 28}), Field::fixed("label", kInt64, {}),
                Field::ragged("tokens", kInt32, {kVariableDim})}),
        options);
    std::mt19937 rng(5);
    std::vector<uint8_t> image(28 * 28);
    for (int64_t i = 0; i < 300; ++i) {
      for (auto& p : image) p = static_cast<uint8_t>(rng() % 16 * 16);
      writer.append({tensor(image, {28, 28}), full({}, static_cast<double>(i % 10), kInt64),
                     full({i % 9}, static_cast<double>(i), kInt32)});
    }
    writer.finish();
  }
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes{std::istreambuf_iterator<char>(in), {}};
  const Dataset good = Dataset::open(path);
  good.verify();
  const DatasetInfo info = good.info();
  ASSERT_GE(info.chunks, 20);
  const std::byte* raw = reinterpret_cast<const std::byte*>(bytes.data());
  const format::Preamble preamble = format::decode_preamble(raw, static_cast<int64_t>(bytes.size()));
  const format::Footer footer = format::decode_footer(raw, static_cast<int64_t>(bytes.size()), preamble);

  MemoryFile memory;
  int64_t cases = 0;
  auto expect_refused = [&](const std::vector<char>& damaged, size_t length, const std::string& what) {
    for (bool verify : {true, false}) {
      ++cases;
      try {
        read_all(memory.put(damaged, length), verify);
        if (verify) ADD_FAILURE() << what << ": damage not detected";
      } catch (const FormatError&) {
      } catch (const std::exception& e) {
        ADD_FAILURE() << what << ": " << e.what() << " is not a FormatError";
      }
    }
  };

  // Truncation at every chunk boundary (and a byte either side), and at every byte of the
  // preamble, the schema block, the chunk table and the footer.
  std::vector<size_t> lengths;
  for (int64_t c = 0; c < info.chunks; ++c) {
    const ChunkInfo chunk = good.chunk(c);
    for (int64_t at : {chunk.file_offset, chunk.file_offset + chunk.stored_bytes})
      for (int64_t delta : {-1, 0, 1}) lengths.push_back(static_cast<size_t>(at + delta));
  }
  for (size_t at = 0; at < static_cast<size_t>(format::kPreambleBytes); ++at) lengths.push_back(at);
  for (size_t at = footer.schema_offset; at < bytes.size(); ++at) lengths.push_back(at);  // schema, table, footer
  for (size_t length : lengths) expect_refused(bytes, length, detail::str("truncated to ", length, " bytes"));
  const int64_t truncations = cases;

  // Every bit of the preamble, the schema block and the footer; of the chunk table, every
  // bit of the first, second, middle and last entries (every entry with MMT_SWEEP_FULL=1:
  // they are all checked by the same code, and CI time is better spent elsewhere).
  const bool full_sweep = std::getenv("MMT_SWEEP_FULL") != nullptr;
  const size_t table = footer.chunk_table_offset, entry_bytes = format::kChunkEntryBytes;
  std::vector<std::pair<size_t, size_t>> regions{{0, format::kPreambleBytes},
                                                  {footer.schema_offset, footer.schema_offset + footer.schema_bytes},
                                                  {bytes.size() - format::kFooterBytes, bytes.size()}};
  if (full_sweep) {
    regions.push_back({table, bytes.size() - format::kFooterBytes});
  } else {
    for (int64_t c : {int64_t{0}, int64_t{1}, info.chunks / 2, info.chunks - 1})
      regions.push_back({table + c * entry_bytes, table + (c + 1) * entry_bytes});
  }
  std::vector<char> damaged = bytes;
  for (auto [begin, end] : regions)
    for (size_t at = begin; at < end; ++at)
      for (int bit = 0; bit < 8; ++bit) {
        damaged[at] = static_cast<char>(bytes[at] ^ (1 << bit));
        expect_refused(damaged, damaged.size(), detail::str("bit ", bit, " of byte ", at, " flipped"));
        damaged[at] = bytes[at];
      }
  const int64_t bit_flips = cases - truncations;

  // Random byte damage in chunk payloads: a ChecksumError naming the damaged chunk.
  std::mt19937_64 rng(17);
  int64_t payload_cases = 0;
  for (int round = 0; round < 300; ++round) {
    const int64_t c = static_cast<int64_t>(rng() % static_cast<uint64_t>(info.chunks));
    const ChunkInfo chunk = good.chunk(c);
    const size_t at = static_cast<size_t>(chunk.file_offset + static_cast<int64_t>(rng() % chunk.stored_bytes));
    damaged[at] = static_cast<char>(bytes[at] ^ static_cast<char>(1 + rng() % 255));
    ++payload_cases;
    try {
      Dataset::open(memory.put(damaged, damaged.size())).verify();
      ADD_FAILURE() << "payload damage at byte " << at << " not detected";
    } catch (const ChecksumError& e) {
      EXPECT_NE(std::string(e.what()).find(detail::str(": chunk ", c, " (byte offset ", chunk.file_offset)),
                std::string::npos) << e.what();
    }
    damaged[at] = bytes[at];
  }
  const std::string summary = detail::str(bytes.size(), "-byte file of ", info.chunks, " chunks: ", truncations,
                                          " truncated reads, ", bit_flips, " bit-flipped reads, ", payload_cases,
                                          " payload damages named by chunk");
  std::printf("%s\n", summary.c_str());
  RecordProperty("summary", summary);
}

}  // namespace
}  // namespace mmt
