#include "daemon/report/html_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "daemon/report/svg_plot.h"
#include "daemon/util/atomic_file.h"

namespace diloco {
namespace {

// Tapes of 100k merges would make a page of megabytes: plot at most this many points.
constexpr size_t kMaxMergePoints = 2000;
// Staleness at or above this shares the last histogram bar.
constexpr long kStalenessBuckets = 16;

const char* kTrainColour = "#4caf50";
const char* kGapColour = "#e53935";

// A panel: its svg (empty when nothing could be drawn) and plain-language notes.
struct Panel {
  std::string id, heading;
  std::vector<std::string> svgs;
  std::vector<std::string> notes;
};

std::string Fmt(double v, const char* format) {
  if (!std::isfinite(v)) return "–";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string Bytes(double v) {
  if (!std::isfinite(v)) return "–";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(v) >= 1024 && u < 4) v /= 1024, ++u;
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

// Per step, the mean over the learners that logged it: (step, mean of field, mean wall_s,
// mean tokens).
struct MeanPoint {
  long step;
  double loss, wall_s, tokens;
};
std::vector<MeanPoint> MeanOverLearners(const RunData& run) {
  struct Acc {
    double loss = 0, wall = 0, tokens = 0;
    int n = 0;
  };
  std::map<long, Acc> by_step;
  for (const LearnerTrace& t : run.traces) {
    for (const MetricPoint& p : t.points) {
      if (!std::isfinite(p.loss)) continue;
      Acc& a = by_step[p.step];
      a.loss += p.loss, a.wall += p.wall_s, a.tokens += p.tokens, ++a.n;
    }
  }
  std::vector<MeanPoint> out;
  for (const auto& [step, a] : by_step) out.push_back({step, a.loss / a.n, a.wall / a.n, a.tokens / a.n});
  return out;
}

bool HasTrainingLines(const RunData& run) {
  for (const LearnerTrace& t : run.traces)
    if (!t.points.empty()) return true;
  return false;
}

// x of a learner point on the "run's tokens" axis: its tokens times the learner count, so
// runs with different learner counts line up by total work.
double RunTokens(const RunData& run, double learner_tokens) {
  return learner_tokens * std::max<size_t>(1, run.traces.size());
}

Panel LossPanel(const std::vector<RunData>& runs, bool by_wall) {
  Panel panel;
  panel.id = by_wall ? "loss-vs-wall" : "loss-vs-tokens";
  panel.heading = by_wall ? "2. Training loss vs wall-clock time" : "1. Training and validation loss vs tokens";
  LinePlot plot;
  plot.title = by_wall ? "Training loss vs wall-clock seconds" : "Loss vs tokens (all learners)";
  plot.x_label = by_wall ? "seconds since start" : "tokens (all learners)";
  plot.y_label = "loss";
  for (size_t r = 0; r < runs.size(); ++r) {
    const RunData& run = runs[r];
    const std::string colour = PaletteColour(int(r));
    if (!HasTrainingLines(run)) {
      panel.notes.push_back(run.label + ": no training lines in the metrics, no curve");
    }
    if (run.traces.size() > 1) {
      for (const LearnerTrace& t : run.traces) {
        Series s{"", colour, SeriesStyle::kLine, 1, 0.35, {}};
        for (const MetricPoint& p : t.points)
          s.points.push_back({by_wall ? p.wall_s : RunTokens(run, p.tokens), p.loss});
        plot.series.push_back(std::move(s));
      }
    }
    Series mean{
        run.label + (run.traces.size() > 1 ? " (mean of learners)" : ""), colour, SeriesStyle::kLine, 2.5, 1, {}};
    for (const MeanPoint& m : MeanOverLearners(run))
      mean.points.push_back({by_wall ? m.wall_s : RunTokens(run, m.tokens), m.loss});
    plot.series.push_back(std::move(mean));
    if (by_wall) {
      if (HasTrainingLines(run) && !run.wall_from_timestamps)
        panel.notes.push_back(run.label + ": no time_ms in the metrics; the time axis is summed step_ms");
      continue;
    }
    Series val{run.label + " validation", colour, SeriesStyle::kPoints, 1, 1, {}};
    if (std::isfinite(run.initial_val_loss)) val.points.push_back({0, run.initial_val_loss});
    const double per_step = run.TokensPerStep();
    for (const EvalPoint& e : run.evals) val.points.push_back({e.step * per_step, e.val_loss});
    if (val.points.empty()) {
      panel.notes.push_back(run.label + ": no validation loss (no start or eval events)");
    } else if (!run.evals.empty() && !std::isfinite(per_step)) {
      panel.notes.push_back(run.label + ": eval points cannot be placed on the tokens axis (no tokens per step)");
    }
    plot.series.push_back(std::move(val));
  }
  panel.svgs.push_back(RenderLinePlot(plot));
  return panel;
}

Panel GoodputPanel(const std::vector<RunData>& runs) {
  Panel panel{"goodput", "3. Goodput, uptime and merges over time", {}, {}};
  BarChart bars;
  bars.title = "Goodput and uptime (from the summary)";
  bars.y_label = "fraction";
  bars.series_names = {"goodput", "uptime"};
  bars.series_colours = {"#1f77b4", "#9ecae1"};
  bars.values.resize(2);
  bars.y_hi = 1.05;
  for (const RunData& run : runs) {
    bars.categories.push_back(run.label);
    bars.values[0].push_back(run.summary.goodput);
    bars.values[1].push_back(run.summary.uptime);
    if (!run.summary.present) panel.notes.push_back(run.label + ": no summary line, no goodput/uptime bar");
  }
  panel.svgs.push_back(RenderBarChart(bars));

  LinePlot merges;
  merges.title = "Cumulative merges (events.log)";
  merges.x_label = "seconds since start";
  merges.y_label = "merges";
  bool any = false;
  for (size_t r = 0; r < runs.size(); ++r) {
    const RunData& run = runs[r];
    if (!run.has_events_log) {
      panel.notes.push_back(run.label + ": no events.log (" + (run.mode.empty() ? "no syncer" : run.mode + " run") +
                            "), no merges to plot");
      continue;
    }
    Series s{run.label, PaletteColour(int(r)), SeriesStyle::kLine, 2, 1, {}};
    const size_t stride = std::max<size_t>(1, run.merges.size() / kMaxMergePoints);
    for (size_t i = 0; i < run.merges.size(); ++i)
      if (i % stride == 0 || i + 1 == run.merges.size()) s.points.push_back({run.merges[i].wall_s, double(i + 1)});
    any = any || !s.points.empty();
    merges.series.push_back(std::move(s));
  }
  if (any) panel.svgs.push_back(RenderLinePlot(merges));
  return panel;
}

// Each learner's training segments and gaps (down or blocked) over wall time.
Panel TimelinePanel(const std::vector<RunData>& runs) {
  Panel panel{"timeline", "4. Per-learner timeline", {}, {}};
  Timeline tl;
  tl.title = "Learners over wall time (gap: > 3x the median time per step)";
  tl.x_label = "seconds since start";
  tl.kind_names = {"training", "gap (down / blocked)"};
  tl.kind_colours = {kTrainColour, kGapColour};
  for (const RunData& run : runs) {
    if (!HasTrainingLines(run)) {
      panel.notes.push_back(run.label + ": no training lines, no timeline");
      continue;
    }
    if (!run.wall_from_timestamps)
      panel.notes.push_back(run.label + ": no time_ms in the metrics, so gaps cannot be seen (compute time only)");
    for (const LearnerTrace& t : run.traces) {
      TimelineRow row;
      row.label = runs.size() > 1 ? run.label + " L" + std::to_string(t.learner) : "L" + std::to_string(t.learner);
      // Seconds per step between consecutive lines; the median is the learner's normal pace.
      std::vector<double> rates;
      for (size_t i = 1; i < t.points.size(); ++i) {
        const long steps = t.points[i].step - t.points[i - 1].step;
        if (steps > 0) rates.push_back((t.points[i].wall_s - t.points[i - 1].wall_s) / steps);
      }
      std::vector<double> sorted = rates;
      std::sort(sorted.begin(), sorted.end());
      const double median = sorted.empty() ? kMissing : sorted[sorted.size() / 2];
      for (size_t i = 0; i < t.points.size(); ++i) {
        const MetricPoint& p = t.points[i];
        if (i == 0) {
          // Before the first line: its steps at the normal pace.
          const double pace = std::isfinite(median) ? median : p.step_ms / 1e3;
          const double x0 = std::isfinite(pace) ? std::max(0.0, p.wall_s - p.step * pace) : p.wall_s;
          row.segments.push_back({x0, p.wall_s, 0});
          continue;
        }
        const MetricPoint& prev = t.points[i - 1];
        const long steps = p.step - prev.step;
        const double rate = steps > 0 ? (p.wall_s - prev.wall_s) / steps : kMissing;
        const bool gap = !std::isfinite(rate) || (std::isfinite(median) && rate > kTimelineGapFactor * median);
        row.segments.push_back({prev.wall_s, p.wall_s, gap ? 1 : 0});
      }
      tl.rows.push_back(std::move(row));
    }
  }
  if (!tl.rows.empty()) panel.svgs.push_back(RenderTimeline(tl));
  return panel;
}

// The run's cumulative bytes over time: each learner's last value, summed, at every line.
Panel BytesPanel(const std::vector<RunData>& runs) {
  Panel panel{"bytes", "5. Bytes up and down over time", {}, {}};
  LinePlot plot;
  plot.title = "Cumulative bytes (all learners; solid up, dashed down; log scale)";
  plot.x_label = "seconds since start";
  plot.y_label = "bytes";
  plot.log_y = true;  // ddp moves orders of magnitude more than DiLoCo: both must show
  bool any = false;
  for (size_t r = 0; r < runs.size(); ++r) {
    const RunData& run = runs[r];
    struct Line {
      double wall_s;
      size_t learner;
      double up, down;
    };
    std::vector<Line> lines;
    for (size_t k = 0; k < run.traces.size(); ++k)
      for (const MetricPoint& p : run.traces[k].points) lines.push_back({p.wall_s, k, p.bytes_up, p.bytes_down});
    std::stable_sort(lines.begin(), lines.end(), [](const Line& a, const Line& b) { return a.wall_s < b.wall_s; });
    std::vector<double> up(run.traces.size(), 0), down(run.traces.size(), 0);
    Series su{run.label + " up", PaletteColour(int(r)), SeriesStyle::kLine, 2, 1, {}};
    Series sd{run.label + " down", PaletteColour(int(r)), SeriesStyle::kDashedLine, 2, 1, {}};
    bool has_up = false, has_down = false;
    for (const Line& l : lines) {
      if (std::isfinite(l.up)) up[l.learner] = l.up, has_up = true;
      if (std::isfinite(l.down)) down[l.learner] = l.down, has_down = true;
      double u = 0, d = 0;
      for (size_t k = 0; k < up.size(); ++k) u += up[k], d += down[k];
      su.points.push_back({l.wall_s, u});
      sd.points.push_back({l.wall_s, d});
    }
    if (!has_up && !has_down) {
      panel.notes.push_back(run.label + ": no bytes_up / bytes_down in the metrics lines");
      continue;
    }
    if (!has_down) panel.notes.push_back(run.label + ": no bytes_down in the metrics lines (only bytes up drawn)");
    any = true;
    if (has_up) plot.series.push_back(std::move(su));
    if (has_down) plot.series.push_back(std::move(sd));
  }
  if (any) panel.svgs.push_back(RenderLinePlot(plot));
  return panel;
}

Panel ContributorsPanel(const std::vector<RunData>& runs) {
  Panel panel{"contributors", "6. Contributors per merge", {}, {}};
  LinePlot plot;
  plot.title = "Contributors per merge (events.log)";
  plot.x_label = "merge index";
  plot.y_label = "contributors";
  bool any = false;
  for (size_t r = 0; r < runs.size(); ++r) {
    const RunData& run = runs[r];
    if (run.merges.empty()) {
      panel.notes.push_back(run.label + (run.has_events_log ? ": events.log has no merges" : ": no events.log"));
      continue;
    }
    Series s{run.label, PaletteColour(int(r)), SeriesStyle::kLine, 1.5, 1, {}};
    const size_t stride = std::max<size_t>(1, run.merges.size() / kMaxMergePoints);
    for (size_t i = 0; i < run.merges.size(); i += stride)
      s.points.push_back({double(i + 1), double(run.merges[i].staleness.size())});
    plot.series.push_back(std::move(s));
    any = true;
  }
  if (any) {
    plot.y_lo = 0;
    double hi = 1;
    for (const Series& s : plot.series)
      for (auto [x, y] : s.points) hi = std::max(hi, y);
    plot.y_hi = hi + 0.5;
    panel.svgs.push_back(RenderLinePlot(plot));
  }
  return panel;
}

Panel StalenessPanel(const std::vector<RunData>& runs) {
  Panel panel{"staleness", "7. Staleness of merged deltas", {}, {}};
  BarChart chart;
  chart.title = "Staleness histogram (versions behind, per contributor)";
  chart.x_label = "staleness";
  chart.y_label = "contributions";
  long max_seen = -1;
  std::vector<std::vector<double>> counts;
  for (size_t r = 0; r < runs.size(); ++r) {
    const RunData& run = runs[r];
    std::vector<double> c(kStalenessBuckets, 0);
    bool any = false;
    for (const MergeRecord& m : run.merges) {
      for (long s : m.staleness) {
        const long b = std::clamp(s, 0L, kStalenessBuckets - 1);
        c[b] += 1, any = true;
        max_seen = std::max(max_seen, b);
      }
    }
    if (!any) {
      panel.notes.push_back(run.label + (run.has_events_log ? ": no contributors in events.log" : ": no events.log"));
      continue;
    }
    chart.series_names.push_back(run.label);
    chart.series_colours.push_back(PaletteColour(int(r)));
    counts.push_back(std::move(c));
  }
  if (max_seen < 0) return panel;
  for (long b = 0; b <= max_seen; ++b)
    chart.categories.push_back(b == kStalenessBuckets - 1 ? "≥" + std::to_string(b) : std::to_string(b));
  for (auto& c : counts) c.resize(max_seen + 1);
  chart.values = std::move(counts);
  panel.svgs.push_back(RenderBarChart(chart));
  return panel;
}

std::string SummaryTable(const std::vector<RunData>& runs) {
  std::string s =
      "<table><tr><th>run</th><th>mode</th><th>learners</th><th>steps</th><th>tokens</th>"
      "<th>final val loss</th><th>val batches</th><th>goodput</th><th>uptime</th><th>bytes up</th><th>bytes down</th>"
      "<th>outer steps</th><th>wall s</th></tr>\n";
  for (size_t r = 0; r < runs.size(); ++r) {
    const RunData& run = runs[r];
    const RunSummary& m = run.summary;
    auto cell = [](const std::string& text) { return "<td>" + EscapeXml(text) + "</td>"; };
    s += "<tr><td><span class=\"swatch\" style=\"background:" + PaletteColour(int(r)) + "\"></span>" +
         EscapeXml(run.label) + "</td>";
    s += cell(run.mode.empty() ? "–" : run.mode) + cell(std::to_string(run.learners)) + cell(Fmt(m.steps, "%.0f")) +
         cell(Fmt(m.tokens, "%.0f")) + cell(Fmt(m.final_val_loss, "%.4f")) + cell(Fmt(m.final_val_batches, "%.0f")) +
         cell(Fmt(m.goodput, "%.3f")) +
         cell(Fmt(m.uptime, "%.3f")) + cell(Bytes(m.bytes_up)) + cell(Bytes(m.bytes_down)) +
         cell(Fmt(m.outer_steps, "%.0f")) + cell(Fmt(m.wall_s, "%.1f")) + "</tr>\n";
  }
  s += "</table>\n";
  return s;
}

std::string RenderPanel(const Panel& panel) {
  std::string s = "<section id=\"" + panel.id + "\"><h2>" + EscapeXml(panel.heading) + "</h2>\n";
  for (const std::string& note : panel.notes) s += "<p class=\"note\">" + EscapeXml(note) + "</p>\n";
  if (panel.svgs.empty()) s += "<p class=\"note\">Nothing to draw: the runs have none of the data above.</p>\n";
  for (const std::string& svg : panel.svgs) s += "<div class=\"plot\">" + svg + "</div>\n";
  return s + "</section>\n";
}

const char* kStyle = R"(
body { font-family: sans-serif; margin: 24px; color: #222; background: #fafafa; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; }
.plot { background: white; border: 1px solid #ddd; display: inline-block; margin: 4px 0; }
.note { color: #8a4b00; background: #fff4e0; padding: 4px 8px; margin: 4px 0; font-size: 13px; }
table { border-collapse: collapse; background: white; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 4px 8px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.swatch { display: inline-block; width: 12px; height: 12px; margin-right: 6px; }
)";

}  // namespace

const std::vector<std::string>& ReportPanelIds() {
  static const std::vector<std::string> kIds = {"loss-vs-tokens", "loss-vs-wall", "goodput",   "timeline",
                                                "bytes",          "contributors", "staleness", "summary"};
  return kIds;
}

std::string RenderHtmlReport(const std::vector<RunData>& runs) {
  std::string s = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>dilocod report</title>\n";
  s += "<style>" + std::string(kStyle) + "</style></head><body>\n<h1>dilocod training report</h1>\n<p>";
  for (size_t r = 0; r < runs.size(); ++r) {
    s += "<span class=\"swatch\" style=\"background:" + PaletteColour(int(r)) + "\"></span>" +
         EscapeXml(runs[r].label) + " <small>(" + EscapeXml(runs[r].dir) + ")</small>&nbsp;&nbsp; ";
  }
  s += "</p>\n";
  bool any_notes = false;
  for (const RunData& run : runs) any_notes = any_notes || !run.notes.empty();
  if (any_notes) {
    s += "<section id=\"data-notes\"><h2>Damaged or missing inputs</h2>\n";
    for (const RunData& run : runs)
      for (const std::string& note : run.notes)
        s += "<p class=\"note\">" + EscapeXml(run.label + " (" + run.dir + "): " + note) + "</p>\n";
    s += "</section>\n";
  }
  s += RenderPanel(LossPanel(runs, false));
  s += RenderPanel(LossPanel(runs, true));
  s += RenderPanel(GoodputPanel(runs));
  s += RenderPanel(TimelinePanel(runs));
  s += RenderPanel(BytesPanel(runs));
  s += RenderPanel(ContributorsPanel(runs));
  s += RenderPanel(StalenessPanel(runs));
  s += "<section id=\"summary\"><h2>8. Summary</h2>\n" + SummaryTable(runs) + "</section>\n";
  return s + "</body></html>\n";
}

Status WriteHtmlReport(const std::vector<RunData>& runs, const std::string& path) {
  const std::string page = RenderHtmlReport(runs);
  return WriteFileAtomically(path, {{page.data(), page.size()}}, "report");
}

}  // namespace diloco
