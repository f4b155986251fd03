// Validation loss of an opened model (model_source.h) on its run's corpus split, for
// `dilococtl eval`.
//
// Two modes:
//   sampled (default)  the first `batches` batches of the run's validation sampler
//                      (trainer.h ValSampler: train.batch_size rows of block_size tokens, seeded by
//                      train.seed), exactly what training's evaluations and the summary's
//                      final_val_loss use, so with batches = final_val_batches they agree.
//   full               the whole validation split, deterministic: split the N val tokens into
//                      consecutive non-overlapping windows starting at 0, T, 2T, ... (T =
//                      block_size); window k feeds tokens [kT, kT + len) and scores the next
//                      token of each, targets [kT + 1, kT + len + 1), with len = T except for the
//                      last window, which is shorter (len = N - 1 - kT, the targets that are left)
//                      and still starts its own context. Every val token but the first is scored
//                      exactly once (N - 1 targets), each with the context since its window's
//                      start. Windows go train.batch_size at a time (the last batch may have fewer
//                      rows; the short window is a batch of its own). The loss is the mean over
//                      all targets (token-weighted).
// Both report the mean cross-entropy in nats; bits per token = loss / ln 2 (bits per byte for
// data.format bytes, whose tokens are bytes).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "daemon/export/model_source.h"
#include "daemon/train/data.h"
#include "daemon/util/status.h"
#include "kernels/backend.h"

namespace diloco {

struct ModelEvalOptions {
  bool full = false;
  int batches = 0;  // sampled: 0 = the run's eval.batches
  std::string device = "cpu";
  int threads = 0;  // OpenMP threads; 0 = every core
  // full: called after each batch with windows done and the total.
  std::function<void(size_t done, size_t total)> progress;
};

struct ModelEvalResult {
  std::string mode;       // "sampled" or "full"
  double val_loss = 0;    // nats per token
  int64_t batches = 0;    // forward passes
  int64_t windows = 0;    // sequences scored
  int64_t tokens = 0;     // targets scored
  double bits_per_token = 0;
  bool tokens_are_bytes = true;  // data.format bytes: bits_per_token is bits per byte
  std::string corpus;
  int64_t val_begin = 0;   // where the split starts, in tokens of the whole corpus
  int64_t val_tokens = 0;  // its length
};

// One window of the full split: tokens [begin, begin + len) in, [begin + 1, begin + len + 1) scored.
struct EvalWindow {
  size_t begin = 0;
  int len = 0;
};
// The windows of the full mode (above) over n val tokens with block size T (n >= 2).
std::vector<EvalWindow> FullSplitWindows(size_t n, int T);

// Token-weighted mean loss over every window of val on backend, batch rows at a time.
struct FullEvalSums {
  double loss_sum = 0;  // nats, summed over targets
  int64_t tokens = 0;
  int64_t batches = 0;
  int64_t windows = 0;
};
FullEvalSums EvaluateFullSplit(TrainingBackend& backend, TokenSpan val, int batch, int T,
                               const std::function<void(size_t, size_t)>& progress);

// Loads the run's corpus (its config's data section) and evaluates source's parameters.
Status EvaluateModel(const ModelSource& source, const ModelEvalOptions& options, ModelEvalResult* out);

}  // namespace diloco
