#include "checksum.h"

#include <cinttypes>
#include <cstdio>

#include <openssl/evp.h>

#include <memory>
#include <new>
#include <utility>

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

}  // namespace

std::optional<HexDigest> HexDigest::make(std::string_view algorithm) {
  if (const char* openssl_name = openssl_name_of(algorithm)) {
    // A digest the library does not offer (one a FIPS provider withholds, say) is one this
    // engine cannot check, as for an unknown name; the caller decides what that means.
    const std::unique_ptr<EVP_MD, decltype(&EVP_MD_free)> md(EVP_MD_fetch(nullptr, openssl_name, nullptr),
                                                             &EVP_MD_free);
    if (!md) return std::nullopt;
    EVP_MD_CTX* context = EVP_MD_CTX_new();
    if (context == nullptr) throw std::bad_alloc();
    if (EVP_DigestInit_ex(context, md.get(), nullptr) != 1) {  // the context keeps its own reference
      EVP_MD_CTX_free(context);
      return std::nullopt;
    }
    return HexDigest(Kind::OpenSsl, context);
  }
  const auto created = [](void* state) {
    if (state == nullptr) throw std::bad_alloc();
    return state;
  };
  if (algorithm == "xxh32") {
    auto* state = static_cast<XXH32_state_t*>(created(XXH32_createState()));
    XXH32_reset(state, 0);
    return HexDigest(Kind::Xxh32, state);
  }
  if (algorithm == "xxh64") {
    auto* state = static_cast<XXH64_state_t*>(created(XXH64_createState()));
    XXH64_reset(state, 0);
    return HexDigest(Kind::Xxh64, state);
  }
  if (algorithm == "xxh3_64" || algorithm == "xxh128" || algorithm == "xxh3_128") {
    auto* state = static_cast<XXH3_state_t*>(created(XXH3_createState()));
    if (algorithm == "xxh3_64") XXH3_64bits_reset(state);
    else XXH3_128bits_reset(state);
    return HexDigest(algorithm == "xxh3_64" ? Kind::Xxh3_64 : Kind::Xxh3_128, state);
  }
  return std::nullopt;
}

HexDigest::HexDigest(HexDigest&& other) noexcept : kind_(other.kind_), state_(std::exchange(other.state_, nullptr)) {}

HexDigest::~HexDigest() {
  if (state_ == nullptr) return;
  switch (kind_) {
    case Kind::Xxh32: XXH32_freeState(static_cast<XXH32_state_t*>(state_)); break;
    case Kind::Xxh64: XXH64_freeState(static_cast<XXH64_state_t*>(state_)); break;
    case Kind::Xxh3_64:
    case Kind::Xxh3_128: XXH3_freeState(static_cast<XXH3_state_t*>(state_)); break;
    case Kind::OpenSsl: EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(state_)); break;
  }
}

void HexDigest::update(const void* data, size_t nbytes) {
  switch (kind_) {
    case Kind::Xxh32: XXH32_update(static_cast<XXH32_state_t*>(state_), data, nbytes); break;
    case Kind::Xxh64: XXH64_update(static_cast<XXH64_state_t*>(state_), data, nbytes); break;
    case Kind::Xxh3_64: XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, nbytes); break;
    case Kind::Xxh3_128: XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, nbytes); break;
    case Kind::OpenSsl: EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(state_), data, nbytes); break;
  }
}

std::string HexDigest::hex() {
  switch (kind_) {
    case Kind::Xxh32: {
      XXH32_canonical_t canonical;
      XXH32_canonicalFromHash(&canonical, XXH32_digest(static_cast<XXH32_state_t*>(state_)));
      return hex_of(canonical.digest);
    }
    case Kind::Xxh64:
    case Kind::Xxh3_64: {
      XXH64_canonical_t canonical;
      XXH64_canonicalFromHash(&canonical, kind_ == Kind::Xxh64 ? XXH64_digest(static_cast<XXH64_state_t*>(state_))
                                                               : XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_)));
      return hex_of(canonical.digest);
    }
    case Kind::Xxh3_128: {
      XXH128_canonical_t canonical;
      XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_)));
      return hex_of(canonical.digest);
    }
    case Kind::OpenSsl: {
      unsigned char digest[EVP_MAX_MD_SIZE];
      unsigned int length = 0;
      EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(state_), digest, &length);
      return hex_of(std::string_view(reinterpret_cast<const char*>(digest), length));
    }
  }
  return {};
}

std::optional<std::string> hexdigest(std::string_view algorithm, const void* data, size_t nbytes) {
  std::optional<HexDigest> digest = HexDigest::make(algorithm);
  if (!digest) return std::nullopt;
  digest->update(data, nbytes);
  return digest->hex();
}

}  // namespace mmt::detail
