#include "daemon/train/learner.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <cmath>
#include <cstring>
#include <map>
#include <limits>
#include <random>
#include <thread>

#include "daemon/net/channel.h"
#include "daemon/net/clone.h"
#include "daemon/net/codec.h"
#include "daemon/net/wire_transport.h"
#include "daemon/sync/decide.h"
#include "daemon/sync/fold.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/merge.h"
#include "daemon/sync/protocol.h"
#include "daemon/train/checkpoint.h"
#include "daemon/train/data.h"
#include "daemon/train/fragment_ledger.h"
#include "daemon/train/inner_loop.h"
#include "daemon/train/liveness_sender.h"
#include "daemon/train/local_ring.h"
#include "daemon/train/outer_state.h"
#include "daemon/train/run_dir.h"
#include "daemon/train/step_stretch.h"
#include "daemon/train/trainer.h"
#include "daemon/util/crc32c.h"
#include "kernels/rng.h"

namespace diloco {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t UnixMs() {
  return (uint64_t)std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

net::SocketOptions LearnerSocket(const LearnerOptions& o, const std::string& name) {
  net::SocketOptions so;
  so.name = name;
  so.allow_plaintext = o.allow_plaintext;
  if (o.curve) {
    so.curve = o.curve;
    so.curve->server = false;
  }
  so.link = o.link;
  return so;
}

// A fragment as the backend's sync ops see it: its parameter ranges in packed order.
std::vector<ParamRange> RangesOf(const Fragment& frag) {
  std::vector<ParamRange> out;
  for (const FragmentRange& r : frag.ranges) out.push_back({r.offset, r.numel});
  return out;
}

// The wire codec's numbering is the sync ops' (kernels/sync_ops.h).
SyncCodec SyncCodecOf(CodecKind kind) { return static_cast<SyncCodec>(static_cast<int>(kind)); }

// A verified message's payload in one piece (it arrives in chunks): what the backend decodes.
void ContiguousPayload(const ParsedMessage& m, std::vector<uint8_t>* out) {
  out->clear();
  for (const auto& chunk : m.payload_spans()) out->insert(out->end(), chunk.begin(), chunk.end());
}

// Rank 0 of the learner's ring: everything of RunLearner but the followers. An event loop
// (CONVENTIONS.md): its state is these members; each message, timer and phase is a method, and
// its hook on the inner loop (inner_loop.h) is the outer sync around every step.
class LearnerLoop final : public InnerLoopHook {
 public:
  // train: the learner's sampler (ranks × batch_size rows per step), shared with the followers.
  // frags: backend 0's table partitioned into fragments (PartitionFragments).
  LearnerLoop(net::NetContext& context, const LearnerOptions& o, const BatchSampler& train, LocalRing& ring,
              OuterState& outer,
              std::vector<Fragment> frags);

  // Start, train and flush. *loop_entered: the inner loop started (the followers are in it);
  // *loop_end_crc: rank 0's parameters when the inner loop ended (train.ranks > 1).
  Status Run(bool* loop_entered, uint32_t* loop_end_crc, LearnerResult* result);

  // InnerLoopHook: the outer sync around every step.
  Status BeforeStep(long at, TrainingBackend&, StepControl* control) override;
  Status AfterStep(const StepResult& r, TrainingBackend&) override;

 private:
  // Setup.
  Status SetUpSyncState();
  Status OpenDownlink();
  Status OpenUplink();
  Status OpenSnapshotDealer();
  // Phases of Run.
  Status Handshake(bool* ended);
  HelloMsg Hello() const;
  Status AwaitJoinSnapshot(bool* ended);
  Status StartFromInitParams();
  Status StartLiveness();
  Status Flush();
  bool Settled(Clock::time_point deadline) const;
  Status Finish();
  // Sending.
  Status Build(uint64_t* sq, const MessageBody& body, std::shared_ptr<std::vector<uint8_t>> payload,
               net::Message* out);
  Status Send(const MessageBody& body, std::shared_ptr<std::vector<uint8_t>> payload);
  Status SendDealer(const MessageBody& body);
  Status Heartbeat(LearnerState state);
  Status BeatIfDue();
  Status SendDelta(int p, long at_step);
  Status EncodeUplink(int p, std::vector<uint8_t>* payload, std::vector<uint64_t>* tensor_bytes, bool* encoded);
  void ResetResidual(int p);
  Status SendFiringDeltas(long done);
  Status ResendLost();
  // Receiving.
  Status Poll(int timeout_ms);
  Status HandleDownlink(net::Received& r);
  Status HandleGlobal(net::Received& r);
  Status ApplyGlobal(const ParsedMessage& m);
  Status DecodeFiniteUpdate(const Fragment& frag, const GlobalMsg& g, const ParsedMessage& m);
  void HandleStatus(const SyncerStatusMsg& st);
  void HandleDropNotices(const std::vector<DroppedDelta>& drops);
  void CheckVersionsAndAcks(const SyncerStatusMsg& st);
  Status HandleDealer();
  // Snapshots (Clone pattern).
  void NeedSnapshot(const std::string& why);
  Status RequestSnapshot();
  Status InstallSnapshot(std::vector<ParsedMessage>&& parts);
  Status InstallSnapshotPart(ParsedMessage& part);
  Status ApplyBufferedGlobals(const std::map<uint64_t, uint64_t>& versions);
  // Steps.
  Status WaitForBlockedFragments();
  Status WaitUntil(const std::function<bool()>& done, const std::string& what);
  double StretchStep(double step_s);
  Status SaveMomentsIfDue(long done);
  void LogStep(const StepResult& r, long done, double step_s);
  // State.
  void MarkChanged(int p);
  void Report(LearnerState state);
  LearnerState StateNow() const;
  std::vector<uint64_t> BaseVersions() const;
  bool Crashed() const;
  bool Stopping() const;

  net::NetContext& context_;
  const LearnerOptions& o_;
  const RunConfig& cfg_;
  const TrainConfig& tc_;
  const SyncConfig& sc_;
  const std::string me_;
  const BatchSampler& train_;
  LocalRing& ring_;
  TrainingBackend& backend_;
  // The outer-sync state: on backend_, or sharded over the ring (outer_state.h). A ring command
  // that failed where no Status could be returned (a handler of a syncer status) is kept here and
  // ends the learner at its next step.
  OuterState& outer_;
  Status outer_error_;
  LearnerResult res_;
  std::vector<ParamRange> changed_;  // parameters rewritten since the ring last copied them

  const std::vector<Fragment> frags_;
  const int P_;  // fragments
  const int H_;  // sync.inner_steps
  // The outer-sync state lives on the backend (base, θ at send, residual: sync_*); the host keeps
  // a mirror of each base, updated from the same decoded bytes, to check the Globals' CRC32C. The
  // ledger (fragment_ledger.h) keeps versions, counters and what is in flight.
  FragmentLedger ledger_;
  std::vector<std::vector<float>> bases_;
  std::vector<uint8_t> contiguous_;
  // sync.codec.*: with top-k on the uplink the backend hands Δ over in fp32 (its residual stays
  // zero) and the host encodes it, keeping the residual here (EncodeUplink).
  const CodecOptions up_codec_;
  ErrorFeedback up_topk_ef_;
  std::vector<float> up_values_;
  // Steps a fragment may stay in flight before training waits for its Global (ledger Blocks):
  // 0 in diloco, sync.overlap in streaming, never in decoupled.
  const long block_after_;

  // Sockets (this thread's).
  std::shared_ptr<ParsedMessage> parsed_ = std::make_shared<ParsedMessage>();
  ParseOptions expect_;
  std::unique_ptr<net::SubChannel> down_;
  std::unique_ptr<net::PubChannel> up_;
  std::shared_ptr<ParsedMessage> dparsed_ = std::make_shared<ParsedMessage>();
  std::unique_ptr<net::DealerChannel> dealer_;

  const uint64_t incarnation_;
  uint64_t seq_ = 0, dealer_seq_ = 0;

  double step_ms_ema_ = 0;
  float last_loss_ = std::numeric_limits<float>::quiet_NaN();
  long step_;
  net::CloneClient clone_;  // awaiting a snapshot until the start decides otherwise
  LearnerProgress progress_;
  Clock::time_point last_step_save_ = Clock::now() - std::chrono::hours(1);
  std::unique_ptr<LivenessSender> liveness_;  // started once the handshake is through

  // Snapshot requests (Clone pattern): at most one outstanding; re-sent after snapshot_retry_ms.
  uint64_t request_id_ = 0;
  Clock::time_point requested_at_ = Clock::now();
  bool request_outstanding_ = false;
  std::unique_ptr<SnapshotAssembler> assembler_;
  std::string resync_reason_ = "join";

  std::vector<float> scratch_;
  // In-flight deltas the syncer's status says it never got: sent again (ResendLost).
  std::vector<int> lost_deltas_;
  Clock::time_point last_downlink_ = Clock::now();

  // Startup exchange state (see the header).
  bool welcomed_ = false, downlink_seen_ = false;

  std::vector<net::Socket*> sockets_;
  std::vector<bool> ready_;
  bool started_ = false;  // the start decided how to leave the initial "awaiting snapshot"

  const long tokens_per_step_;
  StepStretch stretch_;
  // sync.lr_clock: global: the latest step each other learner is known at (the syncer's status
  // lists each live learner's heartbeat step; a learner that finished or died keeps its last).
  std::map<std::string, uint64_t> known_steps_;
  double recent_sum_ = 0;
  int recent_n_ = 0;
  Clock::time_point last_beat_ = Clock::now() - std::chrono::hours(1);
  Clock::time_point train_start_;
};

LearnerLoop::LearnerLoop(net::NetContext& context, const LearnerOptions& o, const BatchSampler& train,
                         LocalRing& ring, OuterState& outer, std::vector<Fragment> frags)
    : context_(context),
      o_(o),
      cfg_(*o.config),
      tc_(cfg_.train),
      sc_(cfg_.sync),
      me_(LearnerName(o.index)),
      train_(train),
      ring_(ring),
      backend_(ring.backend(0)),
      outer_(outer),
      frags_(std::move(frags)),
      P_((int)frags_.size()),
      H_(sc_.inner_steps),
      ledger_(P_, sc_.fold, sc_.max_staleness),
      bases_(P_),
      up_codec_(UplinkCodec(sc_)),
      up_topk_ef_(up_codec_, LinkFeedback(sc_)),
      block_after_(sc_.mode == SyncMode::kDiloco      ? 0
                   : sc_.mode == SyncMode::kStreaming ? sc_.overlap
                                                      : std::numeric_limits<long>::max()),
      incarnation_(std::random_device{}() | (uint64_t{std::random_device{}()} << 32)),
      step_(o.start_step),
      tokens_per_step_((long)LearnerTokensPerStep(cfg_)),
      stretch_(cfg_, o.index) {
  progress_.index = o.index;
  progress_.device = ring.description();
  progress_.ranks = ring.world_ranks();
}

Status LearnerLoop::Run(bool* loop_entered, uint32_t* loop_end_crc, LearnerResult* result) {
  DL_RETURN_IF_ERROR(SetUpSyncState());
  // The downlink first, so nothing published after the handshake is missed.
  DL_RETURN_IF_ERROR(OpenDownlink());
  DL_RETURN_IF_ERROR(OpenUplink());
  DL_RETURN_IF_ERROR(OpenSnapshotDealer());

  bool ended = false;  // crashed or stopped before training
  DL_RETURN_IF_ERROR(Handshake(&ended));
  if (!ended) {
    started_ = true;
    if (o_.join_from_snapshot) {
      DL_RETURN_IF_ERROR(AwaitJoinSnapshot(&ended));
    } else {
      DL_RETURN_IF_ERROR(StartFromInitParams());
    }
  }
  if (ended) {
    *result = res_;
    return Status::Ok();
  }
  DL_RETURN_IF_ERROR(Heartbeat(StateNow()));
  last_beat_ = Clock::now();
  Report(StateNow());
  DL_RETURN_IF_ERROR(StartLiveness());

  train_start_ = Clock::now();
  res_.train_start_unix_ms = (int64_t)UnixMs();
  *loop_entered = true;
  DL_RETURN_IF_ERROR(RunInnerLoop(RankLoopOptions(cfg_, train_, 0, step_), backend_, ring_.comm(0), this, &step_));
  if (ring_.ranks() > 1) *loop_end_crc = ParamsCrc32c(backend_);  // before the last polls fold into rank 0
  res_.steps = step_;
  if (!o_.run_dir.empty()) DL_RETURN_IF_ERROR(SaveLearnerStep(o_.run_dir, o_.index, step_));
  if (!res_.crashed) DL_RETURN_IF_ERROR(Flush());
  DL_RETURN_IF_ERROR(Finish());
  *result = res_;
  return Status::Ok();
}

Status LearnerLoop::SetUpSyncState() {
  std::vector<std::vector<ParamRange>> ranges;
  for (const Fragment& frag : frags_) ranges.push_back(RangesOf(frag));
  DL_RETURN_IF_ERROR(outer_.Setup(ranges, sc_.codec.block).WithContext(me_));
  for (int p = 0; p < P_; p++) {
    bases_[p].resize(frags_[p].numel);
    DL_RETURN_IF_ERROR(outer_.ReadBase(p, bases_[p].data()).WithContext(me_));
  }
  return Status::Ok();
}

Status LearnerLoop::OpenDownlink() {
  expect_.job_id = o_.job_id;
  expect_.accept = MessageBit(MessageType::kGlobal) | MessageBit(MessageType::kSyncerStatus);
  expect_.model_params = backend_.num_params();
  expect_.allowed_senders = {kSyncerName};
  net::ReceiveOptions ro;
  // Globals are verified and decoded where ZeroMQ received them (no copy of the payload).
  ro.validator = net::EnvelopeValidatorInPlace(expect_, parsed_);
  net::SocketOptions so = LearnerSocket(o_, me_ + ".downlink");
  so.recv_hwm_msgs = 100000;
  DL_RETURN_IF_ERROR(net::SubChannel::Create(context_, so, ro, &down_));
  DL_RETURN_IF_ERROR(down_->Subscribe(o_.job_id));
  DL_RETURN_IF_ERROR(down_->Connect(o_.downlink_endpoint).WithContext(me_ + " downlink"));
  return Status::Ok();
}

Status LearnerLoop::OpenUplink() {
  net::SocketOptions po = LearnerSocket(o_, me_ + ".uplink");
  po.send_hwm_msgs = 100000;
  DL_RETURN_IF_ERROR(net::PubChannel::Create(context_, po, &up_));
  DL_RETURN_IF_ERROR(up_->Connect(o_.uplink_endpoint).WithContext(me_ + " uplink"));
  return Status::Ok();
}

Status LearnerLoop::OpenSnapshotDealer() {
  ParseOptions dexpect = expect_;
  dexpect.accept = MessageBit(MessageType::kWelcome) | MessageBit(MessageType::kSnapshot);
  net::ReceiveOptions dro;
  dro.validator = net::EnvelopeValidator(dexpect, dparsed_);
  dro.track_sequence = false;  // replies to requests: the syncer numbers them across all learners
  net::SocketOptions dso = LearnerSocket(o_, me_ + ".snapshot");
  dso.recv_hwm_msgs = 100000;
  dso.linger_ms = 0;
  DL_RETURN_IF_ERROR(net::DealerChannel::Create(context_, dso, dro, &dealer_));
  if (o_.snapshot_endpoint.empty())
    return Status::Error(me_ + ": no snapshot endpoint (the syncer's ROUTER) given");
  DL_RETURN_IF_ERROR(dealer_->Connect(o_.snapshot_endpoint).WithContext(me_ + " snapshot endpoint"));
  sockets_ = {&down_->socket(), &dealer_->socket()};
  return Status::Ok();
}

// Startup exchange: Heartbeat(kJoining) on the uplink, Hello on the DEALER, until Welcome
// and a downlink message (both directions up). *ended: crashed or stopped meanwhile.
Status LearnerLoop::Handshake(bool* ended) {
  Report(LearnerState::kJoining);
  const HelloMsg hello = Hello();
  const auto t0 = Clock::now();
  auto last_hello = t0 - std::chrono::hours(1);
  auto last_join_beat = t0 - std::chrono::hours(1);
  while (!(welcomed_ && downlink_seen_)) {
    if (Crashed()) {
      res_.crashed = true;
      *ended = true;
      return Status::Ok();
    }
    if (Stopping()) {
      res_.stopped = true;
      *ended = true;
      return Status::Ok();
    }
    const auto now = Clock::now();
    if (now - t0 > std::chrono::milliseconds(o_.handshake_timeout_ms))
      return Status::Error(me_ + ": no answer from the syncer (uplink " + o_.uplink_endpoint + ", downlink " +
                           o_.downlink_endpoint + ", snapshot " + o_.snapshot_endpoint + ") within " +
                           std::to_string(o_.handshake_timeout_ms) + " ms; is it running, and are the keys right?");
    if (now - last_join_beat >= std::chrono::milliseconds(20)) {
      DL_RETURN_IF_ERROR(Heartbeat(LearnerState::kJoining));
      last_join_beat = now;
    }
    if (now - last_hello >= std::chrono::milliseconds(50)) {
      DL_RETURN_IF_ERROR(SendDealer(hello));
      last_hello = now;
    }
    DL_RETURN_IF_ERROR(Poll(10));
  }
  return Status::Ok();
}

HelloMsg LearnerLoop::Hello() const {
  HelloMsg hello;
  hello.role = PeerRole::kLearner;
  hello.tensor_table_digest = backend_.table().digest();
  hello.num_params = backend_.num_params();
  hello.num_fragments = (uint32_t)P_;
  hello.fragment_layout_digest = FragmentsDigest(frags_);
  hello.build = "dilocod learner";
  return hello;
}

// Train only once the snapshot is in (Poll sends the request; Globals are buffered meanwhile).
// *ended: crashed or stopped meanwhile.
Status LearnerLoop::AwaitJoinSnapshot(bool* ended) {
  resync_reason_ = "join";
  Report(LearnerState::kResyncing);
  const auto t0 = Clock::now();
  while (clone_.awaiting_snapshot()) {
    if (Crashed() || Stopping()) {
      res_.crashed = Crashed();
      res_.stopped = !res_.crashed;
      *ended = true;
      return Status::Ok();
    }
    DL_RETURN_IF_ERROR(BeatIfDue());
    DL_RETURN_IF_ERROR(Poll(10));
    if (Clock::now() - t0 > std::chrono::milliseconds(o_.handshake_timeout_ms))
      return Status::Error(me_ + ": no snapshot from the syncer at " + o_.snapshot_endpoint + " within " +
                           std::to_string(o_.handshake_timeout_ms) + " ms");
  }
  return Status::Ok();
}

// Version 0 of every fragment is init_params; Globals buffered so far apply now.
Status LearnerLoop::StartFromInitParams() {
  std::map<uint64_t, uint64_t> zero;
  for (int p = 0; p < P_; p++) zero[(uint64_t)p] = 0;
  return ApplyBufferedGlobals(zero);
}

// From here on liveness beats come from their own thread (liveness_sender.h).
Status LearnerLoop::StartLiveness() {
  LivenessOptions lo;
  lo.job_id = o_.job_id;
  lo.sender = me_;
  lo.incarnation = incarnation_;
  lo.endpoint = o_.uplink_endpoint;
  lo.socket = LearnerSocket(o_, me_ + ".liveness");
  lo.socket.linger_ms = 0;
  lo.interval_ms = o_.heartbeat_interval_ms;
  lo.crash = o_.crash;
  DL_RETURN_IF_ERROR(LivenessSender::Start(context_, lo, &liveness_));
  return Heartbeat(StateNow());  // gives the liveness thread its first beat
}

// Flush, so no work is lost at the end: the deltas in flight are merged or let go (lost ones
// go again), then the work since each fragment's last send goes out, and the learner stays
// until the syncer has merged that too (within flush_timeout_ms).
Status LearnerLoop::Flush() {
  const auto deadline = Clock::now() + std::chrono::milliseconds(o_.flush_timeout_ms);
  auto settled = [&] { return Settled(deadline); };
  DL_RETURN_IF_ERROR(WaitUntil(settled, "flushing: waiting for the globals of the deltas in flight"));
  if (!clone_.awaiting_snapshot())
    for (int p = 0; p < P_; p++)
      if (!ledger_[p].in_flight && ledger_[p].c_steps > 0) DL_RETURN_IF_ERROR(SendDelta(p, step_));
  DL_RETURN_IF_ERROR(WaitUntil(settled, "flushing: waiting for the syncer to merge the last deltas"));
  for (int p = 0; p < P_; p++)
    if (ledger_[p].in_flight)
      std::fprintf(stderr, "%s: fragment %d's last delta was not merged within %d ms of the end\n", me_.c_str(), p,
                   o_.flush_timeout_ms);
  res_.crashed = o_.crash && o_.crash->load();
  return Status::Ok();
}

bool LearnerLoop::Settled(Clock::time_point deadline) const {
  return (!ledger_.AnyInFlight() && !clone_.awaiting_snapshot() && lost_deltas_.empty()) || Clock::now() > deadline;
}

// The last word: a final heartbeat (finished or stopping), or, crashed, the work lost with it.
Status LearnerLoop::Finish() {
  if (liveness_) {
    liveness_->Stop();  // the last beat below is the final word
    res_.bytes_up += liveness_->bytes_sent();
  }
  if (!res_.crashed) {
    const LearnerState final_state = res_.stopped ? LearnerState::kStopping : LearnerState::kFinished;
    DL_RETURN_IF_ERROR(Heartbeat(final_state));
    DL_RETURN_IF_ERROR(Poll(0));
    Report(final_state);
    res_.end_unix_ms = (int64_t)UnixMs();
  } else {
    Report(LearnerState::kFailed);
    res_.crashed_unix_ms = (int64_t)UnixMs();
    for (int p = 0; p < P_; p++) {
      const LedgerFragment& f = ledger_[p];
      res_.unsent_tokens_at_crash.push_back(f.c_tokens - (f.in_flight ? std::min(f.c_tokens, f.c_tokens_at_send) : 0));
    }
  }
  return Status::Ok();
}

Status LearnerLoop::Build(uint64_t* sq, const MessageBody& body, std::shared_ptr<std::vector<uint8_t>> payload,
                          net::Message* out) {
  EnvelopeHeader h;
  h.job_id = o_.job_id;
  h.sender = me_;
  h.seq = ++*sq;
  h.incarnation = incarnation_;
  h.sent_unix_ms = UnixMs();
  OutgoingMessage om;
  std::span<const uint8_t> bytes;
  if (payload) bytes = {payload->data(), payload->size()};
  DL_RETURN_IF_ERROR(BuildMessage(h, body, bytes, &om));
  res_.bytes_up += om.wire_bytes();
  *out = net::ToMessage(std::move(om), payload);
  return Status::Ok();
}

Status LearnerLoop::Send(const MessageBody& body, std::shared_ptr<std::vector<uint8_t>> payload) {
  net::Message m;
  DL_RETURN_IF_ERROR(Build(&seq_, body, std::move(payload), &m));
  (void)up_->Publish(o_.job_id, m);
  return Status::Ok();
}

Status LearnerLoop::SendDealer(const MessageBody& body) {
  net::Message m;
  DL_RETURN_IF_ERROR(Build(&dealer_seq_, body, nullptr, &m));
  (void)dealer_->Send(m, 0);  // queued until connected; a full queue: retried later
  return Status::Ok();
}

Status LearnerLoop::Heartbeat(LearnerState state) {
  HeartbeatMsg hb;
  hb.state = state;
  hb.step = step_;
  hb.tokens = res_.tokens;
  hb.loss = last_loss_;
  hb.tokens_per_s = res_.train_s > 0 ? (float)(res_.tokens / res_.train_s) : 0.f;
  hb.step_time_ms = (float)step_ms_ema_;
  hb.interval_ms = o_.heartbeat_interval_ms;
  for (int p = 0; p < P_; p++) {
    const LedgerFragment& f = ledger_[p];
    hb.fragments.push_back({(uint32_t)p, f.base_version, f.c_steps, f.c_tokens, f.in_flight});
  }
  if (liveness_) liveness_->Update(hb);
  return Send(hb, nullptr);
}

Status LearnerLoop::BeatIfDue() {
  if (Clock::now() - last_beat_ < std::chrono::milliseconds(o_.heartbeat_interval_ms)) return Status::Ok();
  last_beat_ = Clock::now();
  return Heartbeat(StateNow());
}

Status LearnerLoop::SendDelta(int p, long at_step) {
  const LedgerFragment& f = ledger_[p];
  const Fragment& frag = frags_[p];
  auto payload = std::make_shared<std::vector<uint8_t>>();
  std::vector<uint64_t> tensor_bytes;
  bool encoded = false;
  DL_RETURN_IF_ERROR(EncodeUplink(p, payload.get(), &tensor_bytes, &encoded));
  if (!encoded)
    return Status::Error(me_ + ": the delta of fragment " + std::to_string(p) + " at step " +
                         std::to_string(at_step) + " is NaN or Inf (or overflows the codec); try a lower train.lr");
  DeltaMsg d;
  d.fragment = (uint32_t)p;
  d.base_version = f.base_version;
  d.c_steps = f.c_steps;
  d.c_tokens = f.c_tokens;
  d.learner_step = (uint64_t)at_step;
  d.payload = FragmentPayloadInfo(frag, up_codec_, tensor_bytes);
  DL_RETURN_IF_ERROR(Send(d, payload));
  ledger_.OnSend(p, at_step, seq_);  // seq_: the delta's number on the main stream
  res_.deltas_sent++;
  progress_.last_fragment_sent = p;
  return Status::Ok();
}

// Δ = base − θ (θ at send is kept where the parameters live), encoded with error feedback:
// dense codecs with the plain residual by the backend; sparse codecs (top-k, topk_chunked) and the
// decaying accumulator (sync.codec.feedback: accumulate) on the host from the backend's exact fp32
// Δ + residual, whose residual is then zero (fp32 loses nothing), the host one kept in
// up_topk_ef_. false when a value is not finite.
Status LearnerLoop::EncodeUplink(int p, std::vector<uint8_t>* payload, std::vector<uint64_t>* tensor_bytes,
                                 bool* encoded) {
  if (!IsSparseCodec(up_codec_) && up_topk_ef_.feedback().rule == FeedbackRule::kResidual)
    return outer_.EncodeDelta(p, SyncCodecOf(up_codec_.kind), up_codec_.block_size, payload, tensor_bytes, encoded)
        .WithContext(me_);
  DL_RETURN_IF_ERROR(
      outer_.EncodeDelta(p, SyncCodec::kFp32, up_codec_.block_size, payload, tensor_bytes, encoded).WithContext(me_));
  if (!*encoded) return Status::Ok();
  up_values_.resize(payload->size() / sizeof(float));
  std::memcpy(up_values_.data(), payload->data(), up_values_.size() * sizeof(float));
  *encoded = up_topk_ef_.Encode((uint32_t)p, up_values_, FragmentNumels(frags_[p]), payload, tensor_bytes).ok();
  return Status::Ok();
}

// Drops what error feedback carries for fragment p (its delta was dropped, lost or resynced).
void LearnerLoop::ResetResidual(int p) {
  if (Status st = outer_.ResetResidual(p); !st.ok() && outer_error_.ok()) outer_error_ = st.WithContext(me_);
  up_topk_ef_.Reset((uint32_t)p);
}

// The fragments whose cadence fires after step done. No deltas while a snapshot is awaited: the
// bases are about to change.
Status LearnerLoop::SendFiringDeltas(long done) {
  for (int p = 0; p < P_; p++)
    if (Fires(p, done, H_, P_) && !ledger_[p].in_flight && !clone_.awaiting_snapshot())
      DL_RETURN_IF_ERROR(SendDelta(p, done));
  return Status::Ok();
}

// Lost deltas go again with all the work since their base (not while a snapshot is awaited:
// the bases are about to change, and the snapshot settles what is in flight).
Status LearnerLoop::ResendLost() {
  if (clone_.awaiting_snapshot()) return Status::Ok();
  std::vector<int> lost;
  lost.swap(lost_deltas_);
  for (int p : lost)
    if (!ledger_[p].in_flight && ledger_[p].c_steps > 0) DL_RETURN_IF_ERROR(SendDelta(p, step_));
  return Status::Ok();
}

Status LearnerLoop::Poll(int timeout_ms) {
  if (timeout_ms > 0 && !net::PollReadable(sockets_, timeout_ms, &ready_)) return Status::Ok();
  net::Received r;
  while (down_->Receive(&r, 0) == net::RecvResult::kMessage) DL_RETURN_IF_ERROR(HandleDownlink(r));
  while (dealer_->Receive(&r, 0) == net::RecvResult::kMessage) DL_RETURN_IF_ERROR(HandleDealer());
  if (started_ && clone_.awaiting_snapshot() &&
      (!request_outstanding_ || Clock::now() - requested_at_ > std::chrono::milliseconds(o_.snapshot_retry_ms)))
    DL_RETURN_IF_ERROR(RequestSnapshot());
  return Status::Ok();
}

// A downlink message (its parse in *parsed_, its frames in r): a Global or a SyncerStatus.
Status LearnerLoop::HandleDownlink(net::Received& r) {
  downlink_seen_ = true;
  last_downlink_ = Clock::now();
  res_.bytes_down += parsed_->wire_bytes;
  if (parsed_->get<GlobalMsg>()) DL_RETURN_IF_ERROR(HandleGlobal(r));
  if (const SyncerStatusMsg* st = parsed_->get<SyncerStatusMsg>()) HandleStatus(*st);
  return Status::Ok();
}

// A Global from the downlink (its parse in *parsed_, its frames in r).
Status LearnerLoop::HandleGlobal(net::Received& r) {
  const GlobalMsg* g = parsed_->get<GlobalMsg>();
  if ((int)g->fragment >= P_) return Status::Ok();
  net::VersionedUpdate u;
  u.key = g->fragment;
  u.version = g->version;
  u.full = false;  // the syncer sends updates only; a full Global would be applied as a gap
  u.message = std::move(r.message);
  std::vector<net::VersionedUpdate> apply;
  const net::CloneVerdict v = clone_.OnUpdate(std::move(u), &apply);
  if (v == net::CloneVerdict::kApply) return ApplyGlobal(*parsed_);
  if (v == net::CloneVerdict::kGap) {
    res_.gaps++;
    NeedSnapshot("gap in the global stream of fragment " + std::to_string(g->fragment));
  }
  return Status::Ok();
}

// Applies one Global that is the next version of its fragment (the CloneClient said so).
Status LearnerLoop::ApplyGlobal(const ParsedMessage& m) {
  const GlobalMsg* g = m.get<GlobalMsg>();
  const int p = (int)g->fragment;
  std::vector<float>& base = bases_[p];
  const Fragment& frag = frags_[p];
  // An update that does not decode, or is not finite, would poison every parameter it touches:
  // refuse it and resync from a snapshot.
  if (Status decoded = DecodeFiniteUpdate(frag, *g, m); !decoded.ok()) {
    res_.globals_refused++;
    std::fprintf(stderr, "%s: refusing Global %llu of fragment %d (%s); resyncing\n", me_.c_str(),
                 (unsigned long long)g->version, p, decoded.message().c_str());
    NeedSnapshot("refused global of fragment " + std::to_string(p));
    return Status::Ok();
  }
  const bool included_self = std::any_of(g->contributors.begin(), g->contributors.end(),
                                         [&](const Contributor& c) { return c.learner == me_; });
  ApplyUpdate(scratch_.data(), frag.numel, base.data());
  // A dense update is applied from its encoded bytes (on a GPU only those cross); a top-k one,
  // which the backend does not decode, from its decoded values (scratch_) as an fp32 payload.
  const bool topk = g->payload.topk_fraction != 0 || g->payload.codec == CodecKind::kTopkChunked;
  if (!topk) ContiguousPayload(m, &contiguous_);
  const uint8_t* update = topk ? reinterpret_cast<const uint8_t*>(scratch_.data()) : contiguous_.data();
  const size_t update_bytes = topk ? frag.numel * sizeof(float) : contiguous_.size();
  bool applied = false;
  DL_RETURN_IF_ERROR(outer_
                         .ApplyUpdate((int)g->fragment, update, update_bytes,
                                      topk ? SyncCodec::kFp32 : SyncCodecOf(g->payload.codec), g->payload.block_size,
                                      &applied)
                         .WithContext(me_));
  if (!applied)
    return Status::Error(me_ + ": the backend refused the Global of fragment " + std::to_string(g->fragment) +
                         " that the wire codec accepted; this is a bug");
  if (Crc32c(base.data(), frag.numel * sizeof(float)) != g->fragment_crc32c) {
    // Our copy of Θ_p is not the syncer's: fetch it (the local θ_p, and a delta in flight,
    // stay until then: a lock-step learner keeps waiting for the snapshot).
    ledger_.OnCrcMismatch(p, g->version);
    res_.crc_mismatches++;
    NeedSnapshot("crc mismatch on fragment " + std::to_string(g->fragment) + " version " +
                 std::to_string(g->version));
    return Status::Ok();
  }
  const GlobalFold fold = ledger_.OnGlobal(p, g->version, included_self);
  DL_RETURN_IF_ERROR(outer_
                         .Fold(p, FoldModeOf(sc_.fold), sc_.alpha,
                               fold.ours_included ? FoldIncluded::kAtSend : FoldIncluded::kPreviousBase)
                         .WithContext(me_));
  if (fold.shift_at_send) DL_RETURN_IF_ERROR(outer_.ShiftAtSend(p).WithContext(me_));
  MarkChanged(p);
  res_.globals_applied++;
  progress_.last_fragment_folded = (int)g->fragment;
  return Status::Ok();
}

// A Global's update decoded into scratch_; an error when it does not decode or is not finite.
Status LearnerLoop::DecodeFiniteUpdate(const Fragment& frag, const GlobalMsg& g, const ParsedMessage& m) {
  Status decoded = DecodeFragmentPayload(frag, g.payload, m, &scratch_);
  if (decoded.ok() && !std::all_of(scratch_.begin(), scratch_.end(), [](float x) { return std::isfinite(x); }))
    decoded = Status::Error("its update is not finite");
  return decoded;
}

// A SyncerStatus (fragment_ledger.h, Status and Drop):
//  - a drop notice for our in-flight delta: no Global will include it, so stop waiting; the next
//    delta of that fragment carries all the progress since its base (the error-feedback
//    residual of the dropped one goes too). A base from the future: the syncer went back: resync;
//  - a version that differs from our base: we missed a Global (or the syncer went back): resync;
//  - an in-flight delta the syncer has heard past and does not hold: lost; sent again at once
//    (lost_deltas_), so a lock-step round is not left waiting for it.
void LearnerLoop::HandleStatus(const SyncerStatusMsg& st) {
  HandleDropNotices(st.recent_drops);
  for (size_t i = 0; i < st.live_steps.size() && i < st.live_learners.size(); i++)
    if (st.live_learners[i] != me_ && st.live_steps[i] > 0) known_steps_[st.live_learners[i]] = st.live_steps[i];
  if (clone_.awaiting_snapshot()) return;  // Globals are buffered: the bases are not current
  CheckVersionsAndAcks(st);
}

void LearnerLoop::HandleDropNotices(const std::vector<DroppedDelta>& drops) {
  for (const DroppedDelta& d : drops) {
    if (d.learner != me_ || d.fragment >= (uint32_t)P_) continue;
    if (!ledger_.OnDrop((int)d.fragment, d.base_version)) continue;
    ResetResidual((int)d.fragment);
    res_.deltas_dropped++;
    std::fprintf(stderr, "%s: the syncer dropped our delta of fragment %u (base %llu): %s\n", me_.c_str(),
                 d.fragment, (unsigned long long)d.base_version, d.reason.c_str());
    if (d.reason == ToString(StalenessVerdict::kFromTheFuture))
      NeedSnapshot("the syncer is behind our base of fragment " + std::to_string(d.fragment));
  }
}

void LearnerLoop::CheckVersionsAndAcks(const SyncerStatusMsg& st) {
  const LearnerAck* ack = nullptr;
  for (const LearnerAck& a : st.acks)
    if (a.learner == me_ && a.incarnation == incarnation_) ack = &a;
  const StatusVerdict v = ledger_.OnStatus(st.versions, ack);
  if (!v.missed.empty()) {
    res_.globals_missed += v.missed.size();
    const int p = v.missed.front();
    NeedSnapshot("fragment " + std::to_string(p) + " is at version " + std::to_string(st.versions[p]) +
                 " at the syncer, ours is " + std::to_string(ledger_[p].base_version));
  }
  for (int p : v.lost) {
    ResetResidual(p);
    res_.deltas_lost++;
    lost_deltas_.push_back(p);
    std::fprintf(stderr, "%s: our delta of fragment %d (base %llu) never reached the syncer; sending again\n",
                 me_.c_str(), p, (unsigned long long)ledger_[p].sent_base);
  }
}

// A DEALER message (its parse in *dparsed_): a Welcome or a part of the snapshot asked for.
Status LearnerLoop::HandleDealer() {
  res_.bytes_down += dparsed_->wire_bytes;
  if (const WelcomeMsg* w = dparsed_->get<WelcomeMsg>()) {
    if (w->result == JoinResult::kAccepted) {
      welcomed_ = true;
    } else if (w->result != JoinResult::kBusy) {
      return Status::Error(me_ + ": the syncer at " + o_.snapshot_endpoint + " refused this learner: " + w->reason);
    }
    return Status::Ok();
  }
  if (dparsed_->get<SnapshotMsg>() && assembler_ && request_outstanding_) {
    if (dparsed_->get<SnapshotMsg>()->request_id != request_id_) return Status::Ok();  // an older answer
    if (Status st = assembler_->Add(std::move(*dparsed_)); !st.ok()) {
      std::fprintf(stderr, "%s: dropping a snapshot part (%s); will ask again\n", me_.c_str(), st.message().c_str());
      return Status::Ok();
    }
    if (assembler_->complete()) return InstallSnapshot(assembler_->Take());
  }
  return Status::Ok();
}

void LearnerLoop::NeedSnapshot(const std::string& why) {
  clone_.BeginSnapshot();
  resync_reason_ = why;
}

Status LearnerLoop::RequestSnapshot() {
  SnapshotRequestMsg rq;
  rq.request_id = ++request_id_;
  rq.reason = resync_reason_;
  assembler_ = std::make_unique<SnapshotAssembler>(request_id_, backend_.num_params() * sizeof(float) + (1 << 20));
  request_outstanding_ = true;
  requested_at_ = Clock::now();
  return SendDealer(rq);
}

// A complete snapshot: install the fragments that differ, then the buffered newer Globals.
Status LearnerLoop::InstallSnapshot(std::vector<ParsedMessage>&& parts) {
  for (ParsedMessage& part : parts) DL_RETURN_IF_ERROR(InstallSnapshotPart(part));
  std::map<uint64_t, uint64_t> versions;
  const std::vector<uint64_t>& cut = parts.front().get<SnapshotMsg>()->versions;
  for (int p = 0; p < P_; p++) versions[(uint64_t)p] = cut[p];
  res_.snapshots_installed++;
  request_outstanding_ = false;
  return ApplyBufferedGlobals(versions);
}

// One fragment of a snapshot, checked; installed when it differs from what this learner holds.
Status LearnerLoop::InstallSnapshotPart(ParsedMessage& part) {
  const SnapshotMsg& sm = *part.get<SnapshotMsg>();
  if ((int)sm.fragment >= P_ || sm.versions.size() != (size_t)P_)
    return Status::Error(me_ + ": snapshot has " + std::to_string(sm.versions.size()) + " fragments, this learner " +
                         std::to_string(P_) + "; are the syncer and the learner running the same config?");
  const Fragment& frag = frags_[sm.fragment];
  DL_RETURN_IF_ERROR(DecodeFragmentPayload(frag, sm.payload, part, &scratch_)
                         .WithContext(me_ + ": snapshot part for fragment " + std::to_string(sm.fragment)));
  if (Crc32c(scratch_.data(), frag.numel * sizeof(float)) != sm.fragment_crc32c)
    return Status::Error(me_ + ": snapshot fragment " + std::to_string(sm.fragment) + " fails its CRC32C");
  const int p = (int)sm.fragment;
  if (!std::all_of(scratch_.begin(), scratch_.end(), [](float x) { return std::isfinite(x); }))
    return Status::Error(me_ + ": snapshot fragment " + std::to_string(p) + " is not finite");
  const bool same = !ledger_[p].bad && ledger_[p].base_version == sm.version &&
                    Crc32c(bases_[p].data(), frag.numel * sizeof(float)) == sm.fragment_crc32c;
  if (!same) {
    bases_[p] = scratch_;
    DL_RETURN_IF_ERROR(outer_.Install(p, bases_[p].data()).WithContext(me_));
    up_topk_ef_.Reset((uint32_t)p);
    MarkChanged(p);
    ledger_.OnSnapshot(p, sm.version);
  }
  return Status::Ok();
}

// The state is now at versions (a snapshot's cut, or version 0): the buffered Globals newer than
// that apply, in order.
Status LearnerLoop::ApplyBufferedGlobals(const std::map<uint64_t, uint64_t>& versions) {
  std::vector<net::VersionedUpdate> apply;
  clone_.OnSnapshot(versions, &apply);
  ParsedMessage m;
  for (auto& u : apply) {
    const auto spans = u.message.spans();
    DL_RETURN_IF_ERROR(ParseEnvelope(spans, expect_, &m).WithContext(me_ + ": a buffered global"));
    DL_RETURN_IF_ERROR(ApplyGlobal(m));
  }
  return Status::Ok();
}

Status LearnerLoop::BeforeStep(long at, TrainingBackend&, StepControl* control) {
  step_ = at;
  DL_RETURN_IF_ERROR(outer_error_);
  if (TimeLimitReached(tc_, train_start_)) {
    control->stop = true;
    return Status::Ok();
  }
  if (Crashed()) {
    res_.crashed = true;
    control->stop = true;
    return Status::Ok();
  }
  if (Stopping()) {
    res_.stopped = true;
    control->stop = true;
    return Status::Ok();
  }
  if (o_.before_step) o_.before_step(step_);
  DL_RETURN_IF_ERROR(Poll(0));
  DL_RETURN_IF_ERROR(ResendLost());
  DL_RETURN_IF_ERROR(WaitForBlockedFragments());
  DL_RETURN_IF_ERROR(BeatIfDue());
  control->changed = std::move(changed_);
  changed_.clear();
  // The fleet's progress: the mean step of this learner and the others it has heard of.
  if (sc_.lr_clock == LrClock::kGlobal && !known_steps_.empty()) {
    double sum = (double)at;
    for (const auto& [name, step] : known_steps_) sum += (double)step;
    control->lr_step = std::lround(sum / (double)(known_steps_.size() + 1));
  }
  return Status::Ok();
}

// Lock-step modes: wait for fragments in flight too long, as long as the syncer is there (a
// lost delta or Global is found through its status and sent or fetched again).
Status LearnerLoop::WaitForBlockedFragments() {
  for (int p = 0; p < P_; p++) {
    if (!ledger_.Blocks(p, step_, block_after_)) continue;
    const auto w0 = Clock::now();
    const int64_t w0_unix = (int64_t)UnixMs();
    DL_RETURN_IF_ERROR(WaitUntil([&] { return !ledger_.Blocks(p, step_, block_after_) || Stopping(); },
                                 "waiting for the global of fragment " + std::to_string(p) + " at step " +
                                     std::to_string(step_)));
    res_.wait_s += std::chrono::duration<double>(Clock::now() - w0).count();
    res_.blocked_unix_ms.push_back({w0_unix, (int64_t)UnixMs()});
  }
  return Status::Ok();
}

// Poll (and beat) until done() or the syncer has been silent for syncer_timeout_ms. what names
// the wait in the error and in the progress lines printed every 30 s.
Status LearnerLoop::WaitUntil(const std::function<bool()>& done, const std::string& what) {
  auto last_said = Clock::now();
  while (!done()) {
    if ((o_.crash && o_.crash->load())) return Status::Ok();
    DL_RETURN_IF_ERROR(BeatIfDue());
    DL_RETURN_IF_ERROR(Poll(10));
    DL_RETURN_IF_ERROR(ResendLost());
    const auto now = Clock::now();
    if (now - last_downlink_ > std::chrono::milliseconds(o_.syncer_timeout_ms))
      return Status::Error(me_ + ": no word from the syncer (downlink " + o_.downlink_endpoint + ") for " +
                           std::to_string(o_.syncer_timeout_ms / 1000) + " s while " + what +
                           "; is it running? (LearnerOptions::syncer_timeout_ms)");
    if (now - last_said > std::chrono::seconds(30)) {
      std::fprintf(stderr, "%s: still %s\n", me_.c_str(), what.c_str());
      last_said = now;
    }
  }
  return Status::Ok();
}

Status LearnerLoop::AfterStep(const StepResult& r, TrainingBackend&) {
  DL_RETURN_IF_ERROR(outer_error_);
  const StepStats& st = r.stats;
  if (!st.applied)
    return Status::Error(me_ + ": training diverged at step " + std::to_string(step_) +
                         " (loss or gradient NaN/Inf). Try a lower train.lr or sync.outer.lr");
  const double step_s = StretchStep(r.step_s);
  res_.compute_s += r.step_s;
  step_ms_ema_ = step_ms_ema_ == 0 ? step_s * 1e3 : step_ms_ema_ + 0.2 * (step_s * 1e3 - step_ms_ema_);
  res_.train_s += step_s;
  res_.tokens += tokens_per_step_;
  last_loss_ = (float)st.loss;
  recent_sum_ += st.loss;
  recent_n_++;
  ledger_.OnStep((uint64_t)tokens_per_step_);
  const long done = r.step + 1;
  step_ = done;
  DL_RETURN_IF_ERROR(SendFiringDeltas(done));
  Report(StateNow());
  DL_RETURN_IF_ERROR(SaveMomentsIfDue(done));
  if (done % tc_.log_every == 0 || done == tc_.steps) LogStep(r, done, step_s);
  return Status::Ok();
}

// A slowed learner (learners[i].slowdown and .jitter, or the factor chaos sets; as in ddp) sleeps
// the stretch (step_stretch.h); returns the step's time with it.
double LearnerLoop::StretchStep(double step_s) {
  return stretch_.Apply(step_s, o_.slowdown ? o_.slowdown->load() : 1.0);
}

// The learner's own moments, for a restart (its parameters then come from a snapshot).
Status LearnerLoop::SaveMomentsIfDue(long done) {
  if (!o_.run_dir.empty() && tc_.checkpoint_every > 0 && done % tc_.checkpoint_every == 0)
    DL_RETURN_IF_ERROR(SaveCheckpoint(LearnerCheckpointPath(o_.run_dir, o_.index), ring_, done,
                                      RunConfigToYaml(cfg_))
                           .WithContext(me_ + ": saving its moments"));
  return Status::Ok();
}

// Every log_every steps: the mean loss since the last time, and a metrics.jsonl line.
void LearnerLoop::LogStep(const StepResult& r, long done, double step_s) {
  res_.final_train_loss = recent_sum_ / recent_n_;
  recent_sum_ = 0;
  recent_n_ = 0;
  if (!o_.metrics) return;
  std::lock_guard<std::mutex> lock(*o_.metrics_mu);
  (void)o_.metrics->Write({{"learner", o_.index},
                           {"step", done},
                           {"loss", r.stats.loss},
                           {"lr", r.lr},
                           {"grad_norm", r.stats.grad_norm},
                           {"tokens", res_.tokens},
                           {"step_ms", step_s * 1e3},
                           {"tok_per_s", res_.tokens / res_.train_s},
                           {"time_ms", (int64_t)UnixMs()},
                           {"bytes_up", res_.bytes_up},
                           {"bytes_down", res_.bytes_down},
                           {"versions", BaseVersions()}});
}

// The parameters of fragment p changed on rank 0: the ring copies them before the next step.
void LearnerLoop::MarkChanged(int p) {
  if (outer_.SpreadsParameters()) return;  // every rank already holds the new θ_p
  for (const FragmentRange& r : frags_[p].ranges) changed_.push_back({r.offset, r.numel});
}

void LearnerLoop::Report(LearnerState state) {
  // What a restart continues from (a few times a second; a step is cheap to lose).
  if (!o_.run_dir.empty() && Clock::now() - last_step_save_ > std::chrono::milliseconds(250)) {
    last_step_save_ = Clock::now();
    (void)SaveLearnerStep(o_.run_dir, o_.index, step_);
  }
  if (!o_.on_progress) return;
  progress_.state = state;
  progress_.step = step_;
  progress_.tokens = res_.tokens;
  progress_.loss = last_loss_;
  progress_.tokens_per_s = res_.train_s > 0 ? res_.tokens / res_.train_s : 0;
  progress_.base_versions = BaseVersions();
  progress_.deltas_sent = res_.deltas_sent;
  progress_.globals_applied = res_.globals_applied;
  progress_.snapshots_installed = res_.snapshots_installed;
  o_.on_progress(progress_);
}

LearnerState LearnerLoop::StateNow() const {
  return clone_.awaiting_snapshot() ? LearnerState::kResyncing : LearnerState::kTraining;
}

// Per fragment: the version of the global it last folded.
std::vector<uint64_t> LearnerLoop::BaseVersions() const {
  std::vector<uint64_t> v;
  for (int p = 0; p < P_; p++) v.push_back(ledger_[p].base_version);
  return v;
}

bool LearnerLoop::Crashed() const {
  return (o_.crash && o_.crash->load()) || (o_.crash_after_steps >= 0 && step_ >= o_.crash_after_steps);
}

bool LearnerLoop::Stopping() const { return o_.stop && o_.stop->load(); }

Status RunLearnerLeader(net::NetContext& context, const LearnerOptions& o, const BatchSampler& train,
                        LocalRing& ring, OuterState& outer, bool* loop_entered, uint32_t* loop_end_crc,
                        LearnerResult* result) {
  std::vector<Fragment> frags;
  DL_RETURN_IF_ERROR(PartitionFragments(ring.backend(0).table(), EffectiveFragments(o.config->sync), &frags));
  LearnerLoop loop(context, o, train, ring, outer, std::move(frags));
  return loop.Run(loop_entered, loop_end_crc, result);
}

}  // namespace

Status RunLearner(net::NetContext& context, const LearnerOptions& o, LearnerResult* result) {
  const RunConfig& cfg = *o.config;
  const std::string me = LearnerName(o.index);
  if (o.init_params == nullptr && !o.join_from_snapshot)
    return Status::Error(me + ": no initial parameters: give init_params or join_from_snapshot");
  std::unique_ptr<Corpus> corpus;
  DL_RETURN_IF_ERROR(Corpus::Load(cfg.data.corpus, CorpusOptionsOf(cfg, o.index, cfg.sync.learners), &corpus));
  std::unique_ptr<LocalRing> ring;
  LocalRingOptions ro = LocalRingOptionsOf(cfg, std::max(1, o.threads));
  if (!o.device.empty()) ro.device = o.device;
  DL_RETURN_IF_ERROR((o.make_ring ? o.make_ring(ro, &ring) : LocalRing::Create(ro, &ring)).WithContext(me));
  // A joining learner starts from the syncer's snapshot: rank 0 installs it, the ring copies it.
  if (o.init_params != nullptr) ring->Upload(o.init_params);
  bool moments_restored = false;
  // A restarted learner takes its AdamW moments back from its own last checkpoint, when it has one
  // (the snapshot then replaces the parameters); else they start at zero.
  if (o.join_from_snapshot && !o.run_dir.empty() && ring->world_ranks() == ring->ranks() && std::filesystem::exists(LearnerCheckpointPath(o.run_dir, o.index))) {
    Checkpoint ckpt;
    DL_RETURN_IF_ERROR(LoadCheckpoint(LearnerCheckpointPath(o.run_dir, o.index), &ckpt).WithContext(me));
    DL_RETURN_IF_ERROR(CheckCheckpointFits(ckpt, GptConfigOf(cfg.model), true).WithContext(me));
    ring->Upload(ckpt.params.data(), &ckpt.optimizer);
    moments_restored = true;
  }
  const BatchSampler train = TrainSampler(*corpus, ring->world_ranks() * cfg.train.batch_size, cfg.model.block_size,
                                          mix_seed(cfg.train.seed, (uint64_t)o.index));
  std::vector<uint32_t> crcs(ring->ranks(), 0);
  // With train.shard the ring shards the outer-sync state too: the followers serve rank 0's
  // commands between steps and after the loop until rank 0 releases them.
  std::unique_ptr<OuterState> outer = MakeOuterState(*ring, cfg.train.shard);
  DL_RETURN_IF_ERROR(ring->Run([&](int rank) -> Status {
    if (rank == 0) {
      bool loop_entered = false;
      Status st = RunLearnerLeader(context, o, train, *ring, *outer, &loop_entered, &crcs[0], result);
      // Ended before training (a crash or a stop during the handshake): release the followers.
      if (st.ok() && !loop_entered) (void)StopFollowers(ring->comm(0));
      if (st.ok()) st = outer->Release();
      return st;
    }
    long done = 0;  // a follower takes each step's number from rank 0
    // Its parameters when the loop ended, as rank 0 takes its own: before the last folds.
    return RunRingFollower(RankLoopOptions(cfg, train, rank, 0), *ring, rank, cfg.train.shard, &done,
                           [&] { crcs[rank] = ParamsCrc32c(ring->backend(rank)); });
  }));
  if (ring->ranks() > 1 && crcs[0] != 0) result->rank_param_crc32c = crcs;
  result->moments_restored = moments_restored;
  return Status::Ok();
}

}  // namespace diloco
