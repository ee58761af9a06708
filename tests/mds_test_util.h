// Writes MosaicML Streaming (MDS) datasets as its MDSWriter does
// (streaming/base/format/mds/writer.py): shards of uint32 count, uint32 absolute offsets,
// the writer's config as JSON, then the samples (uint32 sizes of the variable columns, then
// every column's bytes); index.json listing the shards.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "importer_test_util.h"

namespace mmt::testutil {

class MdsBuilder {
 public:
  struct Column {
    std::string name, encoding;
    int64_t fixed_size = -1;  // the encoding's fixed size, or -1
  };
  // Columns in the order the writer keeps them (it sorts them by name).
  explicit MdsBuilder(std::vector<Column> columns) : columns_(std::move(columns)) {}

  // A sample: each column's encoded bytes, in column order.
  MdsBuilder& sample(const std::vector<Bytes>& values) {
    Bytes encoded;
    for (size_t c = 0; c < columns_.size(); ++c)
      if (columns_[c].fixed_size < 0) put32(encoded, static_cast<uint32_t>(values[c].size()));
    for (const Bytes& value : values) encoded.insert(encoded.end(), value.begin(), value.end());
    pending_.push_back(std::move(encoded));
    return *this;
  }

  // Ends the shard being written: its bytes, and its entry in the index.
  Bytes shard_bytes() const {
    const std::string config = config_json().dump();
    Bytes out;
    put32(out, static_cast<uint32_t>(pending_.size()));
    uint32_t offset = static_cast<uint32_t>(4 + 4 * (pending_.size() + 1) + config.size());
    put32(out, offset);
    for (const Bytes& s : pending_) put32(out, offset += static_cast<uint32_t>(s.size()));
    append(out, config);
    for (const Bytes& s : pending_) out.insert(out.end(), s.begin(), s.end());
    return out;
  }
  // Writes the shard as DIR/BASENAME (and, compressed, as `zip_basename` instead when given:
  // the caller writes that file) and adds it to the index.
  void flush(const std::string& dir, const std::string& basename, const std::string& zip_basename = "",
             const std::string& compression = "") {
    nlohmann::json entry = config_json();
    entry["samples"] = pending_.size();
    entry["raw_data"] = {{"basename", basename}, {"bytes", shard_bytes().size()}, {"hashes", nlohmann::json::object()}};
    if (zip_basename.empty()) {
      write_file(dir + "/" + basename, shard_bytes());
      entry["zip_data"] = nullptr;
    } else {
      entry["zip_data"] = {{"basename", zip_basename}, {"bytes", 0}, {"hashes", nlohmann::json::object()}};
      entry["compression"] = compression;
    }
    shards_.push_back(entry);
    pending_.clear();
  }
  void write_index(const std::string& dir) const {
    const nlohmann::json index = {{"shards", shards_}, {"version", 2}};
    write_file(dir + "/index.json", to_bytes(index.dump()));
  }

  static void put32(Bytes& out, uint32_t v) {
    for (int b = 0; b < 4; ++b) out.push_back(static_cast<std::byte>((v >> (8 * b)) & 0xFF));
  }
  template <typename T>
  static Bytes bytes_of(const std::vector<T>& values) {
    Bytes out(values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
    return out;
  }

 private:
  nlohmann::json config_json() const {
    nlohmann::json names = nlohmann::json::array(), encodings = nlohmann::json::array(), sizes = nlohmann::json::array();
    for (const Column& c : columns_) {
      names.push_back(c.name);
      encodings.push_back(c.encoding);
      sizes.push_back(c.fixed_size < 0 ? nlohmann::json(nullptr) : nlohmann::json(c.fixed_size));
    }
    return {{"column_encodings", encodings}, {"column_names", names}, {"column_sizes", sizes},
            {"compression", nullptr},        {"format", "mds"},      {"hashes", nlohmann::json::array()},
            {"size_limit", 1 << 26},         {"version", 2}};
  }

  std::vector<Column> columns_;
  std::vector<Bytes> pending_;
  nlohmann::json shards_ = nlohmann::json::array();
};

}  // namespace mmt::testutil
