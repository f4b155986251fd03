#include "daemon/sync/goodput_builder.h"

#include <algorithm>

namespace diloco {

GoodputBuilder::GoodputBuilder(int64_t start_unix_ms, int learners, std::vector<double> fragment_weights,
                               double tokens_per_step, int inner_steps)
    : start_ms_(start_unix_ms),
      weights_(std::move(fragment_weights)),
      tokens_per_step_(tokens_per_step),
      inner_steps_(inner_steps),
      tokens_(learners, 0.0),
      provisioned_s_(learners, 0.0) {}

void GoodputBuilder::AddWork(int learner, double tokens, double provisioned_s) {
  tokens_[learner] += tokens;
  provisioned_s_[learner] += provisioned_s;
}

void GoodputBuilder::AddSpan(int learner, int64_t start_unix_ms, int64_t end_unix_ms, Activity activity) {
  spans_.push_back({learner, start_unix_ms, end_unix_ms, activity});
}

void GoodputBuilder::AddMerged(int64_t unix_ms, int fragment, int learner, double tokens) {
  merged_.push_back({Seconds(unix_ms), fragment, learner, tokens});
}

void GoodputBuilder::AddLost(int64_t unix_ms, int fragment, int learner, double tokens, LossCause cause) {
  lost_.push_back({Seconds(unix_ms), fragment, learner, tokens, cause});
}

void GoodputBuilder::AddMerges(const MergeTape& tape) { tape.GoodputRecords(start_ms_, &merged_, &lost_); }

Status GoodputBuilder::Build(int64_t end_unix_ms, GoodputInput* out) const {
  GoodputInput in;
  double wall = Seconds(end_unix_ms);
  for (const MergedDelta& m : merged_) wall = std::max(wall, m.time_s);
  for (const LostDelta& l : lost_) wall = std::max(wall, l.time_s);
  in.wall_s = std::max(wall, 1e-3);
  const auto clip = [&](double s) { return std::clamp(s, 0.0, in.wall_s); };
  for (MergedDelta m : merged_) {
    m.time_s = clip(m.time_s);
    in.merged.push_back(m);
  }
  for (LostDelta l : lost_) {
    l.time_s = clip(l.time_s);
    in.lost.push_back(l);
  }
  double slowest_step_s = 0;
  for (size_t l = 0; l < tokens_.size(); l++) {
    const double rate = NominalTokensPerS(tokens_[l], provisioned_s_[l]);
    in.nominal_tokens_per_s.push_back(rate);
    if (rate > 0) slowest_step_s = std::max(slowest_step_s, tokens_per_step_ / rate);
  }
  if (slowest_step_s <= 0) return Status::Error("no learner has a nominal rate yet (no step done)");
  for (const Span& s : spans_)
    in.spans.push_back({s.learner, clip(Seconds(s.start_ms)), s.end_ms > 0 ? clip(Seconds(s.end_ms)) : in.wall_s, s.activity});
  std::stable_sort(in.spans.begin(), in.spans.end(), [](const ActivitySpan& a, const ActivitySpan& b) {
    return a.learner != b.learner ? a.learner < b.learner : a.start_s < b.start_s;
  });
  for (size_t k = 1; k < in.spans.size(); k++) {
    ActivitySpan& prev = in.spans[k - 1];
    ActivitySpan& cur = in.spans[k];
    if (prev.learner != cur.learner || cur.start_s >= prev.end_s) continue;
    if (cur.activity == Activity::kDown) prev.end_s = cur.start_s;
    else cur.start_s = std::min(prev.end_s, cur.end_s);
  }
  in.fragment_weights = weights_;
  in.expected_merge_interval_s =
      std::max(1e-3, inner_steps_ * slowest_step_s / (double)std::max<size_t>(1, weights_.size()));
  *out = std::move(in);
  return Status::Ok();
}

}  // namespace diloco
