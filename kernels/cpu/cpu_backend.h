// The CPU training backend: the fp32 Gpt + train_step of kernels/, behind
// the TrainingBackend interface (kernels/backend.h).
#pragma once

#include "kernels/backend.h"

namespace diloco {

class CpuBackend final : public TrainingBackend {
 public:
  explicit CpuBackend(const BackendOptions& options);

  std::string name() const override { return "cpu"; }
  const GptConfig& config() const override { return model_.config(); }
  const TensorTable& table() const override { return model_.table(); }

  void upload_params(const float* host, size_t offset, size_t count) override;
  void download_params(float* host, size_t offset, size_t count) const override;
  float* param_buffer() override { return model_.params(); }
  void params_written(size_t, size_t) override {}  // no second copy on the CPU
  void download_optimizer(AdamWState* out) const override { *out = optimizer_; }
  void upload_optimizer(const AdamWState& state) override { optimizer_ = state; }

  double forward_backward(const int* inputs, const int* targets, int B, int T) override;
  float* grad_buffer() override { return model_.grads(); }
  MemorySpace grad_memory() const override { return MemorySpace::kHost; }
  void download_grads(float* host) const override;
  StepStats apply_update(double loss, const AdamWHyper& hp, double grad_clip) override;
  double eval_loss(const int* inputs, const int* targets, int B, int T) override;
  size_t activation_bytes() const override { return model_.activation_bytes(); }
  void next_token_logits(const int* tokens, int T, float* out) override;

  Gpt& model() { return model_; }

 private:
  Gpt model_;
  AdamWState optimizer_;
};

}  // namespace diloco
