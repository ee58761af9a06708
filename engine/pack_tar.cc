// PackSources::from_tars: WebDataset shards as pack sources. Samples are runs of members
// with one key (packer.h); values view the mapped archives.

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "import_util.h"
#include "mapping_guard.h"
#include "mmtensor/error.h"
#include "mmtensor/packer.h"
#include "decompressed_file.h"
#include "tar_reader.h"
#include "utf8.h"

namespace mmt {

namespace detail {

struct TarSamples {
  struct Value {
    int64_t offset = 0;  // in its archive
    int64_t size = 0;
  };
  // Each archive mapped whole (empty for an empty file, or a compressed one), or, compressed,
  // its decompression in `decompressed` (decompressed_index >= 0).
  std::vector<UntypedStorage> mapped;
  std::vector<int64_t> decompressed_index;
  DecompressedFiles decompressed;
  std::vector<std::string> extensions;     // one per member field, in schema order
  std::vector<std::string> alternatives;   // per field: "jpg;png" when it has several (TarOptions), else ""
  size_t class_field = SIZE_MAX;           // the "cls" field, stored as int64
  bool keys = false;                       // field "__key__" last
  // Per record: its archive, its values (one per extension, record-major), its class
  // number, and its key (keys_text[key_end[r - 1], key_end[r])).
  std::vector<uint32_t> archive_of;
  std::vector<Value> values;
  std::vector<int64_t> classes;
  std::string keys_text;
  std::vector<int64_t> key_end;

  UntypedStorage archive(uint32_t a) const {
    return decompressed_index[a] < 0 ? mapped[a] : decompressed.get(static_cast<size_t>(decompressed_index[a]));
  }

  std::string_view key(int64_t record) const {
    const int64_t begin = record == 0 ? 0 : key_end[static_cast<size_t>(record) - 1];
    return std::string_view(keys_text).substr(static_cast<size_t>(begin),
                                              static_cast<size_t>(key_end[static_cast<size_t>(record)] - begin));
  }
};

}  // namespace detail

namespace {

using detail::str;
using detail::TarSamples;

// WebDataset's split of a member's path: the key is everything up to the first '.' of the
// file name, the extension (lower-cased) the rest. nullopt for a name with no '.' or a leading
// one ("README", ".DS_Store", "._x.jpg"): not part of any sample.
std::optional<std::pair<std::string_view, std::string>> key_and_extension(std::string_view path) {
  const size_t slash = path.rfind('/');
  const size_t file_start = slash == std::string_view::npos ? 0 : slash + 1;
  const size_t dot = path.find('.', file_start);
  if (dot == std::string_view::npos || dot == file_start || dot + 1 == path.size()) return std::nullopt;
  std::string extension(path.substr(dot + 1));
  for (char& c : extension)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return std::pair{path.substr(0, dot), std::move(extension)};
}

// WebDataset reads a .cls member as int(text): optional blanks around an optional sign and digits.
std::optional<int64_t> class_number(std::string_view text) {
  const auto blank = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  while (!text.empty() && blank(text.front())) text.remove_prefix(1);
  while (!text.empty() && blank(text.back())) text.remove_suffix(1);
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// The decompressed bytes of a gzip- or zstd-compressed archive, its first block checked as
// soon as it is out, so that a large compressed file of something else is refused before it
// fills the temporary folder.
UntypedStorage decompressed_archive(const std::string& path, bool gzip) {
  UntypedStorage archive = detail::decompressed_file(
      path, gzip ? detail::FileCompression::Gzip : detail::FileCompression::Zstd, 512,
      [&](const std::byte* head, int64_t n) {
        MMT_CHECK(n == 512, FormatError, path, ": decompresses to ", n, " bytes, less than a tar header (an empty "
                  "or truncated archive)");
        MMT_CHECK(detail::is_tar_start(head, n), ValueError, path,
                  ": decompresses to something that is not a tar archive (no ustar header at its start)");
      });
  return archive;
}

// The archive at `path` mapped, or decompressed first (gzip, zstd: `compression` says which);
// empty for an empty file.
UntypedStorage archive_bytes(const std::string& path, std::optional<detail::FileCompression>& compression) {
  compression.reset();
  detail::InputFile file = detail::map_input_file(path);  // IoError naming a missing file or a folder
  if (file.bytes.empty()) return UntypedStorage();
  const char* compressor = detail::guard_storage_reads(
      file.mapping, [&] { return detail::compressor_of(file.bytes.data(), std::min<size_t>(file.bytes.size(), 6)); });
  if (compressor != nullptr && std::strcmp(compressor, "gzip") == 0) {
    compression = detail::FileCompression::Gzip;
    return decompressed_archive(path, /*gzip=*/true);
  }
  if (compressor != nullptr && std::strcmp(compressor, "zstd") == 0) {
    compression = detail::FileCompression::Zstd;
    return decompressed_archive(path, /*gzip=*/false);
  }
  MMT_CHECK(compressor == nullptr, ValueError, path, ": a ", compressor, "-compressed tar archive; tar archives are ",
            "read uncompressed or compressed with gzip or zstd: decompress it first");
  const auto [tar_start, ustar_magic] = detail::guard_storage_reads(file.mapping, [&] {
    const int64_t n = static_cast<int64_t>(file.bytes.size());
    return std::pair(detail::is_tar_start(file.bytes.data(), n),
                     n >= 262 && std::memcmp(file.bytes.data() + 257, "ustar", 5) == 0);
  });
  if (tar_start) return std::move(file.mapping);
  // A first header whose magic is there is a tar archive damaged or cut short, not a file of
  // another kind.
  MMT_CHECK(!ustar_magic, FormatError, path, ": byte 0: ", file.bytes.size() < 512
                                                               ? "the archive ends inside its first header (it is truncated)"
                                                               : "the first header's checksum does not hold (damaged)");
  throw ValueError(detail::str(path, ": not a tar archive (no ustar header at its start, nor gzip or zstd ",
                               "compression): a file of another kind, or an archive damaged at its start"));
}

// One sample as its members come: extension -> member.
struct PendingSample {
  std::string key;
  uint32_t archive = 0;
  int64_t first_header = 0;
  std::vector<std::pair<std::string, detail::TarMember>> members;
};

}  // namespace

PackSources PackSources::from_tars(const std::vector<std::string>& paths, TarOptions options) {
  MMT_CHECK(!paths.empty(), ValueError, "no tar archives to pack");
  // Every input checked before the first archive is read (which may take long).
  detail::DistinctInputs distinct("tar archive");
  for (const std::string& path : paths) {
    detail::refuse_input_of_another_kind(path, "tar archives");
    distinct.add(path);
  }
  auto samples = std::make_shared<TarSamples>();
  samples->keys = options.keys;
  PackSources out;
  // extension -> (field, rank among the field's alternatives: the lowest present wins)
  std::map<std::string, std::pair<size_t, size_t>, std::less<>> field_of_extension;
  const bool chosen = !options.extensions.empty();
  for (const std::string& spec : options.extensions) {
    const size_t field = samples->extensions.size();
    size_t rank = 0;
    for (size_t begin = 0; begin <= spec.size();) {
      const size_t end = std::min(spec.find(';', begin), spec.size());
      std::string extension = spec.substr(begin, end - begin);
      for (char& c : extension)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      while (!extension.empty() && (extension.front() == ' ' || extension.front() == '.')) extension.erase(0, 1);
      while (!extension.empty() && extension.back() == ' ') extension.pop_back();  // "jpg; png"
      MMT_CHECK(!extension.empty(), ValueError, "tar extensions: '", spec, "' has an empty extension");
      MMT_CHECK(!field_of_extension.contains(extension), ValueError, "tar extensions: '", extension, "' is given twice");
      MMT_CHECK(extension != "__key__", ValueError, "tar extensions: '__key__' names the field of each sample's key "
                "(TarOptions::keys, --keys), not a member");
      if (rank == 0) {
        // A class number is parsed from the member's text: it comes from a .cls member only.
        MMT_CHECK(extension != "cls" || spec.find(';') == std::string::npos, ValueError, "tar extensions: '", spec,
                  "': field 'cls' holds class numbers, which come from .cls members only; it cannot have alternatives");
        try {
          (void)Field::bytes(extension);  // a name a field may have: checked before any archive is read
        } catch (const ValueError& e) {
          throw ValueError(str("tar extensions: '", detail::cut_for_message(extension, 100), "' cannot name a field: ",
                               e.what()));
        }
        samples->extensions.push_back(extension);
        samples->alternatives.push_back(spec.find(';') == std::string::npos ? std::string() : spec);
      }
      field_of_extension[extension] = {field, rank++};
      begin = end + 1;
    }
  }
  std::string first_sample;  // "KEY in ARCHIVE", for messages
  PendingSample pending;
  const auto where = [&](const PendingSample& sample) {
    return str(paths[sample.archive], ": sample '", detail::cut_for_message(sample.key, 200), "' (header at byte ",
               sample.first_header, ")");
  };
  const std::string fix = "; choose the fields (TarOptions::extensions, mmt pack --ext) and what a sample lacking one "
                          "gives (--missing skip|empty)";
  std::vector<size_t> rank_taken;  // per field of the sample being flushed
  const UntypedStorage* scanned = nullptr;  // the archive being read
  const auto flush = [&] {
    if (pending.members.empty()) return;
    if (samples->extensions.empty()) {  // the first sample sets the fields
      for (const auto& [extension, member] : pending.members) {
        MMT_CHECK(extension != "__key__", ValueError, where(pending), " has a '.__key__' member; '__key__' names the "
                  "field of each sample's key (--keys): choose the other fields (--ext)");
        samples->extensions.push_back(extension);
      }
      std::sort(samples->extensions.begin(), samples->extensions.end());
      samples->alternatives.assign(samples->extensions.size(), std::string());
      for (size_t f = 0; f < samples->extensions.size(); ++f) field_of_extension[samples->extensions[f]] = {f, 0};
      first_sample = str("'", detail::cut_for_message(pending.key, 200), "' of ", paths[pending.archive]);
    }
    const size_t fields = samples->extensions.size();
    const size_t first_value = samples->values.size();
    samples->values.resize(first_value + fields, {-1, -1});
    rank_taken.assign(fields, SIZE_MAX);
    for (const auto& [extension, member] : pending.members) {
      const auto it = field_of_extension.find(extension);
      if (it == field_of_extension.end()) {
        MMT_CHECK(chosen, ValueError, where(pending), " has a '.", extension, "' member, which the first sample (",
                  first_sample, ") has not; every sample must have the same extensions (", detail::joined(samples->extensions),
                  ")", fix);
        continue;  // not among the fields chosen
      }
      const auto [field, rank] = it->second;
      if (rank < rank_taken[field]) {
        rank_taken[field] = rank;
        samples->values[first_value + field] = {member.data_offset, member.size};
      }
    }
    size_t first_missing = SIZE_MAX;
    for (size_t f = 0; f < fields; ++f)
      if (samples->values[first_value + f].offset < 0 && first_missing == SIZE_MAX) first_missing = f;
    if (first_missing != SIZE_MAX) {
      const std::string& spec = samples->alternatives[first_missing];
      MMT_CHECK(options.missing != MissingMember::Error, ValueError, where(pending),
                spec.empty() ? str(" has no '.", samples->extensions[first_missing], "' member")
                             : str(" has none of '", spec, "'"),
                chosen ? str(" (a field chosen); say what such a sample gives: --missing skip|empty "
                             "(TarOptions::missing)")
                       : str(", which the first sample (", first_sample, ") has; every sample must have the same "
                             "extensions (", detail::joined(samples->extensions), ")", fix));
      bool any_field = false;
      for (size_t f = 0; f < fields; ++f) any_field = any_field || samples->values[first_value + f].offset >= 0;
      // A sample of none of the fields (a stray member: "meta.json" beside the samples) is
      // not made a record of empty values.
      if (options.missing == MissingMember::Skip || !any_field) {
        samples->values.resize(first_value);
        ++out.samples_skipped_;
        pending.members.clear();
        return;
      }
      for (size_t f = 0; f < fields; ++f) {
        if (samples->values[first_value + f].offset >= 0) continue;
        MMT_CHECK(samples->extensions[f] != "cls", ValueError, where(pending), " has no '.cls' member, and a class "
                  "number cannot be empty: skip such samples instead (--missing skip)");
        samples->values[first_value + f] = {0, 0};  // empty
      }
    }
    // The class number, read now: a compressed archive's decompression may be gone once the
    // next one is read.
    const auto cls = std::find(samples->extensions.begin(), samples->extensions.end(), "cls");
    if (cls != samples->extensions.end()) {
      const TarSamples::Value& value = samples->values[first_value + static_cast<size_t>(cls - samples->extensions.begin())];
      std::string text(static_cast<size_t>(std::min<int64_t>(value.size, 64)), '\0');
      if (value.size <= 64 && !text.empty())
        detail::guard_storage_reads(*scanned, [&] { std::memcpy(text.data(), scanned->data() + value.offset, text.size()); });
      const std::optional<int64_t> number = value.size <= 64 ? class_number(text) : std::nullopt;
      MMT_CHECK(number.has_value(), ValueError, paths[pending.archive], ": sample '",
                detail::cut_for_message(pending.key, 200), "': its .cls member (byte ", value.offset,
                ") is not an integer in decimal text (WebDataset's class number): '",
                detail::cut_for_message(text, 40), "'");
      samples->classes.push_back(*number);
    }
    samples->archive_of.push_back(pending.archive);
    samples->keys_text += pending.key;
    samples->key_end.push_back(static_cast<int64_t>(samples->keys_text.size()));
    pending.members.clear();
  };

  for (size_t a = 0; a < paths.size(); ++a) {
    const std::string& path = paths[a];
    MMT_CHECK(a <= UINT32_MAX, ValueError, "more than 2^32 tar archives");
    std::optional<detail::FileCompression> compression;
    UntypedStorage archive = archive_bytes(path, compression);
    scanned = &archive;
    // An empty file is no archive (tar writes its end-of-archive marker even for no members):
    // a download that failed, or a shard never written.
    MMT_CHECK(archive.nbytes() > 0, FormatError, path, ": the file is empty: no tar archive, not even the ",
              "end-of-archive marker");
    {
      detail::for_each_tar_member(archive, [&](const detail::TarMember& member) {
        auto split = key_and_extension(member.name);
        if (!split) {
          ++out.hidden_skipped_;
          return;
        }
        auto& [key, extension] = *split;
        if (pending.archive != a || key != pending.key) {
          flush();
          pending.key = std::string(key);
          pending.archive = static_cast<uint32_t>(a);
          pending.first_header = member.header_offset;
        }
        for (const auto& [seen, earlier] : pending.members)
          MMT_CHECK(seen != extension, ValueError, where(pending), " has two '.", extension, "' members (headers at bytes ",
                    earlier.header_offset, " and ", member.header_offset, ")");
        pending.members.emplace_back(std::move(extension), member);
      });
    }
    flush();  // a sample ends with its archive
    scanned = nullptr;
    if (compression) {  // kept in the scratch folder while within its budget, else decompressed again when packed
      samples->decompressed_index.push_back(
          static_cast<int64_t>(samples->decompressed.add(path, *compression, std::move(archive))));
      samples->mapped.emplace_back();
    } else {
      samples->decompressed_index.push_back(-1);
      samples->mapped.push_back(std::move(archive));
    }
  }
  const auto records = static_cast<int64_t>(samples->archive_of.size());
  MMT_CHECK(records > 0, ValueError, detail::joined(paths), ": no samples (no member named KEY.EXTENSION",
            out.hidden_skipped_ > 0 ? str("; ", out.hidden_skipped_, " other members were skipped") : std::string(),
            out.samples_skipped_ > 0 ? str("; ", out.samples_skipped_, " samples lacked a member and were skipped")
                                     : std::string(),
            ")");

  // The fields, in name order; "cls" holds numbers.
  std::vector<Field> fields;
  const size_t member_fields = samples->extensions.size();
  for (size_t f = 0; f < member_fields; ++f) {
    const std::string& extension = samples->extensions[f];
    try {
      fields.push_back(extension == "cls" ? Field::fixed(extension, kInt64, {}) : Field::bytes(extension));
    } catch (const ValueError& e) {
      throw ValueError(str(first_sample, ": the extension '", detail::cut_for_message(extension, 100),
                           "' cannot name a field: ", e.what()));
    }
    if (extension == "cls") samples->class_field = f;
    out.origins_.push_back(str(extension, "=", detail::joined(paths), " (tar members)"));
  }
  if (options.keys) {
    fields.push_back(Field::bytes("__key__"));
    out.origins_.push_back(str("__key__=", detail::joined(paths), " (sample keys)"));
  }
  for (int64_t r = 0; r < records; ++r) {
    for (size_t f = 0; f < member_fields; ++f)
      out.total_bytes_ += f == samples->class_field ? 8 : samples->values[static_cast<size_t>(r) * member_fields + f].size;
  }
  if (options.keys) out.total_bytes_ += static_cast<int64_t>(samples->keys_text.size());
  out.schema_ = Schema(std::move(fields));
  out.metadata_["source"] = "webdataset";
  if (chosen || options.missing != MissingMember::Error) {
    nlohmann::json recorded = {{"extensions", options.extensions}, {"missing", std::string(to_string(options.missing))}};
    out.metadata_[std::string(kTarOptionsMetadataKey)] = recorded.dump();
  }
  out.records_ = records;
  out.input_paths_ = paths;
  out.tar_ = std::move(samples);
  return out;
}

void PackSources::tar_record(int64_t index, std::vector<Tensor>& values) const {
  const TarSamples& samples = *tar_;
  const size_t member_fields = samples.extensions.size();
  const UntypedStorage archive = samples.archive(samples.archive_of[static_cast<size_t>(index)]);
  for (size_t f = 0; f < member_fields; ++f) {
    if (f == samples.class_field) {
      values[f] = full({}, samples.classes[static_cast<size_t>(index)], kInt64);  // exact: no double between
      continue;
    }
    const TarSamples::Value& value = samples.values[static_cast<size_t>(index) * member_fields + f];
    values[f] = value.size == 0 ? empty({0}, kUInt8) : Tensor(archive, kUInt8, {value.size}, value.offset);
  }
  if (samples.keys) {
    const std::string_view key = samples.key(index);
    Tensor bytes = empty({static_cast<int64_t>(key.size())}, kUInt8);
    if (!key.empty()) std::memcpy(bytes.mutable_data_ptr(), key.data(), key.size());
    values.back() = std::move(bytes);
  }
}

std::string PackSources::tar_origin(size_t field, int64_t index) const {
  const TarSamples& samples = *tar_;
  const std::string& archive = input_paths_[samples.archive_of[static_cast<size_t>(index)]];
  const std::string key = detail::cut_for_message(std::string(samples.key(index)), 200);
  if (field >= samples.extensions.size()) return str("the key of sample '", key, "' in ", archive);
  const TarSamples::Value& value = samples.values[static_cast<size_t>(index) * samples.extensions.size() + field];
  // A member's bytes follow its header: offset 0 is no member (MissingMember::Empty).
  if (value.offset == 0) return str("sample '", key, "' of ", archive, ", which has no '.", samples.extensions[field],
                                    "' member (an empty value)");
  if (!samples.alternatives[field].empty())
    return str("the member of sample '", key, "' for field '", samples.extensions[field], "' (the first of '",
               samples.alternatives[field], "' it has) in ", archive, " (byte ", value.offset, ")");
  return str("member '", key, ".", samples.extensions[field], "' of ", archive, " (byte ", value.offset, ")");
}

std::string_view to_string(MissingMember missing) {
  switch (missing) {
    case MissingMember::Error: return "error";
    case MissingMember::Skip: return "skip";
    case MissingMember::Empty: return "empty";
  }
  return "unknown";
}

std::optional<MissingMember> missing_member_from_string(std::string_view name) {
  for (MissingMember m : {MissingMember::Error, MissingMember::Skip, MissingMember::Empty})
    if (name == to_string(m)) return m;
  return std::nullopt;
}

std::optional<TarOptions> tar_options_of(const Metadata& metadata, const std::string& where) {
  const auto it = metadata.find(std::string(kTarOptionsMetadataKey));
  if (it == metadata.end()) return std::nullopt;
  const auto malformed = [&](const std::string& why) {
    return FormatError(str(where, ": metadata key '", kTarOptionsMetadataKey, "' ", why));
  };
  const nlohmann::json entry = nlohmann::json::parse(it->second, nullptr, false);
  if (!entry.is_object()) throw malformed("is not a JSON object");
  TarOptions options;
  const auto extensions = entry.find("extensions");
  if (extensions == entry.end() || !extensions->is_array()) throw malformed("lacks a list of extensions");
  for (const nlohmann::json& extension : *extensions) {
    if (!extension.is_string()) throw malformed("has an extension that is not text");
    options.extensions.push_back(extension.get<std::string>());
  }
  const auto missing = entry.find("missing");
  const std::optional<MissingMember> parsed =
      missing != entry.end() && missing->is_string() ? missing_member_from_string(missing->get<std::string>())
                                                     : std::nullopt;
  if (!parsed) throw malformed("has no 'missing' of error, skip or empty");
  options.missing = *parsed;
  return options;
}

}  // namespace mmt
