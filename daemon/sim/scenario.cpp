#include "daemon/sim/scenario.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <map>

namespace diloco {
namespace {

namespace fs = std::filesystem;

std::string Where(const std::string& path, const YAML::Node& node) {
  const YAML::Mark m = node.Mark();
  return path + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

}  // namespace

Status LoadScenario(const std::string& path, const std::vector<std::string>& run_overrides, Scenario* out) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return Status::Error("scenario '" + path + "' cannot be read");
  } catch (const YAML::Exception& e) {
    return Status::Error(path + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
  }
  if (!root.IsMap()) return Status::Error(path + ": a scenario is a YAML mapping (see configs/simulate/)");
  Scenario s;
  s.path = path;
  // Number keys: name -> (field, minimum allowed, whether the minimum itself is allowed).
  struct NumberKey {
    double* field;
    double min;
    bool min_ok;
  };
  double stragglers = 0, elastic_slices = s.elastic_slices, seed = 1;
  const std::map<std::string, NumberKey> numbers = {
      {"chips", {&s.chips, 1, true}},
      {"hours", {&s.hours, 0, true}},
      {"seed", {&seed, 0, true}},
      {"step_s", {&s.step_s, 0, false}},
      {"step_jitter", {&s.step_jitter, 0, true}},
      {"chip_mtbf_h", {&s.chip_mtbf_h, 0, true}},
      {"detect_s", {&s.detect_s, 0, true}},
      {"restart_s", {&s.restart_s, 0, true}},
      {"rejoin_s", {&s.rejoin_s, 0, true}},
      {"stragglers", {&stragglers, 0, true}},
      {"straggler_factor", {&s.straggler_factor, 1, true}},
      {"checkpoint_every_s", {&s.checkpoint_every_s, 0, false}},
      {"elastic_slices", {&elastic_slices, 1, true}},
      {"reconfigure_s", {&s.reconfigure_s, 0, true}},
      {"merge_gbps", {&s.merge_gbps, 0, false}},
      {"wan_gbps", {&s.wan_gbps, 0, false}},
      {"wan_latency_ms", {&s.wan_latency_ms, 0, true}},
      {"heartbeat_s", {&s.heartbeat_s, 0, false}},
  };
  std::string run_path;
  std::vector<std::string> overrides;
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    if (key == "run") {
      if (!v.IsScalar()) return Status::Error(Where(path, v) + ": run: the path of a run config");
      run_path = v.as<std::string>();
      continue;
    }
    if (key == "set") {
      if (!v.IsSequence()) return Status::Error(Where(path, v) + ": set: a list of key=value overrides");
      for (const auto& o : v) overrides.push_back(o.as<std::string>());
      continue;
    }
    auto it = numbers.find(key);
    if (it == numbers.end()) {
      return Status::Error(Where(path, kv.first) + ": unknown key '" + key +
                           "' (keys: run, set, and the numbers in daemon/sim/scenario.h)");
    }
    double x = 0;
    try {
      x = v.as<double>();
    } catch (const YAML::Exception&) {
      return Status::Error(Where(path, v) + ": " + key + " must be a number");
    }
    const NumberKey& nk = it->second;
    if (!std::isfinite(x) || x < nk.min || (!nk.min_ok && x == nk.min)) {
      return Status::Error(Where(path, v) + ": " + key + " must be " + (nk.min_ok ? ">= " : "> ") +
                           std::to_string(nk.min).substr(0, std::to_string(nk.min).find('.')));
    }
    *nk.field = x;
  }
  if (run_path.empty()) return Status::Error(path + ": `run: RUN_CONFIG` is required (the model and sync settings)");
  const fs::path run_file = fs::path(run_path).is_absolute() ? fs::path(run_path) : fs::path(path).parent_path() / run_path;
  for (const std::string& o : run_overrides) overrides.push_back(o);
  DL_RETURN_IF_ERROR(LoadRunConfig(run_file.string(), overrides, &s.run).WithContext("scenario " + path));
  s.stragglers = (int)stragglers;
  s.elastic_slices = (int)elastic_slices;
  s.seed = (uint64_t)seed;
  if (s.stragglers > s.run.sync.learners) {
    return Status::Error(path + ": stragglers (" + std::to_string(s.stragglers) + ") exceeds sync.learners (" +
                         std::to_string(s.run.sync.learners) + ")");
  }
  *out = std::move(s);
  return Status::Ok();
}

}  // namespace diloco
