// The CPU training backend: the fp32 Gpt + train_step of kernels/, behind
// the TrainingBackend interface (kernels/backend.h).
#pragma once

#include "kernels/backend.h"

namespace diloco {

class CpuBackend final : public TrainingBackend {
 public:
  explicit CpuBackend(const BackendOptions& options);
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  const GptConfig& config() const override { return model_.config(); }
  const TensorTable& table() const override { return model_.table(); }

  void upload_params(const float* host, size_t offset, size_t count) override;
  void download_params(float* host, size_t offset, size_t count) const override;
  float* param_buffer() override { return model_.params(); }
  size_t param_buffer_floats() const override { return buffer_floats_; }
  void params_written(size_t, size_t) override {}  // no second copy on the CPU
  void download_optimizer(AdamWState* out) const override;
  void upload_optimizer(const AdamWState& state) override;
  ParamRange optimizer_range() const override { return shard_; }
  ShardMode shard() const override { return shard_mode_; }
  CommStatus sharded_train_step(LocalComm& comm, const int* inputs, const int* targets, int B, int T,
                                const AdamWHyper& hp, double grad_clip, StepStats* stats) override;

  double forward_backward(const int* inputs, const int* targets, int B, int T) override;
  float* grad_buffer() override { return model_.grads(); }
  MemorySpace grad_memory() const override { return MemorySpace::kHost; }
  // A rank of shard kGradients keeps its shard of the gradients only: the rest reads as zeros.
  void download_grads(float* host) const override;
  StepStats apply_update(double loss, const AdamWHyper& hp, double grad_clip) override;
  double eval_loss(const int* inputs, const int* targets, int B, int T) override;
  size_t activation_bytes() const override { return model_.activation_bytes(); }
  Allocated allocated() const override;
  void next_token_logits(const int* tokens, int T, float* out) override;

  void sync_setup(const std::vector<std::vector<ParamRange>>& fragments) override;
  void sync_install(int p, const float* packed) override;
  bool sync_encode_delta(int p, SyncCodec kind, int block, std::vector<uint8_t>* payload,
                         std::vector<uint64_t>* range_bytes) override;
  void sync_reset_residual(int p) override;
  bool sync_apply_update(int p, const uint8_t* payload, size_t bytes, SyncCodec kind, int block) override;
  void sync_fold(int p, FoldMode mode, double alpha, FoldIncluded included) override;
  void sync_shift_at_send(int p) override;
  void sync_read_base(int p, float* packed) const override;

  Gpt& model() { return model_; }

 private:
  // A fragment's outer-sync state (packed vectors; see TrainingBackend).
  struct SyncFragment {
    std::vector<ParamRange> ranges;
    size_t numel = 0;
    std::vector<float> base, previous_base, at_send, residual;
  };
  SyncFragment& fragment(int p);
  void gather(const SyncFragment& f, float* packed) const;
  void scatter(const SyncFragment& f, const float* packed);

  class ShardedGrads;  // kGradients: the GradSink that reduce-scatters each bucket (cpp)

  // The mean gradients of this rank's shard, into the rank's part of the model's gradients
  // (kOptimizer) or into sharded_grads_ (kGradients); nullptr with *status set when the ring failed.
  const float* ReduceShardGradients(LocalComm& comm, CommStatus* status);

  Gpt model_;
  // Sharded rings: this rank keeps AdamW moments for shard_ only (the whole table unsharded), and
  // with kGradients the model keeps no gradient buffer: sharded_grads_ holds the shard's.
  ShardMode shard_mode_;
  std::vector<size_t> shard_counts_;   // every rank's real values, ShardCounts(num_params, world)
  std::vector<size_t> padded_counts_;  // ShardPaddedCounts: the parts of the padded buffers
  size_t buffer_floats_ = 0;           // of the model's params and grads: num_params or padded
  ParamRange shard_;
  std::unique_ptr<ShardedGrads> sharded_grads_;
  AdamWState optimizer_;
  std::vector<SyncFragment> sync_;
  std::vector<float> scratch_, scratch2_, residual_scratch_;
};

}  // namespace diloco
