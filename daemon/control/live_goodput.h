// Goodput and uptime of a daemon job as its syncer sees it, while it runs (sync/goodput.h has
// the definitions). Local mode accounts from every learner's own records; in daemon mode the
// learners run on other sites, so the syncer's site accounts from what reaches it:
//   merges and dropped deltas   its events.log, read as it grows (MergeTapeReader)
//   the run's start             the syncer's start (the learners start with it; their start-up
//                               counts as time not spent training)
//   a learner's nominal rate    the best rate its heartbeats reported (each: its tokens over the
//                               time of its steps so far, so this is its fault-free pace; a
//                               learner slowed by its config counts at its slowed pace)
//   down                        from the last time a learner was heard until it is heard again,
//                               when it was declared dead meanwhile (no heartbeat within
//                               sync.heartbeat_timeout_ms) or came back as a new incarnation
//                               (restarted sooner than the timeout)
//   idle                        a learner that finished while the run goes on
// Not seen from here, so not in its waste: time blocked at a barrier, work a learner's fold
// discarded, and unsent work lost with a killed learner (its down time is).
// Observe is called about every 200 ms from the daemon's loop; Report from any thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/sync/goodput.h"
#include "daemon/sync/syncer.h"

namespace diloco {

struct LiveGoodputOptions {
  int learners = 0;
  std::vector<double> fragment_weights;  // numel shares, sum 1
  double tokens_per_step = 0;            // per learner step (ranks x batch x block)
  int inner_steps = 1;                   // H: a fragment's merge cadence in steps
  std::string events_path;               // the syncer's events.log
  int64_t start_unix_ms = 0;             // the run's start
};

class LiveGoodput {
 public:
  explicit LiveGoodput(LiveGoodputOptions options);

  void Observe(const SyncerStatusSnapshot& status, int64_t now_unix_ms);
  // So far (wall time up to now_unix_ms). An error until a learner has reported its rate, or
  // when events.log is damaged.
  Status Report(int64_t now_unix_ms, GoodputReport* out);

 private:
  struct Learner {
    bool heard = false;
    uint64_t incarnation = 0;
    int64_t last_heard_ms = 0;
    double best_tokens_per_s = 0;       // best heartbeat rate seen
    int64_t down_since_ms = -1;         // open down span
    int64_t finished_ms = -1;           // done with its steps
    std::vector<std::pair<int64_t, int64_t>> down;  // closed down spans
  };

  const LiveGoodputOptions options_;
  std::mutex mu_;
  std::vector<Learner> learners_;
  MergeTapeReader tape_;
  std::vector<MergedDelta> merged_;
  std::vector<LostDelta> lost_;
};

}  // namespace diloco
