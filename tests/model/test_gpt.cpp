#include "kernels/gpt.h"

#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <tuple>

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


namespace {

bool bitwise_equal(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// Index and values of the first differing float, for failure messages.
std::string first_difference(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return "first difference at " + std::to_string(i) + ": " + std::to_string(a[i]) + " vs " +
             std::to_string(b[i]);
  return "none";
}

// Records every Open/Close and hands out zeroed buffers `shift` floats past a 64-byte boundary,
// so the kernels write gradients at other alignments than grads() has.
class RecordingSink : public GradSink {
 public:
  struct Event {
    bool open;
    size_t offset, count;
    bool operator==(const Event&) const = default;
  };
  RecordingSink(size_t num_params, size_t shift) : assembled_(num_params, NAN), shift_(shift) {}

  float* Open(size_t offset, size_t count) override {
    events_.push_back({true, offset, count});
    std::vector<float>& buf = buffers_[offset];
    buf.assign(count + shift_ + 16, 0.0f);
    float* p = buf.data();
    while (reinterpret_cast<uintptr_t>(p) % 64 != 0) p++;
    return p + shift_;
  }
  void Close(size_t offset, size_t count) override {
    events_.push_back({false, offset, count});
    const float* p = buffers_[offset].data();
    while (reinterpret_cast<uintptr_t>(p) % 64 != 0) p++;
    p += shift_;
    for (size_t i = 0; i < count; i++) {
      // Each parameter belongs to exactly one bucket: NaN marks "not delivered yet".
      if (!std::isnan(assembled_[offset + i])) overlaps_++;
      assembled_[offset + i] = p[i];
    }
  }

  std::vector<Event> events_;
  std::vector<float> assembled_;  // every delivered bucket at its table offset
  size_t overlaps_ = 0;

 private:
  std::map<size_t, std::vector<float>> buffers_;
  size_t shift_;
};

// Buckets in the order GradSink documents: wte+wpe opens first and closes last; ln_f; blocks
// from the last to the first.
std::vector<RecordingSink::Event> expected_events(const TensorTable& t, int n_layer) {
  auto range = [&](const std::string& first, const std::string& last) {
    const TensorInfo* a = t.find(first);
    const TensorInfo* b = t.find(last);
    return std::pair{a->offset, b->offset + b->numel - a->offset};
  };
  std::vector<RecordingSink::Event> e;
  const auto [emb_off, emb_n] = range("wte", "wpe");
  e.push_back({true, emb_off, emb_n});
  const auto [lnf_off, lnf_n] = range("ln_f.weight", "ln_f.bias");
  e.push_back({true, lnf_off, lnf_n});
  e.push_back({false, lnf_off, lnf_n});
  for (int l = n_layer - 1; l >= 0; l--) {
    const std::string h = "h." + std::to_string(l) + ".";
    const auto [off, n] = range(h + "ln_1.weight", h + "mlp.c_proj.bias");
    e.push_back({true, off, n});
    e.push_back({false, off, n});
  }
  e.push_back({false, emb_off, emb_n});
  return e;
}

struct GradRun {
  double loss;
  std::vector<float> grads;
  size_t activation_bytes;
};

// Two accumulated forward+backward passes (the second reuses the recompute scratch) from
// zero_grad(), then the loss of the second and the gradients.
GradRun run_grads(const GptConfig& c, int max_batch, GptOptions options, int B, int T) {
  Gpt model(c, max_batch, options);
  model.init_weights(11);
  // Larger weights than GPT-2 init so every gradient is clearly non-zero.
  for (size_t i = 0; i < model.num_params(); i++) model.params()[i] *= 3.0f;
  model.zero_grad();
  GradRun r{};
  for (int pass = 0; pass < 2; pass++) {
    const Batch b = text_batch(B, T, pass * 5);
    r.loss = model.forward(b.inputs.data(), b.targets.data(), B, T);
    model.backward();
  }
  r.grads.assign(model.grads(), model.grads() + model.num_params());
  r.activation_bytes = model.activation_bytes();
  return r;
}

// (config, max_batch, B, T) cases: full batch, B < max_batch and T < block_size, n_layer 1 and 3.
std::vector<std::tuple<GptConfig, int, int, int>> recompute_shapes() {
  GptConfig two = tiny_config();
  GptConfig one = tiny_config(3);
  one.n_layer = 1;
  one.n_embd = 9;
  one.block_size = 11;
  GptConfig three = tiny_config(2);
  three.n_layer = 3;
  three.n_embd = 16;
  return {{two, 3, 3, two.block_size}, {one, 4, 2, 7}, {three, 3, 1, 5}, {three, 2, 2, three.block_size}};
}

}  // namespace

TEST_CASE("recompute gives the same loss and bitwise the same gradients", "[unit][model]") {
  for (const auto& [c, max_batch, B, T] : recompute_shapes()) {
    INFO("n_layer " << c.n_layer << " n_embd " << c.n_embd << " max_batch " << max_batch << " B " << B << " T " << T);
    const GradRun stored = run_grads(c, max_batch, GptOptions{}, B, T);
    const GradRun recomputed = run_grads(c, max_batch, GptOptions{.recompute = true}, B, T);
    CHECK(std::memcmp(&stored.loss, &recomputed.loss, sizeof(double)) == 0);
    INFO(first_difference(stored.grads.data(), recomputed.grads.data(), stored.grads.size()));
    CHECK(bitwise_equal(stored.grads.data(), recomputed.grads.data(), stored.grads.size()));
    // One block saves nothing: its slot is the scratch.
    if (c.n_layer > 1) CHECK(recomputed.activation_bytes < stored.activation_bytes);
    CHECK(recomputed.activation_bytes <= stored.activation_bytes);
  }
}

TEST_CASE("recompute: forward without targets gives the same logits", "[unit][model]") {
  GptConfig c = tiny_config(2);
  c.n_layer = 3;
  Gpt stored(c, 3), recomputed(c, 3, GptOptions{.recompute = true});
  stored.init_weights(5);
  recomputed.init_weights(5);
  for (const auto& [B, T] : {std::pair{3, c.block_size}, std::pair{2, 9}}) {
    const Batch b = text_batch(B, T);
    CHECK(stored.forward(b.inputs.data(), nullptr, B, T) == 0.0);
    CHECK(recomputed.forward(b.inputs.data(), nullptr, B, T) == 0.0);
    const size_t n = (size_t)B * T * c.vocab_size;
    CHECK(bitwise_equal(stored.logits(), recomputed.logits(), n));
  }
  // Training still works after an eval forward reused the scratch.
  const Batch b = text_batch(3, c.block_size);
  stored.zero_grad();
  recomputed.zero_grad();
  stored.forward(b.inputs.data(), b.targets.data(), 3, c.block_size);
  recomputed.forward(b.inputs.data(), b.targets.data(), 3, c.block_size);
  stored.backward();
  recomputed.backward();
  CHECK(bitwise_equal(stored.grads(), recomputed.grads(), stored.num_params()));
}

TEST_CASE("backward into a GradSink: bucket order, coverage, bitwise grads()", "[unit][model]") {
  for (const auto& [c, max_batch, B, T] : recompute_shapes()) {
    for (const bool recompute : {false, true}) {
      for (const size_t shift : {0, 1, 3}) {
        INFO("n_layer " << c.n_layer << " B " << B << " T " << T << " recompute " << recompute << " shift "
                        << shift);
        Gpt model(c, max_batch, GptOptions{.recompute = recompute});
        model.init_weights(13);
        for (size_t i = 0; i < model.num_params(); i++) model.params()[i] *= 3.0f;
        const Batch b = text_batch(B, T);
        const double loss = model.forward(b.inputs.data(), b.targets.data(), B, T);
        model.zero_grad();
        model.backward();
        const std::vector<float> reference(model.grads(), model.grads() + model.num_params());

        // grads() must stay as it was: fill it with a marker the sink path must not touch.
        std::fill(model.grads(), model.grads() + model.num_params(), 7.0f);
        CHECK(model.forward(b.inputs.data(), b.targets.data(), B, T) == loss);
        RecordingSink sink(model.num_params(), shift);
        model.backward(&sink);
        CHECK(sink.events_ == expected_events(model.table(), c.n_layer));
        CHECK(sink.overlaps_ == 0);
        CHECK(std::none_of(sink.assembled_.begin(), sink.assembled_.end(), [](float x) { return std::isnan(x); }));
        INFO(first_difference(reference.data(), sink.assembled_.data(), reference.size()));
        CHECK(bitwise_equal(reference.data(), sink.assembled_.data(), reference.size()));
        CHECK(std::all_of(model.grads(), model.grads() + model.num_params(), [](float x) { return x == 7.0f; }));
      }
    }
  }
}

TEST_CASE("keep_grads = false: no grads(), backward(sink) still works", "[unit][model]") {
  GptConfig c = tiny_config();
  Gpt with(c, 2), without(c, 2, GptOptions{.recompute = true, .keep_grads = false});
  CHECK(without.grads() == nullptr);
  CHECK(with.grads() != nullptr);
  with.init_weights(3);
  without.init_weights(3);
  const Batch b = text_batch(2, c.block_size);
  with.forward(b.inputs.data(), b.targets.data(), 2, c.block_size);
  with.zero_grad();
  with.backward();
  without.zero_grad();  // nothing to zero, and no crash
  without.forward(b.inputs.data(), b.targets.data(), 2, c.block_size);
  RecordingSink sink(without.num_params(), 0);
  without.backward(&sink);
  CHECK(sink.events_ == expected_events(without.table(), c.n_layer));
  CHECK(bitwise_equal(with.grads(), sink.assembled_.data(), with.num_params()));

  // backward() without a sink has nowhere to put gradients: it aborts, saying why. The child
  // fails the check before any OpenMP work, so forking here is safe.
  int err[2];
  REQUIRE(pipe(err) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::signal(SIGABRT, SIG_DFL);  // not Catch2's handler, which would report a failure
    dup2(err[1], 2);
    without.backward();
    _exit(0);  // not reached
  }
  close(err[1]);
  std::string message;
  char buf[512];
  for (ssize_t n; (n = read(err[0], buf, sizeof buf)) > 0;) message.append(buf, n);
  close(err[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
  INFO(message);
  CHECK(message.find("keep_grads") != std::string::npos);
}

// Time per training step (zero_grad + forward + backward) with and without recompute, and the
// activation memory, as a markdown table. Hidden: run with
//   OMP_NUM_THREADS=2 build/bin/model_tests "[.bench]"
// The two models' steps alternate, so load from other processes falls on both alike.
TEST_CASE("recompute step time and activation memory", "[.bench][model]") {
  struct Shape {
    const char* name;
    GptConfig config;
    int B;
  };
  const Shape shapes[] = {
      {"shakespeare L4 C128 T64 B12", GptConfig{.vocab_size = 256, .block_size = 64, .n_layer = 4, .n_embd = 128, .n_head = 4}, 12},
      {"L6 C384 T256 B4", GptConfig{.vocab_size = 256, .block_size = 256, .n_layer = 6, .n_embd = 384, .n_head = 6}, 4},
  };
  constexpr int kWarmup = 2, kSteps = 10;
  std::printf("threads: %d\n\n", omp_get_max_threads());
  // Medians as asked; the minimum too, the better estimate on a machine shared with others.
  std::printf("| model | activation MiB stored | activation MiB recompute | step ms stored, median (min) | "
              "step ms recompute, median (min) | slowdown, median (min) |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const Shape& shape : shapes) {
    const int B = shape.B, T = shape.config.block_size;
    Gpt stored(shape.config, B), recomputed(shape.config, B, GptOptions{.recompute = true});
    stored.init_weights(1);
    recomputed.init_weights(1);
    const Batch b = text_batch(B, T);
    auto step_ms = [&](Gpt& model) {
      const auto t0 = std::chrono::steady_clock::now();
      model.zero_grad();
      model.forward(b.inputs.data(), b.targets.data(), B, T);
      model.backward();
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    std::vector<double> ms_stored, ms_recomputed;
    for (int i = 0; i < kWarmup + kSteps; i++) {
      const double a = step_ms(stored), r = step_ms(recomputed);
      if (i >= kWarmup) {
        ms_stored.push_back(a);
        ms_recomputed.push_back(r);
      }
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;  // kSteps is even
    };
    const double s = median(ms_stored), r = median(ms_recomputed);
    const double s_min = *std::min_element(ms_stored.begin(), ms_stored.end());
    const double r_min = *std::min_element(ms_recomputed.begin(), ms_recomputed.end());
    std::printf("| %s | %.1f | %.1f | %.1f (%.1f) | %.1f (%.1f) | %+.0f%% (%+.0f%%) |\n", shape.name,
                stored.activation_bytes() / 1048576.0, recomputed.activation_bytes() / 1048576.0, s, s_min, r, r_min,
                100 * (r / s - 1), 100 * (r_min / s_min - 1));
    CHECK(bitwise_equal(stored.grads(), recomputed.grads(), stored.num_params()));
    // At these sizes OpenBLAS takes its large-matrix paths: buckets at odd alignments still
    // give grads() bitwise.
    for (const size_t shift : {1, 3}) {
      RecordingSink sink(recomputed.num_params(), shift);
      recomputed.forward(b.inputs.data(), b.targets.data(), B, T);
      recomputed.backward(&sink);
      CHECK(bitwise_equal(stored.grads(), sink.assembled_.data(), stored.num_params()));
    }
  }
}

}  // namespace diloco
