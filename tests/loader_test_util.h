// Shared by the loader's CPU and GPU tests: a small dataset with every kind of field, and
// checks that a batch holds exactly what Dataset::get returns for its indices.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "mmtensor/dataset.h"
#include "mmtensor/dataset_writer.h"
#include "mmtensor/loader.h"
#include "test_util.h"

namespace mmt::testing {

// Records [begin, end): "x" float32 [4] = 10*i + k; "label" int64 [] = i; "image" uint8
// [3, 4, 4] stored channels-last; "tokens" int32 ragged [-1] of length i % 5 (zero-length
// included). Shards of [0, N) hold the same records as one file of [0, N).
inline std::string write_loader_records(const std::string& path, int64_t begin, int64_t end, CodecSpec codec = {},
                                        int64_t chunk_records = 16, Metadata metadata = {}) {
  Schema schema({Field::fixed("x", kFloat32, {4}), Field::fixed("label", kInt64, {}),
                 Field::fixed("image", kUInt8, {3, 4, 4}).stored_channels_last(),
                 Field::ragged("tokens", kInt32, {kVariableDim})});
  WriterOptions options;
  options.codec = codec;
  options.chunk_records = chunk_records;
  options.threads = 1;
  options.metadata = std::move(metadata);
  DatasetWriter writer = DatasetWriter::create(path, schema, options);
  for (int64_t i = begin; i < end; ++i) {
    std::vector<float> x;
    for (int k = 0; k < 4; ++k) x.push_back(static_cast<float>(10 * i + k));
    std::vector<uint8_t> image(48);
    for (size_t p = 0; p < image.size(); ++p) image[p] = static_cast<uint8_t>((i * 7 + p) & 0xff);
    std::vector<int32_t> tokens;
    for (int64_t t = 0; t < i % 5; ++t) tokens.push_back(static_cast<int32_t>(i * 100 + t));
    Tensor token_tensor = tokens.empty() ? empty({0}, kInt32) : tensor(tokens);
    writer.append({tensor(x), full({}, static_cast<double>(i), kInt64), tensor(image, {3, 4, 4}), token_tensor});
  }
  writer.finish();
  return path;
}

// write_loader_records of [0, records) into dir/name.
inline std::string write_loader_dataset(const TempDir& dir, int64_t records, CodecSpec codec = {},
                                        int64_t chunk_records = 16, const std::string& name = "data.mmt") {
  return write_loader_records(dir.file(name), 0, records, codec, chunk_records);
}

// Flips a byte in the middle of chunk `chunk_index`'s stored bytes, as a disk error would,
// and returns the chunk's entry (its records are the ones a reader must now refuse).
inline ChunkInfo damage_chunk(const std::string& path, int64_t chunk_index) {
  ChunkInfo chunk;
  {
    Dataset dataset = Dataset::open(path);
    chunk = dataset.chunk(chunk_index);
  }
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  char byte = 0;
  file.seekg(chunk.file_offset + chunk.stored_bytes / 2);
  file.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x5a);
  file.seekp(chunk.file_offset + chunk.stored_bytes / 2);
  file.write(&byte, 1);
  return chunk;
}

// Every field of every row equals dataset.get(index, field); host tensors only.
inline void expect_batch_matches_dataset(const Batch& batch, const Dataset& dataset,
                                         const std::vector<std::string>& fields) {
  const std::span<const int64_t> indices = batch.indices();
  ASSERT_EQ(static_cast<int64_t>(indices.size()), batch.size());
  for (const std::string& field : fields) {
    if (batch.is_ragged(field)) {
      const RaggedBatch& ragged = batch.ragged(field);
      ASSERT_EQ(ragged.offsets.numel(), batch.size() + 1);
      const std::vector<int64_t> offsets = ragged.offsets.to_vector<int64_t>();
      ASSERT_EQ(offsets.front(), 0);
      ASSERT_EQ(offsets.back(), ragged.values.numel());
      for (int64_t row = 0; row < batch.size(); ++row) {
        const Tensor expected = dataset.get(indices[row], field);
        const Tensor shape = ragged.shapes[row];
        ASSERT_EQ(shape.to_vector<int64_t>(), expected.sizes().vec()) << field << " row " << row;
        const Tensor got = ragged.values.narrow(0, offsets[row], offsets[row + 1] - offsets[row])
                               .view(expected.sizes());
        EXPECT_TRUE(got.equal(expected)) << field << " row " << row << " record " << indices[row];
      }
    } else {
      const Tensor& values = batch[field];
      ASSERT_EQ(values.size(0), batch.size());
      for (int64_t row = 0; row < batch.size(); ++row)
        EXPECT_TRUE(values[row].equal(dataset.get(indices[row], field)))
            << field << " row " << row << " record " << indices[row];
    }
  }
}

// Drains the current epoch and returns the indices in the order they came.
inline std::vector<int64_t> drain_epoch(Loader& loader, std::vector<int64_t>* batch_sizes = nullptr) {
  std::vector<int64_t> order;
  while (std::optional<Batch> batch = loader.next()) {
    order.insert(order.end(), batch->indices().begin(), batch->indices().end());
    if (batch_sizes) batch_sizes->push_back(batch->size());
  }
  return order;
}

// Takes the next `batches` batches (each must come: a failure is recorded otherwise) and
// returns their indices in the order they came.
inline std::vector<int64_t> take_batches(Loader& loader, int batches) {
  std::vector<int64_t> order;
  for (int b = 0; b < batches; ++b) {
    std::optional<Batch> batch = loader.next();
    if (!batch) {
      ADD_FAILURE() << "the epoch ended after " << b << " of " << batches << " batches";
      break;
    }
    order.insert(order.end(), batch->indices().begin(), batch->indices().end());
  }
  return order;
}

}  // namespace mmt::testing
