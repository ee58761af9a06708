// The engine's one checksum: 64-bit xxHash3, used for the preamble, footer, schema block,
// chunk table entries and chunk payloads (docs/FORMAT.md, "Checksums").
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mmt::detail {

// XXH3_64bits_withSeed(data, nbytes, seed). Seed 0 equals plain XXH3_64bits.
uint64_t checksum64(const void* data, size_t nbytes, uint64_t seed = 0);

// A 64-bit hash as text: "0x" and 16 hex digits (LoaderState's JSON, `mmt info`, messages),
// so readers that hold JSON numbers as doubles keep it exact.
std::string hex64(uint64_t value);

// What MosaicML Streaming's get_hash(algorithm, data) writes into an index: the lowercase hex
// digest of python-xxhash ("xxh32", "xxh64", "xxh3_64", "xxh128" or its other name "xxh3_128";
// seed 0, the canonical big-endian bytes) or of Python's hashlib ("md5", "sha1", "sha224",
// "sha256", "sha384", "sha512", "sha3_224", "sha3_256", "sha3_384", "sha3_512", and "blake2b"
// and "blake2s" at their default, longest, digest sizes), the latter computed by OpenSSL's
// libcrypto. nullopt for other names, and for a digest the linked libcrypto does not offer.
std::optional<std::string> hexdigest(std::string_view algorithm, const void* data, size_t nbytes);

// The same digest in steps, so that only update() need run under the SIGBUS guard of a
// mapping (mapping_guard.h): it allocates nothing and owns nothing a fault could skip;
// make() allocates the state, hex() finishes, the destructor frees it.
class HexDigest {
 public:
  // nullopt for a name hexdigest() does not know, or a digest libcrypto withholds.
  static std::optional<HexDigest> make(std::string_view algorithm);
  HexDigest(HexDigest&& other) noexcept;
  HexDigest& operator=(HexDigest&&) = delete;
  ~HexDigest();
  void update(const void* data, size_t nbytes);
  std::string hex();  // once

 private:
  enum class Kind { Xxh32, Xxh64, Xxh3_64, Xxh3_128, OpenSsl };
  HexDigest(Kind kind, void* state) : kind_(kind), state_(state) {}
  Kind kind_;
  void* state_;  // XXH32_state_t, XXH64_state_t, XXH3_state_t or EVP_MD_CTX
};

}  // namespace mmt::detail
