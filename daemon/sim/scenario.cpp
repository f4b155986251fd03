#include "daemon/sim/scenario.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

namespace diloco {
namespace {

namespace fs = std::filesystem;

std::string Where(const std::string& path, const YAML::Node& node) {
  const YAML::Mark m = node.Mark();
  return path + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1);
}

}  // namespace

Status ReadMergeBench(const std::string& path, double* merge_gbps) {
  std::ifstream in(path);
  const std::string what = "merge_bench '" + path + "'";
  const std::string bench = " (the output of `dilococtl bench syncer --json`)";
  if (!in) return Status::Error(what + " cannot be read (write it with `dilococtl bench syncer --json > FILE`)");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    return Status::Error(what + " is not one JSON object" + bench + ": " + e.what());
  }
  if (!j.is_object() || !j.contains("merge_GBps")) {
    return Status::Error(what + " has no field merge_GBps" + bench);
  }
  const nlohmann::json& v = j["merge_GBps"];
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0) {
    return Status::Error(what + ": merge_GBps must be a number > 0, not " + v.dump());
  }
  *merge_gbps = v.get<double>();
  return Status::Ok();
}

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
      {"wan_window_s", {&s.wan_window_s, 0, true}},
  };
  auto is_scenario_key = [&](const std::string& key) {
    return numbers.count(key) > 0 || key == "balanced_fragments" || key == "merge_bench";
  };
  // One scenario key: where names it in errors, base is the directory a relative path is in
  // (empty: the working directory).
  auto apply = [&](const std::string& key, const YAML::Node& v, const std::string& where,
                   const fs::path& base) -> Status {
    if (key == "balanced_fragments") {
      bool b = true;
      try {
        b = v.as<bool>();
      } catch (const YAML::Exception&) {
        return Status::Error(where + ": balanced_fragments must be true or false");
      }
      s.balanced_fragments = b;
      return Status::Ok();
    }
    if (key == "merge_bench") {
      if (!v.IsScalar() || v.as<std::string>().empty()) {
        return Status::Error(where + ": merge_bench: the path of a `dilococtl bench syncer --json` output");
      }
      const fs::path file = fs::path(v.as<std::string>()).is_absolute() ? fs::path(v.as<std::string>())
                                                                        : base / v.as<std::string>();
      DL_RETURN_IF_ERROR(ReadMergeBench(file.string(), &s.merge_gbps).WithContext(where));
      s.merge_gbps_source = file.string();
      return Status::Ok();
    }
    const NumberKey& nk = numbers.at(key);
    double x = 0;
    try {
      x = v.as<double>();
    } catch (const YAML::Exception&) {
      return Status::Error(where + ": " + key + " must be a number");
    }
    if (!std::isfinite(x) || x < nk.min || (!nk.min_ok && x == nk.min)) {
      return Status::Error(where + ": " + key + " must be " + (nk.min_ok ? ">= " : "> ") +
                           std::to_string(nk.min).substr(0, std::to_string(nk.min).find('.')));
    }
    *nk.field = x;
    if (key == "merge_gbps") s.merge_gbps_source = where.rfind("--set", 0) == 0 ? "--set" : "scenario";
    return Status::Ok();
  };
  std::string run_path;
  std::vector<std::string> overrides;
  bool file_merge_gbps = false, file_merge_bench = false;
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
    if (!is_scenario_key(key)) {
      return Status::Error(Where(path, kv.first) + ": unknown key '" + key +
                           "' (keys: run, set, and the others in daemon/sim/scenario.h)");
    }
    file_merge_gbps = file_merge_gbps || key == "merge_gbps";
    file_merge_bench = file_merge_bench || key == "merge_bench";
    if (file_merge_gbps && file_merge_bench) {
      return Status::Error(Where(path, kv.first) + ": give merge_gbps or merge_bench, not both");
    }
    DL_RETURN_IF_ERROR(apply(key, v, Where(path, v), fs::path(path).parent_path()));
  }
  if (run_path.empty()) return Status::Error(path + ": `run: RUN_CONFIG` is required (the model and sync settings)");
  // The command line's overrides: scenario keys here (after the file's), the rest for the run config.
  for (const std::string& o : run_overrides) {
    const size_t eq = o.find('=');
    const std::string key = o.substr(0, eq);
    if (eq == std::string::npos || !is_scenario_key(key)) {
      overrides.push_back(o);
      continue;
    }
    YAML::Node v;
    try {
      v = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      return Status::Error("--set " + o + ": not a valid value: " + e.msg);
    }
    DL_RETURN_IF_ERROR(apply(key, v, "--set " + o, fs::path()));  // a path as given: from the working directory
  }
  const fs::path run_file = fs::path(run_path).is_absolute() ? fs::path(run_path) : fs::path(path).parent_path() / run_path;
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
