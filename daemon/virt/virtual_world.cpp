#include "daemon/virt/virtual_world.h"

#include <algorithm>
#include <filesystem>
#include <limits>

#include "daemon/train/trainer.h"
#include "kernels/gpt.h"
#include "kernels/rng.h"

namespace diloco {

VirtualModel VirtualModelOf(const RunConfig& cfg) {
  const GptConfig gc = GptConfigOf(cfg.model);
  VirtualModel m{gpt_tensor_table(gc), {}};
  m.init.resize(m.table.total_numel());
  gpt_init_params(gc, cfg.train.seed, m.init.data());
  return m;
}

Status VirtualWorld::Create(const VirtualWorldOptions& options, std::unique_ptr<VirtualWorld>* out) {
  std::unique_ptr<VirtualWorld> w(new VirtualWorld());
  w->options_ = options;
  const RunConfig& cfg = *options.config;
  const int M = cfg.sync.learners;
  w->network_ = std::make_unique<VirtualNetwork>(w->scheduler_, cfg, ReceiversOf(&w->shards_, &w->incarnations_));
  w->shards_.resize(cfg.sync.syncers);
  w->syncer_starts_.assign(cfg.sync.syncers, 0);
  for (int s = 0; s < cfg.sync.syncers; s++) DL_RETURN_IF_ERROR(w->CreateShard(s, /*resume=*/false));
  w->incarnations_.resize(M);
  w->down_.resize(M);
  w->pending_restarts_.assign(M, 0);
  w->clock_offset_ns_.assign(M, 0);
  w->ended_ns_.assign(M, -1);
  *out = std::move(w);
  return Status::Ok();
}

VirtualWorld::~VirtualWorld() {
  baton_.Abort();
  incarnations_.clear();  // joins the threads
}

void VirtualWorld::StartLearner(int i, bool join_from_snapshot, long start_step) {
  const RunConfig& cfg = *options_.config;
  LearnerOptions lo;
  lo.index = i;
  lo.config = &cfg;
  lo.init_params = join_from_snapshot ? nullptr : options_.init_params;
  lo.join_from_snapshot = join_from_snapshot;
  lo.start_step = start_step;
  // A restarted learner keeps the run's train.time_limit_s (the first incarnation's start).
  if (!incarnations_[i].empty()) lo.time_budget_start_unix_ms = incarnations_[i].front()->result().train_start_unix_ms;
  lo.threads = options_.threads;
  lo.run_dir = options_.run_dir;
  lo.heartbeat_interval_ms = (int)cfg.timing.heartbeat_ms;
  // A restarted learner that cannot join (cut off, or the syncer down, for longer than its
  // handshake timeout) is restarted by its supervisor until it does: here it keeps asking, as in
  // TimedWorld (dilococtl dst --seed 1095: a learner restarted into a 65 s partition).
  if (join_from_snapshot) lo.handshake_timeout_ms = std::numeric_limits<int>::max();
  (void)LearnerDevice(cfg.train, i, cfg.sync.learners, &lo.device);  // checked when the run starts
  const uint64_t incarnation = mix_seed(cfg.timing.seed ^ (uint64_t)i, 0x1ea7, incarnations_[i].size());
  baton_.Revive(i);
  incarnations_[i].push_back(
      std::make_unique<VirtualLearner>(scheduler_, baton_, *network_, lo, incarnation,
                                      options_.metrics ? options_.metrics->writer(i) : nullptr));
  incarnations_[i].back()->JumpClock(clock_offset_ns_[i]);  // the machine's clock, as the last one saw it
  incarnations_[i].back()->Launch();
}

void VirtualWorld::KillLearnerAt(int64_t t_ns, int learner, int64_t restart_after_ns) {
  scheduler_.At(t_ns, [this, learner, restart_after_ns] { KillLearner(learner, restart_after_ns); });
}

void VirtualWorld::KillLearner(int i, int64_t restart_after_ns) {
  VirtualLearner& l = *incarnations_[i].back();
  if (l.done() || pending_restarts_[i] > 0) return;  // ended already, or down
  l.Kill();
  network_->Disconnect(i);
  down_[i].push_back({scheduler_.unix_ms(), 0});
  if (restart_after_ns < 0) return;
  pending_restarts_[i]++;
  scheduler_.After(restart_after_ns, [this, i] {
    pending_restarts_[i]--;
    down_[i].back().second = scheduler_.unix_ms();
    network_->Reconnect(i);
    StartLearner(i, /*join_from_snapshot=*/true, incarnations_[i].back()->steps_done());
  });
}

void VirtualWorld::PartitionAt(int64_t t_ns, int learner, int64_t heal_after_ns) {
  scheduler_.At(t_ns, [this, learner, heal_after_ns] {
    network_->SetCut(learner, true);
    scheduler_.After(heal_after_ns, [this, learner] { network_->SetCut(learner, false); });
  });
}

void VirtualWorld::KillSyncerAt(int64_t t_ns, int64_t restart_after_ns, int shard) {
  scheduler_.At(t_ns, [this, restart_after_ns, shard] { KillSyncer(shard, restart_after_ns); });
}

void VirtualWorld::KillSyncer(int shard, int64_t restart_after_ns) {
  std::unique_ptr<VirtualSyncer>& syncer = shards_[shard];
  if (!syncer) return;  // down already
  if (!options_.durable_syncer || restart_after_ns < 0) {
    error_ = Status::Error("a virtual syncer is killed only when durable, and restarted (this is a bug of the test)");
    return;
  }
  if (syncer->busy_until_ns() > scheduler_.now_ns()) {
    scheduler_.At(syncer->busy_until_ns(), [this, shard, restart_after_ns] { KillSyncer(shard, restart_after_ns); });
    return;
  }
  syncer.reset();
  network_->SyncerDown(shard);
  scheduler_.After(restart_after_ns, [this, shard] { RestartSyncer(shard); });
}

// Shard `shard`'s next incarnation: the first from init_params, a restart resumed from its store.
Status VirtualWorld::CreateShard(int shard, bool resume) {
  SyncerOptions so = VirtualSyncerOptions(*options_.config, options_.run_dir, shard);
  so.resume = resume;
  so.on_merge = merge_tape_.Listener();
  DL_RETURN_IF_ERROR(VirtualSyncer::Create(scheduler_, *network_, so, options_.config->timing.merge_gbps,
                                           *options_.table, resume ? nullptr : options_.init_params,
                                           &shards_[shard], options_.durable_syncer, syncer_starts_[shard]));
  shards_[shard]->on_global = on_global_;
  return Status::Ok();
}

void VirtualWorld::RestartSyncer(int shard) {
  syncer_starts_[shard]++;
  if (Status st = CreateShard(shard, /*resume=*/true); !st.ok()) {
    error_ = st.WithContext("restarting syncer shard " + std::to_string(shard));
    return;
  }
  network_->SyncerUp(shard);
  syncer_restarts_ns_.push_back(scheduler_.now_ns());
  shards_[shard]->Start();
}

void VirtualWorld::OnGlobal(std::function<void(const GlobalMsg&)> fn) {
  on_global_ = std::move(fn);
  for (auto& s : shards_)
    if (s) s->on_global = on_global_;
}

Status VirtualWorld::FinishSyncers() {
  for (auto& s : shards_)
    if (!s) return Status::Error("a syncer shard is down at the end");
  for (auto& s : shards_) DL_RETURN_IF_ERROR(s->Finish());
  if (shards() == 1 || options_.run_dir.empty()) return Status::Ok();
  return SaveGlobalState((std::filesystem::path(options_.run_dir) / "global_state.bin").string(), JoinedState());
}

GlobalState VirtualWorld::JoinedState() const {
  std::vector<const GlobalState*> states;
  for (const auto& s : shards_) states.push_back(&s->state());
  return JoinShardStates(states, shards_.front()->shards());
}

void VirtualWorld::GlobalParams(float* flat) const {
  for (const auto& s : shards_) s->GlobalParams(flat);
}

void VirtualWorld::JumpClockAt(int64_t t_ns, int learner, int64_t jump_ns) {
  scheduler_.At(t_ns, [this, learner, jump_ns] {
    if (learner < 0) {
      // A shard that is down starts on a fresh clock.
      if (const int s = -1 - learner; s < shards() && shards_[s]) shards_[s]->JumpClock(jump_ns);
      return;
    }
    clock_offset_ns_[learner] += jump_ns;
    if (!incarnations_[learner].empty()) incarnations_[learner].back()->JumpClock(jump_ns);
  });
}

std::string VirtualWorld::Describe() {
  std::string out;
  for (int s = 0; s < shards(); s++)
    out += (s ? " | " : "") + (shards_[s] ? shards_[s]->Describe() : "syncer shard " + std::to_string(s) + ": down");
  for (const auto& incs : incarnations_) out += " | " + incs.back()->Describe();
  return out;
}

bool VirtualWorld::AllShardsUp() const {
  return std::all_of(shards_.begin(), shards_.end(), [](const auto& s) { return s != nullptr; });
}

bool VirtualWorld::AllShardsDone() const {
  return std::all_of(shards_.begin(), shards_.end(), [](const auto& s) { return s && s->AllDone(); });
}

bool VirtualWorld::AllEnded() const {
  for (size_t i = 0; i < incarnations_.size(); i++)
    if (pending_restarts_[i] > 0 || !incarnations_[i].back()->done()) return false;
  return true;
}

Status VirtualWorld::Run() {
  for (auto& s : shards_) s->Start();
  for (int i = 0; i < learners(); i++) StartLearner(i, /*join_from_snapshot=*/false, 0);
  const int64_t linger_ns = (int64_t)options_.config->sync.heartbeat_timeout_ms * 1000000;
  while (scheduler_.RunNext()) {
    DL_RETURN_IF_ERROR(error_);
    for (const auto& s : shards_)
      if (s) DL_RETURN_IF_ERROR(s->error());
    for (const auto& incs : incarnations_)
      if (incs.back()->done() && !incs.back()->status().ok()) return incs.back()->status();
    if (options_.after_event) DL_RETURN_IF_ERROR(options_.after_event());
    if (options_.max_virtual_s > 0 && scheduler_.now_ns() > (int64_t)(options_.max_virtual_s * 1e9))
      return Status::Error("the virtual run passed its limit of " + std::to_string(options_.max_virtual_s) +
                           " virtual s (" + std::to_string(scheduler_.events_run()) + " events) without ending: " +
                           Describe());
    for (size_t i = 0; i < incarnations_.size(); i++)
      if (ended_ns_[i] < 0 && pending_restarts_[i] == 0 && incarnations_[i].back()->done())
        ended_ns_[i] = scheduler_.now_ns();
    if (all_ended_ns_ < 0 && AllEnded()) all_ended_ns_ = scheduler_.now_ns();
    // A shard that is down is waited for: its restart is scheduled.
    if (all_ended_ns_ >= 0 && AllShardsUp() &&
        (AllShardsDone() || scheduler_.now_ns() - all_ended_ns_ > linger_ns))
      break;
  }
  if (!AllEnded())
    return Status::Error("the virtual run stalled at " + std::to_string(scheduler_.now_ns() / 1e9) +
                         " virtual s with learners still running; this is a bug");
  return Status::Ok();
}

}  // namespace diloco
