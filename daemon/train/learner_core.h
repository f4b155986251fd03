// The learner's decisions as a sans-IO core (issue 30): what a learner (learner.h) does with
// every message, timer and step, with no socket, thread, sleep, file or clock inside. A runtime
// feeds it events (a downlink or DEALER message that passed its checks, a timer, a step before
// and after) and it acts through a LearnerPort: send real envelopes (BuildMessage,
// net::ToMessage) on the uplink or the DEALER, hand over its latest heartbeat for the liveness
// stream, save its step and moments, write metrics, print a line.
//
// Two runtimes drive it: the wall-clock learner (learner.cpp: ZeroMQ sockets, polls, the liveness
// thread, a slowed step's sleep) and the virtual one (daemon/virt: a discrete-event scheduler).
// The maths is the OuterState's (outer_state.h: encode, apply, fold where the parameters live);
// the bookkeeping is the FragmentLedger's (fragment_ledger.h); the snapshot protocol the
// CloneClient's (net/clone.h). The protocol itself is described in learner.h.
//
// Given the same events in the same order at the same port times, the core sends the same bytes:
// time comes from the port only and the incarnation is given.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/net/channel.h"
#include "daemon/net/clone.h"
#include "daemon/net/codec.h"
#include "daemon/net/envelope.h"
#include "daemon/sync/core_clock.h"
#include "daemon/sync/fragments.h"
#include "daemon/train/fragment_ledger.h"
#include "daemon/train/inner_loop.h"
#include "daemon/train/learner.h"
#include "daemon/train/outer_state.h"

namespace diloco {

// What the core acts through; its clock (CoreClock) is the only time the core reads.
class LearnerPort : public CoreClock {
 public:
  virtual void SendUplink(net::Message&& m) = 0;         // PUB main stream, topic job_id
  virtual void SendDealer(net::Message&& m) = 0;         // DEALER (Hello, SnapshotRequest)
  virtual void OnHeartbeat(const HeartbeatMsg& hb) = 0;  // the liveness stream's latest beat
  virtual void SaveStep(long step) = 0;                  // learner-<i>.step in run_dir (may no-op)
  virtual Status SaveMoments(long done) = 0;             // learner-<i>.ckpt (the ring's moments)
  virtual void WriteMetrics(const nlohmann::json& line) = 0;  // metrics.jsonl (may no-op)
  virtual void Note(const std::string& line) = 0;        // what the learner prints
};

class LearnerCore {
 public:
  // backend: rank 0's (its table and size); frags: its table partitioned (PartitionFragments);
  // incarnation: drawn by the runtime. options, backend, outer and port outlive the core.
  LearnerCore(const LearnerOptions& options, const TrainingBackend& backend, OuterState& outer,
              std::vector<Fragment> frags, uint64_t incarnation, LearnerPort* port);

  // The bases from the outer state (its setup over the fragments' ranges).
  Status SetUp();

  // Startup: until Joined(), OnJoinTimer (Heartbeat(kJoining) every 20 ms, Hello every 50 ms)
  // and the messages; then Start: from init_params (version 0, buffered Globals apply) or, with
  // join_from_snapshot, awaiting the snapshot it requests (OnTimer) while Globals are buffered.
  Status OnJoinTimer();
  bool Joined() const { return welcomed_ && downlink_seen_; }
  Status Start(bool join_from_snapshot);
  bool AwaitingSnapshot() const { return clone_.awaiting_snapshot(); }
  // Training begins: the first heartbeat of this state, the clock of train.time_limit_s.
  Status BeginTraining();

  // Messages that passed the runtime's checks (ParseEnvelope with this core's expectations).
  Status OnDownlink(net::Received& r, const ParsedMessage& m);  // Global, SyncerStatus
  Status OnDealer(ParsedMessage& m);                            // Welcome, Snapshot parts
  // Timers: a snapshot request when one is due, lost deltas sent again, a heartbeat when due.
  Status OnTimer();

  // The inner loop's hook: before step `at`, appends the ranges this learner rewrote to
  // control->changed and sets the LR clock (and stop at train.time_limit_s). Blocked(): a
  // lock-step mode waits for a Global; the runtime then delivers messages and timers and calls
  // BeforeStep again until it is not (the wait is counted in the result).
  Status BeforeStep(long at, StepControl* control);
  bool Blocked() const;
  // After a step: step_s is its time as the learner lived it (slowed, or virtual); r.step_s its
  // own time (goodput's nominal rate). Sends the deltas whose cadence fires.
  Status AfterStep(const StepResult& r, double step_s);

  // The end: BeginFlush starts the flush_timeout_ms clock; until Flushed, messages and timers;
  // SendRemaining sends the work since each fragment's last send; until Flushed again; Finish.
  void BeginFlush();
  bool Flushed() const;
  Status SendRemaining();
  // The last word: a final heartbeat (finished, or stopping), or, crashed, nothing.
  Status Finish(bool crashed, bool stopped);
  // The result of an incarnation that dies now (nothing more is sent): its counters, crashed,
  // and per fragment the tokens that had not left in a delta.
  LearnerResult CrashedResult();

  // What progress reports name: the ring's devices and ranks.
  void SetRing(const std::string& description, int ranks) {
    progress_.device = description;
    progress_.ranks = ranks;
  }

  // The step the learner is at, its state, what it has done.
  long step() const { return step_; }
  LearnerState StateNow() const;
  const LearnerResult& result() const { return res_; }
  // Per fragment: the version of the global it last folded.
  std::vector<uint64_t> BaseVersions() const;
  // Called on the inner loop's thread, reported through options.on_progress.
  void Report(LearnerState state);
  // Bytes the runtime sent for the learner outside the core (the liveness thread's beats).
  void AddBytesUp(uint64_t bytes) { res_.bytes_up += bytes; }
  // A ring command that failed where no Status could be returned ends the learner at its next step.
  const Status& outer_error() const { return outer_error_; }

 private:
  // Sending.
  Status Build(uint64_t* seq, const MessageBody& body, std::shared_ptr<std::vector<uint8_t>> payload, net::Message* out);
  Status Send(const MessageBody& body, std::shared_ptr<std::vector<uint8_t>> payload);
  Status SendDealerMessage(const MessageBody& body);
  Status Heartbeat(LearnerState state);
  Status BeatIfDue();
  HelloMsg Hello() const;
  Status SendDelta(int p, long at_step);
  Status EncodeUplink(int p, std::vector<uint8_t>* payload, std::vector<uint64_t>* tensor_bytes, bool* encoded);
  void ResetResidual(int p);
  Status SendFiringDeltas(long done);
  Status ResendLost();
  // Receiving.
  Status HandleGlobal(net::Received& r, const ParsedMessage& m);
  Status ApplyGlobal(const ParsedMessage& m);
  Status DecodeFiniteUpdate(const Fragment& frag, const GlobalMsg& g, const ParsedMessage& m);
  void HandleStatus(const SyncerStatusMsg& st);
  void HandleDropNotices(const std::vector<DroppedDelta>& drops);
  void CheckVersionsAndAcks(const SyncerStatusMsg& st);
  // Snapshots (Clone pattern).
  void NeedSnapshot(const std::string& why);
  Status RequestSnapshot();
  Status InstallSnapshot(std::vector<ParsedMessage>&& parts);
  Status InstallSnapshotPart(ParsedMessage& part);
  Status ApplyBufferedGlobals(const std::map<uint64_t, uint64_t>& versions);
  // Steps.
  void LogStep(const StepResult& r, long done, double step_s);
  void MarkChanged(int p);
  void CloseWait();

  const LearnerOptions& o_;
  const RunConfig& cfg_;
  const TrainConfig& tc_;
  const SyncConfig& sc_;
  const std::string me_;
  const TrainingBackend& backend_;
  LearnerPort& port_;
  OuterState& outer_;
  Status outer_error_;
  LearnerResult res_;
  std::vector<ParamRange> changed_;  // parameters rewritten since the ring last copied them

  const std::vector<Fragment> frags_;
  const int P_;  // fragments
  const int H_;  // sync.inner_steps
  // The host's mirror of each base (the CRC32C check of Globals), the ledger (fragment_ledger.h).
  FragmentLedger ledger_;
  std::vector<std::vector<float>> bases_;
  std::vector<uint8_t> contiguous_;
  // sync.codec.*: sparse codecs and the accumulator encode on the host (EncodeUplink).
  const CodecOptions up_codec_;
  ErrorFeedback up_topk_ef_;
  std::vector<float> up_values_;
  // Steps a fragment may stay in flight before training waits for its Global (ledger Blocks):
  // 0 in diloco, sync.overlap in streaming, never in decoupled.
  const long block_after_;
  ParseOptions expect_;  // the downlink's: buffered Globals are parsed again with it

  const uint64_t incarnation_;
  uint64_t seq_ = 0, dealer_seq_ = 0;
  double step_ms_ema_ = 0;
  float last_loss_;
  long step_;
  net::CloneClient clone_;  // awaiting a snapshot until the start decides otherwise
  LearnerProgress progress_;
  SyncTime last_step_save_;
  bool step_saved_ = false;

  // Snapshot requests (Clone pattern): at most one outstanding; re-sent after snapshot_retry_ms.
  uint64_t request_id_ = 0;
  SyncTime requested_at_;
  bool request_outstanding_ = false;
  std::unique_ptr<SnapshotAssembler> assembler_;
  std::string resync_reason_ = "join";

  std::vector<float> scratch_;
  std::vector<int> lost_deltas_;  // in-flight deltas the syncer's status says it never got
  bool welcomed_ = false, downlink_seen_ = false;
  bool started_ = false;  // the start decided how to leave the initial "awaiting snapshot"
  SyncTime last_hello_, last_join_beat_;
  bool joining_sent_ = false;

  const long tokens_per_step_;
  // sync.lr_clock: global: the latest step each other learner is known at.
  std::map<std::string, uint64_t> known_steps_;
  double recent_sum_ = 0;
  int recent_n_ = 0;
  SyncTime last_beat_;
  SyncTime train_start_;
  // A lock-step wait in progress (BeforeStep found the step blocked).
  bool waiting_ = false;
  SyncTime wait_start_;
  int64_t wait_start_unix_ms_ = 0;
  SyncTime flush_deadline_;
};

}  // namespace diloco
