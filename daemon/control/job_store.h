// A daemon's jobs on disk, so that none lives only in memory:
//   <state_dir>/jobs/<id>/job.yaml     the resolved run config (RunConfigToYaml)
//   <state_dir>/jobs/<id>/state.json   JobRecord, rewritten atomically on every change
//   <state_dir>/jobs/<id>/job.log      this daemon's log lines about the job (past 8 MiB it moves
//                                      to job.log.1, replacing the one before)
//   <state_dir>/jobs/<id>/run/         the run directory of the roles on this site
// States: pending -> running -> completed | failed | stopped. A job's roles on this site are
// "syncer" and "learner-<i>"; each has its own state and, once done, a result object.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/util/status.h"
#include "daemon/util/unix_time.h"

namespace diloco {

enum class JobState { kPending, kRunning, kCompleted, kFailed, kStopped };
const char* ToString(JobState s);
bool ParseJobState(const std::string& text, JobState* out);
inline bool IsFinal(JobState s) { return s == JobState::kCompleted || s == JobState::kFailed || s == JobState::kStopped; }

inline constexpr uintmax_t kMaxJobLogBytes = uintmax_t{8} << 20;

struct RoleRecord {
  JobState state = JobState::kPending;
  std::string error;
  nlohmann::json result;  // LearnerResult / SyncerResult fields once done
};

struct JobRecord {
  std::string id;
  JobState state = JobState::kPending;
  std::string submitted_to;  // the site whose daemon took the submit
  int64_t created_ms = 0;    // Unix ms
  int64_t updated_ms = 0;
  std::string error;
  std::map<std::string, RoleRecord> roles;  // "syncer", "learner-0", ... placed on this site
};

nlohmann::json JobRecordToJson(const JobRecord& r);
Status JobRecordFromJson(const nlohmann::json& j, JobRecord* out);

class JobStore {
 public:
  explicit JobStore(std::string state_dir);

  // A fresh id: <yyyymmdd>-<hhmmss>-<4 hex>.
  std::string NewId() const;
  bool Exists(const std::string& id) const;
  std::string JobDir(const std::string& id) const;
  std::string RunDir(const std::string& id) const;
  std::string ConfigPath(const std::string& id) const { return JobDir(id) + "/job.yaml"; }
  std::string LogPath(const std::string& id) const { return JobDir(id) + "/job.log"; }

  // Creates the job's directory with job.yaml and state.json (refuses an existing id).
  Status Create(const JobRecord& record, const std::string& config_yaml);
  Status Save(JobRecord record);  // updated_ms = now
  Status Load(const std::string& id, JobRecord* out) const;  // kNotFound: no such job
  // Every job, oldest first (by id).
  std::vector<std::string> List() const;
  // Appends "<time> <line>" to the job's job.log.
  void AppendLog(const std::string& id, const std::string& line) const;

 private:
  std::string jobs_dir_;
};

// Ids are the store's directory names: letters, digits, '-', '_', '.'.
bool IsJobId(const std::string& id);

}  // namespace diloco
