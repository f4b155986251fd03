#include <catch2/catch.hpp>
#include <vector>

#include "daemon/sync/fold.h"

namespace diloco {
namespace {

TEST_CASE("sync: fold: overwrite, replay and mix a new global fragment", "[unit][sync]") {
  const std::vector<float> global = {1, 2, -1};
  const std::vector<float> included = {4, 3, 0};  // θ when the delta Θ holds was sent
  const std::vector<float> local0 = {5, 5, 0.5};  // θ now: it moved on since

  std::vector<float> local = local0;
  FoldGlobal(FoldRule::kOverwrite, 0.5, global.data(), nullptr, local.data(), local.size());
  CHECK(local == global);

  // Θ plus the progress made while the delta was in flight: (1, 2, 0.5).
  local = local0;
  FoldGlobal(FoldRule::kReplay, 0.5, global.data(), included.data(), local.data(), local.size());
  CHECK(local == std::vector<float>{2, 4, -0.5});
  // Nothing happened since the send: replay is overwrite.
  local = included;
  FoldGlobal(FoldRule::kReplay, 0.5, global.data(), included.data(), local.data(), local.size());
  CHECK(local == global);

  local = local0;
  FoldGlobal(FoldRule::kMix, 0.25, global.data(), nullptr, local.data(), local.size());
  CHECK(local[0] == Approx(0.25 * 5 + 0.75 * 1));
  CHECK(local[1] == Approx(0.25 * 5 + 0.75 * 2));
  CHECK(local[2] == Approx(0.25 * 0.5 + 0.75 * -1));
  // α = 0 is overwrite, α = 1 keeps the local fragment.
  local = local0;
  FoldGlobal(FoldRule::kMix, 0.0, global.data(), nullptr, local.data(), local.size());
  CHECK(local == global);
  local = local0;
  FoldGlobal(FoldRule::kMix, 1.0, global.data(), nullptr, local.data(), local.size());
  CHECK(local == local0);
}

}  // namespace
}  // namespace diloco
