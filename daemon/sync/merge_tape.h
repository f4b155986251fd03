// A run's merges, kept in memory as the syncer makes them: what the run's goodput is accounted
// from (sync/goodput.h) and the merge statistics a job's status shows. The syncer hands each
// merge over (SyncerOptions::on_merge) as it appends it to events.log, so nobody reads the log
// back while the run goes on. A syncer resumed from its run directory (a daemon restart) starts
// the tape from the merges already in events.log (Load), so the job's accounts keep them.
//
// Thread-safe: the syncer's thread adds, any thread reads.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/sync/event_log.h"
#include "daemon/sync/goodput.h"
#include "daemon/util/status.h"

namespace diloco {

class MergeTape {
 public:
  void Add(const MergeEvent& event);
  // The merges in an existing events.log (and its rotated part); a missing file holds none.
  Status Load(const std::string& events_path);
  // A listener for SyncerOptions::on_merge; the tape must outlive the syncer.
  std::function<void(const MergeEvent&)> Listener();

  size_t merges() const;
  // Goodput records (GoodputRecordsOf) of every merge so far, times relative to run_start_unix_ms.
  void GoodputRecords(int64_t run_start_unix_ms, std::vector<MergedDelta>* merged, std::vector<LostDelta>* lost) const;
  // Adds "last_merge", "merge_reasons" and "staleness" {sum, count, max} to *out; nothing before
  // the first merge.
  void AddStatsTo(nlohmann::json* out) const;

 private:
  // One goodput record, in absolute time so the reader picks the run's start.
  struct Record {
    int64_t time_ms = 0;
    int fragment = 0;
    int learner = 0;
    double tokens = 0;
    bool dropped = false;  // else merged
  };

  mutable std::mutex mu_;
  std::vector<Record> records_;
  size_t merges_ = 0;
  std::map<std::string, uint64_t> reasons_;
  double staleness_sum_ = 0, staleness_max_ = 0;
  uint64_t contributions_ = 0;
  nlohmann::json last_;
};

}  // namespace diloco
