#include <charconv>
#include <limits>
#include <string>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "checksum.h"
#include "mmtensor/error.h"
#include "mmtensor/loader.h"
#include "utf8.h"

namespace mmt {

namespace {

using detail::hex64;

// A value as a message quotes it: its JSON, cut to a line. A state is one flat object, so a
// value worth quoting is short; a hostile one (a megabyte string) must not fill the message.
std::string excerpt(const nlohmann::json& value) {
  return detail::cut_for_message(value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), 120);
}

// The value at `it` (the entry `key`): "0x" and 16 hex digits, as hex64() writes it (upper
// case digits are read too).
uint64_t parse_hex64(const nlohmann::json::const_iterator& it, const char* key) {
  const std::string hex = it->is_string() ? it->get<std::string>() : std::string();
  uint64_t value = 0;
  bool well_formed = hex.size() == 18 && hex.starts_with("0x");
  if (well_formed) {
    const auto [end, error] = std::from_chars(hex.data() + 2, hex.data() + hex.size(), value, 16);
    well_formed = error == std::errc() && end == hex.data() + hex.size();
  }
  MMT_CHECK(well_formed, ValueError, "LoaderState: entry '", key, "' must be a string of 0x and 16 hex digits, got ",
            excerpt(*it));
  return value;
}

// The entry `key` written by hex64(), or 0 when the state has none ("not recorded").
uint64_t optional_hex64(const nlohmann::json& json, const char* key) {
  const auto it = json.find(key);
  return it == json.end() ? 0 : parse_hex64(it, key);
}

}  // namespace

std::string LoaderState::to_string() const {
  nlohmann::json json = {
      {"version", shuffles_five_to_eight ? 5 : mixture_hash != 0 ? 4 : subset_hash != 0 ? 3 : 2},
      {"sampler", std::string(mmt::to_string(sampler))},
      {"seed", hex64(seed)},
      {"window_chunks", window_chunks},
      {"records", records},
      {"epoch", epoch},
      {"consumed", consumed},
  };
  if (chunk_layout != 0) json["chunk_layout"] = hex64(chunk_layout);
  if (dataset_fingerprint != 0) json["dataset_fingerprint"] = hex64(dataset_fingerprint);
  if (subset_hash != 0) {
    json["subset_hash"] = hex64(subset_hash);
    json["subset_size"] = subset_size;
  }
  if (mixture_hash != 0) {
    json["mixture_hash"] = hex64(mixture_hash);
    json["mixture_size"] = mixture_size;
  }
  return json.dump();
}

namespace {

template <typename T>
T required(const nlohmann::json& json, const char* key) {
  const auto it = json.find(key);
  MMT_CHECK(it != json.end(), ValueError, "LoaderState: missing entry '", key, "'");
  if constexpr (std::is_integral_v<T>) {
    MMT_CHECK(it->is_number_integer(), ValueError, "LoaderState: entry '", key,
              "' must be an integer, got ", excerpt(*it));
    // get<T>() would wrap a value out of T's range (2^64-1 read as -1, 2^32+1 as 1).
    const bool fits = it->is_number_unsigned()
                          ? it->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                          : it->get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                                it->get<int64_t>() <= static_cast<int64_t>(std::numeric_limits<T>::max());
    MMT_CHECK(fits, ValueError, "LoaderState: entry '", key, "' is out of range: ", excerpt(*it));
  }
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw ValueError(detail::str("LoaderState: entry '", key, "' has the wrong type: ", excerpt(*it)));
  }
}

// What an epoch selects, a subset or a mixture (`name`): entries NAME_hash and NAME_size,
// which came with version `since`. A state holds both or neither, and no list or mixture
// hashes to 0. Whether the state holds them.
bool read_selection(const nlohmann::json& json, const std::string& name, int version, int since, uint64_t& hash,
                    int64_t& size) {
  const std::string hash_key = name + "_hash", size_key = name + "_size";
  const bool present = json.contains(hash_key) || json.contains(size_key);
  MMT_CHECK(!present || version >= since, ValueError, "LoaderState: a version-", version, " state cannot name a ", name,
            " (", name, "s came with version ", since, ")");
  if (!present) return false;
  hash = optional_hex64(json, hash_key.c_str());
  MMT_CHECK(hash != 0, ValueError, "LoaderState: entry '", hash_key, "' is ",
            json.contains(hash_key) ? detail::str("0, which no ", name, " hashes to")
                                      : detail::str("missing, yet '", size_key, "' is there"));
  size = required<int64_t>(json, size_key.c_str());
  MMT_CHECK(size >= 0, ValueError, "LoaderState: negative ", size_key, " ", size);
  return true;
}

}  // namespace

LoaderState LoaderState::parse(std::string_view text) {
  nlohmann::json json;
  try {
    // A state is one object of numbers and strings. Anything nested is refused as it is met:
    // quoting (dumping) a value nested a hundred thousand deep would recurse past the stack.
    json = nlohmann::json::parse(text, [](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
      const bool opens = event == nlohmann::json::parse_event_t::object_start ||
                         event == nlohmann::json::parse_event_t::array_start;
      MMT_CHECK(!opens || depth == 0, ValueError,
                "LoaderState: expected one JSON object of numbers and strings, found a nested ",
                event == nlohmann::json::parse_event_t::object_start ? "object" : "array");
      return true;
    });
  } catch (const nlohmann::json::exception& e) {
    // nlohmann quotes the token it stopped at, which may be the whole (huge) input.
    throw ValueError(detail::str("LoaderState: not valid JSON: ", detail::cut_for_message(e.what(), 300)));
  }
  MMT_CHECK(json.is_object(), ValueError, "LoaderState: expected a JSON object, got ", excerpt(json));
  const int version = required<int>(json, "version");
  MMT_CHECK(version >= 1 && version <= kVersion, ValueError, "LoaderState: version ", version,
            " is not supported (this build reads versions 1 to ", kVersion, ")");
  LoaderState state;
  const std::string kind = required<std::string>(json, "sampler");
  const auto parsed_kind = sampler_kind_from_string(kind);
  MMT_CHECK(parsed_kind.has_value(), ValueError, "LoaderState: unknown sampler '", kind, "'");
  state.sampler = *parsed_kind;
  const auto seed = json.find("seed");
  MMT_CHECK(seed != json.end(), ValueError, "LoaderState: missing entry 'seed'");
  if (version >= 2) {
    // A hex string, as chunk_layout: readers that hold JSON numbers as doubles keep it exact.
    state.seed = parse_hex64(seed, "seed");
  } else {
    // Version 1 wrote a JSON number; readers in other languages may have stored it signed
    // (2^64 - 1 as -1), and version-1 builds read it back that way, so this one does too.
    MMT_CHECK(seed->is_number_integer(), ValueError, "LoaderState: entry 'seed' must be an integer, got ",
              excerpt(*seed));
    state.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : static_cast<uint64_t>(seed->get<int64_t>());
  }
  // Absent in states written before it existed, and for orders that do not depend on the
  // chunks: read as 0, "not recorded".
  state.chunk_layout = optional_hex64(json, "chunk_layout");
  MMT_CHECK(state.chunk_layout == 0 || state.sampler == SamplerKind::QuasiRandom, ValueError, "LoaderState: a ", kind,
            " order does not depend on the chunk layout, yet the state names one (", hex64(state.chunk_layout), ")");
  state.dataset_fingerprint = optional_hex64(json, "dataset_fingerprint");
  // A subset came with version 3, a mixture with version 4: an older state has neither, and
  // no state both.
  const bool has_subset = read_selection(json, "subset", version, 3, state.subset_hash, state.subset_size);
  const bool has_mixture = read_selection(json, "mixture", version, 4, state.mixture_hash, state.mixture_size);
  MMT_CHECK(!has_mixture || !has_subset, ValueError, "LoaderState: a state names a subset or a mixture, not both");
  state.window_chunks = required<int64_t>(json, "window_chunks");
  state.records = required<int64_t>(json, "records");
  state.epoch = required<int64_t>(json, "epoch");
  state.consumed = required<int64_t>(json, "consumed");
  state.shuffles_five_to_eight = version >= 5;  // only written so
  MMT_CHECK(state.records >= 0 && state.window_chunks >= 0, ValueError,
            "LoaderState: negative records (", state.records, ") or window_chunks (", state.window_chunks, ")");
  // A Loader writes the window its order was made with, never 0 (which in SamplerOptions
  // means "the default"): resuming by a 0 here could only fail later, naming a mismatch.
  MMT_CHECK(state.sampler != SamplerKind::QuasiRandom || state.window_chunks > 0, ValueError,
            "LoaderState: a quasi-random state needs the window its order was made with "
            "(window_chunks >= 1), got 0");
  MMT_CHECK(state.epoch >= 0 && state.epoch < kMaxEpoch, ValueError, "LoaderState: epoch ", state.epoch,
            " is outside [0, ", kMaxEpoch, ")");
  if (has_subset)
    MMT_CHECK(state.consumed >= 0 && state.consumed <= state.subset_size, ValueError, "LoaderState: consumed=",
              state.consumed, " is outside [0, subset_size=", state.subset_size, "]");
  else if (has_mixture)
    MMT_CHECK(state.consumed >= 0 && state.consumed <= state.mixture_size, ValueError, "LoaderState: consumed=",
              state.consumed, " is outside [0, mixture_size=", state.mixture_size, "]");
  else
    MMT_CHECK(state.consumed >= 0 && state.consumed <= state.records, ValueError,
              "LoaderState: consumed=", state.consumed, " is outside [0, records=", state.records, "]");
  // Version 2 changed the random and quasi-random orders (uniform shuffles, sampler.h). A
  // version-1 state in the middle of such an epoch counts positions of an order this build
  // no longer makes: resuming by it would repeat some records and skip others. At an epoch's
  // start it counts none, and resumes as well as ever. (A Loader writes an epoch's end as the
  // next epoch's start; consumed == records comes from hand-made states, and is as safe.)
  const bool mid_epoch = state.consumed > 0 && state.consumed < state.records;
  MMT_CHECK(version >= 2 || state.sampler == SamplerKind::Sequential || !mid_epoch, ValueError,
            "LoaderState: this version-1 state stands in the middle of a ", kind, " epoch (consumed=",
            state.consumed, " of ", state.records, "), whose order mmtensor no longer makes (its "
            "shuffles changed in version 2): resuming would repeat some records and skip others. "
            "Start the epoch over (consumed = 0) or go on with the next one");
  return state;
}

}  // namespace mmt
