// Helpers shared by the run-config tests: parse text as "run.yaml" with
// relative paths resolved against /base/dir.
#pragma once

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "daemon/config/run_config.h"

namespace diloco::testing {

inline Status Parse(const std::string& text, const std::vector<std::string>& overrides, RunConfig* config) {
  return ParseRunConfig(text, "run.yaml", "/base/dir", overrides, config);
}

// The error message of parsing text; fails the test when parsing succeeds.
inline std::string ErrorOf(const std::string& text, const std::vector<std::string>& overrides = {}) {
  RunConfig config;
  Status status = Parse(text, overrides, &config);
  INFO(text);
  REQUIRE_FALSE(status.ok());
  return status.message();
}

// The smallest valid config.
inline const char* const kMinimal = "data:\n  corpus: corpus.txt\n";

}  // namespace diloco::testing
