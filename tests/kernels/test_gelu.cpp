#include "kernels/gelu.h"

#include "tests/kernels/op_testing.h"

namespace diloco {
using namespace diloco::testing;

TEST_CASE("gelu forward on hand-computed points", "[unit][kernels]") {
  const std::vector<double> x = {0.0, 1.0, -1.0, 3.0};
  std::vector<double> out(4);
  gelu_forward(out.data(), x.data(), 4);
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
  CHECK(out[0] == 0.0);
  CHECK(out[1] == Approx(0.8411919906082768).epsilon(1e-12));
  CHECK(out[2] == Approx(-0.15880800939172324).epsilon(1e-12));
  CHECK(out[3] == Approx(2.996362607918227).epsilon(1e-12));
}

TEST_CASE("gelu backward matches finite differences", "[unit][kernels]") {
  const size_t n = 37;
  std::vector<double> x = random_vec(n, 21, 2.0);
  const std::vector<double> dout = random_vec(n, 22);
  std::vector<double> out(n);
  auto loss = [&] {
    gelu_forward(out.data(), x.data(), n);
    return dot(out, dout);
  };
  std::vector<double> dx(n, 0.5);  // backward overwrites: start from garbage
  gelu_backward(dx.data(), x.data(), dout.data(), n);
  require_close(dx, numeric_grad(x, loss), 1e-6, 1e-8, "dinp");
}

}  // namespace diloco
