// A learner as large as a site (DESIGN.md §2, "Where this goes next"): a learner whose ring spans
// the site's first train.hosts hosts. Host 0 runs the learner (rank 0 of the ring talks to the
// syncer: learner.h with LearnerOptions::make_ring); every other host h runs its part, a ring
// member: the ring's ranks [h × R, (h + 1) × R) (R = train.ranks) as followers of rank 0
// (inner_loop.h: RunInnerLoop without a hook), sampling their rows of the same step batches
// (the learner's corpus shard, the learner's seed).
//
// Incarnations: every ring is one incarnation of the learner, named by host 0, which publishes
// the name under kRingIncarnationKey in the store of ring RingPointerName(index). A member reads
// it, joins that ring (LocalRing::CreateAcrossHosts) and follows it until rank 0 ends it (the
// learner finished or stopped: the member's work is done) or it fails (a host died or stalled:
// Gloo fails every host's collectives). After a failure it waits for a new name and joins again,
// so a stale member never joins a newer ring. The store says kRingEnded once the learner has
// ended on host 0: the member ends too.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "daemon/config/run_config.h"
#include "daemon/util/status.h"

namespace diloco {

class CommStore;
class LocalRing;

// The contract between host 0's learner and the members (both include this header).
inline constexpr const char* kRingIncarnationKey = "incarnation";
// A store get fails with text containing this once host 0 has no running learner of the index.
inline constexpr const char* kRingEnded = "the learner's ring has ended on host 0";
// The store namespace where host 0 names learner index's current incarnation.
std::string RingPointerName(int index);
// Incarnation `attempt` of learner index of job, started by host 0 at boot_ms (unique across
// restarts of host 0's daemon).
std::string RingIncarnationName(const std::string& job_id, int index, int64_t boot_ms, int attempt);

struct RingMemberProgress {
  std::string state = "starting";  // starting, waiting (for an incarnation), joining, following, ended
  std::string incarnation;         // the ring it is in or joining
  int incarnations = 0;            // rings it followed
  std::string last_error;          // why its last ring ended, when it failed
};

struct RingMemberOptions {
  int index = 0;  // the learner
  const RunConfig* config = nullptr;
  int host = 1;   // this host (1 .. train.hosts - 1)
  std::string ring_address;
  int64_t timeout_ms = 60000;
  int threads = 1;
  // The rendezvous store of a ring (an incarnation, or RingPointerName(index)).
  std::function<std::shared_ptr<CommStore>(const std::string& ring)> store_of;
  const std::atomic<bool>* stop = nullptr;  // join no further incarnation
  // The ring being followed (nullptr when it ends), so its owner can abort it (LocalRing::Abort).
  std::function<void(LocalRing*)> on_ring;
  std::function<void(const RingMemberProgress&)> on_progress;
};

struct RingMemberResult {
  int incarnations = 0;
  long steps = 0;  // the step the last ring ended at
  bool stopped = false;
};

// Follows the learner's incarnations until its ring ends well or it has ended on host 0 (OK), or
// *stop.
Status RunRingMember(const RingMemberOptions& options, RingMemberResult* result);

}  // namespace diloco
