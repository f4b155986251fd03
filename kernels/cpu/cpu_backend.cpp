#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/check.h"
#include "kernels/grad_clip.h"

namespace diloco {

// ZeRO-2's gradients: backward hands each bucket (a range of the table: ln_f, a block, the
// embeddings) over as soon as it is final; the ring reduce-scatters it at once, each rank keeping
// the mean of its shard's part, and the bucket's buffer is reused. So a rank holds its shard of the
// gradients plus the buckets open at one time (the embeddings' and one block's), not all of them.
class CpuBackend::ShardedGrads final : public GradSink {
 public:
  ShardedGrads(const std::vector<size_t>& counts, ParamRange shard) : counts_(counts), shard_(shard) {
    grads_.assign(shard.count, 0.0f);
  }

  void Start(LocalComm* comm) {
    comm_ = comm;
    status_ = CommStatus::Ok();
  }
  const CommStatus& status() const { return status_; }
  const float* grads() const { return grads_.data(); }
  size_t bytes() const {
    size_t n = grads_.size();
    for (const Bucket& b : buckets_) n += b.values.size();
    return n * sizeof(float);
  }

  float* Open(size_t offset, size_t count) override {
    Bucket* free = nullptr;
    for (Bucket& b : buckets_)
      if (!b.open && (free == nullptr || b.values.size() > free->values.size())) free = &b;
    if (free == nullptr) free = &buckets_.emplace_back();
    free->open = true;
    free->offset = offset;
    free->values.assign(count, 0.0f);
    return free->values.data();
  }

  void Close(size_t offset, size_t count) override {
    Bucket* b = nullptr;
    for (Bucket& c : buckets_)
      if (c.open && c.offset == offset) b = &c;
    DL_CHECK(b != nullptr && b->values.size() == count, "bucket [%zu, +%zu) closed but not open", offset, count);
    b->open = false;
    if (!status_.ok()) return;  // the ring failed on an earlier bucket: every rank gives up together
    // Each rank's part of the bucket is where the bucket meets its shard.
    std::vector<size_t> parts(counts_.size(), 0);
    size_t lo = 0;
    for (size_t q = 0; q < counts_.size(); q++) {
      const size_t a = std::max(lo, offset), z = std::min(lo + counts_[q], offset + count);
      if (a < z) parts[q] = z - a;
      lo += counts_[q];
    }
    status_ = comm_->reduce_scatter(b->values.data(), parts, ReduceOp::kMean);
    if (!status_.ok()) return;
    const size_t a = std::max(shard_.offset, offset), z = std::min(shard_.offset + shard_.count, offset + count);
    if (a < z) std::copy(b->values.begin() + (a - offset), b->values.begin() + (z - offset), grads_.begin() + (a - shard_.offset));
  }

 private:
  struct Bucket {
    bool open = false;
    size_t offset = 0;
    std::vector<float> values;
  };
  const std::vector<size_t> counts_;
  const ParamRange shard_;
  std::vector<float> grads_;  // the shard's mean gradients
  std::vector<Bucket> buckets_;
  LocalComm* comm_ = nullptr;
  CommStatus status_;
};

namespace {

// The floats of the model's params and grads: padded to world equal shards on a sharded ring.
size_t BufferFloats(const BackendOptions& o) {
  const size_t n = gpt_tensor_table(o.model).total_numel();
  return o.shard == ShardMode::kNone ? n : ShardPaddedFloats(n, o.world);
}

GptOptions GptOptionsOf(const BackendOptions& o) {
  GptOptions g;
  g.recompute = o.recompute;
  g.keep_grads = o.shard != ShardMode::kGradients;
  g.buffer_floats = BufferFloats(o);
  return g;
}

}  // namespace

CpuBackend::CpuBackend(const BackendOptions& options)
    : model_(options.model, options.max_batch, GptOptionsOf(options)),
      shard_mode_(options.shard),
      buffer_floats_(BufferFloats(options)) {
  shard_ = {0, num_params()};
  if (shard_mode_ != ShardMode::kNone) {
    shard_counts_ = ShardCounts(num_params(), options.world);
    padded_counts_ = ShardPaddedCounts(num_params(), options.world);
    shard_ = {PartOffset(shard_counts_, options.rank), shard_counts_[options.rank]};
  }
  if (shard_mode_ == ShardMode::kGradients) sharded_grads_ = std::make_unique<ShardedGrads>(shard_counts_, shard_);
}

CpuBackend::~CpuBackend() = default;

TrainingBackend::Allocated CpuBackend::allocated() const {
  Allocated a;
  a.params = buffer_floats_ * sizeof(float);
  a.grads = sharded_grads_ ? sharded_grads_->bytes() : buffer_floats_ * sizeof(float);
  a.moments = (optimizer_.m.size() + optimizer_.v.size()) * sizeof(float);
  size_t outer = scratch_.size() + scratch2_.size() + residual_scratch_.size();
  for (const SyncFragment& f : sync_)
    outer += f.base.size() + f.previous_base.size() + f.at_send.size() + f.residual.size();
  a.outer_state = outer * sizeof(float);
  a.activations = model_.activation_bytes();
  return a;
}

void CpuBackend::download_optimizer(AdamWState* out) const {
  if (shard_mode_ == ShardMode::kNone) {
    *out = optimizer_;
    return;
  }
  const size_t n = num_params();
  if (out->m.size() != n) out->m.assign(n, 0.0f);
  if (out->v.size() != n) out->v.assign(n, 0.0f);
  out->step = optimizer_.step;
  if (optimizer_.m.empty()) return;  // no step yet: zero moments
  std::copy(optimizer_.m.begin(), optimizer_.m.end(), out->m.begin() + shard_.offset);
  std::copy(optimizer_.v.begin(), optimizer_.v.end(), out->v.begin() + shard_.offset);
}

void CpuBackend::upload_optimizer(const AdamWState& state) {
  if (shard_mode_ == ShardMode::kNone) {
    optimizer_ = state;
    return;
  }
  optimizer_ = AdamWState{};
  optimizer_.step = state.step;
  if (state.m.empty()) return;  // a fresh optimizer: the first step sizes the moments
  DL_CHECK(state.m.size() == num_params() && state.v.size() == num_params(), "optimizer state of %zu values, model %zu",
           state.m.size(), num_params());
  optimizer_.m.assign(state.m.begin() + shard_.offset, state.m.begin() + shard_.offset + shard_.count);
  optimizer_.v.assign(state.v.begin() + shard_.offset, state.v.begin() + shard_.offset + shard_.count);
}

CommStatus CpuBackend::sharded_train_step(LocalComm& comm, const int* inputs, const int* targets, int B, int T,
                                          const AdamWHyper& hp, double grad_clip, StepStats* stats) {
  DL_CHECK(comm.world_size() == (int)shard_counts_.size(), "a backend sharded %zu ways on a ring of %d",
           shard_counts_.size(), comm.world_size());
  StepStats s;
  // The mean loss first: a rank whose loss is not finite makes every rank skip the step together.
  s.loss = model_.forward(inputs, targets, B, T);
  if (CommStatus st = comm.all_reduce_host(&s.loss, 1, ReduceOp::kMean); !st.ok()) return st;
  *stats = s;
  if (!std::isfinite(s.loss)) return CommStatus::Ok();
  CommStatus reduced;
  const float* grads = ReduceShardGradients(comm, &reduced);
  if (!reduced.ok()) return reduced;
  // Every norm chunk lies in one shard: each rank sums its own, the ring adds zeros to the rest.
  std::vector<double> partial((num_params() + kNormChunk - 1) / kNormChunk, 0.0);
  norm_chunk_sums(grads, shard_.count, partial.data() + shard_.offset / kNormChunk);
  if (CommStatus st = comm.all_reduce_host(partial.data(), (int)partial.size(), ReduceOp::kSum); !st.ok()) return st;
  s.grad_norm = norm_of_chunk_sums(partial.data(), partial.size());
  *stats = s;
  if (!std::isfinite(s.grad_norm)) return CommStatus::Ok();
  AdamWHyper clipped = hp;
  clipped.grad_scale = hp.grad_scale * clip_scale(s.grad_norm, grad_clip);
  adamw_step_range(model_.params(), grads, optimizer_, model_.table(), clipped, shard_.offset, shard_.count);
  // Equal parts of the padded buffer (kernels/shard.h): the pads are zeros on every rank.
  if (CommStatus st = comm.all_gather(model_.params(), padded_counts_); !st.ok()) return st;
  stats->applied = true;
  return CommStatus::Ok();
}

const float* CpuBackend::ReduceShardGradients(LocalComm& comm, CommStatus* status) {
  if (sharded_grads_) {
    sharded_grads_->Start(&comm);
    model_.backward(sharded_grads_.get());
    *status = sharded_grads_->status();
    return sharded_grads_->grads();
  }
  model_.zero_grad();
  model_.backward();
  *status = comm.reduce_scatter(model_.grads(), padded_counts_, ReduceOp::kMean);
  return model_.grads() + shard_.offset;
}

void CpuBackend::upload_params(const float* host, size_t offset, size_t count) {
  DL_CHECK(offset + count <= num_params(), "params range [%zu, +%zu) outside %zu", offset, count, num_params());
  std::memcpy(model_.params() + offset, host, count * sizeof(float));
}

void CpuBackend::download_params(float* host, size_t offset, size_t count) const {
  DL_CHECK(offset + count <= num_params(), "params range [%zu, +%zu) outside %zu", offset, count, num_params());
  std::memcpy(host, model_.params() + offset, count * sizeof(float));
}

void CpuBackend::download_grads(float* host) const {
  if (!sharded_grads_) {
    std::memcpy(host, model_.grads(), num_params() * sizeof(float));
    return;
  }
  std::fill_n(host, num_params(), 0.0f);
  std::copy_n(sharded_grads_->grads(), shard_.count, host + shard_.offset);
}

double CpuBackend::forward_backward(const int* inputs, const int* targets, int B, int T) {
  const double loss = model_.forward(inputs, targets, B, T);
  model_.zero_grad();
  if (std::isfinite(loss)) model_.backward();  // else apply_update skips the step
  return loss;
}

StepStats CpuBackend::apply_update(double loss, const AdamWHyper& hp, double grad_clip) {
  // The second half of train_step() (kernels/train_step.cpp), step for step.
  StepStats s;
  s.loss = loss;
  if (!std::isfinite(loss)) return s;
  s.grad_norm = global_norm(model_.grads(), model_.num_params());
  if (!std::isfinite(s.grad_norm)) return s;
  AdamWHyper clipped = hp;
  clipped.grad_scale = hp.grad_scale * clip_scale(s.grad_norm, grad_clip);
  adamw_step(model_.params(), model_.grads(), optimizer_, model_.table(), clipped);
  s.applied = true;
  return s;
}

double CpuBackend::eval_loss(const int* inputs, const int* targets, int B, int T) {
  return model_.forward(inputs, targets, B, T);
}

CpuBackend::SyncFragment& CpuBackend::fragment(int p) {
  DL_CHECK(p >= 0 && p < (int)sync_.size(), "fragment %d of %zu (sync_setup first)", p, sync_.size());
  return sync_[p];
}

void CpuBackend::gather(const SyncFragment& f, float* packed) const {
  for (const ParamRange& r : f.ranges) packed = std::copy_n(model_.params() + r.offset, r.count, packed);
}

void CpuBackend::scatter(const SyncFragment& f, const float* packed) {
  for (const ParamRange& r : f.ranges) {
    std::copy_n(packed, r.count, model_.params() + r.offset);
    packed += r.count;
  }
}

void CpuBackend::sync_setup(const std::vector<std::vector<ParamRange>>& fragments) {
  sync_.assign(fragments.size(), {});
  for (size_t p = 0; p < fragments.size(); p++) {
    SyncFragment& f = sync_[p];
    f.ranges = fragments[p];
    f.numel = checked_fragment_numel(f.ranges);
    f.base.resize(f.numel);
    gather(f, f.base.data());
    f.previous_base = f.base;
    f.at_send = f.base;
    f.residual.assign(f.numel, 0.0f);
  }
}

void CpuBackend::sync_install(int p, const float* packed) {
  SyncFragment& f = fragment(p);
  std::copy_n(packed, f.numel, f.base.data());
  scatter(f, packed);
  std::fill(f.residual.begin(), f.residual.end(), 0.0f);
}

bool CpuBackend::sync_encode_delta(int p, SyncCodec kind, int block, std::vector<uint8_t>* payload,
                                   std::vector<uint64_t>* range_bytes) {
  SyncFragment& f = fragment(p);
  scratch_.resize(f.numel);
  gather(f, scratch_.data());  // θ_p
  scratch2_.resize(f.numel);
  outer_delta(scratch2_.data(), f.base.data(), scratch_.data(), f.numel);
  range_bytes->clear();
  size_t total = 0;
  for (const ParamRange& r : f.ranges) total += range_bytes->emplace_back(sync_payload_bytes(kind, r.count, block));
  payload->resize(total);
  // Encode into a copy of the residual, so a failure on a later range leaves it as it was.
  residual_scratch_.assign(f.residual.begin(), f.residual.end());
  size_t at = 0, value = 0;
  for (size_t i = 0; i < f.ranges.size(); i++) {
    const size_t n = f.ranges[i].count;
    if (!sync_encode(payload->data() + at, residual_scratch_.data() + value, scratch2_.data() + value, kind, block,
                     n))
      return false;
    at += (*range_bytes)[i];
    value += n;
  }
  f.residual.swap(residual_scratch_);
  f.at_send.swap(scratch_);
  return true;
}

void CpuBackend::sync_reset_residual(int p) {
  SyncFragment& f = fragment(p);
  std::fill(f.residual.begin(), f.residual.end(), 0.0f);
}

bool CpuBackend::sync_apply_update(int p, const uint8_t* payload, size_t bytes, SyncCodec kind, int block) {
  SyncFragment& f = fragment(p);
  scratch_.resize(f.numel);
  size_t at = 0, value = 0;
  for (const ParamRange& r : f.ranges) {
    const size_t b = sync_payload_bytes(kind, r.count, block);
    if (at + b > bytes || !sync_decode(scratch_.data() + value, payload + at, kind, block, r.count)) return false;
    at += b;
    value += r.count;
  }
  if (at != bytes) return false;
  f.previous_base.swap(f.base);  // no copy: the new base is written from the previous one
  for (size_t i = 0; i < f.numel; i++) f.base[i] = f.previous_base[i] + scratch_[i];
  return true;
}

void CpuBackend::sync_fold(int p, FoldMode mode, double alpha, FoldIncluded included) {
  SyncFragment& f = fragment(p);
  scratch_.resize(f.numel);
  gather(f, scratch_.data());
  const float* at = included == FoldIncluded::kAtSend ? f.at_send.data() : f.previous_base.data();
  fold(scratch_.data(), f.base.data(), at, mode, alpha, f.numel);
  scatter(f, scratch_.data());
}

void CpuBackend::sync_shift_at_send(int p) {
  SyncFragment& f = fragment(p);
  for (size_t i = 0; i < f.numel; i++) f.at_send[i] += f.base[i] - f.previous_base[i];
}

void CpuBackend::sync_read_base(int p, float* packed) const {
  DL_CHECK(p >= 0 && p < (int)sync_.size(), "fragment %d of %zu", p, sync_.size());
  std::copy(sync_[p].base.begin(), sync_[p].base.end(), packed);
}

void CpuBackend::next_token_logits(const int* tokens, int T, float* out) {
  const int V = model_.config().vocab_size;
  model_.forward(tokens, nullptr, 1, T);
  std::copy_n(model_.logits() + (size_t)(T - 1) * V, V, out);
}

}  // namespace diloco
