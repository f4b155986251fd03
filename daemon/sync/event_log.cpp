#include "daemon/sync/event_log.h"

namespace diloco {

nlohmann::json MergeEventToJson(const MergeEvent& event) {
  nlohmann::json contributors = nlohmann::json::array();
  for (const MergeContributor& c : event.contributors) {
    contributors.push_back({{"learner", c.learner},
                            {"weight", c.weight},
                            {"staleness", c.staleness},
                            {"base_version", c.base_version},
                            {"tokens", c.tokens},
                            {"steps", c.steps}});
  }
  nlohmann::json skipped = nlohmann::json::array();
  for (const SkippedDelta& s : event.skipped) {
    skipped.push_back({{"learner", s.learner}, {"why", s.why}, {"detail", s.detail}, {"tokens", s.tokens}});
  }
  return {{"event", "merge"},
          {"time_ms", event.time_ms},
          {"fragment", event.fragment},
          {"version", event.version},
          {"reason", event.reason},
          {"grace_ms", event.grace_ms},
          {"delta_norm", event.delta_norm},
          {"update_norm", event.update_norm},
          {"contributors", std::move(contributors)},
          {"skipped", std::move(skipped)}};
}

}  // namespace diloco
