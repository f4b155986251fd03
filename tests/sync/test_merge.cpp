// Merge maths against plain double-precision references.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "daemon/sync/merge.h"
#include "kernels/gpt.h"
#include "kernels/rng.h"

namespace diloco {
namespace {

using Catch::Matchers::Contains;

// A fragment of named tensors, each of the given size, packed in order.
Fragment FragmentOf(const std::vector<std::pair<std::string, size_t>>& tensors) {
  Fragment f;
  for (const auto& [name, numel] : tensors) {
    FragmentRange r;
    r.tensor = name;
    r.offset = 1000 + f.numel;  // anywhere in a flat buffer; merge only uses packed offsets
    r.numel = numel;
    r.packed_offset = f.numel;
    r.embedding = IsEmbeddingTensor(name);
    f.ranges.push_back(r);
    f.numel += numel;
  }
  return f;
}

double NormOf(const std::vector<float>& x, size_t begin = 0, size_t n = SIZE_MAX) {
  n = std::min(n, x.size() - begin);
  double s = 0;
  for (size_t i = begin; i < begin + n; ++i) s += (double)x[i] * x[i];
  return std::sqrt(s);
}

std::vector<float> Merge(const Fragment& f, const std::vector<std::vector<float>>& deltas,
                         const std::vector<double>& weights, MergeRule rule) {
  std::vector<const float*> pointers;
  for (const auto& d : deltas) pointers.push_back(d.data());
  std::vector<float> out(f.numel, 123.0f);
  MergeDeltas(f, pointers, weights, rule, out.data());
  return out;
}

// RDA of one tensor, in double, straight from the definition.
std::vector<double> RdaReference(const std::vector<std::vector<float>>& deltas,
                                 const std::vector<double>& w) {
  const size_t n = deltas[0].size();
  double radius = 0;
  std::vector<double> s(n, 0.0);
  for (size_t m = 0; m < deltas.size(); ++m) {
    const double norm = NormOf(deltas[m]);
    radius += w[m] * norm;
    for (size_t i = 0; i < n; ++i) s[i] += w[m] * deltas[m][i] / norm;
  }
  double s_norm = 0;
  for (double v : s) s_norm += v * v;
  s_norm = std::sqrt(s_norm);
  for (double& v : s) v *= radius / s_norm;
  return s;
}

TEST_CASE("sync: weights are c_tok^2 / c_steps, normalized, or uniform", "[unit][sync]") {
  std::vector<double> w;
  const std::vector<ContributionCounts> counts = {{1000, 10}, {500, 10}, {2000, 40}};
  REQUIRE(ContributionWeights(counts, Weighting::kTokens, &w).ok());
  // 1e5, 2.5e4, 1e5 of 2.25e5: a learner that made as many tokens in fewer
  // steps (bigger batches) weighs more; twice the tokens in 4x the steps, the same.
  REQUIRE(w.size() == 3);
  CHECK(w[0] == Approx(100.0 / 225));
  CHECK(w[1] == Approx(25.0 / 225));
  CHECK(w[2] == Approx(100.0 / 225));
  REQUIRE(ContributionWeights(counts, Weighting::kUniform, &w).ok());
  CHECK(w == std::vector<double>{1.0 / 3, 1.0 / 3, 1.0 / 3});
  REQUIRE(ContributionWeights({{0, 5}, {10, 5}}, Weighting::kTokens, &w).ok());
  CHECK(w == std::vector<double>{0.0, 1.0});

  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Bad {
    std::vector<ContributionCounts> counts;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {{}, "no contributions to weigh"},
      {{{100, 0}}, "contribution 0 has c_tokens 100 and c_steps 0: a delta needs steps > 0"},
      {{{10, 1}, {-1, 1}}, "contribution 1 has c_tokens -1"},
      {{{nan, 1}}, "contribution 0 has c_tokens nan"},
      {{{10, 1}, {10, 1, -1}}, "contribution 1 has age -1: versions behind must be >= 0"},
      {{{0, 1}, {0, 3}}, "contribution weights sum to 0: every contribution has 0 tokens"},
  };
  for (const Bad& b : bad) {
    w = {42.0};
    const Status status = ContributionWeights(b.counts, Weighting::kTokens, &w);
    REQUIRE_FALSE(status.ok());
    CHECK_THAT(status.message(), Contains(b.message));
    CHECK(w == std::vector<double>{42.0});
  }
}

TEST_CASE(
    "sync: RDA keeps the norm of orthogonal equal-norm deltas; the mean shrinks it by 1/sqrt 2",
    "[unit][sync]") {
  const Fragment f = FragmentOf({{"h.0.mlp.c_fc.weight", 4}});
  const std::vector<std::vector<float>> deltas = {{2, 0, 0, 0}, {0, 2, 0, 0}};
  const std::vector<double> w = {0.5, 0.5};
  const std::vector<float> rda = Merge(f, deltas, w, MergeRule::kRda);
  CHECK(NormOf(rda) == Approx(2.0).epsilon(1e-7));
  CHECK(rda[0] == Approx(std::sqrt(2.0)));
  CHECK(rda[1] == Approx(std::sqrt(2.0)));
  CHECK(rda[2] == 0);
  const std::vector<float> mean = Merge(f, deltas, w, MergeRule::kMean);
  CHECK(NormOf(mean) == Approx(2.0 / std::sqrt(2.0)).epsilon(1e-7));
  CHECK(mean == std::vector<float>{1, 1, 0, 0});

  // Identical deltas merge to themselves under either rule.
  const std::vector<float> same = Merge(f, {{1, -2, 3, 0.5}, {1, -2, 3, 0.5}}, w, MergeRule::kRda);
  for (size_t i = 0; i < 4; ++i) CHECK(same[i] == Approx(std::vector<float>{1, -2, 3, 0.5}[i]));
}

TEST_CASE("sync: RDA matches a double-precision reference per tensor on random deltas",
          "[unit][sync]") {
  const Fragment f = FragmentOf({{"h.0.attn.c_attn.weight", 600}, {"h.0.ln_1.bias", 7}});
  Rng rng(7);
  std::vector<std::vector<float>> deltas(3, std::vector<float>(f.numel));
  for (auto& d : deltas) {
    for (float& x : d) x = (float)(0.01 * rng.normal());
  }
  std::vector<double> w;
  REQUIRE(ContributionWeights({{3000, 10}, {1000, 10}, {2500, 20}}, Weighting::kTokens, &w).ok());
  const std::vector<float> merged = Merge(f, deltas, w, MergeRule::kRda);
  for (const FragmentRange& r : f.ranges) {
    std::vector<std::vector<float>> slices;
    for (const auto& d : deltas) {
      slices.emplace_back(d.begin() + r.packed_offset, d.begin() + r.packed_offset + r.numel);
    }
    const std::vector<double> expected = RdaReference(slices, w);
    for (size_t i = 0; i < r.numel; ++i) {
      INFO(r.tensor << "[" << i << "]");
      CHECK(merged[r.packed_offset + i] == Approx(expected[i]).epsilon(1e-6).margin(1e-9));
    }
    // The merged norm is the weighted mean of the norms.
    double radius = 0;
    for (size_t m = 0; m < 3; ++m) radius += w[m] * NormOf(slices[m]);
    CHECK(NormOf(merged, r.packed_offset, r.numel) == Approx(radius).epsilon(1e-6));
  }
}

TEST_CASE("sync: RDA falls back to the weighted mean when the directions cancel", "[unit][sync]") {
  const Fragment f = FragmentOf({{"h.1.mlp.c_proj.weight", 3}});
  const std::vector<double> w = {0.5, 0.5};
  // v and -2v: unit directions cancel exactly; the mean is 0.5 v - v = -0.5 v.
  const std::vector<float> out = Merge(f, {{1, 2, -2}, {-2, -4, 4}}, w, MergeRule::kRda);
  CHECK(out == std::vector<float>{-0.5f, -1.0f, 1.0f});
  // Two zero deltas merge to zero (no direction, no NaN).
  CHECK(Merge(f, {{0, 0, 0}, {0, 0, 0}}, w, MergeRule::kRda) == std::vector<float>{0, 0, 0});
  // A zero delta adds no direction but pulls the norm down: w2 · Δ2, like the mean.
  const std::vector<float> half = Merge(f, {{0, 0, 0}, {2, 0, 0}}, w, MergeRule::kRda);
  CHECK(half[0] == Approx(1.0));
  CHECK(half[1] == 0);
}

TEST_CASE("sync: embedding tensors take the plain weighted mean even under RDA", "[unit][sync]") {
  const Fragment f = FragmentOf({{"wte", 2}, {"wpe", 2}, {"h.0.attn.c_proj.weight", 2}});
  const std::vector<float> out =
      Merge(f, {{2, 0, 2, 0, 2, 0}, {0, 2, 0, 2, 0, 2}}, {0.5, 0.5}, MergeRule::kRda);
  CHECK(out[0] == 1);  // wte: mean
  CHECK(out[1] == 1);
  CHECK(out[2] == 1);                       // wpe: mean
  CHECK(out[4] == Approx(std::sqrt(2.0)));  // block tensor: RDA
  CHECK(out[5] == Approx(std::sqrt(2.0)));
}

TEST_CASE("sync: merge contributors takes each coordinate's mean over the deltas that sent it", "[unit][sync]") {
  const Fragment f = FragmentOf({{"wte", 2}, {"h.0.mlp.c_fc.weight", 4}});
  const std::vector<double> w = {0.75, 0.25};  // token weights
  // Sparse supports: coordinate 0 and 2 sent by one delta each, 1 and 3 by both, 4 by none.
  const std::vector<std::vector<float>> deltas = {{4, 4, 8, 2, 0, 0}, {0, 8, 0, 6, 0, 1}};
  const std::vector<float> out = Merge(f, deltas, w, MergeRule::kContributors);
  CHECK(out[0] == 4);                       // its one sender's value, not 0.75 x 4
  CHECK(out[1] == Approx(0.75 * 4 + 0.25 * 8));  // both: the token-weighted mean
  CHECK(out[2] == 8);
  CHECK(out[3] == Approx(0.75 * 2 + 0.25 * 6));
  CHECK(out[4] == 0);  // nobody sent it
  CHECK(out[5] == 1);
  // Dense deltas: the plain weighted mean.
  const std::vector<std::vector<float>> dense = {{1, 2, 3, 4, 5, 6}, {6, 5, 4, 3, 2, 1}};
  CHECK(Merge(f, dense, w, MergeRule::kContributors) == Merge(f, dense, w, MergeRule::kMean));
  // A round's share (weights summing to 0.5) scales every coordinate by it, as the mean does.
  const std::vector<float> share = Merge(f, deltas, {0.375, 0.125}, MergeRule::kContributors);
  CHECK(share[0] == Approx(2));
  CHECK(share[1] == Approx(0.5 * (0.75 * 4 + 0.25 * 8)));
}

TEST_CASE("sync: a fragment with row pieces merges each range on its own", "[unit][sync]") {
  // A GPT-2 vocabulary on a narrow model: wte is 97% of it, so the partition
  // cuts it into row pieces that share fragments with block tensors.
  GptConfig config;
  config.vocab_size = 50257;
  config.block_size = 256;
  config.n_layer = 2;
  config.n_embd = 64;
  std::vector<Fragment> fragments;
  REQUIRE(PartitionFragments(gpt_tensor_table(config), 8, &fragments).ok());
  const Fragment* mixed = nullptr;
  for (const Fragment& f : fragments) {
    bool piece = false, other = false;
    for (const FragmentRange& r : f.ranges) {
      piece = piece || (r.piece && r.embedding);
      other = other || !r.embedding;
    }
    if (piece && other) mixed = &f;
  }
  REQUIRE(mixed != nullptr);
  const Fragment& f = *mixed;
  Rng rng(3);
  std::vector<std::vector<float>> deltas(3, std::vector<float>(f.numel));
  for (auto& d : deltas) {
    for (float& x : d) x = (float)(0.01 * rng.normal());
  }
  const std::vector<double> w = {0.5, 0.3, 0.2};
  const std::vector<float> merged = Merge(f, deltas, w, MergeRule::kRda);
  for (const FragmentRange& r : f.ranges) {
    INFO(RangeName(r));
    std::vector<std::vector<float>> slices;
    for (const auto& d : deltas) {
      slices.emplace_back(d.begin() + r.packed_offset, d.begin() + r.packed_offset + r.numel);
    }
    const std::vector<double> rda = RdaReference(slices, w);
    for (size_t i = 0; i < r.numel; i += 97) {
      const double mean = w[0] * slices[0][i] + w[1] * slices[1][i] + w[2] * slices[2][i];
      // Embedding pieces: the weighted mean; the rest: RDA over this range alone.
      const double expected = r.embedding ? mean : rda[i];
      CHECK(merged[r.packed_offset + i] == Approx(expected).epsilon(1e-6).margin(1e-9));
    }
  }
}

TEST_CASE("sync: the norm filter rejects non-finite deltas and outlier norms", "[unit][sync]") {
  NormFilterOptions options;
  options.max_ratio = 10;
  options.history = 4;
  options.min_history = 3;
  NormFilter filter(options);
  auto check = [&](std::vector<float> delta) { return filter.Check(delta.data(), delta.size()); };

  FilterResult r = check({1, std::nanf(""), 0, 0});
  CHECK(r.verdict == FilterVerdict::kNonFinite);
  CHECK(r.reason == "1 of 4 values are NaN or Inf");
  CHECK(check({INFINITY, -INFINITY, 0, 0}).verdict == FilterVerdict::kNonFinite);
  CHECK(filter.Median() == 0);  // rejected deltas leave no trace

  // Until min_history norms are known any finite delta passes.
  CHECK(check({100, 0, 0, 0}).accepted());
  CHECK(check({1, 0, 0, 0}).accepted());
  CHECK(check({0, 2, 0, 0}).accepted());
  CHECK(filter.Median() == 2);  // of {100, 1, 2}
  r = check({0, 0, 21, 0});
  CHECK(r.verdict == FilterVerdict::kNormTooLarge);
  CHECK(r.norm == 21);
  CHECK(r.limit == 20);
  CHECK(r.reason == "norm per step 21 is above 10 x the median 2 of the last 3 deltas");
  CHECK(std::string(ToString(r.verdict)) == "norm_too_large");
  CHECK(filter.Median() == 2);
  r = check({0, 0, 20, 0});  // at the limit: accepted
  CHECK(r.accepted());
  CHECK(r.limit == 20);
  // The history keeps the last 4: {1, 2, 20, 3} → median 2.5 after 100 falls out.
  CHECK(check({3, 0, 0, 0}).accepted());
  CHECK(filter.Median() == 2.5);
  // Norms are per inner step: 50 over 10 steps is 5 per step (within 10 x 2.5); 50 over 1 is not.
  std::vector<float> big = {0, 50, 0, 0};
  r = filter.Check(big.data(), big.size(), 10);
  CHECK(r.accepted());
  CHECK(r.norm == 5);
  CHECK(filter.Check(big.data(), big.size(), 1).verdict == FilterVerdict::kNormTooLarge);
  CHECK(filter.Check(big.data(), big.size(), 0).verdict == FilterVerdict::kNormTooLarge);  // 0 steps: as 1

  options.max_ratio = 0;  // norm limit off
  NormFilter off(options);
  for (int i = 0; i < 5; ++i) {
    std::vector<float> d = {(float)std::pow(100.0, i)};
    CHECK(off.Check(d.data(), 1).accepted());
  }
  std::vector<float> nan = {std::nanf("")};
  CHECK(off.Check(nan.data(), 1).verdict == FilterVerdict::kNonFinite);
}

TEST_CASE("sync: outer Nesterov matches a double-precision reference to 1e-6", "[unit][sync]") {
  const double lr = 0.7, mu = 0.9;
  // One step by hand: u = 0.9·0 + 1 = 1; update = −0.7·(1 + 0.9·1) = −1.33.
  float u = 0, update = 0, theta = 5;
  const float delta = 1;
  OuterNesterovUpdate(&delta, 1, lr, mu, &u, &update);
  CHECK(u == 1);
  CHECK(update == Approx(-1.33));
  ApplyUpdate(&update, 1, &theta);
  CHECK(theta == Approx(3.67));

  const size_t n = 1000;
  Rng rng(3);
  std::vector<float> theta_f(n), u_f(n, 0.0f), update_f(n);
  std::vector<double> theta_d(n), u_d(n, 0.0);
  for (size_t i = 0; i < n; ++i) theta_d[i] = theta_f[i] = (float)rng.normal();
  for (int step = 0; step < 5; ++step) {
    std::vector<float> delta_f(n);
    for (float& x : delta_f) x = (float)(0.02 * rng.normal());
    OuterNesterovUpdate(delta_f.data(), n, lr, mu, u_f.data(), update_f.data());
    ApplyUpdate(update_f.data(), n, theta_f.data());
    for (size_t i = 0; i < n; ++i) {
      u_d[i] = mu * u_d[i] + delta_f[i];
      theta_d[i] -= lr * (delta_f[i] + mu * u_d[i]);
    }
  }
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::abs(theta_f[i] - theta_d[i]));
    worst = std::max(worst, std::abs(u_f[i] - u_d[i]));
  }
  CHECK(worst < 1e-6);
}

TEST_CASE("sync: the norm filter cannot lock a fragment out forever, yet keeps rejecting an outlier", "[unit][sync]") {
  NormFilterOptions options;  // max_ratio 10, history 32, min_history 3, 8 rejections in a row
  std::vector<float> normal = {1, 0, 0, 0}, resent = {50, 0, 0, 0};  // a learner resending all its progress
  NormFilter filter(options);
  for (int i = 0; i < 10; i++) REQUIRE(filter.Check(normal.data(), normal.size()).accepted());
  // The same large delta again and again (the only learner still sending): refused at most 8
  // times, then the history restarts from it.
  int attempts = 0;
  while (!filter.Check(resent.data(), resent.size()).accepted()) REQUIRE(++attempts < 100);
  CHECK(attempts == options.max_rejections_in_a_row);
  CHECK(filter.Median() == 50);

  // An outlier between accepted deltas never gets through: each acceptance resets the run.
  NormFilter mixed(options);
  for (int i = 0; i < 10; i++) REQUIRE(mixed.Check(normal.data(), normal.size()).accepted());
  for (int i = 0; i < 50; i++) {
    CHECK(mixed.Check(resent.data(), resent.size()).verdict == FilterVerdict::kNormTooLarge);
    CHECK(mixed.Check(normal.data(), normal.size()).accepted());
  }
  // 0 turns the bound off: refused forever, as before.
  options.max_rejections_in_a_row = 0;
  NormFilter strict(options);
  for (int i = 0; i < 10; i++) REQUIRE(strict.Check(normal.data(), normal.size()).accepted());
  for (int i = 0; i < 50; i++) CHECK_FALSE(strict.Check(resent.data(), resent.size()).accepted());
}

TEST_CASE("merge: the same deltas merge to the same bits whatever order they arrived in", "[unit]") {
  const Fragment f = FragmentOf({{"wte", 300}, {"h.0.attn.c_attn.weight", 500}});
  Rng rng(17);
  std::vector<std::vector<float>> deltas(4, std::vector<float>(f.numel));
  for (auto& d : deltas)
    for (float& x : d) x = (float)rng.normal();
  // Values where even a double sum depends on the order: (1e20 + 1) - 1e20 is 0, (1e20 - 1e20) + 1
  // is 1 (in the embedding, merged by the plain weighted mean).
  deltas[0][5] = 1e20f;
  deltas[1][5] = 1.0f;
  deltas[2][5] = -1e20f;
  deltas[3][5] = 0.0f;
  const ContributionCounts counts[] = {{1000, 10}, {1000, 10}, {1000, 10}, {1000, 10}};
  for (MergeRule rule : {MergeRule::kRda, MergeRule::kMean}) {
    std::vector<int> order = {0, 1, 2, 3};
    std::vector<float> first(f.numel);
    bool first_done = false, arrival_order_differs = false;
    do {
      std::vector<Contribution> cs;
      for (int m : order) cs.push_back({m, counts[m], deltas[m].data()});
      std::vector<float> out(f.numel);
      std::vector<double> weights;
      REQUIRE(MergeContributions(f, &cs, Weighting::kTokens, rule, out.data(), &weights).ok());
      CHECK(cs.front().learner == 0);  // sorted for the caller's contributor list too
      REQUIRE(weights.size() == 4);
      if (!first_done) {
        first = out;
        first_done = true;
      }
      CHECK(std::memcmp(out.data(), first.data(), out.size() * sizeof(float)) == 0);
      // What merging in arrival order gives: not always the same bits.
      std::vector<ContributionCounts> c;
      std::vector<const float*> d;
      for (int m : order) {
        c.push_back(counts[m]);
        d.push_back(deltas[m].data());
      }
      std::vector<double> w;
      REQUIRE(ContributionWeights(c, Weighting::kTokens, &w).ok());
      std::vector<float> arrival(f.numel);
      MergeDeltas(f, d, w, rule, arrival.data());
      arrival_order_differs |= std::memcmp(arrival.data(), first.data(), arrival.size() * sizeof(float)) != 0;
    } while (std::next_permutation(order.begin(), order.end()));
    CHECK(arrival_order_differs);  // so the check above can fail
  }
}

}  // namespace
}  // namespace diloco
