// PackSources::token_windows: a field's values as one stream of tokens, cut into fixed-length
// records (packer.h, WindowOptions).
#include <algorithm>
#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "mmtensor/error.h"
#include "mmtensor/packer.h"
#include "pack_windows.h"

namespace mmt {


namespace {

using detail::str;
using detail::TokenWindows;

// Whether `value` survives the trip into `dtype` and back (a separator must be that token).
// An integer dtype holds it exactly or refuses it, but for a negative value that an unsigned
// one wraps (as PyTorch does: -1 into uint8 is 255, not the token asked for); a floating one
// may round it (float32 holds 2^62, not 2^53 + 1), and the rounded value is exact in a double.
bool holds_exactly(ScalarType dtype, int64_t value) {
  try {
    const Tensor token = full({}, value, dtype);
    if (dtype == kUInt64) return value >= 0;
    if (!token.is_floating_point() && !token.is_complex()) return token.item_as_int64() == value;
    const double back = token.item_as_complex().real();
    return back >= -0x1p63 && back < 0x1p63 && static_cast<int64_t>(back) == value;
  } catch (const ValueError&) {  // out of the dtype's range
    return false;
  }
}

// Tokens [first, first + count) of a 1-D array's stream, from what the last call read
// where it overlaps (TokenWindows::Held): new memory, or a view of the array's mapping.
Tensor run_of(const TokenWindows& w, int64_t first, int64_t count) {
  std::vector<Tensor> values;
  if (!w.converted_array) {
    if (!w.tokens.record_batch(first, count, values)) return Tensor();
    return values[0];
  }
  TokenWindows::Held& held = *w.held;
  std::lock_guard lock(held.mutex);
  const int64_t held_end = held.run.defined() ? held.run_first + held.run.size(0) : -1;
  Tensor run = empty({count}, w.dtype);
  int64_t reused = 0;
  if (held.run.defined() && held.run_first <= first && first <= held_end) {
    reused = std::min(held_end - first, count);
    if (reused > 0) run.narrow(0, 0, reused).copy_(held.run.narrow(0, first - held.run_first, reused));
  }
  if (reused < count) {
    if (!w.tokens.record_batch(first + reused, count - reused, values)) return Tensor();
    run.narrow(0, reused, count - reused).copy_(values[0]);
  }
  held.run = run;
  held.run_first = first;
  return run;
}

// Document d's values, flattened: the one the last window ended in is kept (TokenWindows::Held).
Tensor document_of(const TokenWindows& w, int64_t d) {
  TokenWindows::Held& held = *w.held;
  std::lock_guard lock(held.mutex);
  if (held.document != d) {
    std::vector<Tensor> values;
    w.tokens.record(d, values);
    held.values = values[0].flatten();
    held.document = d;
  }
  return held.values;
}

// Whether `tokens` give one field, with at most its null mask beside it (an Arrow or Parquet
// column with nulls brings it): the windows are cut from the first.
bool one_field_and_its_mask(const PackSources& tokens) {
  const Schema& schema = tokens.schema();
  return schema.size() == 1 ||
         (schema.size() == 2 && schema[1].name == schema[0].name + ".valid" && tokens.is_null_mask(schema[1].name));
}

}  // namespace

PackSources PackSources::token_windows(PackSources tokens, WindowOptions options) {
  MMT_CHECK(one_field_and_its_mask(tokens), ValueError, "token windows are cut from one field; the sources have ",
            tokens.schema().size(), " (choose one: --field NAME of datasets, Arrow or Parquet files, or one array)");
  const Field field = tokens.schema()[0];
  // A null document is empty: only documents of any length may be null. A null among fixed
  // values (zeros, or NaN, in their place) would be cut into the stream as tokens.
  MMT_CHECK(tokens.schema().size() == 1 || field.shape == DimVector{kVariableDim}, ValueError, "token windows: column '",
            field.name, "' has nulls (its mask ", field.name, ".valid), and its rows are of fixed shape ",
            IntArrayRef(field.shape), ": a null has no tokens to put in their place (only a list column's null is an ",
            "empty document)");
  MMT_CHECK(options.length >= 1, ValueError, "token windows: the length must be >= 1 token, got ", options.length);
  MMT_CHECK(options.stride >= 0, ValueError, "token windows: the stride must be >= 1 token (0: the length), got ",
            options.stride);
  if (options.stride == 0) options.stride = options.length;
  MMT_CHECK(field.dtype != kBool, ValueError, "token windows: field '", field.name, "' holds bools, not tokens");
  auto windows = std::make_shared<TokenWindows>();
  windows->dtype = field.dtype;
  windows->documents = field.shape.size() == 1;  // ragged [-1] or fixed [n]
  MMT_CHECK(windows->documents || field.shape.empty(), ValueError, "token windows: field '", field.name,
            "' holds values of shape ", IntArrayRef(field.shape),
            "; a stream is cut from one value a record (a 1-D array) or a 1-D value a record (documents)");
  if (options.separator) {
    MMT_CHECK(windows->documents, ValueError, "token windows: a separator goes between documents, and field '",
              field.name, "' holds one token a record (a 1-D array: its values are one document)");
    MMT_CHECK(holds_exactly(field.dtype, *options.separator), ValueError, "token windows: the separator ",
              *options.separator, " is not a ", to_string(field.dtype), " value (",
              is_floating_point(field.dtype) || is_complex(field.dtype) ? "past its range, or rounded in it" : "past its range",
              ")");
  }
  if (windows->documents) {
    // One pass over the documents for their sizes: the windows' count must be known before
    // any is written (shards are cut by it), and a window's place in the stream needs them.
    const int64_t records = tokens.records();
    windows->document_start.reserve(static_cast<size_t>(records) + 1);
    windows->document_start.push_back(0);
    std::vector<Tensor> values;
    const int64_t separator_tokens = options.separator ? 1 : 0;
    for (int64_t d = 0; d < records; ++d) {
      tokens.record(d, values);
      const int64_t size = values[0].numel() + separator_tokens;
      MMT_CHECK(size <= std::numeric_limits<int64_t>::max() - windows->document_start.back(), ValueError,
                "token windows: the stream passes 2^63 tokens");
      windows->document_start.push_back(windows->document_start.back() + size);
    }
    windows->stream_tokens = windows->document_start.back();
  } else {
    windows->stream_tokens = tokens.records();
    windows->converted_array = !tokens.columns_.empty() && !tokens.columns_[0].defined();
  }
  const int64_t length = options.length, stride = options.stride;
  windows->windows = windows->stream_tokens < length ? 0 : (windows->stream_tokens - length) / stride + 1;
  const int64_t covered = windows->windows == 0 ? 0 : (windows->windows - 1) * stride + length;
  windows->options = options;

  PackSources out;
  out.records_ = windows->windows;
  out.schema_ = Schema({Field::fixed(field.name, field.dtype, {length})});
  out.metadata_ = tokens.metadata();
  nlohmann::json entry = {{"field", field.name}, {"length", length},          {"stride", stride},
                          {"tokens", windows->stream_tokens}, {"dropped", windows->stream_tokens - covered}};
  if (options.separator) entry["separator"] = *options.separator;
  out.metadata_[std::string(kTokenWindowsMetadataKey)] = entry.dump();
  out.origins_ = {str(field.name, "=windows of ", length, " tokens every ", stride, " over ", tokens.origins()[0])};
  out.input_paths_ = tokens.input_paths_;
  out.input_folders_ = tokens.input_folders_;
  out.linked_input_files_ = tokens.linked_input_files_;
  // For progress figures only: saturated rather than wrapped for a stream of absurd windows.
  int64_t window_bytes = 0, all_bytes = 0;
  out.total_bytes_ = __builtin_mul_overflow(length, element_size(field.dtype), &window_bytes) ||
                             __builtin_mul_overflow(window_bytes, windows->windows, &all_bytes)
                         ? std::numeric_limits<int64_t>::max()
                         : all_bytes;
  windows->tokens = std::move(tokens);
  out.windows_ = std::move(windows);
  return out;
}

std::optional<PackSources::RecordedWindows> PackSources::windows_of(const Metadata& metadata, const std::string& where) {
  const auto it = metadata.find(std::string(kTokenWindowsMetadataKey));
  if (it == metadata.end()) return std::nullopt;
  const auto malformed = [&](const std::string& why) {
    return FormatError(str(where, ": metadata key '", kTokenWindowsMetadataKey, "' ", why));
  };
  const nlohmann::json entry = nlohmann::json::parse(it->second, nullptr, false);
  if (!entry.is_object()) throw malformed("is not a JSON object");
  const auto integer = [&](const char* key) -> std::optional<int64_t> {
    const auto value = entry.find(key);
    if (value == entry.end()) return std::nullopt;
    if (!value->is_number_integer() || (value->is_number_unsigned() && value->get<uint64_t>() > INT64_MAX))
      throw malformed(str("has '", key, "' that is not an integer"));
    return value->get<int64_t>();
  };
  RecordedWindows recorded;
  const std::optional<int64_t> length = integer("length"), stride = integer("stride"), tokens = integer("tokens");
  if (!length || !stride || *length < 1 || *stride < 1) throw malformed("lacks a length and stride >= 1");
  if (!tokens || *tokens < 0) throw malformed("lacks the stream's tokens (>= 0)");
  recorded.options.length = *length;
  recorded.options.stride = *stride;
  recorded.options.separator = integer("separator");
  recorded.stream_tokens = *tokens;
  return recorded;
}

void PackSources::fill_windows(int64_t start, int64_t count, const Tensor& out) const {
  const TokenWindows& w = *windows_;
  const int64_t length = w.options.length;
  std::vector<Tensor> values;
  for (int64_t r = 0; r < count; ++r) {
    const Tensor row = out.select(0, r);
    const int64_t first = (start + r) * w.options.stride;  // in the stream
    if (!w.documents) {
      // A 1-D array: the window is a run of its records, one token each.
      if (const Tensor run = run_of(w, first, length); run.defined()) {
        row.copy_(run);
      } else {
        for (int64_t k = 0; k < length; ++k) {
          w.tokens.record(first + k, values);
          row.select(0, k).copy_(values[0]);
        }
      }
      continue;
    }
    // Documents: from the one holding `first` on, each one's part in the window, then its
    // separator.
    auto d = static_cast<size_t>(std::upper_bound(w.document_start.begin(), w.document_start.end(), first) -
                                 w.document_start.begin()) - 1;
    int64_t filled = 0, position = first;
    while (filled < length) {
      const int64_t within = position - w.document_start[d];
      const int64_t tokens = w.document_tokens(d);
      if (within < tokens) {
        const int64_t take = std::min(tokens - within, length - filled);
        row.narrow(0, filled, take).copy_(document_of(w, static_cast<int64_t>(d)).narrow(0, within, take));
        filled += take;
        position += take;
      } else {  // the separator (without one, the loop below never leaves a document at its end)
        row.narrow(0, filled, 1).fill_(*w.options.separator);  // an integer, exact (holds_exactly)
        ++filled;
        ++position;
      }
      // On to the next document that has tokens left (an empty one, without a separator,
      // takes no place in the stream).
      while (d + 2 < w.document_start.size() && position == w.document_start[d + 1]) ++d;
    }
  }
}

bool PackSources::window_batch(int64_t start, int64_t count, std::vector<Tensor>& values) const {
  const TokenWindows& w = *windows_;
  const int64_t length = w.options.length, stride = w.options.stride;
  values.resize(1);
  if (!w.documents && count > 0) {
    // A 1-D array: the windows are one strided view of its run of tokens (overlapping when
    // stride < length), of the array's mapping where it lies as it is; the writer copies
    // them row by row.
    const Tensor run = run_of(w, start * stride, (count - 1) * stride + length);
    if (run.defined() && run.is_contiguous()) {
      values[0] = run.as_strided({count, length}, {stride, 1}, run.storage_offset());
      return true;
    }
  }
  values[0] = empty({count, length}, w.dtype);
  fill_windows(start, count, values[0]);
  return true;
}

std::string PackSources::window_origin(int64_t index) const {
  const TokenWindows& w = *windows_;
  const int64_t first = index * w.options.stride, last = first + w.options.length;  // [first, last) of the stream
  if (!w.documents)
    return str("tokens ", first, " to ", last - 1, " of ", w.tokens.origins()[0], " (window ", index, ")");
  const auto d = static_cast<int64_t>(std::upper_bound(w.document_start.begin(), w.document_start.end(), first) -
                                      w.document_start.begin()) - 1;
  return str("window ", index, ": tokens ", first, " to ", last - 1, " of the stream, from token ",
             first - w.document_start[static_cast<size_t>(d)], " of document ", d, " (",
             w.tokens.record_origin(0, d), ") on");
}

}  // namespace mmt
