// The one rule for a site's name, shared by the daemon config (`site`, `peers[i].site`) and the
// run config (`placement`): names end up in file names, endpoints' peers and log lines.
#pragma once

#include <cctype>
#include <string_view>

namespace diloco {

inline constexpr size_t kMaxSiteNameBytes = 64;

// For messages: "'x' is not a site name (" + kSiteNameRule + ")".
inline constexpr std::string_view kSiteNameRule = "letters, digits, '-', '_', '.'; at most 64 characters";

inline bool IsSiteName(std::string_view name) {
  if (name.empty() || name.size() > kMaxSiteNameBytes) return false;
  for (char ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.') return false;
  }
  return true;
}

}  // namespace diloco
