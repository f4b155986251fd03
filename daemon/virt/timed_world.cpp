#include "daemon/virt/timed_world.h"

#include <algorithm>
#include <limits>

#include "kernels/rng.h"

namespace diloco {

Status TimedWorld::Create(const TimedWorldOptions& options, std::unique_ptr<TimedWorld>* out) {
  std::unique_ptr<TimedWorld> w(new TimedWorld());
  w->options_ = options;
  const RunConfig& cfg = *options.config;
  const int M = cfg.sync.learners;
  w->model_ = TimedModelFor(EffectiveFragments(cfg.sync));
  const TensorTable table = gpt_tensor_table(w->model_);
  w->init_.resize(table.total_numel());
  gpt_init_params(w->model_, cfg.train.seed, w->init_.data());
  w->network_ = std::make_unique<VirtualNetwork>(w->scheduler_, cfg, ReceiversOf(&w->shards_, &w->incarnations_));
  w->network_->CountWindows((int64_t)(options.window_s * 1e9));
  w->shards_.resize(cfg.sync.syncers);
  for (int s = 0; s < cfg.sync.syncers; s++) {
    DL_RETURN_IF_ERROR(VirtualSyncer::Create(w->scheduler_, *w->network_, VirtualSyncerOptions(cfg, "", s),
                                             cfg.timing.merge_gbps, table, w->init_.data(), &w->shards_[s]));
    w->shards_[s]->ChargeAs(options.global_bytes, options.merge_bytes);
  }
  w->incarnations_.resize(M);
  w->down_.resize(M);
  w->pending_restarts_.assign(M, 0);
  *out = std::move(w);
  return Status::Ok();
}

void TimedWorld::StartLearner(int i, bool join_from_snapshot, long start_step) {
  const RunConfig& cfg = *options_.config;
  LearnerOptions lo;
  lo.index = i;
  lo.config = &cfg;
  lo.init_params = join_from_snapshot ? nullptr : init_.data();
  lo.join_from_snapshot = join_from_snapshot;
  lo.start_step = start_step;
  lo.heartbeat_interval_ms = (int)cfg.timing.heartbeat_ms;
  // A deployment's learner that cannot join (a syncer busy with merges for minutes) is restarted
  // by its supervisor until it does: here it keeps asking.
  lo.handshake_timeout_ms = std::numeric_limits<int>::max();
  const uint64_t incarnation = mix_seed(cfg.timing.seed ^ (uint64_t)i, 0x1ea7, incarnations_[i].size());
  incarnations_[i].push_back(
      std::make_unique<TimedLearner>(scheduler_, *network_, lo, model_, options_.delta_bytes, incarnation));
  incarnations_[i].back()->Launch();
}

void TimedWorld::KillLearnerAt(int64_t t_ns, int learner, int64_t restart_after_ns) {
  scheduler_.At(t_ns, [this, learner, restart_after_ns] { KillLearner(learner, restart_after_ns); });
}

void TimedWorld::KillLearner(int i, int64_t restart_after_ns) {
  TimedLearner& l = *incarnations_[i].back();
  if (l.done() || pending_restarts_[i] > 0) return;  // ended already, or down
  kills_++;
  l.Kill();
  network_->Disconnect(i);
  down_[i].push_back({scheduler_.now_ns(), -1});
  if (restart_after_ns < 0) return;
  pending_restarts_[i]++;
  scheduler_.After(restart_after_ns, [this, i] {
    pending_restarts_[i]--;
    down_[i].back().second = scheduler_.now_ns();
    network_->Reconnect(i);
    StartLearner(i, /*join_from_snapshot=*/true, incarnations_[i].back()->steps_done());
    if (options_.on_restart) options_.on_restart(i);
  });
}

bool TimedWorld::AllEnded() const {
  for (size_t i = 0; i < incarnations_.size(); i++)
    if (pending_restarts_[i] > 0 || !incarnations_[i].back()->done()) return false;
  return true;
}

bool TimedWorld::AllShardsDone() const {
  return std::all_of(shards_.begin(), shards_.end(), [](const auto& s) { return s->AllDone(); });
}

std::string TimedWorld::Describe() {
  std::string out;
  for (const auto& s : shards_) out += (out.empty() ? "" : " | ") + s->Describe();
  for (const auto& incs : incarnations_) out += " | " + incs.back()->Describe();
  return out;
}

Status TimedWorld::Run() {
  for (auto& s : shards_) s->Start();
  for (int i = 0; i < learners(); i++) StartLearner(i, /*join_from_snapshot=*/false, 0);
  const RunConfig& cfg = *options_.config;
  const int64_t end_ns = (int64_t)(options_.end_s * 1e9);
  const int64_t linger_ns = (int64_t)cfg.sync.heartbeat_timeout_ms * 1000000;
  int64_t all_ended_ns = -1;
  while (!scheduler_.empty()) {
    if (end_ns > 0 && scheduler_.next_ns() > end_ns) break;
    scheduler_.RunNext();
    for (const auto& s : shards_) DL_RETURN_IF_ERROR(s->error());
    for (const auto& incs : incarnations_)
      if (incs.back()->done() && !incs.back()->status().ok()) return incs.back()->status();
    if (end_ns > 0) continue;
    if (all_ended_ns < 0 && AllEnded()) all_ended_ns = scheduler_.now_ns();
    if (all_ended_ns >= 0 && (AllShardsDone() || scheduler_.now_ns() - all_ended_ns > linger_ns)) break;
  }
  if (end_ns == 0 && !AllEnded())
    return Status::Error("the simulation stalled at " + std::to_string(scheduler_.now_ns() / 1e9) +
                         " virtual s with learners still running; this is a bug: " + Describe());
  return Status::Ok();
}

}  // namespace diloco
