#include "kernels/encoder.h"

#include "tests/kernels/op_testing.h"

namespace diloco {
using namespace diloco::testing;

TEST_CASE("encoder forward adds token and position rows", "[unit][kernels]") {
  // V=3, T=2, C=2, B=1
  const std::vector<float> wte = {1, 2, 3, 4, 5, 6};
  const std::vector<float> wpe = {10, 20, 30, 40};
  const std::vector<int> tokens = {2, 0};
  std::vector<float> out(4);
  encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), 1, 2, 2);
  CHECK(out == std::vector<float>{15, 26, 31, 42});
}

TEST_CASE("encoder backward matches finite differences", "[unit][kernels]") {
  const int B = 2, T = 5, C = 7, V = 4;
  std::vector<double> wte = random_vec(V * C, 1), wpe = random_vec(T * C, 2);
  const std::vector<int> tokens = {0, 3, 3, 1, 2, 2, 2, 0, 1, 3};
  const std::vector<double> w = random_vec(B * T * C, 3);
  std::vector<double> out(B * T * C);
  auto loss = [&] {
    encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, w);
  };
  std::vector<double> dwte(V * C, 0.0), dwpe(T * C, 0.0);
  encoder_backward(dwte.data(), dwpe.data(), w.data(), tokens.data(), B, T, C);
  require_close(dwte, numeric_grad(wte, loss), 1e-6, 1e-8, "dwte");
  require_close(dwpe, numeric_grad(wpe, loss), 1e-6, 1e-8, "dwpe");
}

}  // namespace diloco
