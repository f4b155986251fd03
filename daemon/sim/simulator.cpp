#include "daemon/sim/simulator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <queue>
#include <random>

#include "daemon/net/codec.h"
#include "daemon/sync/decide.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/protocol.h"
#include "daemon/sync/round_book.h"
#include "daemon/train/trainer.h"
#include "kernels/gpt.h"

namespace diloco {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Virtual time: seconds since the run's start, as the SyncTime the syncer's rules take.
SyncTime At(double t) {
  return SyncTime(std::chrono::duration_cast<SyncClock::duration>(std::chrono::duration<double>(t)));
}

// A learner's WAN link: messages queue behind each other at its bandwidth. Bytes are counted
// per window of window_s (from when they start) for the peak.
class Link {
 public:
  Link(double gbps, double latency_s, double window_s)
      : bytes_per_s_(gbps * 1e9 / 8), latency_s_(latency_s), window_s_(window_s) {}
  // When a message of bytes sent at t arrives.
  double Send(double t, double bytes) {
    const double start = std::max(t, free_at_);
    free_at_ = start + bytes / bytes_per_s_;
    Count(start, bytes);
    return free_at_ + latency_s_;
  }
  double PeakGbps() const {
    double peak = 0;
    for (double b : buckets_) peak = std::max(peak, b * 8 / window_s_ / 1e9);
    return peak;
  }
  double total_bytes() const { return total_; }

 private:
  void Count(double t, double bytes) {
    const size_t b = (size_t)(t / window_s_);
    if (buckets_.size() <= b) buckets_.resize(b + 1, 0);
    buckets_[b] += bytes;
    total_ += bytes;
  }
  double bytes_per_s_, latency_s_, window_s_;
  double free_at_ = 0;
  double total_ = 0;
  std::vector<double> buckets_;
};

enum class Ev { kStep, kHeartbeat, kDeltaArrives, kGlobalArrives, kDropNotice, kWake, kFail, kRestart };

struct Event {
  double t;
  uint64_t seq = 0;  // ties in time go in the order scheduled: the run is deterministic
  Ev kind = Ev::kStep;
  int learner = 0;
  uint64_t incarnation = 0;
  int fragment = 0;
  // kDeltaArrives: the delta; kGlobalArrives: the version and when it was merged.
  uint64_t base_version = 0, c_steps = 0, c_tokens = 0, learner_step = 0;
  double merged_at = 0;
  double restart_after_s = -1;  // kFail, scripted: < 0 never restarted
  bool stale = false;           // kDropNotice: the delta was too stale (the learner resyncs)
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

// Per fragment, as the learner's FragmentLedger counts: the work since the base, and the delta
// in flight with the counts it carried (the work after it stays counted when its Global folds).
struct FragmentState {
  uint64_t base = 0;  // the global version it last folded
  uint64_t c_steps = 0, c_tokens = 0;
  bool in_flight = false;
  uint64_t sent_steps = 0, sent_tokens = 0;
  long in_flight_steps = 0;  // steps since the delta left
  double delta_arrived = kInf;  // when the syncer got it (its Global is the first merge after)
};

struct SimLearner {
  bool up = true;
  bool flushing = false;  // did train.steps: sends the work left, then says it finished
  bool finished = false;
  uint64_t incarnation = 1;
  long steps = 0;  // in all (a restarted learner resumes its count, as from its checkpoint)
  double factor = 1;  // straggler slowdown
  bool blocked = false;
  double blocked_since = 0;
  std::vector<FragmentState> frags;
};

// The DiLoCo modes: learners, links and the syncer's round book and Decide.
class SyncerSim {
 public:
  SyncerSim(const Scenario& s, SimMode mode, const std::vector<Fragment>& fragments, SimResult* out)
      : s_(s), mode_(mode), out_(out), rng_(s.seed) {
    sync_ = s.run.sync;
    sync_.mode = mode == SimMode::kDiloco ? SyncMode::kDiloco
                 : mode == SimMode::kStreaming ? SyncMode::kStreaming
                                               : SyncMode::kDecoupled;
    M_ = sync_.learners;
    P_ = (int)fragments.size();
    H_ = sync_.inner_steps;
    // hours 0: every learner does train.steps, and the run ends with the last merge.
    step_limited_ = s.hours <= 0;
    end_ = step_limited_ ? kInf : s.hours * 3600;
    tokens_per_step_ = (double)s.run.train.batch_size * s.run.model.block_size * std::max(1, s.run.train.ranks);
    double total = 0;
    for (const Fragment& f : fragments) total += (double)f.numel;
    for (const Fragment& f : fragments) {
      weights_.push_back(f.numel / total);
      // The codec's size: exact when dense, with top-k its bound (the bitmap index).
      up_bytes_.push_back((double)MaxEncodedBytes(UplinkCodec(sync_), f.numel));
      down_bytes_.push_back((double)MaxEncodedBytes(DownlinkCodec(sync_), f.numel));
      merge_s_per_delta_.push_back(f.numel * 4.0 / (s.merge_gbps * 1e9));
    }
    RoundBookOptions bo = RoundBookOptionsFor(sync_, P_);
    bo.norm_limit = 0;  // no model maths: there are no norms to filter
    book_ = std::make_unique<RoundBook>(bo, At(0));
    dopt_ = DecideOptionsFor(sync_);
    const double gbps = sync_.link.bandwidth_mbps > 0 ? sync_.link.bandwidth_mbps / 1e3 : s.wan_gbps;
    const double latency_s = (sync_.link.bandwidth_mbps > 0 ? sync_.link.latency_ms : s.wan_latency_ms) / 1e3;
    latency_s_ = latency_s;
    // wan_window_s 0: one fragment interval, the time between two fragments' sends.
    const double window_s = s.wan_window_s > 0 ? s.wan_window_s : H_ * s.step_s / P_;
    out_->wan_window_s = window_s;
    learners_.resize(M_);
    for (int l = 0; l < M_; l++) {
      learners_[l].frags.assign(P_, FragmentState());
      learners_[l].factor =
          (l >= M_ - s.stragglers ? s.straggler_factor : 1) * SlowdownOf(s.run.learners, l);
      up_links_.emplace_back(gbps, latency_s, window_s);
      down_links_.emplace_back(gbps, latency_s, window_s);
    }
    version_.assign(P_, 0);
    wake_at_.assign(P_, kInf);
    chip_rate_per_s_ = s.chip_mtbf_h > 0 ? (s.chips / M_) / (s.chip_mtbf_h * 3600) : 0;
    step_sigma_ = std::sqrt(std::log1p(s.step_jitter * s.step_jitter));
  }

  Status Run() {
    for (int l = 0; l < M_; l++) {
      ScheduleStep(l, 0);
      Push(Event{s_.heartbeat_s, 0, Ev::kHeartbeat, l, 1});
      ScheduleFailure(l, 0);
    }
    // The run config's scripted kills, as `dilococtl train` plays them (seconds since the start).
    for (const ChaosEvent& ce : s_.run.chaos.events) {
      if (ce.kind != ChaosEventKind::kKill || ce.at_step >= 0 || ce.learner < 0 || ce.learner >= M_) continue;
      Event k{ce.at_s, 0, Ev::kFail, ce.learner, 0};
      k.restart_after_s = ce.restart_after_s;
      Push(k);
    }
    while (!queue_.empty()) {
      Event e = queue_.top();
      queue_.pop();
      if (e.t > end_) break;
      if (step_limited_ && AllFinished() && NothingPending() && e.kind != Ev::kDeltaArrives) break;
      now_ = e.t;
      out_->events++;
      DL_RETURN_IF_ERROR(Handle(e));
    }
    return Finish();
  }

 private:
  void Push(Event e) {
    e.seq = seq_++;
    queue_.push(e);
  }
  double StepTime(int l) {
    std::lognormal_distribution<double> d(-step_sigma_ * step_sigma_ / 2, step_sigma_);  // mean 1
    return s_.step_s * learners_[l].factor * (s_.step_jitter > 0 ? d(rng_) : 1.0);
  }
  void ScheduleStep(int l, double t) {
    Push(Event{t + StepTime(l), 0, Ev::kStep, l, learners_[l].incarnation});
  }
  void ScheduleFailure(int l, double t) {
    if (chip_rate_per_s_ <= 0) return;
    std::exponential_distribution<double> d(chip_rate_per_s_);
    Push(Event{t + d(rng_), 0, Ev::kFail, l, learners_[l].incarnation});
  }
  bool Current(const Event& e) const {
    return learners_[e.learner].up && learners_[e.learner].incarnation == e.incarnation;
  }

  Status Handle(const Event& e) {
    switch (e.kind) {
      case Ev::kStep:
        if (Current(e)) OnStep(e.learner, e.t);
        return Status::Ok();
      case Ev::kHeartbeat:
        if (Current(e)) OnHeartbeat(e.learner, e.t);
        return Status::Ok();
      case Ev::kDeltaArrives:
        return OnDelta(e);
      case Ev::kGlobalArrives:
        if (Current(e)) OnGlobal(e);
        return Status::Ok();
      case Ev::kDropNotice:
        if (Current(e)) OnDropNotice(e);
        return Status::Ok();
      case Ev::kWake:
        if (e.fragment < 0) return DeliverBeats(e.t);
        if (wake_at_[e.fragment] == e.t) wake_at_[e.fragment] = kInf;
        return DecideFragment(e.fragment, e.t);
      case Ev::kFail:
        if (e.incarnation == 0 && learners_[e.learner].up && !learners_[e.learner].flushing) {
          OnFail(e.learner, e.t, e.restart_after_s);  // scripted: restart after its own delay
        } else if (Current(e) && !learners_[e.learner].flushing) {
          OnFail(e.learner, e.t, s_.detect_s + s_.restart_s + s_.rejoin_s);
        }
        return Status::Ok();
      case Ev::kRestart:
        OnRestart(e.learner, e.t);
        return Status::Ok();
    }
    return Status::Ok();
  }

  void OnStep(int l, double t) {
    SimLearner& L = learners_[l];
    L.steps++;
    last_t_ = t;
    for (int p = 0; p < P_; p++) {
      FragmentState& f = L.frags[p];
      f.c_steps++;
      f.c_tokens += (uint64_t)tokens_per_step_;
      if (f.in_flight) f.in_flight_steps++;
      if (!f.in_flight && Fires(p, L.steps, H_, P_)) SendDelta(l, p, t);
    }
    if (step_limited_ && L.steps >= s_.run.train.steps) {
      Finish(l, t);
    } else if (MustWait(L)) {
      L.blocked = true;
      L.blocked_since = t;
    } else {
      ScheduleStep(l, t);
    }
  }

  // Done with train.steps, the learner flushes as the real one does: it waits for the Globals of
  // its deltas in flight, sends the work left, and once nothing is left says kFinished in a
  // heartbeat, so no round waits for it any more.
  void Finish(int l, double t) {
    learners_[l].flushing = true;
    Flush(l, t);
  }
  void Flush(int l, double t) {
    SimLearner& L = learners_[l];
    bool left = false;
    for (int p = 0; p < P_; p++) {
      FragmentState& f = L.frags[p];
      if (!f.in_flight && f.c_steps > 0) SendDelta(l, p, t);
      left = left || f.in_flight;
    }
    if (left) return;
    L.finished = true;
    OnHeartbeat(l, t);
  }

  void SendDelta(int l, int p, double t) {
    SimLearner& L = learners_[l];
    FragmentState& f = L.frags[p];
    Event d{up_links_[l].Send(t, up_bytes_[p]), 0, Ev::kDeltaArrives, l, L.incarnation, p};
    d.base_version = f.base;
    d.c_steps = f.c_steps;
    d.c_tokens = f.c_tokens;
    d.learner_step = (uint64_t)L.steps;
    Push(d);
    f.sent_steps = f.c_steps;
    f.sent_tokens = f.c_tokens;
    f.in_flight = true;
    f.in_flight_steps = 0;
    f.delta_arrived = kInf;
  }

  // diloco waits for the Global of its delta; streaming once a delta is sync.overlap steps old.
  bool MustWait(const SimLearner& L) const {
    for (const FragmentState& f : L.frags) {
      if (!f.in_flight) continue;
      if (mode_ == SimMode::kDiloco) return true;
      if (mode_ == SimMode::kStreaming && f.in_flight_steps >= sync_.overlap) return true;
    }
    return false;
  }

  void OnHeartbeat(int l, double t) {
    const SimLearner& L = learners_[l];
    HeartbeatMsg hb;
    hb.state = L.finished ? LearnerState::kFinished : LearnerState::kTraining;
    hb.step = (uint64_t)L.steps;
    hb.step_time_ms = (float)(s_.step_s * L.factor * 1e3);
    hb.interval_ms = (uint32_t)(s_.heartbeat_s * 1e3);
    for (int p = 0; p < P_; p++) {
      const FragmentState& f = L.frags[p];
      hb.fragments.push_back({(uint32_t)p, f.base, f.c_steps, f.c_tokens, f.in_flight});
    }
    const double arrive = t + latency_s_;  // heartbeats are small: they take the latency only
    heard_.push_back({arrive, l, L.incarnation, std::move(hb)});
    Push(Event{arrive, 0, Ev::kWake, l, L.incarnation, -1});  // delivers the beat (below)
    if (!L.finished) Push(Event{t + s_.heartbeat_s, 0, Ev::kHeartbeat, l, L.incarnation});
  }

  Status OnDelta(const Event& e) {
    const SyncTime now = At(e.t);
    const int l = e.learner;
    if (learners_[l].incarnation != e.incarnation) {
      // Sent by an incarnation that died and has restarted since: the syncer hears the new one.
      lost_.push_back({e.t, e.fragment, l, (double)e.c_tokens, LossCause::kCrashed});
      return Status::Ok();
    }
    book_->OnHeard(l, e.incarnation, now);
    book_->OnDeltaSeen(l, (uint32_t)e.fragment);
    DeltaArrival d;
    d.learner = l;
    d.fragment = (uint32_t)e.fragment;
    d.base_version = e.base_version;
    d.c_steps = e.c_steps;
    d.c_tokens = e.c_tokens;
    d.learner_step = e.learner_step;
    book_->Admit(std::move(d), version_[e.fragment], now);
    if (Current(e)) learners_[l].frags[e.fragment].delta_arrived = e.t;
    return DecideFragment(e.fragment, e.t);
  }

  Status DecideFragment(int p, double t) {
    if (t < syncer_free_at_) return Wake(p, syncer_free_at_);  // one syncer thread: merges queue
    if (!book_->HasPending((uint32_t)p)) return Status::Ok();
    const Decision d = Decide(At(t), book_->Round((uint32_t)p, At(t), timings_), dopt_);
    if (d.action == DecideAction::kWait) {
      if (d.wait_until != SyncTime::max()) {
        return Wake(p, std::chrono::duration<double>(d.wait_until.time_since_epoch()).count());
      }
      return Status::Ok();
    }
    std::vector<PendingDelta> taken = book_->TakeForMerge((uint32_t)p, version_[p]);
    TakeDrops(t);
    if (taken.empty()) return Status::Ok();
    const double done = t + merge_s_per_delta_[p] * taken.size();
    syncer_free_at_ = done;
    double first = kInf;
    std::vector<double> arrivals;
    for (const PendingDelta& pd : taken) {
      const double at = std::chrono::duration<double>(pd.at.time_since_epoch()).count();
      first = std::min(first, at);
      arrivals.push_back(at);
      merged_.push_back({done, p, pd.learner, pd.counts.tokens});  // past the end: in flight, left out
      const uint64_t stale = version_[p] - std::min(version_[p], pd.base_version);
      if (out_->staleness.size() <= stale) out_->staleness.resize(stale + 1, 0);
      out_->staleness[stale]++;
    }
    std::sort(arrivals.begin(), arrivals.end());
    const size_t k = std::min<size_t>(arrivals.size(), std::max(1, d.quorum)) - 1;
    timings_.quorum_ms.Add((arrivals[k] - first) * 1e3);
    timings_.sync_ms.Add((done - t) * 1e3);
    contributors_ += taken.size();
    out_->merges++;
    last_t_ = std::max(last_t_, done);
    version_[p]++;
    for (int l = 0; l < M_; l++) {
      if (!learners_[l].up) continue;
      Event g{down_links_[l].Send(done, down_bytes_[p]), 0, Ev::kGlobalArrives, l, learners_[l].incarnation, p};
      g.base_version = version_[p];
      g.merged_at = t;
      Push(g);
    }
    return Status::Ok();
  }

  Status Wake(int p, double t) {
    t = std::max(t, now_ + 1e-3);  // a wait that ends now: decide again a moment later, not in a loop
    if (t >= wake_at_[p]) return Status::Ok();  // an earlier wake is set: it decides again
    wake_at_[p] = t;
    Push(Event{t, 0, Ev::kWake, 0, 0, p});
    return Status::Ok();
  }

  // Heartbeats due by t reach the round book; the step times feed the grace window.
  Status DeliverBeats(double t) {
    while (!heard_.empty() && heard_.front().at <= t) {
      Beat& b = heard_.front();
      if (learners_[b.learner].incarnation == b.incarnation && learners_[b.learner].up) {
        book_->OnHeard(b.learner, b.incarnation, At(b.at));
        book_->OnHeartbeat(b.learner, b.hb, At(b.at));
        timings_.step_ms.Add(b.hb.step_time_ms);
      }
      heard_.pop_front();
    }
    // A learner's liveness changed: every open round may close now.
    for (int p = 0; p < P_; p++)
      if (book_->HasPending((uint32_t)p)) DL_RETURN_IF_ERROR(DecideFragment(p, t));
    return Status::Ok();
  }

  // Drops the syncer tells the learner of (its next SyncerStatus): a stale delta's learner
  // resyncs from a snapshot and its work is lost; a refused one sends its work again.
  void TakeDrops(double t) {
    for (const DeltaDrop& d : book_->TakeDrops()) {
      if (DropKeepsWork(d.why)) continue;  // its work travels in the learner's next delta
      out_->dropped_deltas++;
      const bool stale = d.why == "too_stale" || d.why == "from_the_future";
      if (stale) lost_.push_back({t, (int)d.fragment, d.learner, d.tokens, LossCause::kDropped});
      if (!d.tell_learner || !learners_[d.learner].up) continue;
      Event n{t + latency_s_, 0, Ev::kDropNotice, d.learner, learners_[d.learner].incarnation, (int)d.fragment};
      n.stale = stale;
      Push(n);
    }
  }

  void OnDropNotice(const Event& e) {
    FragmentState& f = learners_[e.learner].frags[e.fragment];
    if (!f.in_flight) return;
    f.in_flight = false;
    if (e.stale) {  // a snapshot of the fragment replaces its work
      f.base = version_[e.fragment];
      f.c_steps = f.c_tokens = 0;
    }
    Unblock(e.learner, e.t);
  }

  void Unblock(int l, double t) {
    SimLearner& L = learners_[l];
    if (L.flushing) {
      if (!L.finished) Flush(l, t);
      return;
    }
    if (L.blocked && !MustWait(L)) {
      L.blocked = false;
      spans_.push_back({l, L.blocked_since, t, Activity::kBlocked});
      ScheduleStep(l, t);
    }
  }

  void OnGlobal(const Event& e) {
    SimLearner& L = learners_[e.learner];
    FragmentState& f = L.frags[e.fragment];
    if (e.base_version <= f.base) return;
    f.base = e.base_version;
    if (f.in_flight && e.merged_at >= f.delta_arrived) {  // ours was in it (or was let go): fold
      f.in_flight = false;
      f.c_steps -= f.sent_steps;
      f.c_tokens -= f.sent_tokens;
    }
    Unblock(e.learner, e.t);
  }

  // restart_after < 0: never restarted.
  void OnFail(int l, double t, double restart_after) {
    SimLearner& L = learners_[l];
    out_->failures++;
    for (int p = 0; p < P_; p++) {  // the work not sent yet dies with it
      const FragmentState& f = L.frags[p];
      const uint64_t unsent = f.c_tokens - (f.in_flight ? f.sent_tokens : 0);
      if (unsent > 0) lost_.push_back({t, p, l, (double)unsent, LossCause::kCrashed});
    }
    if (L.blocked) spans_.push_back({l, L.blocked_since, t, Activity::kBlocked});
    L.up = false;
    L.blocked = false;
    const double back = restart_after < 0 ? kInf : t + restart_after;
    down_spans_.push_back({l, t, back, Activity::kDown});
    if (restart_after >= 0) Push(Event{back, 0, Ev::kRestart, l, L.incarnation});
  }

  // A new incarnation with the global model of now (the snapshot it fetched while rejoining).
  void OnRestart(int l, double t) {
    SimLearner& L = learners_[l];
    L.up = true;
    L.incarnation++;
    L.blocked = false;
    for (int p = 0; p < P_; p++) {
      L.frags[p] = FragmentState();
      L.frags[p].base = version_[p];
    }
    ScheduleStep(l, t);
    Push(Event{t, 0, Ev::kHeartbeat, l, L.incarnation});
    ScheduleFailure(l, t);
  }

  bool AllFinished() const {
    for (const SimLearner& L : learners_)
      if (!L.finished) return false;
    return true;
  }
  bool NothingPending() const {
    for (int p = 0; p < P_; p++)
      if (book_->HasPending((uint32_t)p)) return false;
    return true;
  }

  Status Finish() {
    if (step_limited_) end_ = last_t_;
    for (const ActivitySpan& d : down_spans_)
      if (d.start_s < end_) spans_.push_back({d.learner, d.start_s, std::min(d.end_s, end_), d.activity});
    for (int l = 0; l < M_; l++)
      if (learners_[l].blocked) spans_.push_back({l, learners_[l].blocked_since, end_, Activity::kBlocked});
    GoodputInput in;
    in.wall_s = end_;
    std::erase_if(merged_, [&](const MergedDelta& m) { return m.time_s > end_; });
    std::erase_if(lost_, [&](const LostDelta& m) { return m.time_s > end_; });
    for (ActivitySpan& sp : spans_) sp.end_s = std::min(sp.end_s, end_);
    in.nominal_tokens_per_s.assign(M_, tokens_per_step_ / s_.step_s);
    in.fragment_weights = weights_;
    in.expected_merge_interval_s = H_ * s_.step_s / P_;
    in.spans = std::move(spans_);
    in.merged = std::move(merged_);
    in.lost = std::move(lost_);
    DL_RETURN_IF_ERROR(ComputeGoodput(in, &out_->goodput));
    out_->contributors_mean = out_->merges ? (double)contributors_ / out_->merges : 0;
    double total = 0;
    for (int l = 0; l < M_; l++) {
      out_->peak_wan_gbps = std::max({out_->peak_wan_gbps, up_links_[l].PeakGbps(), down_links_[l].PeakGbps()});
      total += up_links_[l].total_bytes() + down_links_[l].total_bytes();
    }
    out_->mean_wan_gbps = total * 8 / end_ / 1e9 / (2 * M_);
    return Status::Ok();
  }

  struct Beat {
    double at;
    int learner;
    uint64_t incarnation;
    HeartbeatMsg hb;
  };

  const Scenario& s_;
  SimMode mode_;
  SimResult* out_;
  std::mt19937_64 rng_;
  SyncConfig sync_;
  int M_ = 1, P_ = 1, H_ = 1;
  double latency_s_ = 0;
  double end_ = 0, tokens_per_step_ = 0, chip_rate_per_s_ = 0, step_sigma_ = 0;
  std::vector<double> weights_, up_bytes_, down_bytes_, merge_s_per_delta_;
  std::unique_ptr<RoundBook> book_;
  DecideOptions dopt_;
  RoundTimings timings_;
  std::vector<SimLearner> learners_;
  std::vector<Link> up_links_, down_links_;
  std::vector<uint64_t> version_;
  std::vector<double> wake_at_;
  double syncer_free_at_ = 0;
  double now_ = 0;     // the event being handled
  double last_t_ = 0;  // the last step or merge (a step-limited run ends there)
  bool step_limited_ = false;
  uint64_t seq_ = 0, contributors_ = 0;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue_;
  std::deque<Beat> heard_;  // in flight to the syncer, in arrival order (one latency for all)
  std::vector<ActivitySpan> spans_;
  std::vector<ActivitySpan> down_spans_;  // may end past the run: clipped at Finish
  std::vector<MergedDelta> merged_;
  std::vector<LostDelta> lost_;
};

// ddp and elastic ddp: groups of chips in lock step, no syncer. A "slice" is the unit that
// fails and comes back (ddp: the whole job is one slice). Progress is piecewise constant
// between events, so the loop visits failures, returns and pauses, not steps.
Status SimulateDataParallel(const Scenario& s, bool elastic, SimResult* out) {
  const int S = elastic ? s.elastic_slices : 1;
  const double end = s.hours * 3600;
  const double tokens_per_step =
      (double)s.run.train.batch_size * s.run.model.block_size * std::max(1, s.run.train.ranks) * s.run.sync.learners;
  const double rate = tokens_per_step / s.step_s;  // the whole job, fault-free
  // A synchronous job runs at its slowest member's pace.
  const double pace = s.stragglers > 0 ? 1.0 / s.straggler_factor : 1.0;
  const double fail_rate_per_s = s.chips / (s.chip_mtbf_h * 3600);  // any chip, the whole job
  std::mt19937_64 rng(s.seed);
  std::exponential_distribution<double> next_failure(fail_rate_per_s);

  GoodputInput in;
  in.wall_s = end;
  in.nominal_tokens_per_s.assign(S, rate / S);
  in.fragment_weights = {1.0};
  in.expected_merge_interval_s = elastic ? s.step_s * 60 : s.checkpoint_every_s;

  std::vector<double> back_at(S, -1);  // < 0: up
  double t = 0, pause_until = 0;
  double fail_at = next_failure(rng);
  double since_checkpoint = 0;      // ddp: tokens not yet in a checkpoint
  double last_checkpoint_t = 0;     // ddp: training time at the last checkpoint
  double trained_since_resume = 0;  // ddp: seconds of training since the last restart
  double record_t = 0, record_tokens = 0;  // elastic: merged tokens batched per minute
  auto up_count = [&] { return (int)std::count_if(back_at.begin(), back_at.end(), [](double b) { return b < 0; }); };
  while (t < end) {
    double next_back = kInf;
    for (double b : back_at)
      if (b >= 0) next_back = std::min(next_back, b);
    // ddp checkpoints every checkpoint_every_s of training (not while it is down).
    const double next_ckpt = elastic || back_at[0] >= 0
                                 ? kInf
                                 : t + (s.checkpoint_every_s - (trained_since_resume - last_checkpoint_t));
    const double next_record = elastic ? record_t + 60 : kInf;
    const double pause_end = pause_until > t ? pause_until : kInf;
    const double next = std::min({end, fail_at, next_back, pause_end, next_ckpt, next_record});
    // Train over [t, next) unless paused.
    const double train_from = std::max(t, pause_until);
    if (next > train_from && (elastic ? up_count() > 0 : back_at[0] < 0)) {
      const double secs = next - train_from;
      const double tokens = rate * pace * secs * up_count() / S;
      if (elastic) {
        record_tokens += tokens;
      } else {
        since_checkpoint += tokens;
        trained_since_resume += secs;
      }
      if (pause_until > t) {  // paused over [t, pause_until), then trained
        for (int i = 0; i < S; i++)
          if (back_at[i] < 0) in.spans.push_back({i, t, pause_until, Activity::kBlocked});
      }
    } else if (next > t && pause_until > t) {
      for (int i = 0; i < S; i++)
        if (back_at[i] < 0) in.spans.push_back({i, t, std::min(next, pause_until), Activity::kBlocked});
    }
    t = next;
    out->events++;
    if (t >= end) break;
    if (elastic && t >= next_record) {
      if (record_tokens > 0) in.merged.push_back({t, 0, 0, record_tokens});
      record_tokens = 0;
      record_t = t;
    }
    if (!elastic && t == next_ckpt) {
      if (since_checkpoint > 0) in.merged.push_back({t, 0, 0, since_checkpoint});
      out->merges++;
      since_checkpoint = 0;
      last_checkpoint_t = trained_since_resume;
    }
    if (t == fail_at) {
      fail_at = t + next_failure(rng);
      std::uniform_int_distribution<int> which(0, S - 1);
      const int slice = which(rng);
      if (back_at[slice] >= 0) continue;  // already down: the restart covers it
      out->failures++;
      const double down_for = s.detect_s + s.restart_s + s.rejoin_s;
      back_at[slice] = t + down_for;
      in.spans.push_back({slice, t, std::min(end, t + down_for), Activity::kDown});
      if (elastic) {
        // The step in progress is lost; everyone pauses while the job shrinks.
        in.lost.push_back({t, 0, slice, rate * pace / S * s.step_s, LossCause::kCrashed});
        pause_until = std::max(pause_until, t + s.detect_s + s.reconfigure_s);
      } else {
        if (since_checkpoint > 0) in.lost.push_back({t, 0, 0, since_checkpoint, LossCause::kCrashed});
        since_checkpoint = 0;
        trained_since_resume = last_checkpoint_t = 0;
      }
      continue;
    }
    for (int i = 0; i < S; i++) {
      if (back_at[i] >= 0 && back_at[i] <= t) {
        back_at[i] = -1;
        if (elastic) pause_until = std::max(pause_until, t + s.reconfigure_s);  // it grows back
      }
    }
  }
  if (since_checkpoint > 0) in.merged.push_back({end, 0, 0, since_checkpoint});  // the final checkpoint
  if (record_tokens > 0) in.merged.push_back({end, 0, 0, record_tokens});
  if (elastic) out->merges = in.merged.size();
  out->contributors_mean = 1;
  return ComputeGoodput(in, &out->goodput);
}

}  // namespace

const char* ToString(SimMode mode) {
  switch (mode) {
    case SimMode::kDdp: return "ddp";
    case SimMode::kElasticDdp: return "elastic-ddp";
    case SimMode::kDiloco: return "diloco";
    case SimMode::kStreaming: return "streaming";
    case SimMode::kDecoupled: return "decoupled";
  }
  return "?";
}

Status ParseSimMode(const std::string& text, SimMode* out) {
  for (SimMode m : {SimMode::kDdp, SimMode::kElasticDdp, SimMode::kDiloco, SimMode::kStreaming, SimMode::kDecoupled}) {
    if (text == ToString(m)) {
      *out = m;
      return Status::Ok();
    }
  }
  return Status::Error("unknown mode '" + text + "': ddp, elastic-ddp, diloco, streaming or decoupled");
}

SimMode SimModeOf(const RunConfig& run) {
  switch (run.sync.mode) {
    case SyncMode::kDdp: return SimMode::kDdp;
    case SyncMode::kDiloco: return SimMode::kDiloco;
    case SyncMode::kStreaming: return SimMode::kStreaming;
    default: return SimMode::kDecoupled;
  }
}

Status Simulate(const Scenario& s, SimMode mode, SimResult* out) {
  const auto t0 = std::chrono::steady_clock::now();
  *out = SimResult();
  out->mode = mode;
  out->chips = s.chips;
  out->hours = s.hours;
  out->merge_gbps = s.merge_gbps;
  out->merge_gbps_source = s.merge_gbps_source;
  out->balanced_fragments = s.balanced_fragments;
  if (mode == SimMode::kDdp || mode == SimMode::kElasticDdp) {
    if (s.hours <= 0) return Status::Error(std::string(ToString(mode)) + " needs hours > 0 (a time-limited run)");
    out->learners = mode == SimMode::kDdp ? 1 : s.elastic_slices;
    DL_RETURN_IF_ERROR(SimulateDataParallel(s, mode == SimMode::kElasticDdp, out));
  } else {
    RunConfig run = s.run;
    run.sync.mode = mode == SimMode::kDiloco ? SyncMode::kDiloco
                    : mode == SimMode::kStreaming ? SyncMode::kStreaming
                                                  : SyncMode::kDecoupled;
    std::vector<Fragment> fragments;
    DL_RETURN_IF_ERROR(PartitionFragments(gpt_tensor_table(GptConfigOf(run.model)), EffectiveFragments(run.sync),
                                          &fragments,
                                          s.balanced_fragments ? PartitionRule::kBalanced
                                                               : PartitionRule::kWholeTensors));
    out->fragments = (int)fragments.size();
    out->fragment_imbalance = FragmentImbalance(fragments);
    out->learners = run.sync.learners;
    Scenario scenario = s;
    scenario.run = run;
    SyncerSim sim(scenario, mode, fragments, out);
    DL_RETURN_IF_ERROR(sim.Run());
  }
  out->runtime_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status::Ok();
}

nlohmann::json SimResultToJson(const SimResult& r) {
  nlohmann::json j = GoodputToJson(r.goodput);
  j["mode"] = ToString(r.mode);
  j["learners"] = r.learners;
  j["chips"] = r.chips;
  j["hours"] = r.hours;
  j["merges"] = r.merges;
  j["merges_per_hour"] = r.merges_per_hour();
  j["contributors_mean"] = r.contributors_mean;
  j["staleness"] = r.staleness;
  j["failures"] = r.failures;
  j["dropped_deltas"] = r.dropped_deltas;
  j["peak_wan_gbps"] = r.peak_wan_gbps;
  j["mean_wan_gbps"] = r.mean_wan_gbps;
  j["wan_window_s"] = r.wan_window_s;
  j["fragments"] = r.fragments;
  j["fragment_imbalance"] = r.fragment_imbalance;
  j["balanced_fragments"] = r.balanced_fragments;
  j["merge_gbps"] = r.merge_gbps;
  j["merge_gbps_source"] = r.merge_gbps_source;
  j["events"] = r.events;
  j["runtime_s"] = r.runtime_s;
  return j;
}

}  // namespace diloco
