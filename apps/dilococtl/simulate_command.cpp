// dilococtl simulate: one row per mode and learner count of a scenario (daemon/sim). Exit 1
// when a simulation fails, 2 on a bad scenario or option.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "apps/dilococtl/job_commands.h"
#include "daemon/report/svg_plot.h"
#include "daemon/sim/scenario.h"
#include "daemon/sim/simulator.h"
#include "daemon/util/atomic_file.h"

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

// Goodput against chips, one line per mode and learner count, as a standalone SVG file.
Status WritePlot(const std::string& path, const std::vector<SimResult>& results) {
  LinePlot plot;
  plot.title = "Goodput against chips (dilococtl simulate)";
  plot.x_label = "chips (millions)";
  plot.y_label = "goodput";
  plot.y_lo = 0;
  plot.y_hi = 1;
  for (const SimResult& r : results) {
    const bool data_parallel = r.mode == SimMode::kDdp || r.mode == SimMode::kElasticDdp;
    const std::string name = std::string(ToString(r.mode)) +
                             (data_parallel ? "" : " M=" + std::to_string(r.learners)) +
                             (r.syncers > 1 ? " S=" + std::to_string(r.syncers) : "");
    auto it = std::find_if(plot.series.begin(), plot.series.end(), [&](const Series& s) { return s.name == name; });
    if (it == plot.series.end()) {
      plot.series.push_back({name, PaletteColour((int)plot.series.size()),
                             data_parallel ? SeriesStyle::kDashedLine : SeriesStyle::kLine, 2, 1, {}});
      it = plot.series.end() - 1;
    }
    it->points.push_back({r.chips / 1e6, r.goodput.goodput});
  }
  std::string svg = RenderLinePlot(plot);
  // A file of its own needs the XML namespace the inline page does not.
  if (svg.find("xmlns=") == std::string::npos) svg.insert(4, " xmlns=\"http://www.w3.org/2000/svg\"");
  svg += "\n";
  return WriteFileAtomically(path, {{svg.data(), svg.size()}}, "plot");
}

}  // namespace

int RunSimulateCommand(const SimulateCommand& cmd) {
  std::vector<std::string> overrides = cmd.overrides;
  if (!cmd.merge_bench.empty()) overrides.push_back("merge_bench=" + cmd.merge_bench);
  Scenario scenario;
  if (Status st = LoadScenario(cmd.scenario, overrides, &scenario); !st.ok()) {
    std::fprintf(stderr, "dilococtl simulate: %s\n", st.message().c_str());
    return 2;
  }
  if (cmd.hours > 0) scenario.hours = cmd.hours;
  std::vector<double> chip_counts = cmd.chips;
  if (chip_counts.empty()) chip_counts.push_back(scenario.chips);
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
  std::vector<int> syncer_counts = cmd.syncers;
  if (syncer_counts.empty()) syncer_counts.push_back(scenario.run.sync.syncers);
  for (int S : syncer_counts)
    if (S > EffectiveFragments(scenario.run.sync)) {
      std::fprintf(stderr, "dilococtl simulate: --syncers %d: more shards than the run's %d fragments (sync.fragments)\n",
                   S, EffectiveFragments(scenario.run.sync));
      return 2;
    }
  if (!cmd.json) {
    std::printf("merge %.2f GB/s (%s), %s fragments\n", scenario.merge_gbps, scenario.merge_gbps_source.c_str(),
                scenario.balanced_fragments ? "balanced" : "whole-tensor (unbalanced)");
    std::printf("%-12s %8s %7s %10s %8s %7s %10s %6s %9s %8s %9s %9s %10s %8s\n", "mode", "learners", "syncers",
                "chips", "goodput", "uptime", "merges/h", "contr", "stale", "failures", "peak Gb/s", "mean Gb/s",
                "syncer Gb/s", "sim s");
  }
  // The rows, in the order they print.
  std::vector<std::pair<Scenario, SimMode>> rows;
  for (double chips : chip_counts) {
    for (SimMode mode : modes) {
      const bool data_parallel = mode == SimMode::kDdp || mode == SimMode::kElasticDdp;
      for (size_t i = 0; i < (data_parallel ? 1 : learner_counts.size()); i++) {
        for (size_t k = 0; k < (data_parallel ? 1 : syncer_counts.size()); k++) {
          Scenario s = scenario;
          s.chips = chips;
          if (!data_parallel) {
            s.run.sync.learners = learner_counts[i];
            s.run.sync.syncers = syncer_counts[k];
            s.run.sync.quorum = std::min(s.run.sync.quorum, learner_counts[i]);
            s.stragglers = std::min(s.stragglers, learner_counts[i]);
          }
          rows.emplace_back(std::move(s), mode);
        }
      }
    }
  }
  // Each row is a simulation of its own on one thread; --jobs of them at once, printed in order
  // as they complete.
  std::vector<SimResult> results(rows.size());
  std::vector<Status> statuses(rows.size());
  std::vector<char> finished(rows.size(), 0);
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<size_t> next{0};
  auto work = [&] {
    omp_set_num_threads(1);  // the rows are the parallelism
    for (size_t k; (k = next++) < rows.size();) {
      Status st = Simulate(rows[k].first, rows[k].second, &results[k]);
      std::lock_guard<std::mutex> lock(mu);
      statuses[k] = std::move(st);
      finished[k] = 1;
      cv.notify_all();
    }
  };
  std::vector<std::thread> workers;
  for (int j = 0; j < std::min<int>(cmd.jobs, (int)rows.size()); j++) workers.emplace_back(work);
  int rc = 0;
  for (size_t k = 0; k < rows.size() && rc == 0; k++) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return finished[k] != 0; });
    }
    const SimResult& r = results[k];
    if (!statuses[k].ok()) {
      std::fprintf(stderr, "dilococtl simulate: %s, %d learners: %s\n", ToString(rows[k].second),
                   rows[k].first.run.sync.learners, statuses[k].message().c_str());
      rc = 1;
      next = rows.size();  // start no more
      break;
    }
    if (cmd.json) {
      std::printf("%s\n", SimResultToJson(r).dump().c_str());
    } else {
      std::printf("%-12s %8d %7d %10.0f %8.3f %7.3f %10.1f %6.2f %9s %8llu %9.2f %9.3f %10.2f %8.2f\n",
                  ToString(r.mode), r.learners, r.syncers, r.chips, r.goodput.goodput, r.goodput.uptime,
                  r.merges_per_hour(), r.contributors_mean, StalenessText(r.staleness).c_str(),
                  (unsigned long long)r.failures, r.peak_wan_gbps, r.mean_wan_gbps, r.peak_syncer_gbps, r.runtime_s);
    }
    std::fflush(stdout);
  }
  for (std::thread& t : workers) t.join();
  if (rc != 0) return rc;
  if (!cmd.plot.empty()) {
    if (Status st = WritePlot(cmd.plot, results); !st.ok()) {
      std::fprintf(stderr, "dilococtl simulate: --plot: %s\n", st.message().c_str());
      return 1;
    }
    std::fprintf(stderr, "dilococtl simulate: plot %s\n", cmd.plot.c_str());
  }
  return 0;
}

}  // namespace diloco
