// Megatron-LM indexed datasets as pack sources (PackSources::from_megatron): one record per
// document, its sequences joined, viewing the mapped .bin; every damaged index refused with
// the file, the entry and its byte.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "importer_test_util.h"
#include "megatron_test_util.h"
#include "mmtensor/dataset.h"
#include "mmtensor/error.h"
#include "mmtensor/packer.h"
#include "test_util.h"

namespace mmt {
namespace {

using testing::error_of;
using testutil::Bytes;
using testutil::MegatronBuilder;
using testutil::TempFolder;
using testutil::write_file;

std::vector<int64_t> values_of(const Tensor& t) {
  std::vector<int64_t> out;
  const Tensor c = t.contiguous();
  for (int64_t i = 0; i < c.numel(); ++i) out.push_back(static_cast<int64_t>(c.flatten()[i].item<double>()));
  return out;
}

// Four documents: one sequence; two sequences (sentences split); none; one long sequence.
MegatronBuilder four_documents() {
  MegatronBuilder builder;  // uint16, as Megatron writes a vocabulary under 65,500
  std::vector<int64_t> long_one;
  for (int64_t t = 0; t < 5000; ++t) long_one.push_back((t * 37) % 65000);
  builder.document({{1, 2, 3}}).document({{4}, {5, 6}}).document({}).document({long_one});
  return builder;
}

TEST(PackMegatron, DocumentsBecomeRecordsViewingTheMappedBin) {
  TempFolder dir;
  const MegatronBuilder built = four_documents();
  built.write(dir / "corpus_text_document");
  const std::string prefix = dir / "corpus_text_document";

  const PackSources sources = PackSources::from_megatron(std::vector<std::string>{prefix});
  ASSERT_EQ(sources.records(), 4);
  ASSERT_EQ(sources.schema().size(), 1u);
  EXPECT_EQ(sources.schema()[0].name, "tokens");
  EXPECT_EQ(sources.schema()[0].dtype, kUInt16);
  EXPECT_FALSE(sources.schema()[0].is_fixed());
  EXPECT_EQ(sources.metadata().at("source"), "megatron");
  EXPECT_EQ(sources.total_bytes(), (3 + 3 + 5000) * 2);
  EXPECT_EQ(values_of(sources.record(0)[0]), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(values_of(sources.record(1)[0]), (std::vector<int64_t>{4, 5, 6}));  // its two sequences joined
  EXPECT_EQ(sources.record(2)[0].numel(), 0);
  EXPECT_EQ(values_of(sources.record(3)[0]).at(4999), (4999 * 37) % 65000);
  // Zero-copy: the values are the .bin's mapping.
  EXPECT_EQ(sources.record(3)[0].untyped_storage().filename(), prefix + ".bin");
  EXPECT_NE(sources.record_origin(0, 1).find("document 1 of " + prefix + ".bin (sequences 1 to 3"), std::string::npos)
      << sources.record_origin(0, 1);
  // Packing over them would replace an input.
  EXPECT_THROW(sources.check_output(prefix + ".bin"), ValueError);

  const std::string out = dir / "out.mmt";
  pack_dataset(out, sources, {});
  const Dataset ds = Dataset::open(out);
  ASSERT_EQ(ds.size(), 4);
  EXPECT_EQ(values_of(ds[1]["tokens"]), (std::vector<int64_t>{4, 5, 6}));
  EXPECT_EQ(ds[2]["tokens"].numel(), 0);
  EXPECT_EQ(compare_with_sources(ds, sources), 4);
}

TEST(PackMegatron, ThePrefixTheIdxOrTheBinNameTheDatasetAndSeveralReadAsOne) {
  TempFolder dir;
  four_documents().write(dir / "a");
  MegatronBuilder second;
  second.document({{9, 9}}).document({{8}});
  second.write(dir / "b");
  for (const std::string& spec : {dir / "a", dir / "a.idx", dir / "a.bin", "ids=" + dir / "a"}) {
    const std::vector<std::string> specs{spec, dir / "b.idx"};
    EXPECT_TRUE(are_megatron_inputs(specs)) << spec;
    EXPECT_FALSE(are_tar_inputs(specs)) << spec;
    EXPECT_FALSE(are_dataset_inputs(specs)) << spec;
  }
  const std::vector<std::string> specs{"ids=" + dir / "a", "ids=" + dir / "b.bin"};
  const PackSources both = PackSources::from_inputs(specs);
  ASSERT_EQ(both.records(), 6);
  EXPECT_EQ(both.schema()[0].name, "ids");
  EXPECT_EQ(values_of(both.record(4)[0]), (std::vector<int64_t>{9, 9}));
  EXPECT_EQ(values_of(both.record(5)[0]), (std::vector<int64_t>{8}));
  EXPECT_NE(both.record_origin(0, 5).find("document 1 of " + dir / "b.bin"), std::string::npos);
  EXPECT_EQ(both.input_paths().size(), 4u);  // each .idx and .bin

  // One field: two names, two dtypes, or another kind of input among them are refused.
  EXPECT_THROW(PackSources::from_inputs(std::vector<std::string>{"ids=" + dir / "a", "x=" + dir / "b"}), InputSpecError);
  MegatronBuilder wide(4, 4);  // int32
  wide.document({{1}});
  wide.write(dir / "c");
  EXPECT_NE(error_of([&] { PackSources::from_inputs(std::vector<std::string>{dir / "a", dir / "c"}); })
                .find("holds int32 tokens, but " + dir / "a.idx" + " holds uint16"),
            std::string::npos);
  write_file(dir / "x.npy", testutil::npy_with_dict("{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }",
                                                    Bytes(8, std::byte{0})));
  EXPECT_NE(error_of([&] { PackSources::from_inputs(std::vector<std::string>{dir / "a", "x=" + dir / "x.npy"}); })
                .find("is not a Megatron indexed dataset"),
            std::string::npos);
  EXPECT_THROW(PackSources::from_inputs(std::vector<std::string>{dir / "a"}, std::vector<std::string>{"tokens"}),
               InputSpecError);
}

TEST(PackMegatron, EveryDtypeCodeIsMegatrons) {
  TempFolder dir;
  const struct {
    uint8_t code;
    int64_t item;
    ScalarType dtype;
  } codes[] = {{1, 1, kUInt8}, {2, 1, kInt8},    {3, 2, kInt16},   {4, 4, kInt32},
               {5, 8, kInt64}, {6, 8, kFloat64}, {7, 4, kFloat32}, {8, 2, kUInt16}};
  for (const auto& c : codes) {
    MegatronBuilder builder(c.code, c.item);
    builder.document({{0, 0}});
    const std::string prefix = dir / ("code" + std::to_string(c.code));
    builder.write(prefix);
    const PackSources sources = PackSources::from_megatron(std::vector<std::string>{prefix});
    EXPECT_EQ(sources.schema()[0].dtype, c.dtype) << int{c.code};
    EXPECT_EQ(sources.record(0)[0].numel(), 2) << int{c.code};
  }
  MegatronBuilder negative(2, 1);  // int8
  negative.document({{-5, 7}});
  negative.write(dir / "negative");
  EXPECT_EQ(values_of(PackSources::from_megatron(std::vector<std::string>{dir / "negative"}).record(0)[0]),
            (std::vector<int64_t>{-5, 7}));
}

TEST(PackMegatron, SequencesApartOrBetweenValuesAreGathered) {
  TempFolder dir;
  MegatronBuilder builder;  // uint16
  builder.document({{1, 2}, {3, 4}});
  builder.pointers() = {4, 0};  // the second sequence first in the .bin
  builder.write(dir / "apart");
  const PackSources apart = PackSources::from_megatron(std::vector<std::string>{dir / "apart"});
  const Tensor tokens = apart.record(0)[0];
  EXPECT_EQ(values_of(tokens), (std::vector<int64_t>{3, 4, 1, 2}));
  EXPECT_TRUE(tokens.untyped_storage().filename().empty()) << "a copy, not a view";

  MegatronBuilder odd;
  odd.document({{0x0100, 0x0302}});  // bytes 00 01 02 03
  odd.pointers() = {1};              // from byte 1: one uint16 token 0x0201 and ... past the end
  odd.write(dir / "odd");
  EXPECT_NE(error_of([&] { PackSources::from_megatron(std::vector<std::string>{dir / "odd"}); }).find("runs past its end"),
            std::string::npos);
  MegatronBuilder shorter;
  shorter.document({{0x0100, 0x0302, 0x0504}}).document({{0}});
  shorter.write(dir / "short");
  Bytes index = shorter.index();
  index[shorter.pointers_at()] = std::byte{1};  // sequence 0 from byte 1: bytes 1..7
  write_file(dir / "short.idx", index);
  const PackSources unaligned = PackSources::from_megatron(std::vector<std::string>{dir / "short"});
  EXPECT_EQ(values_of(unaligned.record(0)[0]), (std::vector<int64_t>{0x0201, 0x0403, 0x0005}));
}

TEST(PackMegatron, DamagedIndexesAreRefusedWithTheEntryAndItsByte) {
  TempFolder dir;
  const MegatronBuilder built = four_documents();
  const std::string prefix = dir / "d";
  built.write(prefix);
  const Bytes good = built.index();
  const auto refusal = [&](const Bytes& index) {
    write_file(prefix + ".idx", index);
    return error_of([&] { PackSources::from_megatron(std::vector<std::string>{prefix}); });
  };
  const auto with = [&](size_t at, uint64_t value, int bytes) {
    Bytes index = good;
    for (int b = 0; b < bytes; ++b) index[at + static_cast<size_t>(b)] = static_cast<std::byte>((value >> (8 * b)) & 0xFF);
    return index;
  };
  EXPECT_NE(refusal(with(9, 2, 8)).find("index version 2 (byte 9); this reader knows version 1"), std::string::npos);
  EXPECT_NE(refusal(with(17, 9, 1)).find("dtype code 9 (byte 17)"), std::string::npos);
  EXPECT_NE(refusal(with(18, uint64_t{1} << 60, 8)).find("more than the file holds"), std::string::npos);
  EXPECT_NE(refusal(with(26, 6, 8)).find("(truncated)"), std::string::npos);
  EXPECT_NE(refusal(with(26, 0, 8)).find("(trailing bytes)"), std::string::npos);
  Bytes multimodal = good;
  multimodal.resize(good.size() + 4, std::byte{0});  // a mode byte for each of the 4 sequences
  EXPECT_NE(refusal(multimodal).find("a multimodal index"), std::string::npos);
  EXPECT_NE(refusal(with(MegatronBuilder::kLengthsAt + 4, 0xFFFFFFFF, 4)).find("sequence 1 has length -1 (byte 38)"),
            std::string::npos);
  EXPECT_NE(refusal(with(built.pointers_at() + 8 * 3, 10000 - 1, 8)).find("sequence 3 (5000 tokens of uint16) at byte 9999"),
            std::string::npos);
  EXPECT_NE(refusal(with(built.document_indices_at(), 1, 8)).find("document index 0 is 1"), std::string::npos);
  EXPECT_NE(refusal(with(built.document_indices_at() + 8 * 2, 0, 8)).find("document index 2 is 0"), std::string::npos);
  EXPECT_NE(refusal(with(built.document_indices_at() + 8 * 4, 3, 8)).find("the last 1 sequence belongs to no document"),
            std::string::npos);

  // Cut at every byte: refused (or, with too little of the magic left, not taken for an index).
  for (size_t cut = 0; cut < good.size(); ++cut) {
    const std::string why = refusal(Bytes(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut)));
    EXPECT_NE(why, "") << "cut at " << cut;
  }
  // Every bit flipped: refused, or records that read without fault.
  for (size_t bit = 0; bit < good.size() * 8; ++bit) {
    Bytes index = good;
    index[bit / 8] ^= static_cast<std::byte>(1u << (bit % 8));
    write_file(prefix + ".idx", index);
    try {
      const PackSources sources = PackSources::from_megatron(std::vector<std::string>{prefix});
      for (int64_t r = 0; r < sources.records(); ++r) (void)sources.record(r)[0].contiguous();
    } catch (const Error&) {
    }
  }
  // An index of the older format, or of no format, beside a .bin: named as such.
  write_file(prefix + ".idx", testutil::to_bytes(std::string("TNTIDX\0\0", 8) + std::string(40, '\0')));
  EXPECT_TRUE(are_megatron_inputs(std::vector<std::string>{prefix}));
  EXPECT_NE(refusal(testutil::to_bytes(std::string("TNTIDX\0\0", 8) + std::string(40, '\0'))).find("rebuild it in the mmap format"),
            std::string::npos);
  EXPECT_NE(refusal(testutil::to_bytes("tiny")).find("4 bytes, less than the 34-byte header"), std::string::npos);
  write_file(prefix + ".idx", good);
  std::filesystem::remove(prefix + ".bin");
  EXPECT_THROW(PackSources::from_megatron(std::vector<std::string>{prefix}), IoError);
}

TEST(PackMegatron, AnIndexRewrittenWhileItIsPackedIsAnIoErrorAndADatasetIsPackedOnce) {
  TempFolder dir;
  MegatronBuilder builder;
  builder.document({{1, 2}, {3}}).document({{4}});
  builder.write(dir / "x.bin");  // a prefix that ends in ".bin": x.bin.idx, x.bin.bin
  const PackSources sources = PackSources::from_megatron(std::vector<std::string>{dir / "x.bin"});
  ASSERT_EQ(sources.records(), 2);
  // Rewritten in place, the same size: a pointer far past the .bin, then a document index.
  Bytes index = builder.index();
  for (int b = 0; b < 8; ++b) index[builder.pointers_at() + 8 + static_cast<size_t>(b)] = std::byte{0x7F};
  write_file(dir / "x.bin.idx", index);
  EXPECT_THROW_WITH(sources.record(0), IoError, "sequence 1 (bytes 38 and 54) changed while it was being packed");
  index = builder.index();
  index[builder.document_indices_at() + 8] = std::byte{9};
  write_file(dir / "x.bin.idx", index);
  EXPECT_THROW_WITH(sources.record(0), IoError, "changed while it was being packed");
  write_file(dir / "x.bin.idx", builder.index());
  EXPECT_THROW_WITH(PackSources::from_megatron(std::vector<std::string>{dir / "x.bin", dir / "x.bin.bin"}), ValueError,
                    "each Megatron dataset is packed once");
}

TEST(PackMegatron, DocumentsCutIntoTokenWindows) {
  TempFolder dir;
  MegatronBuilder builder;
  builder.document({{1, 2, 3}}).document({{4}, {5}}).document({{6, 7, 8, 9}});
  builder.write(dir / "w");
  const PackSources windows = PackSources::token_windows(PackSources::from_megatron(std::vector<std::string>{dir / "w"}),
                                                         {.length = 4, .stride = 3, .separator = 0});
  // The stream: 1 2 3 0 4 5 0 6 7 8 9 0 (12 tokens): windows at 0, 3, 6; 8 would pass the end.
  ASSERT_EQ(windows.records(), 3);
  EXPECT_EQ(values_of(windows.record(0)[0]), (std::vector<int64_t>{1, 2, 3, 0}));
  EXPECT_EQ(values_of(windows.record(1)[0]), (std::vector<int64_t>{0, 4, 5, 0}));
  EXPECT_EQ(values_of(windows.record(2)[0]), (std::vector<int64_t>{0, 6, 7, 8}));
}

}  // namespace
}  // namespace mmt
