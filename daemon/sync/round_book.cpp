#include "daemon/sync/round_book.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "daemon/sync/fragments.h"
#include "daemon/sync/protocol.h"

namespace diloco {

namespace {
// learner_step comes from the network: bounded before it becomes a long (CheckCounts also bounds it).
constexpr uint64_t kMaxCadenceStep = uint64_t{1} << 53;
}  // namespace

RoundBookOptions RoundBookOptionsFor(const SyncConfig& sc, int fragments) {
  RoundBookOptions bo;
  bo.learners = sc.learners;
  bo.fragments = fragments;
  bo.inner_steps = sc.inner_steps;
  bo.max_staleness = sc.max_staleness;
  bo.heartbeat_timeout_ms = sc.heartbeat_timeout_ms;
  bo.norm_limit = sc.norm_limit;
  bo.lock_step = sc.mode == SyncMode::kDiloco || sc.mode == SyncMode::kStreaming;
  return bo;
}

RoundBook::RoundBook(const RoundBookOptions& options, SyncTime start)
    : options_(options),
      learners_(options.learners),
      pending_(options.fragments),
      merged_step_(options.fragments),
      counted_through_(options.learners, std::vector<uint64_t>(options.fragments, 0)) {
  for (LearnerBook& l : learners_) l.last_heard = start;
  NormFilterOptions nf;
  nf.max_ratio = options.norm_limit;
  filters_.assign(options.fragments, NormFilter(nf));
}

bool RoundBook::OnHeard(int learner, uint64_t incarnation, SyncTime now) {
  LearnerBook& l = learners_[learner];
  const bool restarted = !l.heard || l.incarnation != incarnation;
  if (restarted) {
    // A new incarnation: waited for again until it says otherwise; its stream starts over.
    const bool rejoin = l.heard;
    l = LearnerBook();
    if (rejoin) l.rejoined_at = now;
    l.last_heard = now;
    l.heard = true;
    l.incarnation = incarnation;
  }
  l.last_heard = now;
  return restarted;
}

void RoundBook::OnStreamSeq(int learner, uint64_t seq) {
  LearnerBook& l = learners_[learner];
  l.heard_seq = std::max(l.heard_seq, seq);
}

void RoundBook::OnHeartbeat(int learner, const HeartbeatMsg& hb, SyncTime now) {
  LearnerBook& l = learners_[learner];
  // The liveness thread's beats can overtake the training thread's: keep the newest step. Once
  // it said it stops or finished, only a delta (OnDeltaSeen) makes it a worker again, not a
  // liveness beat of the same step that was on its way. Until it trains (joining, or resyncing
  // to join) its step is its checkpoint's: a rejoin into a lock-step fleet starts it at the
  // fleet's step, which may be lower.
  const bool finishing = hb.state == LearnerState::kFinished || hb.state == LearnerState::kStopping ||
                         hb.state == LearnerState::kFailed;
  const bool before_training = l.beat.state == LearnerState::kJoining || l.beat.state == LearnerState::kResyncing;
  if (l.beat.have && ((hb.step < l.beat.step && !before_training) ||
                      (l.finished && !finishing && hb.step == l.beat.step)))
    return;
  Beat& b = l.beat;
  b.have = true;
  b.at = now;
  b.step = hb.step;
  b.step_ms = hb.step_time_ms;
  b.state = hb.state;
  b.fragments.assign(options_.fragments, FragmentCounters());
  b.listed.assign(options_.fragments, false);
  b.in_flight.assign(options_.fragments, false);
  for (const FragmentCounters& fc : hb.fragments) {
    if (fc.fragment >= (uint32_t)options_.fragments) continue;
    b.fragments[fc.fragment] = fc;
    b.listed[fc.fragment] = true;
    b.in_flight[fc.fragment] = fc.in_flight;
  }
  l.finished = finishing;
  l.done = hb.state == LearnerState::kFinished;
}

void RoundBook::OnDeltaSeen(int learner, uint32_t fragment) {
  LearnerBook& l = learners_[learner];
  // A delta means the learner is at work again (a kStopping learner flushes its last deltas).
  l.finished = false;
  l.done = false;
  if (fragment < l.beat.in_flight.size()) l.beat.in_flight[fragment] = true;
}

void RoundBook::Drop(int learner, uint32_t fragment, uint64_t base, double tokens, std::string why,
                     std::string detail, bool rejected, bool tell) {
  drops_.push_back({learner, fragment, base, std::move(why), std::move(detail), tokens, rejected, tell});
}

void RoundBook::Reject(int learner, uint32_t fragment, uint64_t base_version, const std::string& why,
                       const std::string& detail) {
  Drop(learner, fragment, base_version, 0, why, detail, /*rejected=*/true, /*tell=*/true);
}

std::string RoundBook::CheckCountsOf(const DeltaArrival& d) const {
  const CountsVerdict cv = CheckCounts(d.c_steps, d.c_tokens, d.learner_step, options_.count_limits);
  const std::string numbers = "c_steps " + std::to_string(d.c_steps) + ", c_tokens " + std::to_string(d.c_tokens) +
                              ", learner step " + std::to_string(d.learner_step);
  if (cv != CountsVerdict::kPlausible) return std::string(ToString(cv)) + ": " + numbers;
  // Its last heartbeat showed c_steps for this base at some step; one step adds one. A beat
  // from after the delta (the liveness stream is not ordered with the deltas) gives a tighter
  // bound, never a wrong one, as long as the base is the same.
  const Beat& b = learners_[d.learner].beat;
  if (!b.have || d.fragment >= b.fragments.size()) return "";
  if (!b.listed[d.fragment]) return "";
  const FragmentCounters& fc = b.fragments[d.fragment];
  if (fc.base_version != d.base_version) return "";
  // In 128 bits: counts come from the network and may be anything.
  const __int128 allowed = (__int128)fc.c_steps + ((__int128)d.learner_step - (__int128)b.step) + 1;  // +1: rounding
  if ((__int128)d.c_steps > allowed)
    return "more steps than its heartbeats show: " + numbers + "; heartbeat at step " + std::to_string(b.step) +
           " had c_steps " + std::to_string(fc.c_steps) + " for base " + std::to_string(fc.base_version);
  return "";
}

// Lock-step: a cadence delta (sent at a firing step) of a round already merged, sent before the
// learner's last step (at its last step, the next round takes it: the learner trains no more, and
// its flush would only send it again; seed 387).
bool RoundBook::IsLate(const DeltaArrival& d) const {
  const uint64_t last_step = options_.count_limits.max_steps;
  if (!options_.lock_step || last_step == 0 || merged_step_[d.fragment] == 0) return false;
  if (d.learner_step > merged_step_[d.fragment] || d.learner_step >= last_step) return false;
  return Fires((int)d.fragment, (long)d.learner_step, options_.inner_steps, options_.fragments);
}

bool RoundBook::Admit(DeltaArrival&& d, uint64_t current_version, SyncTime now) {
  const uint32_t p = d.fragment;
  if (std::string why = CheckCountsOf(d); !why.empty()) {
    Drop(d.learner, p, d.base_version, 0, "implausible_counts", why, true, true);  // its counts mean nothing
    return false;
  }
  if (const uint64_t counted = counted_through_[d.learner][p]; counted > 0 && d.learner_step <= counted) {
    Drop(d.learner, p, d.base_version, (double)d.c_tokens, std::string(kAlreadyMerged),
         "sent at step " + std::to_string(d.learner_step) + ", its delta of step " + std::to_string(counted) +
             " is merged",
         false, true);
    return false;
  }
  if (IsLate(d)) {
    Drop(d.learner, p, d.base_version, (double)d.c_tokens, "late",
         "sent at step " + std::to_string(d.learner_step) + ", its round merged at step " +
             std::to_string(merged_step_[p]),
         false, true);
    return false;
  }
  const StalenessCheck sc = CheckStaleness(current_version, d.base_version, options_.max_staleness);
  if (!sc.accepted()) {
    Drop(d.learner, p, d.base_version, (double)d.c_tokens, ToString(sc.verdict),
         "base " + std::to_string(d.base_version) + ", current " + std::to_string(current_version), false, true);
    return false;
  }
  FilterResult fr;
  if (!d.held.range_norms.empty()) {
    // Decoded values are finite (the codecs check); the ranges' norms make the delta's.
    double sq = 0;
    for (double r : d.held.range_norms) sq += r * r;
    fr = filters_[p].CheckNorm(std::sqrt(sq), (double)d.c_steps);
  } else {
    const std::span<const float> v = d.values.empty() ? std::span<const float>(d.held.values) : d.values;
    fr = filters_[p].Check(v.data(), v.size(), (double)d.c_steps);
  }
  if (!fr.accepted()) {
    Drop(d.learner, p, d.base_version, (double)d.c_tokens,
         fr.verdict == FilterVerdict::kNonFinite ? "non_finite" : "norm_too_large", fr.reason, true, true);
    return false;
  }
  PendingDelta pd;
  pd.learner = d.learner;
  pd.base_version = d.base_version;
  pd.counts = {(double)d.c_tokens, (double)d.c_steps};
  pd.held = std::move(d.held);
  pd.at = now;
  pd.learner_step = std::min<uint64_t>(d.learner_step, kMaxCadenceStep);
  for (PendingDelta& old : pending_[p]) {
    if (old.learner != pd.learner) continue;
    // Not told: the learner waits for its newer delta, which is pending.
    Drop(old.learner, p, old.base_version, old.counts.tokens, "replaced",
         "base " + std::to_string(old.base_version) + " replaced by base " + std::to_string(pd.base_version), false,
         false);
    old = std::move(pd);
    return true;
  }
  pending_[p].push_back(std::move(pd));
  return true;
}

std::optional<SyncTime> RoundBook::ExpectedDeltaAt(int learner, uint32_t p) const {
  // The steps until p fires, or until its last step when that comes first (it sends every
  // fragment's work then), plus one step of slack for jitter and the heartbeat's age. Forecast
  // at the next firing, the deltas of a learner's last step were not waited for under a cap of a
  // few steps, and the job's last merges went out one learner at a time (the last, alone, with a
  // whole outer step: configs/shakespeare-m4.yaml with quorum 1 and cap_steps 4 ended at val
  // 2.1586 against 2.1126 with every learner in every merge, seed 1, virtual clock).
  const Beat& b = learners_[learner].beat;
  if (!b.have || b.step_ms <= 0 || p >= b.in_flight.size() || b.in_flight[p]) return std::nullopt;
  long steps = StepsUntilFires((int)p, (long)b.step, options_.inner_steps, options_.fragments);
  const uint64_t last_step = options_.count_limits.max_steps;
  if (last_step > b.step) steps = std::min<long>(steps, (long)std::min<uint64_t>(last_step - b.step, kMaxCadenceStep));
  steps += 1;
  return b.at + std::chrono::duration_cast<SyncClock::duration>(
                    std::chrono::duration<double, std::milli>(steps * b.step_ms));
}

// Lock-step: a learner whose heartbeat is past the round's step with no delta of the fragment in
// flight will not send one for this round (it was lost and then thrown away by a resync, or
// dropped as late): the round does not wait for it (dilococtl dst --seed 955: a learner cut off
// and resynced was waited for at step 14 while it waited at step 17 for a later round).
bool RoundBook::PassedRound(const LearnerBook& lb, uint32_t p) const {
  if (!options_.lock_step || pending_[p].empty() || !lb.beat.have || p >= lb.beat.in_flight.size()) return false;
  if (lb.beat.state != LearnerState::kTraining || lb.beat.in_flight[p]) return false;
  // The round's step: the earliest of its deltas' cadence steps (the last firing at or before
  // each one's step). The earliest, not the latest: a delta from a learner ahead of the fleet (a
  // rejoiner) must not make the round wait for learners blocked on an older round that waits for
  // them in turn (dilococtl dst --seed 28948). Deltas sent at a learner's last step (its flush) do
  // not count: a learner still training its last steps has nothing in flight for that round and
  // must not be passed over (streaming lost its end merges to that).
  const uint64_t last_step = options_.count_limits.max_steps;
  uint64_t round_step = std::numeric_limits<uint64_t>::max();
  for (const PendingDelta& pd : pending_[p])
    if (last_step == 0 || pd.learner_step < last_step)
      round_step = std::min<uint64_t>(
          round_step, (uint64_t)LastFiring((int)p, (long)pd.learner_step, options_.inner_steps, options_.fragments));
  return round_step != std::numeric_limits<uint64_t>::max() && round_step > 0 && lb.beat.step > round_step;
}

// Lock-step: a learner flushing at its end (kStopping) whose last heartbeat shows work for the
// fragment (in flight, or steps not sent yet): its delta is coming, so the round still waits for
// it and merges every learner's remaining work at once (one merge per learner, 12 lone end merges
// with outer momentum, cost streaming 8% of its loss). Without work it is not waited for; nor in
// decoupled mode, whose quorum and grace do not need it (dilococtl dst --seeds 139, 475: rounds at
// the end waited for learners with nothing to send, or whose last word was lost).
bool RoundBook::FlushingWorkFor(const LearnerBook& lb, uint32_t p) const {
  const Beat& b = lb.beat;
  if (!options_.lock_step || b.state != LearnerState::kStopping || p >= b.listed.size() || !b.listed[p]) return false;
  return b.in_flight[p] || b.fragments[p].c_steps > 0;
}

RoundState RoundBook::Round(uint32_t p, SyncTime now, const RoundTimings& timings) const {
  RoundState rs;
  rs.timings = timings;
  std::optional<SyncTime> opened;  // the round's first arrival
  for (const PendingDelta& pd : pending_[p])
    if (!opened || pd.at < *opened) opened = pd.at;
  for (int l = 0; l < options_.learners; l++) {
    const LearnerBook& lb = learners_[l];
    LearnerPresence lp;
    lp.learner = l;
    lp.last_heard = lb.last_heard;
    for (const PendingDelta& pd : pending_[p])
      if (pd.learner == l) lp.contributed_at = pd.at;
    // Finished, failed, or stopping with nothing more for this fragment: not waited for any more.
    if (lb.finished && !lp.contributed_at && !FlushingWorkFor(lb, p)) continue;
    // Restarted after this round opened: it rejoins out of step with the round (its cadence
    // starts from its own step), so the round does not wait for it; its delta goes to the next.
    if (!lp.contributed_at && lb.rejoined_at && opened && *lb.rejoined_at > *opened) continue;
    if (!lp.contributed_at && PassedRound(lb, p)) continue;
    if (lb.finished && lp.contributed_at) lp.last_heard = now;  // its last delta is in: counts as live
    if (!lp.contributed_at) lp.expected_at = ExpectedDeltaAt(l, p);
    if (lb.beat.have) lp.step_ms = lb.beat.step_ms;
    rs.learners.push_back(lp);
  }
  return rs;
}

std::vector<PendingDelta> RoundBook::TakeForMerge(uint32_t p, uint64_t current_version) {
  std::vector<PendingDelta> ok;
  for (PendingDelta& pd : pending_[p]) {
    const StalenessCheck c = CheckStaleness(current_version, pd.base_version, options_.max_staleness);
    if (c.accepted()) {
      RecallMerged(pd.learner, p, pd.learner_step);
      ok.push_back(std::move(pd));
    } else {
      Drop(pd.learner, p, pd.base_version, pd.counts.tokens, ToString(c.verdict),
           "base " + std::to_string(pd.base_version) + ", current " + std::to_string(current_version), false, true);
    }
  }
  pending_[p].clear();
  std::sort(ok.begin(), ok.end(), [](const PendingDelta& a, const PendingDelta& b) { return a.learner < b.learner; });
  return ok;
}

void RoundBook::RecallMerged(int learner, uint32_t p, uint64_t learner_step) {
  if (learner < 0 || learner >= options_.learners || p >= (uint32_t)options_.fragments) return;
  learner_step = std::min(learner_step, kMaxCadenceStep);
  const uint64_t fired = (uint64_t)LastFiring((int)p, (long)learner_step, options_.inner_steps, options_.fragments);
  merged_step_[p] = std::max(merged_step_[p], fired);
  uint64_t& counted = counted_through_[learner][p];
  counted = std::max(counted, learner_step);
}

uint64_t RoundBook::CadenceStep() const {
  if (std::all_of(merged_step_.begin(), merged_step_.end(), [](uint64_t s) { return s == 0; })) return 0;
  uint64_t earliest_open = std::numeric_limits<uint64_t>::max();
  for (int p = 0; p < options_.fragments; p++) {
    if (!options_.owned.empty() && !std::binary_search(options_.owned.begin(), options_.owned.end(), (uint32_t)p))
      continue;
    const long merged = (long)merged_step_[p];
    const long next = merged + StepsUntilFires(p, merged, options_.inner_steps, options_.fragments);
    earliest_open = std::min(earliest_open, (uint64_t)next);
  }
  return earliest_open - 1;
}

uint64_t RoundBook::FleetStep(SyncTime now) const {
  std::vector<uint64_t> steps;
  for (int l = 0; l < options_.learners; l++) {
    const Beat& b = learners_[l].beat;
    if (!Live(l, now) || !b.have || b.state != LearnerState::kTraining || b.step_ms <= 0) continue;
    const double since = std::chrono::duration<double, std::milli>(now - b.at).count() / b.step_ms;
    steps.push_back(b.step + (uint64_t)std::clamp(since, 0.0, (double)options_.inner_steps));
  }
  return steps.empty() ? 0 : std::min(LowerMedian(std::move(steps)), kMaxCadenceStep);
}

std::vector<DeltaDrop> RoundBook::TakeDrops() {
  std::vector<DeltaDrop> out;
  out.swap(drops_);
  return out;
}

std::vector<LearnerAck> RoundBook::Acks() const {
  std::vector<LearnerAck> acks;
  for (int l = 0; l < options_.learners; l++) {
    const LearnerBook& lb = learners_[l];
    if (!lb.heard) continue;
    LearnerAck a;
    a.learner = LearnerName(l);
    a.incarnation = lb.incarnation;
    a.heard_seq = lb.heard_seq;
    for (int p = 0; p < options_.fragments; p++)
      for (const PendingDelta& pd : pending_[p])
        if (pd.learner == l) {
          a.pending_fragments.push_back((uint32_t)p);
          a.pending_bases.push_back(pd.base_version);
        }
    acks.push_back(std::move(a));
  }
  return acks;
}

bool RoundBook::Live(int learner, SyncTime now) const {
  const LearnerBook& l = learners_[learner];
  return l.heard && !l.finished && now - l.last_heard <= std::chrono::milliseconds(options_.heartbeat_timeout_ms);
}

bool RoundBook::AllDone() const {
  return std::all_of(learners_.begin(), learners_.end(), [](const LearnerBook& l) { return l.done; });
}

}  // namespace diloco
