#include "daemon/config/yaml_helpers.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cctype>
#include <filesystem>

namespace diloco::config_internal {
namespace {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// from_chars over the whole of text, after an optional '+' (from_chars takes only '-'); a sign
// must be alone and followed by a digit or a '.', so "+-1", "-+1", "+" and "-" are not numbers.
template <typename T>
bool ParseWhole(std::string_view text, T* out) {
  const bool plus = !text.empty() && text[0] == '+';
  if (plus) text.remove_prefix(1);
  const bool minus = !text.empty() && text[0] == '-';
  if (plus && minus) return false;
  const size_t first = minus ? 1 : 0;
  if (text.size() <= first || !(std::isdigit(static_cast<unsigned char>(text[first])) || text[first] == '.')) {
    return false;
  }
  const char* end = text.data() + text.size();
  const auto result = std::from_chars(text.data(), end, *out);
  return result.ec == std::errc() && result.ptr == end;
}

}  // namespace

bool ParseInt(std::string_view text, int* out) { return ParseWhole(text, out); }

bool ParseUint64(std::string_view text, uint64_t* out) { return ParseWhole(text, out); }

bool ParseDouble(std::string_view text, double* out) { return ParseWhole(text, out) && std::isfinite(*out); }

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

std::string DidYouMean(const std::string& name, const std::vector<std::string>& candidates) {
  const std::string* best = nullptr;
  size_t best_distance = 3;  // suggest only within 2 edits, and fewer for short names
  for (const std::string& candidate : candidates) {
    size_t distance = EditDistance(name, candidate);
    if (distance < best_distance && 2 * distance <= name.size()) {
      best = &candidate;
      best_distance = distance;
    }
  }
  return best ? "; did you mean '" + *best + "'?" : "";
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Scalar:
      return "'" + node.Scalar() + "'";
    default:
      return "an empty value";
  }
}

std::string Where(const std::string& source, const YAML::Mark& mark) {
  if (mark.is_null()) return source;
  return source + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

std::string ResolvePath(const std::string& path, const std::string& base) {
  namespace fs = std::filesystem;
  if (path.empty()) return path;
  fs::path resolved(path);
  if (resolved.is_relative() && !base.empty()) resolved = fs::path(base) / resolved;
  std::error_code ec;
  fs::path absolute = fs::absolute(resolved, ec);
  if (!ec) resolved = absolute;
  return resolved.lexically_normal().string();
}

}  // namespace diloco::config_internal
