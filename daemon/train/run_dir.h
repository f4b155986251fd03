// A run directory, written the same way by every mode and role (local `dilococtl train` and the
// daemon's roles alike):
//   config.yaml       the resolved run config (PrepareRunDir: its one writer)
//   learner-<i>.step  the last inner step learner i reached (rewritten atomically as it trains):
//                     what a resumed learner continues from
//   learner-<i>.jsonl learner i's metrics lines (its steps, evaluations, syncs), every incarnation
//                     appending; the run's own lines (start, chaos, learner_done, eval, summary)
//                     go to metrics.jsonl (a daemon job's at its syncer's site:
//                     control/job_metrics.h)
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/util/jsonl_writer.h"
#include "daemon/util/status.h"

namespace diloco {

// Creates run_dir if missing and writes config.yaml atomically.
Status PrepareRunDir(const std::string& run_dir, const RunConfig& config);

std::string LearnerStepPath(const std::string& run_dir, int learner);
Status SaveLearnerStep(const std::string& run_dir, int learner, long step);
// The step learner `learner` reached, or 0 when it never recorded one. A damaged file is an error.
Status ReadLearnerStep(const std::string& run_dir, int learner, long* step);
// learner-<i>.ckpt: a learner's own parameters and AdamW moments (train.checkpoint_every), what
// a restarted learner takes its moments from (its parameters come from the syncer's snapshot).
std::string LearnerCheckpointPath(const std::string& run_dir, int learner);

std::string LearnerMetricsPath(const std::string& run_dir, int learner);

// The metrics files of the learners a process runs (local and virtual runs: all of them), open
// for all their incarnations; a learner's writer is guarded by its mutex (a killed incarnation may
// still be writing when the next one starts).
class LearnerMetricsFiles {
 public:
  Status Open(const std::string& run_dir, int learners);
  JsonlWriter* writer(int learner) { return &files_[learner]->writer; }
  std::mutex* mu(int learner) { return &files_[learner]->mu; }

 private:
  struct File {
    JsonlWriter writer;
    std::mutex mu;
  };
  std::vector<std::unique_ptr<File>> files_;
};

}  // namespace diloco
