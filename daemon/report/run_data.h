// One run directory (as `dilococtl train` or a daemon job writes it) loaded into plain
// structs for `dilococtl report`. Loading is forgiving: a missing file, a bad or truncated
// JSON line becomes a note naming the file and line, and the rest still loads. Only a
// directory that does not exist is an error.
//
// Read: config.yaml (mode, learners), metrics.jsonl (the run's lines: start, chaos,
// learner_done, eval, summary; a daemon job's at its syncer's site), learner-<i>.jsonl
// (each learner's lines) and the syncer's merge tape events.log.1 then events.log
// (daemon/sync/event_log.h): one layout for local, virtual and daemon runs.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "daemon/util/status.h"

namespace diloco {

constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();

// One learner metrics line (every train.log_every steps).
struct MetricPoint {
  long step = 0;  // that learner's steps so far
  double loss = kMissing;
  double tokens = kMissing;    // that learner's tokens so far
  double step_ms = kMissing;   // the last step's duration
  double bytes_up = kMissing;  // cumulative, that learner
  double bytes_down = kMissing;
  int64_t time_ms = 0;       // Unix ms when logged; 0: not in the line (older runs)
  double wall_s = kMissing;  // seconds since the run's start (derived, see RunData)
};

struct LearnerTrace {
  int learner = 0;
  std::vector<MetricPoint> points;  // in file order
};

struct EvalPoint {
  long step = 0;  // as logged: the run's total learner steps
  double val_loss = kMissing;
};

struct MergeRecord {
  int64_t time_ms = 0;
  double wall_s = kMissing;  // seconds since the run's start (derived)
  int fragment = 0;
  long version = 0;
  std::string reason;
  std::vector<long> staleness;  // one per contributor
};

// The final {"event":"summary"} line; kMissing where a field is absent.
struct RunSummary {
  bool present = false;
  double final_val_loss = kMissing, goodput = kMissing, uptime = kMissing;
  double final_val_batches = kMissing;  // the validation batches behind final_val_loss
  double tokens = kMissing, steps = kMissing, outer_steps = kMissing;
  double bytes_up = kMissing, bytes_down = kMissing, wall_s = kMissing;
};

struct RunData {
  std::string dir;
  std::string label;
  std::string mode;  // sync.mode; "" if unknown
  int learners = 0;
  std::vector<LearnerTrace> traces;  // sorted by learner
  double initial_val_loss = kMissing;
  std::vector<EvalPoint> evals;
  std::vector<MergeRecord> merges;  // in tape order; empty without events.log
  bool has_events_log = false;
  RunSummary summary;
  // How MetricPoint::wall_s was found: from time_ms, or summed step_ms (compute only).
  bool wall_from_timestamps = false;
  std::vector<std::string> notes;  // damaged or missing inputs, for the page

  // Tokens per learner step (to place evals, logged by total steps, on a tokens axis).
  double TokensPerStep() const;
};

// Loads one run kept in several directories into *out: a daemon job's site run
// directories (each holds its learners' learner-<i>.jsonl, the syncer's site the merge
// tape and the job's metrics.jsonl). The label
// defaults to the first directory's name. Fails only when a directory does not exist.
Status LoadRunParts(const std::vector<std::string>& dirs, const std::string& label, RunData* out);

// Loads dir into *out (label: the directory's name unless given). Fails only when dir
// is not a directory; everything else lands in out->notes.
Status LoadRunDir(const std::string& dir, const std::string& label, RunData* out);

}  // namespace diloco
