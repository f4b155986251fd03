// dilococtl simulate: one row per mode and learner count of a scenario (daemon/sim). Exit 1
// when a simulation fails, 2 on a bad scenario or option.
#include <cstdio>
#include <string>
#include <vector>

#include "apps/dilococtl/job_commands.h"
#include "daemon/sim/scenario.h"
#include "daemon/sim/simulator.h"

namespace diloco {
namespace {

std::string StalenessText(const std::vector<uint64_t>& hist) {
  uint64_t total = 0, max_s = 0;
  double sum = 0;
  for (size_t s = 0; s < hist.size(); s++) {
    total += hist[s];
    sum += (double)s * hist[s];
    if (hist[s] > 0) max_s = s;
  }
  if (total == 0) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f/%llu", sum / total, (unsigned long long)max_s);
  return buf;
}

}  // namespace

int RunSimulateCommand(const SimulateCommand& cmd) {
  std::vector<std::string> overrides = cmd.overrides;
  Scenario scenario;
  if (Status st = LoadScenario(cmd.scenario, overrides, &scenario); !st.ok()) {
    std::fprintf(stderr, "dilococtl simulate: %s\n", st.message().c_str());
    return 2;
  }
  if (cmd.chips > 0) scenario.chips = cmd.chips;
  if (cmd.hours > 0) scenario.hours = cmd.hours;
  std::vector<SimMode> modes;
  for (const std::string& m : cmd.modes) {
    SimMode mode;
    if (Status st = ParseSimMode(m, &mode); !st.ok()) {
      std::fprintf(stderr, "dilococtl simulate: --mode: %s\n", st.message().c_str());
      return 2;
    }
    modes.push_back(mode);
  }
  if (modes.empty()) modes.push_back(SimModeOf(scenario.run));
  std::vector<int> learner_counts = cmd.learners;
  if (learner_counts.empty()) learner_counts.push_back(scenario.run.sync.learners);
  if (!cmd.json) {
    std::printf("%-12s %8s %10s %8s %7s %10s %6s %9s %8s %9s %9s %8s\n", "mode", "learners", "chips", "goodput",
                "uptime", "merges/h", "contr", "stale", "failures", "peak Gb/s", "mean Gb/s", "sim s");
  }
  for (SimMode mode : modes) {
    const bool data_parallel = mode == SimMode::kDdp || mode == SimMode::kElasticDdp;
    for (size_t i = 0; i < (data_parallel ? 1 : learner_counts.size()); i++) {
      Scenario s = scenario;
      if (!data_parallel) {
        s.run.sync.learners = learner_counts[i];
        s.run.sync.quorum = std::min(s.run.sync.quorum, learner_counts[i]);
        s.stragglers = std::min(s.stragglers, learner_counts[i]);
      }
      SimResult r;
      if (Status st = Simulate(s, mode, &r); !st.ok()) {
        std::fprintf(stderr, "dilococtl simulate: %s, %d learners: %s\n", ToString(mode), s.run.sync.learners,
                     st.message().c_str());
        return 1;
      }
      if (cmd.json) {
        std::printf("%s\n", SimResultToJson(r).dump().c_str());
      } else {
        std::printf("%-12s %8d %10.0f %8.3f %7.3f %10.1f %6.2f %9s %8llu %9.2f %9.3f %8.2f\n", ToString(mode),
                    r.learners, r.chips, r.goodput.goodput, r.goodput.uptime, r.merges_per_hour(),
                    r.contributors_mean, StalenessText(r.staleness).c_str(), (unsigned long long)r.failures,
                    r.peak_wan_gbps, r.mean_wan_gbps, r.runtime_s);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace diloco
