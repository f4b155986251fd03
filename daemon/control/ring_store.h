// The rendezvous store of a learner's ring across a site's hosts (train/ring_member.h): served by
// host 0's dilocod from memory, reached by every host of the site (host 0 itself included) over
// the CURVE control channel (control_protocol.h), never on a port of its own:
//   ring_set {ring, key, value}  -> {ok}
//   ring_get {ring, key, learner} -> {ok, value} | {ok, missing} | {ok, ended}
// ring: the incarnation (or the learner's pointer namespace, RingPointerName); value: hex. Only
// the site's own hosts may call them (the daemon checks the authenticated key against
// site_hosts). `ended`: the job, or that learner, no longer runs on host 0.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "daemon/control/control_protocol.h"
#include "daemon/util/status.h"
#include "kernels/comm/comm_store.h"

namespace diloco {

struct RingStoreLimits {
  size_t max_ring_bytes = 256;    // ring and key names
  size_t max_value_bytes = 4096;  // a value (before hex)
  size_t max_keys_per_ring = 1024;
  size_t max_rings_per_job = 8;   // older incarnations are dropped first
};

// Host 0's table: per job, per ring, key -> value. Bounded by RingStoreLimits.
class RingStoreTable {
 public:
  explicit RingStoreTable(RingStoreLimits limits = {}) : limits_(limits) {}
  Status Set(const std::string& job, const std::string& ring, const std::string& key, const std::string& value);
  // Whether key is set, and its value.
  bool Get(const std::string& job, const std::string& ring, const std::string& key, std::string* value) const;
  void DropJob(const std::string& job);
  size_t rings(const std::string& job) const;

 private:
  struct Job {
    std::map<std::string, std::map<std::string, std::string>> rings;
    std::deque<std::string> order;  // rings, oldest first
  };
  RingStoreLimits limits_;
  std::map<std::string, Job> jobs_;
};

std::string HexEncode(const std::vector<char>& bytes);
bool HexDecode(const std::string& text, std::vector<char>* out);

// A CommStore over host 0's ring_set / ring_get. get polls every poll_ms until timeout_ms (host 0
// unreachable meanwhile is waited out too); it fails at once, with kRingEnded in its text, when
// host 0 says the learner has ended, or when *cancel is set.
class ControlCommStore final : public CommStore {
 public:
  ControlCommStore(net::NetContext& context, ControlTarget host0, std::string job_id, std::string ring, int learner,
                   const std::atomic<bool>* cancel = nullptr, int poll_ms = 25);
  CommStatus set(const std::string& key, const std::vector<char>& value) override;
  CommStatus get(const std::string& key, int64_t timeout_ms, std::vector<char>* value) override;

 private:
  net::NetContext& context_;
  ControlTarget host0_;
  std::string job_id_, ring_;
  int learner_;
  const std::atomic<bool>* cancel_;
  int poll_ms_;
};

}  // namespace diloco
