// The backend-independent parts of kernels/backend.h.
#include <vector>

#include "kernels/backend.h"
#include "kernels/check.h"

namespace diloco {

void TrainingBackend::init_weights(uint64_t seed) {
  std::vector<float> params(num_params());
  gpt_init_params(config(), seed, params.data());
  upload_params(params.data());
}

size_t TrainingBackend::checked_fragment_numel(const std::vector<ParamRange>& ranges) const {
  size_t numel = 0;
  for (const ParamRange& r : ranges) {
    DL_CHECK(r.offset + r.count <= num_params(), "fragment range [%zu, +%zu) outside %zu", r.offset, r.count,
             num_params());
    numel += r.count;
  }
  return numel;
}

CommStatus TrainingBackend::sharded_train_step(LocalComm&, const int*, const int*, int, int, const AdamWHyper&,
                                               double, StepStats*) {
  return CommStatus::Error("the " + name() + " backend does not shard its state yet: set train.shard: none");
}

CommStatus ring_train_step(TrainingBackend& backend, LocalComm& comm, const int* inputs, const int* targets, int B,
                           int T, const AdamWHyper& hp, double grad_clip, StepStats* stats) {
  DL_CHECK(comm.memory() == backend.grad_memory(),
           "ring %s and backend %s keep buffers in different memories", comm.name().c_str(),
           backend.name().c_str());
  if (backend.shard() != ShardMode::kNone)
    return backend.sharded_train_step(comm, inputs, targets, B, T, hp, grad_clip, stats);
  double loss = backend.forward_backward(inputs, targets, B, T);
  if (comm.world_size() > 1) {
    CommStatus st = comm.all_reduce(backend.grad_buffer(), backend.num_params(), ReduceOp::kMean);
    if (!st.ok()) return st;
    // A NaN on any rank makes the mean NaN: every rank then skips together.
    st = comm.all_reduce_host(&loss, 1, ReduceOp::kMean);
    if (!st.ok()) return st;
  }
  *stats = backend.apply_update(loss, hp, grad_clip);
  return CommStatus::Ok();
}

}  // namespace diloco
