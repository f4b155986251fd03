// The syncer's merge tape: one JSON line per merge in the run's events.log,
// enough to replay who moved the global model, by how much and why (keys
// come out sorted; shown here in reading order):
//
//   {"event":"merge","time_ms":1767225600123,"fragment":2,"version":17,
//    "reason":"grace_expired","grace_ms":412.5,"delta_norm":0.031,"update_norm":0.052,
//    "contributors":[{"learner":0,"weight":0.61,"staleness":0,"base_version":16,
//                     "tokens":9216,"steps":12,"learner_step":48}, ...],
//    "skipped":[{"learner":3,"why":"too_stale","detail":"base 11, current 16"}]}
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/util/jsonl_writer.h"
#include "daemon/util/status.h"

namespace diloco {

struct MergeContributor {
  int learner = 0;
  double weight = 0;       // normalized
  uint64_t staleness = 0;  // versions between its base and the merged-into version
  uint64_t base_version = 0;
  double tokens = 0;  // c_tokens
  double steps = 0;   // c_steps
  uint64_t learner_step = 0;  // the learner's step when it sent the delta
};

// A delta that arrived for this round but was not merged.
struct SkippedDelta {
  int learner = 0;
  std::string why;     // "too_stale", "from_the_future", "non_finite", "norm_too_large"
  std::string detail;  // numbers, for a human
  double tokens = 0;   // its c_tokens: the work that did not reach the global model
};

struct MergeEvent {
  int64_t time_ms = 0;  // wall clock, ms since the Unix epoch (the caller's clock)
  int fragment = 0;
  uint64_t version = 0;  // the version this merge produced
  std::string reason;    // why the round closed (ToString(DecideReason))
  double grace_ms = 0;
  double delta_norm = 0;   // |merged Δ|
  double update_norm = 0;  // |Θ_new − Θ_old|
  std::vector<MergeContributor> contributors;
  std::vector<SkippedDelta> skipped;
};

nlohmann::json MergeEventToJson(const MergeEvent& event);

// The one reader of a merge line (every reader of events.log goes through it). Needs time_ms,
// fragment and contributors (each with learner and tokens); a field missing otherwise reads as 0 or
// empty. where: names the line in the error.
bool IsMergeLine(const nlohmann::json& line);
Status MergeEventFromJson(const nlohmann::json& line, const std::string& where, MergeEvent* out);

// Every merge in an events.log, its rotated part (<path>.1) first. Other events are skipped, and
// so is an unparsable last line (the syncer may be writing it); any other bad line is an error
// that names it. missing_ok: a log not there holds no merge (else an error).
Status ReadEventLog(const std::string& path, bool missing_ok, std::vector<MergeEvent>* out);

// events.log is rotated at this size (events.log.1 keeps the previous part): a merge line is a
// few hundred bytes, so each part holds about 100k merges.
constexpr int64_t kEventsLogRotateBytes = int64_t{64} << 20;

class EventLog {
 public:
  // Appends; past rotate_bytes the file moves to <path>.1 and a new one begins.
  Status Open(const std::string& path, int64_t rotate_bytes = kEventsLogRotateBytes) { return writer_.Open(path, rotate_bytes); }
  Status Append(const MergeEvent& event) { return writer_.Write(MergeEventToJson(event)); }

 private:
  JsonlWriter writer_;
};

}  // namespace diloco
