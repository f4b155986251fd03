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
#include "daemon/train/learner_core.h"
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

// Rank 0 of the learner's ring in the wall-clock runtime: the LearnerCore (learner_core.h) with
// ZeroMQ sockets, polls, the liveness thread and a slowed step's sleep behind its port. Its hook
// on the inner loop (inner_loop.h) is the outer sync around every step.
class LearnerLoop final : public InnerLoopHook, public LearnerPort {
 public:
  LearnerLoop(net::NetContext& context, const LearnerOptions& o, LocalRing& ring, OuterState& outer,
              std::vector<Fragment> frags);

  // Start, train and flush. *loop_entered: the inner loop started (the followers are in it);
  // *loop_end_crc: rank 0's parameters when the inner loop ended (train.ranks > 1).
  Status Run(const BatchSampler& train, bool* loop_entered, uint32_t* loop_end_crc, LearnerResult* result);

  // InnerLoopHook: the outer sync around every step.
  Status BeforeStep(long at, TrainingBackend&, StepControl* control) override;
  Status AfterStep(const StepResult& r, TrainingBackend&) override;

  // LearnerPort
  SyncTime Now() override { return Clock::now(); }
  int64_t UnixMs() override { return (int64_t)diloco::UnixMs(); }
  void SendUplink(net::Message&& m) override { (void)up_->Publish(o_.job_id, m); }
  void SendDealer(net::Message&& m) override { (void)dealer_->Send(m, 0); }  // queued until connected
  void OnHeartbeat(const HeartbeatMsg& hb) override {
    last_beat_ = hb;
    if (liveness_) liveness_->Update(hb);
  }
  void SaveStep(long step) override {
    if (!o_.run_dir.empty()) (void)SaveLearnerStep(o_.run_dir, o_.index, step);
  }
  Status SaveMoments(long done) override {
    if (o_.run_dir.empty()) return Status::Ok();
    return SaveCheckpoint(LearnerCheckpointPath(o_.run_dir, o_.index), ring_, done, RunConfigToYaml(cfg_));
  }
  void WriteMetrics(const nlohmann::json& line) override {
    if (!o_.metrics) return;
    std::lock_guard<std::mutex> lock(*o_.metrics_mu);
    (void)o_.metrics->Write(line);
  }
  void Note(const std::string& line) override { std::fprintf(stderr, "%s: %s\n", me_.c_str(), line.c_str()); }

 private:
  Status OpenDownlink();
  Status OpenUplink();
  Status OpenSnapshotDealer();
  Status Handshake(bool* ended);
  Status AwaitJoinSnapshot(bool* ended);
  Status StartLiveness();
  Status Flush();
  Status Finish();
  Status Poll(int timeout_ms);
  Status WaitUntil(const std::function<bool()>& done, const std::string& what);
  bool Crashed() const;
  bool Stopping() const;

  net::NetContext& context_;
  const LearnerOptions& o_;
  const RunConfig& cfg_;
  const std::string me_;
  LocalRing& ring_;
  const uint64_t incarnation_;
  LearnerCore core_;
  StepStretch stretch_;

  std::shared_ptr<ParsedMessage> parsed_ = std::make_shared<ParsedMessage>();
  std::shared_ptr<ParsedMessage> dparsed_ = std::make_shared<ParsedMessage>();
  std::unique_ptr<net::SubChannel> down_;
  std::unique_ptr<net::PubChannel> up_;
  std::unique_ptr<net::DealerChannel> dealer_;
  std::vector<net::Socket*> sockets_;
  std::vector<bool> ready_;
  std::unique_ptr<LivenessSender> liveness_;  // started once the handshake is through
  Clock::time_point last_downlink_ = Clock::now();
  HeartbeatMsg last_beat_;  // the core's latest: the liveness thread's first
  bool crashed_ = false, stopped_ = false;
};

// A fresh incarnation number: a restarted learner is never mistaken for its former self.
uint64_t NewIncarnation() { return std::random_device{}() | (uint64_t{std::random_device{}()} << 32); }

LearnerLoop::LearnerLoop(net::NetContext& context, const LearnerOptions& o, LocalRing& ring, OuterState& outer,
                         std::vector<Fragment> frags)
    : context_(context),
      o_(o),
      cfg_(*o.config),
      me_(LearnerName(o.index)),
      ring_(ring),
      incarnation_(NewIncarnation()),
      core_(o, ring.backend(0), outer, std::move(frags), incarnation_, this),
      stretch_(cfg_, o.index) {
  core_.SetRing(ring.description(), ring.world_ranks());
}

Status LearnerLoop::Run(const BatchSampler& train, bool* loop_entered, uint32_t* loop_end_crc,
                        LearnerResult* result) {
  DL_RETURN_IF_ERROR(core_.SetUp());
  // The downlink first, so nothing published after the handshake is missed.
  DL_RETURN_IF_ERROR(OpenDownlink());
  DL_RETURN_IF_ERROR(OpenUplink());
  DL_RETURN_IF_ERROR(OpenSnapshotDealer());

  bool ended = false;  // crashed or stopped before training
  DL_RETURN_IF_ERROR(Handshake(&ended));
  if (!ended) {
    DL_RETURN_IF_ERROR(core_.Start(o_.join_from_snapshot));
    if (o_.join_from_snapshot) DL_RETURN_IF_ERROR(AwaitJoinSnapshot(&ended));
  }
  if (ended) {
    *result = core_.result();
    result->crashed = crashed_;
    result->stopped = stopped_;
    return Status::Ok();
  }
  DL_RETURN_IF_ERROR(core_.BeginTraining());
  DL_RETURN_IF_ERROR(StartLiveness());

  *loop_entered = true;
  long step = o_.start_step;
  DL_RETURN_IF_ERROR(RunInnerLoop(RankLoopOptions(cfg_, train, 0, step), ring_.backend(0), ring_.comm(0), this, &step));
  if (ring_.ranks() > 1) *loop_end_crc = ParamsCrc32c(ring_.backend(0));  // before the last polls fold into rank 0
  if (!o_.run_dir.empty()) DL_RETURN_IF_ERROR(SaveLearnerStep(o_.run_dir, o_.index, step));
  if (!crashed_) DL_RETURN_IF_ERROR(Flush());
  DL_RETURN_IF_ERROR(Finish());
  *result = core_.result();
  return Status::Ok();
}

Status LearnerLoop::OpenDownlink() {
  ParseOptions expect;
  expect.job_id = o_.job_id;
  expect.accept = MessageBit(MessageType::kGlobal) | MessageBit(MessageType::kSyncerStatus);
  expect.model_params = ring_.backend(0).num_params();
  expect.allowed_senders = {kSyncerName};
  net::ReceiveOptions ro;
  // Globals are verified and decoded where ZeroMQ received them (no copy of the payload).
  ro.validator = net::EnvelopeValidatorInPlace(expect, parsed_);
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
  ParseOptions dexpect;
  dexpect.job_id = o_.job_id;
  dexpect.accept = MessageBit(MessageType::kWelcome) | MessageBit(MessageType::kSnapshot);
  dexpect.model_params = ring_.backend(0).num_params();
  dexpect.allowed_senders = {kSyncerName};
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

// Startup exchange (the core's join timers) until Welcome and a downlink message. *ended:
// crashed or stopped meanwhile.
Status LearnerLoop::Handshake(bool* ended) {
  const auto t0 = Clock::now();
  while (!core_.Joined()) {
    if (Crashed() || Stopping()) {
      crashed_ = Crashed();
      stopped_ = !crashed_;
      *ended = true;
      return Status::Ok();
    }
    if (Clock::now() - t0 > std::chrono::milliseconds(o_.handshake_timeout_ms))
      return Status::Error(me_ + ": no answer from the syncer (uplink " + o_.uplink_endpoint + ", downlink " +
                           o_.downlink_endpoint + ", snapshot " + o_.snapshot_endpoint + ") within " +
                           std::to_string(o_.handshake_timeout_ms) + " ms; is it running, and are the keys right?");
    DL_RETURN_IF_ERROR(core_.OnJoinTimer());
    DL_RETURN_IF_ERROR(Poll(10));
  }
  return Status::Ok();
}

// Train only once the snapshot is in (the core requests it; Globals are buffered meanwhile).
Status LearnerLoop::AwaitJoinSnapshot(bool* ended) {
  const auto t0 = Clock::now();
  while (core_.AwaitingSnapshot()) {
    if (Crashed() || Stopping()) {
      crashed_ = Crashed();
      stopped_ = !crashed_;
      *ended = true;
      return Status::Ok();
    }
    DL_RETURN_IF_ERROR(core_.OnTimer());
    DL_RETURN_IF_ERROR(Poll(10));
    if (Clock::now() - t0 > std::chrono::milliseconds(o_.handshake_timeout_ms))
      return Status::Error(me_ + ": no snapshot from the syncer at " + o_.snapshot_endpoint + " within " +
                           std::to_string(o_.handshake_timeout_ms) + " ms");
  }
  return Status::Ok();
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
  liveness_->Update(last_beat_);  // BeginTraining's
  return Status::Ok();
}

Status LearnerLoop::Flush() {
  core_.BeginFlush();
  DL_RETURN_IF_ERROR(
      WaitUntil([&] { return core_.Flushed(); }, "flushing: waiting for the globals of the deltas in flight"));
  DL_RETURN_IF_ERROR(core_.SendRemaining());
  DL_RETURN_IF_ERROR(WaitUntil([&] { return core_.Flushed(); }, "flushing: waiting for the syncer to merge the last deltas"));
  crashed_ = o_.crash && o_.crash->load();
  return Status::Ok();
}

// The last word: a final heartbeat (finished or stopping), or, crashed, the work lost with it.
Status LearnerLoop::Finish() {
  uint64_t liveness_bytes = 0;
  if (liveness_) {
    liveness_->Stop();  // the core's last beat is the final word
    liveness_bytes = liveness_->bytes_sent();
  }
  DL_RETURN_IF_ERROR(core_.Finish(crashed_, stopped_));
  if (!crashed_) DL_RETURN_IF_ERROR(Poll(0));
  core_.AddBytesUp(liveness_bytes);
  return Status::Ok();
}

Status LearnerLoop::Poll(int timeout_ms) {
  if (timeout_ms > 0 && !net::PollReadable(sockets_, timeout_ms, &ready_)) return Status::Ok();
  net::Received r;
  while (down_->Receive(&r, 0) == net::RecvResult::kMessage) {
    last_downlink_ = Clock::now();
    DL_RETURN_IF_ERROR(core_.OnDownlink(r, *parsed_));
  }
  while (dealer_->Receive(&r, 0) == net::RecvResult::kMessage) DL_RETURN_IF_ERROR(core_.OnDealer(*dparsed_));
  return Status::Ok();
}

// Poll (and the core's timers) until done() or the syncer has been silent for syncer_timeout_ms.
// what names the wait in the error and in the progress lines printed every 30 s.
Status LearnerLoop::WaitUntil(const std::function<bool()>& done, const std::string& what) {
  auto last_said = Clock::now();
  while (!done()) {
    if ((o_.crash && o_.crash->load())) return Status::Ok();
    DL_RETURN_IF_ERROR(Poll(10));
    DL_RETURN_IF_ERROR(core_.OnTimer());
    const auto now = Clock::now();
    if (now - last_downlink_ > std::chrono::milliseconds(o_.syncer_timeout_ms))
      return Status::Error(me_ + ": no word from the syncer (downlink " + o_.downlink_endpoint + ") for " +
                           std::to_string(o_.syncer_timeout_ms / 1000) + " s while " + what +
                           "; is it running? (LearnerOptions::syncer_timeout_ms)");
    if (now - last_said > std::chrono::seconds(30)) {
      Note("still " + what);
      last_said = now;
    }
  }
  return Status::Ok();
}

Status LearnerLoop::BeforeStep(long at, TrainingBackend&, StepControl* control) {
  DL_RETURN_IF_ERROR(core_.outer_error());
  if (Crashed() || Stopping()) {
    crashed_ = Crashed();
    stopped_ = !crashed_;
    control->stop = true;
    return Status::Ok();
  }
  if (o_.before_step) o_.before_step(at);
  DL_RETURN_IF_ERROR(Poll(0));
  DL_RETURN_IF_ERROR(core_.OnTimer());
  DL_RETURN_IF_ERROR(core_.BeforeStep(at, control));
  // Lock-step modes: wait for the Global that unblocks the step, as long as the syncer speaks.
  while (!control->stop && core_.Blocked() && !Stopping()) {
    DL_RETURN_IF_ERROR(WaitUntil([&] { return !core_.Blocked() || Stopping(); },
                                 "waiting for a global at step " + std::to_string(at)));
    if (o_.crash && o_.crash->load()) break;
    DL_RETURN_IF_ERROR(core_.BeforeStep(at, control));
  }
  return Status::Ok();
}

Status LearnerLoop::AfterStep(const StepResult& r, TrainingBackend&) {
  // A slowed learner (learners[i].slowdown and .jitter, or the factor chaos sets) sleeps the
  // stretch (step_stretch.h); the core takes the step's time with it.
  const double step_s = stretch_.Apply(r.step_s, o_.slowdown ? o_.slowdown->load() : 1.0);
  return core_.AfterStep(r, step_s);
}

bool LearnerLoop::Crashed() const {
  return (o_.crash && o_.crash->load()) || (o_.crash_after_steps >= 0 && core_.step() >= o_.crash_after_steps);
}

bool LearnerLoop::Stopping() const { return o_.stop && o_.stop->load(); }

Status RunLearnerLeader(net::NetContext& context, const LearnerOptions& o, const BatchSampler& train,
                        LocalRing& ring, OuterState& outer, bool* loop_entered, uint32_t* loop_end_crc,
                        LearnerResult* result) {
  std::vector<Fragment> frags;
  DL_RETURN_IF_ERROR(PartitionFragments(ring.backend(0).table(), EffectiveFragments(o.config->sync), &frags));
  LearnerLoop loop(context, o, ring, outer, std::move(frags));
  return loop.Run(train, loop_entered, loop_end_crc, result);
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
