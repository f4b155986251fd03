// The CUDA backend's sharded state (train.shard: ZeRO-1 and ZeRO-2), activation recompute
// (train.recompute) and allocated(), on the GPU.
//
// A ring of several ranks needs several GPUs for NCCL (it refuses two ranks on one device), and
// the lent machine has one. So the sharding logic (reduce-scatter parts, buckets straddling shard
// edges, norm chunk sums, the all-gather, ranks that own nothing) is checked on rings of 1, 2 and 4
// CudaBackends sharing GPU 0 whose collectives are the thread ring's, staged through host memory
// (StagedComm below): the threads sum in rank order for all-reduce and reduce-scatter alike, so
// the sharded ring must end at the unsharded ring's bits. Over NCCL: 2 GPUs when present (two
// ranks: one add per value, the same bits whichever collective), else a 1-rank NCCL ring.
//
// Tagged [cuda]: without a CUDA device every case WARNs and returns (Catch2 v2 has no SKIP).
// Written and compiled on a machine without a GPU: until scripts/gpu-check.sh has run on one,
// nothing here has been observed to pass.
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/comm/local_comm.h"
#include "kernels/cuda/device.h"
#include "tests/kernels/cuda_testing.h"
#include "tests/kernels/op_testing.h"

namespace diloco {
namespace {

// A thread ring's collectives on device buffers: each copies the buffer to the host, runs the
// thread ring's collective there (rank-order sums) and copies it back.
class StagedComm final : public LocalComm {
 public:
  explicit StagedComm(std::unique_ptr<LocalComm> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  MemorySpace memory() const override { return MemorySpace::kDevice; }
  std::string name() const override { return "threads staged over cuda:0"; }
  CommStatus all_reduce(float* buf, size_t count, ReduceOp op) override {
    return staged(buf, count, [&](float* h) { return inner_->all_reduce(h, count, op); });
  }
  CommStatus broadcast(float* buf, size_t count, int root) override {
    return staged(buf, count, [&](float* h) { return inner_->broadcast(h, count, root); });
  }
  CommStatus broadcast_host(float* values, size_t count, int root) override {
    return inner_->broadcast(values, count, root);
  }
  CommStatus all_gather_host(float* values, const std::vector<size_t>& counts) override {
    return inner_->all_gather(values, counts);
  }
  CommStatus barrier() override { return inner_->barrier(); }
  CommStatus all_reduce_host(double* values, int count, ReduceOp op) override {
    return inner_->all_reduce_host(values, count, op);
  }
  CommStatus reduce_scatter(float* buf, const std::vector<size_t>& counts, ReduceOp op) override {
    return staged(buf, total(counts), [&](float* h) { return inner_->reduce_scatter(h, counts, op); });
  }
  CommStatus all_gather(float* buf, const std::vector<size_t>& counts) override {
    return staged(buf, total(counts), [&](float* h) { return inner_->all_gather(h, counts); });
  }
  // The stream-ordered collectives: the host waits for the caller's stream (which waits for the
  // work that wrote buf), then runs the staged collective; what follows on the stream comes after.
  CommStatus reduce_scatter_on(void* stream, float* buf, const std::vector<size_t>& counts, ReduceOp op) override {
    cuda::synchronize(static_cast<cuda::Stream>(stream));
    return reduce_scatter(buf, counts, op);
  }
  CommStatus all_gather_on(void* stream, float* buf, const std::vector<size_t>& counts) override {
    cuda::synchronize(static_cast<cuda::Stream>(stream));
    return all_gather(buf, counts);
  }
  CommStatus wait_stream(void* stream) override {
    cuda::synchronize(static_cast<cuda::Stream>(stream));
    return CommStatus::Ok();
  }

 private:
  static size_t total(const std::vector<size_t>& counts) {
    size_t n = 0;
    for (size_t c : counts) n += c;
    return n;
  }
  template <typename F>
  CommStatus staged(float* buf, size_t count, F&& op) {
    host_.resize(count);
    if (count) cuda::copy_to_host(host_.data(), buf, count * sizeof(float));
    CommStatus st = op(host_.data());
    if (st.ok() && count) cuda::copy_to_device(buf, host_.data(), count * sizeof(float));
    return st;
  }
  std::unique_ptr<LocalComm> inner_;
  std::vector<float> host_;
};

GptConfig ring_config(int n_embd) {
  GptConfig c;
  c.vocab_size = 256;
  c.block_size = 32;
  c.n_layer = 2;
  c.n_embd = n_embd;
  c.n_head = 2;
  return c;
}

// Rank r's batch of step s: learnable targets, different rows per rank.
void batch_of(int step, int rank, int B, int T, std::vector<int>* in, std::vector<int>* tg) {
  in->resize((size_t)B * T);
  tg->resize((size_t)B * T);
  for (int i = 0; i < B * T; i++) {
    (*in)[i] = (int)((i * 31u + step * 17u + rank * 101u + (i / T) * 7u) % 256u);
    (*tg)[i] = ((*in)[i] * 5 + 3) % 256;
  }
}

enum class Ring { kStaged, kNccl };

struct RingRun {
  std::vector<std::vector<float>> params;  // per rank, after the steps
  AdamWState optimizer;                    // gathered from every rank
  std::vector<StepStats> last;             // per rank
  std::vector<TrainingBackend::Allocated> used;
  std::string error;
};

// `steps` steps of a ring of R CUDA ranks from init seed 3 (batch B, length T).
RingRun run_ring(const GptConfig& c, int B, int T, int R, ShardMode shard, bool recompute, Ring ring, int steps,
                 double clip) {
  RingRun out;
  std::unique_ptr<LocalCommGroup> group;
  std::vector<std::unique_ptr<LocalComm>> comms;
  if (ring == Ring::kStaged) {
    group = std::make_unique<ThreadCommGroup>(R);
    for (int r = 0; r < R; r++) comms.push_back(std::make_unique<StagedComm>(group->comm(r)));
  } else {
    if (std::string err = CreateLocalCommGroup("cuda", R, &group); !err.empty()) {
      out.error = err;
      return out;
    }
    for (int r = 0; r < R; r++) comms.push_back(group->comm(r));
  }
  std::vector<std::unique_ptr<TrainingBackend>> backends(R);
  for (int r = 0; r < R; r++) {
    BackendOptions o{c, B};
    o.recompute = recompute;
    o.shard = shard;
    o.rank = r;
    o.world = R;
    const std::string device = ring == Ring::kNccl ? "cuda:" + std::to_string(r) : "cuda:0";
    if (std::string err = CreateBackend(device, o, &backends[r]); !err.empty()) {
      out.error = err;
      return out;
    }
    backends[r]->init_weights(3);
  }
  out.last.resize(R);
  std::vector<std::string> errors(R);
  const AdamWHyper hp{.lr = 3e-3f, .weight_decay = 0.1f};
  std::vector<std::thread> threads;
  for (int r = 0; r < R; r++) {
    threads.emplace_back([&, r] {
      std::vector<int> in, tg;
      for (int s = 0; s < steps && errors[r].empty(); s++) {
        batch_of(s, r, B, T, &in, &tg);
        const CommStatus st = ring_train_step(*backends[r], *comms[r], in.data(), tg.data(), B, T, hp, clip, &out.last[r]);
        if (!st.ok()) errors[r] = st.error;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < R; r++) {
    if (!errors[r].empty()) out.error = "rank " + std::to_string(r) + ": " + errors[r];
    out.params.emplace_back(backends[r]->num_params());
    backends[r]->download_params(out.params.back().data());
    backends[r]->download_optimizer(&out.optimizer);  // sharded: each rank writes its range
    out.used.push_back(backends[r]->allocated());
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void check_same_run(const RingRun& plain, const RingRun& other) {
  REQUIRE(plain.error.empty());
  REQUIRE(other.error.empty());
  for (size_t r = 0; r < plain.params.size(); r++) {
    CAPTURE(r);
    CHECK(other.last[r].applied);
    CHECK(other.last[r].loss == plain.last[r].loss);
    CHECK(other.last[r].grad_norm == plain.last[r].grad_norm);
    CHECK(same_bits(other.params[r], plain.params[r]));
  }
  CHECK(other.optimizer.step == plain.optimizer.step);
  CHECK(same_bits(other.optimizer.m, plain.optimizer.m));
  CHECK(same_bits(other.optimizer.v, plain.optimizer.v));
}

}  // namespace

TEST_CASE("cuda: a sharded ring (ZeRO-1 and ZeRO-2) trains bit for bit as the unsharded ring", "[cuda][zero]") {
  REQUIRE_CUDA_DEVICE();
  // 64 wide: ~120k parameters, 8 norm chunks, so every rank of 2 and 4 owns a part and ZeRO-2's
  // buckets straddle shard edges (3 ranks: shards of 3 chunks, the last one's cut at the table's
  // end, so the padded buffers' pads are real); 16 wide: ~11k parameters, one chunk, so ranks 1..
  // own nothing.
  for (int width : {64, 16}) {
    for (int R : {1, 2, 3, 4}) {
      for (double clip : {1.0, 0.0}) {
        CAPTURE(width, R, clip);
        const GptConfig c = ring_config(width);
        const RingRun plain = run_ring(c, 4, 32, R, ShardMode::kNone, false, Ring::kStaged, 12, clip);
        for (ShardMode mode : {ShardMode::kOptimizer, ShardMode::kGradients}) {
          CAPTURE(kShardModeNames[(int)mode]);
          check_same_run(plain, run_ring(c, 4, 32, R, mode, false, Ring::kStaged, 12, clip));
        }
      }
    }
  }
}

TEST_CASE("cuda: a sharded NCCL ring trains bit for bit as the unsharded one", "[cuda][zero][nccl]") {
  REQUIRE_CUDA_DEVICE();
  if (cuda::device_count() < 2) WARN("one GPU: the 2-rank NCCL ring is skipped; checking a 1-rank NCCL ring");
  const int R = cuda::device_count() >= 2 ? 2 : 1;
  const GptConfig c = ring_config(64);
  const RingRun plain = run_ring(c, 4, 32, R, ShardMode::kNone, false, Ring::kNccl, 12, 1.0);
  if (plain.error.find("no NCCL") != std::string::npos) {
    WARN("built without NCCL: " << plain.error);
    return;
  }
  for (ShardMode mode : {ShardMode::kOptimizer, ShardMode::kGradients}) {
    CAPTURE(R, kShardModeNames[(int)mode]);
    check_same_run(plain, run_ring(c, 4, 32, R, mode, false, Ring::kNccl, 12, 1.0));
  }
}

// Bitwise where cuBLASLt sees the same pointer alignments in both paths (its algorithm choice
// depends on them): every per-layer slot offset max_batch*T*C*2 bytes must be a multiple of 256,
// i.e. max_batch*T*C a multiple of 128, as in these shapes (one with B < max_batch).
TEST_CASE("cuda: recompute gives the stored-activation path's loss and gradients bit for bit", "[cuda][recompute]") {
  REQUIRE_CUDA_DEVICE();
  struct Shape {
    int L, C, NH, T, maxB, B;
  };
  for (const Shape& sh : {Shape{2, 64, 4, 32, 4, 4}, Shape{3, 128, 2, 64, 4, 2}, Shape{1, 64, 1, 128, 2, 2},
                          Shape{4, 64, 4, 32, 8, 4}}) {
    CAPTURE(sh.L, sh.C, sh.NH, sh.T, sh.maxB, sh.B);
    GptConfig c;
    c.vocab_size = 256;
    c.block_size = sh.T;
    c.n_layer = sh.L;
    c.n_embd = sh.C;
    c.n_head = sh.NH;
    std::unique_ptr<TrainingBackend> stored, again;
    BackendOptions o{c, sh.maxB};
    REQUIRE(CreateBackend("cuda", o, &stored).empty());
    o.recompute = true;
    REQUIRE(CreateBackend("cuda", o, &again).empty());
    // Recompute keeps one block's activations instead of L: with one layer it saves nothing (the
    // 1-layer shape is here for the bits, not the memory).
    if (sh.L > 1) CHECK(again->activation_bytes() < stored->activation_bytes());
    stored->init_weights(7);
    again->init_weights(7);
    std::vector<int> in, tg;
    const AdamWHyper hp{.lr = 3e-3f, .weight_decay = 0.1f};
    for (int s = 0; s < 4; s++) {
      CAPTURE(s);
      batch_of(s, 0, sh.B, sh.T, &in, &tg);
      const double a = stored->forward_backward(in.data(), tg.data(), sh.B, sh.T);
      const double b = again->forward_backward(in.data(), tg.data(), sh.B, sh.T);
      CHECK(a == b);
      std::vector<float> ga(stored->num_params()), gb(again->num_params());
      stored->download_grads(ga.data());
      again->download_grads(gb.data());
      CHECK(same_bits(ga, gb));
      REQUIRE(stored->apply_update(a, hp, 1.0).applied);
      REQUIRE(again->apply_update(b, hp, 1.0).applied);
    }
    std::vector<float> pa(stored->num_params()), pb(again->num_params());
    stored->download_params(pa.data());
    again->download_params(pb.data());
    CHECK(same_bits(pa, pb));
    // The logits too (eval and sampling run the same forward).
    std::vector<float> la(c.vocab_size), lb(c.vocab_size);
    stored->next_token_logits(in.data(), sh.T, la.data());
    again->next_token_logits(in.data(), sh.T, lb.data());
    CHECK(same_bits(la, lb));
  }
}

TEST_CASE("cuda: ZeRO-2 with recompute on a ring of 2 ends at the plain ring's bits", "[cuda][zero][recompute]") {
  REQUIRE_CUDA_DEVICE();
  const GptConfig c = ring_config(64);
  const RingRun plain = run_ring(c, 4, 32, 2, ShardMode::kNone, false, Ring::kStaged, 10, 1.0);
  check_same_run(plain, run_ring(c, 4, 32, 2, ShardMode::kGradients, true, Ring::kStaged, 10, 1.0));
}

// What the backend reports holding, by component, against what the sharding says, and the device
// memory its construction took (cudaMemGetInfo) against their sum.
TEST_CASE("cuda: allocated() counts what the backend holds", "[cuda][memory]") {
  REQUIRE_CUDA_DEVICE();
  // ~15M parameters and ~170 MiB of activations: large enough that the bounds below mean something.
  GptConfig c;
  c.vocab_size = 4096;
  c.block_size = 256;
  c.n_layer = 4;
  c.n_embd = 512;
  c.n_head = 8;
  const TensorTable table = gpt_tensor_table(c);
  const size_t n = table.total_numel();
  const size_t embed = table.find("wte")->numel + table.find("wpe")->numel;
  const size_t block = table.find("h.1.ln_1.weight")->offset - table.find("h.0.ln_1.weight")->offset;
  const int R = 4;
  const std::vector<size_t> counts = ShardCounts(n, R);
  for (ShardMode mode : {ShardMode::kNone, ShardMode::kOptimizer, ShardMode::kGradients}) {
    for (int r = 0; r < R; r++) {
      CAPTURE(kShardModeNames[(int)mode], r);
      BackendOptions o{c, 8};
      o.shard = mode;
      o.rank = r;
      o.world = R;
      const size_t before = cuda::device_memory_used_bytes();
      std::unique_ptr<TrainingBackend> b;
      REQUIRE(CreateBackend("cuda", o, &b).empty());
      const size_t taken = cuda::device_memory_used_bytes() - before;
      const TrainingBackend::Allocated a = b->allocated();
      const size_t shard = mode == ShardMode::kNone ? n : counts[r];
      // Sharded, the fp32 parameters (and ZeRO-1's gradients) are padded to R equal shards.
      const size_t buffer = mode == ShardMode::kNone ? n : ShardPaddedFloats(n, R);
      CHECK(a.params == buffer * 4);
      CHECK(a.params_low == n * 2);
      CHECK(a.moments == 2 * shard * 4);
      // ZeRO-2: the shard plus three buckets, the embeddings' and two blocks' (double-buffered),
      // each with up to 63 floats of alignment pad.
      CHECK(a.grads == (mode == ShardMode::kGradients ? (shard + embed + 2 * block + 3 * 63) * 4 : buffer * 4));
      CHECK(a.activations == b->activation_bytes());
      const size_t sum = a.params + a.params_low + a.grads + a.moments + a.outer_state - a.outer_state_host + a.activations;
      INFO("device memory taken " << taken << " bytes, allocated() " << sum);
      // cudaMemGetInfo counts whole pages, the cuBLASLt workspace (32 MiB) and small index arrays.
      CHECK(taken + (size_t{16} << 20) >= sum);
      CHECK(taken <= sum + (size_t{96} << 20));
    }
  }
}

}  // namespace diloco
