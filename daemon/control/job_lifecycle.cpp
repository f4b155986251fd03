// Admit, start, resume, reap and rejoin the roles of jobs on this site (daemon_impl.h).
#include "daemon/control/daemon_impl.h"

#include <algorithm>
#include <filesystem>
#include <thread>

#include "daemon/control/job_limits.h"
#include "daemon/control/job_metrics.h"
#include "daemon/train/role_plan.h"
#include "daemon/train/run_summary.h"
#include "daemon/train/trainer.h"
#include "daemon/util/atomic_file.h"
#include "daemon/util/proc_stats.h"

namespace diloco {

// A role of a learner whose ring spans train.hosts > 1 of this site's hosts: this host's place in
// it and the ring store on host 0.
void DaemonImpl::SetRingOptions(const std::string& id, int learner, RoleOptions* ro) const {
  if (ro->config.train.hosts <= 1 || config.site_hosts.empty()) return;
  ro->ring_host = config.host;
  ro->ring_address = config.site_hosts[config.host].ring_address;
  ro->ring_timeout_ms = config.ring_timeout_ms;
  const ControlTarget host0 = SiteHostTarget(0, 2000);
  net::NetContext* ctx = context.get();
  ro->ring_store = [ctx, host0, id, learner](const std::string& ring, const std::atomic<bool>* cancel) {
    return std::make_shared<ControlCommStore>(*ctx, host0, id, ring, learner, cancel);
  };
  ro->log = [this, id](const std::string& line) { JobLog(id, line); };
}

// Starts the roles cfg places on this site (only those in *only when given: a restart
// resumes the roles that had not ended).
Status DaemonImpl::StartRoles(const std::string& id, const RunConfig& cfg, bool resume, JobRecord* record,
                              const std::set<std::string>* only) {
  Job job;
  job.config = cfg;
  auto wanted = [&](const std::string& name) { return only == nullptr || only->count(name) > 0; };
  const int cores = config.threads > 0 ? config.threads : (int)std::max(1u, std::thread::hardware_concurrency());
  const RolePlan plan = PlanSite(cfg, config.site, config.host, cores);
  if (plan.roles_here == 0) return Status::Ok();
  RoleOptions ro;
  ro.job_id = id;
  ro.config = cfg;
  ro.run_dir = store->RunDir(id);
  ro.threads = plan.threads_per_role;
  ro.allow_plaintext = config.allow_plaintext;
  ro.resume = resume;
  ro.time_budget_start_unix_ms = record->created_ms;
  ro.chaos_link = config.chaos;
  ro.bind_retry_s = resume ? 15 : 0;  // the ports of the role it replaces may take a moment to be free
  for (const PlannedRole& pr : plan.roles) {
    if (!wanted(pr.name)) continue;
    std::unique_ptr<Role> role;
    if (pr.learner < 0) {
      DL_RETURN_IF_ERROR(StartSyncerRole(id, ro, pr, &role));
    } else if (pr.ring_member) {  // another host of the site: its part of the learner's ring
      RoleOptions mo = ro;
      SetRingOptions(id, pr.learner, &mo);
      DL_RETURN_IF_ERROR(Role::StartRingMember(*context, mo, pr.learner, &role).WithContext("starting " + pr.name + "'s ring member"));
    } else {
      DL_RETURN_IF_ERROR(StartLearnerRole(id, ro, pr, &role));
    }
    job.roles[pr.name] = std::move(role);
  }
  for (auto& [name, role] : job.roles) {
    RoleRecord& rr = record->roles[name];
    rr.state = JobState::kRunning;
    rr.error.clear();
  }
  JobLog(id, std::string(resume ? "resumed" : "started") + " roles: " + [&] {
    std::string s;
    for (auto& [name, r] : job.roles) s += (s.empty() ? "" : ", ") + name;
    return s;
  }());
  // Into the job's entry (a rejoin restarts some roles of a job whose others keep running).
  Job& entry = jobs[id];
  entry.config = cfg;
  // The home shard's site (shard 0's: sync/shards.h) keeps the run's lines and plays its chaos.
  const bool syncer_started = job.roles.count(SyncerShardName(0, cfg.sync.syncers)) > 0;
  for (auto& [name, role] : job.roles) entry.roles[name] = std::move(role);
  if (syncer_started && OpenRunMetrics(id, entry))
    WriteRunMetrics(id, entry, RunStartLine(cfg, resume, plan.threads_per_role));
  if (syncer_started && !cfg.chaos.empty() && !entry.chaos_runner) StartChaosTimeline(id, entry, resume);
  return Status::Ok();
}

// The syncer's site keeps the job's run-level lines (control/job_metrics.h); a failure to
// write them is logged, not the job's end.
bool DaemonImpl::OpenRunMetrics(const std::string& id, Job& job) {
  if (job.run_metrics) return true;
  auto writer = std::make_shared<JsonlWriter>();
  const std::string path = (std::filesystem::path(store->RunDir(id)) / "metrics.jsonl").string();
  if (Status st = writer->Open(path); !st.ok()) {
    JobLog(id, "the job's metrics.jsonl is not written: " + st.message());
    return false;
  }
  job.run_metrics = std::move(writer);
  return true;
}

// A running job whose roles here had all ended when this daemon went down (between the syncer's
// end and its summary: WriteDueSummaries): an entry without roles, which Reap settles as it would
// have, once the summary (this site hosts the syncer) is written.
void DaemonImpl::SettleEndedJob(const std::string& id, const RunConfig& cfg, const JobRecord& rec) {
  Job& job = jobs[id];
  job.config = cfg;
  const auto sr = rec.roles.find(SyncerShardName(0, cfg.sync.syncers));
  if (sr != rec.roles.end() && sr->second.state == JobState::kCompleted && OpenRunMetrics(id, job))
    job.ExpectSummary(sr->second.result);
  JobLog(id, "every role here had ended before this restart: the job is settled now");
}

void DaemonImpl::WriteRunMetrics(const std::string& id, const Job& job, const nlohmann::json& line) {
  if (!job.run_metrics) return;
  if (Status st = job.run_metrics->Write(line); !st.ok()) JobLog(id, "metrics.jsonl: " + st.message());
}

// Every syncer shard's endpoints as this site reaches them (placement.syncer; a site's n-th shard
// on its listen ports + n: ShardListen), with its site's key. bound: this site's own shards as it
// binds them (else as its learners connect to them).
Status DaemonImpl::ShardEndpoints(const RunConfig& cfg, bool bound, std::vector<SyncerEndpoints>* out) const {
  const int S = cfg.sync.syncers;
  out->assign(S, {});
  for (int s = 0; s < S; s++) {
    const std::string site = cfg.placement.SyncerSite(s);
    const std::vector<int> there = cfg.placement.ShardsOn(site, S);
    const int n = (int)(std::find(there.begin(), there.end(), s) - there.begin());
    DaemonEndpoints listen;
    std::string key;
    if (site == config.site) {
      listen = config.listen;
      if (!bound) {
        for (std::string* e : {&listen.uplink, &listen.downlink, &listen.snapshot}) *e = ConnectableEndpoint(*e);
      }
      if (keys) key = keys->public_z85;
      if (listen.uplink.empty() || listen.downlink.empty() || listen.snapshot.empty())
        return Status::Error("site " + config.site + " hosts " + SyncerShardName(s, S) + " but " + config.source +
                             " lacks listen.uplink, listen.downlink or listen.snapshot");
    } else {
      const PeerConfig* peer = config.FindPeer(site);
      if (!peer)
        return Status::Error("the site of " + SyncerShardName(s, S) + ", '" + site + "', is not among the peers in " +
                             config.source);
      listen = peer->endpoints;
      key = peer->public_key;
    }
    DaemonEndpoints shifted;
    DL_RETURN_IF_ERROR(ShardListen(listen, n, &shifted).WithContext(SyncerShardName(s, S) + " on site " + site));
    (*out)[s] = SyncerEndpoints{shifted.uplink, shifted.downlink, shifted.snapshot, key};
  }
  return Status::Ok();
}

Status DaemonImpl::StartSyncerRole(const std::string& id, const RoleOptions& ro, const PlannedRole& pr,
                                   std::unique_ptr<Role>* role) {
  const RunConfig& cfg = ro.config;
  RoleOptions so = ro;
  so.device = pr.device;  // where it evaluates
  so.shard = pr.shard;
  DL_RETURN_IF_ERROR(ShardEndpoints(cfg, /*bound=*/true, &so.syncers));
  if (keys) {
    so.curve = net::CurveOptions{keys->public_z85, keys->secret_z85, true, "dilocod", ""};
    // Each learner speaks only with the key of the site the job placed it on.
    for (const std::string& site : cfg.placement.learners) {
      const PeerConfig* peer = config.FindPeer(site);
      if (site != config.site && !peer) return Status::Error("learner site '" + site + "' is not among the peers");
      so.learner_keys.push_back(site == config.site ? keys->public_z85 : peer->public_key);
    }
  }
  for (auto& [other_id, other] : jobs) {
    for (const auto& [name, other_role] : other.roles) {
      if (other_id != id && IsSyncerRoleName(name))
        return Status::Refused("site " + config.site + " already hosts the syncer of job " + other_id +
                               " (one job's syncer per site: its listen endpoints are taken); stop it or wait");
    }
  }
  return Role::StartSyncer(*context, so, role).WithContext("starting " + pr.name);
}

Status DaemonImpl::StartLearnerRole(const std::string& id, const RoleOptions& ro, const PlannedRole& pr,
                                    std::unique_ptr<Role>* role) {
  RoleOptions lo = ro;
  SetRingOptions(id, pr.learner, &lo);
  lo.device = pr.device;
  DL_RETURN_IF_ERROR(ShardEndpoints(ro.config, /*bound=*/false, &lo.syncers));
  if (keys) lo.curve = net::CurveOptions{keys->public_z85, keys->secret_z85, false, "dilocod", lo.syncers[0].curve_server_key};
  return Role::StartLearner(*context, lo, pr.learner, role).WithContext("starting " + pr.name);
}

// Takes a new job: persists it and starts its roles here.
Status DaemonImpl::AcceptJob(const std::string& id, const RunConfig& cfg, const std::string& submitted_to) {
  // The learners placed here must fit this site's devices (daemon config) and this machine; each
  // gets its own GPUs (StartRoles).
  const int here = (int)std::count(cfg.placement.learners.begin(), cfg.placement.learners.end(), config.site);
  if (here > 0) DL_RETURN_IF_ERROR(CheckJobFitsSiteHosts(config.site, config.SiteHostCount(), cfg.train.hosts, config.source));
  if (here > 0) {
    TrainConfig all = cfg.train;
    all.ranks *= here;
    DL_RETURN_IF_ERROR(CheckJobFitsSite(config.site, config.devices, all.device, all.ranks));
    DL_RETURN_IF_ERROR(CheckTrainDevice(all).WithContext("site '" + config.site + "'"));
  }
  // A forwarded job too (the submitting site checked it): a daemon runs no ddp or virtual-clock job.
  DL_RETURN_IF_ERROR(CheckDaemonCanRun(cfg, "job " + id));
  if ((int)jobs.size() >= config.max_jobs)
    return Status::Error("site " + config.site + " already runs " + std::to_string(jobs.size()) +
                         " jobs, its max_jobs (" + config.source + "); stop one or wait");
  DL_RETURN_IF_ERROR(CheckCorpusAllowed(config.site, cfg.data.corpus, config.data_roots, config.source));
  const bool syncer_here = !cfg.placement.ShardsOn(config.site, cfg.sync.syncers).empty();
  DL_RETURN_IF_ERROR(CheckJobFitsMemory(config.site, cfg, here, syncer_here, MachineMemoryBytes()));
  if (!cfg.chaos.empty() && !config.chaos)
    return Status::Error("the job has a chaos: section, which site " + config.site + " refuses: its daemon config (" +
                         config.source + ") says chaos: false (set chaos: true on test clusters only)");
  // Host 0 of a site of several hosts: the hosts of the learners' rings take the job first.
  if (here > 0 && config.host == 0 && cfg.train.hosts > 1) DL_RETURN_IF_ERROR(ForwardToSiteHosts(id, cfg));
  JobRecord rec;
  rec.id = id;
  rec.submitted_to = submitted_to;
  rec.created_ms = UnixMsNow();
  rec.state = JobState::kPending;
  DL_RETURN_IF_ERROR(store->Create(rec, RunConfigToYaml(cfg)));
  Status st = StartRoles(id, cfg, false, &rec);
  if (!st.ok()) {
    rec.state = JobState::kFailed;
    rec.error = st.message();
    SaveRecord(rec);
    JobLog(id, "failed to start: " + st.message());
    return st;
  }
  rec.state = JobState::kRunning;
  DL_RETURN_IF_ERROR(store->Save(rec));
  return Status::Ok();
}

// The job to hosts 1 .. train.hosts - 1 of this site, each of which starts its ring members; any
// refusal (or no answer in 5 s) refuses the job, and those that took it stop it again.
Status DaemonImpl::ForwardToSiteHosts(const std::string& id, const RunConfig& cfg) {
  std::vector<std::string> hosts;
  for (int h = 1; h < cfg.train.hosts; h++) hosts.push_back(std::to_string(h));
  const std::string yaml = RunConfigToYaml(cfg);
  const PeerAnswers answers = AtOnce(hosts, [&](const std::string& h, ControlArgs* reply) {
    return CallControl(*context, SiteHostTarget(std::stoi(h), 5000), id, MessageBody(JobSpecMsg{yaml}), reply)
        .WithContext("host " + h + " of site " + config.site + " (" + config.site_hosts[std::stoi(h)].control + ")");
  });
  std::string refused;
  std::vector<std::string> took;
  for (const PeerAnswer& a : answers) {
    if (a.status.ok()) took.push_back(a.site);
    else refused += (refused.empty() ? "" : "; ") + a.status.message();
  }
  if (refused.empty()) return Status::Ok();
  for (const std::string& h : took) {
    ControlArgs reply;
    (void)CallControl(*context, SiteHostTarget(std::stoi(h), 2000), "peer_stop", id, {}, &reply);
  }
  return Status::Error(refused + ": every host of the learner's ring (train.hosts " + std::to_string(cfg.train.hosts) +
                       ") must be up and take the job");
}

void DaemonImpl::SaveRecord(const JobRecord& rec) {
  const Status st = store->Save(rec);
  if (st.ok()) {
    store_errors.erase(rec.id);
    return;
  }
  if (store_errors[rec.id] != st.message()) Log("job " + rec.id + ": its record was not saved: " + st.message());
  store_errors[rec.id] = st.message();
}

Status DaemonImpl::LoadJobConfig(const std::string& id, RunConfig* cfg) const {
  std::string text;
  DL_RETURN_IF_ERROR(ReadWholeFile(store->ConfigPath(id), "job config", &text));
  return ParseRunConfig(text, store->ConfigPath(id), "", {}, cfg);
}

Status DaemonImpl::StopLocal(const std::string& id) {
  JobRecord rec;
  DL_RETURN_IF_ERROR(store->Load(id, &rec));
  auto it = jobs.find(id);
  if (it != jobs.end()) {
    it->second.stop_requested = true;
    for (auto& [name, role] : it->second.roles) role->RequestStop();
    JobLog(id, "stop requested");
  } else if (!IsFinal(rec.state)) {
    rec.state = JobState::kStopped;
    DL_RETURN_IF_ERROR(store->Save(rec));
    JobLog(id, "stopped");
  }
  return Status::Ok();
}

// The job's sites other than this one.
std::vector<std::string> DaemonImpl::OtherSitesOf(const RunConfig& cfg) const {
  std::vector<std::string> out;
  for (const std::string& site : SitesOf(cfg))
    if (site != config.site) out.push_back(site);
  return out;
}

std::vector<std::string> DaemonImpl::OtherSites(const std::string& id) const {
  RunConfig cfg;
  (void)LoadJobConfig(id, &cfg);
  return OtherSitesOf(cfg);
}

void DaemonImpl::ResumeJobs() {
  for (const std::string& id : store->List()) {
    JobRecord rec;
    if (!store->Load(id, &rec).ok() || rec.state != JobState::kRunning) continue;
    RunConfig cfg;
    Status st = LoadJobConfig(id, &cfg);
    // Only the roles that had not finished before the restart.
    if (st.ok()) {
      std::set<std::string> unfinished;
      for (auto& [name, rr] : rec.roles)
        if (!IsFinal(rr.state)) unfinished.insert(name);
      if (unfinished.empty()) {
        SettleEndedJob(id, cfg, rec);
        continue;
      }
      st = StartRoles(id, cfg, true, &rec, &unfinished);
      if (st.ok() && std::any_of(unfinished.begin(), unfinished.end(), IsSyncerRoleName)) AskLearnersToRejoin(id, cfg);
    }
    if (!st.ok()) {
      rec.state = JobState::kFailed;
      rec.error = "resuming after a restart: " + st.message();
      JobLog(id, rec.error);
    }
    SaveRecord(rec);
  }
}

// Roles that ended: record how, and the job's state on this site.
void DaemonImpl::Reap() {
  for (auto it = jobs.begin(); it != jobs.end();) {
    Job& job = it->second;
    const std::string& id = it->first;
    JobRecord rec;
    if (!store->Load(id, &rec).ok()) {
      ++it;
      continue;
    }
    bool changed = false;
    for (auto rit = job.roles.begin(); rit != job.roles.end();) {
      Role& role = *rit->second;
      if (!role.done()) {
        ++rit;
        continue;
      }
      role.Join();
      RoleRecord& rr = rec.roles[rit->first];
      const Status st = role.outcome();
      rr.result = role.result();
      if (!st.ok()) {
        rr.state = JobState::kFailed;
        rr.error = st.message();
        JobLog(id, rit->first + " failed: " + st.message());
      } else {
        const bool stopped = job.stop_requested || rr.result.value("stopped", false);
        rr.state = stopped ? JobState::kStopped : JobState::kCompleted;
        JobLog(id, rit->first + " " + ToString(rr.state) + ": " + JsonText(rr.result));
        if (rit->first == SyncerShardName(0, job.config.sync.syncers) && rr.state == JobState::kCompleted &&
            job.run_metrics)
          job.ExpectSummary(rr.result);  // WriteDueSummaries
      }
      changed = true;
      rit = job.roles.erase(rit);
    }
    const bool roles_pending = job.roles.empty() && job.RolesPending();
    if (job.roles.empty() && !roles_pending) {
      for (const std::string& name : job.killed) {  // killed by chaos, never restarted
        rec.roles[name].state = JobState::kStopped;
        rec.roles[name].error = "killed by a chaos command and not restarted";
        changed = true;
      }
      bool failed = false, stopped = job.stop_requested;
      for (auto& [name, rr] : rec.roles) {
        failed |= rr.state == JobState::kFailed;
        stopped |= rr.state == JobState::kStopped;
        if (rr.state == JobState::kFailed && rec.error.empty()) rec.error = name + ": " + rr.error;
      }
      rec.state = failed ? JobState::kFailed : stopped ? JobState::kStopped : JobState::kCompleted;
      changed = true;  // also when the last role ended in an earlier turn (a summary was due)
      JobLog(id, std::string("job ") + ToString(rec.state) + " on this site");
    }
    if (changed) SaveRecord(rec);
    if (job.roles.empty() && !roles_pending) {
      ended_jobs[id] = Clock::now();  // its metrics go after metrics_keep_finished_s
      ring_store.DropJob(id);
      it = jobs.erase(it);
      UpdateSdStatus();
    } else {
      ++it;
    }
  }
}

// Role `name`'s result once it has ended, on this site or (from what the background refresh of
// peer views has) on `site`; false while it runs or is unknown. views: the peer views read so far.
bool DaemonImpl::EndedRoleResult(const std::string& id, const Job& job, const std::string& site, const std::string& name,
                                 std::map<std::string, nlohmann::json>* views, nlohmann::json* result) {
  nlohmann::json view;
  if (site == config.site) {
    JobRecord rec;
    if (job.roles.count(name) || !store->Load(id, &rec).ok()) return false;
    view = JobRecordToJson(rec);
  } else if (views->count(site)) {
    view = (*views)[site];
  } else {
    const PeerViews::View v = peer_views->Get(site, id, /*wait=*/false);
    if (!v.ok || !v.error.empty()) return false;
    view = (*views)[site] = v.json;
  }
  if (!view.is_object() || !view.contains("roles") || !view["roles"].contains(name)) return false;
  const nlohmann::json& role = view["roles"][name];
  JobState js;
  if (!ParseJobState(role.value("state", ""), &js) || !IsFinal(js)) return false;
  *result = role.value("result", nlohmann::json());
  return true;
}

// Every learner's role result when all of them have ended; false while any is running or unknown.
bool DaemonImpl::LearnerResults(const std::string& id, const Job& job, std::vector<nlohmann::json>* results) {
  results->clear();
  std::map<std::string, nlohmann::json> views;
  for (size_t i = 0; i < job.config.placement.learners.size(); i++) {
    nlohmann::json r;
    if (!EndedRoleResult(id, job, job.config.placement.learners[i], LearnerName((int)i), &views, &r)) return false;
    results->push_back(r);
  }
  return true;
}

// The syncer's result: the home shard's own (syncer_result), joined with every other shard's once
// each has ended (JoinShardResults); false while any is running or unknown.
bool DaemonImpl::JoinedSyncerResult(const std::string& id, const Job& job, nlohmann::json* result) {
  const int S = job.config.sync.syncers;
  std::vector<nlohmann::json> shards = {job.syncer_result};
  std::map<std::string, nlohmann::json> views;
  for (int s = 1; s < S; s++) {
    nlohmann::json r;
    if (!EndedRoleResult(id, job, job.config.placement.SyncerSite(s), SyncerShardName(s, S), &views, &r)) return false;
    shards.push_back(r);
  }
  *result = JoinShardResults(shards, ShardLayoutOf(job.config));
  return true;
}

void DaemonImpl::CheckLearnersEnded() {
  if (Clock::now() - last_learner_check < std::chrono::seconds(3)) return;
  last_learner_check = Clock::now();
  for (auto& [id, job] : jobs) {
    std::vector<Role*> syncers;  // the job's syncer shards here
    for (auto& [name, role] : job.roles)
      if (IsSyncerRoleName(name) && !role->done()) syncers.push_back(role.get());
    if (syncers.empty() || job.syncer_stop_sent) continue;
    std::vector<nlohmann::json> results;
    if (LearnerResults(id, job, &results)) {
      JobLog(id, "every learner has ended; the syncer merges what is pending and stops");
      for (Role* s : syncers) s->RequestStop();
      job.syncer_stop_sent = true;
    }
  }
}

// Jobs whose syncer completed here: their learner_done lines, evaluation and summary once every
// learner's result is known (a remote site's comes with its next view, within seconds). The job
// stays running here until then (Job::RolesPending), so whoever sees it completed finds its
// summary in metrics.jsonl; after a minute without them only the evaluation is written.
void DaemonImpl::WriteDueSummaries() {
  for (auto& [id, job] : jobs) {
    if (!job.summary_due) continue;
    std::vector<nlohmann::json> results;
    nlohmann::json sr;
    const bool known = LearnerResults(id, job, &results) && JoinedSyncerResult(id, job, &sr);
    if (!known && Clock::now() - job.summary_due_since < std::chrono::seconds(60)) continue;
    job.summary_due = false;
    if (!known) sr = job.syncer_result;
    nlohmann::json summary = known ? JobSummaryObject(job.config, sr, results, store->RunDir(id), id) : nullptr;
    if (!summary.is_null())
      for (size_t i = 0; i < results.size(); i++) WriteRunMetrics(id, job, LearnerDoneLine((int)i, results[i]));
    // At the summary's step count, as a local run's eval line (0 when the learners are unknown).
    WriteRunMetrics(id, job, {{"event", "eval"},
                              {"step", summary.is_null() ? 0L : summary.value("steps", 0L)},
                              {"val_loss", sr.value("final_val_loss", 0.0)}});
    if (summary.is_null()) {
      JobLog(id, "no summary in metrics.jsonl: the learners' results did not all come within a minute");
      continue;
    }
    summary["event"] = "summary";
    WriteRunMetrics(id, job, summary);
  }
}

// The job's syncer restarted from its checkpoint: learners that were running here may hold
// deltas the old syncer never merged (and will not send those fragments again until their
// Globals come), or a base newer than the checkpoint. Restart them as after a crash of this
// daemon: they join from the new syncer's snapshot at their recorded step.
// The old learners end on their threads (after their current step); RejoinTick starts the new
// ones once they have.
Status DaemonImpl::RejoinLearners(const std::string& id) {
  auto it = jobs.find(id);
  if (it == jobs.end()) return Status::Ok();
  Job& job = it->second;
  std::vector<std::string> names;
  for (auto& [name, role] : job.roles)
    if (!IsSyncerRoleName(name) && !role->done()) names.push_back(name);
  for (const std::string& name : names) {
    job.roles[name]->RequestShutdown();
    job.dying.push_back(std::move(job.roles[name]));
    job.roles.erase(name);
    job.rejoining.insert(name);
  }
  if (!names.empty()) JobLog(id, "the syncer restarted: learners rejoin from its snapshot once their current step ends");
  return Status::Ok();
}

// Each loop turn: learners asked to rejoin whose old selves have ended start again from
// their recorded step.
void DaemonImpl::RejoinTick() {
  for (auto& [id, job] : jobs) {
    if (job.rejoining.empty()) continue;
    if (std::any_of(job.dying.begin(), job.dying.end(), [&](const auto& r) { return job.rejoining.count(r->name()) > 0; }))
      continue;
    std::set<std::string> names = std::exchange(job.rejoining, {});
    JobRecord rec;
    Status st = store->Load(id, &rec);
    if (st.ok()) st = StartRoles(id, job.config, true, &rec, &names);
    if (!st.ok()) {
      for (const std::string& name : names) {
        rec.roles[name].state = JobState::kFailed;
        rec.roles[name].error = "rejoining after the syncer restarted: " + st.message();
      }
      JobLog(id, "learners could not rejoin: " + st.message());
    }
    SaveRecord(rec);
  }
}

// After this daemon resumed a job's syncer: ask the learners' sites to rejoin.
void DaemonImpl::AskLearnersToRejoin(const std::string& id, const RunConfig& cfg) {
  std::set<std::string> sites(cfg.placement.learners.begin(), cfg.placement.learners.end());
  sites.erase(config.site);  // learners here were resumed with this daemon
  const std::vector<std::string> remote(sites.begin(), sites.end());
  InBackground(
      "asking job " + id + "'s learners to rejoin", [this, id, remote] { return CallPeersAtOnce(remote, "peer_rejoin", id, {}, 5000); },
      [this, id](const PeerAnswers& answers) {
        for (const PeerAnswer& a : answers)
          JobLog(id, a.status.ok() ? "asked " + a.site + " to rejoin its learners"
                                   : "could not ask " + a.site + " to rejoin: " + a.status.message());
      });
}

}  // namespace diloco
