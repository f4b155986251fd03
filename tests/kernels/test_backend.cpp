// The backend interface (kernels/backend.h): the CPU backend is train_step
// bit for bit; CreateBackend's errors say what to do.
#include "kernels/backend.h"

#include <cstring>
#include <string>

#include "daemon/net/codec.h"
#include "daemon/sync/fold.h"
#include "tests/kernels/op_testing.h"

namespace diloco {
using namespace diloco::testing;

namespace {

GptConfig small_config() {
  GptConfig c;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_embd = 16;
  c.n_head = 4;
  return c;
}

std::vector<int> random_tokens(size_t n, uint64_t seed, int V) {
  Rng rng(seed);
  std::vector<int> t(n);
  for (int& x : t) x = (int)rng.below(V);
  return t;
}

}  // namespace

TEST_CASE("cpu backend steps exactly like train_step", "[unit][kernels]") {
  const GptConfig c = small_config();
  const int B = 3, T = 16;
  std::unique_ptr<TrainingBackend> backend;
  REQUIRE(CreateBackend("cpu", BackendOptions{c, B}, &backend).empty());
  CHECK(backend->name() == "cpu");
  CHECK(backend->grad_memory() == MemorySpace::kHost);
  backend->init_weights(11);
  Gpt model(c, B);
  model.init_weights(11);
  AdamWState opt;
  const AdamWHyper hp{.lr = 3e-3f, .weight_decay = 0.1f};
  for (int step = 0; step < 3; step++) {
    const auto in = random_tokens(B * T, 20 + step, c.vocab_size), tg = random_tokens(B * T, 40 + step, c.vocab_size);
    const StepStats a = backend->train_step(in.data(), tg.data(), B, T, hp, 0.5);
    const StepStats b = train_step(model, opt, in.data(), tg.data(), B, T, hp, 0.5);
    CHECK(a.loss == b.loss);
    CHECK(a.grad_norm == b.grad_norm);
    CHECK(a.applied);
  }
  std::vector<float> p(backend->num_params());
  backend->download_params(p.data());
  CHECK(std::memcmp(p.data(), model.params(), p.size() * sizeof(float)) == 0);
  AdamWState st;
  backend->download_optimizer(&st);
  CHECK(st.step == opt.step);
  CHECK(st.m == opt.m);
  // Ranged upload and eval.
  const float x = 0.125f;
  backend->upload_params(&x, 5, 1);
  backend->download_params(p.data());
  CHECK(p[5] == x);
  const auto in = random_tokens(B * T, 1, c.vocab_size);
  CHECK(std::isfinite(backend->eval_loss(in.data(), in.data(), B, T)));
}

TEST_CASE("CreateBackend explains what it cannot make", "[unit][kernels]") {
  std::unique_ptr<TrainingBackend> backend;
  const BackendOptions options{small_config(), 1};
  CHECK(CreateBackend("tpu", options, &backend).find("use cpu, cuda or cuda:N") != std::string::npos);
  BackendOptions bad = options;
  bad.model.n_head = 5;
  CHECK(CreateBackend("cpu", bad, &backend).find("multiple of n_head") != std::string::npos);
  CHECK(BackendCompiled("cpu"));
  const std::string err = CreateBackend("cuda", options, &backend);
  if (!BackendCompiled("cuda")) {
    CHECK(err.find("no CUDA backend") != std::string::npos);
  } else if (!err.empty()) {
    // Built with CUDA, but this machine has no device.
    CHECK(err.find("no CUDA device") != std::string::npos);
  }
  if (BackendCompiled("cuda")) CHECK(CreateBackend("cuda:x", options, &backend).find("cuda:N") != std::string::npos);
}

}  // namespace diloco

namespace diloco {
namespace {

// The learner's outer sync as it ran on the host before it moved onto the backend: the wire
// codec with error feedback (daemon/net/codec.h) and the fold of kernels/sync_ops.h.
struct HostMirror {
  std::vector<ParamRange> ranges;
  std::vector<float> base, previous_base, at_send;
  std::vector<uint64_t> numels() const {
    std::vector<uint64_t> n;
    for (const ParamRange& r : ranges) n.push_back(r.count);
    return n;
  }
  std::vector<float> Gather(const TrainingBackend& b) const {
    std::vector<float> all(b.num_params()), out;
    b.download_params(all.data());
    for (const ParamRange& r : ranges) out.insert(out.end(), all.begin() + r.offset, all.begin() + r.offset + r.count);
    return out;
  }
};

void TrainOneStep(TrainingBackend& b, uint64_t seed) {
  const int B = 2, T = 16;
  const auto in = random_tokens((size_t)B * T, seed, 256), tg = random_tokens((size_t)B * T, seed + 1, 256);
  AdamWHyper hp;
  hp.lr = 1e-2f;
  REQUIRE(b.train_step(in.data(), tg.data(), B, T, hp, 1.0).applied);
}

}  // namespace

TEST_CASE("cpu backend sync ops: the learner's host codec and fold, bit for bit", "[unit][kernels]") {
  std::unique_ptr<TrainingBackend> backend;
  REQUIRE(CreateBackend("cpu", BackendOptions{small_config(), 2}, &backend).empty());
  backend->init_weights(3);
  HostMirror h;
  h.ranges = {{0, 100}, {500, 77}};  // a fragment of two ranges, packed back to back
  backend->sync_setup({h.ranges, {{1000, 300}}});
  h.base = h.Gather(*backend);
  std::vector<float> base_read(h.base.size());
  backend->sync_read_base(0, base_read.data());
  CHECK(base_read == h.base);

  // Two deltas (the second carries the first's residual): the bytes of the wire codec.
  ErrorFeedback ef(CodecOptions{CodecKind::kInt4, 64, 0});
  for (int round = 0; round < 2; round++) {
    TrainOneStep(*backend, 10 + round);
    const std::vector<float> theta = h.Gather(*backend);
    std::vector<float> delta(theta.size());
    for (size_t i = 0; i < delta.size(); i++) delta[i] = h.base[i] - theta[i];
    std::vector<uint8_t> want, got;
    std::vector<uint64_t> want_bytes, got_bytes;
    REQUIRE(ef.Encode(0, delta, h.numels(), &want, &want_bytes).ok());
    REQUIRE(backend->sync_encode_delta(0, SyncCodec::kInt4, 64, &got, &got_bytes));
    CHECK(got == want);
    CHECK(got_bytes == want_bytes);
    h.at_send = theta;
  }

  // A Global's update: base += Decode(payload), then the folds.
  Rng rng(5);
  std::vector<float> update(h.base.size());
  for (float& x : update) x = 0.01f * (float)rng.normal();
  std::vector<uint8_t> payload;
  std::vector<uint64_t> tensor_bytes;
  REQUIRE(EncodeTensors(CodecOptions{CodecKind::kInt8, 64, 0}, update, h.numels(), &payload, &tensor_bytes).ok());
  std::vector<float> decoded(update.size());
  REQUIRE(DecodeTensors(CodecOptions{CodecKind::kInt8, 64, 0}, payload, h.numels(), tensor_bytes, decoded).ok());
  CHECK_FALSE(backend->sync_apply_update(0, payload.data(), payload.size() - 1, SyncCodec::kInt8, 64));
  REQUIRE(backend->sync_apply_update(0, payload.data(), payload.size(), SyncCodec::kInt8, 64));
  h.previous_base = h.base;
  for (size_t i = 0; i < h.base.size(); i++) h.base[i] += decoded[i];
  backend->sync_read_base(0, base_read.data());
  CHECK(base_read == h.base);

  // Replay of a Global without our delta: θ from the previous base, θ at send moves with the base.
  std::vector<float> theta = h.Gather(*backend);
  FoldGlobal(FoldRule::kReplay, 0.5, h.base.data(), h.previous_base.data(), theta.data(), theta.size());
  backend->sync_fold(0, FoldMode::kReplay, 0.5, FoldIncluded::kPreviousBase);
  CHECK(h.Gather(*backend) == theta);
  for (size_t i = 0; i < h.at_send.size(); i++) h.at_send[i] += h.base[i] - h.previous_base[i];
  backend->sync_shift_at_send(0);
  // ... then one with our delta: θ from θ at send (which the shift moved).
  TrainOneStep(*backend, 20);
  theta = h.Gather(*backend);
  FoldGlobal(FoldRule::kReplay, 0.5, h.base.data(), h.at_send.data(), theta.data(), theta.size());
  backend->sync_fold(0, FoldMode::kReplay, 0.5, FoldIncluded::kAtSend);
  CHECK(h.Gather(*backend) == theta);
  // Mix and overwrite.
  TrainOneStep(*backend, 30);
  theta = h.Gather(*backend);
  FoldGlobal(FoldRule::kMix, 0.3, h.base.data(), nullptr, theta.data(), theta.size());
  backend->sync_fold(0, FoldMode::kMix, 0.3, FoldIncluded::kAtSend);
  CHECK(h.Gather(*backend) == theta);
  backend->sync_fold(0, FoldMode::kOverwrite, 0, FoldIncluded::kAtSend);
  CHECK(h.Gather(*backend) == h.base);

  // A snapshot: base and θ of fragment 1 become the snapshot's values; fragment 0 is untouched.
  std::vector<float> snapshot(300, 0.125f);
  backend->sync_install(1, snapshot.data());
  HostMirror h1;
  h1.ranges = {{1000, 300}};
  CHECK(h1.Gather(*backend) == snapshot);
  std::vector<float> base1(300);
  backend->sync_read_base(1, base1.data());
  CHECK(base1 == snapshot);
  CHECK(h.Gather(*backend) == h.base);
}

}  // namespace diloco
