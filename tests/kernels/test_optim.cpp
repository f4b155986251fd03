// AdamW, gradient clipping and the learning-rate schedule.
#include "kernels/adamw.h"
#include "kernels/grad_clip.h"
#include "kernels/lr_schedule.h"
#include "tests/kernels/op_testing.h"

namespace diloco {
using namespace diloco::testing;

TEST_CASE("adamw matches a hand-computed step", "[unit][kernels]") {
  std::vector<float> p = {1.0f, -2.0f}, m = {0, 0}, v = {0, 0};
  const std::vector<float> g = {0.5f, -0.25f};
  AdamWHyper hp{.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f};
  adamw_update(p.data(), m.data(), v.data(), g.data(), 2, hp, 1);
  // Step 1: mhat = g, vhat = g^2, so the update is sign(g) (plus eps) and decay.
  CHECK(m[0] == Approx(0.05f));
  CHECK(v[0] == Approx(0.0025f));
  CHECK(p[0] == Approx(1.0f - 0.1f * (1.0f + 0.1f * 1.0f)).epsilon(1e-6));
  CHECK(p[1] == Approx(-2.0f - 0.1f * (-1.0f + 0.1f * -2.0f)).epsilon(1e-6));
  // Step 2 with the same gradient: moments keep the ratio, so again +-1.
  const float p0 = p[0];
  adamw_update(p.data(), m.data(), v.data(), g.data(), 2, hp, 2);
  CHECK(p[0] == Approx(p0 - 0.1f * (1.0f + 0.1f * p0)).epsilon(1e-6));
}

TEST_CASE("global norm and clipping", "[unit][kernels]") {
  std::vector<float> g = {3.0f, 4.0f};
  CHECK(global_norm(g.data(), 2) == Approx(5.0));
  CHECK(clip_scale(5.0, 10.0) == 1.0f);  // under the limit
  CHECK(clip_scale(5.0, 0.0) == 1.0f);   // clipping off
  CHECK(clip_scale(5.0, 1.0) == Approx(0.2f).epsilon(1e-6));
  // AdamW applies the scale: a scaled gradient gives the same first moment.
  std::vector<float> p = {0, 0}, m = {0, 0}, v = {0, 0}, m2 = {0, 0}, v2 = {0, 0}, p2 = {0, 0};
  const std::vector<float> g_small = {0.6f, 0.8f};
  AdamWHyper hp;
  hp.grad_scale = 0.2f;
  adamw_update(p.data(), m.data(), v.data(), g.data(), 2, hp, 1);
  adamw_update(p2.data(), m2.data(), v2.data(), g_small.data(), 2, AdamWHyper{}, 1);
  CHECK(m[1] == Approx(m2[1]));
  CHECK(v[1] == Approx(v2[1]));
  // Large buffers are summed in fixed chunks: check against a plain sum.
  const auto big = random_vec<float>(100003, 81);
  double s = 0;
  for (float x : big) s += (double)x * x;
  CHECK(global_norm(big.data(), big.size()) == Approx(std::sqrt(s)).epsilon(1e-12));
}

TEST_CASE("lr schedule: linear warmup then cosine to min_lr", "[unit][kernels]") {
  const LrSchedule s{.lr = 1e-3f, .min_lr = 1e-4f, .warmup_steps = 10, .decay_steps = 110};
  CHECK(lr_at(s, 0) == Approx(1e-3f / 11));
  CHECK(lr_at(s, 9) == Approx(1e-3f * 10 / 11));
  CHECK(lr_at(s, 10) == Approx(1e-3f));
  CHECK(lr_at(s, 60) == Approx(5.5e-4f));  // half way: the mean of lr and min_lr
  CHECK(lr_at(s, 110) == Approx(1e-4f));
  CHECK(lr_at(s, 500) == Approx(1e-4f));
}

}  // namespace diloco
