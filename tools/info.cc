// mmt info FILE... [--json]: what a dataset holds and how it is stored; for several files
// (shards read as one dataset), the whole and each part.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "checksum.h"
#include "mmt_commands.h"
#include "mmtensor/dataset.h"

namespace mmt::tool {
namespace {

std::string shape_text(const Field& f) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < f.shape.size(); ++i) {
    out << (i ? ", " : "");
    if (f.shape[i] == kVariableDim) out << "*";
    else out << f.shape[i];
  }
  out << "]";
  return out.str();
}

// "row-major", "channels-last" or the explicit physical order of the logical dimensions.
std::string layout_text(const Field& f) {
  std::string kind = f.is_fixed() ? "fixed" : "variable";
  if (f.storage_order.empty()) return kind + ", row-major";
  std::vector<int64_t> order(f.storage_order.begin(), f.storage_order.end());
  if (order == std::vector<int64_t>{0, 2, 3, 1} || order == std::vector<int64_t>{0, 2, 3, 4, 1} ||
      order == std::vector<int64_t>{1, 2, 0} || order == std::vector<int64_t>{1, 2, 3, 0})
    return kind + ", channels-last";
  std::ostringstream out;
  out << kind << ", storage order " << IntArrayRef(order);
  return out.str();
}

double ratio(const DatasetInfo& info) {
  return info.stored_bytes > 0 ? static_cast<double>(info.decoded_bytes) / info.stored_bytes : 0.0;
}

// One file of a concatenation, as info lists it.
struct PartSummary {
  std::string path;
  int64_t first_record = 0;  // its record 0's index in the concatenation
  DatasetInfo info;
};

std::vector<PartSummary> summarize_parts(const Dataset& ds) {
  std::vector<PartSummary> parts;
  int64_t first_record = 0;
  for (const Dataset& part : ds.parts()) {
    parts.push_back({part.path(), first_record, part.info()});
    first_record += parts.back().info.records;
  }
  return parts;
}

nlohmann::json info_json(const Dataset& ds) {
  DatasetInfo info = ds.info();
  const std::vector<PartSummary> parts = summarize_parts(ds);
  nlohmann::json fields = nlohmann::json::array();
  for (const Field& f : ds.schema()) {
    nlohmann::json field = {{"name", f.name},
                            {"dtype", std::string(to_string(f.dtype))},
                            {"shape", f.shape.vec()},
                            {"fixed", f.is_fixed()},
                            {"storage_order", f.storage_order.vec()}};
    if (f.is_fixed()) field["record_bytes"] = f.fixed_nbytes();
    fields.push_back(std::move(field));
  }
  nlohmann::json metadata = nlohmann::json::object();
  for (const auto& [key, value] : ds.metadata()) metadata[key] = value;
  // "paths": the files one by one ("path" joins several with ", ", for display only).
  nlohmann::json paths = nlohmann::json::array();
  for (const PartSummary& part : parts) paths.push_back(part.path);
  nlohmann::json out = {{"path", ds.path()},
                        {"paths", paths},
                        {"format_version", info.format_version},
                        {"fingerprint", detail::hex64(ds.fingerprint())},
                        {"file_bytes", info.file_bytes},
                        {"records", info.records},
                        {"chunks", info.chunks},
                        {"alignment", info.alignment},
                        {"codec", codec_text(info)},
                        {"stored_bytes", info.stored_bytes},
                        {"decoded_bytes", info.decoded_bytes},
                        {"ratio", ratio(info)},
                        {"fields", fields},
                        {"metadata", metadata}};
  // Only for several files: a single file's object stays as it always was.
  if (parts.size() > 1) {
    nlohmann::json listed = nlohmann::json::array();
    for (const PartSummary& part : parts)
      listed.push_back({{"path", part.path},
                        {"first_record", part.first_record},
                        {"records", part.info.records},
                        {"chunks", part.info.chunks},
                        {"file_bytes", part.info.file_bytes},
                        {"codec", part.info.codec.str()}});
    out["parts"] = std::move(listed);
  }
  return out;
}

// "files      2, read as one dataset in this order (...)" and a line for each file.
void print_parts(const DatasetInfo& info, const std::vector<PartSummary>& parts) {
  std::cout << "files      " << parts.size() << ", read as one dataset in this order ("
            << human_bytes(info.file_bytes) << ", " << info.file_bytes << " bytes in all)\n";
  std::vector<std::string> paths;
  size_t path_width = 0;
  for (const PartSummary& part : parts) {
    paths.push_back(printable(part.path));
    path_width = std::max(path_width, display_width(paths.back()));
  }
  std::fflush(stdout);  // printf and cout share stdout
  for (size_t p = 0; p < parts.size(); ++p) {
    const DatasetInfo& part = parts[p].info;
    // Where the part's records are in the concatenation's numbering (what get takes).
    const std::string range = part.records == 0 ? std::string()
                                                : detail::str(" (", parts[p].first_record, "..",
                                                              parts[p].first_record + part.records - 1, ")");
    std::printf("  %s  %lld records%s, %lld chunks, %s (%lld bytes), %s\n",
                pad_to_width(paths[p], path_width).c_str(), static_cast<long long>(part.records), range.c_str(),
                static_cast<long long>(part.chunks), human_bytes(part.file_bytes).c_str(),
                static_cast<long long>(part.file_bytes), part.codec.str().c_str());
  }
  std::fflush(stdout);
}

void print_text(const Dataset& ds) {
  DatasetInfo info = ds.info();
  const std::vector<PartSummary> parts = summarize_parts(ds);
  char ratio_text[32];
  std::snprintf(ratio_text, sizeof ratio_text, "%.2fx", ratio(info));
  if (parts.size() > 1)
    print_parts(info, parts);
  else
    std::cout << "file       " << printable(ds.path()) << " (" << human_bytes(info.file_bytes) << ", "
              << info.file_bytes << " bytes)\n";
  std::cout << "format     version " << info.format_version << "\n"
            << "records    " << info.records << "\n"
            << "chunks     " << info.chunks << " (aligned to " << info.alignment << " bytes)\n"
            << "codec      " << codec_text(info) << ": " << human_bytes(info.decoded_bytes)
            << " of chunks decoded, " << human_bytes(info.stored_bytes) << " stored, ratio "
            << ratio_text << " (the codec's: headers and alignment aside)\n"
            << "fingerprint " << detail::hex64(ds.fingerprint()) << " (what a loader's saved state names)\n"
            << "fields     " << ds.schema().size() << "\n";
  // Names and metadata come from the file: escaped, so a crafted one cannot drive the terminal.
  std::vector<std::string> names;
  for (const Field& f : ds.schema()) names.push_back(printable(f.name));
  size_t name_width = 4, dtype_width = 8;  // 8: "bfloat16"; complex128 widens the column
  for (const std::string& name : names) name_width = std::max(name_width, display_width(name));
  for (const Field& f : ds.schema()) dtype_width = std::max(dtype_width, to_string(f.dtype).size());
  for (size_t i = 0; i < names.size(); ++i) {
    const Field& f = ds.schema()[i];
    std::printf("  %s  %-*s  %-16s  %s\n", pad_to_width(names[i], name_width).c_str(),
                static_cast<int>(dtype_width), std::string(to_string(f.dtype)).c_str(), shape_text(f).c_str(),
                layout_text(f).c_str());
  }
  std::fflush(stdout);
  const size_t keys = ds.metadata().size();
  std::cout << "metadata   " << keys << (keys == 0 ? "\n" : keys == 1 ? " key\n" : " keys\n");
  // A value longer than a line or two (a thousand class names, Hugging Face's features) is
  // cut, its size said; --json gives every byte.
  constexpr size_t kShownValueBytes = 240;
  for (const auto& [key, value] : ds.metadata()) {
    std::cout << "  " << printable(key) << " = ";
    if (value.size() <= kShownValueBytes) {
      std::cout << printable(value) << "\n";
      continue;
    }
    size_t cut = kShownValueBytes;
    while (cut > 0 && (static_cast<unsigned char>(value[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
    std::cout << printable(std::string_view(value).substr(0, cut)) << " ... (" << value.size()
              << " bytes; --json gives them all)\n";
  }
}

}  // namespace

void add_info_command(CLI::App& app) {
  struct Args {
    std::vector<std::string> files;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("info", "Show a dataset's records, fields, chunks, codec and metadata");
  cmd->add_option("FILE", args->files, kFilesHelp)->required();
  cmd->add_flag("--json", args->json,
                "Print one JSON object (stable keys, for scripts; for several files, a \"parts\" array too)");
  cmd->callback([args] {
    Dataset ds = Dataset::open_concat(args->files);
    // JSON escapes control characters itself; bytes that are not UTF-8 (which it cannot
    // hold) become U+FFFD instead of failing the command.
    if (args->json) std::cout << info_json(ds).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    else print_text(ds);
  });
}

}  // namespace mmt::tool
