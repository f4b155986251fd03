// One way to open a trained model from a path, for `dilococtl eval` and `dilococtl export`:
//
//   a checkpoint file   checkpoint.bin of `dilococtl train` (or ddp), a learner's learner-<i>.ckpt,
//                       or the merged-model checkpoint.bin a daemon's syncer writes beside its
//                       global_state.bin (train/checkpoint.h). The run config is the one inside.
//   a run directory     config.yaml plus, preferred in this order:
//                         global_state.bin  the syncer's merged model Θ (local multi-learner runs,
//                                           a daemon job's run/ on the syncer's site)
//                         checkpoint.bin    a single-learner or ddp run (`dilococtl train`)
//
// What it returns besides the parameters (flat, gpt_tensor_table order) and the model's shape:
//   training_steps  inner optimizer steps behind the model, summed over learners as the run
//                   summary's "steps" counts them: the summary event of metrics.jsonl when there
//                   is one; else a trainer checkpoint's step (× learners for ddp, whose ranks all
//                   take every step); else every learner's learner-<i>.step; else unknown.
//   merges          outer steps of the syncer: global_state.bin's merge count, or the step of
//                   the syncer's merged-model checkpoint; 0 for a single learner or ddp (they
//                   never merge); else unknown.
// A daemon JOB resolves to its run directory before this (apps/dilococtl/model_arg.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/util/status.h"
#include "kernels/gpt.h"

namespace diloco {

struct ModelSourceOptions {
  // The job id to report; empty: the run directory's name, or its parent's when it is called
  // "run" (dilocod's jobs/<id>/run layout).
  std::string job_id;
  // Used when the files do not tell the training steps (a daemon job's syncer site: the
  // learners ran elsewhere; `dilococtl status` knows them).
  std::optional<uint64_t> training_steps_hint;
};

struct ModelSource {
  std::string path;         // what was opened
  std::string params_path;  // the file the parameters came from
  // "global_state" (the syncer's merged model), "checkpoint" (a trainer's or learner's) or
  // "merged_checkpoint" (the syncer's merged model saved as a checkpoint).
  std::string params_kind;
  std::string job_id;
  RunConfig config;  // the run's resolved config (corpus, val split, eval batches)
  GptConfig model;
  std::vector<float> params;
  std::optional<uint64_t> training_steps;  // nullopt: unknown
  std::optional<uint64_t> merges;          // nullopt: unknown
  std::vector<uint64_t> versions;          // per fragment; global state only
};

// "12" or "unknown".
std::string CountText(const std::optional<uint64_t>& n);

// Opens path as a checkpoint file or a run directory (above). Errors name the path and what is
// missing or wrong, and what to pass instead.
Status OpenModelSource(const std::string& path, const ModelSourceOptions& options, ModelSource* out);

}  // namespace diloco
