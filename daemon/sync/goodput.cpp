#include "daemon/sync/goodput.h"

#include "daemon/sync/drop_reasons.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

namespace diloco {
namespace {

using Interval = std::pair<double, double>;  // [first, second)

bool NonNegative(double x) { return std::isfinite(x) && x >= 0; }

std::string Num(double x) {
  std::string s = std::to_string(x);  // "12.500000" -> "12.5"
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// Checks a merged or lost record; what = "merged[3]" etc.
Status CheckDelta(const GoodputInput& in, const std::string& what, double time_s, int fragment,
                  int learner, double tokens) {
  if (!NonNegative(time_s)) return Status::Error(what + ": time_s " + Num(time_s) + " is negative or not finite");
  if (time_s > in.wall_s) {
    return Status::Error(what + ": time_s " + Num(time_s) + " is after wall_s " + Num(in.wall_s) +
                         "; pass the run's end as wall_s or leave later events out");
  }
  if (fragment < 0 || fragment >= static_cast<int>(in.fragment_weights.size())) {
    return Status::Error(what + ": unknown fragment " + std::to_string(fragment) + " (have " +
                         std::to_string(in.fragment_weights.size()) + " fragment weights)");
  }
  if (learner < 0 || learner >= static_cast<int>(in.nominal_tokens_per_s.size())) {
    return Status::Error(what + ": unknown learner " + std::to_string(learner) + " (have " +
                         std::to_string(in.nominal_tokens_per_s.size()) + " nominal rates)");
  }
  if (!NonNegative(tokens)) return Status::Error(what + ": tokens " + Num(tokens) + " is negative or not finite");
  return Status::Ok();
}

// Spans clipped to [0, wall_s], per learner, sorted by start.
Status ClippedSpans(const GoodputInput& in, std::vector<std::vector<ActivitySpan>>* out) {
  out->assign(in.nominal_tokens_per_s.size(), {});
  for (size_t i = 0; i < in.spans.size(); ++i) {
    ActivitySpan s = in.spans[i];
    const std::string what = "spans[" + std::to_string(i) + "]";
    if (s.learner < 0 || s.learner >= static_cast<int>(out->size())) {
      return Status::Error(what + ": unknown learner " + std::to_string(s.learner) + " (have " +
                           std::to_string(out->size()) + " nominal rates)");
    }
    if (!NonNegative(s.start_s) || !NonNegative(s.end_s)) {
      return Status::Error(what + ": start_s/end_s " + Num(s.start_s) + "/" + Num(s.end_s) +
                           " negative or not finite");
    }
    if (s.end_s < s.start_s) {
      return Status::Error(what + ": ends (" + Num(s.end_s) + ") before it starts (" + Num(s.start_s) + ")");
    }
    s.start_s = std::min(s.start_s, in.wall_s);
    s.end_s = std::min(s.end_s, in.wall_s);
    (*out)[s.learner].push_back(s);
  }
  for (size_t l = 0; l < out->size(); ++l) {
    std::vector<ActivitySpan>& spans = (*out)[l];
    std::stable_sort(spans.begin(), spans.end(),
                     [](const ActivitySpan& a, const ActivitySpan& b) { return a.start_s < b.start_s; });
    // A learner does one thing at a time; overlap would count its time twice.
    for (size_t i = 1; i < spans.size(); ++i) {
      if (spans[i].start_s < spans[i - 1].end_s) {
        return Status::Error("learner " + std::to_string(l) + ": spans overlap at " + Num(spans[i].start_s) +
                             " s (the one before ends at " + Num(spans[i - 1].end_s) + " s)");
      }
    }
  }
  return Status::Ok();
}

Status Validate(const GoodputInput& in, std::vector<std::vector<ActivitySpan>>* spans) {
  if (!std::isfinite(in.wall_s) || in.wall_s <= 0) return Status::Error("wall_s must be > 0, got " + Num(in.wall_s));
  if (!std::isfinite(in.expected_merge_interval_s) || in.expected_merge_interval_s <= 0) {
    return Status::Error("expected_merge_interval_s must be > 0, got " + Num(in.expected_merge_interval_s));
  }
  if (in.nominal_tokens_per_s.empty()) return Status::Error("no learners: nominal_tokens_per_s is empty");
  double total_rate = 0;
  for (size_t l = 0; l < in.nominal_tokens_per_s.size(); ++l) {
    if (!NonNegative(in.nominal_tokens_per_s[l])) {
      return Status::Error("nominal_tokens_per_s[" + std::to_string(l) + "] is negative or not finite");
    }
    total_rate += in.nominal_tokens_per_s[l];
  }
  if (total_rate <= 0) return Status::Error("nominal_tokens_per_s are all 0: nothing was provisioned");
  if (in.fragment_weights.empty()) return Status::Error("no fragments: fragment_weights is empty");
  double weight_sum = 0;
  for (size_t p = 0; p < in.fragment_weights.size(); ++p) {
    if (!NonNegative(in.fragment_weights[p])) {
      return Status::Error("fragment_weights[" + std::to_string(p) + "] is negative or not finite");
    }
    weight_sum += in.fragment_weights[p];
  }
  if (std::abs(weight_sum - 1) > 1e-6) {
    return Status::Error("fragment_weights sum to " + Num(weight_sum) + ", not 1: pass each fragment's numel share");
  }
  for (size_t i = 0; i < in.merged.size(); ++i) {
    const MergedDelta& d = in.merged[i];
    DL_RETURN_IF_ERROR(CheckDelta(in, "merged[" + std::to_string(i) + "]", d.time_s, d.fragment, d.learner, d.tokens));
  }
  for (size_t i = 0; i < in.lost.size(); ++i) {
    const LostDelta& d = in.lost[i];
    DL_RETURN_IF_ERROR(CheckDelta(in, "lost[" + std::to_string(i) + "]", d.time_s, d.fragment, d.learner, d.tokens));
  }
  return ClippedSpans(in, spans);
}

// The times the global was up, as disjoint sorted intervals: [m, m + 2·I)
// for each merge m and for the virtual merge at 0, cut at wall_s.
std::vector<Interval> UpIntervals(const GoodputInput& in) {
  std::vector<double> times = {0.0};
  for (const MergedDelta& d : in.merged) times.push_back(d.time_s);
  std::sort(times.begin(), times.end());
  const double reach_s = 2 * in.expected_merge_interval_s;
  std::vector<Interval> up;
  for (double t : times) {
    const double end = std::min(t + reach_s, in.wall_s);
    if (!up.empty() && t <= up.back().second) {
      up.back().second = std::max(up.back().second, end);
    } else {
      up.push_back({t, end});
    }
  }
  return up;
}

double UpSeconds(const std::vector<Interval>& up, double from_s, double to_s) {
  double total = 0;
  for (const Interval& i : up) total += std::max(0.0, std::min(i.second, to_s) - std::max(i.first, from_s));
  return total;
}

double TotalRate(const GoodputInput& in) {
  double rate = 0;
  for (double r : in.nominal_tokens_per_s) rate += r;
  return rate;
}

}  // namespace

Status ComputeGoodput(const GoodputInput& in, GoodputReport* report) {
  std::vector<std::vector<ActivitySpan>> spans;
  DL_RETURN_IF_ERROR(Validate(in, &spans).WithContext("goodput"));
  GoodputReport r;
  r.provisioned_tokens = TotalRate(in) * in.wall_s;
  for (const MergedDelta& d : in.merged) r.merged_tokens += in.fragment_weights[d.fragment] * d.tokens;

  const size_t M = in.nominal_tokens_per_s.size();
  r.down_s.assign(M, 0);
  r.blocked_s.assign(M, 0);
  double down_tokens = 0, blocked_tokens = 0, idle_tokens = 0;
  for (size_t l = 0; l < M; ++l) {
    for (const ActivitySpan& s : spans[l]) {
      if (s.activity == Activity::kDown) r.down_s[l] += s.end_s - s.start_s;
      if (s.activity == Activity::kBlocked) r.blocked_s[l] += s.end_s - s.start_s;
      if (s.activity == Activity::kIdle) idle_tokens += in.nominal_tokens_per_s[l] * (s.end_s - s.start_s);
    }
    down_tokens += in.nominal_tokens_per_s[l] * r.down_s[l];
    blocked_tokens += in.nominal_tokens_per_s[l] * r.blocked_s[l];
  }
  double dropped_tokens = 0, discarded_tokens = 0;
  for (const LostDelta& d : in.lost) {
    const double weighted = in.fragment_weights[d.fragment] * d.tokens;
    if (d.cause == LossCause::kDropped) dropped_tokens += weighted;
    else if (d.cause == LossCause::kDiscarded) discarded_tokens += weighted;
    else down_tokens += weighted;
  }

  r.goodput = r.merged_tokens / r.provisioned_tokens;
  r.uptime = UpSeconds(UpIntervals(in), 0, in.wall_s) / in.wall_s;
  r.waste_down = down_tokens / r.provisioned_tokens;
  r.waste_blocked = blocked_tokens / r.provisioned_tokens;
  r.waste_dropped = dropped_tokens / r.provisioned_tokens;
  r.waste_discarded = discarded_tokens / r.provisioned_tokens;
  r.waste_idle = idle_tokens / r.provisioned_tokens;
  *report = std::move(r);
  return Status::Ok();
}

Status GoodputOverTime(const GoodputInput& in, double bucket_s, std::vector<GoodputPoint>* out) {
  std::vector<std::vector<ActivitySpan>> spans;
  DL_RETURN_IF_ERROR(Validate(in, &spans).WithContext("goodput over time"));
  if (!std::isfinite(bucket_s) || bucket_s <= 0) {
    return Status::Error("goodput over time: bucket_s must be > 0, got " + Num(bucket_s));
  }
  // The tolerance keeps wall_s = 100, bucket_s = 10 at 10 buckets, not 11.
  const size_t n = std::max<size_t>(1, static_cast<size_t>(std::ceil(in.wall_s / bucket_s - 1e-9)));
  std::vector<GoodputPoint> points(n);
  for (size_t k = 0; k < n; ++k) {
    points[k].start_s = k * bucket_s;
    points[k].end_s = k + 1 == n ? in.wall_s : (k + 1) * bucket_s;
  }
  std::vector<double> merged(n, 0);
  for (const MergedDelta& d : in.merged) {
    const size_t k = std::min(n - 1, static_cast<size_t>(d.time_s / bucket_s));  // wall_s: the last bucket
    merged[k] += in.fragment_weights[d.fragment] * d.tokens;
  }
  const std::vector<Interval> up = UpIntervals(in);
  const double rate = TotalRate(in);
  for (size_t k = 0; k < n; ++k) {
    GoodputPoint& p = points[k];
    const double length_s = p.end_s - p.start_s;
    if (length_s <= 0) continue;
    p.goodput = merged[k] / (rate * length_s);
    p.uptime = UpSeconds(up, p.start_s, p.end_s) / length_s;
    p.up = p.uptime >= 1 - 1e-9;
  }
  *out = std::move(points);
  return Status::Ok();
}

nlohmann::json GoodputToJson(const GoodputReport& r) {
  return {{"goodput", r.goodput},
          {"uptime", r.uptime},
          {"waste",
           {{"down", r.waste_down},
            {"blocked", r.waste_blocked},
            {"dropped", r.waste_dropped},
            {"discarded", r.waste_discarded},
            {"idle", r.waste_idle}}},
          {"merged_tokens", r.merged_tokens},
          {"provisioned_tokens", r.provisioned_tokens}};
}

void GoodputRecordsOf(const MergeEvent& e, int64_t run_start_unix_ms, std::vector<MergedDelta>* merged,
                      std::vector<LostDelta>* lost) {
  const double time_s = (double)(e.time_ms - run_start_unix_ms) / 1000;
  for (const MergeContributor& c : e.contributors) merged->push_back({time_s, e.fragment, c.learner, c.tokens});
  for (const SkippedDelta& k : e.skipped)
    if (!DropKeepsWork(k.why) && k.tokens > 0) lost->push_back({time_s, e.fragment, k.learner, k.tokens, LossCause::kDropped});
}

Status ReadMergedDeltas(const std::string& events_path, int64_t run_start_unix_ms, std::vector<MergedDelta>* out,
                        std::vector<LostDelta>* lost) {
  std::vector<MergeEvent> events;
  DL_RETURN_IF_ERROR(ReadEventLog(events_path, /*missing_ok=*/false, &events));
  std::vector<LostDelta> dropped;
  for (const MergeEvent& e : events) GoodputRecordsOf(e, run_start_unix_ms, out, &dropped);
  if (lost) lost->insert(lost->end(), dropped.begin(), dropped.end());
  return Status::Ok();
}

}  // namespace diloco
