#include "daemon/report/run_data.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "daemon/sync/event_log.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A page full of notes helps nobody: past this many per file, one line counts the rest.
constexpr int kMaxNotesPerFile = 5;

// A number field, or kMissing when absent or not a number (never throws on odd input).
double Num(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : kMissing;
}

long Int(const json& j, const char* key, long fallback) {
  const double v = Num(j, key);
  // Out-of-range doubles cannot be cast to long: treat them as absent.
  return std::isfinite(v) && std::fabs(v) < 1e15 ? static_cast<long>(v) : fallback;
}

std::string Str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// Calls on_line for each JSON object line of path; damaged lines become notes.
void ReadJsonLines(const fs::path& path, std::vector<std::string>* notes,
                   const std::function<void(const json&)>& on_line) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    notes->push_back(path.filename().string() + ": cannot be read");
    return;
  }
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  int bad = 0;
  size_t pos = 0;
  for (long line_no = 1; pos < text.size(); ++line_no) {
    size_t end = text.find('\n', pos);
    const bool last_unterminated = end == std::string::npos;
    if (last_unterminated) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object()) {
      on_line(j);
      continue;
    }
    if (++bad <= kMaxNotesPerFile) {
      notes->push_back(path.filename().string() + " line " + std::to_string(line_no) + ": " +
                       (last_unterminated ? "truncated last line" : "not a JSON object") + " (skipped)");
    }
  }
  if (bad > kMaxNotesPerFile) {
    notes->push_back(path.filename().string() + ": " + std::to_string(bad - kMaxNotesPerFile) +
                     " more damaged lines (skipped)");
  }
}

MetricPoint ParseMetricPoint(const json& j) {
  MetricPoint p;
  p.step = Int(j, "step", 0);
  p.loss = Num(j, "loss");
  p.tokens = Num(j, "tokens");
  p.step_ms = Num(j, "step_ms");
  p.bytes_up = Num(j, "bytes_up");
  p.bytes_down = Num(j, "bytes_down");
  const double t = Num(j, "time_ms");
  p.time_ms = std::isfinite(t) && t > 0 ? static_cast<int64_t>(t) : 0;
  return p;
}

// A training line has a step and a loss and is not an event.
bool IsLearnerLine(const json& j) { return !j.contains("event") && j.contains("step") && j.contains("loss"); }

RunSummary ParseSummary(const json& j) {
  RunSummary s;
  s.present = true;
  s.final_val_loss = Num(j, "final_val_loss");
  s.final_val_batches = Num(j, "final_val_batches");
  s.goodput = Num(j, "goodput");
  s.uptime = Num(j, "uptime");
  s.tokens = Num(j, "tokens");
  s.steps = Num(j, "steps");
  s.outer_steps = Num(j, "outer_steps");
  s.bytes_up = Num(j, "bytes_up");
  s.bytes_down = Num(j, "bytes_down");
  s.wall_s = Num(j, "wall_s");
  return s;
}

MergeRecord RecordOf(const MergeEvent& e) {
  MergeRecord m;
  m.time_ms = e.time_ms;
  m.fragment = e.fragment;
  m.version = static_cast<long>(e.version);
  m.reason = e.reason;
  for (const MergeContributor& c : e.contributors) m.staleness.push_back(static_cast<long>(c.staleness));
  return m;
}

// Every line of a metrics file; learner lines go to traces[learner] (default_learner when
// the line does not say, as in single-learner runs).
void ReadMetricsFile(const fs::path& path, int default_learner, RunData* run, std::map<int, LearnerTrace>* traces) {
  ReadJsonLines(path, &run->notes, [&](const json& j) {
    if (IsLearnerLine(j)) {
      const int learner = static_cast<int>(Int(j, "learner", default_learner));
      (*traces)[learner].learner = learner;
      (*traces)[learner].points.push_back(ParseMetricPoint(j));
      return;
    }
    const std::string event = Str(j, "event");
    if (event == "start") {
      if (std::string mode = Str(j, "mode"); !mode.empty()) run->mode = mode;
      run->learners = static_cast<int>(Int(j, "learners", run->learners));
      if (!std::isfinite(run->initial_val_loss)) run->initial_val_loss = Num(j, "val_loss");
    } else if (event == "eval") {
      run->evals.push_back({Int(j, "step", 0), Num(j, "val_loss")});
    } else if (event == "summary") {
      run->summary = ParseSummary(j);
      // A daemon job evaluates the merged model at the end only: its start line has no loss.
      if (!std::isfinite(run->initial_val_loss)) run->initial_val_loss = Num(j, "initial_val_loss");
    }
  });
}

void ReadConfig(const fs::path& path, RunData* run) {
  try {
    const YAML::Node root = YAML::LoadFile(path.string());
    if (root["sync"] && root["sync"]["mode"]) run->mode = root["sync"]["mode"].as<std::string>();
    if (root["sync"] && root["sync"]["learners"]) run->learners = root["sync"]["learners"].as<int>();
  } catch (const std::exception& e) {
    run->notes.push_back(std::string("config.yaml: cannot be parsed (") + e.what() + ")");
  }
}

// Seconds since the run's start for every point and merge. With time_ms on every line
// the start is the earliest line less the steps before it; otherwise each learner's
// step_ms is summed (compute time only, so waits do not show).
void DeriveWallTime(RunData* run) {
  bool all_timed = !run->traces.empty();
  for (const LearnerTrace& t : run->traces)
    for (const MetricPoint& p : t.points) all_timed = all_timed && p.time_ms > 0;
  run->wall_from_timestamps = all_timed;
  double t0_ms = kMissing;
  if (all_timed) {
    for (const LearnerTrace& t : run->traces) {
      if (t.points.empty()) continue;
      const MetricPoint& first = t.points.front();
      const double before_ms = std::isfinite(first.step_ms) ? first.step * first.step_ms : 0;
      const double start = static_cast<double>(first.time_ms) - before_ms;
      t0_ms = std::isfinite(t0_ms) ? std::min(t0_ms, start) : start;
    }
    for (LearnerTrace& t : run->traces)
      for (MetricPoint& p : t.points) p.wall_s = (static_cast<double>(p.time_ms) - t0_ms) / 1e3;
  } else {
    for (LearnerTrace& t : run->traces) {
      double wall_s = 0;
      long prev_step = 0;
      for (MetricPoint& p : t.points) {
        if (std::isfinite(p.step_ms)) wall_s += p.step_ms * std::max(0L, p.step - prev_step) / 1e3;
        prev_step = p.step;
        p.wall_s = wall_s;
      }
    }
    if (!run->traces.empty()) {
      run->notes.push_back(
          "metrics lines have no time_ms: wall time is each learner's summed step_ms "
          "(compute only; waits and downtime do not show)");
    }
  }
  // Merges: on the metrics clock when there is one, else from the first merge.
  if (!std::isfinite(t0_ms)) {
    for (const MergeRecord& m : run->merges)
      if (m.time_ms > 0) t0_ms = std::isfinite(t0_ms) ? std::min<double>(t0_ms, m.time_ms) : m.time_ms;
  }
  for (MergeRecord& m : run->merges)
    if (m.time_ms > 0) m.wall_s = (static_cast<double>(m.time_ms) - t0_ms) / 1e3;
}

// One directory's files into *run; learner lines into *traces (several directories may
// hold the learners of one run).
struct LoadState {
  std::map<int, LearnerTrace> traces;
  bool any_metrics = false;
  bool config_seen = false;
};

void LoadInto(const fs::path& root, RunData* run, LoadState* ls) {
  std::map<int, LearnerTrace>* traces = &ls->traces;
  if (!ls->config_seen && fs::exists(root / "config.yaml")) {
    ls->config_seen = true;
    ReadConfig(root / "config.yaml", run);
  }
  if (fs::exists(root / "metrics.jsonl")) {
    ls->any_metrics = true;
    ReadMetricsFile(root / "metrics.jsonl", 0, run, traces);
  }
  // A daemon job: learner-<i>.jsonl per learner (sorted so notes come in a stable order).
  static const std::regex kLearnerFile(R"(learner-(\d+)\.jsonl)");
  std::vector<std::pair<int, fs::path>> learner_files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, kLearnerFile)) learner_files.push_back({std::stoi(m[1].str()), entry.path()});
  }
  std::sort(learner_files.begin(), learner_files.end());
  for (const auto& [index, path] : learner_files) {
    ls->any_metrics = true;
    ReadMetricsFile(path, index, run, traces);
  }

  // The merge tape: the rotated part first.
  for (const char* name : {"events.log.1", "events.log"}) {
    if (!fs::exists(root / name)) continue;
    run->has_events_log = true;
    int bad = 0;
    ReadJsonLines(root / name, &run->notes, [&](const json& j) {
      if (!IsMergeLine(j)) return;
      MergeEvent e;
      if (Status st = MergeEventFromJson(j, name, &e); st.ok()) run->merges.push_back(RecordOf(e));
      else if (++bad <= kMaxNotesPerFile) run->notes.push_back(st.message());
    });
  }
}

void FinishLoading(LoadState* ls, RunData* run) {
  const bool any_metrics = ls->any_metrics;
  if (!ls->config_seen) run->notes.push_back("config.yaml: missing (mode and learners taken from the metrics)");
  if (!any_metrics) run->notes.push_back("metrics.jsonl (or learner-<i>.jsonl): missing, no training curves");
  for (auto& [learner, trace] : ls->traces) run->traces.push_back(std::move(trace));
  if (run->learners <= 0) run->learners = static_cast<int>(run->traces.size());
  if (any_metrics && !run->summary.present) {
    run->notes.push_back("no summary line in the metrics (the run is still going, or stopped early)");
  }
  // Without an eval line (older daemon jobs): the summary's final loss at its step.
  if (run->evals.empty() && std::isfinite(run->summary.final_val_loss) && std::isfinite(run->summary.steps))
    run->evals.push_back({static_cast<long>(run->summary.steps), run->summary.final_val_loss});
  // The parts' tapes as one (a sharded job's shards each keep their own): in time order.
  std::stable_sort(run->merges.begin(), run->merges.end(),
                   [](const MergeRecord& a, const MergeRecord& b) { return a.time_ms < b.time_ms; });
  DeriveWallTime(run);
}

}  // namespace

double RunData::TokensPerStep() const {
  if (std::isfinite(summary.tokens) && std::isfinite(summary.steps) && summary.steps > 0)
    return summary.tokens / summary.steps;
  for (const LearnerTrace& t : traces) {
    if (!t.points.empty() && t.points.back().step > 0 && std::isfinite(t.points.back().tokens))
      return t.points.back().tokens / t.points.back().step;
  }
  return kMissing;
}

Status LoadRunParts(const std::vector<std::string>& dirs, const std::string& label, RunData* out) {
  if (dirs.empty()) return Status::Error("no run directory given");
  std::error_code ec;
  for (const std::string& dir : dirs) {
    if (!fs::is_directory(dir, ec)) {
      return Status::Error("run directory '" + dir + "' does not exist; pass a directory written by dilococtl train");
    }
  }
  *out = RunData{};
  out->dir = dirs[0];
  out->label = label;
  if (out->label.empty()) {
    fs::path p = fs::path(dirs[0]).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    out->label = p.filename().string();
  }
  // Odd input must give a partial report, never a crash.
  LoadState ls;
  try {
    for (const std::string& dir : dirs) LoadInto(dir, out, &ls);
    FinishLoading(&ls, out);
  } catch (const std::exception& e) {
    out->notes.push_back(std::string("loading stopped early: ") + e.what());
  }
  return Status::Ok();
}

Status LoadRunDir(const std::string& dir, const std::string& label, RunData* out) {
  return LoadRunParts({dir}, label, out);
}

}  // namespace diloco
