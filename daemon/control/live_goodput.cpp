#include "daemon/control/live_goodput.h"

#include <algorithm>

namespace diloco {

LiveGoodput::LiveGoodput(LiveGoodputOptions options)
    : options_(std::move(options)), learners_(options_.learners) {}

void LiveGoodput::Observe(const SyncerStatusSnapshot& s, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < s.learners.size() && i < learners_.size(); i++) {
    const LearnerStatusEntry& e = s.learners[i];
    Learner& l = learners_[i];
    if (!e.heard) continue;
    const bool restarted = l.heard && e.incarnation != l.incarnation;
    const int64_t heard_before_ms = l.last_heard_ms;
    l.heard = true;
    l.incarnation = e.incarnation;
    l.last_heard_ms = e.last_heard_unix_ms;
    if (restarted) {
      l.past_tokens += l.tokens;
      l.past_provisioned_s += l.provisioned_s;
      l.tokens = l.provisioned_s = 0;
    }
    if (e.tokens_per_s > 0 && e.tokens > 0) {
      l.tokens = (double)e.tokens;
      l.provisioned_s = (double)e.tokens / e.tokens_per_s;
    }
    const bool finished = e.state == LearnerState::kFinished || e.state == LearnerState::kStopping;
    if (finished) {
      if (l.finished_ms < 0) l.finished_ms = now_ms;
    } else {
      l.finished_ms = -1;  // a restarted learner that had reported finished (not expected)
    }
    // Down from when it was last heard: declared dead, or back as a new incarnation.
    if (l.down_since_ms < 0 && ((!e.live && !finished) || restarted)) l.down_since_ms = restarted ? heard_before_ms : l.last_heard_ms;
    if (l.down_since_ms >= 0 && e.live) {
      l.down.push_back({l.down_since_ms, std::max(l.down_since_ms, now_ms)});
      l.down_since_ms = -1;
    }
  }
}

Status LiveGoodput::Report(int64_t now_ms, GoodputReport* out) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t start_ms = options_.start_unix_ms;
  std::vector<MergedDelta> merged;
  std::vector<LostDelta> lost;
  if (options_.merges) options_.merges->GoodputRecords(start_ms, &merged, &lost);
  GoodputInput in;
  auto rel = [&](int64_t ms) { return std::max(0.0, (double)(ms - start_ms) / 1000); };
  in.wall_s = std::max(rel(now_ms), 1e-3);
  // Records stamped after now (another clock read) or before the start would be refused.
  for (MergedDelta m : merged) {
    m.time_s = std::clamp(m.time_s, 0.0, in.wall_s);
    in.merged.push_back(m);
  }
  for (LostDelta d : lost) {
    d.time_s = std::clamp(d.time_s, 0.0, in.wall_s);
    in.lost.push_back(d);
  }
  in.fragment_weights = options_.fragment_weights;
  double slowest_step_s = 0;
  for (size_t i = 0; i < learners_.size(); i++) {
    const Learner& l = learners_[i];
    const double rate = l.Rate();
    in.nominal_tokens_per_s.push_back(rate);
    if (rate > 0) slowest_step_s = std::max(slowest_step_s, options_.tokens_per_step / rate);
    for (const auto& [a, b] : l.down) in.spans.push_back({(int)i, rel(a), rel(b), Activity::kDown});
    if (l.down_since_ms >= 0) in.spans.push_back({(int)i, rel(l.down_since_ms), in.wall_s, Activity::kDown});
    if (l.finished_ms >= 0) in.spans.push_back({(int)i, rel(l.finished_ms), in.wall_s, Activity::kIdle});
  }
  if (slowest_step_s <= 0) return Status::Error("no learner has reported its rate yet");
  in.expected_merge_interval_s =
      std::max(1e-3, options_.inner_steps * slowest_step_s / std::max<size_t>(1, options_.fragment_weights.size()));
  return ComputeGoodput(in, out);
}

}  // namespace diloco
