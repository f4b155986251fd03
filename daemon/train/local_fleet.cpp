#include "daemon/train/local_fleet.h"

#include <chrono>
#include <cstdio>

namespace diloco {

namespace {

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---- LocalSyncer ----

Status LocalSyncer::Start(net::NetContext& context, const SyncerOptions& options, const TensorTable& table,
                          const float* init_params) {
  context_ = &context;
  options_ = options;
  table_ = &table;
  DL_RETURN_IF_ERROR(Syncer::Create(context, options, table, init_params, &syncer_));
  thread_ = std::thread([this] { RunThread(); });
  return Status::Ok();
}

void LocalSyncer::RunThread() {
  Status st = syncer_->Run();
  std::lock_guard<std::mutex> lock(mu_);
  if (status_.ok() && !st.ok()) status_ = st;
}

void LocalSyncer::Kill() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!syncer_) return;
  syncer_->Abort();
  lock.unlock();  // its thread takes mu_ as it ends
  thread_.join();
  lock.lock();
  syncer_.reset();  // its sockets close: the learners' messages go nowhere until the restart
}

void LocalSyncer::Restart() {
  std::lock_guard<std::mutex> lock(mu_);
  if (syncer_) return;
  SyncerOptions o = options_;
  o.resume = true;
  Status st = Syncer::Create(*context_, o, *table_, nullptr, &syncer_);
  if (!st.ok()) {
    if (status_.ok()) status_ = st.WithContext("restarting the syncer");
    return;
  }
  thread_ = std::thread([this] { RunThread(); });
}

Status LocalSyncer::Stop() {
  std::unique_lock<std::mutex> lock(mu_);
  if (syncer_) {
    syncer_->RequestStop();
    lock.unlock();
    thread_.join();
    lock.lock();
  }
  return status_;
}

SyncerStatusSnapshot LocalSyncer::CurrentStatus() const {
  std::lock_guard<std::mutex> lock(mu_);
  return syncer_ ? syncer_->CurrentStatus() : SyncerStatusSnapshot();
}

// ---- LocalFleet ----

LocalFleet::LocalFleet(net::NetContext& context, int learners, std::function<LearnerOptions(int)> options_of,
                       LocalSyncer* syncer, std::vector<std::shared_ptr<net::Link>> links,
                       net::LinkParams base_link)
    : context_(context),
      options_of_(std::move(options_of)),
      syncer_(syncer),
      links_(std::move(links)),
      base_link_(base_link) {
  for (int i = 0; i < learners; i++) slots_.push_back(std::make_unique<Slot>());
}

LocalFleet::~LocalFleet() {
  for (auto& s : slots_)
    for (auto& inc : s->incarnations)
      if (inc->thread.joinable()) inc->thread.join();
}

void LocalFleet::Start(int i, LearnerOptions lo) {
  Slot& slot = *slots_[i];
  slot.crash = false;
  lo.crash = &slot.crash;
  lo.slowdown = &slot.slowdown;
  auto chained = lo.on_progress;
  lo.on_progress = [&slot, chained](const LearnerProgress& p) {
    slot.step = p.step;
    if (chained) chained(p);
  };
  auto inc = std::make_unique<Incarnation>();
  Incarnation* raw = inc.get();
  std::lock_guard<std::mutex> lock(mu_);
  slot.incarnations.push_back(std::move(inc));
  raw->thread = std::thread([this, raw, lo] {
    raw->status = RunLearner(context_, lo, &raw->result);
    raw->ended = true;
  });
}

bool LocalFleet::Ended(int i) const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_[i]->incarnations.empty() || slots_[i]->incarnations.back()->ended;
}

void LocalFleet::WaitEnded(int i) {
  for (;;) {
    Incarnation* latest = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (slots_[i]->incarnations.empty()) return;
      latest = slots_[i]->incarnations.back().get();
    }
    // Only this thread joins (the chaos thread joins ended ones under mu_ in RestartLearner).
    while (!latest->ended) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::lock_guard<std::mutex> lock(mu_);
    if (slots_[i]->incarnations.back().get() == latest) return;  // no newer one started meanwhile
  }
}

void LocalFleet::JoinAll(const ChaosRunner* runner) {
  for (;;) {
    bool all = true;
    for (int i = 0; i < (int)slots_.size(); i++) {
      WaitEnded(i);
      std::lock_guard<std::mutex> lock(mu_);
      const Incarnation& latest = *slots_[i]->incarnations.back();
      if (!latest.ended || (latest.result.crashed && runner && runner->RestartPending(i))) all = false;
    }
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : slots_)
    for (auto& inc : s->incarnations)
      if (inc->thread.joinable()) inc->thread.join();
}

std::vector<std::vector<const LearnerResult*>> LocalFleet::Results() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::vector<const LearnerResult*>> out(slots_.size());
  for (size_t i = 0; i < slots_.size(); i++)
    for (const auto& inc : slots_[i]->incarnations) out[i].push_back(&inc->result);
  return out;
}

Status LocalFleet::FirstError() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < slots_.size(); i++)
    for (size_t k = 0; k < slots_[i]->incarnations.size(); k++) {
      const Status& st = slots_[i]->incarnations[k]->status;
      if (!st.ok())
        return st.WithContext(LearnerName((int)i) + (k > 0 ? " (incarnation " + std::to_string(k + 1) + ")" : ""));
    }
  return Status::Ok();
}

std::vector<std::vector<std::pair<int64_t, int64_t>>> LocalFleet::DownSpans() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> out(slots_.size());
  for (size_t i = 0; i < slots_.size(); i++) {
    const auto& incs = slots_[i]->incarnations;
    for (size_t k = 0; k < incs.size(); k++) {
      if (!incs[k]->result.crashed || incs[k]->killed_unix_ms == 0) continue;
      // Down from the kill until the next incarnation trains (or, never restarted, the end).
      const int64_t back = k + 1 < incs.size() ? incs[k + 1]->result.train_start_unix_ms : 0;
      out[i].push_back({incs[k]->killed_unix_ms, back});
    }
  }
  return out;
}

void LocalFleet::KillLearner(int i) {
  std::lock_guard<std::mutex> lock(mu_);
  Slot& slot = *slots_[i];
  if (slot.incarnations.empty() || slot.incarnations.back()->ended) return;  // done already
  slot.incarnations.back()->killed_unix_ms = UnixMs();
  slot.crash = true;
}

void LocalFleet::RestartLearner(int i) {
  Incarnation* latest = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slots_[i]->incarnations.empty()) return;
    latest = slots_[i]->incarnations.back().get();
    if (latest->killed_unix_ms == 0) return;  // not killed (finished, or already restarted)
  }
  while (!latest->ended) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (!latest->status.ok() || !latest->result.crashed) return;
  LearnerOptions lo = options_of_(i);
  lo.init_params = nullptr;
  lo.join_from_snapshot = true;
  lo.start_step = latest->result.steps;
  {
    // The time budget runs from the first incarnation's start (it has ended: a later one exists).
    std::lock_guard<std::mutex> lock(mu_);
    lo.time_budget_start_unix_ms = slots_[i]->incarnations.front()->result.train_start_unix_ms;
  }
  if (lo.start_step >= lo.config->train.steps) return;
  std::fprintf(stderr, "chaos: restarting %s at step %ld\n", LearnerName(i).c_str(), lo.start_step);
  Start(i, lo);
}

void LocalFleet::SetSlowdown(int i, double factor) {
  if (i >= 0 && i < (int)slots_.size()) slots_[i]->slowdown = factor;
}

void LocalFleet::ShapeLinks(int learner, const std::function<void(net::LinkParams*)>& change) {
  for (int i = 0; i < (int)links_.size(); i++) {
    if (learner >= 0 && i != learner) continue;
    // Chaos values are checked when the config is read; a change the link refuses says why.
    if (Status st = links_[i]->Change(change); !st.ok()) std::fprintf(stderr, "chaos: %s\n", st.message().c_str());
  }
}

void LocalFleet::SetPartitioned(int learner, bool partitioned) {
  ShapeLinks(learner, [&](net::LinkParams* p) { p->partitioned = partitioned; });
}

void LocalFleet::SetLoss(int learner, double prob) {
  ShapeLinks(learner, [&](net::LinkParams* p) { p->loss = prob > 0 ? prob : base_link_.loss; });
}

void LocalFleet::SetCorrupt(int learner, double prob) {
  ShapeLinks(learner, [&](net::LinkParams* p) { p->corrupt = prob; });
}

long LocalFleet::LearnerStep(int i) const { return i >= 0 && i < (int)slots_.size() ? slots_[i]->step.load() : 0; }

}  // namespace diloco
