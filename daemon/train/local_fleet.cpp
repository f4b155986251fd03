#include "daemon/train/local_fleet.h"

#include <chrono>
#include <cstdio>

#include "daemon/sync/shards.h"
#include "daemon/util/unix_time.h"

namespace diloco {

// ---- LocalSyncers ----

Status LocalSyncers::Start(net::NetContext& context, RoleOptions options) {
  context_ = &context;
  options_ = std::move(options);
  std::lock_guard<std::mutex> lock(mu_);
  roles_.resize(shards());
  // Every shard builds at once (each on its role's thread), then each is awaited.
  for (int s = 0; s < shards(); s++) DL_RETURN_IF_ERROR(StartShard(s, options_));
  for (int s = 0; s < shards(); s++) DL_RETURN_IF_ERROR(AwaitBuilt(s));
  return Status::Ok();
}

Status LocalSyncers::StartShard(int shard, const RoleOptions& options) {
  RoleOptions o = options;
  o.shard = shard;
  return Role::StartSyncer(*context_, o, &roles_[shard]);
}

// Built on the role's thread: the learners start once it is (or not, when it cannot be).
Status LocalSyncers::AwaitBuilt(int shard) {
  std::unique_ptr<Role>& role = roles_[shard];
  while (!role->syncer() && !role->done()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  if (role->syncer()) return Status::Ok();
  role->Join();
  const Status st = role->outcome();
  role.reset();
  return st;
}

void LocalSyncers::Kill(int shard) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int s = 0; s < shards(); s++) {
    if ((shard >= 0 && s != shard) || !roles_[s]) continue;
    roles_[s]->Kill();
    roles_[s]->Join();
    roles_[s].reset();  // its sockets close: the learners' messages go nowhere until the restart
  }
}

void LocalSyncers::Restart(int shard) {
  std::lock_guard<std::mutex> lock(mu_);
  RoleOptions o = options_;
  o.resume = true;
  o.init_params = nullptr;  // the model comes from the shard's global_state.bin
  o.bind_retry_s = 15;      // loopback ports of the killed one may take a moment
  for (int s = 0; s < shards(); s++) {
    if ((shard >= 0 && s != shard) || roles_[s]) continue;
    Status st = StartShard(s, o);
    if (st.ok()) st = AwaitBuilt(s);
    if (!st.ok() && status_.ok()) status_ = st.WithContext("restarting " + SyncerShardName(s, shards()));
  }
}

Status LocalSyncers::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& role : roles_)
    if (role) role->RequestStop();
  for (auto& role : roles_) {
    if (!role) continue;
    role->Join();
    if (Status st = role->outcome(); !st.ok() && status_.ok()) status_ = st.WithContext(role->name());
  }
  return status_;
}

Syncer* LocalSyncers::get(int shard) const {
  std::lock_guard<std::mutex> lock(mu_);
  return roles_[shard] ? roles_[shard]->syncer() : nullptr;
}

SyncerStatusSnapshot LocalSyncers::CurrentStatus(int shard) const {
  std::lock_guard<std::mutex> lock(mu_);
  Syncer* s = roles_[shard] ? roles_[shard]->syncer() : nullptr;
  return s ? s->CurrentStatus() : SyncerStatusSnapshot();
}

uint64_t LocalSyncers::Merges() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t merges = 0;
  for (const auto& role : roles_)
    if (Syncer* s = role ? role->syncer() : nullptr) merges += s->CurrentStatus().merges;
  return merges;
}

// ---- LocalFleet ----

LocalFleet::LocalFleet(net::NetContext& context, int learners, std::function<RoleOptions(int)> role_of,
                       LocalSyncers* syncers, std::vector<std::shared_ptr<net::Link>> links,
                       net::LinkParams base_link)
    : context_(context),
      role_of_(std::move(role_of)),
      syncers_(syncers),
      links_(std::move(links)),
      base_link_(base_link),
      slots_(learners) {}

LocalFleet::~LocalFleet() {
  // Each role stops and joins as it is destroyed; those still running were not waited for (an
  // error path): they end as at a daemon's shutdown.
  std::lock_guard<std::mutex> lock(mu_);
  slots_.clear();
}

void LocalFleet::Start(int i, RoleOptions ro) {
  if (!links_.empty()) ro.link = links_[i];
  auto inc = std::make_unique<Incarnation>();
  inc->status = Role::StartLearner(context_, ro, i, &inc->role);
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = slots_[i];
  if (inc->role && slot.slowdown != 1) (void)inc->role->SetSlowdown(slot.slowdown);  // a learner always takes one
  slot.incarnations.push_back(std::move(inc));
}

bool LocalFleet::Ended(int i) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_[i].incarnations.empty() || slots_[i].incarnations.back()->ended();
}

void LocalFleet::WaitEnded(int i) {
  for (;;) {
    Incarnation* latest = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (slots_[i].incarnations.empty()) return;
      latest = slots_[i].incarnations.back().get();
    }
    while (!latest->ended()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::lock_guard<std::mutex> lock(mu_);
    if (slots_[i].incarnations.back().get() == latest) return;  // no newer one started meanwhile
  }
}

void LocalFleet::JoinAll(const ChaosRunner* runner) {
  for (;;) {
    bool all = true;
    for (int i = 0; i < (int)slots_.size(); i++) {
      WaitEnded(i);
      std::lock_guard<std::mutex> lock(mu_);
      if (slots_[i].incarnations.empty()) continue;
      const Incarnation& latest = *slots_[i].incarnations.back();
      if (!latest.ended() || (latest.role && latest.role->learner_result().crashed && runner && runner->RestartPending(i)))
        all = false;
    }
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (Slot& s : slots_)
    for (auto& inc : s.incarnations)
      if (inc->role) inc->role->Join();
}

std::vector<std::vector<const LearnerResult*>> LocalFleet::Results() const {
  static const LearnerResult kNotStarted;
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::vector<const LearnerResult*>> out(slots_.size());
  for (size_t i = 0; i < slots_.size(); i++)
    for (const auto& inc : slots_[i].incarnations) out[i].push_back(inc->role ? &inc->role->learner_result() : &kNotStarted);
  return out;
}

Status LocalFleet::FirstError() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < slots_.size(); i++)
    for (size_t k = 0; k < slots_[i].incarnations.size(); k++) {
      const Incarnation& inc = *slots_[i].incarnations[k];
      const Status st = inc.role ? inc.role->outcome() : inc.status;
      if (!st.ok())
        return st.WithContext(LearnerName((int)i) + (k > 0 ? " (incarnation " + std::to_string(k + 1) + ")" : ""));
    }
  return Status::Ok();
}

std::vector<std::vector<std::pair<int64_t, int64_t>>> LocalFleet::DownSpans() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> out(slots_.size());
  for (size_t i = 0; i < slots_.size(); i++) {
    const auto& incs = slots_[i].incarnations;
    for (size_t k = 0; k < incs.size(); k++) {
      if (!incs[k]->role || !incs[k]->role->learner_result().crashed || incs[k]->killed_unix_ms == 0) continue;
      // Down from the kill until the next incarnation trains (or, never restarted, the end).
      const int64_t back =
          k + 1 < incs.size() && incs[k + 1]->role ? incs[k + 1]->role->learner_result().train_start_unix_ms : 0;
      out[i].push_back({incs[k]->killed_unix_ms, back});
    }
  }
  return out;
}

void LocalFleet::KillLearner(int i) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = slots_[i];
  if (slot.incarnations.empty() || slot.incarnations.back()->ended()) return;  // done already
  slot.incarnations.back()->killed_unix_ms = UnixMsNow();
  slot.incarnations.back()->role->Kill();
}

void LocalFleet::RestartLearner(int i) {
  Incarnation* latest = nullptr;
  const Incarnation* first = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slots_[i].incarnations.empty()) return;
    latest = slots_[i].incarnations.back().get();
    first = slots_[i].incarnations.front().get();
    if (latest->killed_unix_ms == 0) return;  // not killed (finished, or already restarted)
  }
  while (!latest->ended()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (!latest->role || !latest->role->outcome().ok() || !latest->role->learner_result().crashed) return;
  RoleOptions ro = role_of_(i);
  ro.resume = true;  // from the syncer's snapshot
  ro.start_step = latest->role->learner_result().steps;
  // The time budget runs from the first incarnation's start (it has ended: the latest has).
  ro.time_budget_start_unix_ms = first->role ? first->role->learner_result().train_start_unix_ms : 0;
  if (ro.start_step >= ro.config.train.steps) return;
  std::fprintf(stderr, "chaos: restarting %s at step %ld\n", LearnerName(i).c_str(), ro.start_step);
  Start(i, ro);
}

void LocalFleet::SetSlowdown(int i, double factor) {
  if (i < 0 || i >= (int)slots_.size()) return;
  std::lock_guard<std::mutex> lock(mu_);
  slots_[i].slowdown = factor;
  if (!slots_[i].incarnations.empty() && slots_[i].incarnations.back()->role)
    (void)slots_[i].incarnations.back()->role->SetSlowdown(factor);  // a learner always takes one
}

void LocalFleet::ShapeLinks(int learner, const std::function<void(net::LinkParams*)>& change) {
  for (int i = 0; i < (int)links_.size(); i++) {
    if (learner >= 0 && i != learner) continue;
    // Chaos values are checked when the config is read; a change the link refuses says why.
    if (Status st = links_[i]->Change(change); !st.ok()) std::fprintf(stderr, "chaos: %s\n", st.message().c_str());
  }
}

void LocalFleet::SetPartitioned(int learner, bool partitioned) {
  ShapeLinks(learner, [&](net::LinkParams* p) { p->partitioned = partitioned; });
}

void LocalFleet::SetLoss(int learner, double prob) {
  ShapeLinks(learner, [&](net::LinkParams* p) { p->loss = prob > 0 ? prob : base_link_.loss; });
}

void LocalFleet::SetCorrupt(int learner, double prob) {
  ShapeLinks(learner, [&](net::LinkParams* p) { p->corrupt = prob; });
}

long LocalFleet::LearnerStep(int i) const {
  if (i < 0 || i >= (int)slots_.size()) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  const auto& incs = slots_[i].incarnations;
  return incs.empty() || !incs.back()->role ? 0 : incs.back()->role->step();
}

}  // namespace diloco
