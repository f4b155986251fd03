// What a run of several learners in this process does around its roles, written once for local
// threads on the wall clock (local_run.cpp) and virtual time (virt/virtual_run.cpp):
//   Open    the run directory (config.yaml, metrics.jsonl, learner-<i>.jsonl: run_dir.h), the
//           corpus's validation tail, the initial model and the role plan (train/role_plan.h)
//   Begin   the initial model's evaluation on the plan's device and the start line
//   Finish  each learner over its incarnations (learner_done lines), the merged model's
//           checkpoint.bin and evaluation, goodput from the merge tape and the summary line
// Between Begin and Finish the runtime runs the plan's roles its own way: threads and sockets,
// or a virtual scheduler.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/sync/merge_tape.h"
#include "daemon/train/data.h"
#include "daemon/train/learner.h"
#include "daemon/train/local_run.h"
#include "daemon/train/role_plan.h"
#include "daemon/train/run_dir.h"
#include "daemon/util/jsonl_writer.h"
#include "daemon/util/status.h"
#include "kernels/gpt.h"

namespace diloco {

// How the run ended, as its runtime saw it.
struct RunEnd {
  std::vector<std::vector<const LearnerResult*>> incarnations;  // per learner, in order
  std::vector<std::vector<std::pair<int64_t, int64_t>>> down;   // per learner: [killed, back) Unix ms
  const MergeTape* merges = nullptr;
  uint64_t outer_steps = 0, dropped_deltas = 0, rejected_deltas = 0;
  std::vector<uint64_t> shard_merges;  // per syncer shard (empty: one)
  std::vector<uint64_t> versions;  // each fragment's, at the end
  const float* global_params = nullptr;  // the merged model (table().total_numel() values)
  int64_t end_unix_ms = 0;               // when training ended, on the run's clock
  double wall_s = 0, peak_rss_mb = 0;
};

// The merged model of a run of several learners as a trainer checkpoint, run_dir/checkpoint.bin
// (for `dilococtl sample`, eval and export), beside the syncer's global_state.bin; written the
// same way by local and virtual runs and a daemon job's syncer. merges: the checkpoint's step.
Status SaveMergedCheckpoint(const std::string& run_dir, const RunConfig& cfg, const float* params, uint64_t merges,
                            std::string* path);

class RunFrame {
 public:
  // Its threads: train.threads (all of the machine's when 0), for the plan and the evaluations.
  static Status Open(const TrainOptions& options, std::unique_ptr<RunFrame>* out);

  // Evaluates the initial model and writes RunStartLine with its val_loss and what the runtime
  // adds (extra: clock, start_steps).
  Status Begin(bool resume, const nlohmann::json& extra);
  Status Finish(const RunEnd& end, LocalRunDetails* details, TrainSummary* summary);

  const RunConfig& config() const { return cfg_; }
  const GptConfig& gpt() const { return gc_; }
  const TensorTable& table() const { return table_; }
  // The model the learners start from (Begin evaluates it); a resumed run overwrites it first.
  std::vector<float>& init() { return init_; }
  const RolePlan& plan() const { return plan_; }
  int threads() const { return threads_; }
  JsonlWriter& metrics() { return metrics_; }  // the run's lines (any thread)
  LearnerMetricsFiles& learner_metrics() { return learner_metrics_; }

 private:
  RunFrame() = default;
  RunConfig cfg_;
  std::string run_dir_;
  GptConfig gc_;
  TensorTable table_;
  std::vector<float> init_;
  std::unique_ptr<Corpus> corpus_;
  std::unique_ptr<BatchSampler> val_;
  RolePlan plan_;
  int threads_ = 1;
  JsonlWriter metrics_;
  LearnerMetricsFiles learner_metrics_;
  TrainSummary s_;
};

}  // namespace diloco
