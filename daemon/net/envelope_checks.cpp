// Field checks shared by every message check, and the envelope header check.
#include "daemon/net/envelope_checks.h"

#include <algorithm>
#include <cmath>

namespace diloco::wire_io {
namespace {

bool IsIdentifier(std::string_view s) {
  for (char c : s) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

std::string Printable(std::string_view s, size_t max) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const char c = s[i];
    out += (c >= 0x20 && c <= 0x7e) ? c : '?';
  }
  if (s.size() > max) out += "...";
  return out;
}

std::string MessageWho(MessageType type, std::string_view sender) {
  return std::string(MessageTypeName(type)) + " from " + Printable(sender);
}

Status CheckIdentifier(std::string_view s, size_t max_bytes, bool may_be_empty,
                       std::string_view who, std::string_view field) {
  if (s.empty() && !may_be_empty) {
    return Status::Error(std::string(who) + ": " + std::string(field) + " is empty");
  }
  if (s.size() > max_bytes) {
    return Status::Error(std::string(who) + ": " + std::string(field) + " has " + Str(s.size()) +
                         " bytes, more than " + Str(max_bytes));
  }
  if (!IsIdentifier(s)) {
    return Status::Error(std::string(who) + ": " + std::string(field) + " \"" + Printable(s) +
                         "\" is not printable ASCII without spaces");
  }
  return Status::Ok();
}

Status CheckText(std::string_view s, size_t max_bytes, std::string_view who,
                 std::string_view field) {
  if (s.size() > max_bytes) {
    return Status::Error(std::string(who) + ": " + std::string(field) + " has " + Str(s.size()) +
                         " bytes, more than " + Str(max_bytes));
  }
  return Status::Ok();
}

Status CheckListSize(size_t n, size_t max, std::string_view who, std::string_view field) {
  if (n > max) {
    return Status::Error(std::string(who) + ": " + std::string(field) + " has " + Str(n) +
                         " entries, more than " + Str(max));
  }
  return Status::Ok();
}

Status CheckFragment(uint64_t fragment, const ParseOptions& o, std::string_view who,
                     std::string_view field) {
  if (fragment >= o.max_fragments) {
    return Status::Error(std::string(who) + ": " + std::string(field) + " " + Str(fragment) +
                         " is out of range (max_fragments " + Str(o.max_fragments) + ")");
  }
  return Status::Ok();
}

Status CheckFragmentSet(std::vector<uint32_t> fragments, const ParseOptions& o,
                        std::string_view who, std::string_view field) {
  DL_RETURN_IF_ERROR(CheckListSize(fragments.size(), o.max_fragments, who, field));
  for (uint32_t f : fragments) DL_RETURN_IF_ERROR(CheckFragment(f, o, who, field));
  std::sort(fragments.begin(), fragments.end());
  auto dup = std::adjacent_find(fragments.begin(), fragments.end());
  if (dup != fragments.end()) {
    return Status::Error(std::string(who) + ": " + std::string(field) + " lists fragment " +
                         Str(*dup) + " twice");
  }
  return Status::Ok();
}

Status CheckFiniteNonNegative(float v, std::string_view who, std::string_view field) {
  if (!std::isfinite(v) || v < 0) {
    return Status::Error(std::string(who) + ": " + std::string(field) + " is " +
                         std::to_string(v) + ", not a finite value >= 0");
  }
  return Status::Ok();
}

Status CheckHeader(const EnvelopeHeader& h, const ParseOptions& o, std::string_view who) {
  DL_RETURN_IF_ERROR(CheckIdentifier(h.sender, kMaxNameBytes, false, who, "sender"));
  DL_RETURN_IF_ERROR(CheckIdentifier(h.job_id, kMaxJobIdBytes, false, who, "job id"));
  if (h.protocol_version < o.min_protocol_version || h.protocol_version > o.max_protocol_version) {
    return Status::Error(std::string(who) + ": protocol version " + Str(h.protocol_version) +
                         " is not supported (this build speaks " + Str(o.min_protocol_version) +
                         ".." + Str(o.max_protocol_version) + "); upgrade the older side");
  }
  if (!o.any_job && h.job_id != o.job_id) {
    return Status::Error(std::string(who) + ": job id \"" + h.job_id + "\" is not this job (\"" +
                         Printable(o.job_id) + "\")");
  }
  if (!o.allowed_senders.empty() &&
      std::find(o.allowed_senders.begin(), o.allowed_senders.end(), h.sender) ==
          o.allowed_senders.end()) {
    return Status::Error(std::string(who) + ": sender is not in the allowlist of " +
                         Str(o.allowed_senders.size()) + " peers");
  }
  return Status::Ok();
}

}  // namespace diloco::wire_io
