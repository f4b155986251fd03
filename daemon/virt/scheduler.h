// The virtual clock (sync.clock: virtual): a discrete-event scheduler. Events run in order of
// their virtual time, ties in the order they were scheduled, one at a time on the caller's
// thread; nothing here reads the machine's clock, so the same events give the same run on any
// machine under any load.
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <unordered_map>
#include <utility>
#include <vector>

#include "daemon/sync/decide.h"  // SyncTime

namespace diloco {

class VirtualScheduler {
 public:
  using Event = std::function<void()>;
  // Virtual time 0 is this Unix time (2026-01-01T00:00:00Z): what envelopes and logs carry.
  static constexpr int64_t kEpochUnixMs = 1767225600000;

  int64_t now_ns() const { return now_ns_; }
  // The same instant as the time type the cores use (a steady_clock time point counted from 0).
  SyncTime now() const { return ToSyncTime(now_ns_); }
  int64_t unix_ms() const { return kEpochUnixMs + now_ns_ / 1000000; }
  static SyncTime ToSyncTime(int64_t ns) { return SyncTime(std::chrono::nanoseconds(ns)); }
  static int64_t ToNs(SyncTime t) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  }

  // Runs `event` at t_ns (not before now: an earlier time runs now, after what is due now).
  // Returns an id for Cancel.
  uint64_t At(int64_t t_ns, Event event);
  uint64_t After(int64_t delay_ns, Event event) { return At(now_ns_ + delay_ns, std::move(event)); }
  void Cancel(uint64_t id);

  // Runs the next event (time moves to it); false when none is left.
  bool RunNext();
  bool empty() const { return events_.empty(); }
  // The time of the next event (now when none).
  int64_t next_ns() const;
  uint64_t events_run() const { return events_run_; }

 private:
  int64_t now_ns_ = 0;
  uint64_t next_id_ = 0;
  uint64_t events_run_ = 0;
  // (time, id), earliest first: id breaks ties in the order scheduled. A cancelled event's entry
  // stays until it comes up and is skipped (its id is no longer in events_).
  using Entry = std::pair<int64_t, uint64_t>;
  mutable std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue_;
  std::unordered_map<uint64_t, Event> events_;  // id -> what to run, while scheduled
  void SkipCancelled() const;
};

}  // namespace diloco
