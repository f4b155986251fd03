#include "daemon/export/model_eval.h"

#include <omp.h>

#include <cmath>

#include "daemon/train/trainer.h"

namespace diloco {

std::vector<EvalWindow> FullSplitWindows(size_t n, int T) {
  std::vector<EvalWindow> windows;
  if (n < 2 || T < 1) return windows;
  const size_t targets = n - 1;
  for (size_t begin = 0; begin < targets; begin += (size_t)T)
    windows.push_back({begin, (int)std::min<size_t>((size_t)T, targets - begin)});
  return windows;
}

FullEvalSums EvaluateFullSplit(TrainingBackend& backend, TokenSpan val, int batch, int T,
                               const std::function<void(size_t, size_t)>& progress) {
  const std::vector<EvalWindow> windows = FullSplitWindows(val.size(), T);
  FullEvalSums sums;
  std::vector<int> inputs((size_t)batch * T), targets((size_t)batch * T);
  size_t w = 0;
  while (w < windows.size()) {
    // Full-length windows share a batch; the short last one goes alone.
    const int len = windows[w].len;
    int rows = 0;
    while (w + rows < windows.size() && rows < batch && windows[w + rows].len == len) {
      const EvalWindow& win = windows[w + rows];
      for (int t = 0; t < len; t++) {
        inputs[(size_t)rows * len + t] = val[win.begin + t];
        targets[(size_t)rows * len + t] = val[win.begin + t + 1];
      }
      rows++;
    }
    const double mean = backend.eval_loss(inputs.data(), targets.data(), rows, len);
    sums.loss_sum += mean * rows * len;
    sums.tokens += (int64_t)rows * len;
    sums.batches++;
    sums.windows += rows;
    w += rows;
    if (progress) progress(w, windows.size());
  }
  return sums;
}

Status EvaluateModel(const ModelSource& source, const ModelEvalOptions& options, ModelEvalResult* out) {
  const RunConfig& cfg = source.config;
  omp_set_num_threads(options.threads > 0 ? options.threads : omp_get_num_procs());
  std::unique_ptr<Corpus> corpus;
  DL_RETURN_IF_ERROR(Corpus::Load(cfg.data.corpus, CorpusOptionsOf(cfg, 0, 1), &corpus)
                         .WithContext("the run's corpus (data.corpus in its config)"));
  if (corpus->val_tokens().empty())
    return Status::Error("the run's config has data.val_fraction 0: there is no validation split to evaluate on");
  const int B = cfg.train.batch_size, T = source.model.block_size;

  ModelEvalResult r;
  r.corpus = cfg.data.corpus;
  r.val_tokens = (int64_t)corpus->val_tokens().size();
  r.val_begin = (int64_t)corpus->total_tokens() - r.val_tokens;
  r.tokens_are_bytes = cfg.data.format == DataFormat::kBytes;
  if (options.full) {
    std::unique_ptr<TrainingBackend> backend;
    if (std::string err = CreateBackend(options.device, {source.model, B}, &backend); !err.empty())
      return Status::Error("cannot evaluate on " + options.device + ": " + err);
    backend->upload_params(source.params.data());
    const FullEvalSums sums = EvaluateFullSplit(*backend, corpus->val_tokens(), B, T, options.progress);
    r.mode = "full";
    r.val_loss = sums.tokens > 0 ? sums.loss_sum / sums.tokens : 0;
    r.batches = sums.batches;
    r.windows = sums.windows;
    r.tokens = sums.tokens;
  } else {
    const int batches = options.batches > 0 ? options.batches : cfg.eval.batches;
    const BatchSampler val = ValSampler(*corpus, B, T, cfg.train.seed);
    DL_RETURN_IF_ERROR(EvaluateParams(options.device, source.model, source.params.data(), val, batches, &r.val_loss));
    r.mode = "sampled";
    r.batches = batches;
    r.windows = (int64_t)batches * B;
    r.tokens = r.windows * T;
  }
  r.bits_per_token = r.val_loss / std::log(2.0);
  *out = std::move(r);
  return Status::Ok();
}

}  // namespace diloco
