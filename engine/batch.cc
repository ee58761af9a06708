// Batch: a loan of one ring slot, viewed as tensors; returned on release.
#include <algorithm>
#include <utility>

#include "cuda_stream.h"
#include "loader_core.h"
#include "quoted_names.h"
#include "mmtensor/error.h"

namespace mmt {
namespace {

// A device batch's events and streams belong to the CUDA context of the process that made
// the loader; the child of a fork cannot use them.
void check_device_batch_is_this_process(const detail::LoaderCore& core) {
  if (detail::inherited_through_fork(core.made_in_generation))
    detail::throw_inherited_through_fork("Batch on " + core.options.device.str(),
                                         "Take batches from a Loader made in this process.");
}

}  // namespace

Batch::Batch(Batch&& other) noexcept { *this = std::move(other); }

Batch& Batch::operator=(Batch&& other) noexcept {
  if (this == &other) return *this;
  release();
  core_ = std::move(other.core_);
  slot_ = std::exchange(other.slot_, -1);
  rows_ = std::exchange(other.rows_, 0);
  epoch_ = other.epoch_;
  number_ = other.number_;
  device_ = other.device_;
  consumer_stream_ = other.consumer_stream_;
  other_streams_ = std::move(other.other_streams_);
  other.other_streams_.clear();
  state_after_ = other.state_after_;
  fields_ = std::move(other.fields_);
  other.fields_.clear();
  return *this;
}

void Batch::release() noexcept {
  if (!core_) return;
  fields_.clear();  // the views go first: the slot may be refilled as soon as it is free
  if (detail::inherited_through_fork(core_->made_in_generation))
    // In the child of a fork the loader's lock may be held for ever by a worker that stayed
    // in the parent: the slot is not handed back, and the loader is never destroyed here.
    detail::abandon_after_fork(new std::shared_ptr<detail::LoaderCore>(std::move(core_)));
  else
    core_->release_slot(slot_, consumer_stream_, other_streams_);
  other_streams_.clear();
  core_.reset();
  slot_ = -1;
  rows_ = 0;
}

std::span<const int64_t> Batch::indices() const& {
  MMT_CHECK(core_ != nullptr, ValueError, "Batch: this batch was released");
  return {core_->slots[slot_].indices.data(), static_cast<size_t>(rows_)};
}

size_t Batch::field_position(std::string_view field) const {
  MMT_CHECK(core_ != nullptr, ValueError, "Batch: this batch was released");
  // CUDA keeps pinned pages out of a fork's child (and device memory is the parent's
  // context's): the views would fault. Ordinary host memory came along with the process.
  if (detail::inherited_through_fork(core_->made_in_generation))
    MMT_CHECK(!device_.is_cuda() && !core_->ring.host_storage().is_pinned(), ValueError,
              "Batch: taken in the parent of this forked process, in ", device_.is_cuda() ? "device" : "pinned",
              " memory, which a forked child does not have; take batches from a Loader made in this process");
  const std::vector<std::string>& names = core_->field_names;
  if (names.size() < detail::kFieldsLookedUpByMap) {
    for (size_t f = 0; f < names.size(); ++f)
      if (names[f] == field) return f;
  } else if (const auto it = core_->field_position_by_name.find(field); it != core_->field_position_by_name.end()) {
    return it->second;
  }
  const auto name_of = [](const std::string& name) -> const std::string& { return name; };
  throw ValueError(detail::str("Batch: no field '", field, "' in this batch (it holds ",
                               detail::quoted_names(names, name_of), ")"));
}

const std::vector<std::string>& Batch::field_names() const {
  MMT_CHECK(core_ != nullptr, ValueError, "Batch: this batch was released");
  return core_->field_names;
}

const Tensor& Batch::operator[](std::string_view field) const& {
  return fields_[field_position(field)].values;
}

bool Batch::is_ragged(std::string_view field) const {
  const size_t f = field_position(field);  // first: it refuses a released batch, whose core_ is null
  return core_->ring.fields()[f].ragged;
}

const RaggedBatch& Batch::ragged(std::string_view field) const& {
  const size_t f = field_position(field);
  MMT_CHECK(core_->ring.fields()[f].ragged, ValueError, "Batch: field '", field,
            "' has a fixed shape; use batch[\"", field, "\"]");
  return fields_[f];
}

void Batch::wait(CUstream_st* stream) {
  MMT_CHECK(core_ != nullptr, ValueError, "Batch: this batch was released");
  if (!device_.is_cuda()) return;
  check_device_batch_is_this_process(*core_);
  const int stream_device = cuda::stream_device(stream);
  MMT_CHECK(stream_device < 0 || stream_device == device_.index, CudaError, "Batch::wait: the stream belongs to cuda:",
            stream_device, ", not to the batch's device ", device_.str(), "; copy the batch there instead");
  // Room first: a stream made to wait must also be one the slot's release waits for, so
  // nothing after the wait may fail.
  const bool known = stream == consumer_stream_ ||
                     std::find(other_streams_.begin(), other_streams_.end(), stream) != other_streams_.end();
  if (!known) other_streams_.reserve(other_streams_.size() + 1);
  core_->slots[slot_].copied.make_stream_wait(stream);
  if (!known) other_streams_.push_back(stream);
}

void Batch::synchronize() const {
  MMT_CHECK(core_ != nullptr, ValueError, "Batch: this batch was released");
  if (!device_.is_cuda()) return;
  check_device_batch_is_this_process(*core_);
  core_->slots[slot_].copied.synchronize();
}

namespace detail {

Batch LoaderCore::make_batch(int s, int64_t batch_epoch, const LoaderState& state_after) {
  Slot& slot = slots[s];
  Batch batch;
  // Not owning the slot yet (core_ stays null): next() hands the slot over once nothing can
  // fail, so an exception here leaves the slot Ready for the next call.
  batch.slot_ = s;
  batch.consumer_stream_ = options.consumer_stream;
  const bool on_device = options.device.is_cuda();
  batch.fields_.resize(ring.fields().size());
  for (size_t f = 0; f < ring.fields().size(); ++f) {
    RaggedBatch& out = batch.fields_[f];
    if (ring.fields()[f].ragged) {
      out.values = ring.values_view(s, f, on_device);
      out.offsets = ring.offsets_view(s, f, slot.rows, on_device);
      out.shapes = ring.shapes_view(s, f, slot.rows, on_device);
    } else {
      out.values = ring.fixed_view(s, f, slot.rows, on_device);
    }
  }
  batch.rows_ = slot.rows;
  batch.epoch_ = batch_epoch;
  batch.number_ = slot.batch;
  batch.device_ = options.device;
  batch.state_after_ = state_after;
  if (on_device) {
    slot.copied.make_stream_wait(options.consumer_stream);
    // The engine's own device copies of the batch (cpu(), clone(), to()) run on the legacy
    // default stream: with another consumer stream, that one must wait for the copy too.
    if (options.consumer_stream != nullptr) slot.copied.make_stream_wait(nullptr);
  }
  return batch;
}

}  // namespace detail
}  // namespace mmt
