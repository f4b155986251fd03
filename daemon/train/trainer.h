// Single-learner training run: the inner loop of every later mode, with a
// run directory (config.yaml, metrics.jsonl, checkpoint.bin), progress on a
// terminal, periodic evaluation and checkpoints, and a summary at the end.
#pragma once

#include <chrono>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/sync/goodput.h"
#include "daemon/sync/decide.h"
#include "daemon/train/data.h"
#include "daemon/train/local_ring.h"
#include "daemon/train/run_dir.h"
#include "daemon/util/status.h"
#include "kernels/adamw.h"
#include "kernels/backend.h"
#include "kernels/gpt.h"
#include "kernels/lr_schedule.h"

namespace diloco {

struct TrainOptions {
  RunConfig config;
  std::string run_dir;     // created if missing
  bool resume = false;     // continue from run_dir/checkpoint.bin
  bool progress = false;   // redraw one status line on stderr (a terminal)
  bool quiet = false;      // no progress lines at all
};

struct TrainSummary {
  double final_val_loss = 0;
  int final_val_batches = 0;    // validation batches behind final_val_loss (eval.batches)
  double final_train_loss = 0;  // mean of the last log_every steps
  long steps = 0;
  long tokens = 0;          // training tokens processed by this run
  double wall_s = 0;        // whole run, setup and evaluation included
  double train_s = 0;       // training steps only
  double tokens_per_s = 0;  // tokens / train_s
  uint64_t bytes_up = 0;    // learner -> syncer; 0 with one learner
  uint64_t bytes_down = 0;  // syncer -> learner; 0 with one learner
  double peak_rss_mb = 0;
  // Several learners (local_run.h); in the JSON only when learners > 1.
  int learners = 1;
  uint64_t outer_steps = 0;         // merges by the syncer (every shard's)
  std::vector<uint64_t> shard_merges;  // per syncer shard (sync.syncers > 1; in the JSON then)
  uint64_t dropped_deltas = 0;      // too stale / replaced
  uint64_t rejected_deltas = 0;     // failed the norm filter
  double initial_val_loss = 0;      // of the initial model
  std::vector<long> learner_tokens;  // per learner
  std::vector<uint64_t> versions;    // final version per fragment
  std::string run_dir;
  std::string checkpoint;    // checkpoint.bin: the model as a trainer checkpoint (the merged one)
  std::string global_state;  // several learners: the syncer's global_state.bin (empty: not in JSON)
  // Multi-learner runs: goodput, uptime and wasted work (sync/goodput.h), in the JSON as
  // "goodput", "uptime", "waste" {down, blocked, dropped, discarded}, ...
  std::optional<GoodputReport> goodput;
};

// The engine's model shape for a run config's `model` section.
GptConfig GptConfigOf(const ModelConfig& m);

// The inner optimizer of a run config's `train` section: its LR schedule (decay over all steps
// when lr_decay_steps is 0) and AdamW hyper-parameters (hp.lr is set per step from the schedule).
LrSchedule LrScheduleOf(const TrainConfig& tc);
AdamWHyper AdamWHyperOf(const TrainConfig& tc);

// train.time_limit_s: true once that many seconds have passed since start (never when 0).
inline bool TimeLimitReached(const TrainConfig& tc, std::chrono::steady_clock::time_point start) {
  return tc.time_limit_s > 0 &&
         std::chrono::steady_clock::now() - start >= std::chrono::duration<double>(tc.time_limit_s);
}

// Mean validation loss over the first `batches` batches of val (the same every time): of a
// backend's parameters, or of a parameter vector (on a fresh backend of shape gc on device).
double EvaluateBackend(TrainingBackend& backend, const BatchSampler& val, int batches);
Status EvaluateParams(const std::string& device, const GptConfig& gc, const float* params, const BatchSampler& val,
                      int batches, double* loss);

// train.device and train.ranks against this build and machine: a clear error (no CUDA in this
// build, no GPU, too few GPUs) before anything starts.
Status CheckTrainDevice(const TrainConfig& tc);

// The corpus options of learner `learner` of `num_learners` (its shard, the format, the vocab).
CorpusOptions CorpusOptionsOf(const RunConfig& config, int learner, int num_learners);
// Samplers over a corpus of either format: a learner's training shard (batch = ranks × batch_size
// rows; rank r takes rows r × batch_size ...) and the validation split (the same for everyone).
BatchSampler TrainSampler(const Corpus& corpus, int batch, int block_size, uint64_t seed);
BatchSampler ValSampler(const Corpus& corpus, int batch, int block_size, uint64_t run_seed);

// The first device of learner `ordinal`'s ring when `learners` learners of train.ranks ranks share
// one machine: each gets its own GPUs (cuda:N + ordinal × ranks ...) when there are enough; with
// one rank each and too few GPUs they share them (a 1-rank ring runs no collective, so sharing
// cannot deadlock); several multi-GPU rings on too few GPUs are an error. CPU: "cpu".
Status LearnerDevice(const TrainConfig& tc, int ordinal, int learners, std::string* device);

// What the syncer checks a delta's counts against: train.steps, and the tokens of one learner
// step (ranks × batch_size × block_size).
CountLimits CountLimitsOf(const RunConfig& config);
// The tokens one step of a learner takes: its whole ring (train.hosts x train.ranks ranks) of
// train.batch_size sequences of model.block_size tokens.
uint64_t LearnerTokensPerStep(const RunConfig& config);

// Where a ring whose run keeps a checkpoint.bin (a single learner, ddp) starts: on resume, the
// checkpoint's parameters, AdamW moments and step on every rank; else the GPT-2 init of
// train.seed at step 0 (and a run directory that already holds a checkpoint is refused).
Status StartRing(const TrainOptions& options, const std::string& checkpoint_path, LocalRing* ring,
                 long* start_step);

// A learner's local ring for a run config (train.device, train.ranks, the model, the batch).
LocalRingOptions LocalRingOptionsOf(const RunConfig& config, int threads);

// Trains to config.train.steps. Stops with an error naming the step when
// the loss or gradients become NaN/Inf (the last checkpoint is kept), or
// when SIGINT/SIGTERM arrives (a checkpoint of the current step is saved).
Status RunTraining(const TrainOptions& options, TrainSummary* summary);

// The summary as one JSON object (the last stdout line of --json).
nlohmann::json TrainSummaryObject(const TrainSummary& s);
std::string TrainSummaryJson(const TrainSummary& s);

}  // namespace diloco
