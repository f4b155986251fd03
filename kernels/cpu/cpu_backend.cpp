#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/check.h"
#include "kernels/grad_clip.h"

namespace diloco {

CpuBackend::CpuBackend(const BackendOptions& options) : model_(options.model, options.max_batch) {}

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

void CpuBackend::next_token_logits(const int* tokens, int T, float* out) {
  const int V = model_.config().vocab_size;
  model_.forward(tokens, nullptr, 1, T);
  std::copy_n(model_.logits() + (size_t)(T - 1) * V, V, out);
}

}  // namespace diloco
