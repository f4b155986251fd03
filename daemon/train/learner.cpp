#include "daemon/train/learner.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>

#include "daemon/net/channel.h"
#include "daemon/net/wire_transport.h"
#include "daemon/sync/core_clock.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/protocol.h"
#include "daemon/train/checkpoint.h"
#include "daemon/train/data.h"
#include "daemon/train/inner_loop.h"
#include "daemon/train/learner_core.h"
#include "daemon/train/liveness_sender.h"
#include "daemon/train/local_ring.h"
#include "daemon/train/outer_state.h"
#include "daemon/train/run_dir.h"
#include "daemon/train/step_stretch.h"
#include "daemon/train/trainer.h"
#include "daemon/util/log.h"
#include "kernels/rng.h"

namespace diloco {

namespace {

using std::chrono::milliseconds;

// A socket of the learner to syncer shard `shard` (its CURVE server key, when it has its own).
net::SocketOptions LearnerSocket(const LearnerOptions& o, const std::string& name, int shard) {
  net::SocketOptions so;
  so.name = name;
  so.allow_plaintext = o.allow_plaintext;
  if (o.curve) {
    so.curve = o.curve;
    so.curve->server = false;
    if (!o.syncers[shard].curve_server_key.empty()) so.curve->server_public_key_z85 = o.syncers[shard].curve_server_key;
  }
  so.link = o.link;
  return so;
}

// A fresh incarnation per run of a learner: the syncer tells this one's stream from a previous one's.
uint64_t DrawIncarnation() { return std::random_device{}() | (uint64_t{std::random_device{}()} << 32); }

// Rank 0 of the learner's ring: the wall-clock runtime of its LearnerCore (learner_core.h). It
// owns the sockets, the liveness thread, the waits (as long as the syncer speaks), the crash and
// stop flags, the stretch's sleep and the files; the core decides. Its hook on the inner loop
// (inner_loop.h) hands every step to the core.
class LearnerLoop final : public InnerLoopHook, public LearnerPort {
 public:
  // train: the learner's sampler (ranks × batch_size rows per step), shared with the followers.
  // frags: backend 0's table partitioned into fragments (PartitionFragments).
  LearnerLoop(net::NetContext& context, const LearnerOptions& o, const BatchSampler& train, LocalRing& ring,
              OuterState& outer, std::vector<Fragment> frags);

  // Start, train and flush. *loop_entered: the inner loop started (the followers are in it);
  // *loop_end_crc: rank 0's parameters when the inner loop ended (train.ranks > 1).
  Status Run(bool* loop_entered, uint32_t* loop_end_crc, LearnerResult* result);

  // InnerLoopHook: the outer sync around every step.
  Status BeforeStep(long at, TrainingBackend&, StepControl* control) override;
  Status AfterStep(const StepResult& r, TrainingBackend&) override;

  // LearnerPort.
  SyncTime Now() override { return WallClock().Now(); }
  int64_t UnixMs() override { return WallClock().UnixMs(); }
  void SendUplink(int shard, net::Message&& m) override { (void)shard_[shard].up->Publish(o_.job_id, m); }
  void SendDealer(int shard, net::Message&& m) override {
    (void)shard_[shard].dealer->Send(m, 0);  // queued until connected
  }
  void OnHeartbeat(const HeartbeatMsg& hb) override;
  void SaveStep(long step) override;
  Status SaveMoments(long done) override;
  void WriteMetrics(const nlohmann::json& line) override;
  void Note(const std::string& line) override { LogToStderr(LogWho(me_, o_.job_id), line); }

 private:
  // Setup: the sockets to syncer shard `shard`.
  Status OpenDownlink(int shard);
  Status OpenUplink(int shard);
  Status OpenSnapshotDealer(int shard);
  // "learner-0.uplink", or with several shards "learner-0.uplink@syncer-1".
  std::string SocketName(const std::string& kind, int shard) const;
  // Every shard's endpoints, or those of the shards that have not answered yet (for errors).
  std::string DescribeShards(bool only_unjoined) const;
  // Phases of Run; *ended: crashed or stopped meanwhile.
  Status Handshake(bool* ended);
  Status AwaitJoinSnapshot(bool* ended);
  bool EndedByFlags();
  Status StartLiveness();
  Status Flush();
  Status Finish(LearnerResult* result);
  // Receiving and waiting.
  Status Poll(int timeout_ms);
  Status WaitUntil(const std::function<bool()>& done, const std::string& what);
  bool Crashed() const;
  bool Stopping() const { return o_.stop && o_.stop->load(); }

  net::NetContext& context_;
  const LearnerOptions& o_;
  const RunConfig& cfg_;
  const std::string me_;
  const BatchSampler& train_;
  LocalRing& ring_;
  LearnerCore core_;

  // Sockets (this thread's), per syncer shard.
  struct ShardSockets {
    std::shared_ptr<ParsedMessage> parsed = std::make_shared<ParsedMessage>();
    std::unique_ptr<net::SubChannel> down;
    std::unique_ptr<net::PubChannel> up;
    std::shared_ptr<ParsedMessage> dparsed = std::make_shared<ParsedMessage>();
    std::unique_ptr<net::DealerChannel> dealer;
  };
  std::vector<ShardSockets> shard_;
  std::vector<net::Socket*> sockets_;  // polled: each shard's downlink and DEALER
  std::vector<bool> ready_;
  SyncTime last_downlink_ = WallClock().Now();

  std::unique_ptr<LivenessSender> liveness_;  // started once training starts
  bool have_beat_ = false;
  HeartbeatMsg last_beat_;  // the core's latest, what the liveness thread starts with
  StepStretch stretch_;
};

LearnerLoop::LearnerLoop(net::NetContext& context, const LearnerOptions& o, const BatchSampler& train,
                         LocalRing& ring, OuterState& outer, std::vector<Fragment> frags)
    : context_(context),
      o_(o),
      cfg_(*o.config),
      me_(LearnerName(o.index)),
      train_(train),
      ring_(ring),
      core_(o, ring.backend(0), outer, std::move(frags), DrawIncarnation(), this),
      stretch_(cfg_, o.index) {
  core_.Describe(ring.description(), ring.world_ranks());
}

Status LearnerLoop::Run(bool* loop_entered, uint32_t* loop_end_crc, LearnerResult* result) {
  const int S = core_.shards().shards();
  if ((int)o_.syncers.size() != S)
    return Status::Error(me_ + ": " + std::to_string(o_.syncers.size()) + " syncer endpoints given for sync.syncers " +
                         std::to_string(S));
  DL_RETURN_IF_ERROR(core_.SetUp());
  shard_.resize(S);
  for (int s = 0; s < S; s++) {
    // The downlink first, so nothing published after the handshake is missed.
    DL_RETURN_IF_ERROR(OpenDownlink(s));
    DL_RETURN_IF_ERROR(OpenUplink(s));
    DL_RETURN_IF_ERROR(OpenSnapshotDealer(s));
  }

  bool ended = false;  // crashed or stopped before training
  DL_RETURN_IF_ERROR(Handshake(&ended));
  if (!ended) {
    DL_RETURN_IF_ERROR(core_.Start(o_.join_from_snapshot));
    // A learner started from init_params trains at once, even if its buffered Globals had a gap.
    if (o_.join_from_snapshot) DL_RETURN_IF_ERROR(AwaitJoinSnapshot(&ended));
  }
  if (ended) {
    *result = core_.result();
    return Status::Ok();
  }
  DL_RETURN_IF_ERROR(core_.BeginTraining());
  DL_RETURN_IF_ERROR(StartLiveness());

  *loop_entered = true;
  long step = core_.StartStep();
  DL_RETURN_IF_ERROR(
      RunInnerLoop(RankLoopOptions(cfg_, train_, 0, step), ring_.backend(0), ring_.comm(0), this, &step));
  if (ring_.ranks() > 1) *loop_end_crc = ParamsCrc32c(ring_.backend(0));  // before the last polls fold into rank 0
  if (!o_.run_dir.empty()) DL_RETURN_IF_ERROR(SaveLearnerStep(o_.run_dir, o_.index, step));
  if (!core_.result().crashed) DL_RETURN_IF_ERROR(Flush());
  DL_RETURN_IF_ERROR(Finish(result));
  result->steps = step;
  return Status::Ok();
}

std::string LearnerLoop::SocketName(const std::string& kind, int shard) const {
  const ShardMap& map = core_.shards();
  return me_ + "." + kind + (map.shards() > 1 ? "@" + map.NameOf(shard) : "");
}

std::string LearnerLoop::DescribeShards(bool only_unjoined) const {
  const ShardMap& map = core_.shards();
  std::string out;
  for (int s = 0; s < map.shards(); s++) {
    if (only_unjoined && core_.ShardJoined(s)) continue;
    if (!out.empty()) out += "; ";
    out += (map.shards() > 1 ? map.NameOf(s) + ": " : "") + DescribeEndpoints(o_.syncers[s]);
  }
  return out;
}

Status LearnerLoop::OpenDownlink(int shard) {
  ShardSockets& ss = shard_[shard];
  net::ReceiveOptions ro;
  // Globals are verified and decoded where ZeroMQ received them (no copy of the payload).
  ro.validator = net::EnvelopeValidatorInPlace(core_.downlink_expect(), ss.parsed);
  net::SocketOptions so = LearnerSocket(o_, SocketName("downlink", shard), shard);
  so.recv_hwm_msgs = 100000;
  DL_RETURN_IF_ERROR(net::SubChannel::Create(context_, so, ro, &ss.down));
  DL_RETURN_IF_ERROR(ss.down->Subscribe(o_.job_id));
  DL_RETURN_IF_ERROR(ss.down->Connect(o_.syncers[shard].downlink).WithContext(SocketName("downlink", shard)));
  sockets_.push_back(&ss.down->socket());
  return Status::Ok();
}

Status LearnerLoop::OpenUplink(int shard) {
  ShardSockets& ss = shard_[shard];
  net::SocketOptions po = LearnerSocket(o_, SocketName("uplink", shard), shard);
  po.send_hwm_msgs = net::kUplinkHwmMsgs;
  DL_RETURN_IF_ERROR(net::PubChannel::Create(context_, po, &ss.up));
  DL_RETURN_IF_ERROR(ss.up->Connect(o_.syncers[shard].uplink).WithContext(SocketName("uplink", shard)));
  return Status::Ok();
}

Status LearnerLoop::OpenSnapshotDealer(int shard) {
  ShardSockets& ss = shard_[shard];
  net::ReceiveOptions dro;
  dro.validator = net::EnvelopeValidator(core_.dealer_expect(), ss.dparsed);
  dro.track_sequence = false;  // replies to requests: the syncer numbers them across all learners
  net::SocketOptions dso = LearnerSocket(o_, SocketName("snapshot", shard), shard);
  dso.recv_hwm_msgs = 100000;
  dso.linger_ms = 0;
  DL_RETURN_IF_ERROR(net::DealerChannel::Create(context_, dso, dro, &ss.dealer));
  if (o_.syncers[shard].snapshot.empty())
    return Status::Error(SocketName("snapshot", shard) + ": no snapshot endpoint (the syncer's ROUTER) given");
  DL_RETURN_IF_ERROR(ss.dealer->Connect(o_.syncers[shard].snapshot).WithContext(SocketName("snapshot", shard)));
  sockets_.push_back(&ss.dealer->socket());
  return Status::Ok();
}

// Startup exchange (the core's join timer) until Welcome and a downlink message (both
// directions up), within handshake_timeout_ms.
Status LearnerLoop::Handshake(bool* ended) {
  const SyncTime t0 = Now();
  while (!core_.Joined()) {
    if ((*ended = EndedByFlags())) return Status::Ok();
    if (Now() - t0 > milliseconds(o_.handshake_timeout_ms))
      return Status::Error(me_ + ": no answer from the syncer (" + DescribeShards(/*only_unjoined=*/true) + ") within " +
                           std::to_string(o_.handshake_timeout_ms) + " ms; is it running, and are the keys right?");
    DL_RETURN_IF_ERROR(core_.OnJoinTimer());
    DL_RETURN_IF_ERROR(Poll(10));
  }
  return Status::Ok();
}

// Joining from a snapshot: train only once it is installed (Globals are buffered meanwhile).
Status LearnerLoop::AwaitJoinSnapshot(bool* ended) {
  const SyncTime t0 = Now();
  while (core_.AwaitingSnapshot()) {
    if ((*ended = EndedByFlags())) return Status::Ok();
    DL_RETURN_IF_ERROR(core_.OnTimer());
    DL_RETURN_IF_ERROR(Poll(10));
    if (Now() - t0 > milliseconds(o_.handshake_timeout_ms))
      return Status::Error(me_ + ": no snapshot from the syncer (" + DescribeShards(false) + ") within " +
                           std::to_string(o_.handshake_timeout_ms) + " ms");
  }
  return Status::Ok();
}

// The crash or stop flags are set: the core marks the learner crashed or stopped.
bool LearnerLoop::EndedByFlags() {
  if (Crashed()) {
    core_.MarkCrashed();
    return true;
  }
  if (Stopping()) {
    core_.MarkStopped();
    return true;
  }
  return false;
}

// From here on liveness beats come from their own thread (liveness_sender.h), starting with the
// core's latest heartbeat.
Status LearnerLoop::StartLiveness() {
  LivenessOptions lo;
  lo.job_id = o_.job_id;
  lo.sender = me_;
  lo.incarnation = core_.incarnation();
  for (int s = 0; s < core_.shards().shards(); s++) {
    LivenessOptions::Target& t = lo.targets.emplace_back();
    t.endpoint = o_.syncers[s].uplink;
    t.socket = LearnerSocket(o_, SocketName("liveness", s), s);
    t.socket.linger_ms = 0;
  }
  lo.interval_ms = o_.heartbeat_interval_ms;
  lo.crash = o_.crash;
  DL_RETURN_IF_ERROR(LivenessSender::Start(context_, lo, &liveness_));
  if (have_beat_) liveness_->Update(last_beat_);
  return Status::Ok();
}

// Flush, so no work is lost at the end (the core says when it is settled, or gives up after
// flush_timeout_ms without any learner stepping).
Status LearnerLoop::Flush() {
  DL_RETURN_IF_ERROR(core_.BeginFlush());
  auto flushed = [&] { return core_.Flushed(); };
  DL_RETURN_IF_ERROR(WaitUntil(flushed, "flushing: waiting for the globals of the deltas in flight"));
  DL_RETURN_IF_ERROR(core_.SendRemaining());
  DL_RETURN_IF_ERROR(WaitUntil(flushed, "flushing: waiting for the syncer to merge the last deltas"));
  if (o_.crash && o_.crash->load()) core_.MarkCrashed();
  return Status::Ok();
}

// The last word (the core's final heartbeat, or the crash's tally); the liveness thread stops first.
Status LearnerLoop::Finish(LearnerResult* result) {
  uint64_t liveness_bytes = 0;
  if (liveness_) {
    liveness_->Stop();  // the last beat is the core's final word
    liveness_bytes = liveness_->bytes_sent();
  }
  DL_RETURN_IF_ERROR(core_.SendLastWord());
  DL_RETURN_IF_ERROR(WaitUntil([&] { return core_.LastWordHeard(); }, "waiting for the syncer to hear our last word"));
  DL_RETURN_IF_ERROR(core_.Finish());
  if (!core_.result().crashed) DL_RETURN_IF_ERROR(Poll(0));
  *result = core_.result();
  result->bytes_up += liveness_bytes;
  return Status::Ok();
}

// Hands what arrived to the core (after waiting up to timeout_ms for something).
Status LearnerLoop::Poll(int timeout_ms) {
  if (timeout_ms > 0 && !net::PollReadable(sockets_, timeout_ms, &ready_)) return Status::Ok();
  net::Received r;
  for (ShardSockets& ss : shard_) {
    while (ss.down->Receive(&r, 0) == net::RecvResult::kMessage) {
      last_downlink_ = Now();
      DL_RETURN_IF_ERROR(core_.OnDownlink(r, *ss.parsed));
    }
    while (ss.dealer->Receive(&r, 0) == net::RecvResult::kMessage) DL_RETURN_IF_ERROR(core_.OnDealer(*ss.dparsed));
  }
  return Status::Ok();
}

// Poll (and run the core's timer) until done() or the syncer has been silent for
// syncer_timeout_ms. what names the wait in the error and in the lines printed every 30 s.
Status LearnerLoop::WaitUntil(const std::function<bool()>& done, const std::string& what) {
  SyncTime last_said = Now();
  while (!done()) {
    if (o_.crash && o_.crash->load()) return Status::Ok();
    DL_RETURN_IF_ERROR(core_.OnTimer());
    DL_RETURN_IF_ERROR(Poll(10));
    DL_RETURN_IF_ERROR(core_.OnTimer());
    const SyncTime now = Now();
    if (now - last_downlink_ > milliseconds(o_.syncer_timeout_ms))
      return Status::Error(me_ + ": no word from the syncer (" + DescribeShards(false) + ") for " +
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
  if (EndedByFlags()) {  // the core is at step `at` since the last step (or the start)
    control->stop = true;
    return Status::Ok();
  }
  if (o_.before_step) o_.before_step(at);
  DL_RETURN_IF_ERROR(Poll(0));
  DL_RETURN_IF_ERROR(core_.OnTimer());
  DL_RETURN_IF_ERROR(core_.BeforeStep(at, control));
  // Lock-step modes: wait for the Global that unblocks the step, as long as the syncer speaks. A
  // crash or a stop meanwhile ends training before this step.
  while (!control->stop && core_.Blocked()) {
    const int p = core_.BlockingFragment();
    DL_RETURN_IF_ERROR(WaitUntil([&] { return !core_.Blocked() || Stopping(); },
                                 "waiting for the global of fragment " + std::to_string(p) + " at step " +
                                     std::to_string(at)));
    if (EndedByFlags()) {
      control->stop = true;
      return Status::Ok();
    }
    DL_RETURN_IF_ERROR(core_.BeforeStep(at, control));
  }
  return Status::Ok();
}

Status LearnerLoop::AfterStep(const StepResult& r, TrainingBackend&) {
  // A slowed learner (learners[i].slowdown and .jitter, or the factor chaos sets; as in ddp) sleeps
  // the stretch (step_stretch.h); the core counts the step's time with it.
  const StretchedStep s =
      r.stats.applied ? stretch_.Apply(r.step_s, o_.slowdown ? o_.slowdown->load() : 1.0) : StretchedStep{r.step_s, r.step_s};
  return core_.AfterStep(r, s.step_s, s.provisioned_s);
}

void LearnerLoop::OnHeartbeat(const HeartbeatMsg& hb) {
  last_beat_ = hb;
  have_beat_ = true;
  if (liveness_) liveness_->Update(hb);
}

void LearnerLoop::SaveStep(long step) {
  if (!o_.run_dir.empty()) (void)SaveLearnerStep(o_.run_dir, o_.index, step);
}

Status LearnerLoop::SaveMoments(long done) {
  if (o_.run_dir.empty()) return Status::Ok();
  return SaveCheckpoint(LearnerCheckpointPath(o_.run_dir, o_.index), ring_, done, RunConfigToYaml(cfg_));
}

void LearnerLoop::WriteMetrics(const nlohmann::json& line) {
  if (!o_.metrics) return;
  std::lock_guard<std::mutex> lock(*o_.metrics_mu);
  (void)o_.metrics->Write(line);
}

bool LearnerLoop::Crashed() const {
  return (o_.crash && o_.crash->load()) || (o_.crash_after_steps >= 0 && core_.step() >= o_.crash_after_steps);
}

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
