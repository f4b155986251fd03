#include "daemon/train/chaos_runner.h"

#include <algorithm>

namespace diloco {

nlohmann::json ChaosEventJson(double t_s, const ChaosAction& a) {
  nlohmann::json j = {{"event", "chaos"}, {"t_s", t_s}, {"action", std::string(ToString(a.kind))},
                      {"learner", a.learner}, {"value", a.value}};
  if (a.shard >= 0) j["shard"] = a.shard;
  return j;
}

ChaosRunner::ChaosRunner(std::vector<ChaosAction> actions, ChaosTarget* target,
                         std::function<void(double, const ChaosAction&)> on_action)
    : target_(target), on_action_(std::move(on_action)), pending_(std::move(actions)) {}

ChaosRunner::~ChaosRunner() { Stop(); }

void ChaosRunner::Start() {
  start_ = std::chrono::steady_clock::now();
  thread_ = std::thread([this] { Run(); });
}

void ChaosRunner::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

bool ChaosRunner::RestartPending(int learner) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (playing_) return true;  // an action taken off the list is being played
  for (const ChaosAction& a : pending_) {
    if (learner < 0 && a.kind == ChaosActionKind::kSyncerRestart) return true;
    if (learner >= 0 && a.learner == learner &&
        (a.kind == ChaosActionKind::kRestart || a.kind == ChaosActionKind::kPartitionEnd))
      return true;
  }
  return false;
}

void ChaosRunner::Play(const ChaosAction& a, double t_s) {
  if (on_action_) on_action_(t_s, a);
  switch (a.kind) {
    case ChaosActionKind::kKill: target_->KillLearner(a.learner); break;
    case ChaosActionKind::kRestart: target_->RestartLearner(a.learner); break;
    case ChaosActionKind::kSlowStart: target_->SetSlowdown(a.learner, a.value); break;
    case ChaosActionKind::kSlowEnd: target_->SetSlowdown(a.learner, 1); break;
    case ChaosActionKind::kPartitionStart: target_->SetPartitioned(a.learner, true); break;
    case ChaosActionKind::kPartitionEnd: target_->SetPartitioned(a.learner, false); break;
    case ChaosActionKind::kDropStart: target_->SetLoss(a.learner, a.value); break;
    case ChaosActionKind::kDropEnd: target_->SetLoss(a.learner, 0); break;
    case ChaosActionKind::kCorruptStart: target_->SetCorrupt(a.learner, a.value); break;
    case ChaosActionKind::kCorruptEnd: target_->SetCorrupt(a.learner, 0); break;
    case ChaosActionKind::kSyncerKill: target_->KillSyncer(a.shard); break;
    case ChaosActionKind::kSyncerRestart: target_->RestartSyncer(a.shard); break;
  }
}

void ChaosRunner::Run() {
  while (!stop_) {
    const double now_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::vector<ChaosAction> due;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < pending_.size();) {
        const ChaosAction a = pending_[i];  // a copy: a follow-up may grow pending_
        const bool fires = a.step >= 0 ? target_->LearnerStep(a.learner) >= a.step : a.time_s <= now_s;
        if (!fires) {
          i++;
          continue;
        }
        if (a.step >= 0 && a.follow_up_after_s >= 0) {
          // Its end (or restart) is timed from now; it stays pending until then.
          ChaosAction f = a;
          f.kind = FollowUpOf(a.kind);
          f.step = -1;
          f.time_s = now_s + a.follow_up_after_s;
          f.follow_up_after_s = -1;
          f.value = 0;
          pending_.push_back(f);
        }
        due.push_back(a);
        pending_.erase(pending_.begin() + (long)i);
      }
      playing_ = !due.empty();
    }
    for (const ChaosAction& a : due) Play(a, now_s);
    {
      std::lock_guard<std::mutex> lock(mu_);
      playing_ = false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace diloco
