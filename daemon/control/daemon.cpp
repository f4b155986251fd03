#include "daemon/control/daemon.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/control/control_protocol.h"
#include "daemon/control/job_limits.h"
#include "daemon/control/job_store.h"
#include "daemon/control/off_loop.h"
#include "daemon/control/peer_views.h"
#include "daemon/control/ring_store.h"
#include "daemon/control/roles.h"
#include "daemon/control/site_chaos.h"
#include "daemon/control/site_metrics.h"
#include "daemon/train/chaos_runner.h"
#include "daemon/metrics/registry.h"
#include "daemon/metrics/server.h"
#include "daemon/net/channel.h"
#include "daemon/net/curve.h"
#include "daemon/net/envelope.h"
#include "daemon/net/wire_transport.h"
#include "daemon/sync/syncer.h"
#include "daemon/train/trainer.h"
#include "daemon/util/atomic_file.h"
#include "daemon/util/lock_file.h"
#include "daemon/util/proc_stats.h"
#include "daemon/util/sd_notify.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::atomic<bool> g_shutdown{false};

void OnSignal(int) { g_shutdown = true; }

// The last `lines` lines of a file (lines clamped to [1, kMaxTailLines]: a request cannot make
// the daemon hold more).
constexpr int kMaxTailLines = 10000;
int TailLines(const std::string& requested) {
  const long n = std::strtol(requested.c_str(), nullptr, 10);
  return (int)std::clamp<long>(n, 1, kMaxTailLines);
}
// Lines longer than this are cut in `logs` (the reply must stay under kMaxTextBytes).
constexpr size_t kMaxLogLineBytes = 2048;
std::string Tail(const std::string& path, int lines, size_t max_bytes = 16 << 10) {
  lines = std::clamp(lines, 1, kMaxTailLines);
  std::ifstream f(path);
  std::deque<std::string> last;
  for (std::string line; std::getline(f, line);) {
    if (line.size() > kMaxLogLineBytes)
      line = line.substr(0, kMaxLogLineBytes) + "...[" + std::to_string(line.size() - kMaxLogLineBytes) + " bytes cut]";
    last.push_back(std::move(line));
    if ((int)last.size() > lines) last.pop_front();
  }
  // The newest lines that fit in max_bytes.
  size_t bytes = 0;
  auto first = last.end();
  while (first != last.begin() && bytes + std::prev(first)->size() + 1 <= max_bytes) bytes += (--first)->size() + 1;
  std::string out;
  for (auto it = first; it != last.end(); ++it) out += *it + "\n";
  return out;
}

// JSON as text for replies and logs: strings that are not valid UTF-8 (a path with byte 0xff,
// say) come out with U+FFFD instead of throwing.
std::string JsonText(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

// A site's view of a job (LocalView) as a peer sent it: only the shapes the readers below rely on
// (objects where they index, strings where they read text). Anything else is refused whole.
bool IsJobView(const nlohmann::json& v) {
  if (!v.is_object()) return false;
  for (const char* key : {"state", "error", "run_dir", "site"})
    if (v.contains(key) && !v[key].is_string()) return false;
  if (!v.contains("roles")) return true;
  if (!v["roles"].is_object()) return false;
  for (const auto& [name, role] : v["roles"].items()) {
    if (!role.is_object()) return false;
    for (const char* key : {"progress", "result"})
      if (role.contains(key) && !role[key].is_object() && !role[key].is_null()) return false;
    for (const char* key : {"state", "error"})
      if (role.contains(key) && !role[key].is_string()) return false;
  }
  return true;
}

// j[key] when it is a number, else fallback (NaN is stored as JSON null).
template <typename T>
T Number(const nlohmann::json& j, const char* key, T fallback) {
  const auto it = j.is_object() ? j.find(key) : j.end();
  return j.is_object() && it != j.end() && it->is_number() ? it->get<T>() : fallback;
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

// The sites a job's placement names, syncer first, each once.
std::vector<std::string> SitesOf(const RunConfig& cfg) {
  std::vector<std::string> sites = {cfg.placement.syncer};
  for (const std::string& s : cfg.placement.learners)
    if (std::find(sites.begin(), sites.end(), s) == sites.end()) sites.push_back(s);
  return sites;
}

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
  void KillSyncer() override { Push(ChaosActionKind::kSyncerKill, -1, 0); }
  void RestartSyncer() override { Push(ChaosActionKind::kSyncerRestart, -1, 0); }
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
  void Push(ChaosActionKind kind, int learner, double value) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({kind, learner, value});
  }
  mutable std::mutex mu_;
  std::vector<ChaosAction> queue_;
  std::vector<long> steps_;
};

}  // namespace

struct Daemon::Impl {
  DaemonConfig config;
  std::unique_ptr<LockFile> lock;
  std::optional<net::CurveKeyPair> keys;
  std::unique_ptr<net::NetContext> context;
  std::unique_ptr<JobStore> store;
  std::unique_ptr<PeerViews> peer_views;  // after context: its workers call peers through it
  std::unique_ptr<OffLoop> off_loop;      // after context: its workers call peers through it
  std::set<std::string> reserved_ids;     // jobs whose submit waits on other sites
  std::unique_ptr<net::RouterChannel> local;  // ipc, the CLI
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
    // Roles that have not ended for good: the job is not over on this site.
    bool RolesPending() const {
      if (!dying.empty() || !rejoining.empty()) return true;
      for (const auto& [t, c] : chaos_due)
        if (c.action == SiteChaosAction::kRestart) return true;
      for (const std::string& name : killed)
        if (chaos_runner && chaos_runner->RestartPending(name == kSyncerName ? -1 : LearnerIndexOf(name))) return true;
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

  void UpdateMetrics() {
    if (!metrics_server || Clock::now() - last_metrics < std::chrono::seconds(1)) return;
    last_metrics = Clock::now();
    for (auto it = ended_jobs.begin(); it != ended_jobs.end();) {
      if (jobs.count(it->first) == 0 && Clock::now() - it->second >= std::chrono::seconds(config.metrics_keep_finished_s)) {
        metrics.RemoveWithLabel("job", it->first);
        it = ended_jobs.erase(it);
      } else {
        ++it;
      }
    }
    std::map<std::string, int> states = {{"pending", 0}, {"running", 0}, {"completed", 0}, {"failed", 0}, {"stopped", 0}};
    for (const std::string& id : store->List()) {
      JobRecord rec;
      if (store->Load(id, &rec).ok()) states[ToString(rec.state)]++;
    }
    for (const auto& [state, n] : states) metrics.Set("dilocod_jobs", {state}, n);
    for (auto& [id, job] : jobs)
      for (auto& [name, role] : job.roles) MirrorRoleProgress(&metrics, id, name, role->Progress());
  }

  void Log(const std::string& line) const {
    const auto now = std::chrono::system_clock::now();
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    const int ms = (int)(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", std::gmtime(&t));
    std::fprintf(stderr, "%s.%03dZ dilocod[%s] %s\n", stamp, ms, SiteAndHost().c_str(), line.c_str());
    std::fflush(stderr);
  }
  void JobLog(const std::string& id, const std::string& line) const {
    Log("job " + id + ": " + line);
    store->AppendLog(id, "[" + SiteAndHost() + "] " + line);
  }
  // "site1", or "site1 host 1" on a site of several hosts.
  std::string SiteAndHost() const {
    return config.site_hosts.size() > 1 ? config.site + " host " + std::to_string(config.host) : config.site;
  }

  // A daemon's control endpoint whose CURVE server key is server_key, as a control target.
  ControlTarget TargetOf(const std::string& endpoint, const std::string& server_key, int timeout_ms) const {
    ControlTarget t;
    t.endpoint = endpoint;
    t.sender = config.site;
    t.timeout_ms = timeout_ms;
    if (keys) {
      net::CurveOptions c;
      c.public_key_z85 = keys->public_z85;
      c.secret_key_z85 = keys->secret_z85;
      c.server_public_key_z85 = server_key;
      t.curve = c;
    }
    return t;
  }

  // Host h of this site (site_hosts), as a control target.
  ControlTarget SiteHostTarget(int h, int timeout_ms) const {
    return TargetOf(config.site_hosts[h].control, config.site_hosts[h].public_key, timeout_ms);
  }

  // A role of a learner whose ring spans train.hosts > 1 of this site's hosts: this host's place in
  // it and the ring store on host 0.
  void SetRingOptions(const std::string& id, int learner, RoleOptions* ro) const {
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

  ControlTarget PeerTarget(const PeerConfig& peer, int timeout_ms) const {
    return TargetOf(peer.endpoints.control, peer.public_key, timeout_ms);
  }

  Status CallPeer(const std::string& site, const std::string& name, const std::string& job_id,
                  const ControlArgs& args, ControlArgs* reply, int timeout_ms = 3000) const {
    const PeerConfig* peer = config.FindPeer(site);
    if (!peer) return Status::Error("site '" + site + "' is not among this daemon's peers");
    return CallControl(*context, PeerTarget(*peer, timeout_ms), name, job_id, args, reply)
        .WithContext("site " + site);
  }

  // ---- Peer calls off the loop (off_loop.h) ----

  struct PeerAnswer {
    std::string site;
    Status status;
    ControlArgs reply;
  };
  using PeerAnswers = std::vector<PeerAnswer>;
  // On a worker: call(site, &reply) for every site at once (a thread each), so a slow or dead
  // site costs its own deadline, not the sum; answers in the order of sites.
  static PeerAnswers AtOnce(const std::vector<std::string>& sites,
                            const std::function<Status(const std::string& site, ControlArgs* reply)>& call) {
    std::vector<std::future<PeerAnswer>> calls;
    for (const std::string& site : sites) {
      calls.push_back(std::async(std::launch::async, [&call, site] {
        PeerAnswer a{site, Status::Ok(), {}};
        a.status = call(site, &a.reply);
        return a;
      }));
    }
    PeerAnswers out;
    for (auto& c : calls) out.push_back(c.get());
    return out;
  }
  PeerAnswers CallPeersAtOnce(const std::vector<std::string>& sites, const std::string& name, const std::string& job_id,
                              const ControlArgs& args, int timeout_ms) const {
    return AtOnce(sites, [&](const std::string& site, ControlArgs* reply) {
      return CallPeer(site, name, job_id, args, reply, timeout_ms);
    });
  }

  // Where a request's answer goes, kept for answering it later.
  struct ReplyTo {
    net::RouterChannel* channel = nullptr;
    std::string peer;  // routing id
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
  // The same for work nobody waits on (a rollback, a chaos action of the job's timeline): then
  // runs on the loop with the answers.
  void InBackground(const std::string& what, std::function<PeerAnswers()> work, std::function<void(const PeerAnswers&)> then) {
    const bool queued = off_loop->Run([this, what, work, then]() -> OffLoop::Task {
      try {
        PeerAnswers answers = work();
        return [this, what, then, answers] { Guarded(what.c_str(), [&] { then(answers); }); };
      } catch (const std::exception& e) {
        const std::string error = e.what();
        return [this, what, error] { Log(what + " failed: " + error); };
      }
    });
    if (!queued) Log(what + " not done: too many calls to other sites are waiting");
  }
  ControlArgs Busy(const std::string& name) const {
    return {{"error", "site " + config.site + " is busy with calls to other sites (" + std::to_string(kMaxOffLoop) +
                          " waiting): '" + name + "' not taken; try again in a moment"}};
  }
  static constexpr int kOffLoopWorkers = 4;
  static constexpr size_t kMaxOffLoop = 64;

  // Starts the roles cfg places on this site (only those in *only when given: a restart
  // resumes the roles that had not ended).
  Status StartRoles(const std::string& id, const RunConfig& cfg, bool resume, JobRecord* record,
                    const std::set<std::string>* only = nullptr) {
    Job job;
    job.config = cfg;
    auto wanted = [&](const std::string& name) { return only == nullptr || only->count(name) > 0; };
    int n_roles = (cfg.placement.syncer == config.site);
    for (const std::string& s : cfg.placement.learners) n_roles += (s == config.site);
    if (n_roles == 0) return Status::Ok();
    const int cores = config.threads > 0 ? config.threads : (int)std::max(1u, std::thread::hardware_concurrency());
    RoleOptions ro;
    ro.job_id = id;
    ro.config = cfg;
    ro.run_dir = store->RunDir(id);
    ro.threads = std::max(1, cores / n_roles);
    ro.allow_plaintext = config.allow_plaintext;
    ro.resume = resume;
    ro.chaos_link = config.chaos;
    ro.bind_retry_s = resume ? 15 : 0;  // the ports of the role it replaces may take a moment to be free
    if (cfg.placement.syncer == config.site && config.host == 0 && wanted(kSyncerName)) {
      RoleOptions so = ro;
      so.uplink = config.listen.uplink;
      so.downlink = config.listen.downlink;
      so.snapshot = config.listen.snapshot;
      if (so.uplink.empty() || so.downlink.empty() || so.snapshot.empty()) {
        return Status::Error("site " + config.site + " hosts the syncer of job " + id + " but " + config.source +
                             " lacks listen.uplink, listen.downlink or listen.snapshot");
      }
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
        if (other.roles.count(kSyncerName)) {
          return Status::Error("site " + config.site + " already hosts the syncer of job " + other_id +
                               " (one syncer per site: its listen endpoints are taken); stop it or wait");
        }
      }
      std::unique_ptr<Role> role;
      DL_RETURN_IF_ERROR(Role::StartSyncer(*context, so, &role).WithContext("starting the syncer"));
      job.roles[kSyncerName] = std::move(role);
    }
    int ordinal = -1;  // of the learners placed on this site
    for (size_t i = 0; i < cfg.placement.learners.size(); i++) {
      if (cfg.placement.learners[i] != config.site) continue;
      ordinal++;
      if (!wanted(LearnerName((int)i))) continue;
      if (config.host > 0) {  // another host of the site: its part of the learner's ring, if any
        if (config.host >= cfg.train.hosts) continue;
        RoleOptions mo = ro;
        SetRingOptions(id, (int)i, &mo);
        std::unique_ptr<Role> role;
        DL_RETURN_IF_ERROR(Role::StartRingMember(*context, mo, (int)i, &role).WithContext("starting " + LearnerName(i) + "'s ring member"));
        job.roles[LearnerName(i)] = std::move(role);
        continue;
      }
      RoleOptions lo = ro;
      SetRingOptions(id, (int)i, &lo);
      lo.device = RankDevice(cfg.train.device, ordinal * cfg.train.ranks);
      std::string server_key;
      if (cfg.placement.syncer == config.site) {
        lo.uplink = ConnectableEndpoint(config.listen.uplink);
        lo.downlink = ConnectableEndpoint(config.listen.downlink);
        lo.snapshot = ConnectableEndpoint(config.listen.snapshot);
        if (keys) server_key = keys->public_z85;
      } else {
        const PeerConfig* peer = config.FindPeer(cfg.placement.syncer);
        if (!peer) return Status::Error("the syncer's site '" + cfg.placement.syncer + "' is not among the peers in " + config.source);
        lo.uplink = peer->endpoints.uplink;
        lo.downlink = peer->endpoints.downlink;
        lo.snapshot = peer->endpoints.snapshot;
        server_key = peer->public_key;
      }
      if (keys) lo.curve = net::CurveOptions{keys->public_z85, keys->secret_z85, false, "dilocod", server_key};
      std::unique_ptr<Role> role;
      DL_RETURN_IF_ERROR(Role::StartLearner(*context, lo, (int)i, &role).WithContext("starting " + LearnerName(i)));
      job.roles[LearnerName(i)] = std::move(role);
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
    const bool syncer_started = job.roles.count(kSyncerName) > 0;
    for (auto& [name, role] : job.roles) entry.roles[name] = std::move(role);
    if (syncer_started && !cfg.chaos.empty() && !entry.chaos_runner) StartChaosTimeline(id, entry, resume);
    return Status::Ok();
  }

  // The job's chaos: section, played from here (the syncer's site). Its clock starts now; after
  // a restart of this daemon it is not played again (its faults would repeat).
  void StartChaosTimeline(const std::string& id, Job& job, bool resume) {
    if (resume) {
      JobLog(id, "chaos: the job's chaos timeline is not replayed after a restart of this daemon");
      return;
    }
    const std::vector<ChaosAction> actions = ExpandChaos(job.config.chaos, (int)job.config.placement.learners.size(),
                                                         7 * 24 * 3600.0);
    JobLog(id, "chaos timeline:\n" + ChaosSummary(actions));
    job.chaos_target = std::make_shared<QueuedChaosTarget>();
    job.chaos_runner = std::make_unique<ChaosRunner>(actions, job.chaos_target.get(), nullptr);
    job.chaos_runner->Start();
  }

  // Takes a new job: persists it and starts its roles here.
  Status AcceptJob(const std::string& id, const RunConfig& cfg, const std::string& submitted_to) {
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
    if ((int)jobs.size() >= config.max_jobs)
      return Status::Error("site " + config.site + " already runs " + std::to_string(jobs.size()) +
                           " jobs, its max_jobs (" + config.source + "); stop one or wait");
    DL_RETURN_IF_ERROR(CheckCorpusAllowed(config.site, cfg.data.corpus, config.data_roots, config.source));
    DL_RETURN_IF_ERROR(CheckJobFitsMemory(config.site, cfg, here, cfg.placement.syncer == config.site, MachineMemoryBytes()));
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
      (void)store->Save(rec);
      JobLog(id, "failed to start: " + st.message());
      return st;
    }
    rec.state = JobState::kRunning;
    DL_RETURN_IF_ERROR(store->Save(rec));
    return Status::Ok();
  }

  // The job to hosts 1 .. train.hosts - 1 of this site, each of which starts its ring members; any
  // refusal (or no answer in 5 s) refuses the job, and those that took it stop it again.
  Status ForwardToSiteHosts(const std::string& id, const RunConfig& cfg) {
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

  // ring_set / ring_get (ring_store.h) from a host of this site, on host 0.
  ControlArgs RingRequest(const std::string& job, const std::string& name, const ControlArgs& a) {
    const auto get = [&](const char* k) { auto it = a.find(k); return it == a.end() ? std::string() : it->second; };
    if (config.host != 0 || config.site_hosts.size() < 2)
      return {{"error", "site " + SiteAndHost() + " is not host 0 of a site of several hosts: it serves no ring store"}};
    auto jit = jobs.find(job);
    const int learner = std::atoi(get("learner").c_str());
    bool running = jit != jobs.end();
    if (running && !get("learner").empty()) {
      const Job& j = jit->second;
      const std::string lname = LearnerName(learner);
      running = j.roles.count(lname) || j.rejoining.count(lname) || j.killed.count(lname) ||
                std::any_of(j.dying.begin(), j.dying.end(), [&](const auto& r) { return r->name() == lname; });
    }
    if (!running) return {{"ok", "1"}, {"ended", "1"}};
    if (name == "ring_set") {
      std::vector<char> value;
      if (!HexDecode(get("value"), &value)) return {{"error", "ring_set: value is not hex"}};
      if (Status st = ring_store.Set(job, get("ring"), get("key"), std::string(value.begin(), value.end())); !st.ok())
        return {{"error", st.message()}};
      return {{"ok", "1"}};
    }
    std::string value;
    if (!ring_store.Get(job, get("ring"), get("key"), &value)) return {{"ok", "1"}, {"missing", "1"}};
    return {{"ok", "1"}, {"value", HexEncode(std::vector<char>(value.begin(), value.end()))}};
  }

  Status LoadJobConfig(const std::string& id, RunConfig* cfg) const {
    std::string text;
    DL_RETURN_IF_ERROR(ReadWholeFile(store->ConfigPath(id), "job config", &text));
    return ParseRunConfig(text, store->ConfigPath(id), "", {}, cfg);
  }

  // ---- Commands ----

  MaybeReply Submit(const ControlArgs& a, const ReplyTo& to) {
    const auto get = [&](const char* k) { auto it = a.find(k); return it == a.end() ? std::string() : it->second; };
    if (config.host > 0)
      return ControlArgs{{"error", "this dilocod is host " + std::to_string(config.host) + " of site " + config.site +
                                       ": submit jobs on host 0 (" + config.site_hosts[0].control + "), which the other sites reach"}};
    if ((int64_t)(get("config_yaml").size() + get("overrides").size()) > config.max_job_spec_bytes)
      return ControlArgs{{"error", get("source") + ": the run config and its overrides are larger than site " + config.site +
                            " takes (max_job_spec_bytes " + std::to_string(config.max_job_spec_bytes) + " in " + config.source + ")"},
              {"usage", "1"}};
    RunConfig cfg;
    if (Status st = ParseRunConfig(get("config_yaml"), get("source"), get("base_dir"), SplitLines(get("overrides")), &cfg);
        !st.ok()) {
      return ControlArgs{{"error", st.message()}, {"usage", "1"}};
    }
    if (cfg.placement.empty()) {
      return ControlArgs{{"error", get("source") + ": placement: is required to submit a job: which site hosts the syncer and "
                                        "which hosts each learner, e.g. placement: {syncer: " + config.site +
                            ", learners: [" + config.site + ", " + config.site + "]}"},
              {"usage", "1"}};
    }
    if (Status st = CheckDaemonCanRun(cfg, get("source")); !st.ok()) return ControlArgs{{"error", st.message()}, {"usage", "1"}};
    for (const std::string& site : SitesOf(cfg)) {
      if (site != config.site && !config.FindPeer(site)) {
        std::string known = config.site;
        for (const PeerConfig& p : config.peers) known += ", " + p.site;
        return ControlArgs{{"error", get("source") + ": placement names site '" + site + "', which " + config.site +
                              " does not know (known sites: " + known + "); add it to peers in " + config.source},
                {"usage", "1"}};
      }
    }
    std::string id = store->NewId();
    while (reserved_ids.count(id)) id = store->NewId();
    const std::vector<std::string> remote = OtherSitesOf(cfg);
    const std::string source = get("source");
    if (remote.empty()) return FinishSubmit(id, cfg, source, {});
    // Peers first, off the loop: a peer that cannot take the job fails the submit before
    // anything runs here.
    reserved_ids.insert(id);
    const std::string yaml = RunConfigToYaml(cfg);
    return Defer(
        to,
        [this, id, yaml, remote] {
          return AtOnce(remote, [&](const std::string& site, ControlArgs* reply) {
            return CallControl(*context, PeerTarget(*config.FindPeer(site), 10000), id, MessageBody(JobSpecMsg{yaml}), reply)
                .WithContext("site " + site);
          });
        },
        [this, id, cfg, source](const PeerAnswers& answers) {
          reserved_ids.erase(id);
          return FinishSubmit(id, cfg, source, answers);
        });
  }

  // The submit once the job's other sites answered (none when it runs here only): accepted
  // everywhere, or stopped wherever it started.
  ControlArgs FinishSubmit(const std::string& id, const RunConfig& cfg, const std::string& source, const PeerAnswers& answers) {
    std::vector<std::string> started;
    std::string refused;
    for (const PeerAnswer& a : answers) {
      if (a.status.ok()) started.push_back(a.site);
      else refused += (refused.empty() ? "" : "; ") + a.status.message();
    }
    Status st = refused.empty() ? AcceptJob(id, cfg, config.site) : Status::Error(refused);
    if (!st.ok()) {
      Log("submit of job " + id + " refused: " + st.message());
      if (!started.empty())
        InBackground("stopping job " + id + " where it started", [this, started, id] {
          return CallPeersAtOnce(started, "peer_stop", id, {}, 3000);
        }, [](const PeerAnswers&) {});
      return {{"error", "job " + id + " not started: " + st.message()}};
    }
    JobLog(id, "submitted (" + source + "), placement: syncer " + cfg.placement.syncer + ", learners " + [&] {
      std::string s;
      for (const auto& l : cfg.placement.learners) s += (s.empty() ? "" : ",") + l;
      return s;
    }());
    UpdateSdStatus();
    return {{"ok", "1"}, {"job", id}, {"run_dir", store->RunDir(id)}};
  }

  // This site's view of a job: its record, config placement and its roles' progress.
  nlohmann::json LocalView(const std::string& id) {
    JobRecord rec;
    if (!store->Load(id, &rec).ok()) return nullptr;
    nlohmann::json j = JobRecordToJson(rec);
    j["site"] = config.site;
    j["run_dir"] = store->RunDir(id);
    auto it = jobs.find(id);
    if (it != jobs.end()) {
      for (auto& [name, role] : it->second.roles) j["roles"][name]["progress"] = role->Progress();
      for (const std::string& name : it->second.killed) j["roles"][name]["state"] = "down";
    }
    RunConfig cfg;
    if (LoadJobConfig(id, &cfg).ok()) {
      j["placement"] = {{"syncer", cfg.placement.syncer}, {"learners", cfg.placement.learners}};
      j["steps"] = cfg.train.steps;
    }
    return j;
  }

  ControlArgs JobStatus(const std::string& id) {
    nlohmann::json local = LocalView(id);
    if (local.is_null()) return UnknownJob(id);
    RunConfig cfg;
    (void)LoadJobConfig(id, &cfg);
    nlohmann::json sites = nlohmann::json::object();
    sites[config.site] = local;
    for (const std::string& site : SitesOf(cfg)) {
      if (site == config.site) continue;
      // Through the peer's worker (peer_views.h): a fresh view from a live peer, the last one (or
      // none) within 150 ms from a peer whose last call failed.
      const PeerViews::View v = peer_views->Get(site, id);
      if (v.ok && v.error.empty()) {
        sites[site] = v.json;
        sites[site]["age_ms"] = v.age_ms;
      } else {
        sites[site] = {{"site", site}, {"unreachable", v.error.empty() ? "no answer yet" : v.error}};
      }
    }
    nlohmann::json out = {{"id", id}, {"placement", local["placement"]}, {"steps", local["steps"]}, {"sites", sites}};
    // The syncer's site decides the job's state.
    const nlohmann::json& ss = sites[cfg.placement.syncer];
    out["state"] = ss.contains("state") ? ss["state"] : local["state"];
    if (ss.contains("error")) out["error"] = ss["error"];
    if (local.contains("error") && !out.contains("error")) out["error"] = local["error"];
    out["run_dir"] = ss.value("run_dir", "");
    out["syncer_site"] = cfg.placement.syncer;
    // Per role, wherever it runs.
    nlohmann::json learners = nlohmann::json::array();
    for (size_t i = 0; i < cfg.placement.learners.size(); i++) {
      const std::string& site = cfg.placement.learners[i];
      const std::string name = LearnerName((int)i);
      nlohmann::json l = {{"learner", (int)i}, {"site", site}};
      const nlohmann::json& sj = sites[site];
      if (sj.contains("roles") && sj["roles"].contains(name)) {
        const nlohmann::json& r = sj["roles"][name];
        l["state"] = r["state"];
        if (r.contains("progress")) l["progress"] = r["progress"];
        if (r.contains("result")) l["result"] = r["result"];
        if (r.contains("error")) l["error"] = r["error"];
      } else {
        l["state"] = sj.contains("unreachable") ? "unreachable" : "unknown";
      }
      learners.push_back(l);
    }
    out["learners"] = learners;
    for (const auto& l : learners) {
      if (l.value("state", "") == "failed" && out["state"] != "failed") {
        out["state"] = "failed";
        if (!out.contains("error")) out["error"] = "learner-" + std::to_string(l.value("learner", 0)) + " on " + l.value("site", "?") + ": " + l.value("error", "failed");
      }
    }
    if (ss.contains("roles") && ss["roles"].contains(kSyncerName)) {
      out["syncer"] = ss["roles"][kSyncerName];
      out["syncer"]["site"] = cfg.placement.syncer;
    }
    if (out["state"] == "completed") {
      nlohmann::json summary = Summary(out);
      if (!summary.is_null()) out["summary"] = summary;
    }
    return {{"ok", "1"}, {"json", JsonText(out)}};
  }

  // The `train --json` summary object, from the syncer's and learners' results.
  nlohmann::json Summary(const nlohmann::json& status) {
    if (!status.contains("syncer") || !status["syncer"].contains("result")) return nullptr;
    const nlohmann::json& sr = status["syncer"]["result"];
    nlohmann::json s;
    long steps = 0, tokens = 0;
    double train_s = 0, loss = 0;
    uint64_t up = 0, down = 0;
    std::vector<long> learner_tokens;
    double peak_rss = Number(sr, "peak_rss_mb", 0.0);
    for (const auto& l : status["learners"]) {
      if (!l.contains("result")) return nullptr;
      const nlohmann::json& r = l["result"];
      steps += Number(r, "steps", 0L);
      tokens += Number(r, "tokens", 0L);
      train_s = std::max(train_s, Number(r, "train_s", 0.0));
      loss += Number(r, "final_train_loss", 0.0) / status["learners"].size();
      up += Number(r, "bytes_up", uint64_t{0});
      down += Number(r, "bytes_down", uint64_t{0});
      learner_tokens.push_back(Number(r, "tokens", 0L));
      peak_rss = std::max(peak_rss, Number(r, "peak_rss_mb", 0.0));
    }
    s = {{"final_val_loss", Number(sr, "final_val_loss", 0.0)},
         {"final_val_batches", Number(sr, "final_val_batches", 0)},
         {"initial_val_loss", Number(sr, "initial_val_loss", 0.0)},
         {"final_train_loss", loss},
         {"steps", steps},
         {"tokens", tokens},
         {"train_s", train_s},
         {"tokens_per_s", train_s > 0 ? tokens / train_s : 0.0},
         {"bytes_up", up},
         {"bytes_down", down},
         {"learners", (int)status["learners"].size()},
         {"outer_steps", Number(sr, "merges", uint64_t{0})},
         {"dropped_deltas", Number(sr, "dropped_deltas", uint64_t{0})},
         {"rejected_deltas", Number(sr, "rejected_deltas", uint64_t{0})},
         {"versions", sr.value("versions", nlohmann::json::array())},
         {"learner_tokens", learner_tokens},
         {"run_dir", status.value("run_dir", "")},
         {"checkpoint", sr.value("checkpoint", "")},
         {"global_state", sr.value("global_state", "")},
         {"wall_s", Number(sr, "wall_s", 0.0)},
         {"peak_rss_mb", peak_rss},
         {"job", status.value("id", "")}};
    if (sr.contains("goodput")) s.update(sr["goodput"]);  // the syncer's view (control/live_goodput.h)
    return s;
  }

  ControlArgs UnknownJob(const std::string& id) {
    return {{"error", "unknown job id '" + id + "' on site " + config.site + "; `dilococtl list` shows the jobs"},
            {"usage", "1"}};
  }

  // The jobs from `offset` on, as many as fit one reply; "next" is where the following page
  // starts when some are left (the CLI asks until there is none).
  ControlArgs List(const ControlArgs& a) {
    auto it = a.find("offset");
    const size_t offset = it == a.end() ? 0 : (size_t)std::max(0L, std::atol(it->second.c_str()));
    const std::vector<std::string> ids = store->List();
    nlohmann::json arr = nlohmann::json::array();
    size_t bytes = 2, i = offset;
    for (; i < ids.size(); i++) {
      nlohmann::json j = LocalView(ids[i]);
      if (j.is_null()) continue;
      const size_t n = JsonText(j).size() + 1;
      if (bytes + n > kMaxTextBytes - 1024 && !arr.empty()) break;
      bytes += n;
      arr.push_back(std::move(j));
    }
    ControlArgs out = {{"ok", "1"}, {"json", JsonText(arr)}};
    if (i < ids.size()) out["next"] = std::to_string(i);
    return out;
  }

  Status StopLocal(const std::string& id) {
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
  std::vector<std::string> OtherSitesOf(const RunConfig& cfg) const {
    std::vector<std::string> out;
    for (const std::string& site : SitesOf(cfg))
      if (site != config.site) out.push_back(site);
    return out;
  }
  std::vector<std::string> OtherSites(const std::string& id) const {
    RunConfig cfg;
    (void)LoadJobConfig(id, &cfg);
    return OtherSitesOf(cfg);
  }

  MaybeReply Stop(const std::string& id, const ReplyTo& to) {
    if (!store->Exists(id)) return UnknownJob(id);
    if (Status st = StopLocal(id); !st.ok()) return ControlArgs{{"error", st.message()}};
    const std::vector<std::string> remote = OtherSites(id);
    if (remote.empty()) return ControlArgs{{"ok", "1"}};
    return Defer(
        to, [this, id, remote] { return CallPeersAtOnce(remote, "peer_stop", id, {}, 3000); },
        [](const PeerAnswers& answers) -> ControlArgs {
          std::string errors;
          for (const PeerAnswer& a : answers)
            if (!a.status.ok()) errors += a.status.message() + "; ";
          if (!errors.empty()) return {{"ok", "1"}, {"warning", "some sites did not answer: " + errors}};
          return {{"ok", "1"}};
        });
  }

  MaybeReply Logs(const std::string& id, int tail, const ReplyTo& to) {
    if (!store->Exists(id)) return UnknownJob(id);
    const std::vector<std::string> remote = OtherSites(id);
    // Every site's share of one reply (kMaxTextBytes).
    const size_t share = std::min<size_t>(16 << 10, (kMaxTextBytes - 4096) / (remote.size() + 1));
    const std::string text = Tail(store->LogPath(id), tail, share);
    if (remote.empty()) return ControlArgs{{"ok", "1"}, {"text", text}};
    const ControlArgs args = {{"tail", std::to_string(tail)}, {"bytes", std::to_string(share)}};
    return Defer(
        to, [this, id, remote, args] { return CallPeersAtOnce(remote, "peer_logs", id, args, 2000); },
        [text, share](const PeerAnswers& answers) -> ControlArgs {
          std::string all = text;
          for (const PeerAnswer& a : answers) {
            auto it = a.reply.find("text");
            std::string part = !a.status.ok() ? "(" + a.status.message() + ")\n" : it == a.reply.end() ? "" : it->second;
            if (part.size() > share) part = part.substr(part.size() - share);  // an older peer's longer answer
            all += part;
          }
          return {{"ok", "1"}, {"text", all}};
        });
  }


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

  // ---- Chaos (site_chaos.h) ----

  // The chaos command of a user (local CLI): carried out here or sent to its site.
  MaybeReply Chaos(const std::string& id, const ControlArgs& a, const ReplyTo& to) {
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
  void SendChaos(const std::string& id, const SiteChaosCommand& c) {
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

  // The roles of job id on this site that c names (kill and restart: learners and the syncer;
  // the rest: learners), among `among`.
  template <typename Names>
  std::vector<std::string> ChaosRoles(const SiteChaosCommand& c, const Names& among) const {
    std::vector<std::string> out;
    const bool roles_too = c.action == SiteChaosAction::kKill || c.action == SiteChaosAction::kRestart;
    for (const auto& entry : among) {
      const std::string& name = NameOf(entry);
      const bool is_syncer = name == kSyncerName;
      if (c.syncer ? is_syncer : c.learner >= 0 ? name == LearnerName(c.learner) : (!is_syncer || roles_too))
        out.push_back(name);
    }
    return out;
  }
  static const std::string& NameOf(const std::string& name) { return name; }
  template <typename T>
  static const std::string& NameOf(const std::pair<const std::string, T>& entry) { return entry.first; }

  Status ApplyChaos(const std::string& id, const SiteChaosCommand& c) {
    if (!config.chaos)
      return Status::Error("site " + config.site + " takes no chaos commands: its daemon config (" + config.source +
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
  void ChaosTick() {
    for (auto& [id, job] : jobs) {
      std::erase_if(job.dying, [](const std::unique_ptr<Role>& r) { return r->done(); });
      if (job.chaos_target) {
        std::vector<long> steps(job.config.placement.learners.size(), 0);
        auto sit = job.roles.find(kSyncerName);
        if (sit != job.roles.end()) {
          const nlohmann::json p = sit->second->Progress();
          for (const auto& l : p.value("learners", nlohmann::json::array())) {
            const int i = l.value("learner", -1);
            if (i >= 0 && i < (int)steps.size()) steps[i] = l.value("step", 0L);
          }
        }
        job.chaos_target->SetSteps(std::move(steps));
        for (const ChaosAction& a : job.chaos_target->Take()) {
          for (const SiteChaosCommand& c : SiteChaosOf(a, job.config.placement.learners, job.config.placement.syncer))
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
  void RestartKilled(const std::string& id, Job& job, const SiteChaosCommand& c) {
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
    (void)store->Save(rec);
    JobLog(id, "chaos: " + Describe(c) + (st.ok() ? "" : ": " + st.message()));
  }
  std::map<std::string, int> restart_tries;

  // chaos kill --process: the reply has gone (ZeroMQ sends it from its I/O thread: give it a
  // moment), then die as kill -9 would: no role saves anything.
  void KillProcessIfAsked() {
    if (!kill_process) return;
    Log("chaos: SIGKILL to this dilocod");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    ::kill(::getpid(), SIGKILL);
  }

  MaybeReply HandleLocal(const std::string& name, const std::string& job, const ControlArgs& a, const ReplyTo& to) {
    auto arg = [&](const char* k, const std::string& d = "") { auto it = a.find(k); return it == a.end() ? d : it->second; };
    if (name == "ping") return ControlArgs{{"ok", "1"}, {"site", config.site}};
    if (name == "submit") return Submit(a, to);
    if (name == "list") return List(a);
    if (name == "status") return job == kNoJob ? List(a) : JobStatus(job);
    if (name == "stop") return Stop(job, to);
    if (name == "logs") return Logs(job, TailLines(arg("tail", "50")), to);
    if (name == "chaos") return Chaos(job, a, to);
    if (name == "run_dir") {
      if (!store->Exists(job)) return UnknownJob(job);
      return ControlArgs{{"ok", "1"}, {"run_dir", store->RunDir(job)}, {"site", config.site}};
    }
    return ControlArgs{{"error", "unknown command '" + name + "'"}};
  }

  ControlArgs HandlePeer(const std::string& sender, const ParsedMessage& m) {
    const std::string& job = m.header.job_id;
    if (const JobSpecMsg* spec = m.get<JobSpecMsg>()) {
      if (!IsJobId(job)) return {{"error", "'" + job + "' is not a job id"}};
      const bool from_host0 = sender == config.site && config.host > 0;  // key checked in Run
      if (!from_host0 && std::find(config.submitters.begin(), config.submitters.end(), sender) == config.submitters.end()) {
        Log("refused job " + job + " from " + sender + ": not among submitters");
        return {{"error", "site " + config.site + " takes jobs only from its local CLI and the sites in its submitters; " +
                              sender + " is not one (add it to submitters in " + config.site + "'s config)"}};
      }
      if ((int64_t)spec->config_yaml.size() > config.max_job_spec_bytes)
        return {{"error", "job " + job + ": its run config is larger than site " + config.site + " takes (max_job_spec_bytes " +
                              std::to_string(config.max_job_spec_bytes) + ")"}};
      if (store->Exists(job)) return {{"ok", "1"}};  // a repeated forward
      RunConfig cfg;
      if (Status st = ParseRunConfig(spec->config_yaml, "job " + job + " from " + sender, "", {}, &cfg); !st.ok())
        return {{"error", st.message()}};
      if (Status st = AcceptJob(job, cfg, sender); !st.ok()) return {{"error", st.message()}};
      JobLog(job, "accepted from " + sender);
      UpdateSdStatus();
      return {{"ok", "1"}};
    }
    const ControlMsg* c = m.get<ControlMsg>();
    const ControlArgs a = ArgsOf(*c);
    if (c->name == "ring_set" || c->name == "ring_get") {
      if (sender != config.site) return {{"error", "'" + c->name + "' is for the hosts of site " + config.site + " only"}};
      return RingRequest(job, c->name, a);
    }
    if (!store->Exists(job)) return UnknownJob(job);
    if (c->name == "peer_status") return {{"ok", "1"}, {"json", JsonText(LocalView(job))}};
    if (c->name == "peer_stop") {
      if (Status st = StopLocal(job); !st.ok()) return {{"error", st.message()}};
      return {{"ok", "1"}};
    }
    if (c->name == "peer_rejoin") {
      if (Status st = RejoinLearners(job); !st.ok()) return {{"error", st.message()}};
      return {{"ok", "1"}};
    }
    if (c->name == "peer_chaos") {
      SiteChaosCommand command;
      Status st = ParseSiteChaos(a, &command);
      if (st.ok() && command.site != config.site) st = Status::Error("chaos for site " + command.site + " sent to " + config.site);
      if (st.ok()) st = ApplyChaos(job, command);
      if (!st.ok()) return {{"error", st.message()}};
      JobLog(job, "chaos from " + sender);
      return {{"ok", "1"}};
    }
    if (c->name == "peer_logs") {
      auto it = a.find("tail");
      auto bytes = a.find("bytes");
      const size_t max_bytes = bytes == a.end() ? 16 << 10 : (size_t)std::clamp(std::atol(bytes->second.c_str()), 0L, 16L << 10);
      return {{"ok", "1"}, {"text", Tail(store->LogPath(job), it == a.end() ? 50 : TailLines(it->second), max_bytes)}};
    }
    return {{"error", "unknown peer command '" + c->name + "'"}};
  }

  static ReplyTo ReplyToOf(net::RouterChannel& ch, const net::Received& r, const ParsedMessage& m) {
    const ControlMsg* c = m.get<ControlMsg>();
    return {&ch, r.peer, m.header.job_id, c ? c->name : "job_spec", c ? c->request_id : 0};
  }
  void Reply(const ReplyTo& to, const ControlArgs& args) {
    net::Message out;
    if (Status st = BuildControlReply(config.site, to.job_id, to.name, to.request_id, args, &out); !st.ok()) {
      // Too big for one reply (or not encodable): say so instead of leaving the caller to time out.
      Log("reply to '" + to.name + "' not sent: " + st.message());
      if (!BuildControlReply(config.site, to.job_id, to.name, to.request_id,
                             {{"error", "site " + config.site + " could not send its reply to '" + to.name + "': " + st.message()}},
                             &out)
               .ok())
        return;
    }
    (void)to.channel->SendTo(to.peer, out, 100);
  }

  // The job's syncer restarted from its checkpoint: learners that were running here may hold
  // deltas the old syncer never merged (and will not send those fragments again until their
  // Globals come), or a base newer than the checkpoint. Restart them as after a crash of this
  // daemon: they join from the new syncer's snapshot at their recorded step.
  // The old learners end on their threads (after their current step); RejoinTick starts the new
  // ones once they have.
  Status RejoinLearners(const std::string& id) {
    auto it = jobs.find(id);
    if (it == jobs.end()) return Status::Ok();
    Job& job = it->second;
    std::vector<std::string> names;
    for (auto& [name, role] : job.roles)
      if (name != kSyncerName && !role->done()) names.push_back(name);
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
  void RejoinTick() {
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
      (void)store->Save(rec);
    }
  }

  // After this daemon resumed a job's syncer: ask the learners' sites to rejoin.
  void AskLearnersToRejoin(const std::string& id, const RunConfig& cfg) {
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

  // Roles that ended: record how, and the job's state on this site.
  void Reap() {
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
        JobLog(id, std::string("job ") + ToString(rec.state) + " on this site");
      }
      if (changed) (void)store->Save(rec);
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

  // The syncer of a job ends once every learner has ended, wherever it ran. Learners tell it
  // (Heartbeat kFinished), but one that finished while this daemon was down never will: ask
  // the learners' sites, and once all say their learner ended, stop the syncer (it merges
  // what is pending and saves its state).
  Clock::time_point last_learner_check = Clock::now();
  void CheckLearnersEnded() {
    if (Clock::now() - last_learner_check < std::chrono::seconds(3)) return;
    last_learner_check = Clock::now();
    for (auto& [id, job] : jobs) {
      auto sit = job.roles.find(kSyncerName);
      if (sit == job.roles.end() || sit->second->done() || job.syncer_stop_sent) continue;
      bool all_ended = true;
      std::map<std::string, nlohmann::json> views;
      for (size_t i = 0; i < job.config.placement.learners.size() && all_ended; i++) {
        const std::string& site = job.config.placement.learners[i];
        const std::string name = LearnerName((int)i);
        nlohmann::json view;
        if (site == config.site) {
          JobRecord rec;
          if (job.roles.count(name) || !store->Load(id, &rec).ok()) {
            all_ended = false;
            break;
          }
          view = JobRecordToJson(rec);
        } else if (views.count(site)) {
          view = views[site];
        } else {
          const PeerViews::View v = peer_views->Get(site, id, /*wait=*/false);
          if (!v.ok || !v.error.empty()) {
            all_ended = false;
            break;
          }
          view = views[site] = v.json;
        }
        const std::string state = view.is_object() && view.contains("roles") && view["roles"].contains(name)
                                      ? view["roles"][name].value("state", "")
                                      : "";
        JobState js;
        all_ended = ParseJobState(state, &js) && IsFinal(js);
      }
      if (all_ended) {
        JobLog(id, "every learner has ended; the syncer merges what is pending and stops");
        sit->second->RequestStop();
        job.syncer_stop_sent = true;
      }
    }
  }

  void UpdateSdStatus() {
    int running = 0, done = 0, failed = 0;
    for (const std::string& id : store->List()) {
      JobRecord rec;
      if (!store->Load(id, &rec).ok()) continue;
      running += rec.state == JobState::kRunning;
      done += rec.state == JobState::kCompleted;
      failed += rec.state == JobState::kFailed;
    }
    const std::string status = std::to_string(running) + " running, " + std::to_string(done) + " completed, " +
                               std::to_string(failed) + " failed";
    if (status != last_status) {
      last_status = status;
      (void)SdNotify("STATUS=" + status);
    }
  }

  void ResumeJobs() {
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
        if (unfinished.empty()) continue;
        st = StartRoles(id, cfg, true, &rec, &unfinished);
        if (st.ok() && unfinished.count(kSyncerName)) AskLearnersToRejoin(id, cfg);
      }
      if (!st.ok()) {
        rec.state = JobState::kFailed;
        rec.error = "resuming after a restart: " + st.message();
        JobLog(id, rec.error);
      }
      (void)store->Save(rec);
    }
  }
};

Status Daemon::Create(const DaemonConfig& config, std::unique_ptr<Daemon>* out) {
  std::unique_ptr<Daemon> d(new Daemon());
  d->impl_ = std::make_unique<Impl>();
  Impl& im = *d->impl_;
  im.config = config;
  std::error_code ec;
  fs::create_directories(config.state_dir, ec);
  if (ec) return Status::Error("cannot create state_dir '" + config.state_dir + "': " + ec.message());
  DL_RETURN_IF_ERROR(LockFile::Acquire((fs::path(config.state_dir) / "dilocod.lock").string(), &im.lock));
  if (!config.keys_dir.empty()) {
    net::CurveKeyPair keys;
    DL_RETURN_IF_ERROR(net::LoadCurveKeyPair(config.keys_dir, &keys).WithContext(config.source + ": keys"));
    im.keys = keys;
  }
  for (const PeerConfig& p : config.peers) {
    if (!p.public_key.empty())
      DL_RETURN_IF_ERROR(net::ValidateZ85Key(p.public_key, ("public key of peer " + p.site).c_str()).WithContext(config.source));
  }
  for (size_t h = 0; h < config.site_hosts.size(); h++) {
    const std::string& key = config.site_hosts[h].public_key;
    if (key.empty()) continue;
    DL_RETURN_IF_ERROR(net::ValidateZ85Key(key, ("public key of site host " + std::to_string(h)).c_str()).WithContext(config.source));
    if ((int)h == config.host && im.keys && key != im.keys->public_z85)
      return Status::Error(config.source + ": site_hosts." + std::to_string(h) + ".public_key is not this daemon's key (" +
                           config.keys_dir + "/key.public), yet host: " + std::to_string(config.host) +
                           " says this is that host; fix host or the key");
  }
  net::NetContextOptions context_options;
  context_options.io_threads = config.net_io_threads > 0 ? config.net_io_threads : net::DefaultIoThreads();
  DL_RETURN_IF_ERROR(net::NetContext::Create(context_options, &im.context).WithContext(config.source + ": net.io_threads"));
  if (im.keys) {
    std::vector<std::string> allow = {im.keys->public_z85};  // this site's own learners
    for (const PeerConfig& p : config.peers)
      if (!p.public_key.empty()) allow.push_back(p.public_key);
    for (const SiteHost& h : config.site_hosts)
      if (!h.public_key.empty() && h.public_key != im.keys->public_z85) allow.push_back(h.public_key);
    DL_RETURN_IF_ERROR(im.context->SetAllowlist("dilocod", allow));
  }
  im.store = std::make_unique<JobStore>(config.state_dir);
  im.off_loop = std::make_unique<OffLoop>(Impl::kOffLoopWorkers, Impl::kMaxOffLoop);
  Impl* impl = &im;
  im.peer_views = std::make_unique<PeerViews>(
      [impl](const std::string& site, const std::string& job, nlohmann::json* view) {
        ControlArgs reply;
        DL_RETURN_IF_ERROR(impl->CallPeer(site, "peer_status", job, {}, &reply, 1500));
        *view = nlohmann::json::parse(reply["json"], nullptr, false);
        if (!IsJobView(*view)) return Status::Error("site " + site + "'s status reply was not a job view");
        return Status::Ok();
      },
      PeerViews::Options{});

  // The local control socket (a stale file from a crash is ours to remove: we hold the lock).
  fs::remove(config.control_socket, ec);
  fs::create_directories(fs::path(config.control_socket).parent_path(), ec);
  net::ReceiveOptions ro;
  ro.track_sequence = false;
  ro.validator = net::EnvelopeValidator(ControlParseOptions(), im.local_parsed);
  net::SocketOptions lo;
  lo.name = "control.local";
  lo.allow_plaintext = true;
  lo.max_frame_bytes = int64_t{2} << 20;
  DL_RETURN_IF_ERROR(net::RouterChannel::Create(*im.context, lo, ro, &im.local));
  DL_RETURN_IF_ERROR(im.local->Bind("ipc://" + config.control_socket).WithContext("control_socket"));
  // Owner and group only, whatever the umask (the group is how operators grant the CLI).
  fs::permissions(config.control_socket, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::group_write,
                  fs::perm_options::replace, ec);
  if (ec) return Status::Error("cannot set the mode of control_socket '" + config.control_socket + "': " + ec.message());
  if (!config.listen.control.empty()) {
    net::ReceiveOptions pr;
    pr.track_sequence = false;
    pr.validator = net::EnvelopeValidator(ControlParseOptions(), im.peer_parsed);
    net::SocketOptions po;
    po.name = "control.peers";
    po.allow_plaintext = config.allow_plaintext;
    po.max_frame_bytes = int64_t{2} << 20;
    if (im.keys) po.curve = net::CurveOptions{im.keys->public_z85, im.keys->secret_z85, true, "dilocod", ""};
    DL_RETURN_IF_ERROR(net::RouterChannel::Create(*im.context, po, pr, &im.peers));
    DL_RETURN_IF_ERROR(im.peers->Bind(config.listen.control).WithContext("listen.control"));
  }
  if (config.metrics_port > 0) {
    DL_RETURN_IF_ERROR(DeclareSiteMetrics(&im.metrics));
    MetricsServerOptions mo;
    mo.port = config.metrics_port;
    DL_RETURN_IF_ERROR(MetricsServer::Start(mo, &im.metrics, &im.metrics_server).WithContext(config.source + ": metrics_port"));
    im.Log("metrics on " + im.metrics_server->url());
  }
  im.Log("listening on ipc://" + config.control_socket +
         (config.listen.control.empty() ? "" : " and " + config.listen.control) + (im.keys ? " (CURVE)" : " (plaintext)") +
         ", " + std::to_string(context_options.io_threads) + " ZeroMQ I/O threads");
  im.ResumeJobs();
  *out = std::move(d);
  return Status::Ok();
}

Daemon::~Daemon() = default;

void Daemon::Shutdown() { g_shutdown = true; }

void Daemon::InstallSignalHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

Status Daemon::Run() {
  Impl& im = *impl_;
  (void)SdNotify("READY=1");
  im.UpdateSdStatus();
  std::vector<net::Socket*> sockets = {&im.local->socket()};
  if (im.peers) sockets.push_back(&im.peers->socket());
  std::vector<bool> ready;
  net::Received r;
  while (!g_shutdown) {
    im.Guarded("reaping ended roles", [&] { im.Reap(); });
    im.Guarded("chaos", [&] { im.ChaosTick(); });
    im.Guarded("rejoining learners", [&] { im.RejoinTick(); });
    im.off_loop->Drain();  // answers and follow-ups of work done off the loop (each guarded)
    im.Guarded("goodput", [&] {
      for (auto& [id, job] : im.jobs)
        for (auto& [name, role] : job.roles) role->Observe();
    });
    im.Guarded("checking the learners", [&] { im.CheckLearnersEnded(); });
    im.Guarded("metrics", [&] { im.UpdateMetrics(); });
    // Short polls while work off the loop may finish: its answers go out promptly.
    if (!net::PollReadable(sockets, im.off_loop->in_flight() > 0 ? 5 : 100, &ready)) continue;
    if (ready[0] && im.local->Receive(&r, 0) == net::RecvResult::kMessage) {
      const ParsedMessage& m = *im.local_parsed;
      if (const ControlMsg* c = m.get<ControlMsg>()) {
        const ControlArgs args = ArgsOf(*c);
        const std::string job = m.header.job_id;
        const Daemon::Impl::ReplyTo to = Daemon::Impl::ReplyToOf(*im.local, r, m);
        std::optional<ControlArgs> reply = im.GuardedReply(c->name, [&] { return im.HandleLocal(c->name, job, args, to); });
        if (reply) im.Reply(to, *reply);
      }
    }
    im.KillProcessIfAsked();
    if (ready.size() > 1 && ready[1] && im.peers->Receive(&r, 0) == net::RecvResult::kMessage) {
      const ParsedMessage& m = *im.peer_parsed;
      std::string sender = m.header.sender;
      // With CURVE the key says who it is; the envelope's sender must agree.
      if (im.keys) {
        const PeerConfig* p = im.config.FindPeer(sender);
        const bool site_host = sender == im.config.site && im.config.SiteHostOfKey(r.peer_key) >= 0;
        if (!site_host && (!p || p->public_key != r.peer_key)) {
          im.Log("refused a control request claiming to be '" + sender + "' from key " + r.peer_key);
          im.Reply(Daemon::Impl::ReplyToOf(*im.peers, r, m), {{"error", "sender '" + sender + "' does not match its key"}});
          continue;
        }
      }
      const Daemon::Impl::ReplyTo to = Daemon::Impl::ReplyToOf(*im.peers, r, m);
      im.Reply(to, im.GuardedReply(to.name, [&] { return im.HandlePeer(sender, m); }));
      im.KillProcessIfAsked();
    }
  }
  // Shutting down: the jobs stay "running" on disk, so a restart resumes them.
  (void)SdNotify("STOPPING=1");
  im.Log("stopping: roles save their state");
  for (auto& [id, job] : im.jobs)
    for (auto& [name, role] : job.roles) role->RequestShutdown();
  // Give the roles a moment to end by themselves (learners stop after their current step; a
  // syncer whose uplink is quiet leaves); then blocking socket calls return at once.
  auto all_done = [&] {
    for (auto& [id, job] : im.jobs)
      for (auto& [name, role] : job.roles)
        if (!role->done()) return false;
    return true;
  };
  const auto grace = Clock::now() + std::chrono::milliseconds(1500);
  while (!all_done() && Clock::now() < grace) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  im.context->zmq().shutdown();
  const auto deadline = Clock::now() + std::chrono::seconds(7);
  for (auto& [id, job] : im.jobs) {
    for (auto& [name, role] : job.roles) {
      while (!role->done() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (!role->done()) {
        im.Log("job " + id + ": " + name + " did not stop within 8 s; exiting anyway");
        std::fflush(stderr);
        _exit(0);
      }
      role->Join();
    }
  }
  im.jobs.clear();
  im.metrics_server.reset();
  im.local.reset();
  im.peers.reset();
  im.Log("stopped");
  return Status::Ok();
}

}  // namespace diloco
