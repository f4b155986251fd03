// Goodput and uptime of a daemon job as its syncer sees it, while it runs (sync/goodput.h has
// the definitions). Local mode accounts from every learner's own records; in daemon mode the
// learners run on other sites, so the syncer's site accounts from what reaches it:
//   merges and dropped deltas   the syncer's merge tape (merge_tape.h: each merge handed over as
//                               it is made; a resumed syncer's tape starts from its events.log)
//   the run's start             the syncer's start (the learners start with it; their start-up
//                               counts as time not spent training)
//   a learner's nominal rate    NominalTokensPerS (sync/goodput.h) over its incarnations, as local
//                               mode counts it: each incarnation's latest heartbeat carries its
//                               tokens and its nominal rate (so its provisioned time)
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
#include "daemon/sync/merge_tape.h"
#include "daemon/sync/syncer.h"

namespace diloco {

struct LiveGoodputOptions {
  int learners = 0;
  std::vector<double> fragment_weights;  // numel shares, sum 1
  double tokens_per_step = 0;            // per learner step (ranks x batch x block)
  int inner_steps = 1;                   // H: a fragment's merge cadence in steps
  const MergeTape* merges = nullptr;     // the syncer's; outlives this
  int64_t start_unix_ms = 0;             // the run's start
};

class LiveGoodput {
 public:
  explicit LiveGoodput(LiveGoodputOptions options);

  void Observe(const SyncerStatusSnapshot& status, int64_t now_unix_ms);
  // So far (wall time up to now_unix_ms). An error until a learner has reported its rate.
  Status Report(int64_t now_unix_ms, GoodputReport* out);

 private:
  struct Learner {
    bool heard = false;
    uint64_t incarnation = 0;
    int64_t last_heard_ms = 0;
    // Tokens and provisioned time of the incarnations before this one, and of this one so far.
    double past_tokens = 0, past_provisioned_s = 0;
    double tokens = 0, provisioned_s = 0;
    int64_t down_since_ms = -1;         // open down span
    int64_t finished_ms = -1;           // done with its steps
    std::vector<std::pair<int64_t, int64_t>> down;  // closed down spans
  };

  const LiveGoodputOptions options_;
  std::mutex mu_;
  std::vector<Learner> learners_;
};

}  // namespace diloco
