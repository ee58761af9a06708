// mmt info FILE [--json]: what a dataset holds and how it is stored.
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

nlohmann::json info_json(const Dataset& ds) {
  DatasetInfo info = ds.info();
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
  return {{"path", ds.path()},
          {"format_version", info.format_version},
          {"fingerprint", detail::hex64(ds.fingerprint())},
          {"file_bytes", info.file_bytes},
          {"records", info.records},
          {"chunks", info.chunks},
          {"alignment", info.alignment},
          {"codec", info.codec.str()},
          {"stored_bytes", info.stored_bytes},
          {"decoded_bytes", info.decoded_bytes},
          {"ratio", ratio(info)},
          {"fields", fields},
          {"metadata", metadata}};
}

void print_text(const Dataset& ds) {
  DatasetInfo info = ds.info();
  char ratio_text[32];
  std::snprintf(ratio_text, sizeof ratio_text, "%.2fx", ratio(info));
  std::cout << "file       " << printable(ds.path()) << " (" << human_bytes(info.file_bytes) << ", "
            << info.file_bytes << " bytes)\n"
            << "format     version " << info.format_version << "\n"
            << "records    " << info.records << "\n"
            << "chunks     " << info.chunks << " (aligned to " << info.alignment << " bytes)\n"
            << "codec      " << info.codec.str() << ": " << human_bytes(info.decoded_bytes)
            << " of values stored in " << human_bytes(info.stored_bytes) << ", ratio "
            << ratio_text << "\n"
            << "fingerprint " << detail::hex64(ds.fingerprint()) << " (what a loader's saved state names)\n"
            << "fields     " << ds.schema().size() << "\n";
  // Names and metadata come from the file: escaped, so a crafted one cannot drive the terminal.
  std::vector<std::string> names;
  for (const Field& f : ds.schema()) names.push_back(printable(f.name));
  size_t name_width = 4;
  for (const std::string& name : names) name_width = std::max(name_width, name.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const Field& f = ds.schema()[i];
    std::printf("  %-*s  %-8s  %-16s  %s\n", static_cast<int>(name_width), names[i].c_str(),
                std::string(to_string(f.dtype)).c_str(), shape_text(f).c_str(),
                layout_text(f).c_str());
  }
  std::fflush(stdout);
  std::cout << "metadata   " << ds.metadata().size() << (ds.metadata().empty() ? "\n" : " keys\n");
  for (const auto& [key, value] : ds.metadata())
    std::cout << "  " << printable(key) << " = " << printable(value) << "\n";
}

}  // namespace

void add_info_command(CLI::App& app) {
  struct Args {
    std::string file;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("info", "Show a dataset's records, fields, chunks, codec and metadata");
  cmd->add_option("FILE", args->file, "The dataset file")->required();
  cmd->add_flag("--json", args->json, "Print one JSON object (stable keys, for scripts)");
  cmd->callback([args] {
    Dataset ds = Dataset::open(args->file);
    // JSON escapes control characters itself; bytes that are not UTF-8 (which it cannot
    // hold) become U+FFFD instead of failing the command.
    if (args->json) std::cout << info_json(ds).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    else print_text(ds);
  });
}

}  // namespace mmt::tool
