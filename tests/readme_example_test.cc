// The README's C++ example ("The idea in one example") compiles and runs: CMake copies its
// block out of README.md into readme_example.inc, included below as a function body, so an
// edit of the README or of the API that breaks the example fails the build or this test.
// The names the example takes as given (the tensors it writes, a second writer, the files it
// opens) are made here first, in a folder of its own.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "mmtensor/mmtensor.h"
#include "test_util.h"

namespace {

// The working folder for the example's relative paths, restored when the example is done.
class InFolder {
 public:
  explicit InFolder(const std::filesystem::path& folder) : previous_(std::filesystem::current_path()) {
    std::filesystem::current_path(folder);
  }
  ~InFolder() { std::filesystem::current_path(previous_); }
  InFolder(const InFolder&) = delete;
  InFolder& operator=(const InFolder&) = delete;

 private:
  std::filesystem::path previous_;
};

// A dataset of one int64 field, for the files the example only opens (its shards and the
// sources it mixes): the example reads their sizes and one record's place.
void write_labels(const std::string& path, int64_t records) {
  auto writer = mmt::DatasetWriter::create(path, mmt::Schema({mmt::Field::fixed("label", mmt::kInt64, {})}));
  writer.append_batch({mmt::arange(records)});
  writer.finish();
}

TEST(ReadmeExample, CompilesAndRuns) {
  const mmt::testing::TempDir dir;
  const InFolder in_folder(dir.path());
  write_labels("curated.mmt", 300);
  write_labels("web.mmt", 700);
  for (int k = 0; k < 3; ++k) write_labels("train-" + std::to_string(k) + ".mmt", 50'000);  // locate(123456)
  {
    auto tokens = mmt::DatasetWriter::create(
        "tokens.mmt", mmt::Schema({mmt::Field::ragged("tokens", mmt::kInt32, {-1})}));
    const int64_t documents = 2000;
    mmt::Tensor offsets = mmt::arange(0, documents * 3 + 1, 3);  // documents of 3 tokens
    tokens.append_batch({mmt::arange(documents * 3, mmt::kInt32)}, {offsets});
    tokens.finish();
  }

  // What the example takes as given.
  const int64_t batch_records = 999;
  mmt::Tensor image_tensor = mmt::full({1, 28, 28}, 1, mmt::kUInt8);
  mmt::Tensor label_tensor = mmt::scalar_tensor<int64_t>(3);
  mmt::Tensor images = mmt::full({batch_records, 1, 28, 28}, 2, mmt::kUInt8);
  mmt::Tensor labels = mmt::arange(batch_records);
  auto tokens_writer = mmt::DatasetWriter::create(
      "more-tokens.mmt", mmt::Schema({mmt::Field::ragged("tokens", mmt::kInt32, {-1}),
                                      mmt::Field::fixed("label", mmt::kInt64, {})}));
  mmt::Tensor token_values = mmt::arange(10, mmt::kInt32);
  mmt::Tensor token_offsets = mmt::tensor<int64_t>({0, 4, 10});
  mmt::Tensor token_labels = mmt::tensor<int64_t>({5, 6});
  mmt::Dataset tokens_ds = mmt::Dataset::open("tokens.mmt");
  mmt::Tensor image_out = mmt::empty({3, 1, 28, 28}, mmt::kUInt8);
  mmt::Tensor label_out = mmt::empty({3}, mmt::kInt64);

// The example names values a training step would use (the batch's images) and leaves the
// step out.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-variable"
#include "readme_example.inc"
#pragma GCC diagnostic pop

  // What it did, as its comments say.
  EXPECT_EQ(ds.size(), 1 + batch_records);
  EXPECT_EQ(image.sizes(), mmt::IntArrayRef({1, 28, 28}));
  EXPECT_EQ(batch.sizes(), mmt::IntArrayRef({3, 1, 28, 28}));
  EXPECT_EQ(label_out.select(0, 0).item<int64_t>(), 4);  // record 5: the batch's record 4
  EXPECT_EQ(docs.offsets.numel(), 257);
  EXPECT_EQ(tokens_writer.size(), 2);
  EXPECT_FALSE(checkpoint.empty());
  EXPECT_EQ(part, 2);
  EXPECT_EQ(index_in_part, 123456 - 100'000);
  int64_t seen = 0;
  for (mmt::Batch& b : normalised) {
    EXPECT_EQ(b["image"].dtype(), mmt::kFloat32);
    seen += b["image"].size(0);
  }
  EXPECT_EQ(seen, ds.size());
}

}  // namespace
