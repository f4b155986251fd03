// What each fragment of a run's real model costs a simulated deployment: its share of the model
// (goodput's fragment weights), its bytes on the wire each way under the run's codecs (exact when
// dense; top-k's bound, MaxEncodedBytes), and its fp32 bytes (what a merge reads per
// contributor). `dilococtl simulate` runs a tiny model and charges these instead.
#pragma once

#include <vector>

#include "daemon/config/sync_config.h"
#include "daemon/sync/fragments.h"

namespace diloco {

struct FragmentCosts {
  std::vector<double> weights;       // numel / the model's, summing to 1
  std::vector<double> delta_bytes;   // uplink (sync.codec.up)
  std::vector<double> global_bytes;  // downlink (sync.codec.down)
  std::vector<double> merge_bytes;   // numel x 4
};

FragmentCosts FragmentCostsOf(const std::vector<Fragment>& fragments, const SyncConfig& sync);

}  // namespace diloco
