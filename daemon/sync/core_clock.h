// The time a core sees (the syncer's and the learner's sans-IO cores): the steady clock and
// Unix milliseconds in a wall runtime, the scheduler's virtual time in the virtual one. A core
// reads time only through this, so the same events at the same times make it do the same thing.
#pragma once

#include <cstdint>

#include "daemon/sync/decide.h"

namespace diloco {

class CoreClock {
 public:
  virtual ~CoreClock() = default;
  virtual SyncTime Now() = 0;     // SyncTime is decide.h's steady_clock::time_point
  virtual int64_t UnixMs() = 0;   // envelope sent_unix_ms, event and metric times
};

// The wall clock (steady_clock::now(), system_clock).
CoreClock& WallClock();

}  // namespace diloco
