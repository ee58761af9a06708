// PackSources::from_megatron: Megatron-LM indexed datasets (PREFIX.bin + PREFIX.idx) as pack
// sources, one record per document; values view the mapped .bin (megatron_index.h).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "import_util.h"
#include "mapping_guard.h"
#include "megatron_index.h"
#include "mmtensor/error.h"
#include "mmtensor/packer.h"

namespace mmt {

namespace detail {

struct MegatronDocuments {
  struct Part {
    MegatronIndex index;
    UntypedStorage bin;  // mapped whole; empty for an empty file
    std::string bin_path;
  };
  std::vector<Part> parts;
  std::vector<int64_t> part_end;  // records before the end of each part
  ScalarType dtype = kUInt8;

};

}  // namespace detail

using detail::MegatronDocuments;
using detail::str;

PackSources PackSources::from_megatron(std::span<const std::string> specs) {
  MMT_CHECK(!specs.empty(), ValueError, "no Megatron indexed datasets to pack");
  auto documents = std::make_shared<MegatronDocuments>();
  PackSources out;
  std::string name;
  detail::DistinctInputs distinct("Megatron dataset");
  for (const std::string& spec : specs) {
    auto [spec_name, path] = detail::split_input_spec(spec);
    const std::optional<std::string> prefix = detail::megatron_pair(path);
    MMT_CHECK(prefix.has_value(), ValueError, "input '", spec, "' is not a Megatron indexed dataset (PREFIX, with ",
              "PREFIX.idx beginning \"MMIDIDX\" beside PREFIX.bin); Megatron datasets are packed alone, not with ",
              "other inputs");
    if (spec_name.empty()) spec_name = "tokens";
    MMT_CHECK(name.empty() || spec_name == name, InputSpecError, "input '", spec, "' names its field '", spec_name,
              "', but an earlier one named it '", name, "': Megatron datasets are packed into one field");
    name = spec_name;
    const std::string index_path = *prefix + ".idx", bin_path = *prefix + ".bin";
    // The .bin mapped first, and the index checked against the size of that mapping: a file
    // renamed over the path in between cannot slip past the checks.
    UntypedStorage bin = detail::regular_file_size(bin_path) == 0  // IoError naming a missing .bin
                             ? UntypedStorage()
                             : UntypedStorage::map_file(bin_path);
    detail::MegatronIndex index(UntypedStorage::map_file(index_path), bin.nbytes(), bin_path);
    distinct.add(index_path, spec);
    if (documents->parts.empty()) documents->dtype = index.dtype();
    MMT_CHECK(index.dtype() == documents->dtype, ValueError, index_path, " holds ", to_string(index.dtype()),
              " tokens, but ", documents->parts.front().index.path(), " holds ", to_string(documents->dtype),
              "; the datasets packed into one field must hold one dtype");
    const int64_t before = documents->part_end.empty() ? 0 : documents->part_end.back();
    int64_t bytes = 0;
    MMT_CHECK(!__builtin_mul_overflow(index.total_tokens(), element_size(index.dtype()), &bytes) &&
                  !__builtin_add_overflow(before, index.documents(), &out.records_) &&
                  !__builtin_add_overflow(out.total_bytes_, bytes, &out.total_bytes_),
              ValueError, "the Megatron datasets hold more than 2^63 documents or bytes");
    documents->part_end.push_back(out.records_);
    out.input_paths_.push_back(index_path);
    out.input_paths_.push_back(bin_path);
    documents->parts.push_back({std::move(index), std::move(bin), bin_path});
  }
  try {
    out.schema_ = Schema({Field::ragged(name, documents->dtype, {-1})});
  } catch (const ValueError& e) {
    throw InputSpecError(str("input '", specs.front(), "': ", e.what()));
  }
  std::string origin = str(name, "=");
  for (size_t p = 0; p < documents->parts.size(); ++p)
    origin += str(p == 0 ? "" : ", ", documents->parts[p].bin_path);
  out.origins_ = {origin + " (Megatron documents)"};
  out.metadata_["source"] = "megatron";
  out.megatron_ = std::move(documents);
  return out;
}

void PackSources::megatron_record(int64_t index, std::vector<Tensor>& values) const {
  const MegatronDocuments& documents = *megatron_;
  const auto [p, document_in_part] = detail::part_of(documents.part_end, index);
  const int64_t document = document_in_part;  // a plain variable: lambdas capture it (clang 14 cannot capture bindings)
  const MegatronDocuments::Part& part = documents.parts[p];
  const detail::MegatronIndex& idx = part.index;
  const int64_t item = element_size(documents.dtype);
  // The index may shrink under the pack (its reads are guarded, as the .bin's copies are), or
  // be rewritten in place: what was checked at open is checked again as it is read, once,
  // into memory of our own, so that what is viewed or copied is what was checked.
  thread_local std::vector<std::pair<int64_t, int64_t>> sequences;  // (byte, bytes) of each
  sequences.clear();
  const int64_t bin_bytes = part.bin.nbytes();
  detail::guard_storage_reads(idx.mapping(), [&] {
    const int64_t first = idx.first_sequence(document), end = idx.first_sequence(document + 1);
    MMT_CHECK(0 <= first && first <= end && end <= idx.sequences(), IoError, idx.path(), ": document index ", document,
              " or ", document + 1, " (bytes ", idx.document_byte(document), " on) changed while it was being packed");
    for (int64_t s = first; s < end; ++s) {
      const std::optional<std::pair<int64_t, int64_t>> bytes = idx.sequence_bytes(s, bin_bytes);
      MMT_CHECK(bytes.has_value(), IoError, idx.path(), ": sequence ", s, " (bytes ", idx.length_byte(s), " and ",
                idx.pointer_byte(s), ") changed while it was being packed, and now lies outside ", part.bin_path);
      sequences.push_back(*bytes);
    }
  });
  const int64_t start_byte = sequences.empty() ? 0 : sequences.front().first;
  int64_t end_byte = start_byte, total_bytes = 0;
  bool contiguous = true;
  for (const auto& [byte, bytes] : sequences) {
    contiguous = contiguous && byte == end_byte;
    end_byte = byte + bytes;
    total_bytes += bytes;
  }
  if (contiguous && start_byte % item == 0) {
    // The builder's layout: one document's sequences back to back. A view of the mapping.
    const int64_t tokens = total_bytes / item;
    values[0] = tokens == 0 ? empty({0}, documents.dtype) : Tensor(part.bin, documents.dtype, {tokens}, start_byte / item);
    return;
  }
  // Sequences apart (or a pointer between values, which no writer makes): gathered.
  Tensor gathered = empty({total_bytes / item}, documents.dtype);
  auto* out = static_cast<std::byte*>(gathered.mutable_data_ptr());
  detail::guard_storage_reads(part.bin, [&] {
    for (const auto& [byte, bytes] : sequences) {
      if (bytes > 0) std::memcpy(out, part.bin.data() + byte, static_cast<size_t>(bytes));
      out += bytes;
    }
  });
  values[0] = std::move(gathered);
}

std::string PackSources::megatron_origin(int64_t index) const {
  const MegatronDocuments& documents = *megatron_;
  const auto [p, document_in_part] = detail::part_of(documents.part_end, index);
  const int64_t document = document_in_part;  // a plain variable: lambdas capture it (clang 14 cannot capture bindings)
  const detail::MegatronIndex& idx = documents.parts[p].index;
  int64_t first = 0, end = 0;
  detail::guard_storage_reads(idx.mapping(), [&] {
    first = idx.first_sequence(document);
    end = idx.first_sequence(document + 1);
  });  // only printed: no check needed
  return str("document ", document, " of ", documents.parts[p].bin_path, " (sequences ", first, " to ", end,
             " exclusive, as ", idx.path(), " gives them)");
}

}  // namespace mmt
