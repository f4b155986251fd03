#include "kernels/cpu/fast_math.h"

#include "tests/kernels/op_testing.h"

namespace diloco {

TEST_CASE("fast_expf is within a few ulp of exp over the float range", "[unit][kernels]") {
  double worst = 0;
  for (float x = -87.0f; x < 88.0f; x += 0.01234f) {
    const double exact = std::exp((double)x);
    worst = std::max(worst, std::fabs(fast_expf(x) - exact) / exact);
  }
  CHECK(worst < 3e-7);
  CHECK(fast_expf(0.0f) == 1.0f);
  CHECK(fast_expf(-1000.0f) < 1e-37f);  // clamped, not NaN
  CHECK(std::isfinite(fast_expf(1000.0f)));
}

TEST_CASE("fast_tanhf is within 1e-6 of tanh", "[unit][kernels]") {
  double worst = 0;
  for (float x = -20.0f; x < 20.0f; x += 0.00123f) worst = std::max(worst, std::fabs(fast_tanhf(x) - std::tanh((double)x)));
  CHECK(worst < 1e-6);
  CHECK(fast_tanhf(50.0f) == 1.0f);
  CHECK(fast_tanhf(-50.0f) == -1.0f);
}

}  // namespace diloco
