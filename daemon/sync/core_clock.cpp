#include "daemon/sync/core_clock.h"

#include <chrono>

namespace diloco {

namespace {

class WallCoreClock final : public CoreClock {
 public:
  SyncTime Now() override { return SyncClock::now(); }
  int64_t UnixMs() override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace

CoreClock& WallClock() {
  static WallCoreClock clock;  // stateless: safe from any thread
  return clock;
}

}  // namespace diloco
