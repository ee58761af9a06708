// TarBuilder: a tar archive built header by header (POSIX ustar), for tests of the tar
// input (WebDataset shards) to make and damage at will.
#pragma once

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "importer_test_util.h"

namespace mmt::testutil {

class TarBuilder {
 public:
  // A member of `type` ('0' a file, '5' a folder, '2' a link, 'x' a pax header, 'L' a GNU long name).
  TarBuilder& add(const std::string& name, std::string_view data, char type = '0') {
    std::array<char, 512> header{};
    std::memcpy(header.data(), name.data(), std::min<size_t>(name.size(), 100));
    std::snprintf(header.data() + 100, 8, "%07o", 0644);
    std::snprintf(header.data() + 124, 12, "%011llo", static_cast<unsigned long long>(data.size()));
    std::snprintf(header.data() + 136, 12, "%011o", 0);
    header[156] = type;
    std::memcpy(header.data() + 257, "ustar\0" "00", 8);
    std::memset(header.data() + 148, ' ', 8);
    unsigned sum = 0;
    for (char c : header) sum += static_cast<unsigned char>(c);
    std::snprintf(header.data() + 148, 8, "%06o", sum);
    header_offsets.push_back(static_cast<int64_t>(bytes.size()));
    bytes.insert(bytes.end(), reinterpret_cast<const std::byte*>(header.data()),
                 reinterpret_cast<const std::byte*>(header.data()) + 512);
    testutil::append(bytes, data);
    bytes.resize((bytes.size() + 511) / 512 * 512);
    return *this;
  }
  // A pax header record set: "LEN key=value\n" each.
  TarBuilder& pax(const std::vector<std::pair<std::string, std::string>>& records) {
    std::string text;
    for (const auto& [key, value] : records) {
      const std::string body = " " + key + "=" + value + "\n";
      size_t length = body.size() + 1;
      while (std::to_string(length).size() + body.size() != length) ++length;
      text += std::to_string(length) + body;
    }
    return add("PaxHeaders/x", text, 'x');
  }
  Bytes finish() const {
    Bytes out = bytes;
    out.resize(out.size() + 1024);  // two zero blocks: the end of the archive
    return out;
  }

  Bytes bytes;
  std::vector<int64_t> header_offsets;
};

}  // namespace mmt::testutil
