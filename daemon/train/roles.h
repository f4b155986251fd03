// The roles of a run's plan (train/role_plan.h), each on its own thread: the syncer (a Syncer bound
// to its endpoints) and learners (RunLearner connected to them). A daemon runs the roles a job
// places on its site (tcp, CURVE); local mode runs every role of its plan in one process (inproc
// or loopback, train/local_fleet.h), as incarnations that chaos kills and restarts. A role keeps a thread-safe progress object for `status`, and what a restart needs
// on disk in its run directory:
//   syncer      global_state.bin (the syncer's checkpoint), events.log
//   learner-<i> learner-<i>.step: the last step reached (rewritten atomically about once a second),
//               learner-<i>.jsonl: its metrics lines
//   ring member (host h > 0 of a site, train.hosts > 1; train/ring_member.h): nothing; it follows
//               host 0's learner-<i> (named learner-<i> on its host too)
// A learner whose ring spans the site's hosts runs on host 0 as incarnations: each one's ring has
// a new name (RingIncarnationName), published in host 0's ring store; when a ring fails (a host
// died or stalled: Gloo fails every host) the incarnation ends and the next one waits for the
// site's hosts, then joins from the syncer's snapshot at the recorded step, as a restarted
// learner does. The syncer sees one learner throughout.
// A role started with resume continues from there: the syncer restores global_state.bin
// (versions never go back), a learner joins from the syncer's snapshot at its recorded step.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "daemon/config/run_config.h"
#include "daemon/net/context.h"
#include "daemon/net/link_shaper.h"
#include "daemon/net/socket.h"
#include "daemon/sync/syncer.h"
#include "daemon/train/learner.h"
#include "daemon/util/jsonl_writer.h"
#include "daemon/util/status.h"

namespace diloco {

class CommStore;

struct RoleOptions {
  std::string job_id;
  RunConfig config;
  std::string run_dir;
  int threads = 1;  // OpenMP threads of this role
  // A learner: the first device of its ring; the syncer: where it evaluates (train/role_plan.h);
  // empty: train.device for a learner, "cpu" for the syncer.
  std::string device;
  // Each syncer shard's endpoints (index = shard, shards.h): a syncer role binds its own
  // (syncers[shard]), a learner role connects to them all.
  std::vector<SyncerEndpoints> syncers;
  int shard = 0;  // a syncer role: which of the sync.syncers shards it is
  bool allow_plaintext = false;
  std::optional<net::CurveOptions> curve;  // syncer: server keys; learner: client keys + server key
  bool resume = false;                     // continue after a daemon restart
  // A learner: train.time_limit_s counts from here (Unix ms; the job's arrival on this site), so
  // a restarted learner (daemon restart, new ring incarnation) keeps the job's budget. 0: from
  // when it trains.
  int64_t time_budget_start_unix_ms = 0;
  // The syncer: how long to keep trying when its ports are still taken (a restart right after
  // the role it replaces released them); 0 fails at once.
  double bind_retry_s = 0;
  // A learner: its sockets go through an emulated link (net/link_shaper.h), unshaped, so chaos
  // commands can cut it (partition, drop, corrupt). Set on sites whose config says chaos: true.
  bool chaos_link = false;
  // The syncer: each learner's site key (SyncerOptions::learner_keys); empty without CURVE.
  std::vector<std::string> learner_keys;
  // A learner whose ring spans train.hosts > 1 hosts: this host's index in the site (0: the
  // learner; > 0: a ring member), where its ring binds, the collective and rendezvous timeout, and
  // the rendezvous store of a ring (control/ring_store.h; get gives up once *cancel is set).
  int ring_host = 0;
  std::string ring_address;
  int64_t ring_timeout_ms = 60000;
  std::function<std::shared_ptr<CommStore>(const std::string& ring, const std::atomic<bool>* cancel)> ring_store;
  // Lines for the job's log (any thread); may be empty.
  std::function<void(const std::string&)> log;
  // A learner that local mode runs (train/local_fleet.h), handed what a daemon's role makes
  // itself. start_step >= 0: where this incarnation starts (the step its killed predecessor
  // reached), instead of its step file on resume or 0. link: its emulated link, kept across its
  // incarnations (instead of chaos_link's). init_params: the run's initial model (instead of
  // making it from train.seed). metrics, metrics_mu: the writer of its learner-<i>.jsonl
  // (instead of opening it). tune: last changes to its LearnerOptions (the tests' hooks).
  long start_step = -1;
  std::shared_ptr<net::Link> link;
  const float* init_params = nullptr;  // the syncer's too
  // The syncer that local mode runs: evaluate: false leaves the corpus, the evaluations and
  // checkpoint.bin to its run frame (run_frame.h); tune_syncer: last changes to its options
  // (the run's merge tape, its idle exit, the tests' hooks).
  bool evaluate = true;
  std::function<void(SyncerOptions*)> tune_syncer;
  JsonlWriter* metrics = nullptr;
  std::mutex* metrics_mu = nullptr;
  std::function<void(LearnerOptions*)> tune;
};

class Role {
 public:
  // Start the role's thread, which builds the role (corpus, model, sockets) and runs it: what
  // fails there (a port taken, a corpus that does not load) is the role's outcome. Only cheap
  // checks (the run directory, the device) fail here.
  // The syncer role is named after its shard (shards.h: "syncer", or "syncer-<s>").
  static Status StartSyncer(net::NetContext& context, const RoleOptions& options, std::unique_ptr<Role>* out);
  static Status StartLearner(net::NetContext& context, const RoleOptions& options, int index,
                             std::unique_ptr<Role>* out);
  // Host h > 0's part of learner index's ring across the site's hosts (train/ring_member.h).
  static Status StartRingMember(net::NetContext& context, const RoleOptions& options, int index,
                                std::unique_ptr<Role>* out);
  ~Role();  // requests a stop and joins

  const std::string& name() const { return name_; }
  bool done() const { return done_; }
  // After done(): how the role ended and its result object.
  Status outcome() const;
  nlohmann::json result() const;
  // Any time: what it is doing (for status and metrics).
  nlohmann::json Progress() const;
  // The syncer once built (its sockets bound), until the role is destroyed; else null.
  Syncer* syncer() const;
  // A learner: the step it has reached; once done(), what this incarnation did.
  long step() const;
  const LearnerResult& learner_result() const;
  // Stop cleanly: a learner sends its pending work and a last heartbeat, the syncer merges what
  // is pending and saves its checkpoint.
  void RequestStop();
  // The daemon is going down (SIGTERM): stop as fast as possible, keeping what a restart needs.
  void RequestShutdown();
  void Join();

  // The syncer: one look at its learners for the job's goodput (sync/live_goodput.h); the
  // daemon calls it every turn of its loop. Nothing for a learner.
  void Observe();

  // Chaos (control/site_chaos.h). Kill: stop dead, as kill -9 would: a learner sends nothing
  // more, the syncer merges and saves nothing more (its update log stays). Slowdown: a learner's
  // step stretch (0: back to the config's). ShapeLink: change a learner's emulated link (an error
  // when it has none, or for the syncer).
  void Kill();
  bool killed() const { return killed_; }
  Status SetSlowdown(double factor);
  Status ShapeLink(const std::function<void(net::LinkParams*)>& change);

 private:
  struct Impl;
  Role() = default;
  // A role named name, not started yet (index: a learner's, -1 for the syncer).
  static std::unique_ptr<Role> Make(const std::string& name, const RoleOptions& options, int index);
  // The role's thread: body's status and result become the outcome, then done. An exception out
  // of the role (bad_alloc, say) is its outcome too, not the end of the daemon.
  void RunToEnd(const std::function<Status(nlohmann::json* result)>& body);
  Status RunSyncer(net::NetContext& context, nlohmann::json* result);
  Status RunLearnerRole(net::NetContext& context, nlohmann::json* result);
  Status RunRingMemberRole(nlohmann::json* result);
  Status RunLearnerAcrossHosts(net::NetContext& context, LearnerOptions lo, LearnerResult* res);
  void AbortMemberRing();
  std::string name_;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  std::atomic<bool> killed_{false};
  mutable std::mutex mu_;
  Status outcome_;
  nlohmann::json result_;
};

}  // namespace diloco
