// Small helpers shared by the YAML config readers (run_config.cpp, daemon_config.cpp): how a
// node is described in a message, where it is ("file:line:col"), and "did you mean" hints.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace diloco::config_internal {

// "a, b, c".
std::string Join(const std::vector<std::string>& items);

// "; did you mean 'x'?" when some candidate is a near miss (within 2 edits), else "".
std::string DidYouMean(const std::string& name, const std::vector<std::string>& candidates);

// "a mapping", "a sequence", "'text'" or "an empty value".
std::string Describe(const YAML::Node& node);

// "source:line:col" (1-based), or just source when the mark is unknown.
std::string Where(const std::string& source, const YAML::Mark& mark);

// Absolute, lexically normal form of path; a relative path resolves against base (the current
// working directory when base is empty). "" stays "".
std::string ResolvePath(const std::string& path, const std::string& base);

// A scalar as a number, by one rule for every config file: decimal digits with an optional sign
// ('+' too, as YAML's core schema reads "+5"), the whole text; no hex, octal or digit separators.
// Integers have no decimal point or exponent and must fit; doubles may have both and must be
// finite. false leaves *out unspecified.
bool ParseInt(std::string_view text, int* out);
bool ParseUint64(std::string_view text, uint64_t* out);
bool ParseDouble(std::string_view text, double* out);

}  // namespace diloco::config_internal
