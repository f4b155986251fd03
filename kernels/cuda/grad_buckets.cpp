#include "kernels/cuda/grad_buckets.h"

#include <algorithm>

#include "kernels/check.h"

namespace diloco::cuda {

namespace {

constexpr size_t kAlignFloats = 64;  // 256 bytes: cudaMalloc's alignment, the most gemm.cu looks at

}  // namespace

GradBuckets::GradBuckets(const std::vector<size_t>& counts, ParamRange shard, size_t embed_floats,
                         size_t other_floats, Stream stream, Stream comm_stream)
    : counts_(counts), shard_(shard), stream_(stream), comm_stream_(comm_stream), grads_(shard.count) {
  // The embeddings' slot, and two for ln_f and the blocks (double-buffered: see the header).
  for (size_t capacity : {embed_floats, other_floats, other_floats}) {
    Slot& s = slots_.emplace_back();
    s.capacity = capacity;
    s.buffer = DeviceArray<float>(capacity + kAlignFloats - 1);
    s.ready = std::make_unique<StreamEvent>();
    s.done = std::make_unique<StreamEvent>();
  }
  if (shard.count) fill_bytes(grads_.get(), 0, shard.count * sizeof(float), stream_);
}

size_t GradBuckets::bytes() const {
  size_t n = grads_.size();
  for (const Slot& s : slots_) n += s.buffer.size();
  return n * sizeof(float);
}

void GradBuckets::Start(LocalComm* comm) {
  comm_ = comm;
  status_ = CommStatus::Ok();
  for (const Slot& s : slots_) DL_CHECK(!s.open, "a gradient bucket at %zu is still open", s.offset);
}

float* GradBuckets::Open(size_t offset, size_t count) {
  Slot* best = nullptr;  // the smallest free slot that holds it; of those, the least recently closed
  for (Slot& s : slots_) {
    if (s.open || s.capacity < count) continue;
    if (best == nullptr || s.capacity < best->capacity ||
        (s.capacity == best->capacity && s.closed_at < best->closed_at))
      best = &s;
  }
  DL_CHECK(best != nullptr, "no free gradient bucket for [%zu, +%zu)", offset, count);
  best->open = true;
  best->offset = offset;
  best->count = count;
  best->data = best->buffer.get() + offset % kAlignFloats;
  // The slot's last reduce-scatter may still read it: the compute stream waits for it (on the
  // GPU) before zeroing it.
  best->done->wait(stream_);
  fill_bytes(best->data, 0, count * sizeof(float), stream_);
  return best->data;
}

float* GradBuckets::At(size_t offset) {
  for (Slot& s : slots_)
    if (s.open && offset >= s.offset && offset < s.offset + s.count) return s.data + (offset - s.offset);
  DL_CHECK(false, "table offset %zu lies in no open gradient bucket", offset);
  return nullptr;
}

void GradBuckets::Close(size_t offset, size_t count) {
  Slot* b = nullptr;
  for (Slot& s : slots_)
    if (s.open && s.offset == offset) b = &s;
  DL_CHECK(b != nullptr && b->count == count, "bucket [%zu, +%zu) closed but not open", offset, count);
  b->open = false;
  b->closed_at = ++closes_;
  if (!status_.ok()) return;  // the ring failed on an earlier bucket: every rank gives up together
  DL_CHECK(comm_ != nullptr, "gradient bucket closed outside a sharded step");
  // Each rank's part of the bucket is where the bucket meets its shard; the parts tile the bucket.
  std::vector<size_t> parts(counts_.size(), 0);
  size_t lo = 0;
  for (size_t q = 0; q < counts_.size(); q++) {
    const size_t a = std::max(lo, offset), z = std::min(lo + counts_[q], offset + count);
    if (a < z) parts[q] = z - a;
    lo += counts_[q];
  }
  // The backward's kernels that wrote the bucket come first on the compute stream: the comm
  // stream waits for them, not the host.
  b->ready->record(stream_);
  b->ready->wait(comm_stream_);
  status_ = comm_->reduce_scatter_on(comm_stream_, b->data, parts, ReduceOp::kMean);
  if (!status_.ok()) return;
  const size_t a = std::max(shard_.offset, offset), z = std::min(shard_.offset + shard_.count, offset + count);
  if (a < z)
    copy_device_to_device(grads_.get() + (a - shard_.offset), b->data + (a - offset), (z - a) * sizeof(float),
                          comm_stream_);
  b->done->record(comm_stream_);
}

CommStatus GradBuckets::Finish() {
  // The norm and AdamW (compute stream) read the shard's gradients the comm stream wrote.
  comm_done_.record(comm_stream_);
  comm_done_.wait(stream_);
  DL_CHECK(comm_ != nullptr, "gradient buckets finished outside a sharded step");
  // One host wait per step, through the ring: it ends with an error when a peer fails.
  CommStatus waited = comm_->wait_stream(comm_stream_);
  if (!status_.ok()) return status_;
  return waited;
}

}  // namespace diloco::cuda
