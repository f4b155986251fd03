// The learner's fragment ledger: per fragment, the version of the global it last folded, the work
// counted since (c_steps, c_tokens), and the delta in flight (its base, its seq on the main uplink
// stream, the step and counts at send). Pure bookkeeping, no parameters: the backend's sync ops do
// the maths, the ledger says which. Table-tested.
//
// Events:
//   Step      every fragment counts the step's tokens;
//   Send      a delta leaves (in flight until a Global includes it or the syncer lets it go);
//   Global    the next version applied to the base: which fold, which counters remain;
//   Drop      the syncer said it dropped our in-flight delta (a SyncerStatus drop notice);
//   Status    a SyncerStatus: a fragment whose version differs from our base missed a Global (or
//             the syncer went back): resync from a snapshot; an in-flight delta at or below the
//             syncer's heard seq that it does not hold pending will never be merged (lost on the
//             way, dropped with a lost notice, or the syncer restarted): send again;
//   Snapshot  a fragment installed from a snapshot: counters reset, nothing in flight.
//   Skipped   a cadence firing that sent nothing because a snapshot was awaited: in lock-step
//             modes it blocks as a delta in flight would, until the snapshot is in (Resynced).
//             A learner resyncing with nothing in flight trained on unblocked, and a syncer
//             down for seconds let it run a round or more ahead of the fleet, whose lock-step
//             rounds then waited on each other for ever (a syncer restart; see
//             tests/virt/test_virtual_run.cpp, "lock-step learner resyncing runs ahead").
#pragma once

#include <cstdint>
#include <vector>

#include "daemon/config/sync_config.h"
#include "daemon/net/envelope.h"

namespace diloco {

struct LedgerFragment {
  uint64_t base_version = 0;
  uint64_t c_steps = 0, c_tokens = 0;  // since the base (replay fold: the work not yet in Θ)
  bool in_flight = false;
  uint64_t sent_base = 0;  // base of the delta in flight
  uint64_t sent_seq = 0;   // its seq on the main uplink stream
  long send_step = 0;
  uint64_t c_steps_at_send = 0, c_tokens_at_send = 0;
  bool bad = false;  // CRC mismatch: the base is wrong until a snapshot replaces it
  long skipped_step = -1;  // a firing skipped while a snapshot was awaited (-1: none)
};

// How to fold a Global into the parameters (the backend's sync_fold / sync_shift_at_send).
struct GlobalFold {
  bool ours_included = false;  // our in-flight delta is in it: fold against θ at send
  bool shift_at_send = false;  // replay of a Global without our delta while ours is in flight
  // Not replay: the tokens of local progress the fold replaces with Θ (work neither in Θ nor in a
  // delta in flight); goodput counts them discarded.
  uint64_t replaced_tokens = 0;
};

struct StatusVerdict {
  std::vector<int> missed;  // versions differ from our bases: resync these from a snapshot
  std::vector<int> lost;    // in-flight deltas the syncer will never merge: no longer in flight
};

class FragmentLedger {
 public:
  FragmentLedger(int fragments, FoldRule fold, int max_staleness);

  int size() const { return (int)fragments_.size(); }
  const LedgerFragment& operator[](int p) const { return fragments_[p]; }
  bool AnyInFlight() const;
  // Lock-step modes wait while a fragment has been in flight (or its firing skipped) block_after
  // steps or more.
  bool Blocks(int p, long step, long block_after) const;

  void OnStep(uint64_t tokens);
  void OnSend(int p, long step, uint64_t seq);
  // Version `version` of p was applied to the base; included_self: its contributors name us.
  GlobalFold OnGlobal(int p, uint64_t version, bool included_self);
  // Version `version` of p did not reproduce the syncer's bits: the base is wrong until a
  // snapshot replaces it (what is in flight stays so: the snapshot settles it).
  void OnCrcMismatch(int p, uint64_t version) {
    fragments_[p].base_version = version;
    fragments_[p].bad = true;
  }
  // A drop notice for (p, base): true when it was our in-flight delta (now no longer in flight).
  // merged: its steps are in the global model already (kAlreadyMerged), so they leave the
  // counters as if it had been included; otherwise they go into the next delta.
  bool OnDrop(int p, uint64_t base_version, bool merged = false);
  // ack: the status's LearnerAck for this learner incarnation (nullptr: none, or another one's).
  // fragments: those the status's syncer shard merges (shards.h), whose versions and acks it
  // speaks for.
  StatusVerdict OnStatus(const std::vector<uint64_t>& versions, const LearnerAck* ack,
                         const std::vector<uint32_t>& fragments);
  void OnSnapshot(int p, uint64_t version);
  // p fired at step while a snapshot was awaited (nothing sent); the first such step counts.
  void OnSkipped(int p, long step);
  void OnResynced();  // the snapshot is in: no skipped firing blocks any more

 private:
  std::vector<LedgerFragment> fragments_;
  FoldRule fold_;
  int max_staleness_;
};

}  // namespace diloco
