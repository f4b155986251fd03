#include "daemon/control/site_metrics.h"

#include <vector>

#include "daemon/sync/shards.h"

namespace diloco {

Status DeclareSiteMetrics(MetricsRegistry* registry) {
  const std::vector<std::string> jl = {"job", "learner"};
  // The syncer's families, per shard (sync.syncers; "0" with one syncer): each shard's site
  // exports its own. Counters summed over shard are the job's; goodput, uptime and waste are each
  // shard's over its own fragments (the job's weighs them by each shard's share of the model, as
  // its status does).
  const std::vector<std::string> js = {"job", "shard"}, jsl = {"job", "shard", "learner"};
  struct Family {
    const char* name;
    MetricKind kind;
    const char* help;
    std::vector<std::string> labels;
  };
  const MetricKind counter = MetricKind::kCounter, gauge = MetricKind::kGauge;
  const Family families[] = {
      {"dilocod_jobs", gauge, "Jobs on this site by state.", {"state"}},
      {"dilocod_learner_steps", gauge, "Inner steps a learner on this site has reached.", jl},
      {"dilocod_learner_tokens_total", counter, "Tokens trained on by a learner (this incarnation).", jl},
      {"dilocod_learner_loss", gauge, "A learner's last training loss.", jl},
      {"dilocod_learner_tokens_per_second", gauge, "A learner's training throughput.", jl},
      {"dilocod_learner_deltas_sent_total", counter, "Deltas a learner has sent.", jl},
      {"dilocod_learner_globals_applied_total", counter, "Globals a learner has folded.", jl},
      {"dilocod_syncer_merges_total", counter, "Merges (outer steps) by the syncer.", js},
      {"dilocod_syncer_version", gauge, "Version of each fragment of the global model.", {"job", "shard", "fragment"}},
      {"dilocod_syncer_dropped_deltas_total", counter, "Deltas dropped as too stale.", js},
      {"dilocod_syncer_rejected_deltas_total", counter, "Deltas rejected by the norm filter.", js},
      {"dilocod_syncer_received_bytes_total", counter, "Uplink wire bytes received.", js},
      {"dilocod_syncer_published_bytes_total", counter, "Downlink wire bytes published.", js},
      {"dilocod_syncer_live_learners", gauge, "Learners the syncer hears from.", js},
      {"dilocod_syncer_impostor_messages_total", counter,
       "Messages naming a learner that came with another site's key (dropped).", js},
      {"dilocod_syncer_rounds_total", counter,
       "Merge rounds by what closed them (quorum, grace window expired, ...): where the syncer waited.",
       {"job", "shard", "reason"}},
      {"dilocod_syncer_merged_staleness_versions_total", counter,
       "Sum over merged deltas of their staleness (versions between base and merge); divide by "
       "dilocod_syncer_merged_contributions_total for the mean.",
       js},
      {"dilocod_syncer_merged_contributions_total", counter, "Deltas merged, all learners together.", js},
      {"dilocod_syncer_max_staleness_versions", gauge, "The largest staleness of a merged delta so far.", js},
      {"dilocod_syncer_learner_up", gauge, "1 when the syncer heard from the learner within its liveness window.", jsl},
      {"dilocod_syncer_learner_merged_deltas_total", counter, "A learner's deltas merged: its participation.", jsl},
      {"dilocod_syncer_learner_merged_tokens_total", counter, "Tokens behind a learner's merged deltas.", jsl},
      {"dilocod_syncer_learner_dropped_deltas_total", counter, "A learner's deltas dropped as too stale.", jsl},
      {"dilocod_syncer_learner_rejected_deltas_total", counter, "A learner's deltas rejected by the norm filter.", jsl},
      {"dilocod_job_goodput_ratio", gauge,
       "Share of the provisioned learners' tokens that reached the global model (the syncer's view).", js},
      {"dilocod_job_uptime_ratio", gauge,
       "Share of the wall time in which the global model advanced within 2x its expected merge interval.", js},
      {"dilocod_job_waste_ratio", gauge,
       "Share of the provisioned tokens wasted, by cause (down, dropped, idle as the syncer sees them).",
       {"job", "shard", "cause"}},
  };
  for (const Family& f : families) DL_RETURN_IF_ERROR(registry->Declare(f.name, f.kind, f.help, f.labels));
  return Status::Ok();
}

namespace {

double Num(const nlohmann::json& j, const char* key) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

void MirrorSyncer(MetricsRegistry* r, const std::string& id, const nlohmann::json& p) {
  const std::string shard = std::to_string(p.value("shard", 0));
  r->Set("dilocod_syncer_merges_total", {id, shard}, Num(p, "merges"));
  r->Set("dilocod_syncer_dropped_deltas_total", {id, shard}, Num(p, "dropped_deltas"));
  r->Set("dilocod_syncer_rejected_deltas_total", {id, shard}, Num(p, "rejected_deltas"));
  r->Set("dilocod_syncer_received_bytes_total", {id, shard}, Num(p, "bytes_received"));
  r->Set("dilocod_syncer_published_bytes_total", {id, shard}, Num(p, "bytes_published"));
  r->Set("dilocod_syncer_impostor_messages_total", {id, shard}, Num(p, "impostor_messages"));
  // The fragments the shard merges (every one with one syncer): the others' versions are not its.
  const nlohmann::json versions = p.value("versions", nlohmann::json::array());
  const nlohmann::json owned = p.value("fragments", nlohmann::json());
  auto owns = [&](size_t f) {
    if (!owned.is_array()) return true;
    for (const auto& o : owned)
      if (o.is_number() && o.get<size_t>() == f) return true;
    return false;
  };
  for (size_t f = 0; f < versions.size(); f++)
    if (versions[f].is_number() && owns(f)) r->Set("dilocod_syncer_version", {id, shard, std::to_string(f)}, versions[f].get<double>());
  int live = 0;
  for (const auto& l : p.value("learners", nlohmann::json::array())) {
    if (!l.is_object()) continue;
    const std::vector<std::string> labels = {id, shard, std::to_string(l.value("learner", 0))};
    const bool up = l.value("live", false);
    live += up;
    r->Set("dilocod_syncer_learner_up", labels, up ? 1 : 0);
    r->Set("dilocod_syncer_learner_merged_deltas_total", labels, Num(l, "merged"));
    r->Set("dilocod_syncer_learner_merged_tokens_total", labels, Num(l, "merged_tokens"));
    r->Set("dilocod_syncer_learner_dropped_deltas_total", labels, Num(l, "dropped"));
    r->Set("dilocod_syncer_learner_rejected_deltas_total", labels, Num(l, "rejected"));
  }
  r->Set("dilocod_syncer_live_learners", {id, shard}, live);
  const nlohmann::json reasons = p.value("merge_reasons", nlohmann::json::object());  // items() needs it alive
  for (const auto& [reason, n] : reasons.items())
    if (n.is_number()) r->Set("dilocod_syncer_rounds_total", {id, shard, reason}, n.get<double>());
  if (p.contains("staleness") && p["staleness"].is_object()) {
    const nlohmann::json& s = p["staleness"];
    r->Set("dilocod_syncer_merged_staleness_versions_total", {id, shard}, Num(s, "sum"));
    r->Set("dilocod_syncer_merged_contributions_total", {id, shard}, Num(s, "count"));
    r->Set("dilocod_syncer_max_staleness_versions", {id, shard}, Num(s, "max"));
  }
  if (p.contains("goodput") && p["goodput"].is_object()) {
    const nlohmann::json& g = p["goodput"];
    r->Set("dilocod_job_goodput_ratio", {id, shard}, Num(g, "goodput"));
    r->Set("dilocod_job_uptime_ratio", {id, shard}, Num(g, "uptime"));
    const nlohmann::json waste = g.value("waste", nlohmann::json::object());
    for (const char* cause : {"down", "dropped", "idle"}) r->Set("dilocod_job_waste_ratio", {id, shard, cause}, Num(waste, cause));
  }
}

}  // namespace

void MirrorRoleProgress(MetricsRegistry* r, const std::string& job, const std::string& role, const nlohmann::json& p) {
  if (!p.is_object() || p.contains("phase")) return;  // still starting: nothing to show yet
  if (IsSyncerRoleName(role)) return MirrorSyncer(r, job, p);
  const std::vector<std::string> labels = {job, std::to_string(p.value("learner", 0))};
  r->Set("dilocod_learner_steps", labels, Num(p, "step"));
  r->Set("dilocod_learner_tokens_total", labels, Num(p, "tokens"));
  r->Set("dilocod_learner_loss", labels, Num(p, "loss"));
  r->Set("dilocod_learner_tokens_per_second", labels, Num(p, "tokens_per_s"));
  r->Set("dilocod_learner_deltas_sent_total", labels, Num(p, "deltas_sent"));
  r->Set("dilocod_learner_globals_applied_total", labels, Num(p, "globals_applied"));
}

}  // namespace diloco
