#include "daemon/report/job_report.h"

#include <algorithm>
#include <filesystem>

namespace diloco {

namespace fs = std::filesystem;

std::vector<std::string> JobRunDirs(const nlohmann::json& status, std::vector<std::string>* unreachable) {
  std::vector<std::string> sites;
  if (status.contains("syncer_site") && status["syncer_site"].is_string()) sites.push_back(status["syncer_site"]);
  // The other syncer shards' sites: each holds its shard's merge tape.
  if (status.contains("shards") && status["shards"].is_array()) {
    for (const nlohmann::json& s : status["shards"])
      if (s.is_object() && s.contains("site") && s["site"].is_string()) sites.push_back(s["site"]);
  }
  if (status.contains("learners") && status["learners"].is_array()) {
    for (const nlohmann::json& l : status["learners"]) {
      if (l.is_object() && l.contains("site") && l["site"].is_string()) sites.push_back(l["site"]);
    }
  }
  std::vector<std::string> dirs;
  for (size_t i = 0; i < sites.size(); ++i) {
    const std::string& site = sites[i];
    if (std::find(sites.begin(), sites.begin() + i, site) != sites.begin() + i) continue;  // once per site
    std::string dir;
    const nlohmann::json view = status.contains("sites") ? status["sites"].value(site, nlohmann::json::object())
                                                          : nlohmann::json::object();
    if (view.is_object() && view.contains("run_dir") && view["run_dir"].is_string()) dir = view["run_dir"];
    std::error_code ec;
    if (!dir.empty() && fs::is_directory(dir, ec)) {
      dirs.push_back(dir);
    } else if (unreachable) {
      unreachable->push_back(site + ": " + (dir.empty() ? "run directory unknown (site unreachable)" : dir));
    }
  }
  return dirs;
}

Status LoadJobRun(const nlohmann::json& status, const std::string& label, RunData* out) {
  const std::string job = status.value("id", "?");
  std::vector<std::string> unreachable;
  const std::vector<std::string> dirs = JobRunDirs(status, &unreachable);
  if (dirs.empty()) {
    return Status::Error("job " + job + ": none of its run directories is on this machine (" +
                         (unreachable.empty() ? std::string("no sites in its status") : unreachable[0]) +
                         "); copy them here and pass them as DIR,DIR,...");
  }
  DL_RETURN_IF_ERROR(LoadRunParts(dirs, label.empty() ? job : label, out));
  for (const std::string& u : unreachable) {
    out->notes.push_back("site " + u + " is not readable here: the curves of its learners are missing");
  }
  return Status::Ok();
}

std::string DefaultJobReportPath(const std::string& job_id) { return "report-" + job_id + ".html"; }

}  // namespace diloco
