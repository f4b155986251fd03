// The backend interface (kernels/backend.h): the CPU backend is train_step
// bit for bit; CreateBackend's errors say what to do.
#include "kernels/backend.h"

#include <cstring>
#include <string>

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
