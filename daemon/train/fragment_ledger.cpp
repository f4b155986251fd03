#include "daemon/train/fragment_ledger.h"

#include <algorithm>

namespace diloco {

FragmentLedger::FragmentLedger(int fragments, FoldRule fold, int max_staleness)
    : fragments_(fragments), fold_(fold), max_staleness_(max_staleness) {}

bool FragmentLedger::AnyInFlight() const {
  return std::any_of(fragments_.begin(), fragments_.end(), [](const LedgerFragment& f) { return f.in_flight; });
}

bool FragmentLedger::Blocks(int p, long step, long block_after) const {
  const LedgerFragment& f = fragments_[p];
  if (f.skipped_step >= 0 && step - f.skipped_step >= block_after) return true;
  return f.in_flight && step - f.send_step >= block_after;
}

void FragmentLedger::OnStep(uint64_t tokens) {
  for (LedgerFragment& f : fragments_) {
    f.c_steps++;
    f.c_tokens += tokens;
  }
}

void FragmentLedger::OnSend(int p, long step, uint64_t seq) {
  LedgerFragment& f = fragments_[p];
  f.in_flight = true;
  f.sent_base = f.base_version;
  f.sent_seq = seq;
  f.send_step = step;
  f.c_steps_at_send = f.c_steps;
  f.c_tokens_at_send = f.c_tokens;
}

GlobalFold FragmentLedger::OnGlobal(int p, uint64_t version, bool included_self) {
  LedgerFragment& f = fragments_[p];
  f.base_version = version;
  GlobalFold fold;
  fold.ours_included = included_self && f.in_flight;
  if (fold_ != FoldRule::kReplay) {
    fold.replaced_tokens = f.c_tokens - (f.in_flight ? std::min(f.c_tokens, f.c_tokens_at_send) : 0);
    f.c_steps = 0;
    f.c_tokens = 0;
  } else if (!fold.ours_included) {
    // Replay of a Global without our delta: θ keeps all its local progress (and moved with the
    // base), so the counters stay, and θ at send moves by the same step to stay in the frame
    // the later fold of our delta subtracts it in.
    fold.shift_at_send = f.in_flight;
  } else {
    // Our delta is in Θ: what is left locally is the progress since the send.
    f.c_steps -= std::min(f.c_steps, f.c_steps_at_send);
    f.c_tokens -= std::min(f.c_tokens, f.c_tokens_at_send);
  }
  // Included, or the fragment moved past where the syncer could still take it: its next merge
  // (at this version) accepts bases no older than version - max_staleness.
  if (f.in_flight && (included_self || version > f.sent_base + (uint64_t)max_staleness_)) f.in_flight = false;
  return fold;
}

bool FragmentLedger::OnDrop(int p, uint64_t base_version, bool merged) {
  LedgerFragment& f = fragments_[p];
  if (!f.in_flight || f.sent_base != base_version) return false;
  f.in_flight = false;
  if (merged) {
    f.c_steps -= std::min(f.c_steps, f.c_steps_at_send);
    f.c_tokens -= std::min(f.c_tokens, f.c_tokens_at_send);
  }
  return true;
}

StatusVerdict FragmentLedger::OnStatus(const std::vector<uint64_t>& versions, const LearnerAck* ack,
                                       const std::vector<uint32_t>& fragments) {
  StatusVerdict v;
  if (versions.size() != fragments_.size()) return v;  // not this layout: the handshake refuses it
  for (const uint32_t q : fragments) {
    const int p = (int)q;
    if (p >= size()) continue;
    LedgerFragment& f = fragments_[p];
    // The downlink is ordered: every Global up to versions[p] went out before this status.
    if (versions[p] != f.base_version) {
      v.missed.push_back(p);
      continue;
    }
    if (!f.in_flight || ack == nullptr || ack->heard_seq < f.sent_seq) continue;
    bool pending = false;
    for (size_t i = 0; i < ack->pending_fragments.size() && i < ack->pending_bases.size(); i++)
      pending |= ack->pending_fragments[i] == (uint32_t)p && ack->pending_bases[i] == f.sent_base;
    if (pending) continue;
    f.in_flight = false;
    v.lost.push_back(p);
  }
  return v;
}

void FragmentLedger::OnSkipped(int p, long step) {
  LedgerFragment& f = fragments_[p];
  if (!f.in_flight && f.skipped_step < 0) f.skipped_step = step;
}

void FragmentLedger::OnResynced() {
  for (LedgerFragment& f : fragments_) f.skipped_step = -1;
}

void FragmentLedger::OnSnapshot(int p, uint64_t version) {
  LedgerFragment& f = fragments_[p];
  f = LedgerFragment();
  f.base_version = version;
}

}  // namespace diloco
