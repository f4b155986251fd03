// The learner's fold of a new global fragment Θ_p into its local copy θ_p
// (packed fragment vectors, fragments.h). The AdamW moments are not touched.
//   overwrite:  θ ← Θ                          (paper default)
//   replay:     θ ← Θ + (θ − θ_included)       (keeps the local progress Θ
//               cannot contain: the steps made since θ_included)
//   mix:        θ ← α·θ + (1 − α)·Θ
// θ_included is θ_p as of the delta this learner sent (θ at send) when the
// Global includes it, else the fragment's base_p (the last global folded):
// either way, the point up to which Θ already holds this learner's work.
// After the fold the caller sets base_p ← Θ and resets c_steps/c_tokens.
// The arithmetic is kernels/sync_ops.h's fold (FoldMode; θ_included is its theta_at_send),
// which this calls: mix is fma(α, θ, (1 − α)·Θ) with α and 1 − α rounded to float from the
// double, replay Θ + (θ − θ_included), each rounding pinned so every site folds the same bits.
#pragma once

#include <cstddef>

#include "daemon/config/sync_config.h"
#include "kernels/check.h"
#include "kernels/sync_ops.h"

namespace diloco {

// The engine's fold mode of a run config's sync.fold (the learner folds on its backend).
inline FoldMode FoldModeOf(FoldRule rule) {
  switch (rule) {
    case FoldRule::kOverwrite: return FoldMode::kOverwrite;
    case FoldRule::kReplay: return FoldMode::kReplay;
    case FoldRule::kMix: return FoldMode::kMix;
  }
  return FoldMode::kOverwrite;
}

// local[0..n) ← fold(local, global) on host vectors. included is read only by kReplay (it
// may be null otherwise); alpha only by kMix.
inline void FoldGlobal(FoldRule rule, double alpha, const float* global, const float* included, float* local,
                       size_t n) {
  DL_CHECK(rule != FoldRule::kReplay || included != nullptr, "fold replay needs theta as of the delta Θ includes");
  fold(local, global, included, FoldModeOf(rule), alpha, n);
}

}  // namespace diloco
