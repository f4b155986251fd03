// What a site refuses at submit before anything starts.
#include <catch2/catch.hpp>

#include "daemon/control/job_limits.h"

namespace diloco {

TEST_CASE("a daemon job in ddp mode or on the virtual clock is refused with what to run instead", "[control]") {
  RunConfig cfg;
  cfg.sync.learners = 2;
  cfg.sync.mode = SyncMode::kDecoupled;
  CHECK(CheckDaemonCanRun(cfg, "job.yaml").ok());
  cfg.sync.mode = SyncMode::kDdp;
  Status st = CheckDaemonCanRun(cfg, "job.yaml");
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().find("job.yaml: sync.mode ddp") == 0);
  CHECK(st.message().find("dilococtl train") != std::string::npos);
  cfg.sync.mode = SyncMode::kDiloco;
  cfg.sync.clock = ClockSource::kVirtual;
  st = CheckDaemonCanRun(cfg, "job.yaml");
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().find("sync.clock virtual") != std::string::npos);
}

}  // namespace diloco
