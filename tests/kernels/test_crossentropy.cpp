#include "kernels/crossentropy.h"

#include "tests/kernels/op_testing.h"

namespace diloco {
using namespace diloco::testing;

TEST_CASE("softmax cross-entropy forward on a hand-computed row", "[unit][kernels]") {
  const std::vector<double> logits = {0.0, std::log(3.0)};  // probs 1/4, 3/4
  const std::vector<int> targets = {0};
  std::vector<double> probs(2), losses(1);
  softmax_crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), 1, 2);
  CHECK(probs[0] == Approx(0.25));
  CHECK(probs[1] == Approx(0.75));
  CHECK(losses[0] == Approx(std::log(4.0)));
}

TEST_CASE("softmax cross-entropy stays finite for huge logits", "[unit][kernels]") {
  std::vector<float> logits = {1000.0f, -1000.0f, 0.0f};
  const std::vector<int> targets = {1};
  std::vector<float> losses(1);
  softmax_crossentropy_forward(losses.data(), logits.data(), logits.data(), targets.data(), 1, 3);
  CHECK(losses[0] == Approx(2000.0f));
}

TEST_CASE("softmax cross-entropy backward matches finite differences", "[unit][kernels]") {
  const int N = 5, V = 11;
  std::vector<double> logits = random_vec(N * V, 31, 3.0);
  const std::vector<int> targets = {0, 10, 3, 3, 7};
  std::vector<double> probs(N * V), losses(N);
  const double dloss = 1.0 / N;
  auto loss = [&] {
    softmax_crossentropy_forward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
    double s = 0;
    for (double l : losses) s += l;
    return s * dloss;
  };
  loss();
  std::vector<double> dlogits(N * V, 123.0);  // overwritten, not added to
  softmax_crossentropy_backward(dlogits.data(), probs.data(), targets.data(), dloss, N, V);
  require_close(dlogits, numeric_grad(logits, loss), 1e-6, 1e-9, "dlogits");
}

}  // namespace diloco
