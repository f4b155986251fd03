#include "daemon/control/job_store.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>

#include "daemon/util/atomic_file.h"

namespace diloco {
namespace {
namespace fs = std::filesystem;
constexpr const char* kStateNames[] = {"pending", "running", "completed", "failed", "stopped"};
}  // namespace

const char* ToString(JobState s) { return kStateNames[static_cast<int>(s)]; }

bool ParseJobState(const std::string& text, JobState* out) {
  for (int i = 0; i < 5; i++) {
    if (text == kStateNames[i]) {
      *out = static_cast<JobState>(i);
      return true;
    }
  }
  return false;
}

bool IsJobId(const std::string& id) {
  if (id.empty() || id.size() > 64 || id[0] == '.') return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

nlohmann::json JobRecordToJson(const JobRecord& r) {
  nlohmann::json roles = nlohmann::json::object();
  for (const auto& [name, role] : r.roles) {
    nlohmann::json j = {{"state", ToString(role.state)}};
    if (!role.error.empty()) j["error"] = role.error;
    if (!role.result.is_null()) j["result"] = role.result;
    roles[name] = j;
  }
  nlohmann::json j = {{"id", r.id},
                      {"state", ToString(r.state)},
                      {"submitted_to", r.submitted_to},
                      {"created_ms", r.created_ms},
                      {"updated_ms", r.updated_ms},
                      {"roles", roles}};
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

Status JobRecordFromJson(const nlohmann::json& j, JobRecord* out) {
  try {
    JobRecord r;
    r.id = j.at("id").get<std::string>();
    if (!ParseJobState(j.at("state").get<std::string>(), &r.state)) return Status::Error("unknown job state");
    r.submitted_to = j.value("submitted_to", "");
    r.created_ms = j.value("created_ms", int64_t{0});
    r.updated_ms = j.value("updated_ms", int64_t{0});
    r.error = j.value("error", "");
    const nlohmann::json roles = j.value("roles", nlohmann::json::object());
    for (const auto& [name, rj] : roles.items()) {
      RoleRecord role;
      if (!ParseJobState(rj.at("state").get<std::string>(), &role.state)) return Status::Error("unknown role state");
      role.error = rj.value("error", "");
      if (rj.contains("result")) role.result = rj["result"];
      r.roles[name] = role;
    }
    *out = std::move(r);
    return Status::Ok();
  } catch (const std::exception& e) {
    return Status::Error(std::string("malformed job state: ") + e.what());
  }
}

JobStore::JobStore(std::string state_dir) : jobs_dir_((fs::path(state_dir) / "jobs").string()) {}

std::string JobStore::NewId() const {
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", std::gmtime(&now));
  std::random_device rd;
  for (;;) {
    char suffix[8];
    std::snprintf(suffix, sizeof suffix, "%04x", rd() & 0xffff);
    const std::string id = std::string(stamp) + "-" + suffix;
    if (!Exists(id)) return id;
  }
}

bool JobStore::Exists(const std::string& id) const { return IsJobId(id) && fs::exists(JobDir(id)); }
std::string JobStore::JobDir(const std::string& id) const { return (fs::path(jobs_dir_) / id).string(); }
std::string JobStore::RunDir(const std::string& id) const { return (fs::path(jobs_dir_) / id / "run").string(); }

Status JobStore::Create(const JobRecord& record, const std::string& config_yaml) {
  if (!IsJobId(record.id)) return Status::Error("'" + record.id + "' is not a job id");
  std::error_code ec;
  if (fs::exists(JobDir(record.id))) return Status::Error("job " + record.id + " exists already on this site");
  fs::create_directories(RunDir(record.id), ec);
  if (ec) return Status::Error("cannot create " + RunDir(record.id) + ": " + ec.message());
  DL_RETURN_IF_ERROR(
      WriteFileAtomically(ConfigPath(record.id), {{config_yaml.data(), config_yaml.size()}}, "job config"));
  return Save(record);
}

Status JobStore::Save(JobRecord record) {
  record.updated_ms = UnixMsNow();
  // Invalid UTF-8 (an error naming a path with byte 0xff, say) is stored as U+FFFD, not thrown.
  const std::string text = JobRecordToJson(record).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  return WriteFileAtomically(JobDir(record.id) + "/state.json", {{text.data(), text.size()}}, "job state");
}

Status JobStore::Load(const std::string& id, JobRecord* out) const {
  if (!IsJobId(id)) return Status::NotFound("'" + id + "' is not a job id");
  if (!Exists(id)) return Status::NotFound("no job '" + id + "' in " + jobs_dir_);
  std::string text;
  DL_RETURN_IF_ERROR(ReadWholeFile(JobDir(id) + "/state.json", "job state", &text));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return Status::Error(JobDir(id) + "/state.json is not JSON");
  return JobRecordFromJson(j, out).WithContext(JobDir(id) + "/state.json");
}

std::vector<std::string> JobStore::List() const {
  std::vector<std::string> ids;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(jobs_dir_, ec)) {
    const std::string id = e.path().filename().string();
    if (e.is_directory() && IsJobId(id) && fs::exists(e.path() / "state.json")) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

void JobStore::AppendLog(const std::string& id, const std::string& line) const {
  // Bounded: past kMaxJobLogBytes the log moves to job.log.1 (replacing the one before).
  std::error_code ec;
  if (fs::file_size(LogPath(id), ec) > kMaxJobLogBytes && !ec) fs::rename(LogPath(id), LogPath(id) + ".1", ec);
  std::ofstream f(LogPath(id), std::ios::app);
  const std::time_t now = std::time(nullptr);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  f << stamp << " " << line << "\n";
}

}  // namespace diloco
