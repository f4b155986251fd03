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
#pragma once

#include <cstddef>

#include "daemon/config/sync_config.h"

namespace diloco {

// local[0..n) ← fold(local, global). included is read only by kReplay (it
// may be null otherwise); alpha only by kMix.
void FoldGlobal(FoldRule rule, double alpha, const float* global, const float* included,
                float* local, size_t n);

}  // namespace diloco
