#include "kernels/residual.h"

#include "tests/kernels/op_testing.h"

namespace diloco {

TEST_CASE("residual forward adds elementwise", "[unit][kernels]") {
  const std::vector<float> a = {1, 2, 3}, b = {10, -2, 0.5f};
  std::vector<float> out(3);
  residual_forward(out.data(), a.data(), b.data(), 3);
  CHECK(out == std::vector<float>{11, 0, 3.5f});
}

}  // namespace diloco
