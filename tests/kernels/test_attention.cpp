#include "kernels/attention.h"

#include "tests/kernels/op_testing.h"

namespace diloco {
using namespace diloco::testing;

TEST_CASE("attention forward on a hand-computed case", "[unit][kernels]") {
  // B=1, T=2, C=1, NH=1: q,k,v scalars per position.
  // t=0 attends to itself only; t=1: scores q1*k0, q1*k1 (scale 1).
  const std::vector<double> inp = {/*t0*/ 1, 2, 3, /*t1*/ 1, std::log(2.0), 5};
  std::vector<double> out(2), att(4);
  attention_forward_reference(out.data(), att.data(), inp.data(), 1, 2, 1, 1);
  // t=1: softmax(2, log 2 ≈ 0.693) over keys 0,1; out = p0*3 + p1*5.
  const double p0 = std::exp(2.0) / (std::exp(2.0) + 2.0), p1 = 1 - p0;
  require_close(att, std::vector<double>{1, 0, p0, p1}, 1e-12, 1e-12, "att");
  require_close(out, std::vector<double>{3, p0 * 3 + p1 * 5}, 1e-12, 1e-12, "out");
}

TEST_CASE("attention reference backward matches finite differences", "[unit][kernels]") {
  // Odd sizes and three heads.
  const int B = 2, T = 5, C = 9, NH = 3;
  std::vector<double> inp = random_vec(B * T * 3 * C, 61);
  const std::vector<double> dout = random_vec(B * T * C, 62);
  std::vector<double> out(B * T * C), att(B * NH * T * T);
  auto loss = [&] {
    attention_forward_reference(out.data(), att.data(), inp.data(), B, T, C, NH);
    return dot(out, dout);
  };
  loss();
  std::vector<double> dinp(inp.size(), 5.0);  // overwritten
  attention_backward_reference(dinp.data(), dout.data(), inp.data(), att.data(), B, T, C, NH);
  require_close(dinp, numeric_grad(inp, loss), 1e-5, 1e-7, "dinp");
}

TEST_CASE("attention fast path matches the reference", "[unit][kernels]") {
  // T = 70 spans two row blocks of the fast path; 1 and 3 heads.
  for (const auto& [B, T, C, NH] : {std::tuple{1, 1, 4, 1}, std::tuple{2, 70, 9, 3}, std::tuple{3, 64, 32, 4}}) {
    const auto inp = random_vec<float>(B * T * 3 * C, 71);
    const auto dout = random_vec<float>(B * T * C, 72);
    std::vector<float> out_ref(B * T * C), att_ref(B * NH * T * T);
    std::vector<float> out(B * T * C, -9.0f), att(B * NH * T * T, -9.0f);  // poisoned
    attention_forward_reference(out_ref.data(), att_ref.data(), inp.data(), B, T, C, NH);
    attention_forward(out.data(), att.data(), inp.data(), B, T, C, NH);
    require_close_to_scale(out, out_ref, 1e-5, "out");
    require_close_to_scale(att, att_ref, 1e-5, "att");
    auto dinp_ref = random_vec<float>(inp.size(), 73);  // both overwrite: start from garbage
    std::vector<float> dinp(inp.size(), -4.0f);
    attention_backward_reference(dinp_ref.data(), dout.data(), inp.data(), att_ref.data(), B, T, C, NH);
    attention_backward(dinp.data(), dout.data(), inp.data(), att.data(), B, T, C, NH);
    require_close_to_scale(dinp, dinp_ref, 1e-5, "dinp");
  }
}

}  // namespace diloco
