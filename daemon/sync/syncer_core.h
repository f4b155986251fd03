// The syncer's decisions as a sans-IO core (issue 30): what Syncer (syncer.h) does with every
// message and timer, with no socket, thread of its own, sleep, file or clock inside. A runtime
// feeds it events (an uplink message, a request on the snapshot endpoint, a timer) and it acts
// through a SyncerPort: publish or reply with real envelopes (BuildMessage, net::ToMessage), log
// an update before its Global goes out, report a merge, hand over a checkpoint, print a line.
//
// Two runtimes drive it: the wall-clock Syncer (ZeroMQ sockets, a poll loop, the update log,
// events.log and the checkpoint writer behind the port) and a virtual one (a discrete-event
// scheduler, envelopes through emulated links). Given the same events in the same order at the
// same port times, the core publishes the same bytes: time comes from the port only, the
// incarnation is given, and nothing iterates over an unordered container. The merge's own
// threads (sync.merge_threads, merger.h) give the same bits for any count.
//
// The rules themselves are the RoundBook's (round_book.h: who is live, pending deltas, drops),
// Decide's (decide.h: when a round closes) and the FragmentMerger's (merger.h: the maths); the
// core wires them to the messages (syncer.h describes the protocol).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/net/channel.h"
#include "daemon/net/envelope.h"
#include "daemon/sync/core_clock.h"
#include "daemon/sync/decide.h"
#include "daemon/sync/event_log.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/global_state.h"
#include "daemon/sync/held_delta.h"
#include "daemon/sync/merger.h"
#include "daemon/sync/round_book.h"
#include "daemon/sync/shards.h"
#include "daemon/sync/syncer.h"
#include "daemon/sync/update_log.h"
#include "daemon/util/status.h"
#include "kernels/tensor_table.h"

namespace diloco {

// What the core acts through; its clock (CoreClock) is the only time the core reads.
class SyncerPort : public CoreClock {
 public:
  virtual void Publish(net::Message&& m) = 0;                        // downlink PUB, topic job_id
  virtual void Reply(const std::string& peer, net::Message&& m) = 0;  // ROUTER reply to peer
  // The update is durable before its Global is published (may be a no-op: no run_dir).
  virtual Status LogUpdate(const UpdateRecord& record) = 0;
  virtual void OnMerge(const MergeEvent& event) = 0;      // events.log, listeners (no re-parsing)
  virtual void Checkpoint(const GlobalState& state) = 0;  // every sync.checkpoint_every merges
  virtual void Note(const std::string& line) = 0;  // what the syncer prints (refusals, impostors)
};

// The core's counters (the runtime's SyncerResult and SyncerStatusSnapshot read them).
struct SyncerCounters {
  uint64_t bytes_received = 0;   // wire bytes of every message handed in (uplink and requests)
  uint64_t bytes_published = 0;  // wire bytes of every message built (published or replied)
  uint64_t snapshots_served = 0;
  uint64_t snapshots_throttled = 0;  // requests inside kSnapshotMinIntervalMs of the last one
  uint64_t welcomes = 0, refusals = 0;
  uint64_t impostors = 0;  // messages naming a learner, sent with another key (learner_keys)
  uint64_t home_fetches = 0;  // the home shard's requests for this shard's final fragments answered
};

class SyncerCore {
 public:
  // At most one snapshot per learner this often: each encodes the whole model.
  static constexpr int kSnapshotMinIntervalMs = 1000;

  // state: restored or initial (Syncer::Create keeps doing that, and the files); fragments,
  // state and port outlive the core. incarnation: drawn by the runtime (random_device in the
  // wall runtime, seeded in the virtual one). The port's clock starts the round book and the
  // status timer.
  SyncerCore(const SyncerOptions& options, const std::vector<Fragment>& fragments, GlobalState* state,
             const TensorTable& table, uint64_t incarnation, SyncerPort* port);
  ~SyncerCore();
  SyncerCore(const SyncerCore&) = delete;
  SyncerCore& operator=(const SyncerCore&) = delete;

  // An uplink message (Delta or Heartbeat) that passed ParseEnvelope: r.topic tells the main
  // stream (job_id) from the liveness stream, r.seq the sequence verdict, r.peer_key the CURVE key.
  void OnUplink(const net::Received& r, const ParsedMessage& m);
  // A request on the snapshot endpoint (Hello, SnapshotRequest); the answer goes to r.peer.
  Status OnRequest(const net::Received& r, const ParsedMessage& m);
  // Closes the rounds Decide says to close and publishes a SyncerStatus when due. Lowers
  // *next_wake to the earliest time the core wants OnTimer again (a grace window's end, a
  // learner's heartbeat timeout, the next periodic status); the runtime clamps it (the wall
  // loop turns at least every 20 ms) and calls OnTimer after every message as well.
  Status OnTimer(SyncTime* next_wake);
  // Merges every pending delta (reason "flush"): the run is over. From here on the home shard's
  // request for this shard's fragments is answered (before, it would get a state still moving).
  Status Flush();

  bool AllDone() const { return book_.AllDone(); }  // every learner said kFinished
  SyncTime last_message() const { return last_message_; }  // the last OnUplink / OnRequest

  // Read access for the runtime's status and result.
  const SyncerCounters& counters() const { return counters_; }
  const std::vector<LearnerStatusEntry>& learners() const { return learners_; }  // index = learner
  const RoundBook& book() const { return book_; }
  // Resuming: the merges an earlier incarnation logged (events.log), so a delta whose steps are
  // in the global model is not merged again and a rejoining lock-step learner gets the fleet's
  // cadence. Merges past the resumed state's versions are skipped.
  void RecallMerges(const std::vector<MergeEvent>& merges);
  const RoundTimings& timings() const { return timings_; }
  uint64_t incarnation() const { return incarnation_; }
  const std::string& name() const { return name_; }
  bool Owns(size_t fragment) const { return shards_.Owns(options_.shard, fragment); }

 private:
  // Timers.
  Status DecideAll(SyncTime now, SyncTime* next_wake);
  void RecordQuorumTime(const RoundState& rs, int quorum);
  Status PublishStatusIfDue(SyncTime now, SyncTime* next_wake);
  // Receiving.
  bool Impostor(int learner, const std::string& key);
  // The home shard (shard 0 of several, at a dilocod job's end) asking for this shard's fragments.
  Status HandleHomeRequest(const net::Received& r, const ParsedMessage& m);
  void NoteHeard(int learner, const ParsedMessage& m, SyncTime now);
  void HandleHeartbeat(int learner, const HeartbeatMsg& hb, SyncTime now);
  void HandleDelta(int learner, const ParsedMessage& m, SyncTime now);
  void ApplyDrops();
  Status HandleHello(int learner, const std::string& peer, const ParsedMessage& m);
  WelcomeMsg WelcomeFor(int learner, const ParsedMessage& m) const;
  Status HandleSnapshotRequest(const std::string& peer, const ParsedMessage& m);
  // Sending.
  EnvelopeHeader Header(uint64_t* seq);
  Status PublishStatus();
  Status Reply(const std::string& peer, const MessageBody& body, std::shared_ptr<std::vector<uint8_t>> payload);
  // Merging.
  Status Merge(size_t p, const std::string& reason, double grace_ms);
  Status LogUpdate(size_t p, uint32_t theta_crc, UpdateRecord* record);
  std::shared_ptr<std::vector<uint8_t>> GlobalPayload(size_t p, std::vector<uint8_t>&& bytes) const;
  GlobalMsg GlobalOf(size_t p, uint32_t theta_crc, const std::vector<uint64_t>& tensor_bytes) const;
  void Credit(const std::vector<PendingDelta>& ok, const std::vector<double>& weights, GlobalMsg* g, MergeEvent* ev);
  Status PublishGlobal(const GlobalMsg& g, std::shared_ptr<std::vector<uint8_t>> payload);

  const SyncerOptions options_;
  const SyncConfig& sc_;  // options_.sync
  const std::vector<Fragment>& fragments_;
  bool flushed_ = false;  // Flush ran: the state is final
  const ShardMap shards_;
  const std::string name_;  // this shard's, the sender of everything it sends
  GlobalState& state_;
  SyncerPort& port_;
  const int M_;     // learners
  const size_t P_;  // fragments
  const DecideOptions dopt_;
  const CodecOptions down_codec_;
  const uint64_t table_digest_;
  const uint64_t num_params_;
  const uint64_t fragments_digest_;
  const uint64_t incarnation_;
  uint64_t seq_ = 0;         // downlink
  uint64_t router_seq_ = 0;  // replies
  uint64_t snapshot_ids_ = 0;

  RoundBook book_;  // learners, pending deltas, drops (round_book.h)
  std::vector<std::vector<SkippedDelta>> skipped_;  // per fragment, since its last merge
  // Deltas dropped or rejected since the last SyncerStatus: that status tells their learners,
  // which then stop waiting for a Global that will never include them and send again.
  std::vector<DroppedDelta> recent_drops_;
  std::vector<LearnerStatusEntry> learners_;  // what each learner last reported
  RoundTimings timings_;
  SyncerCounters counters_;
  // The merges (merger.h), with error feedback on the downlink too: what the codec drops from
  // one update of a fragment goes out with its next one, so Θ stays within one message's
  // rounding of the unquantized trajectory. Not checkpointed: a restarted syncer loses at most
  // that one rounding.
  FragmentMerger merger_;
  HeldDeltaRecycler recycler_;  // the buffers of merged deltas, for the next ones
  std::map<int, SyncTime> last_snapshot_;  // by learner: when its last snapshot went out

  bool status_due_ = false;  // publish a SyncerStatus at the next OnTimer
  SyncTime last_message_;
  SyncTime last_status_;
};

}  // namespace diloco
