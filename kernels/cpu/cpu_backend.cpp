#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/check.h"
#include "kernels/grad_clip.h"

namespace diloco {

CpuBackend::CpuBackend(const BackendOptions& options)
    : model_(options.model, options.max_batch, GptOptions{options.recompute}), shard_mode_(options.shard) {
  shard_ = {0, num_params()};
  if (shard_mode_ != ShardMode::kNone) {
    shard_counts_ = ShardCounts(num_params(), options.world);
    shard_ = {PartOffset(shard_counts_, options.rank), shard_counts_[options.rank]};
  }
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
  model_.zero_grad();
  model_.backward();
  float* grads = model_.grads();
  if (CommStatus st = comm.reduce_scatter(grads, shard_counts_, ReduceOp::kMean); !st.ok()) return st;
  // Every norm chunk lies in one shard: each rank sums its own, the ring adds zeros to the rest.
  std::vector<double> partial((num_params() + kNormChunk - 1) / kNormChunk, 0.0);
  norm_chunk_sums(grads + shard_.offset, shard_.count, partial.data() + shard_.offset / kNormChunk);
  if (CommStatus st = comm.all_reduce_host(partial.data(), (int)partial.size(), ReduceOp::kSum); !st.ok()) return st;
  s.grad_norm = norm_of_chunk_sums(partial.data(), partial.size());
  *stats = s;
  if (!std::isfinite(s.grad_norm)) return CommStatus::Ok();
  AdamWHyper clipped = hp;
  clipped.grad_scale = hp.grad_scale * clip_scale(s.grad_norm, grad_clip);
  adamw_step_range(model_.params(), grads, optimizer_, model_.table(), clipped, shard_.offset, shard_.count);
  if (CommStatus st = comm.all_gather(model_.params(), shard_counts_); !st.ok()) return st;
  stats->applied = true;
  return CommStatus::Ok();
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
  std::memcpy(host, model_.grads(), num_params() * sizeof(float));
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
