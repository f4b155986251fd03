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

}  // namespace diloco
