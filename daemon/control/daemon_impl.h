// The daemon's state and handlers (daemon.h's Impl), shared by the files that implement them:
//   daemon.cpp            Create (sockets, keys, store), the loop (Run), logging
//   peer_calls.cpp        calls to other sites and site hosts, on and off the loop; replies
//   request_handlers.cpp  the local CLI's and the peers' requests (submit, stop, logs, ...)
//   job_lifecycle.cpp     admit, start, resume, reap and rejoin the roles of jobs on this site
//   job_status.cpp        what status, list, /metrics and sd_notify say about the jobs
//   job_chaos.cpp         chaos commands and a job's chaos timeline (site_chaos.h)
// Everything runs on the daemon's loop thread except work handed to off_loop.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/config/daemon_config.h"
#include "daemon/config/run_config.h"
#include "daemon/control/control_protocol.h"
#include "daemon/control/daemon.h"
#include "daemon/control/job_store.h"
#include "daemon/control/off_loop.h"
#include "daemon/control/peer_views.h"
#include "daemon/control/ring_store.h"
#include "daemon/train/roles.h"
#include "daemon/control/site_chaos.h"
#include "daemon/metrics/registry.h"
#include "daemon/metrics/server.h"
#include "daemon/net/channel.h"
#include "daemon/net/curve.h"
#include "daemon/net/envelope.h"
#include "daemon/net/local_socket.h"
#include "daemon/sync/protocol.h"
#include "daemon/sync/shards.h"
#include "daemon/train/chaos_runner.h"
#include "daemon/train/role_plan.h"
#include "daemon/util/jsonl_writer.h"
#include "daemon/util/lock_file.h"
#include "daemon/util/status.h"

namespace diloco {

using DaemonClock = std::chrono::steady_clock;

// JSON as text for replies and logs: strings that are not valid UTF-8 (a path with byte 0xff,
// say) come out with U+FFFD instead of throwing.
inline std::string JsonText(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The sites a job's placement names, syncer first, each once.
std::vector<std::string> SitesOf(const RunConfig& cfg);

class QueuedChaosTarget;  // job_chaos.cpp: the chaos runner's actions, queued for the loop

struct DaemonImpl {
  using Clock = DaemonClock;

  DaemonConfig config;
  std::unique_ptr<LockFile> lock;
  std::optional<net::CurveKeyPair> keys;
  std::unique_ptr<net::NetContext> context;
  std::unique_ptr<JobStore> store;
  std::unique_ptr<PeerViews> peer_views;  // after context: its workers call peers through it
  std::unique_ptr<OffLoop> off_loop;      // after context: its workers call peers through it
  std::set<std::string> reserved_ids;     // jobs whose submit waits on other sites
  std::unique_ptr<net::LocalServer> local;     // AF_UNIX, the CLI (net/local_socket.h)
  std::unique_ptr<net::RouterChannel> peers;  // tcp, other daemons
  std::shared_ptr<ParsedMessage> local_parsed = std::make_shared<ParsedMessage>();
  std::shared_ptr<ParsedMessage> peer_parsed = std::make_shared<ParsedMessage>();
  struct Job {
    RunConfig config;
    std::map<std::string, std::unique_ptr<Role>> roles;
    bool stop_requested = false;
    bool syncer_stop_sent = false;
    // Roles still ending (killed by chaos, or learners leaving to rejoin); chaos (site_chaos.h):
    // roles killed (restart may come), actions to undo or restart later, and the job's own
    // timeline when this site plays it.
    std::vector<std::unique_ptr<Role>> dying;
    std::set<std::string> killed;
    std::vector<std::pair<Clock::time_point, SiteChaosCommand>> chaos_due;
    std::shared_ptr<QueuedChaosTarget> chaos_target;
    std::unique_ptr<ChaosRunner> chaos_runner;  // after chaos_target: it calls it
    std::set<std::string> rejoining;  // learners that start again once they are out of dying
    // The syncer's site: the job's run-level lines in its run directory's metrics.jsonl
    // (control/job_metrics.h; shared with the chaos runner's thread); once the syncer completed,
    // its result until the learners' results are known (WriteDueSummaries).
    std::shared_ptr<JsonlWriter> run_metrics;
    bool summary_due = false;
    Clock::time_point summary_due_since;
    nlohmann::json syncer_result;
    void ExpectSummary(const nlohmann::json& result) {
      summary_due = true;
      summary_due_since = Clock::now();
      syncer_result = result;
    }
    // Roles that have not ended for good: the job is not over on this site.
    bool RolesPending() const {
      if (!dying.empty() || !rejoining.empty() || summary_due) return true;
      for (const auto& [t, c] : chaos_due)
        if (c.action == SiteChaosAction::kRestart) return true;
      for (const std::string& name : killed)
        if (chaos_runner && chaos_runner->RestartPending(IsSyncerRoleName(name) ? -1 : LearnerIndexOf(name))) return true;
      return false;
    }
  };
  bool kill_process = false;  // chaos kill --process: SIGKILL after the reply
  std::map<std::string, Job> jobs;  // jobs with roles on this site that are not done
  std::string last_status;
  MetricsRegistry metrics;
  std::unique_ptr<MetricsServer> metrics_server;  // after metrics: it renders the registry
  Clock::time_point last_metrics = Clock::now() - std::chrono::hours(1);
  std::map<std::string, Clock::time_point> ended_jobs;  // jobs whose series are still in /metrics
  // Host 0 of a site of several hosts: the rendezvous store of its learners' rings across the
  // site's hosts (ring_store.h), per job, dropped when the job ends here.
  RingStoreTable ring_store;
  // ---- Peer calls off the loop (off_loop.h) ----
  struct PeerAnswer {
    std::string site;
    Status status;
    ControlArgs reply;
  };
  using PeerAnswers = std::vector<PeerAnswer>;
  // Where a request's answer goes, kept for answering it later: a peer on the ROUTER, or a
  // connection of the local socket.
  struct ReplyTo {
    net::RouterChannel* channel = nullptr;
    std::string peer;  // routing id
    net::LocalServer* local = nullptr;
    uint64_t connection = 0;
    std::string job_id, name;
    uint64_t request_id = 0;
  };
  using MaybeReply = std::optional<ControlArgs>;  // nullopt: Defer answers it later
  // Runs work (peer calls) on a worker, then answers `to` with then(its result) on the loop.
  // Refused at once when too much is waiting already.
  template <typename Work, typename Then>
  MaybeReply Defer(const ReplyTo& to, Work work, Then then) {
    const bool queued = off_loop->Run([this, to, work, then]() -> OffLoop::Task {
      try {
        auto result = work();
        return [this, to, then, result] { Reply(to, GuardedReply(to.name, [&] { return then(result); })); };
      } catch (const std::exception& e) {
        const std::string what = e.what();
        return [this, to, what] { Reply(to, {{"error", "site " + config.site + ": '" + to.name + "' failed: " + what}}); };
      }
    });
    if (!queued) return Busy(to.name);
    return std::nullopt;
  }
  static constexpr int kOffLoopWorkers = 4;
  static constexpr size_t kMaxOffLoop = 64;
  // ---- Never down for one bad request or record ----
  // An exception out of a periodic task is logged and the loop goes on; out of a handler it is
  // also the request's answer.
  template <typename F>
  void Guarded(const char* what, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      Log(std::string(what) + " failed: " + e.what() + " (the daemon goes on)");
    }
  }
  template <typename F>
  auto GuardedReply(const std::string& request, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const std::exception& e) {
      Log("request '" + request + "' failed: " + e.what() + " (the daemon goes on)");
      return ControlArgs{{"error", "site " + config.site + " could not handle '" + request + "': " + e.what()}};
    }
  }
  std::map<std::string, std::string> store_errors;  // per job: why its last record save failed
  std::map<std::string, int> restart_tries;  // chaos restarts that wait for ports, per job
  Clock::time_point last_learner_check = Clock::now();

  // ---- daemon.cpp ----
  void Log(const std::string& line) const;
  void JobLog(const std::string& id, const std::string& line) const;
  // "site1", or "site1 host 1" on a site of several hosts.
  std::string SiteAndHost() const;

  // ---- peer_calls.cpp ----
  // A daemon's control endpoint whose CURVE server key is server_key, as a control target.
  ControlTarget TargetOf(const std::string& endpoint, const std::string& server_key, int timeout_ms) const;
  // Host h of this site (site_hosts), as a control target.
  ControlTarget SiteHostTarget(int h, int timeout_ms) const;
  ControlTarget PeerTarget(const PeerConfig& peer, int timeout_ms) const;
  Status CallPeer(const std::string& site, const std::string& name, const std::string& job_id,
                  const ControlArgs& args, ControlArgs* reply, int timeout_ms = 3000) const;
  // On a worker: call(site, &reply) for every site at once (a thread each), so a slow or dead
  // site costs its own deadline, not the sum; answers in the order of sites.
  static PeerAnswers AtOnce(const std::vector<std::string>& sites,
                            const std::function<Status(const std::string& site, ControlArgs* reply)>& call);
  PeerAnswers CallPeersAtOnce(const std::vector<std::string>& sites, const std::string& name, const std::string& job_id,
                              const ControlArgs& args, int timeout_ms) const;
  // The same for work nobody waits on (a rollback, a chaos action of the job's timeline): then
  // runs on the loop with the answers.
  void InBackground(const std::string& what, std::function<PeerAnswers()> work, std::function<void(const PeerAnswers&)> then);
  ControlArgs Busy(const std::string& name) const;
  static ReplyTo ReplyToOf(net::RouterChannel& ch, const net::Received& r, const ParsedMessage& m);
  static ReplyTo ReplyToOf(net::LocalServer& server, const net::LocalReceived& r, const ParsedMessage& m);
  void Reply(const ReplyTo& to, const ControlArgs& args);

  // ---- job_lifecycle.cpp ----
  // A role of a learner whose ring spans train.hosts > 1 of this site's hosts: this host's place in
  // it and the ring store on host 0.
  void SetRingOptions(const std::string& id, int learner, RoleOptions* ro) const;
  // Starts the roles cfg places on this site (only those in *only when given: a restart
  // resumes the roles that had not ended).
  Status StartRoles(const std::string& id, const RunConfig& cfg, bool resume, JobRecord* record,
                    const std::set<std::string>* only = nullptr);
  // The syncer and a learner of the plan (train/role_plan.h) with this site's endpoints and keys.
  Status StartSyncerRole(const std::string& id, const RoleOptions& ro, const PlannedRole& pr, std::unique_ptr<Role>* role);
  Status StartLearnerRole(const std::string& id, const RoleOptions& ro, const PlannedRole& pr, std::unique_ptr<Role>* role);
  Status ShardEndpoints(const RunConfig& cfg, bool bound, std::vector<SyncerEndpoints>* out) const;
  // Takes a new job: persists it and starts its roles here.
  Status AcceptJob(const std::string& id, const RunConfig& cfg, const std::string& submitted_to);
  // The job to hosts 1 .. train.hosts - 1 of this site, each of which starts its ring members; any
  // refusal (or no answer in 5 s) refuses the job, and those that took it stop it again.
  Status ForwardToSiteHosts(const std::string& id, const RunConfig& cfg);
  Status LoadJobConfig(const std::string& id, RunConfig* cfg) const;
  // Saves a job's record (job_store.h) where the loop can do nothing more about a failure than
  // say it: logged once, and shown by status as the job's store_error until a save succeeds.
  // (Where a request waits on the save, its failure is the request's answer instead.)
  void SaveRecord(const JobRecord& rec);
  Status StopLocal(const std::string& id);
  // The job's sites other than this one.
  std::vector<std::string> OtherSitesOf(const RunConfig& cfg) const;
  std::vector<std::string> OtherSites(const std::string& id) const;
  // The job's syncer restarted from its checkpoint: learners that were running here may hold
  // deltas the old syncer never merged (and will not send those fragments again until their
  // Globals come), or a base newer than the checkpoint. Restart them as after a crash of this
  // daemon: they join from the new syncer's snapshot at their recorded step.
  // The old learners end on their threads (after their current step); RejoinTick starts the new
  // ones once they have.
  Status RejoinLearners(const std::string& id);
  // Each loop turn: learners asked to rejoin whose old selves have ended start again from
  // their recorded step.
  void RejoinTick();
  // After this daemon resumed a job's syncer: ask the learners' sites to rejoin.
  void AskLearnersToRejoin(const std::string& id, const RunConfig& cfg);
  // Roles that ended: record how, and the job's state on this site.
  void Reap();
  // The syncer of a job ends once every learner has ended, wherever it ran. Learners tell it
  // (Heartbeat kFinished), but one that finished while this daemon was down never will: ask
  // the learners' sites, and once all say their learner ended, stop the syncer (it merges
  // what is pending and saves its state).
  void CheckLearnersEnded();
  void ResumeJobs();

  bool OpenRunMetrics(const std::string& id, Job& job);  // false: logged, the job goes on without
  void SettleEndedJob(const std::string& id, const RunConfig& cfg, const JobRecord& rec);
  void WriteRunMetrics(const std::string& id, const Job& job, const nlohmann::json& line);
  bool EndedRoleResult(const std::string& id, const Job& job, const std::string& site, const std::string& name,
                       std::map<std::string, nlohmann::json>* views, nlohmann::json* result);
  bool JoinedSyncerResult(const std::string& id, const Job& job, nlohmann::json* result);
  bool LearnerResults(const std::string& id, const Job& job, std::vector<nlohmann::json>* results);
  void WriteDueSummaries();
  // ---- job_status.cpp ----
  void UpdateMetrics();
  // This site's view of a job: its record, config placement and its roles' progress.
  nlohmann::json LocalView(const std::string& id);
  ControlArgs JobStatus(const std::string& id);
  ControlArgs UnknownJob(const std::string& id);
  // The jobs from `offset` on, as many as fit one reply; "next" is where the following page
  // starts when some are left (the CLI asks until there is none).
  ControlArgs List(const ControlArgs& a);
  void UpdateSdStatus();

  // ---- job_chaos.cpp ----
  // The job's chaos: section, played from here (the syncer's site). Its clock starts now; after
  // a restart of this daemon it is not played again (its faults would repeat).
  void StartChaosTimeline(const std::string& id, Job& job, bool resume);
  // The chaos command of a user (local CLI): carried out here or sent to its site.
  MaybeReply Chaos(const std::string& id, const ControlArgs& a, const ReplyTo& to);
  // An action of the job's chaos timeline: here, or sent to its site off the loop.
  void SendChaos(const std::string& id, const SiteChaosCommand& c);
  Status ApplyChaos(const std::string& id, const SiteChaosCommand& c);
  // Each loop turn: killed roles that ended go; the job's timeline's actions go out; restarts and
  // undos that are due happen.
  void ChaosTick();
  // Starts the killed roles c names again, from what they left on disk; waits for a killed role
  // that has not ended yet (its sockets and files are still in use), retrying for up to 15 s
  // (a syncer's ports take a moment to be free again).
  void RestartKilled(const std::string& id, Job& job, const SiteChaosCommand& c);
  // chaos kill --process: the reply has gone (ZeroMQ sends it from its I/O thread: give it a
  // moment), then die as kill -9 would: no role saves anything.
  void KillProcessIfAsked();

  // ---- request_handlers.cpp ----
  // ring_set / ring_get (ring_store.h) from a host of this site, on host 0.
  ControlArgs RingRequest(const std::string& job, const std::string& name, const ControlArgs& a);
  MaybeReply Submit(const ControlArgs& a, const ReplyTo& to);
  // The submit once the job's other sites answered (none when it runs here only): accepted
  // everywhere, or stopped wherever it started.
  ControlArgs FinishSubmit(const std::string& id, const RunConfig& cfg, const std::string& source, const PeerAnswers& answers);
  MaybeReply Stop(const std::string& id, const ReplyTo& to);
  MaybeReply Logs(const std::string& id, int tail, const ReplyTo& to);
  MaybeReply HandleLocal(const std::string& name, const std::string& job, const ControlArgs& a, const ReplyTo& to);
  ControlArgs HandlePeer(const std::string& sender, const ParsedMessage& m);
};

}  // namespace diloco
