#include "daemon/virt/timed_learner.h"

#include <algorithm>

#include "daemon/sync/fragments.h"
#include "daemon/sync/protocol.h"
#include "daemon/virt/liveness_beat.h"
#include "daemon/virt/virtual_step.h"

namespace diloco {

namespace {

int64_t MsToNs(double ms) { return (int64_t)(ms * 1e6); }

}  // namespace

GptConfig TimedModelFor(int fragments) {
  GptConfig g;
  g.vocab_size = 16;
  g.block_size = 4;
  g.n_embd = 8;
  g.n_head = 1;
  // wte+wpe count as one tensor, ln_f as two, each layer adds 12 (PartitionFragments' limit).
  g.n_layer = std::max(1, (fragments - 3 + 11) / 12);
  return g;
}

TimedLearner::TimedLearner(VirtualScheduler& scheduler, VirtualNetwork& network, LearnerOptions options,
                           const GptConfig& model, std::vector<double> delta_bytes, uint64_t incarnation)
    : scheduler_(scheduler),
      network_(network),
      options_(std::move(options)),
      cfg_(*options_.config),
      me_(LearnerName(options_.index)),
      model_(model),
      delta_bytes_(std::move(delta_bytes)),
      incarnation_(incarnation),
      step_rng_(mix_seed(cfg_.timing.seed, 0x57e9, incarnation)),
      steps_done_(options_.start_step) {}

TimedLearner::~TimedLearner() = default;

void TimedLearner::Launch() {
  wake_timer_ = scheduler_.At(scheduler_.now_ns(), [this] {
    wake_timer_ = 0;
    Run([this] { return SetUp(); });
  });
}

void TimedLearner::Run(const Continue& step) {
  if (done_) return;
  if (Status st = step(); !st.ok()) {
    status_ = st.WithContext(me_);
    if (core_) result_ = core_->result();
    End();
  }
}

// Its result is kept; its model and core go (a long run has an incarnation per failure).
void TimedLearner::End() {
  done_ = true;
  waiting_ = nullptr;
  for (uint64_t* t : {&wake_timer_, &step_timer_, &liveness_timer_}) {
    if (*t) scheduler_.Cancel(*t);
    *t = 0;
  }
  core_.reset();
  outer_.reset();
  backend_.reset();
}

void TimedLearner::Kill() {
  if (done_) return;
  if (core_) result_ = core_->CrashedResult();
  result_.crashed = true;
  result_.steps = steps_done_;
  result_.crashed_unix_ms = scheduler_.unix_ms();
  End();
}

Status TimedLearner::SetUp() {
  BackendOptions bo;
  bo.model = model_;
  if (std::string err = CreateBackend("cpu", bo, &backend_); !err.empty()) return Status::Error(err);
  if (options_.init_params != nullptr) backend_->upload_params(options_.init_params);
  outer_ = MakeBackendOuterState(*backend_);
  std::vector<Fragment> frags;
  DL_RETURN_IF_ERROR(PartitionFragments(backend_->table(), EffectiveFragments(cfg_.sync), &frags));
  core_ = std::make_unique<LearnerCore>(options_, *backend_, *outer_, std::move(frags), incarnation_, this);
  inbox_.Expect(core_->downlink_expect(), core_->dealer_expect(), options_.job_id);
  uplink_check_ = core_->downlink_expect();
  uplink_check_.accept = MessageBit(MessageType::kDelta);
  uplink_check_.allowed_senders = {me_};
  core_->Describe("timed (maths off)", 1);
  DL_RETURN_IF_ERROR(core_->SetUp());
  joining_since_ns_ = scheduler_.now_ns();
  return JoinStep();
}

// ---- Joining ----

Status TimedLearner::JoinStep() {
  if (core_->Joined()) {
    DL_RETURN_IF_ERROR(core_->Start(options_.join_from_snapshot));
    return SnapshotStep();
  }
  if (scheduler_.now_ns() - joining_since_ns_ > MsToNs(options_.handshake_timeout_ms))
    return Status::Error("no answer from the syncer within " + std::to_string(options_.handshake_timeout_ms) +
                         " virtual ms (joining since " + std::to_string(joining_since_ns_ / 1e9) + " virtual s)");
  DL_RETURN_IF_ERROR(core_->OnJoinTimer());
  WaitThen(MsToNs(20), [this] {
    DL_RETURN_IF_ERROR(DrainInbox());
    return JoinStep();
  });
  return Status::Ok();
}

Status TimedLearner::SnapshotStep() {
  if (!core_->AwaitingSnapshot()) return StartTraining();
  DL_RETURN_IF_ERROR(core_->OnTimer());
  WaitThen(MsToNs(cfg_.timing.heartbeat_ms), [this] {
    DL_RETURN_IF_ERROR(DrainInbox());
    return SnapshotStep();
  });
  return Status::Ok();
}

Status TimedLearner::StartTraining() {
  DL_RETURN_IF_ERROR(core_->BeginTraining());
  liveness_timer_ = scheduler_.After(MsToNs(cfg_.timing.heartbeat_ms), [this] { BeatLiveness(); });
  step_ = core_->StartStep();
  steps_done_ = step_;
  return NextStep();
}

// ---- Steps ----

// The inner loop's hook before step step_: what arrived, the core's timers, its BeforeStep.
Status TimedLearner::NextStep() {
  if (step_ >= cfg_.train.steps) return FlushStep(-1);
  DL_RETURN_IF_ERROR(DrainInbox());
  DL_RETURN_IF_ERROR(core_->OnTimer());
  StepControl control;
  DL_RETURN_IF_ERROR(core_->BeforeStep(step_, &control));
  if (control.stop) return FlushStep(-1);
  return TryStep();
}

// Blocked by the ledger (a lock-step mode's fragment in flight too long): wait for a message, as
// long as it takes, then ask again; else the step runs for its virtual duration.
Status TimedLearner::TryStep() {
  if (core_->Blocked()) {
    if (blocked_since_ns_ < 0) blocked_since_ns_ = scheduler_.now_ns();
    // The step has not run, so NextStep asks again for the same step.
    WaitThen(MsToNs(cfg_.timing.heartbeat_ms), [this] { return NextStep(); });
    return Status::Ok();
  }
  blocked_since_ns_ = -1;
  const VirtualStep s = DrawVirtualStep(cfg_, options_.index, step_rng_);
  step_base_s_ = s.base_s;
  step_ns_ = s.ns;
  step_timer_ = scheduler_.After(step_ns_, [this] {
    step_timer_ = 0;
    Run([this] { return StepEnd(); });
  });
  return Status::Ok();
}

// No maths: the parameters stay as they are, so the step's delta is zero.
Status TimedLearner::StepEnd() {
  StepResult r;
  r.step = step_;
  r.stats.applied = true;
  r.step_s = step_base_s_;
  steps_done_ = step_ + 1;
  last_step_ns_ = scheduler_.now_ns();
  const double step_s = (double)step_ns_ / 1e9;  // no chaos slowdown in virtual time: all provisioned
  DL_RETURN_IF_ERROR(core_->AfterStep(r, step_s, step_s));
  step_++;
  return NextStep();
}

// ---- The end ----

// phase -1: begin the flush; 0: until Flushed, then the work left; 1: until Flushed, then the
// last word; 2: until it is heard, then Finish.
Status TimedLearner::FlushStep(int phase) {
  if (phase < 0) {
    DL_RETURN_IF_ERROR(core_->BeginFlush());
    phase = 0;
  }
  if (phase < 2 ? !core_->Flushed() : !core_->LastWordHeard()) {
    WaitThen(MsToNs(cfg_.timing.heartbeat_ms), [this, phase] {
      DL_RETURN_IF_ERROR(DrainInbox());
      DL_RETURN_IF_ERROR(core_->OnTimer());
      return FlushStep(phase);
    });
    return Status::Ok();
  }
  if (phase == 0) {
    DL_RETURN_IF_ERROR(core_->SendRemaining());
    return FlushStep(1);
  }
  if (phase == 1) {
    if (liveness_timer_) scheduler_.Cancel(liveness_timer_);
    liveness_timer_ = 0;
    DL_RETURN_IF_ERROR(core_->SendLastWord());
    return FlushStep(2);
  }
  DL_RETURN_IF_ERROR(core_->Finish());
  result_ = core_->result();
  End();
  return Status::Ok();
}

// ---- Messages ----

void TimedLearner::WaitThen(int64_t timeout_ns, Continue then) {
  if (!inbox_.empty()) {
    Run(then);
    return;
  }
  waiting_ = std::move(then);
  wake_timer_ = scheduler_.After(timeout_ns, [this] {
    wake_timer_ = 0;
    Continue then = std::move(waiting_);
    waiting_ = nullptr;
    Run(then);
  });
}

void TimedLearner::Deliver(bool from_dealer, net::Message&& m) {
  if (done_) return;
  inbox_.Push(from_dealer, std::move(m));
  if (!waiting_) return;
  scheduler_.Cancel(wake_timer_);
  wake_timer_ = 0;
  Continue then = std::move(waiting_);
  waiting_ = nullptr;
  Run(then);
}

Status TimedLearner::DrainInbox() {
  return inbox_.Drain(*core_, [this](const std::string& line) { Note(line); });
}

// A Delta is charged as the real fragment's (a heartbeat, which has no payload, as itself).
void TimedLearner::SendUplink(int shard, net::Message&& m) {
  size_t charged = 0;
  if (!delta_bytes_.empty() && m.size() > 1) {
    ParsedMessage parsed;
    const auto spans = m.spans();
    if (ParseEnvelope(spans, uplink_check_, &parsed).ok())
      if (const DeltaMsg* d = parsed.get<DeltaMsg>(); d && d->fragment < delta_bytes_.size())
        charged = (size_t)delta_bytes_[d->fragment];
  }
  network_.LearnerPublish(options_.index, shard, options_.job_id, std::move(m), charged);
}

void TimedLearner::OnHeartbeat(const HeartbeatMsg& hb) {
  last_beat_ = hb;
  have_beat_ = true;
  last_core_beat_ns_ = scheduler_.now_ns();
}

// The liveness stream keeps a learner heard while its main stream is quiet (a step longer than
// the heartbeat period). Its beat repeats the core's latest heartbeat, so one within the last
// period is not sent again: the syncer hears the same thing, with a message a period fewer.
void TimedLearner::BeatLiveness() {
  const int64_t period_ns = MsToNs(cfg_.timing.heartbeat_ms);
  liveness_timer_ = scheduler_.After(period_ns, [this] { BeatLiveness(); });
  if (!have_beat_ || scheduler_.now_ns() - last_core_beat_ns_ < period_ns) return;
  net::Message m;
  if (!BuildLivenessBeat(options_.job_id, me_, ++liveness_seq_, incarnation_, scheduler_.unix_ms(), last_beat_, &m).ok())
    return;
  network_.LearnerPublish(options_.index, VirtualNetwork::kEveryShard, LivenessTopic(options_.job_id), std::move(m));
}

std::string TimedLearner::Describe() const {
  if (done_) return me_ + ": ended at step " + std::to_string(result_.steps) + (result_.crashed ? " (killed)" : "");
  if (!core_) return me_ + ": starting";
  return me_ + ": step " + std::to_string(step_) + (core_->Joined() ? "" : ", joining") +
         (core_->Blocked() ? ", blocked on fragment " + std::to_string(core_->BlockingFragment()) : "");
}

}  // namespace diloco
