#include "checksum.h"

#include <cinttypes>
#include <cstdio>

#include <openssl/evp.h>

#include <memory>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace mmt::detail {

uint64_t checksum64(const void* data, size_t nbytes, uint64_t seed) {
  return XXH3_64bits_withSeed(data, nbytes, seed);
}

std::string hex64(uint64_t value) {
  char hex[19];
  std::snprintf(hex, sizeof hex, "0x%016" PRIx64, value);
  return hex;
}

namespace {

template <typename Bytes>
std::string hex_of(const Bytes& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (const unsigned char byte : bytes) {
    hex += kDigits[byte >> 4];
    hex += kDigits[byte & 15];
  }
  return hex;
}

// hashlib's names and OpenSSL's for the same digests; hashlib.blake2b() and blake2s() give
// their longest digests (64 and 32 bytes), as these do.
const char* openssl_name_of(std::string_view algorithm) {
  static constexpr std::pair<std::string_view, const char*> kNames[] = {
      {"md5", "MD5"},           {"sha1", "SHA1"},         {"sha224", "SHA224"},
      {"sha256", "SHA256"},     {"sha384", "SHA384"},     {"sha512", "SHA512"},
      {"sha3_224", "SHA3-224"}, {"sha3_256", "SHA3-256"}, {"sha3_384", "SHA3-384"},
      {"sha3_512", "SHA3-512"}, {"blake2b", "BLAKE2B-512"}, {"blake2s", "BLAKE2S-256"}};
  for (const auto& [hashlib_name, openssl_name] : kNames)
    if (hashlib_name == algorithm) return openssl_name;
  return nullptr;
}

std::optional<std::string> openssl_hexdigest(const char* name, const void* data, size_t nbytes) {
  // A digest the library does not offer (one a FIPS provider withholds, say) is one this
  // engine cannot check, as for an unknown name; the caller decides what that means.
  const std::unique_ptr<EVP_MD, decltype(&EVP_MD_free)> md(EVP_MD_fetch(nullptr, name, nullptr), &EVP_MD_free);
  if (!md) return std::nullopt;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(data, nbytes, digest, &length, md.get(), nullptr) != 1) return std::nullopt;
  return hex_of(std::string_view(reinterpret_cast<const char*>(digest), length));
}

std::optional<std::string> xxhash_hexdigest(std::string_view algorithm, const void* data, size_t nbytes) {
  if (algorithm == "xxh32") {
    XXH32_canonical_t canonical;
    XXH32_canonicalFromHash(&canonical, XXH32(data, nbytes, 0));
    return hex_of(canonical.digest);
  }
  if (algorithm == "xxh64" || algorithm == "xxh3_64") {
    XXH64_canonical_t canonical;
    XXH64_canonicalFromHash(&canonical, algorithm == "xxh64" ? XXH64(data, nbytes, 0) : XXH3_64bits(data, nbytes));
    return hex_of(canonical.digest);
  }
  if (algorithm == "xxh128" || algorithm == "xxh3_128") {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits(data, nbytes));
    return hex_of(canonical.digest);
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> hexdigest(std::string_view algorithm, const void* data, size_t nbytes) {
  if (const char* openssl_name = openssl_name_of(algorithm)) return openssl_hexdigest(openssl_name, data, nbytes);
  return xxhash_hexdigest(algorithm, data, nbytes);
}

}  // namespace mmt::detail
