// Prometheus metrics of one dilocod: counters and gauges with labels, set by
// the daemon's roles and rendered in the text exposition format (version
// 0.0.4) for GET /metrics. Thread-safe: roles update it from their own
// threads while the HTTP server renders it.
//
// A family is declared once with its label names; a series is one set of
// label values, given in the declared order:
//
//   registry.Declare("dilocod_steps_total", MetricKind::kCounter,
//                    "Inner training steps taken by a learner.", {"job", "learner"});
//   registry.Add("dilocod_steps_total", {"j-1a2b", "0"}, 1);
//
// Render() prints families by name and series by label values (a stable
// order, so two scrapes of unchanged values are identical); families without
// any series are left out.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/util/status.h"

namespace diloco {

enum class MetricKind { kCounter, kGauge };

class MetricsRegistry {
 public:
  // Declares a family. Names follow Prometheus ([a-zA-Z_:][a-zA-Z0-9_:]*,
  // labels [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__"); counters should
  // end in _total. Declaring again with the same kind and labels is a no-op
  // (the help text of the first declaration stays); anything else is an error.
  Status Declare(const std::string& name, MetricKind kind, const std::string& help,
                 const std::vector<std::string>& label_names = {});

  // Set stores value; Add adds delta (creating the series at 0). Counters
  // only go up: a negative delta on a counter is ignored. Set on a counter is
  // allowed for totals mirrored from elsewhere (e.g. the syncer's merges read
  // back from its state after a restart). label_values has one value per
  // declared label name. An undeclared family or a wrong number of values is
  // a programming error and aborts with the family's name.
  void Set(const std::string& name, const std::vector<std::string>& label_values, double value);
  void Add(const std::string& name, const std::vector<std::string>& label_values, double delta);

  // The value of one series; false when the series does not exist.
  bool Get(const std::string& name, const std::vector<std::string>& label_values,
           double* value) const;

  // Drops every series, of any family, whose label label_name has this value
  // (e.g. all series of a job that was removed). Returns how many.
  size_t RemoveWithLabel(const std::string& label_name, const std::string& value);

  // The text exposition format: per family "# HELP", "# TYPE", then one line
  // per series; label values and help text escaped; ends with a newline
  // (empty when there are no series).
  std::string Render() const;

 private:
  struct Family {
    MetricKind kind = MetricKind::kGauge;
    std::string help;
    std::vector<std::string> label_names;
    std::map<std::vector<std::string>, double> series;  // by label values
  };
  Family& FamilyFor(const std::string& name, const std::vector<std::string>& label_values);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;  // by name
};

// Formats a sample value as Prometheus reads it: the shortest decimal that
// reads back exactly ("12", "0.1", "1e+20"), "NaN", "+Inf" or "-Inf".
std::string FormatMetricValue(double value);

// The families dilocod exports, declared in one place (names below). Labels:
// job = job id; learner = learner index ("0", "1", ...); peer = site name.
//   dilocod_steps_total{job,learner}           counter  inner steps taken
//   dilocod_tokens_total{job,learner}          counter  training tokens processed
//   dilocod_tokens_per_second{job,learner}     gauge    recent training throughput
//   dilocod_loss{job,learner}                  gauge    latest training loss
//   dilocod_bytes_up_total{job,learner}        counter  bytes sent learner -> syncer
//   dilocod_bytes_down_total{job,learner}      counter  bytes received syncer -> learner
//   dilocod_global_version{job,fragment}       gauge    the syncer's version of a fragment
//   dilocod_merges_total{job}                  counter  outer steps (merges) by the syncer
//   dilocod_quorum_waits_total{job}            counter  rounds that waited for a quorum
//   dilocod_grace_waits_total{job}             counter  rounds that waited out a grace window
//   dilocod_dropped_deltas_total{job}          counter  deltas dropped as too stale
//   dilocod_rejected_deltas_total{job}         counter  deltas rejected by the norm filter
//   dilocod_live_peers{}                       gauge    peers heard from within the liveness window
//   dilocod_peer_up{peer}                      gauge    1 when that peer is live, else 0
//   dilocod_jobs{state}                        gauge    jobs on this site per state
Status DeclareDilocodMetrics(MetricsRegistry* registry);

namespace metric {
inline constexpr char kStepsTotal[] = "dilocod_steps_total";
inline constexpr char kTokensTotal[] = "dilocod_tokens_total";
inline constexpr char kTokensPerSecond[] = "dilocod_tokens_per_second";
inline constexpr char kLoss[] = "dilocod_loss";
inline constexpr char kBytesUpTotal[] = "dilocod_bytes_up_total";
inline constexpr char kBytesDownTotal[] = "dilocod_bytes_down_total";
inline constexpr char kGlobalVersion[] = "dilocod_global_version";
inline constexpr char kMergesTotal[] = "dilocod_merges_total";
inline constexpr char kQuorumWaitsTotal[] = "dilocod_quorum_waits_total";
inline constexpr char kGraceWaitsTotal[] = "dilocod_grace_waits_total";
inline constexpr char kDroppedDeltasTotal[] = "dilocod_dropped_deltas_total";
inline constexpr char kRejectedDeltasTotal[] = "dilocod_rejected_deltas_total";
inline constexpr char kLivePeers[] = "dilocod_live_peers";
inline constexpr char kPeerUp[] = "dilocod_peer_up";
inline constexpr char kJobs[] = "dilocod_jobs";
}  // namespace metric

}  // namespace diloco
