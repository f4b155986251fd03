// Opening trained models from real files (model_source.h) and evaluating them (model_eval.h):
// a trained run directory and its checkpoint reproduce the summary's final_val_loss, the full
// mode scores every validation token once, and bad paths give clear errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "daemon/export/model_eval.h"
#include "daemon/export/model_source.h"
#include "daemon/train/checkpoint.h"
#include "daemon/train/trainer.h"
#include "tests/export/tiny_run.h"
#include "tests/temp_dir.h"
#include "tests/text_corpus.h"

namespace diloco {
namespace {
namespace fs = std::filesystem;
using diloco::testing::TempDir;

TrainOptions TinyRun(const TempDir& tmp, int learners, const std::string& run) {
  TrainOptions o = testing::TinyRunOptions(tmp, learners, run);
  RunConfig& c = o.config;
  c.model = {.n_layer = 1, .n_embd = 16, .n_head = 2, .block_size = 8};
  c.data.corpus = testing::WriteShuffledCorpus(tmp.path(), {"all the world's a stage.\n", "and all the men "}, 6000, 3);
  c.train.batch_size = 3;
  c.train.steps = learners > 1 ? 12 : 6;
  c.eval.batches = 3;
  return o;
}

ModelSource Open(const std::string& path) {
  ModelSource s;
  const Status st = OpenModelSource(path, {}, &s);
  INFO(st.message());
  REQUIRE(st.ok());
  return s;
}

ModelEvalResult Eval(const ModelSource& s, bool full, int batches = 0) {
  ModelEvalOptions o;
  o.full = full;
  o.batches = batches;
  o.threads = 1;
  ModelEvalResult r;
  const Status st = EvaluateModel(s, o, &r);
  INFO(st.message());
  REQUIRE(st.ok());
  return r;
}

TEST_CASE("model eval: full-split windows score every target once", "[unit]") {
  for (const size_t n : {2, 3, 9, 10, 17, 100, 101}) {
    for (const int T : {1, 4, 8}) {
      INFO("n " << n << " T " << T);
      const std::vector<EvalWindow> w = FullSplitWindows(n, T);
      size_t next_target = 1;
      for (size_t i = 0; i < w.size(); i++) {
        CHECK(w[i].begin + 1 == next_target);  // consecutive, no overlap, no gap
        CHECK(w[i].len >= 1);
        CHECK(w[i].len <= T);
        if (i + 1 < w.size()) CHECK(w[i].len == T);  // only the last may be short
        CHECK(w[i].begin + w[i].len + 1 <= n);       // its last target is inside the split
        next_target += w[i].len;
      }
      CHECK(next_target == n);  // targets 1 .. n-1
    }
  }
  CHECK(FullSplitWindows(1, 8).empty());
}

TEST_CASE("model eval: a run directory and its checkpoint reproduce the summary's final_val_loss", "[e2e]") {
  TempDir tmp;
  const TrainOptions o = TinyRun(tmp, 1, "run");
  TrainSummary ts;
  REQUIRE(RunTraining(o, &ts).ok());
  CHECK(ts.final_val_batches == 3);
  CHECK(TrainSummaryObject(ts)["final_val_batches"] == 3);

  const ModelSource dir = Open(o.run_dir);
  CHECK(dir.params_kind == "checkpoint");
  CHECK(dir.training_steps == 6u);
  CHECK(dir.merges == 0u);
  CHECK(dir.job_id == tmp.path().filename().string());  // <id>/run: the job dir's name
  CHECK(dir.config.data.corpus == o.config.data.corpus);
  const ModelSource ckpt = Open(o.run_dir + "/checkpoint.bin");
  CHECK(ckpt.params == dir.params);
  CHECK(ckpt.training_steps == 6u);

  for (const ModelSource* s : {&dir, &ckpt}) {
    const ModelEvalResult r = Eval(*s, /*full=*/false);  // default: eval.batches
    CHECK(r.mode == "sampled");
    CHECK(r.batches == 3);
    CHECK(r.tokens == 3 * 3 * 8);
    CHECK(r.val_loss == Approx(ts.final_val_loss).epsilon(1e-9));
    CHECK(r.bits_per_token == Approx(r.val_loss / std::log(2.0)));
    CHECK(r.tokens_are_bytes);
  }
  // Other batch counts are other estimates of the same loss.
  const ModelEvalResult more = Eval(dir, false, 7);
  CHECK(more.batches == 7);
  CHECK(more.val_loss != ts.final_val_loss);
  CHECK(std::fabs(more.val_loss - ts.final_val_loss) < 0.5);
}

TEST_CASE("model eval: --full covers the whole validation split exactly once", "[e2e]") {
  TempDir tmp;
  const TrainOptions o = TinyRun(tmp, 1, "run");
  TrainSummary ts;
  REQUIRE(RunTraining(o, &ts).ok());
  const ModelSource s = Open(o.run_dir);
  const ModelEvalResult r = Eval(s, /*full=*/true);
  const int64_t n = r.val_tokens;
  REQUIRE(n > 100);
  CHECK(r.mode == "full");
  CHECK(r.val_begin + n == (int64_t)fs::file_size(o.config.data.corpus));
  CHECK(n == (int64_t)std::floor(fs::file_size(o.config.data.corpus) * 0.1));
  CHECK(r.tokens == n - 1);  // every val token but the first is a target, once
  CHECK(r.windows == (n - 1 + 7) / 8);
  const int64_t full_windows = (n - 1) / 8;
  const bool tail = (n - 1) % 8 != 0;
  CHECK(r.batches == (full_windows + 2) / 3 + (tail ? 1 : 0));
  CHECK(std::isfinite(r.val_loss));
  CHECK(std::fabs(r.val_loss - ts.final_val_loss) < 0.5);

  // The same loss, computed window by window here.
  std::unique_ptr<TrainingBackend> backend;
  REQUIRE(CreateBackend("cpu", {s.model, 1}, &backend).empty());
  backend->upload_params(s.params.data());
  std::string text;
  {
    std::ifstream f(o.config.data.corpus, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(f), {});
  }
  double sum = 0;
  int64_t count = 0;
  for (const EvalWindow& w : FullSplitWindows((size_t)n, 8)) {
    std::vector<int> in(w.len), tg(w.len);
    for (int t = 0; t < w.len; t++) {
      in[t] = (uint8_t)text[r.val_begin + w.begin + t];
      tg[t] = (uint8_t)text[r.val_begin + w.begin + t + 1];
    }
    sum += backend->eval_loss(in.data(), tg.data(), 1, w.len) * w.len;
    count += w.len;
  }
  CHECK(count == r.tokens);
  CHECK(r.val_loss == Approx(sum / count).epsilon(1e-5));
}

TEST_CASE("model eval: a 2-learner run evaluates the merged model as its summary did", "[e2e]") {
  TempDir tmp;
  const TrainOptions o = TinyRun(tmp, 2, "run2");
  TrainSummary ts;
  const Status trained = RunTraining(o, &ts);
  INFO(trained.message());
  REQUIRE(trained.ok());
  CHECK(ts.final_val_batches == 3);
  const ModelSource s = Open(o.run_dir);
  CHECK(s.params_kind == "global_state");
  CHECK(s.merges == ts.outer_steps);
  CHECK(s.training_steps == (uint64_t)ts.steps);
  CHECK(s.versions == ts.versions);
  CHECK(Eval(s, false).val_loss == Approx(ts.final_val_loss).epsilon(1e-9));

  // The syncer's merged model saved as a checkpoint (what a daemon's syncer writes beside its
  // global_state.bin): its step counts merges, not training steps.
  REQUIRE(SaveCheckpoint(o.run_dir + "/checkpoint.bin", s.model, s.params.data(), AdamWState{}, (long)ts.outer_steps,
                         RunConfigToYaml(o.config))
              .ok());
  const ModelSource merged = Open(o.run_dir + "/checkpoint.bin");
  CHECK(merged.params_kind == "merged_checkpoint");
  CHECK(merged.merges == ts.outer_steps);
  CHECK(merged.training_steps == (uint64_t)ts.steps);  // from the run's summary beside it
  CHECK(merged.params == s.params);
}

TEST_CASE("model eval: bad paths are clear errors", "[unit]") {
  TempDir tmp;
  ModelSource s;
  Status st = OpenModelSource(tmp.file("nope"), {}, &s);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains(tmp.file("nope")) && Catch::Contains("does not exist"));

  st = OpenModelSource(tmp.Write("junk.bin", "this is not a checkpoint at all, not even close....................."
                                             "......................................................"),
                       {}, &s);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("junk.bin"));

  fs::create_directories(tmp.path() / "empty");
  st = OpenModelSource(tmp.file("empty"), {}, &s);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains(tmp.file("empty")) && Catch::Contains("config.yaml"));

  // A learner's directory on a daemon site: the hint names its own checkpoint.
  tmp.Write("learner/config.yaml", "model: {n_layer: 1, n_embd: 16, n_head: 2, block_size: 8}\ndata: {corpus: /nonexistent}\n");
  tmp.Write("learner/learner-0.ckpt", "x");
  st = OpenModelSource(tmp.file("learner"), {}, &s);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("learner-0.ckpt") && Catch::Contains("syncer"));

  // A run whose corpus is gone: eval says which file.
  TempDir tmp2;
  const TrainOptions o = TinyRun(tmp2, 1, "run");
  TrainSummary ts;
  REQUIRE(RunTraining(o, &ts).ok());
  fs::remove(o.config.data.corpus);
  const ModelSource ok = Open(o.run_dir);
  ModelEvalResult r;
  st = EvaluateModel(ok, {}, &r);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains(o.config.data.corpus) && Catch::Contains("data.corpus"));
}

}  // namespace
}  // namespace diloco
