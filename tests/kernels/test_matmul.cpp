#include "kernels/matmul.h"

#include "tests/kernels/op_testing.h"

namespace diloco {
using namespace diloco::testing;

TEST_CASE("matmul forward on a hand-computed case", "[unit][kernels]") {
  // inp (2,3), weight (2,3) as (OC,C), bias (2)
  const std::vector<float> inp = {1, 2, 3, 4, 5, 6}, w = {1, 0, -1, 2, 1, 0}, b = {0.5f, -1};
  const std::vector<float> expected = {-1.5f, 3, -1.5f, 12};
  std::vector<float> out(4);
  matmul_forward_reference(out.data(), inp.data(), w.data(), b.data(), 2, 3, 2);
  CHECK(out == expected);
  std::fill(out.begin(), out.end(), -7.0f);
  matmul_forward(out.data(), inp.data(), w.data(), b.data(), 2, 3, 2);
  CHECK(out == expected);
}

TEST_CASE("matmul reference backward matches finite differences", "[unit][kernels]") {
  const int N = 5, C = 7, OC = 3;
  std::vector<double> x = random_vec(N * C, 41), w = random_vec(OC * C, 42), b = random_vec(OC, 43);
  const std::vector<double> dout = random_vec(N * OC, 44);
  std::vector<double> out(N * OC);
  auto loss = [&] {
    matmul_forward_reference(out.data(), x.data(), w.data(), b.data(), N, C, OC);
    return dot(out, dout);
  };
  std::vector<double> dx(N * C, 7.0), dw(OC * C, 0.0), db(OC, 0.0);  // dinp is overwritten
  matmul_backward_reference(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C, OC);
  require_close(dx, numeric_grad(x, loss), 1e-6, 1e-8, "dinp");
  require_close(dw, numeric_grad(w, loss), 1e-6, 1e-8, "dweight");
  require_close(db, numeric_grad(b, loss), 1e-6, 1e-8, "dbias");
}

TEST_CASE("matmul fast path matches the reference", "[unit][kernels]") {
  for (const auto& [N, C, OC] : {std::tuple{1, 1, 1}, std::tuple{17, 13, 29}, std::tuple{130, 64, 192}}) {
    const auto x = random_vec<float>(N * C, 51), w = random_vec<float>(OC * C, 52), b = random_vec<float>(OC, 53);
    const auto dout = random_vec<float>(N * OC, 54);
    std::vector<float> out_ref(N * OC), out(N * OC);
    matmul_forward_reference(out_ref.data(), x.data(), w.data(), b.data(), N, C, OC);
    matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
    require_close_to_scale(out, out_ref, 1e-5, "out");
    // dweight and dbias are added to: start both from the same non-zero
    // values; dinp is overwritten: start the fast path from garbage.
    auto dx_ref = random_vec<float>(N * C, 55), dw_ref = random_vec<float>(OC * C, 56), db_ref = random_vec<float>(OC, 57);
    auto dw = dw_ref, db = db_ref;
    std::vector<float> dx(N * C, -3.0f);
    matmul_backward_reference(dx_ref.data(), dw_ref.data(), db_ref.data(), dout.data(), x.data(), w.data(), N, C, OC);
    matmul_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, C, OC);
    require_close_to_scale(dx, dx_ref, 1e-5, "dinp");
    require_close_to_scale(dw, dw_ref, 1e-5, "dweight");
    require_close_to_scale(db, db_ref, 1e-5, "dbias");
    // Without bias.
    matmul_forward(out.data(), x.data(), w.data(), nullptr, N, C, OC);
    matmul_forward_reference<float>(out_ref.data(), x.data(), w.data(), nullptr, N, C, OC);
    require_close_to_scale(out, out_ref, 1e-5, "out without bias");
  }
}

}  // namespace diloco
