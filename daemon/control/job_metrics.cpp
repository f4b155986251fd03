#include "daemon/control/job_metrics.h"

#include <algorithm>

#include "daemon/train/run_summary.h"
#include "daemon/train/trainer.h"

namespace diloco {
namespace {

// j[key] when it is a number, else fallback (NaN is stored as JSON null).
template <typename T>
T Number(const nlohmann::json& j, const char* key, T fallback) {
  const auto it = j.is_object() ? j.find(key) : j.end();
  return j.is_object() && it != j.end() && it->is_number() ? it->get<T>() : fallback;
}

}  // namespace

nlohmann::json LearnerDoneLine(int learner, const nlohmann::json& result) {
  nlohmann::json j = result.is_object() ? result : nlohmann::json::object();
  j["event"] = "learner_done";
  j["learner"] = learner;
  return j;
}

nlohmann::json JobSummaryObject(const RunConfig& cfg, const nlohmann::json& sr,
                                const std::vector<nlohmann::json>& learner_results, const std::string& run_dir,
                                const std::string& job_id) {
  if (!sr.is_object()) return nullptr;
  TrainSummary s;
  s.learners = (int)learner_results.size();
  s.peak_rss_mb = Number(sr, "peak_rss_mb", 0.0);
  for (const nlohmann::json& r : learner_results) {
    if (!r.is_object()) return nullptr;
    AddLearnerTotals(cfg,
                     {Number(r, "tokens", 0L), Number(r, "train_s", 0.0), Number(r, "final_train_loss", 0.0),
                      Number(r, "bytes_up", uint64_t{0}), Number(r, "bytes_down", uint64_t{0})},
                     &s);
    s.peak_rss_mb = std::max(s.peak_rss_mb, Number(r, "peak_rss_mb", 0.0));
  }
  s.tokens_per_s = s.train_s > 0 ? s.tokens / s.train_s : 0.0;
  s.final_val_loss = Number(sr, "final_val_loss", 0.0);
  s.final_val_batches = Number(sr, "final_val_batches", 0);
  s.initial_val_loss = Number(sr, "initial_val_loss", 0.0);
  s.outer_steps = Number(sr, "merges", uint64_t{0});
  s.dropped_deltas = Number(sr, "dropped_deltas", uint64_t{0});
  s.rejected_deltas = Number(sr, "rejected_deltas", uint64_t{0});
  if (sr.contains("versions") && sr["versions"].is_array())
    for (const auto& v : sr["versions"]) s.versions.push_back(v.is_number_unsigned() ? v.get<uint64_t>() : 0);
  s.run_dir = run_dir;
  s.checkpoint = sr.value("checkpoint", "");
  s.global_state = sr.value("global_state", "");
  s.wall_s = Number(sr, "wall_s", 0.0);
  if (sr.contains("shard_merges") && sr["shard_merges"].is_array())
    for (const auto& m : sr["shard_merges"]) s.shard_merges.push_back(m.is_number_unsigned() ? m.get<uint64_t>() : 0);
  nlohmann::json j = TrainSummaryObject(s);
  j["job"] = job_id;
  if (sr.contains("goodput")) j.update(sr["goodput"]);  // the syncer's view (control/live_goodput.h)
  return j;
}

namespace {

// Σ_s shares[s] × g_s for every number of the goodput objects (goodput.h's report: its ratios and
// token counts, each shard's over its own fragments), nested objects (waste) alike.
nlohmann::json WeightedGoodput(const std::vector<nlohmann::json>& each, const std::vector<double>& shares) {
  nlohmann::json out = each.front();
  for (auto& [key, value] : out.items()) {
    if (value.is_object()) {
      std::vector<nlohmann::json> inner;
      for (const nlohmann::json& g : each) inner.push_back(g.value(key, nlohmann::json::object()));
      value = WeightedGoodput(inner, shares);
    } else if (value.is_number()) {
      double sum = 0;
      for (size_t s = 0; s < each.size(); s++) sum += shares[s] * Number(each[s], key.c_str(), 0.0);
      value = sum;
    }
  }
  return out;
}

}  // namespace

nlohmann::json JoinShardResults(const std::vector<nlohmann::json>& shard_results, const ShardLayout& layout) {
  const ShardMap& shards = layout.map;
  if (shard_results.size() == 1) return shard_results.front();
  nlohmann::json joined = shard_results.front().is_object() ? shard_results.front() : nlohmann::json::object();
  for (const char* key : {"merges", "dropped_deltas", "rejected_deltas", "bytes_received", "bytes_published",
                          "snapshots_served"}) {
    uint64_t sum = 0;
    for (const nlohmann::json& r : shard_results) sum += Number(r, key, uint64_t{0});
    joined[key] = sum;
  }
  nlohmann::json versions = nlohmann::json::array();
  for (size_t p = 0; p < (size_t)std::max(0, (int)joined.value("versions", nlohmann::json::array()).size()); p++) {
    const nlohmann::json& owner = shard_results[shards.OwnerOf(p)];
    const bool known = owner.is_object() && owner.contains("versions") && owner["versions"].size() > p;
    versions.push_back(known ? owner["versions"][p] : nlohmann::json(0));
  }
  joined["versions"] = versions;
  std::vector<nlohmann::json> goodputs;
  for (const nlohmann::json& r : shard_results)
    if (r.is_object() && r.contains("goodput") && r["goodput"].is_object()) goodputs.push_back(r["goodput"]);
  if (goodputs.size() == shard_results.size() && layout.shares.size() == goodputs.size())
    joined["goodput"] = WeightedGoodput(goodputs, layout.shares);
  else
    joined.erase("goodput");  // a shard's is missing: no figure rather than a partial one
  joined["shard_merges"] = nlohmann::json::array();
  for (const nlohmann::json& r : shard_results) joined["shard_merges"].push_back(Number(r, "merges", uint64_t{0}));
  return joined;
}

}  // namespace diloco
