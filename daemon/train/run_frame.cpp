#include "daemon/train/run_frame.h"

#include <omp.h>

#include <cstdio>
#include <filesystem>

#include "daemon/train/checkpoint.h"
#include "daemon/train/run_summary.h"
#include "daemon/train/trainer.h"

namespace diloco {

namespace fs = std::filesystem;

Status SaveMergedCheckpoint(const std::string& run_dir, const RunConfig& cfg, const float* params, uint64_t merges,
                            std::string* path) {
  *path = (fs::path(run_dir) / "checkpoint.bin").string();
  return SaveCheckpoint(*path, GptConfigOf(cfg.model), params, AdamWState{}, (long)merges, RunConfigToYaml(cfg));
}

Status RunFrame::Open(const TrainOptions& options, std::unique_ptr<RunFrame>* out) {
  std::unique_ptr<RunFrame> f(new RunFrame());
  f->cfg_ = options.config;
  f->run_dir_ = options.run_dir;
  const RunConfig& cfg = f->cfg_;
  const int M = cfg.sync.learners;
  DL_RETURN_IF_ERROR(PrepareRunDir(options.run_dir, cfg));
  DL_RETURN_IF_ERROR(f->metrics_.Open((fs::path(options.run_dir) / "metrics.jsonl").string()));
  DL_RETURN_IF_ERROR(f->learner_metrics_.Open(options.run_dir, M));
  // Validation data (the same tail for every learner) and the initial model.
  DL_RETURN_IF_ERROR(Corpus::Load(cfg.data.corpus, CorpusOptionsOf(cfg, 0, M), &f->corpus_));
  f->gc_ = GptConfigOf(cfg.model);
  f->table_ = gpt_tensor_table(f->gc_);
  f->init_.resize(f->table_.total_numel());
  gpt_init_params(f->gc_, cfg.train.seed, f->init_.data());
  f->val_ = std::make_unique<BatchSampler>(ValSampler(*f->corpus_, cfg.train.batch_size, cfg.model.block_size, cfg.train.seed));
  f->threads_ = cfg.train.threads > 0 ? cfg.train.threads : omp_get_num_procs();
  omp_set_num_threads(f->threads_);
  f->plan_ = PlanLocal(cfg, LearnersOwnDevices(cfg.train, M), f->threads_);
  f->s_.learners = M;
  f->s_.run_dir = options.run_dir;
  *out = std::move(f);
  return Status::Ok();
}

Status RunFrame::Begin(bool resume, const nlohmann::json& extra) {
  DL_RETURN_IF_ERROR(
      EvaluateParams(plan_.eval_device, gc_, init_.data(), *val_, cfg_.eval.batches, &s_.initial_val_loss));
  nlohmann::json line = RunStartLine(cfg_, resume, threads_);
  line.update(extra);
  line["val_loss"] = s_.initial_val_loss;
  return metrics_.Write(line);
}

Status RunFrame::Finish(const RunEnd& end, LocalRunDetails* details, TrainSummary* summary) {
  TrainSummary s = s_;
  DL_RETURN_IF_ERROR(SummarizeLearners(cfg_, end.incarnations, metrics_, &s, details));
  s.outer_steps = end.outer_steps;
  s.shard_merges = end.shard_merges;
  s.dropped_deltas = end.dropped_deltas;
  s.rejected_deltas = end.rejected_deltas;
  s.versions = end.versions;
  omp_set_num_threads(threads_);
  DL_RETURN_IF_ERROR(
      EvaluateParams(plan_.eval_device, gc_, end.global_params, *val_, cfg_.eval.batches, &s.final_val_loss));
  s.final_val_batches = cfg_.eval.batches;
  s.global_state = (fs::path(run_dir_) / "global_state.bin").string();
  DL_RETURN_IF_ERROR(SaveMergedCheckpoint(run_dir_, cfg_, end.global_params, end.outer_steps, &s.checkpoint));
  DL_RETURN_IF_ERROR(metrics_.Write({{"event", "eval"}, {"step", s.steps}, {"val_loss", s.final_val_loss}}));
  s.tokens_per_s = s.train_s > 0 ? s.tokens / s.train_s : 0;
  GoodputReport g;
  if (Status st = AccountGoodput(cfg_, *end.merges, end.incarnations, end.down, end.end_unix_ms, &g); st.ok())
    s.goodput = g;
  else
    std::fprintf(stderr, "goodput not accounted: %s\n", st.message().c_str());
  s.wall_s = end.wall_s;
  s.peak_rss_mb = end.peak_rss_mb;
  nlohmann::json ev = TrainSummaryObject(s);
  ev["event"] = "summary";
  DL_RETURN_IF_ERROR(metrics_.Write(ev));
  *summary = s;
  return Status::Ok();
}

}  // namespace diloco
