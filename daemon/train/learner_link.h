// A learner's emulated link to the syncer (net/link_shaper.h), made one way by local mode (every
// learner, shaped by sync.link) and a daemon's learner role (on sites with chaos: true, unshaped
// until a chaos command cuts it): its name in log lines and its seed, so its random drops repeat.
#pragma once

#include <memory>

#include "daemon/config/run_config.h"
#include "daemon/net/context.h"
#include "daemon/net/link_shaper.h"
#include "daemon/util/status.h"

namespace diloco {

// sync.link as link parameters (both directions).
net::LinkParams LinkParamsOf(const LinkConfig& link);

// Learner index's link ("learner-<i><->syncer"), both directions at base.
Status CreateLearnerLink(net::NetContext& context, const RunConfig& cfg, int index, const net::LinkParams& base,
                         std::shared_ptr<net::Link>* out);

}  // namespace diloco
