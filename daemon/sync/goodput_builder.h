// The input of ComputeGoodput (goodput.h), built one way by every runtime that accounts a run:
// local and virtual runs at their end (train/run_summary.cpp), ddp (train/ddp_run.cpp) and a
// daemon job's syncer while the job runs (control/live_goodput.cpp). Records come in on the run's
// clock (Unix ms; virtual in a virtual run) and leave as seconds since the start, under the rules
// all of them share:
//   nominal rate    NominalTokensPerS of a learner's work, summed over its incarnations (AddWork)
//   wall time       from the start to the end given, or to the last merge or loss when that is
//                   later (a flush merges after the learners' last step)
//   times           clipped to [0, wall]; an open span (end 0) runs to the end; where a down span
//                   overlaps another activity, down wins (a kill can land during a wait)
//   merge interval  H × the slowest learner's nominal step time / P: every fragment fires on its
//                   own schedule (expected_merge_interval_s)
#pragma once

#include <cstdint>
#include <vector>

#include "daemon/sync/goodput.h"
#include "daemon/sync/merge_tape.h"
#include "daemon/util/status.h"

namespace diloco {

class GoodputBuilder {
 public:
  // fragment_weights: numel shares (sum 1); tokens_per_step: one learner step's; inner_steps: H.
  GoodputBuilder(int64_t start_unix_ms, int learners, std::vector<double> fragment_weights, double tokens_per_step,
                 int inner_steps);

  void AddWork(int learner, double tokens, double provisioned_s);
  void AddSpan(int learner, int64_t start_unix_ms, int64_t end_unix_ms, Activity activity);  // end 0: open
  void AddMerged(int64_t unix_ms, int fragment, int learner, double tokens);
  void AddLost(int64_t unix_ms, int fragment, int learner, double tokens, LossCause cause);
  void AddMerges(const MergeTape& tape);  // its merged and dropped deltas

  // An error when no learner has done a step yet (no nominal rate).
  Status Build(int64_t end_unix_ms, GoodputInput* out) const;

 private:
  struct Span {
    int learner;
    int64_t start_ms, end_ms;
    Activity activity;
  };
  double Seconds(int64_t unix_ms) const { return (double)(unix_ms - start_ms_) / 1000; }

  const int64_t start_ms_;
  const std::vector<double> weights_;
  const double tokens_per_step_;
  const int inner_steps_;
  std::vector<double> tokens_, provisioned_s_;  // per learner
  std::vector<Span> spans_;
  std::vector<MergedDelta> merged_;  // times in seconds since the start, not clipped yet
  std::vector<LostDelta> lost_;
};

}  // namespace diloco
