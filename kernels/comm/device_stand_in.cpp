#include "kernels/comm/device_stand_in.h"

namespace diloco {

namespace {

class DeviceStandIn final : public TrainingBackend {
 public:
  DeviceStandIn(std::unique_ptr<TrainingBackend> b, std::shared_ptr<DeviceAllocations> device)
      : b_(std::move(b)), device_(std::move(device)) {
    // The buffers the daemon may hand to the ring: on a GPU, the engine's device allocations.
    params_ = b_->param_buffer();
    grads_ = b_->grad_buffer();  // none on a ZeRO-2 rank
    device_->Add(params_, b_->param_buffer_floats() * sizeof(float));
    if (grads_) device_->Add(grads_, b_->param_buffer_floats() * sizeof(float));
  }
  ~DeviceStandIn() override {
    device_->Remove(params_);
    if (grads_) device_->Remove(grads_);
  }

  using TrainingBackend::download_params;
  using TrainingBackend::upload_params;
  std::string name() const override { return b_->name() + " (standing in for a device)"; }
  const GptConfig& config() const override { return b_->config(); }
  const TensorTable& table() const override { return b_->table(); }
  void upload_params(const float* host, size_t offset, size_t count) override { b_->upload_params(host, offset, count); }
  void download_params(float* host, size_t offset, size_t count) const override {
    b_->download_params(host, offset, count);
  }
  float* param_buffer() override { return b_->param_buffer(); }
  size_t param_buffer_floats() const override { return b_->param_buffer_floats(); }
  void params_written(size_t offset, size_t count) override { b_->params_written(offset, count); }
  void download_optimizer(AdamWState* out) const override { b_->download_optimizer(out); }
  void upload_optimizer(const AdamWState& state) override { b_->upload_optimizer(state); }
  ParamRange optimizer_range() const override { return b_->optimizer_range(); }
  ShardMode shard() const override { return b_->shard(); }
  double forward_backward(const int* inputs, const int* targets, int B, int T) override {
    return b_->forward_backward(inputs, targets, B, T);
  }
  float* grad_buffer() override { return b_->grad_buffer(); }
  MemorySpace grad_memory() const override { return MemorySpace::kDevice; }
  void download_grads(float* host) const override { b_->download_grads(host); }
  StepStats apply_update(double loss, const AdamWHyper& hp, double grad_clip) override {
    return b_->apply_update(loss, hp, grad_clip);
  }
  CommStatus sharded_train_step(LocalComm& comm, const int* inputs, const int* targets, int B, int T,
                                const AdamWHyper& hp, double grad_clip, StepStats* stats) override {
    // The engine's own collectives: on a GPU their buffers are its device arrays (the CPU
    // engine's ZeRO-2 buckets are host vectors, which stand for them here).
    DeviceAllocations::EngineScope engine;
    return b_->sharded_train_step(comm, inputs, targets, B, T, hp, grad_clip, stats);
  }
  void next_token_logits(const int* tokens, int T, float* out) override { b_->next_token_logits(tokens, T, out); }
  size_t activation_bytes() const override { return b_->activation_bytes(); }
  Allocated allocated() const override { return b_->allocated(); }
  void sync_setup(const std::vector<std::vector<ParamRange>>& fragments) override { b_->sync_setup(fragments); }
  void sync_install(int p, const float* packed) override { b_->sync_install(p, packed); }
  bool sync_encode_delta(int p, SyncCodec kind, int block, std::vector<uint8_t>* payload,
                         std::vector<uint64_t>* range_bytes) override {
    return b_->sync_encode_delta(p, kind, block, payload, range_bytes);
  }
  void sync_reset_residual(int p) override { b_->sync_reset_residual(p); }
  bool sync_apply_update(int p, const uint8_t* payload, size_t bytes, SyncCodec kind, int block) override {
    return b_->sync_apply_update(p, payload, bytes, kind, block);
  }
  void sync_fold(int p, FoldMode mode, double alpha, FoldIncluded included) override {
    b_->sync_fold(p, mode, alpha, included);
  }
  void sync_shift_at_send(int p) override { b_->sync_shift_at_send(p); }
  void sync_read_base(int p, float* packed) const override { b_->sync_read_base(p, packed); }
  double eval_loss(const int* inputs, const int* targets, int B, int T) override {
    return b_->eval_loss(inputs, targets, B, T);
  }

 private:
  std::unique_ptr<TrainingBackend> b_;
  std::shared_ptr<DeviceAllocations> device_;
  float* params_ = nullptr;
  float* grads_ = nullptr;
};

}  // namespace

std::unique_ptr<TrainingBackend> StandInForDevice(std::unique_ptr<TrainingBackend> host,
                                                  std::shared_ptr<DeviceAllocations> device) {
  return std::make_unique<DeviceStandIn>(std::move(host), std::move(device));
}

}  // namespace diloco
