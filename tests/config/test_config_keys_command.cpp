// `dilococtl config keys` prints the key table as README shows it (the README test in
// test_run_config_keys.cpp compares README with the same text).
#include <catch2/catch.hpp>
#include <string>

#include "daemon/config/run_config.h"
#include "tests/apps/dilococtl_testing.h"
#include "tests/temp_dir.h"

namespace diloco {
namespace {

TEST_CASE("dilococtl config keys prints README's list of run-config keys", "[e2e][config]") {
  testing::TempDir dir;
  const testing::Result keys = testing::Dilococtl(dir.path(), "config keys");
  INFO(keys.err);
  CHECK(keys.exit_code == 0);
  CHECK(keys.out == RunConfigKeysMarkdown());
  CHECK_THAT(keys.out, Catch::Contains("| `timing.link.loss` | number | `0` | in [0, 1) |"));
  // `config` alone is a usage error.
  CHECK(testing::Dilococtl(dir.path(), "config").exit_code == 2);
}

}  // namespace
}  // namespace diloco
