// Chunk codecs: none, lz4, zstd (with a level).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace mmt {

enum class Codec : uint8_t { None = 0, LZ4 = 1, Zstd = 2 };

struct CodecSpec {
  Codec codec = Codec::None;
  int level = 0;  // zstd: 1..22 (0 = zstd's default, 3); lz4: 0 = fast, 1..12 = HC levels

  // Parses "none", "lz4", "lz4:9", "zstd", "zstd:19"; throws ValueError otherwise.
  static CodecSpec parse(std::string_view text);
  std::string str() const;  // the inverse of parse
  friend bool operator==(const CodecSpec&, const CodecSpec&) = default;
};

std::string_view to_string(Codec codec);

}  // namespace mmt
