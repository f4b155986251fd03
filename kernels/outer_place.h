// Where a GPU learner keeps its outer-sync state (train.outer_state; the sync ops of
// kernels/backend.h): per fragment its base, previous base, θ at send and residual, 16 bytes a
// parameter of the rank's part.
//   device  in the GPU's memory.
//   host    in pinned host memory that the sync kernels read and write in place over the host
//           link; the GPU keeps only one fragment's scratch. The ops run once per fragment sync
//           (every H inner steps), so the slower link costs little, and the GPU gains 16 B a
//           parameter (unsharded) for the model.
// A CPU learner's state is in host memory either way (train.outer_state: host is refused there).
// A header of names only, as kernels/shard.h.
#pragma once

#include <array>
#include <string_view>

namespace diloco {

enum class OuterStatePlace { kDevice, kHost };
inline constexpr std::array<std::string_view, 2> kOuterStatePlaceNames = {"device", "host"};

}  // namespace diloco
