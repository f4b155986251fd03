// The client side of the ZeroMQ guide's Clone pattern, per key (fragment) with versions. Pure
// logic: no sockets, the caller moves messages in and out.
//
//   1. subscribe to the update stream (SUB), call BeginSnapshot(); updates are now buffered;
//   2. request the snapshot (DEALER -> ROUTER);
//   3. OnSnapshot(versions it holds): buffered updates not newer than the snapshot are dropped,
//      newer ones are returned to apply, in arrival order;
//   4. live: each update is applied when it is the next version of its key (or self-contained),
//      dropped when stale, and a skipped version (lost update) sends the client back to step 1's
//      buffering: the caller requests a new snapshot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "daemon/net/socket.h"

namespace diloco::net {

struct VersionedUpdate {
  uint64_t key = 0;      // e.g. the fragment
  uint64_t version = 0;  // the version this update produces
  bool full = false;     // self-contained (a full fragment): applies even after a gap
  Message message;
};

enum class CloneVerdict {
  kBuffered,  // awaiting the snapshot: kept for later
  kApply,     // returned in `apply`
  kStale,     // not newer than what the client holds: dropped
  kGap,       // a version was skipped: buffered, and a new snapshot is needed (awaiting_snapshot())
  kOverflow,  // awaiting, buffer full: the oldest buffered update was dropped for this one
};
const char* ToString(CloneVerdict v);

struct CloneOptions {
  size_t max_buffered_updates = 1024;  // while awaiting a snapshot
};

class CloneClient {
 public:
  explicit CloneClient(const CloneOptions& options = {}) : options_(options) {}

  // Starts buffering: call after subscribing and before requesting the snapshot.
  void BeginSnapshot() { awaiting_ = true; }
  bool awaiting_snapshot() const { return awaiting_; }

  CloneVerdict OnUpdate(VersionedUpdate&& update, std::vector<VersionedUpdate>* apply);
  // The snapshot arrived holding versions[key] for each key. Returns the buffered updates newer than
  // it (in arrival order) in apply. If those skip a version, the client stays awaiting: request again.
  void OnSnapshot(const std::map<uint64_t, uint64_t>& versions, std::vector<VersionedUpdate>* apply);

  uint64_t version(uint64_t key) const;  // 0 when unknown
  uint64_t stale_dropped() const { return stale_dropped_; }
  uint64_t gaps() const { return gaps_; }
  size_t buffered() const { return buffer_.size(); }

 private:
  // Live-mode decision for one update (updates versions_ when it applies).
  CloneVerdict Decide(const VersionedUpdate& u);

  CloneOptions options_;
  bool awaiting_ = true;
  std::map<uint64_t, uint64_t> versions_;
  std::deque<VersionedUpdate> buffer_;
  uint64_t stale_dropped_ = 0, gaps_ = 0;
};

}  // namespace diloco::net
