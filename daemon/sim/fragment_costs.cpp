#include "daemon/sim/fragment_costs.h"

#include "daemon/net/codec.h"
#include "daemon/sync/protocol.h"

namespace diloco {

FragmentCosts FragmentCostsOf(const std::vector<Fragment>& fragments, const SyncConfig& sync) {
  FragmentCosts c;
  c.weights = FragmentWeights(fragments);
  for (const Fragment& f : fragments) {
    c.delta_bytes.push_back((double)MaxEncodedBytes(UplinkCodec(sync), f.numel));
    c.global_bytes.push_back((double)MaxEncodedBytes(DownlinkCodec(sync), f.numel));
    c.merge_bytes.push_back((double)f.numel * sizeof(float));
  }
  return c;
}

}  // namespace diloco
