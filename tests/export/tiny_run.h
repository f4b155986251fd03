// The tiny training runs the export and eval tests read back: one learner, or several in
// decoupled mode (2 fragments, H = 4, quorum 2, a 100 ms grace cap), 1 thread, quiet, writing to
// tmp/run. The caller picks the model, corpus, batch, steps and eval batches.
#pragma once
#include <string>

#include "daemon/train/trainer.h"
#include "tests/temp_dir.h"

namespace diloco::testing {

inline TrainOptions TinyRunOptions(const TempDir& tmp, int learners, const std::string& run) {
  TrainOptions o;
  RunConfig& c = o.config;
  c.train.warmup_steps = 1;
  c.train.threads = 1;
  c.sync.learners = learners;
  if (learners > 1) {
    c.sync.mode = SyncMode::kDecoupled;
    c.sync.fragments = 2;
    c.sync.inner_steps = 4;
    c.sync.quorum = 2;
    c.sync.grace.cap_ms = 100;
  }
  o.run_dir = (tmp.path() / run).string();
  o.quiet = true;
  return o;
}

}  // namespace diloco::testing
