#include "daemon/sync/live_goodput.h"

#include <algorithm>

#include "daemon/sync/goodput_builder.h"

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
  GoodputBuilder b(options_.start_unix_ms, (int)learners_.size(), options_.fragment_weights, options_.tokens_per_step,
                   options_.inner_steps);
  if (options_.merges) b.AddMerges(*options_.merges);
  for (size_t i = 0; i < learners_.size(); i++) {
    const Learner& l = learners_[i];
    b.AddWork((int)i, l.past_tokens + l.tokens, l.past_provisioned_s + l.provisioned_s);
    for (const auto& [from, to] : l.down) b.AddSpan((int)i, from, to, Activity::kDown);
    if (l.down_since_ms >= 0) b.AddSpan((int)i, l.down_since_ms, 0, Activity::kDown);
    if (l.finished_ms >= 0) b.AddSpan((int)i, l.finished_ms, 0, Activity::kIdle);
  }
  GoodputInput in;
  DL_RETURN_IF_ERROR(b.Build(now_ms, &in));
  return ComputeGoodput(in, out);
}

}  // namespace diloco
