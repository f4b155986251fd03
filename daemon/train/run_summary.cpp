#include "daemon/train/run_summary.h"

#include <algorithm>

#include "daemon/sync/fragments.h"
#include "daemon/sync/goodput_builder.h"
#include "daemon/train/trainer.h"
#include "kernels/gpt.h"

namespace diloco {

// Training starts at the first incarnation's first step.
Status AccountGoodput(const RunConfig& cfg, const MergeTape& merges,
                      const std::vector<std::vector<const LearnerResult*>>& incarnations,
                      const std::vector<std::vector<std::pair<int64_t, int64_t>>>& down, int64_t end_unix_ms,
                      GoodputReport* out) {
  const int M = (int)incarnations.size();
  int64_t t0 = 0;
  for (const auto& incs : incarnations)
    for (const LearnerResult* r : incs)
      if (r->train_start_unix_ms > 0 && (t0 == 0 || r->train_start_unix_ms < t0)) t0 = r->train_start_unix_ms;
  if (t0 == 0) return Status::Error("no learner trained");
  std::vector<Fragment> frags;
  DL_RETURN_IF_ERROR(PartitionFragments(gpt_tensor_table(GptConfigOf(cfg.model)), EffectiveFragments(cfg.sync), &frags));
  GoodputBuilder b(t0, M, FragmentWeights(frags), (double)LearnerTokensPerStep(cfg), cfg.sync.inner_steps);
  b.AddMerges(merges);
  for (int i = 0; i < M; i++) {
    for (const LearnerResult* r : incarnations[i]) {
      b.AddWork(i, (double)r->tokens, r->provisioned_s);
      for (const auto& [from, to] : r->blocked_unix_ms) b.AddSpan(i, from, to, Activity::kBlocked);
      for (size_t p = 0; p < r->unsent_tokens_at_crash.size(); p++)
        if (r->unsent_tokens_at_crash[p] > 0)
          b.AddLost(r->crashed_unix_ms, (int)p, i, (double)r->unsent_tokens_at_crash[p], LossCause::kCrashed);
      for (const LearnerResult::Discarded& d : r->discarded) b.AddLost(d.unix_ms, d.fragment, i, d.tokens, LossCause::kDiscarded);
    }
    for (const auto& [from, to] : down[i]) b.AddSpan(i, from, to, Activity::kDown);
    // Done with its steps while the run goes on (a restarted learner catching up): idle.
    const LearnerResult* last = incarnations[i].back();
    if (!last->crashed && last->end_unix_ms > 0) b.AddSpan(i, last->end_unix_ms, 0, Activity::kIdle);
  }
  GoodputInput in;
  DL_RETURN_IF_ERROR(b.Build(end_unix_ms, &in));
  return ComputeGoodput(in, out);
}

nlohmann::json RunStartLine(const RunConfig& cfg, bool resume, int threads) {
  return {{"event", resume ? "resume" : "start"},
          {"step", 0},
          {"params", gpt_tensor_table(GptConfigOf(cfg.model)).total_numel()},
          {"learners", cfg.sync.learners},
          {"mode", std::string(ToString(cfg.sync.mode))},
          {"threads", threads}};
}

void AddLearnerTotals(const RunConfig& cfg, const LearnerTotals& t, TrainSummary* s) {
  s->steps += t.tokens / (long)LearnerTokensPerStep(cfg);
  s->tokens += t.tokens;
  s->train_s = std::max(s->train_s, t.train_s);
  s->bytes_up += t.bytes_up;
  s->bytes_down += t.bytes_down;
  s->final_train_loss += t.final_train_loss / std::max(1, s->learners);
  s->learner_tokens.push_back(t.tokens);
}

Status SummarizeLearners(const RunConfig& cfg, const std::vector<std::vector<const LearnerResult*>>& incarnations,
                         JsonlWriter& metrics, TrainSummary* summary, LocalRunDetails* details) {
  TrainSummary& s = *summary;
  const int M = (int)incarnations.size();
  if (details) *details = {};
  for (int i = 0; i < M; i++) {
    LearnerResult r;  // the learner over all its incarnations
    for (const LearnerResult* x : incarnations[i]) {
      r.steps = x->steps;
      r.tokens += x->tokens;
      r.train_s += x->train_s;
      r.final_train_loss = x->final_train_loss;
      r.bytes_up += x->bytes_up;
      r.bytes_down += x->bytes_down;
      r.deltas_sent += x->deltas_sent;
      r.globals_applied += x->globals_applied;
      r.snapshots_installed += x->snapshots_installed;
      r.gaps += x->gaps;
      r.crc_mismatches += x->crc_mismatches;
      r.deltas_dropped += x->deltas_dropped;
      r.deltas_lost += x->deltas_lost;
      r.globals_missed += x->globals_missed;
      r.globals_refused += x->globals_refused;
      r.moments_restored = r.moments_restored || x->moments_restored;
      r.wait_s += x->wait_s;
      r.crashed = x->crashed;
    }
    AddLearnerTotals(cfg, {r.tokens, r.train_s, r.final_train_loss, r.bytes_up, r.bytes_down}, &s);
    if (details) {
      details->snapshots_installed.push_back(r.snapshots_installed);
      details->crc_mismatches.push_back(r.crc_mismatches);
      details->gaps.push_back(r.gaps);
      details->deltas_dropped.push_back(r.deltas_dropped);
      details->deltas_lost.push_back(r.deltas_lost);
      details->globals_missed.push_back(r.globals_missed);
      details->globals_refused.push_back(r.globals_refused);
      details->incarnations.push_back((int)incarnations[i].size());
      details->rank_param_crc32c.push_back(incarnations[i].front()->rank_param_crc32c);
    }
    DL_RETURN_IF_ERROR(metrics.Write({{"event", "learner_done"},
                                      {"learner", i},
                                      {"steps", r.steps},
                                      {"tokens", r.tokens},
                                      {"incarnations", incarnations[i].size()},
                                      {"deltas_sent", r.deltas_sent},
                                      {"globals_applied", r.globals_applied},
                                      {"snapshots_installed", r.snapshots_installed},
                                      {"gaps", r.gaps},
                                      {"crc_mismatches", r.crc_mismatches},
                                      {"deltas_dropped", r.deltas_dropped},
                                      {"deltas_lost", r.deltas_lost},
                                      {"globals_missed", r.globals_missed},
                                      {"globals_refused", r.globals_refused},
                                      {"moments_restored", r.moments_restored},
                                      {"wait_s", r.wait_s},
                                      {"crashed", r.crashed},
                                      {"bytes_up", r.bytes_up},
                                      {"bytes_down", r.bytes_down}}));
  }
  return Status::Ok();
}

}  // namespace diloco
