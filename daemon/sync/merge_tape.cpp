#include "daemon/sync/merge_tape.h"

#include <algorithm>

namespace diloco {

void MergeTape::Add(const MergeEvent& e) {
  std::vector<MergedDelta> merged;
  std::vector<LostDelta> lost;
  GoodputRecordsOf(e, e.time_ms, &merged, &lost);  // times 0: the record keeps e.time_ms
  std::lock_guard<std::mutex> lock(mu_);
  for (const MergedDelta& m : merged) records_.push_back({e.time_ms, m.fragment, m.learner, m.tokens, false});
  for (const LostDelta& l : lost) records_.push_back({e.time_ms, l.fragment, l.learner, l.tokens, true});
  merges_++;
  reasons_[e.reason]++;
  for (const MergeContributor& c : e.contributors) {
    staleness_sum_ += (double)c.staleness;
    staleness_max_ = std::max(staleness_max_, (double)c.staleness);
    contributions_++;
  }
  last_ = {{"fragment", e.fragment},
           {"version", e.version},
           {"reason", e.reason},
           {"time_ms", e.time_ms},
           {"grace_ms", e.grace_ms},
           {"contributors", e.contributors.size()}};
}

Status MergeTape::Load(const std::string& events_path) {
  std::vector<MergeEvent> events;
  DL_RETURN_IF_ERROR(ReadEventLog(events_path, /*missing_ok=*/true, &events));
  for (const MergeEvent& e : events) Add(e);
  return Status::Ok();
}

std::function<void(const MergeEvent&)> MergeTape::Listener() {
  return [this](const MergeEvent& e) { Add(e); };
}

size_t MergeTape::merges() const {
  std::lock_guard<std::mutex> lock(mu_);
  return merges_;
}

void MergeTape::GoodputRecords(int64_t run_start_unix_ms, std::vector<MergedDelta>* merged,
                               std::vector<LostDelta>* lost) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Record& r : records_) {
    const double time_s = (double)(r.time_ms - run_start_unix_ms) / 1000;
    if (r.dropped) lost->push_back({time_s, r.fragment, r.learner, r.tokens, LossCause::kDropped});
    else merged->push_back({time_s, r.fragment, r.learner, r.tokens});
  }
}

void MergeTape::AddStatsTo(nlohmann::json* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (merges_ == 0) return;
  (*out)["last_merge"] = last_;
  (*out)["merge_reasons"] = reasons_;
  (*out)["staleness"] = {{"sum", staleness_sum_}, {"count", contributions_}, {"max", staleness_max_}};
}

}  // namespace diloco
