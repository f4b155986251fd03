// The learner's decisions (learner.h describes the protocol) as a sans-IO core: it takes events
// (a message arrived, a timer fired, a step is about to start or has finished) and acts through a
// port (LearnerPort) that its runtime implements: the wall-clock runtime of learner.cpp (sockets,
// the liveness thread, sleeps) or a virtual one (a deterministic scheduler). No sockets, threads,
// sleeps, files or clocks in here: time comes from the port, the incarnation from the runtime, so
// the same events at the same times make the core do the same thing.
//
// What the core owns: the FragmentLedger and the host mirrors of the bases, the Clone client and
// the snapshot request in flight, the startup exchange (Welcome, downlink seen), the sequence
// numbers, lost deltas, the other learners' steps (sync.lr_clock: global), the step-time EMA, the
// LearnerResult counters and the progress. The maths stays in OuterState (encode, apply, fold).
//
// The runtime's order of calls:
//   SetUp();
//   while (!Joined()) { OnJoinTimer(); deliver messages (OnDownlink / OnDealer) }
//   Start(join_from_snapshot); joining from a snapshot: while (AwaitingSnapshot()) { OnTimer();
//   deliver messages }
//   BeginTraining();
//   per step: BeforeStep(at, &control); while (!control.stop && Blocked()) { deliver messages,
//             OnTimer(); BeforeStep(at, &control) }; the step; AfterStep(result, step_s);
//   BeginFlush(); wait until Flushed() (messages, OnTimer); SendRemaining(); wait until Flushed();
//   SendLastWord(); wait until LastWordHeard() (messages, OnTimer); Finish().
// A crash or a stop the runtime sees (its flags) ends training through MarkCrashed / MarkStopped.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "daemon/net/channel.h"
#include "daemon/net/clone.h"
#include "daemon/net/codec.h"
#include "daemon/net/envelope.h"
#include "daemon/sync/core_clock.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/shards.h"
#include "daemon/train/fragment_ledger.h"
#include "daemon/train/inner_loop.h"
#include "daemon/train/learner.h"
#include "daemon/train/outer_state.h"
#include "daemon/util/status.h"
#include "kernels/backend.h"

namespace diloco {

// What a learner core does to the world; its clock is the runtime's (CoreClock). shard: the
// syncer shard the message is for (shards.h; 0 with one syncer).
class LearnerPort : public CoreClock {
 public:
  virtual void SendUplink(int shard, net::Message&& m) = 0;  // PUB main stream, topic job_id
  virtual void SendDealer(int shard, net::Message&& m) = 0;  // DEALER (Hello, SnapshotRequest)
  virtual void OnHeartbeat(const HeartbeatMsg& hb) = 0;  // the liveness stream's latest beat
  virtual void SaveStep(long step) = 0;            // learner-<i>.step in run_dir (may no-op)
  virtual Status SaveMoments(long done) = 0;       // learner-<i>.ckpt (SaveCheckpoint of the ring)
  virtual void WriteMetrics(const nlohmann::json& line) = 0;  // metrics.jsonl (may no-op)
  virtual void Note(const std::string& line) = 0;  // what the learner prints
};

class LearnerCore {
 public:
  // backend0: rank 0's backend (its table and size; the parameters change only through outer).
  // frags: backend0's table partitioned into fragments (PartitionFragments). incarnation: this
  // learner's, drawn by the runtime. o and port must outlive the core.
  LearnerCore(const LearnerOptions& o, TrainingBackend& backend0, OuterState& outer, std::vector<Fragment> frags,
              uint64_t incarnation, LearnerPort* port);
  ~LearnerCore();

  // What the downlink (Global, SyncerStatus) and the DEALER (Welcome, Snapshot) accept: the
  // runtime's validators check messages against these before handing them in.
  const ParseOptions& downlink_expect() const { return expect_; }
  ParseOptions dealer_expect() const;
  // The ring as progress reports it ("cpu x 2 ranks (threads)", ranks).
  void Describe(const std::string& device, int ranks);

  Status SetUp();  // the outer-sync state of every fragment, and the host mirrors of the bases

  // Startup exchange: Heartbeat(kJoining) every 20 ms, Hello every 50 ms, until every syncer
  // shard's Welcome and a downlink message from each have arrived (Joined).
  Status OnJoinTimer();
  bool Joined() const;
  bool ShardJoined(int shard) const;  // its Welcome and a downlink message from it are in
  // From init_params (version 0 of every fragment; buffered Globals apply), or from a snapshot:
  // requested now, AwaitingSnapshot() until it is installed.
  Status Start(bool join_from_snapshot);
  // Training starts now: a heartbeat, the start time (train.time_limit_s, goodput). BeforeStep
  // calls it when the runtime has not.
  Status BeginTraining();
  // The step the inner loop starts at (after the join): options.start_step, or, rejoining a
  // lock-step fleet from a snapshot, the fleet's step; rejoining a decoupled fleet, its own step
  // moved forward into the fleet's phase.
  long StartStep() const;

  // r: the frames (kept for buffering while a snapshot is awaited); m: their parse.
  Status OnDownlink(net::Received& r, const ParsedMessage& m);  // Global, SyncerStatus
  Status OnDealer(ParsedMessage& m);                            // Welcome, Snapshot parts
  // Heartbeat when due, snapshot (re)request when due, lost deltas sent again.
  Status OnTimer();

  // Before step `at` (callable again for the same step while Blocked()): control gets the
  // ranges rewritten since the last step and lr_step; stop on train.time_limit_s.
  Status BeforeStep(long at, StepControl* control);
  // A lock-step mode's fragment has been in flight too long: the step waits for its Global.
  bool Blocked() const { return BlockingFragment() >= 0; }
  int BlockingFragment() const;  // the first fragment that blocks the step, -1 when none
  // r: the step; step_s: its stretched (wall) or virtual time; provisioned_s: the same without a
  // chaos slowdown (step_stretch.h; a virtual step's time).
  Status AfterStep(const StepResult& r, double step_s, double provisioned_s);

  // The runtime's crash or stop flags ended training (a wait in progress ends too).
  void MarkCrashed();
  void MarkStopped();

  // The end: the deltas in flight merged (or given up after flush_timeout_ms with no other learner stepping),
  // the work left sent, merged too; then the last word (a final heartbeat, or the crash's tally).
  Status BeginFlush();
  bool Flushed() const;
  Status SendRemaining();
  // The last word: a final heartbeat (finished, or stopping when stopped), sent again every
  // heartbeat interval (OnTimer) until a SyncerStatus acks it or sync.heartbeat_timeout_ms passes
  // (the syncer stops waiting for the learner then anyway). Lost on a lossy link, it left the
  // syncer waiting a heartbeat timeout for a learner that was gone (dilococtl dst --seeds 8667,
  // 9586). Crashed: nothing is sent.
  Status SendLastWord();
  bool LastWordHeard() const;
  Status Finish();  // the result: the crash's tally, or the last word's state reported

  bool AwaitingSnapshot() const { return clone_.awaiting_snapshot(); }
  LearnerState StateNow() const;
  long step() const { return step_; }
  uint64_t incarnation() const { return incarnation_; }
  const ShardMap& shards() const { return shards_; }
  const LearnerResult& result() const { return res_; }
  LearnerProgress progress() const;  // the counters now, the state last reported
  // The result if the learner died now: crashed, with the work that had not left in a delta.
  LearnerResult CrashedResult() const;

 private:
  // Sending.
  Status Build(uint64_t* sq, const MessageBody& body, std::shared_ptr<std::vector<uint8_t>> payload,
               net::Message* out);
  Status Send(int shard, const MessageBody& body, std::shared_ptr<std::vector<uint8_t>> payload);
  Status SendToDealer(int shard, const MessageBody& body);
  HelloMsg Hello() const;
  Status Heartbeat(LearnerState state);
  Status RepeatLastWord();
  Status BeatIfDue();
  Status SendDelta(int p, long at_step);
  Status EncodeUplink(int p, std::vector<uint8_t>* payload, std::vector<uint64_t>* tensor_bytes, bool* encoded);
  void ResetResidual(int p);
  Status SendFiringDeltas(long done);
  Status ResendLost();
  // Receiving.
  Status HandleGlobal(net::Received& r, const ParsedMessage& m);
  Status ApplyGlobal(const ParsedMessage& m);
  Status DecodeFiniteUpdate(const Fragment& frag, const GlobalMsg& g, const ParsedMessage& m);
  void HandleStatus(int shard, const SyncerStatusMsg& st);
  void HandleDropNotices(int shard, const std::vector<DroppedDelta>& drops);
  const LearnerAck* AckOf(const SyncerStatusMsg& st) const;
  void CheckVersionsAndAcks(int shard, const SyncerStatusMsg& st);
  // The shard a verified message came from (its sender names one: downlink_expect()).
  int ShardOf(const ParsedMessage& m) const { return shards_.ShardNamed(m.header.sender); }
  // Snapshots (Clone pattern).
  void NeedSnapshot(const std::string& why);
  Status RequestSnapshotIfDue();
  Status RequestSnapshot(int shard);
  Status AddSnapshotPart(int shard, ParsedMessage& m);
  Status InstallSnapshot();
  Status InstallSnapshotPart(ParsedMessage& part);
  Status ApplyBufferedGlobals(const std::map<uint64_t, uint64_t>& versions);
  // Steps.
  bool TimeLimitReached() const;
  void EndWait();
  Status SaveMomentsIfDue(long done);
  void LogStep(const StepResult& r, long done, double step_s);
  // State.
  void MarkChanged(int p);
  void Report(LearnerState state);
  std::vector<uint64_t> BaseVersions() const;
  static bool Elapsed(const std::optional<SyncTime>& since, SyncTime now, double ms);

  const LearnerOptions& o_;
  const RunConfig& cfg_;
  const TrainConfig& tc_;
  const SyncConfig& sc_;
  const std::string me_;
  TrainingBackend& backend_;
  // The outer-sync state (outer_state.h). A ring command that failed where no Status could be
  // returned (a handler of a syncer status) is kept here and ends the learner at its next step.
  OuterState& outer_;
  Status outer_error_;
  LearnerPort* const port_;
  LearnerResult res_;
  std::vector<ParamRange> changed_;  // parameters rewritten since the ring last copied them

  const std::vector<Fragment> frags_;
  const ShardMap shards_;  // which syncer shard merges which fragment
  const int P_;  // fragments
  const int H_;  // sync.inner_steps
  // Versions, counters and what is in flight; the host mirror of each base, updated from the same
  // decoded bytes as the backend's, to check the Globals' CRC32C.
  FragmentLedger ledger_;
  std::vector<std::vector<float>> bases_;
  std::vector<uint8_t> contiguous_;
  // sync.codec.*: with top-k (or the decaying accumulator) on the uplink the backend hands Δ over
  // in fp32 and the host encodes it, keeping the residual here (EncodeUplink).
  const CodecOptions up_codec_;
  ErrorFeedback up_topk_ef_;
  std::vector<float> up_values_;
  // Steps a fragment may stay in flight before training waits for its Global (ledger Blocks):
  // 0 in diloco, sync.overlap in streaming, never in decoupled.
  const long block_after_;
  ParseOptions expect_;  // the downlink's checks (also for re-parsing buffered Globals)

  const uint64_t incarnation_;
  // Per syncer shard: each hears a main stream of its own (every heartbeat, its fragments'
  // deltas), numbered without gaps, and has its own DEALER exchange.
  std::vector<uint64_t> seq_, dealer_seq_;

  double step_ms_ema_ = 0;
  float last_loss_;
  long step_;
  net::CloneClient clone_;  // awaiting a snapshot until the start decides otherwise
  LearnerProgress progress_;
  std::optional<SyncTime> last_step_save_, last_beat_, last_join_beat_, last_hello_;
  bool join_reported_ = false;

  // Snapshot requests (Clone pattern): at most one outstanding, asking every shard for its
  // fragments; whole when every shard's part is in. A shard's request is re-sent after
  // snapshot_retry_ms without a part of it; the parts of the shards that answered stay (asking
  // them all again threw away a quick shard's answer each time a busy one was slow).
  struct ShardSnapshot {
    uint64_t request_id = 0;
    SyncTime heard_at{};  // its request sent, or its latest part in
    std::unique_ptr<SnapshotAssembler> assembler;  // null once its part is whole
    std::vector<ParsedMessage> parts;
  };
  uint64_t request_id_ = 0;  // the latest request's (to any shard)
  bool request_outstanding_ = false;
  std::vector<ShardSnapshot> snapshot_;  // per shard
  std::string resync_reason_ = "join";

  std::vector<float> scratch_;
  std::vector<int> lost_deltas_;  // in-flight deltas the syncer never got: sent again (ResendLost)

  std::vector<bool> welcomed_, downlink_seen_;  // the startup exchange, per shard
  bool started_ = false;   // Start decided how to leave the initial "awaiting snapshot"
  bool training_ = false;  // BeginTraining ran
  bool flushing_ = false;  // BeginFlush ran
  // SendLastWord: the final state, the seq of its first copy and whether an ack covers it (per
  // shard), and when the learner stops waiting for one.
  std::optional<LearnerState> last_word_;
  std::vector<uint64_t> last_word_seq_;
  std::vector<bool> last_word_heard_;
  SyncTime last_word_deadline_{};
  SyncTime train_start_{}, flush_deadline_{};
  // A lock-step wait in progress (BeforeStep found a fragment blocking): since when.
  bool waiting_ = false;
  SyncTime wait_start_{};
  int64_t wait_start_unix_ms_ = 0;

  const long tokens_per_step_;
  // sync.lr_clock: global: the latest step each other learner is known at (an ordered map: the
  // mean is summed in the same order every run).
  std::map<std::string, uint64_t> known_steps_;
  long cadence_step_ = 0;  // the last snapshot's cadence step (StartStep)
  double recent_sum_ = 0;
  int recent_n_ = 0;
};

}  // namespace diloco
