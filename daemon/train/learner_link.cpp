#include "daemon/train/learner_link.h"

#include "daemon/sync/protocol.h"
#include "kernels/rng.h"

namespace diloco {

net::LinkParams LinkParamsOf(const LinkConfig& link) {
  net::LinkParams p;
  p.bandwidth_bytes_per_s = link.bandwidth_mbps * 1e6 / 8;
  p.latency_ms = link.latency_ms;
  p.jitter_ms = link.jitter_ms;
  p.loss = link.loss;
  return p;
}

Status CreateLearnerLink(net::NetContext& context, const RunConfig& cfg, int index, const net::LinkParams& base,
                         std::shared_ptr<net::Link>* out) {
  net::LinkOptions lo;
  lo.name = LearnerName(index) + "<->syncer";
  lo.up = base;
  lo.down = base;
  lo.seed = mix_seed(cfg.train.seed, 1000 + index);
  return net::Link::Create(context, lo, out).WithContext(LearnerName(index) + "'s link");
}

}  // namespace diloco
