// What status, list, /metrics and sd_notify say about the jobs (daemon_impl.h).
#include "daemon/control/daemon_impl.h"

#include <algorithm>

#include "daemon/control/job_metrics.h"
#include "daemon/control/site_metrics.h"
#include "daemon/util/sd_notify.h"

namespace diloco {
namespace {

// The summary from a job's combined status (every site's roles): null until every result is in.
nlohmann::json StatusSummary(const RunConfig& cfg, const nlohmann::json& status) {
  if (!status.contains("syncer") || !status["syncer"].contains("result")) return nullptr;
  std::vector<nlohmann::json> learners;
  for (const auto& l : status["learners"]) {
    if (!l.contains("result")) return nullptr;
    learners.push_back(l["result"]);
  }
  return JobSummaryObject(cfg, status["syncer"]["result"], learners, status.value("run_dir", ""),
                          status.value("id", ""));
}

// out["syncer"]: the syncer's role (state, progress, result) from its site; with shards the shards
// joined (JoinShardResults: versions from each fragment's owner, counters summed) and each shard's
// own in out["shards"]. A shard whose site did not answer leaves the join out.
void SetSyncerView(const RunConfig& cfg, const nlohmann::json& sites, nlohmann::json* out) {
  const int S = cfg.sync.syncers;
  std::vector<nlohmann::json> roles;
  bool home_found = false;
  for (int s = 0; s < S; s++) {
    const std::string site = cfg.placement.SyncerSite(s);
    const std::string name = SyncerShardName(s, S);
    nlohmann::json r = {{"shard", s}, {"site", site}};
    const nlohmann::json& sj = sites.contains(site) ? sites[site] : nlohmann::json::object();
    if (sj.contains("roles") && sj["roles"].contains(name)) {
      r.update(sj["roles"][name]);
      home_found = home_found || s == 0;
    } else {
      r["state"] = sj.contains("unreachable") ? "unreachable" : "unknown";
    }
    roles.push_back(r);
  }
  if (S == 1) {
    roles[0].erase("shard");
    if (home_found) (*out)["syncer"] = roles[0];
    return;
  }
  (*out)["shards"] = roles;
  nlohmann::json joined = roles[0];
  const ShardLayout shards = ShardLayoutOf(cfg);
  for (const char* part : {"progress", "result"}) {
    std::vector<nlohmann::json> each;
    for (const nlohmann::json& r : roles) each.push_back(r.value(part, nlohmann::json()));
    if (std::all_of(each.begin(), each.end(), [](const nlohmann::json& j) { return j.is_object(); }))
      joined[part] = JoinShardResults(each, shards);
    else
      joined.erase(part);
  }
  joined.erase("shard");
  (*out)["syncer"] = joined;
}

}  // namespace

// The sites a job's placement names, the home shard's first, each once.
std::vector<std::string> SitesOf(const RunConfig& cfg) {
  std::vector<std::string> sites;
  for (int s = 0; s < cfg.sync.syncers; s++) sites.push_back(cfg.placement.SyncerSite(s));
  sites.insert(sites.end(), cfg.placement.learners.begin(), cfg.placement.learners.end());
  std::vector<std::string> once;
  for (const std::string& s : sites)
    if (!s.empty() && std::find(once.begin(), once.end(), s) == once.end()) once.push_back(s);
  return once;
}

// placement.syncer as written: one site, or one per shard.
nlohmann::json SyncerPlacementJson(const PlacementConfig& p) {
  if (p.syncer.size() == 1) return p.syncer.front();
  return p.syncer;
}

// This site's view of a job: its record, config placement and its roles' progress.
nlohmann::json DaemonImpl::LocalView(const std::string& id) {
  JobRecord rec;
  if (!store->Load(id, &rec).ok()) return nullptr;
  nlohmann::json j = JobRecordToJson(rec);
  j["site"] = config.site;
  j["run_dir"] = store->RunDir(id);
  if (auto se = store_errors.find(id); se != store_errors.end()) j["store_error"] = se->second;
  auto it = jobs.find(id);
  if (it != jobs.end()) {
    for (auto& [name, role] : it->second.roles) j["roles"][name]["progress"] = role->Progress();
    for (const std::string& name : it->second.killed) j["roles"][name]["state"] = "down";
  }
  RunConfig cfg;
  if (LoadJobConfig(id, &cfg).ok()) {
    j["placement"] = {{"syncer", SyncerPlacementJson(cfg.placement)}, {"learners", cfg.placement.learners}};
    j["steps"] = cfg.train.steps;
  }
  return j;
}

ControlArgs DaemonImpl::JobStatus(const std::string& id) {
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
  // The home shard's site decides the job's state.
  const std::string home = cfg.placement.SyncerSite(0);
  const nlohmann::json& ss = sites[home];
  out["state"] = ss.contains("state") ? ss["state"] : local["state"];
  if (ss.contains("error")) out["error"] = ss["error"];
  if (local.contains("error") && !out.contains("error")) out["error"] = local["error"];
  // A site whose last save of the job's record failed (its disk is full, say): what it has on disk is behind.
  for (const auto& [site, view] : sites.items())
    if (view.contains("store_error")) out["store_error"][site] = view["store_error"];
  out["run_dir"] = ss.value("run_dir", "");
  out["syncer_site"] = home;
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
  SetSyncerView(cfg, sites, &out);
  if (out["state"] == "completed") {
    nlohmann::json summary = StatusSummary(cfg, out);
    if (!summary.is_null()) out["summary"] = summary;
  }
  return {{"ok", "1"}, {"json", JsonText(out)}};
}

ControlArgs DaemonImpl::UnknownJob(const std::string& id) {
  return {{"error", "unknown job id '" + id + "' on site " + config.site + "; `dilococtl list` shows the jobs"},
          {"usage", "1"}};
}

// The jobs from `offset` on, as many as fit one reply; "next" is where the following page
// starts when some are left (the CLI asks until there is none).
ControlArgs DaemonImpl::List(const ControlArgs& a) {
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

void DaemonImpl::UpdateSdStatus() {
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

void DaemonImpl::UpdateMetrics() {
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

}  // namespace diloco
