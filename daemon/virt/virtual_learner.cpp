#include "daemon/virt/virtual_learner.h"

#include <omp.h>

#include <cmath>
#include <cstdio>

#include "daemon/net/wire_transport.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/protocol.h"
#include "daemon/train/checkpoint.h"
#include "daemon/train/data.h"
#include "daemon/train/inner_loop.h"
#include "daemon/train/local_ring.h"
#include "daemon/train/outer_state.h"
#include "daemon/train/run_dir.h"
#include "daemon/train/trainer.h"
#include "daemon/virt/liveness_beat.h"
#include "daemon/virt/virtual_step.h"

namespace diloco {

namespace {

int64_t MsToNs(double ms) { return (int64_t)std::llround(ms * 1e6); }

}  // namespace

// The inner loop's hook: the core around every step, the step's virtual duration after it.
class VirtualLearner::Hook final : public InnerLoopHook {
 public:
  explicit Hook(VirtualLearner& v) : v_(v) {}

  Status BeforeStep(long at, TrainingBackend&, StepControl* control) override {
    DL_RETURN_IF_ERROR(v_.ProcessInbox());
    DL_RETURN_IF_ERROR(v_.core_->OnTimer());
    DL_RETURN_IF_ERROR(v_.core_->BeforeStep(at, control));
    // Lock-step modes: wait for the Global that unblocks the step, as long as the syncer speaks.
    while (!control->stop && v_.core_->Blocked()) {
      DL_RETURN_IF_ERROR(v_.WaitForMessage(MsToNs(v_.cfg_.timing.heartbeat_ms)));
      DL_RETURN_IF_ERROR(v_.ProcessInbox());
      DL_RETURN_IF_ERROR(v_.core_->OnTimer());
      StepControl again;
      DL_RETURN_IF_ERROR(v_.core_->BeforeStep(at, &again));
      control->stop = again.stop;
      control->lr_step = again.lr_step;
      control->changed.insert(control->changed.end(), again.changed.begin(), again.changed.end());
    }
    step_start_ns_ = v_.scheduler_.now_ns();
    step_ns_ = v_.StepNs();
    return Status::Ok();
  }

  Status AfterStep(const StepResult& r, TrainingBackend&) override {
    DL_RETURN_IF_ERROR(v_.SleepUntil(step_start_ns_ + step_ns_));
    StepResult virtual_r = r;
    virtual_r.step_s = v_.step_base_s_;  // the step's own time, before the slowdown and noise
    v_.steps_done_ = r.step + 1;
    v_.last_step_ns_ = v_.scheduler_.now_ns();
    v_.requests_after_last_step_.assign(v_.cfg_.sync.syncers, 0);
    const double step_s = (double)step_ns_ / 1e9;  // no chaos slowdown in virtual time: all provisioned
    return v_.core_->AfterStep(virtual_r, step_s, step_s);
  }

 private:
  VirtualLearner& v_;
  int64_t step_start_ns_ = 0, step_ns_ = 0;
};

VirtualLearner::VirtualLearner(VirtualScheduler& scheduler, Baton& baton, VirtualNetwork& network,
                               LearnerOptions options, uint64_t incarnation, JsonlWriter* metrics)
    : scheduler_(scheduler),
      baton_(baton),
      network_(network),
      options_(std::move(options)),
      cfg_(*options_.config),
      me_(LearnerName(options_.index)),
      incarnation_(incarnation),
      metrics_(metrics),
      step_rng_(mix_seed(cfg_.timing.seed, 0x57e9, incarnation)),
      steps_done_(options_.start_step),
      requests_after_last_step_(cfg_.sync.syncers, 0) {}

VirtualLearner::~VirtualLearner() {
  if (thread_.joinable()) thread_.join();
}

void VirtualLearner::Launch() {
  thread_ = std::thread([this] { ThreadMain(); });
  scheduler_.At(scheduler_.now_ns(), [this] { baton_.RunActor(options_.index); });
}

void VirtualLearner::ThreadMain() {
  if (!baton_.AwaitTurn(options_.index)) return;
  status_ = Run();
  if (!status_.ok()) status_ = status_.WithContext(me_);
  if (aborted_) return;  // the scheduler is gone: touch nothing shared
  done_ = true;
  if (liveness_timer_) scheduler_.Cancel(liveness_timer_);
  if (wake_timer_) scheduler_.Cancel(wake_timer_);
  baton_.Release();
}

void VirtualLearner::Kill() {
  if (done_) return;
  if (wake_timer_) scheduler_.Cancel(wake_timer_);
  if (liveness_timer_) scheduler_.Cancel(liveness_timer_);
  wake_timer_ = liveness_timer_ = 0;
  waiting_ = false;
  if (core_) result_ = core_->CrashedResult();
  result_.crashed = true;
  result_.steps = steps_done_;
  result_.crashed_unix_ms = scheduler_.unix_ms();
  baton_.Kill(options_.index);
  if (thread_.joinable()) thread_.join();
  status_ = Status::Ok();  // its unwinding ("aborted") is not an error of the run
  done_ = true;
}

std::string VirtualLearner::Describe() const {
  if (done_) return me_ + ": ended at step " + std::to_string(result_.steps) + (result_.crashed ? " (killed)" : "");
  if (!core_) return me_ + ": starting";
  const LearnerProgress p = core_->progress();
  std::string versions;
  for (uint64_t v : p.base_versions) versions += (versions.empty() ? "" : ",") + std::to_string(v);
  return me_ + ": step " + std::to_string(p.step) + ", " + (core_->StateNow() == LearnerState::kResyncing ? "resyncing" : "training") +
         (core_->Joined() ? "" : ", joining") +
         (core_->Blocked() ? ", blocked on fragment " + std::to_string(core_->BlockingFragment()) : "") +
         ", bases [" + versions + "], " + std::to_string(p.deltas_sent) + " deltas sent, " +
         std::to_string(p.globals_applied) + " globals applied";
}

Status VirtualLearner::Aborted() const {
  return aborted_ ? Status::Error("the virtual run was aborted") : Status::Ok();
}

Status VirtualLearner::Run() {
  std::unique_ptr<Corpus> corpus;
  DL_RETURN_IF_ERROR(Corpus::Load(cfg_.data.corpus, CorpusOptionsOf(cfg_, options_.index, cfg_.sync.learners), &corpus));
  std::unique_ptr<LocalRing> ring;
  LocalRingOptions ro = LocalRingOptionsOf(cfg_, std::max(1, options_.threads));
  if (!options_.device.empty()) ro.device = options_.device;
  DL_RETURN_IF_ERROR(LocalRing::Create(ro, &ring));
  if (options_.init_params != nullptr) ring->Upload(options_.init_params);
  ring_ = ring.get();
  const BatchSampler train = TrainSampler(*corpus, ring->world_ranks() * cfg_.train.batch_size,
                                          cfg_.model.block_size, mix_seed(cfg_.train.seed, (uint64_t)options_.index));
  std::unique_ptr<OuterState> outer = MakeOuterState(*ring, cfg_.train.shard);
  Status st = ring->Run([&](int rank) -> Status {
    if (rank == 0) {
      bool loop_entered = false;
      Status s = RunLeader(*ring, *outer, train, &loop_entered);
      if (s.ok() && !loop_entered) (void)StopFollowers(ring->comm(0));
      if (s.ok()) s = outer->Release();
      return s;
    }
    long done = 0;
    return RunRingFollower(RankLoopOptions(cfg_, train, rank, 0), *ring, rank, cfg_.train.shard, &done);
  });
  ring_ = nullptr;
  return st;
}

Status VirtualLearner::RunLeader(LocalRing& ring, OuterState& outer, const BatchSampler& train, bool* loop_entered) {
  std::vector<Fragment> frags;
  DL_RETURN_IF_ERROR(PartitionFragments(ring.backend(0).table(), EffectiveFragments(cfg_.sync), &frags));
  core_ = std::make_unique<LearnerCore>(options_, ring.backend(0), outer, std::move(frags), incarnation_, this);
  inbox_.Expect(core_->downlink_expect(), core_->dealer_expect(), options_.job_id);
  core_->Describe(ring.description(), ring.world_ranks());
  DL_RETURN_IF_ERROR(core_->SetUp());
  DL_RETURN_IF_ERROR(Join());
  DL_RETURN_IF_ERROR(core_->BeginTraining());
  liveness_timer_ = scheduler_.After(MsToNs(cfg_.timing.heartbeat_ms), [this] { BeatLiveness(); });
  *loop_entered = true;
  Hook hook(*this);
  long step = core_->StartStep();
  steps_done_ = step;
  DL_RETURN_IF_ERROR(RunInnerLoop(RankLoopOptions(cfg_, train, 0, step), ring.backend(0),
                                  ring.comm(0), &hook, &step));
  if (!options_.run_dir.empty()) DL_RETURN_IF_ERROR(SaveLearnerStep(options_.run_dir, options_.index, step));
  return FlushAndFinish();
}

// The startup exchange, then the start (from init_params or a snapshot).
Status VirtualLearner::Join() {
  const int64_t t0 = scheduler_.now_ns();
  while (!core_->Joined()) {
    if (scheduler_.now_ns() - t0 > MsToNs(options_.handshake_timeout_ms))
      return Status::Error("no answer from the syncer within " + std::to_string(options_.handshake_timeout_ms) +
                           " virtual ms");
    DL_RETURN_IF_ERROR(core_->OnJoinTimer());
    DL_RETURN_IF_ERROR(WaitForMessage(MsToNs(20)));
    DL_RETURN_IF_ERROR(ProcessInbox());
  }
  DL_RETURN_IF_ERROR(core_->Start(options_.join_from_snapshot));
  while (core_->AwaitingSnapshot()) {
    DL_RETURN_IF_ERROR(core_->OnTimer());
    DL_RETURN_IF_ERROR(WaitForMessage(MsToNs(cfg_.timing.heartbeat_ms)));
    DL_RETURN_IF_ERROR(ProcessInbox());
  }
  return Status::Ok();
}

Status VirtualLearner::FlushAndFinish() {
  DL_RETURN_IF_ERROR(core_->BeginFlush());
  for (int phase = 0; phase < 2; phase++) {
    while (!core_->Flushed()) {
      DL_RETURN_IF_ERROR(WaitForMessage(MsToNs(cfg_.timing.heartbeat_ms)));
      DL_RETURN_IF_ERROR(ProcessInbox());
      DL_RETURN_IF_ERROR(core_->OnTimer());
    }
    if (phase == 0) DL_RETURN_IF_ERROR(core_->SendRemaining());
  }
  if (liveness_timer_) scheduler_.Cancel(liveness_timer_);
  liveness_timer_ = 0;
  DL_RETURN_IF_ERROR(core_->SendLastWord());
  while (!core_->LastWordHeard()) {
    DL_RETURN_IF_ERROR(WaitForMessage(MsToNs(cfg_.timing.heartbeat_ms)));
    DL_RETURN_IF_ERROR(ProcessInbox());
    DL_RETURN_IF_ERROR(core_->OnTimer());
  }
  DL_RETURN_IF_ERROR(core_->Finish());
  result_ = core_->result();
  return Status::Ok();
}

Status VirtualLearner::SleepUntil(int64_t t_ns) {
  DL_RETURN_IF_ERROR(Aborted());
  wake_timer_ = scheduler_.At(t_ns, [this] {
    wake_timer_ = 0;
    baton_.RunActor(options_.index);
  });
  aborted_ = !baton_.Yield(options_.index);
  return Aborted();
}

Status VirtualLearner::WaitForMessage(int64_t timeout_ns) {
  DL_RETURN_IF_ERROR(Aborted());
  if (!inbox_.empty()) return Status::Ok();
  waiting_ = true;
  wake_timer_ = scheduler_.After(timeout_ns, [this] {
    wake_timer_ = 0;
    waiting_ = false;
    baton_.RunActor(options_.index);
  });
  aborted_ = !baton_.Yield(options_.index);
  return Aborted();
}

void VirtualLearner::DeliverDownlink(net::Message&& m) {
  inbox_.Push(false, std::move(m));
  if (!waiting_) return;
  waiting_ = false;
  scheduler_.Cancel(wake_timer_);
  wake_timer_ = 0;
  baton_.RunActor(options_.index);
}

void VirtualLearner::DeliverDealer(net::Message&& m) {
  inbox_.Push(true, std::move(m));
  if (!waiting_) return;
  waiting_ = false;
  scheduler_.Cancel(wake_timer_);
  wake_timer_ = 0;
  baton_.RunActor(options_.index);
}

// What arrived since the last step boundary, checked as the sockets' validators check it.
Status VirtualLearner::ProcessInbox() {
  return inbox_.Drain(*core_, [this](const std::string& line) { Note(line); });
}

void VirtualLearner::BeatLiveness() {
  liveness_timer_ = scheduler_.After(MsToNs(cfg_.timing.heartbeat_ms), [this] { BeatLiveness(); });
  if (!have_beat_) return;
  net::Message m;
  if (!BuildLivenessBeat(options_.job_id, me_, ++liveness_seq_, incarnation_, UnixMs(), last_beat_, &m).ok())
    return;
  network_.LearnerPublish(options_.index, VirtualNetwork::kEveryShard, LivenessTopic(options_.job_id), std::move(m));
}

// The step's virtual duration (virtual_step.h); its own time is kept for AfterStep.
int64_t VirtualLearner::StepNs() {
  const VirtualStep step = DrawVirtualStep(cfg_, options_.index, step_rng_);
  step_base_s_ = step.base_s;
  return step.ns;
}

void VirtualLearner::SendUplink(int shard, net::Message&& m) {
  network_.LearnerPublish(options_.index, shard, options_.job_id, std::move(m));
}

void VirtualLearner::SendDealer(int shard, net::Message&& m) {
  requests_after_last_step_[shard]++;
  network_.LearnerRequest(options_.index, shard, std::move(m));
}

void VirtualLearner::OnHeartbeat(const HeartbeatMsg& hb) {
  last_beat_ = hb;
  have_beat_ = true;
}

void VirtualLearner::SaveStep(long step) {
  if (!options_.run_dir.empty()) (void)SaveLearnerStep(options_.run_dir, options_.index, step);
}

Status VirtualLearner::SaveMoments(long done) {
  if (options_.run_dir.empty() || ring_ == nullptr) return Status::Ok();
  return SaveCheckpoint(LearnerCheckpointPath(options_.run_dir, options_.index), *ring_, done, RunConfigToYaml(cfg_));
}

void VirtualLearner::WriteMetrics(const nlohmann::json& line) {
  if (metrics_) (void)metrics_->Write(line);
}

void VirtualLearner::Note(const std::string& line) { std::fprintf(stderr, "%s: %s\n", me_.c_str(), line.c_str()); }

}  // namespace diloco
