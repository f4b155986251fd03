// The Prometheus families a dilocod exports on /metrics (metrics_port), declared in one place,
// and how a role's progress (Role::Progress) becomes their series. Names follow Prometheus's
// conventions: base units in the name (_bytes, _seconds, _versions, _ratio), _total on counters.
//
//   site      dilocod_jobs{state}
//   learner   dilocod_learner_{steps, tokens_total, loss, tokens_per_second,
//             deltas_sent_total, globals_applied_total}{job,learner}
//   syncer    (each series also labelled shard: "0" .. sync.syncers - 1; a shard's versions are
//             those of the fragments it merges)
//             dilocod_syncer_{merges_total, version{fragment}, dropped_deltas_total,
//             rejected_deltas_total, received_bytes_total, published_bytes_total, live_learners,
//             impostor_messages_total, rounds_total{reason}}
//             staleness of what was merged: dilocod_syncer_merged_staleness_versions_total and
//             dilocod_syncer_merged_contributions_total (their ratio is the mean staleness),
//             dilocod_syncer_max_staleness_versions
//             per learner, liveness apart from participation:
//             dilocod_syncer_learner_up{job,learner} (heard within the liveness window),
//             dilocod_syncer_learner_merged_deltas_total, _dropped_deltas_total,
//             _rejected_deltas_total, _merged_tokens_total {job,learner}
//   job       dilocod_job_goodput_ratio, dilocod_job_uptime_ratio, dilocod_job_waste_ratio{cause},
//             {job,shard}: each shard's over its own fragments
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "daemon/metrics/registry.h"
#include "daemon/util/status.h"

namespace diloco {

Status DeclareSiteMetrics(MetricsRegistry* registry);

// The series of one role of job `job` (role "syncer" or "learner-<i>") from its progress.
void MirrorRoleProgress(MetricsRegistry* registry, const std::string& job, const std::string& role,
                        const nlohmann::json& progress);

}  // namespace diloco
