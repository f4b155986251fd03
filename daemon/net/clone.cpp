#include "daemon/net/clone.h"

namespace diloco::net {

const char* ToString(CloneVerdict v) {
  switch (v) {
    case CloneVerdict::kBuffered: return "buffered";
    case CloneVerdict::kApply: return "apply";
    case CloneVerdict::kStale: return "stale";
    case CloneVerdict::kGap: return "gap";
    case CloneVerdict::kOverflow: return "overflow";
  }
  return "?";
}

uint64_t CloneClient::version(uint64_t key) const {
  const auto it = versions_.find(key);
  return it == versions_.end() ? 0 : it->second;
}

CloneVerdict CloneClient::Decide(const VersionedUpdate& u) {
  const uint64_t have = version(u.key);
  if (u.version <= have) return CloneVerdict::kStale;
  if (u.version == have + 1 || u.full) {
    versions_[u.key] = u.version;
    return CloneVerdict::kApply;
  }
  return CloneVerdict::kGap;
}

CloneVerdict CloneClient::OnUpdate(VersionedUpdate&& update, std::vector<VersionedUpdate>* apply) {
  if (awaiting_) {
    CloneVerdict v = CloneVerdict::kBuffered;
    if (buffer_.size() >= options_.max_buffered_updates && !buffer_.empty()) {
      buffer_.pop_front();
      v = CloneVerdict::kOverflow;
    }
    buffer_.push_back(std::move(update));
    return v;
  }
  const CloneVerdict v = Decide(update);
  switch (v) {
    case CloneVerdict::kApply: apply->push_back(std::move(update)); break;
    case CloneVerdict::kStale: ++stale_dropped_; break;
    case CloneVerdict::kGap:
      ++gaps_;
      awaiting_ = true;
      buffer_.push_back(std::move(update));
      break;
    default: break;
  }
  return v;
}

void CloneClient::OnSnapshot(const std::map<uint64_t, uint64_t>& versions, std::vector<VersionedUpdate>* apply) {
  for (const auto& [key, v] : versions) {
    // A snapshot never moves a key backwards (a slow reply racing a newer one).
    if (v > version(key)) versions_[key] = v;
  }
  awaiting_ = false;
  std::deque<VersionedUpdate> pending;
  pending.swap(buffer_);
  while (!pending.empty()) {
    VersionedUpdate u = std::move(pending.front());
    pending.pop_front();
    if (awaiting_) {  // a gap earlier in the buffer: keep the rest for the next snapshot
      buffer_.push_back(std::move(u));
      continue;
    }
    const CloneVerdict v = Decide(u);
    if (v == CloneVerdict::kApply) {
      apply->push_back(std::move(u));
    } else if (v == CloneVerdict::kStale) {
      ++stale_dropped_;
    } else {
      ++gaps_;
      awaiting_ = true;
      buffer_.push_back(std::move(u));
    }
  }
}

}  // namespace diloco::net
