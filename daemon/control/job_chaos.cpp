// Chaos commands and a job's chaos timeline, played from the syncer's site (daemon_impl.h).
#include "daemon/control/daemon_impl.h"

#include <signal.h>
#include <unistd.h>

#include <mutex>
#include <thread>

namespace diloco {

// A job's chaos timeline (its chaos: section) is played at the syncer's site by a ChaosRunner on
// its own thread; this target only queues the runner's actions for the daemon's loop, which sends
// each to the site it concerns. Learner steps (at_step events) come from the syncer's heartbeats.
class QueuedChaosTarget final : public ChaosTarget {
 public:
  void KillLearner(int l) override { Push(ChaosActionKind::kKill, l, 0); }
  void RestartLearner(int l) override { Push(ChaosActionKind::kRestart, l, 0); }
  void SetSlowdown(int l, double f) override { Push(ChaosActionKind::kSlowStart, l, f); }
  void SetPartitioned(int l, bool p) override {
    Push(p ? ChaosActionKind::kPartitionStart : ChaosActionKind::kPartitionEnd, l, 0);
  }
  void SetLoss(int l, double p) override { Push(ChaosActionKind::kDropStart, l, p); }
  void SetCorrupt(int l, double p) override { Push(ChaosActionKind::kCorruptStart, l, p); }
  void KillSyncer(int shard) override { Push(ChaosActionKind::kSyncerKill, -1, 0, shard); }
  void RestartSyncer(int shard) override { Push(ChaosActionKind::kSyncerRestart, -1, 0, shard); }
  long LearnerStep(int l) const override {
    std::lock_guard<std::mutex> lock(mu_);
    return l >= 0 && l < (int)steps_.size() ? steps_[l] : 0;
  }
  void SetSteps(std::vector<long> steps) {
    std::lock_guard<std::mutex> lock(mu_);
    steps_ = std::move(steps);
  }
  std::vector<ChaosAction> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(queue_, {});
  }

 private:
  // The runner's calls name the effect; slow 1 / loss 0 / corrupt 0 are the ends (SiteChaosOf
  // maps a start with value 0 to "back to normal" as well).
  void Push(ChaosActionKind kind, int learner, double value, int shard = -1) {
    std::lock_guard<std::mutex> lock(mu_);
    ChaosAction a{kind, learner, value};
    a.shard = shard;
    queue_.push_back(a);
  }
  mutable std::mutex mu_;
  std::vector<ChaosAction> queue_;
  std::vector<long> steps_;
};

namespace {

const std::string& NameOf(const std::string& name) { return name; }
template <typename T>
const std::string& NameOf(const std::pair<const std::string, T>& entry) { return entry.first; }

// The roles of job id on this site that c names (kill and restart: learners and the syncer;
// the rest: learners), among `among`.
template <typename Names>
std::vector<std::string> ChaosRoles(const SiteChaosCommand& c, const Names& among) {
  std::vector<std::string> out;
  const bool roles_too = c.action == SiteChaosAction::kKill || c.action == SiteChaosAction::kRestart;
  for (const auto& entry : among) {
    const std::string& name = NameOf(entry);
    const bool is_syncer = IsSyncerRoleName(name);
    if (c.syncer ? is_syncer : c.learner >= 0 ? name == LearnerName(c.learner) : (!is_syncer || roles_too))
      out.push_back(name);
  }
  return out;
}

}  // namespace

// The job's chaos: section, played from here (the syncer's site). Its clock starts now; after
// a restart of this daemon it is not played again (its faults would repeat).
void DaemonImpl::StartChaosTimeline(const std::string& id, Job& job, bool resume) {
  if (resume) {
    JobLog(id, "chaos: the job's chaos timeline is not replayed after a restart of this daemon");
    return;
  }
  const std::vector<ChaosAction> actions = ExpandChaos(job.config.chaos, (int)job.config.placement.learners.size(),
                                                       7 * 24 * 3600.0);
  JobLog(id, "chaos timeline:\n" + ChaosSummary(actions));
  job.chaos_target = std::make_shared<QueuedChaosTarget>();
  // Each action played is a line of the job's metrics.jsonl, as in a local run.
  std::shared_ptr<JsonlWriter> lines = job.run_metrics;
  job.chaos_runner = std::make_unique<ChaosRunner>(actions, job.chaos_target.get(), [lines](double t_s, const ChaosAction& a) {
    if (lines) (void)lines->Write(ChaosEventJson(t_s, a));  // a line lost to a full disk does not stop the chaos
  });
  job.chaos_runner->Start();
}

// The chaos command of a user (local CLI): carried out here or sent to its site.
DaemonImpl::MaybeReply DaemonImpl::Chaos(const std::string& id, const ControlArgs& a, const ReplyTo& to) {
  if (!store->Exists(id)) return UnknownJob(id);
  SiteChaosCommand c;
  if (Status st = ParseSiteChaos(a, &c); !st.ok()) return ControlArgs{{"error", st.message()}, {"usage", "1"}};
  RunConfig cfg;
  if (Status st = LoadJobConfig(id, &cfg); !st.ok()) return ControlArgs{{"error", st.message()}};
  const std::vector<std::string> sites = SitesOf(cfg);
  if (std::find(sites.begin(), sites.end(), c.site) == sites.end())
    return ControlArgs{{"error", "job " + id + " has no role on site '" + c.site + "' (its sites: " + [&] {
               std::string l;
               for (const std::string& x : sites) l += (l.empty() ? "" : ", ") + x;
               return l;
             }() + ")"},
            {"usage", "1"}};
  const auto answer = [c](const Status& st) -> ControlArgs {
    if (!st.ok()) return ControlArgs{{"error", st.message()}};
    return ControlArgs{{"ok", "1"}, {"done", Describe(c)}};
  };
  if (c.site == config.site) return answer(ApplyChaos(id, c));
  return Defer(
      to, [this, id, c] { return CallPeersAtOnce({c.site}, "peer_chaos", id, SiteChaosArgs(c), 3000); },
      [answer](const PeerAnswers& answers) { return answer(answers[0].status); });
}

// An action of the job's chaos timeline: here, or sent to its site off the loop.
void DaemonImpl::SendChaos(const std::string& id, const SiteChaosCommand& c) {
  if (c.site == config.site) {
    if (Status st = ApplyChaos(id, c); !st.ok()) JobLog(id, "chaos timeline: " + Describe(c) + ": " + st.message());
    return;
  }
  InBackground(
      "chaos timeline of job " + id, [this, id, c] { return CallPeersAtOnce({c.site}, "peer_chaos", id, SiteChaosArgs(c), 3000); },
      [this, id, c](const PeerAnswers& answers) {
        if (!answers[0].status.ok()) JobLog(id, "chaos timeline: " + Describe(c) + ": " + answers[0].status.message());
      });
}

Status DaemonImpl::ApplyChaos(const std::string& id, const SiteChaosCommand& c) {
  if (!config.chaos)
    return Status::Refused("site " + config.site + " takes no chaos commands: its daemon config (" + config.source +
                         ") says chaos: false (set chaos: true on test clusters only)");
  auto it = jobs.find(id);
  if (it == jobs.end()) return Status::Error("job " + id + " has no running role on site " + config.site);
  Job& job = it->second;
  if (c.process) {
    JobLog(id, "chaos: " + Describe(c) + ": SIGKILL after this reply");
    kill_process = true;
    return Status::Ok();
  }
  if (c.action == SiteChaosAction::kRestart) {
    if (ChaosRoles(c, job.killed).empty())
      return Status::Error("chaos: no killed role to restart on " + config.site + " (" + Describe(c) + ")");
    job.chaos_due.push_back({Clock::now(), c});  // once the killed roles have ended
    JobLog(id, "chaos: " + Describe(c));
    return Status::Ok();
  }
  std::vector<std::string> names;
  for (const std::string& name : ChaosRoles(c, job.roles))
    if (!job.roles[name]->done()) names.push_back(name);
  if (names.empty())
    return Status::Error("chaos: nothing to " + std::string(ToString(c.action)) + " on " + config.site + " for job " + id +
                         ": no running role matches (" + Describe(c) + ")");
  for (const std::string& name : names) {
    Role& role = *job.roles[name];
    Status st;
    switch (c.action) {
      case SiteChaosAction::kKill:
        role.Kill();
        job.dying.push_back(std::move(job.roles[name]));
        job.roles.erase(name);
        job.killed.insert(name);
        break;
      case SiteChaosAction::kSlow: st = role.SetSlowdown(c.value); break;
      case SiteChaosAction::kPartition:
      case SiteChaosAction::kHeal:
        st = role.ShapeLink([&](net::LinkParams* p) { p->partitioned = c.action == SiteChaosAction::kPartition; });
        break;
      case SiteChaosAction::kDrop: st = role.ShapeLink([&](net::LinkParams* p) { p->loss = c.value; }); break;
      case SiteChaosAction::kCorrupt: st = role.ShapeLink([&](net::LinkParams* p) { p->corrupt = c.value; }); break;
      case SiteChaosAction::kRestart: break;
    }
    if (!st.ok()) return st.WithContext("chaos on job " + id);
  }
  double undo_after_s = 0;
  if (std::optional<SiteChaosCommand> undo = UndoOf(c, &undo_after_s))
    job.chaos_due.push_back({Clock::now() + std::chrono::milliseconds((int64_t)(undo_after_s * 1000)), *undo});
  JobLog(id, "chaos: " + Describe(c));
  return Status::Ok();
}

// Each loop turn: killed roles that ended go; the job's timeline's actions go out; restarts and
// undos that are due happen.
void DaemonImpl::ChaosTick() {
  for (auto& [id, job] : jobs) {
    std::erase_if(job.dying, [](const std::unique_ptr<Role>& r) { return r->done(); });
    if (job.chaos_target) {
      std::vector<long> steps(job.config.placement.learners.size(), 0);
      auto sit = job.roles.find(SyncerShardName(0, job.config.sync.syncers));  // the home shard hears every learner
      if (sit != job.roles.end()) {
        const nlohmann::json p = sit->second->Progress();
        for (const auto& l : p.value("learners", nlohmann::json::array())) {
          const int i = l.value("learner", -1);
          if (i >= 0 && i < (int)steps.size()) steps[i] = l.value("step", 0L);
        }
      }
      job.chaos_target->SetSteps(std::move(steps));
      for (const ChaosAction& a : job.chaos_target->Take()) {
        // A syncer action goes to the site of its shard (every shard's, shard -1); it kills or
        // restarts every syncer shard of the job on that site.
        std::vector<std::string> syncer_sites;
        for (int s = 0; s < job.config.sync.syncers; s++) {
          const std::string site = job.config.placement.SyncerSite(s);
          if ((a.shard < 0 || a.shard == s) &&
              std::find(syncer_sites.begin(), syncer_sites.end(), site) == syncer_sites.end())
            syncer_sites.push_back(site);
        }
        for (const SiteChaosCommand& c : SiteChaosOf(a, job.config.placement.learners, syncer_sites))
          SendChaos(id, c);
      }
    }
    const auto now = Clock::now();
    std::vector<SiteChaosCommand> due;
    for (auto dit = job.chaos_due.begin(); dit != job.chaos_due.end();) {
      if (dit->first <= now) {
        due.push_back(dit->second);
        dit = job.chaos_due.erase(dit);
      } else {
        ++dit;
      }
    }
    for (const SiteChaosCommand& c : due) {
      if (c.action != SiteChaosAction::kRestart) {
        if (Status st = ApplyChaos(id, c); !st.ok()) JobLog(id, "chaos: " + Describe(c) + ": " + st.message());
        continue;
      }
      RestartKilled(id, job, c);
    }
  }
}

// Starts the killed roles c names again, from what they left on disk; waits for a killed role
// that has not ended yet (its sockets and files are still in use), retrying for up to 15 s
// (a syncer's ports take a moment to be free again).
void DaemonImpl::RestartKilled(const std::string& id, Job& job, const SiteChaosCommand& c) {
  std::set<std::string> names;
  for (const std::string& name : ChaosRoles(c, job.killed)) names.insert(name);
  if (names.empty()) return;
  const auto retry = [&] { job.chaos_due.push_back({Clock::now() + std::chrono::milliseconds(200), c}); };
  for (const auto& r : job.dying)
    if (names.count(r->name())) return retry();
  JobRecord rec;
  Status st = store->Load(id, &rec);
  if (st.ok()) st = StartRoles(id, job.config, true, &rec, &names);
  if (!st.ok()) {
    const int tries = ++restart_tries[id];
    if (tries < 75) return retry();
    for (const std::string& name : names) {
      rec.roles[name].state = JobState::kFailed;
      rec.roles[name].error = "restart after a chaos kill failed: " + st.message();
    }
  }
  restart_tries.erase(id);
  for (const std::string& name : names) job.killed.erase(name);
  SaveRecord(rec);
  JobLog(id, "chaos: " + Describe(c) + (st.ok() ? "" : ": " + st.message()));
}

// chaos kill --process: the reply has gone (ZeroMQ sends it from its I/O thread: give it a
// moment), then die as kill -9 would: no role saves anything.
void DaemonImpl::KillProcessIfAsked() {
  if (!kill_process) return;
  Log("chaos: SIGKILL to this dilocod");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::kill(::getpid(), SIGKILL);
}

}  // namespace diloco
