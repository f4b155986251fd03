#include "kernels/gpt.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>

#include "kernels/train_step.h"
#include "tests/kernels/op_testing.h"

namespace diloco {
using namespace diloco::testing;

namespace {

GptConfig tiny_config(int n_head = 4) {
  GptConfig c;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_embd = 12;
  c.n_head = n_head;
  return c;
}

// A batch cut from a fixed text, so the model sees real structure.
struct Batch {
  std::vector<int> inputs, targets;
};
Batch text_batch(int B, int T, int offset = 0) {
  const std::string text =
      "First Citizen: Before we proceed any further, hear me speak. All: Speak, speak. "
      "First Citizen: You are all resolved rather to die than to famish? All: Resolved.";
  Batch b;
  for (int i = 0; i < B; i++)
    for (int t = 0; t < T; t++) {
      const size_t k = (offset + i * 7 + t) % (text.size() - 1);
      b.inputs.push_back((unsigned char)text[k]);
      b.targets.push_back((unsigned char)text[k + 1]);
    }
  return b;
}

}  // namespace

TEST_CASE("tensor table: layout, names, digest", "[unit][model]") {
  const GptConfig c = tiny_config();
  const TensorTable t = gpt_tensor_table(c);
  const int C = c.n_embd, L = c.n_layer, V = c.vocab_size, T = c.block_size;
  const size_t expected = (size_t)V * C + (size_t)T * C + (size_t)L * (12 * C * C + 13 * C) + 2 * C;
  CHECK(t.total_numel() == expected);
  REQUIRE(t.find("h.1.attn.c_attn.weight") != nullptr);
  CHECK(t.find("h.1.attn.c_attn.weight")->shape == std::vector<int>{3 * C, C});
  CHECK(t.tensors().front().name == "wte");
  CHECK(t.tensors().back().name == "ln_f.bias");
  // Offsets are back to back.
  size_t off = 0;
  for (const TensorInfo& ti : t.tensors()) {
    CHECK(ti.offset == off);
    off += ti.numel;
  }
  CHECK(gpt_tensor_decays(*t.find("wte")));
  CHECK_FALSE(gpt_tensor_decays(*t.find("h.0.ln_1.weight")));
  CHECK_FALSE(gpt_tensor_decays(*t.find("h.0.mlp.c_fc.bias")));
  GptConfig other = c;
  other.n_embd = 16;
  CHECK(gpt_tensor_table(other).digest() != t.digest());
  CHECK(gpt_tensor_table(c).digest() == t.digest());
}

TEST_CASE("GPT-2 init statistics", "[unit][model]") {
  GptConfig c = tiny_config();
  c.n_embd = 64;
  Gpt model(c, 1);
  model.init_weights(7);
  auto stats = [&](const char* name) {
    const TensorInfo* t = model.table().find(name);
    double s = 0, s2 = 0;
    for (size_t i = 0; i < t->numel; i++) {
      const double x = model.params()[t->offset + i];
      s += x;
      s2 += x * x;
    }
    return std::pair{s / t->numel, std::sqrt(s2 / t->numel)};
  };
  CHECK(stats("wte").second == Approx(0.02).epsilon(0.05));
  CHECK(stats("h.0.mlp.c_fc.weight").second == Approx(0.02).epsilon(0.05));
  CHECK(stats("h.0.attn.c_proj.weight").second == Approx(0.02 / std::sqrt(4.0)).epsilon(0.05));
  CHECK(stats("h.1.ln_2.weight").first == 1.0);
  CHECK(stats("h.1.ln_2.bias").second == 0.0);
}

TEST_CASE("loss at init is close to ln(256)", "[unit][model]") {
  GptConfig c = tiny_config();
  c.n_embd = 32;
  Gpt model(c, 4);
  model.init_weights(1);
  const Batch b = text_batch(4, c.block_size);
  CHECK(std::fabs(model.forward(b.inputs.data(), b.targets.data(), 4, c.block_size) - std::log(256.0)) < 0.1);
}

TEST_CASE("model gradients match finite differences", "[unit][model]") {
  // n_head = 3 and odd sizes; the batch is shorter than block_size.
  GptConfig c = tiny_config(3);
  c.n_embd = 9;
  c.block_size = 11;
  const int B = 2, T = 7;
  Gpt model(c, B);
  model.init_weights(3);
  // Larger weights than GPT-2 init make every gradient clearly non-zero.
  for (size_t i = 0; i < model.num_params(); i++) model.params()[i] *= 4.0f;
  const Batch b = text_batch(B, T);
  auto loss = [&] { return model.forward(b.inputs.data(), b.targets.data(), B, T); };
  loss();
  model.zero_grad();
  model.backward();
  const std::vector<float> grads(model.grads(), model.grads() + model.num_params());

  // Directional derivative along a random direction over every parameter.
  const std::vector<float> dir = random_vec<float>(model.num_params(), 5);
  const std::vector<float> theta(model.params(), model.params() + model.num_params());
  const double eps = 1e-4;
  auto shifted = [&](double s) {
    for (size_t i = 0; i < theta.size(); i++) model.params()[i] = theta[i] + (float)(s * dir[i]);
    return loss();
  };
  const double numeric = (shifted(eps) - shifted(-eps)) / (2 * eps);
  double analytic = 0;
  for (size_t i = 0; i < grads.size(); i++) analytic += (double)grads[i] * dir[i];
  CHECK(numeric == Approx(analytic).epsilon(2e-3));
  shifted(0);

  // Element by element on a few entries of every tensor.
  for (const TensorInfo& t : model.table().tensors()) {
    for (size_t k = 0; k < 3; k++) {
      const size_t i = t.offset + (k * 7919) % t.numel;
      const float saved = model.params()[i];
      model.params()[i] = saved + 3e-3f;
      const double up = loss();
      model.params()[i] = saved - 3e-3f;
      const double down = loss();
      model.params()[i] = saved;
      const double fd = (up - down) / 6e-3;
      INFO(t.name << "[" << i - t.offset << "]: analytic " << grads[i] << ", numeric " << fd);
      CHECK(std::fabs(fd - grads[i]) <= 2e-3 * std::fabs(grads[i]) + 2e-4);
    }
  }
}

TEST_CASE("training is bitwise deterministic for a seed and thread count", "[unit][model]") {
  GptConfig c = tiny_config();
  c.n_embd = 32;
  auto run = [&] {
    Gpt model(c, 4);
    model.init_weights(42);
    AdamWState opt;
    std::vector<double> losses;
    for (int step = 0; step < 20; step++) {
      const Batch b = text_batch(4, c.block_size, step * 3);
      losses.push_back(train_step(model, opt, b.inputs.data(), b.targets.data(), 4, c.block_size,
                                  AdamWHyper{.lr = 1e-3f, .weight_decay = 0.1f}, 1.0)
                           .loss);
    }
    return losses;
  };
  const std::vector<double> a = run(), b = run();
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
  CHECK(a.back() < a.front());
}

TEST_CASE("the model overfits one batch", "[unit][model]") {
  GptConfig c = tiny_config();
  c.n_embd = 32;
  c.block_size = 32;
  Gpt model(c, 4);
  model.init_weights(9);
  AdamWState opt;
  const Batch b = text_batch(4, c.block_size);
  double loss = 0;
  int step = 0;
  for (; step < 300; step++) {
    loss = train_step(model, opt, b.inputs.data(), b.targets.data(), 4, c.block_size,
                      AdamWHyper{.lr = 3e-3f, .beta2 = 0.99f}, 1.0)
               .loss;
    if (loss < 0.1) break;
  }
  INFO("loss " << loss << " after " << step << " steps");
  CHECK(loss < 0.1);
}

TEST_CASE("a non-finite loss leaves the model untouched", "[unit][model]") {
  GptConfig c = tiny_config();
  Gpt model(c, 1);
  model.init_weights(1);
  model.params()[model.table().find("ln_f.weight")->offset] = NAN;
  const std::vector<float> before(model.params(), model.params() + model.num_params());
  AdamWState opt;
  const Batch b = text_batch(1, c.block_size);
  const StepStats s = train_step(model, opt, b.inputs.data(), b.targets.data(), 1, c.block_size, AdamWHyper{}, 1.0);
  CHECK_FALSE(s.applied);
  CHECK(opt.step == 0);
  CHECK(std::memcmp(before.data(), model.params(), before.size() * sizeof(float)) == 0);
}

}  // namespace diloco
