// A daemon job's run-level lines, written at its syncer's site to <run dir>/metrics.jsonl, as a
// local run writes them (train/run_dir.h): start (or resume), chaos, learner_done (once every
// learner has ended, from their results on whichever site they ran), eval and summary (when the
// syncer completes). Each learner's own lines stay in learner-<i>.jsonl on its site. The start
// line is RunStartLine (train/run_summary.h); the merged model is evaluated once, at the end: the
// initial loss is in the summary (initial_val_loss).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/train/role_plan.h"

namespace diloco {

// learner i's role result (train/roles.cpp) as {"event": "learner_done", "learner": i, ...}.
nlohmann::json LearnerDoneLine(int learner, const nlohmann::json& result);

// The `train --json` summary object of a job from its syncer's and learners' role results: the
// learners added up by local mode's rule (AddLearnerTotals), the object written as local mode
// writes it, plus the syncer's goodput. Null when a result is missing.
nlohmann::json JobSummaryObject(const RunConfig& cfg, const nlohmann::json& syncer_result,
                                const std::vector<nlohmann::json>& learner_results, const std::string& run_dir,
                                const std::string& job_id);

// The syncer shards' results (or progress objects), index = shard, as one syncer's: counters
// summed, each fragment's version from the shard that merges it, "shard_merges" per shard,
// goodput the shards' (each over its own fragments) weighted by their shares of the model; the
// rest (the evaluation, the checkpoint) from the home shard, shard 0.
nlohmann::json JoinShardResults(const std::vector<nlohmann::json>& shard_results, const ShardLayout& shards);

}  // namespace diloco
