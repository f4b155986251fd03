#include "kernels/layernorm.h"

#include "tests/kernels/op_testing.h"

namespace diloco {
using namespace diloco::testing;

TEST_CASE("layernorm forward normalises a hand-computed row", "[unit][kernels]") {
  // x = [1, 2, 3, 4]: mean 2.5, var 1.25.
  const std::vector<double> x = {1, 2, 3, 4}, w = {1, 1, 2, 1}, b = {0, 0, 0, 1};
  std::vector<double> out(4), mean(1), rstd(1);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), 1, 4);
  const double s = 1.0 / std::sqrt(1.25 + 1e-5);
  CHECK(mean[0] == Approx(2.5));
  CHECK(rstd[0] == Approx(s));
  require_close(out, std::vector<double>{-1.5 * s, -0.5 * s, 2 * 0.5 * s, 1.5 * s + 1}, 1e-12, 1e-12, "out");
}

TEST_CASE("layernorm backward matches finite differences", "[unit][kernels]") {
  for (const auto& [N, C] : {std::pair{3, 5}, std::pair{7, 13}, std::pair{1, 1 + 2}}) {
    std::vector<double> x = random_vec(N * C, 10 + C), w = random_vec(C, 11), b = random_vec(C, 12);
    const std::vector<double> dout = random_vec(N * C, 13);
    std::vector<double> out(N * C), mean(N), rstd(N);
    auto loss = [&] {
      layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
      return dot(out, dout);
    };
    loss();
    std::vector<double> dx(N * C, 0.0), dw(C, 0.0), db(C, 0.0);
    layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                       rstd.data(), N, C);
    require_close(dx, numeric_grad(x, loss), 1e-5, 1e-7, "dinp");
    require_close(dw, numeric_grad(w, loss), 1e-5, 1e-7, "dweight");
    require_close(db, numeric_grad(b, loss), 1e-5, 1e-7, "dbias");
  }
}

}  // namespace diloco
