// What a finished multi-learner run reports, built the same way by local mode and the virtual
// runtime: each learner over its incarnations, and the run's goodput, uptime and waste
// (sync/goodput.h) from its merge tape (the syncer's merges, handed over as they happen) and what
// each learner incarnation recorded. Times are the run's clock (Unix ms, virtual in a virtual run).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/sync/goodput.h"
#include "daemon/sync/merge_tape.h"
#include "daemon/train/learner.h"
#include "daemon/train/local_run.h"
#include "daemon/util/jsonl_writer.h"
#include "daemon/util/status.h"

namespace diloco {

// The start (or resume) line every run writes first to its metrics.jsonl — local, virtual and
// daemon runs: {"event": "start" | "resume", "step": 0, "params", "learners", "mode", "threads"}.
nlohmann::json RunStartLine(const RunConfig& cfg, bool resume, int threads);

// One learner over its incarnations, as a run's summary adds it up.
struct LearnerTotals {
  long tokens = 0;
  double train_s = 0, final_train_loss = 0;
  uint64_t bytes_up = 0, bytes_down = 0;
};

// The one rule by which local, virtual and daemon runs add a learner into their summary (of
// s->learners learners): its steps are its tokens over one learner step's (LearnerTokensPerStep),
// summed, as are tokens and bytes; train_s is the longest; the final train loss is the mean.
void AddLearnerTotals(const RunConfig& cfg, const LearnerTotals& t, TrainSummary* s);

// Each learner over all its incarnations (incarnations[i], in order) into *s (steps, tokens,
// bytes, train_s, final train loss, learner_tokens) and *details (may be null; reset first), and
// its "learner_done" line in metrics.
Status SummarizeLearners(const RunConfig& cfg, const std::vector<std::vector<const LearnerResult*>>& incarnations,
                         JsonlWriter& metrics, TrainSummary* s, LocalRunDetails* details);

// incarnations[i]: learner i's incarnations in order; down[i]: when it was down ([start, end) in
// Unix ms, end 0 = until the end); end_unix_ms: when training ended.
Status AccountGoodput(const RunConfig& cfg, const MergeTape& merges,
                      const std::vector<std::vector<const LearnerResult*>>& incarnations,
                      const std::vector<std::vector<std::pair<int64_t, int64_t>>>& down, int64_t end_unix_ms,
                      GoodputReport* out);

}  // namespace diloco
