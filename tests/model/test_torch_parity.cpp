// Parity with PyTorch: the loss and every tensor's gradient norm of one batch
// match a nanoGPT model in PyTorch loaded with the same initial weights (as
// they are, and times 4 so that GELU and softmax see O(1) inputs).
// The reference lives in tests/fixtures/torch_parity.json, written by
// scripts/torch_parity.py, so this test needs no torch.

#include <omp.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/gpt.h"

namespace diloco {
namespace {

constexpr char kFixturePath[] = DILOCO_SOURCE_DIR "/tests/fixtures/torch_parity.json";
constexpr char kRegenerate[] = "/usr/bin/python3 scripts/torch_parity.py";
constexpr double kRelTol = 1e-4;

nlohmann::json load_fixture() {
  std::ifstream in(kFixturePath);
  INFO("cannot open " << kFixturePath << ": regenerate it with " << kRegenerate);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

double rel_diff(double got, double want) { return std::fabs(got - want) / std::fabs(want); }

// One OpenMP thread while in scope: the model is so small that waking a team
// costs far more than the work (hundreds of ms on a loaded machine, 3 ms on
// one thread). Threaded paths are checked against these in tests/kernels.
class SingleThread {
 public:
  SingleThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SingleThread() { omp_set_num_threads(saved_); }
  SingleThread(const SingleThread&) = delete;
  SingleThread& operator=(const SingleThread&) = delete;

 private:
  int saved_;
};

}  // namespace

TEST_CASE("loss and gradient norms match PyTorch", "[unit][model][parity]") {
  const SingleThread single_thread;
  const nlohmann::json fx = load_fixture();
  const nlohmann::json& cj = fx.at("config");
  GptConfig config;
  config.vocab_size = cj.at("vocab_size");
  config.block_size = cj.at("block_size");
  config.n_layer = cj.at("n_layer");
  config.n_embd = cj.at("n_embd");
  config.n_head = cj.at("n_head");
  const nlohmann::json& batch = fx.at("batch");
  const int B = batch.at("B"), T = batch.at("T");
  Gpt model(config, B);

  // The layout the fixture was made with.
  const nlohmann::json& fixture_tensors = fx.at("tensors");
  const std::vector<TensorInfo>& tensors = model.table().tensors();
  REQUIRE(fixture_tensors.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); i++) {
    INFO("tensor " << i << ": the layout changed; regenerate the fixture with " << kRegenerate);
    REQUIRE(fixture_tensors[i].at("name").get<std::string>() == tensors[i].name);
    REQUIRE(fixture_tensors[i].at("shape").get<std::vector<int>>() == tensors[i].shape);
  }

  // The initial weights the fixture was made with.
  const uint64_t seed = fx.at("seed");
  model.init_weights(seed);
  const nlohmann::json& fp = fx.at("params");
  double sum = 0, sum_squares = 0;
  for (size_t i = 0; i < model.num_params(); i++) {
    sum += model.params()[i];
    sum_squares += (double)model.params()[i] * model.params()[i];
  }
  const std::vector<double> first = fp.at("first");
  bool first_equal = first.size() <= model.num_params();
  for (size_t i = 0; first_equal && i < first.size(); i++) first_equal = model.params()[i] == (float)first[i];
  if (fp.at("count").get<size_t>() != model.num_params() || !first_equal || rel_diff(sum, fp.at("sum")) > 1e-9 ||
      rel_diff(sum_squares, fp.at("sum_squares")) > 1e-9) {
    FAIL("Gpt::init_weights(" << seed << ") no longer gives the fixture's parameters (sum " << sum << " vs "
                              << fp.at("sum") << ", sum of squares " << sum_squares << " vs " << fp.at("sum_squares")
                              << "): the init changed. If that is intended, "
                              << "regenerate " << kFixturePath << " with " << kRegenerate << " and commit it.");
  }

  std::vector<int> inputs, targets;
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      inputs.push_back(batch.at("inputs").at(b).at(t));
      targets.push_back(batch.at("targets").at(b).at(t));
    }
  }
  // Each case scales every initial parameter (by a power of 2: exactly).
  const nlohmann::json& cases = fx.at("cases");
  REQUIRE(!cases.empty());
  for (const nlohmann::json& c : cases) {
    const float scale = c.at("param_scale");
    INFO("parameters x" << scale);
    model.init_weights(seed);
    for (size_t i = 0; i < model.num_params(); i++) model.params()[i] *= scale;

    const double loss = model.forward(inputs.data(), targets.data(), B, T);
    INFO("loss " << loss << ", PyTorch " << c.at("loss"));
    CHECK(rel_diff(loss, c.at("loss")) <= kRelTol);

    model.zero_grad();
    model.backward();
    for (const TensorInfo& t : tensors) {
      double norm2 = 0;
      for (size_t k = 0; k < t.numel; k++) {
        norm2 += (double)model.grads()[t.offset + k] * model.grads()[t.offset + k];
      }
      const double want = c.at("grad_norms").at(t.name);
      INFO(t.name << ": gradient norm " << std::sqrt(norm2) << ", PyTorch " << want);
      CHECK(rel_diff(std::sqrt(norm2), want) <= kRelTol);
    }
  }
}

}  // namespace diloco
