// The learner's fragment ledger as tables: what each event does to a fragment's base, counters
// and in-flight delta, and which fold a Global asks for.
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "daemon/train/fragment_ledger.h"

namespace diloco {
namespace {

TEST_CASE("ledger: steps count on every fragment; a send records its base, seq, step and counts",
          "[unit][ledger]") {
  FragmentLedger ledger(3, FoldRule::kOverwrite, 4);
  CHECK(ledger.size() == 3);
  ledger.OnSnapshot(1, 5);
  for (int i = 0; i < 3; ++i) ledger.OnStep(512);
  for (int p = 0; p < 3; ++p) {
    INFO("fragment " << p);
    CHECK(ledger[p].c_steps == 3);
    CHECK(ledger[p].c_tokens == 3 * 512);
    CHECK_FALSE(ledger[p].in_flight);
  }
  CHECK_FALSE(ledger.AnyInFlight());

  ledger.OnSend(1, /*step=*/3, /*seq=*/17);
  ledger.OnStep(100);  // the work goes on while the delta is in flight
  const LedgerFragment& f = ledger[1];
  CHECK(f.in_flight);
  CHECK(f.sent_base == 5);
  CHECK(f.sent_seq == 17);
  CHECK(f.send_step == 3);
  CHECK(f.c_steps_at_send == 3);
  CHECK(f.c_tokens_at_send == 3 * 512);
  CHECK(f.c_steps == 4);
  CHECK(f.c_tokens == 3 * 512 + 100);
  CHECK(f.base_version == 5);  // a send does not move the base
  CHECK(ledger.AnyInFlight());
  CHECK_FALSE(ledger[0].in_flight);
  CHECK_FALSE(ledger[2].in_flight);

  // Blocks exactly when in flight for block_after steps or more.
  struct Row {
    int p;
    long step, block_after;
    bool blocks;
  };
  const std::vector<Row> rows = {
      {1, 3, 2, false}, {1, 4, 2, false}, {1, 5, 2, true}, {1, 9, 2, true},
      {1, 3, 0, true},  {1, 4, 1, true},  {0, 99, 0, false},  // fragment 0 has nothing in flight
  };
  for (const Row& r : rows) {
    INFO("fragment " << r.p << " step " << r.step << " block_after " << r.block_after);
    CHECK(ledger.Blocks(r.p, r.step, r.block_after) == r.blocks);
  }
}

TEST_CASE("ledger: OnGlobal by fold rule, included or not, in flight or not", "[unit][ledger]") {
  struct Row {
    FoldRule fold;
    bool included, in_flight;
    uint64_t version;
    bool ours_included, shift_at_send;
    uint64_t c_steps_after, c_tokens_after;
    bool in_flight_after;
  };
  // Base 10, max staleness 2: a delta of base 10 can be merged at versions 10..12, i.e. be in
  // Globals up to version 13; once Global 13 arrives without it, it never will be.
  // 5 steps of 100 tokens, then (in flight) a send, then 2 more: 7 steps, 700 tokens; 5/500 at send.
  const FoldRule kReplay = FoldRule::kReplay, kOver = FoldRule::kOverwrite, kMix = FoldRule::kMix;
  const std::vector<Row> rows = {
      // Replay: ours in Θ → what is left is the progress since the send.
      {kReplay, true, true, 11, true, false, 2, 200, false},
      // Replay without ours: θ keeps all its progress, θ at send shifts with the base.
      {kReplay, false, true, 11, false, true, 7, 700, true},
      {kReplay, false, true, 12, false, true, 7, 700, true},   // still mergeable at 12
      {kReplay, false, true, 13, false, true, 7, 700, false},  // 13 - 10 > 2: let go
      // Nothing in flight: "included" cannot be ours, nothing to shift.
      {kReplay, true, false, 11, false, false, 7, 700, false},
      {kReplay, false, false, 11, false, false, 7, 700, false},
      // Overwrite and mix start the count over whatever the Global holds.
      {kOver, true, true, 11, true, false, 0, 0, false},
      {kOver, false, true, 11, false, false, 0, 0, true},
      {kOver, false, true, 13, false, false, 0, 0, false},
      {kOver, true, false, 11, false, false, 0, 0, false},
      {kOver, false, false, 11, false, false, 0, 0, false},
      {kMix, true, true, 11, true, false, 0, 0, false},
      {kMix, false, true, 11, false, false, 0, 0, true},
      {kMix, false, true, 13, false, false, 0, 0, false},
      {kMix, true, false, 11, false, false, 0, 0, false},
      {kMix, false, false, 11, false, false, 0, 0, false},
  };
  for (const Row& r : rows) {
    INFO(ToString(r.fold) << (r.included ? ", included" : ", not included")
                          << (r.in_flight ? ", in flight" : ", nothing in flight") << ", version " << r.version);
    FragmentLedger ledger(2, r.fold, 2);
    ledger.OnSnapshot(0, 10);
    ledger.OnSnapshot(1, 10);
    for (int i = 0; i < 5; ++i) ledger.OnStep(100);
    if (r.in_flight) ledger.OnSend(0, 5, 9);
    for (int i = 0; i < 2; ++i) ledger.OnStep(100);

    const GlobalFold fold = ledger.OnGlobal(0, r.version, r.included);
    CHECK(fold.ours_included == r.ours_included);
    CHECK(fold.shift_at_send == r.shift_at_send);
    // Overwrite and mix replace the progress neither in Θ nor in flight: the 200 tokens since the
    // send, or all 700 with nothing sent; replay keeps it.
    CHECK(fold.replaced_tokens == (r.fold == kReplay ? 0u : r.in_flight ? 200u : 700u));
    CHECK(ledger[0].base_version == r.version);
    CHECK(ledger[0].c_steps == r.c_steps_after);
    CHECK(ledger[0].c_tokens == r.c_tokens_after);
    CHECK(ledger[0].in_flight == r.in_flight_after);
    if (r.in_flight) CHECK(ledger[0].sent_base == 10);  // what was sent stays on record
    // The other fragment is untouched.
    CHECK(ledger[1].base_version == 10);
    CHECK(ledger[1].c_steps == 7);
  }
}

TEST_CASE("ledger: replay: a Global without ours, then the one with ours", "[unit][ledger]") {
  FragmentLedger ledger(1, FoldRule::kReplay, 4);
  ledger.OnSnapshot(0, 10);
  for (int i = 0; i < 4; ++i) ledger.OnStep(10);
  ledger.OnSend(0, 4, 1);
  ledger.OnStep(10);
  CHECK(ledger.OnGlobal(0, 11, false).shift_at_send);
  ledger.OnStep(10);
  const GlobalFold fold = ledger.OnGlobal(0, 12, true);
  CHECK(fold.ours_included);
  CHECK_FALSE(fold.shift_at_send);
  // 6 steps in all, 4 of them in the delta: 2 remain.
  CHECK(ledger[0].c_steps == 2);
  CHECK(ledger[0].c_tokens == 20);
  CHECK_FALSE(ledger[0].in_flight);
  CHECK(ledger[0].base_version == 12);
}

TEST_CASE("ledger: a drop notice lets go only of the in-flight delta with that base", "[unit][ledger]") {
  FragmentLedger ledger(2, FoldRule::kOverwrite, 4);
  ledger.OnSnapshot(0, 10);
  ledger.OnSnapshot(1, 10);
  ledger.OnStep(1);
  ledger.OnSend(0, 1, 3);
  CHECK_FALSE(ledger.OnDrop(0, 9));  // an older delta of ours
  CHECK(ledger[0].in_flight);
  CHECK_FALSE(ledger.OnDrop(1, 10));  // nothing in flight there
  CHECK_FALSE(ledger[1].in_flight);
  CHECK(ledger.OnDrop(0, 10));
  CHECK_FALSE(ledger[0].in_flight);
  CHECK_FALSE(ledger.OnDrop(0, 10));  // told twice: already let go
  CHECK(ledger[0].c_steps == 1);      // the work is not lost: it goes into the next delta
  CHECK(ledger[0].base_version == 10);
}

TEST_CASE("ledger: a delta dropped as already merged leaves only the steps since its send", "[unit][ledger]") {
  FragmentLedger ledger(1, FoldRule::kOverwrite, 4);
  ledger.OnSnapshot(0, 4);
  ledger.OnStep(7);
  ledger.OnSend(0, 24, 5);
  ledger.OnStep(7);  // a step after the send
  CHECK(ledger.OnDrop(0, 4, /*merged=*/true));
  CHECK_FALSE(ledger[0].in_flight);
  CHECK(ledger[0].c_steps == 1);
  CHECK(ledger[0].c_tokens == 7);
}

struct Pending {
  uint32_t fragment;
  uint64_t base;
};

LearnerAck AckOf(uint64_t heard_seq, const std::vector<Pending>& pending) {
  LearnerAck a;
  a.learner = "learner-0";
  a.incarnation = 1;
  a.heard_seq = heard_seq;
  for (const Pending& p : pending) {
    a.pending_fragments.push_back(p.fragment);
    a.pending_bases.push_back(p.base);
  }
  return a;
}

TEST_CASE("ledger: OnStatus finds missed Globals and lost deltas", "[unit][ledger]") {
  struct Row {
    std::string name;
    bool in_flight;  // fragment 0's delta of base 10, seq 8
    std::vector<uint64_t> versions;
    bool has_ack;
    uint64_t heard_seq;
    std::vector<Pending> pending;
    std::vector<int> missed, lost;
    bool in_flight_after;
  };
  // Fragment 0 at base 10, fragment 1 at base 20.
  const std::vector<Row> rows = {
      {"all in step, nothing in flight", false, {10, 20}, true, 8, {}, {}, {}, false},
      {"the syncer is ahead", false, {11, 20}, true, 8, {}, {0}, {}, false},
      {"the syncer went back", false, {9, 20}, true, 8, {}, {0}, {}, false},
      {"both missed", false, {11, 21}, true, 8, {}, {0, 1}, {}, false},
      {"heard, not pending: lost", true, {10, 20}, true, 8, {}, {}, {0}, false},
      {"heard later seqs, not pending: lost", true, {10, 20}, true, 9, {}, {}, {0}, false},
      {"pending with its base", true, {10, 20}, true, 8, {{0, 10}}, {}, {}, true},
      {"pending with another base: lost", true, {10, 20}, true, 8, {{0, 9}}, {}, {0}, false},
      {"another fragment pending with the same base: lost", true, {10, 20}, true, 8, {{1, 10}}, {}, {0}, false},
      {"not heard yet: still on its way", true, {10, 20}, true, 7, {}, {}, {}, true},
      {"no ack for this incarnation", true, {10, 20}, false, 0, {}, {}, {}, true},
      {"missed is never also lost", true, {11, 20}, true, 8, {}, {0}, {}, true},
      {"versions of another layout", true, {11}, true, 8, {}, {}, {}, true},
      {"versions of another layout, longer", true, {11, 21, 30}, true, 8, {}, {}, {}, true},
  };
  for (const Row& r : rows) {
    INFO(r.name);
    FragmentLedger ledger(2, FoldRule::kOverwrite, 4);
    ledger.OnSnapshot(0, 10);
    ledger.OnSnapshot(1, 20);
    ledger.OnStep(1);
    if (r.in_flight) ledger.OnSend(0, 1, 8);
    const LearnerAck ack = AckOf(r.heard_seq, r.pending);
    const StatusVerdict v = ledger.OnStatus(r.versions, r.has_ack ? &ack : nullptr, {0, 1});
    CHECK(v.missed == r.missed);
    CHECK(v.lost == r.lost);
    CHECK(ledger[0].in_flight == r.in_flight_after);
    // A status changes no base: a missed fragment waits for its snapshot.
    CHECK(ledger[0].base_version == 10);
    CHECK(ledger[1].base_version == 20);
  }
}

TEST_CASE("FragmentLedger: a syncer shard's status speaks only for the fragments it merges") {
  FragmentLedger ledger(2, FoldRule::kOverwrite, 4);
  ledger.OnSnapshot(0, 10);
  ledger.OnSnapshot(1, 20);
  ledger.OnStep(1);
  ledger.OnSend(0, 1, 8);
  // The shard of fragment 1 knows nothing of fragment 0 (version 0, no pending delta of it).
  const LearnerAck ack = AckOf(9, {});
  StatusVerdict v = ledger.OnStatus({0, 20}, &ack, {1});
  CHECK(v.missed.empty());
  CHECK(v.lost.empty());
  CHECK(ledger[0].in_flight);
  // Fragment 0's own shard heard past the delta and does not hold it: lost.
  v = ledger.OnStatus({10, 0}, &ack, {0});
  CHECK(v.missed.empty());
  CHECK(v.lost == std::vector<int>{0});
}

TEST_CASE("ledger: a CRC mismatch marks the base bad, a snapshot resets all but the version",
          "[unit][ledger]") {
  FragmentLedger ledger(2, FoldRule::kReplay, 4);
  ledger.OnSnapshot(0, 10);
  for (int i = 0; i < 3; ++i) ledger.OnStep(64);
  ledger.OnSend(0, 3, 5);

  ledger.OnCrcMismatch(0, 11);
  CHECK(ledger[0].bad);
  CHECK(ledger[0].base_version == 11);
  CHECK(ledger[0].in_flight);  // the snapshot settles it
  CHECK(ledger[0].sent_base == 10);
  CHECK(ledger[0].c_steps == 3);
  CHECK_FALSE(ledger[1].bad);

  ledger.OnSnapshot(0, 12);
  const LedgerFragment& f = ledger[0];
  CHECK(f.base_version == 12);
  CHECK_FALSE(f.bad);
  CHECK_FALSE(f.in_flight);
  CHECK(f.c_steps == 0);
  CHECK(f.c_tokens == 0);
  CHECK(f.sent_base == 0);
  CHECK(f.sent_seq == 0);
  CHECK(f.send_step == 0);
  CHECK(f.c_steps_at_send == 0);
  CHECK(f.c_tokens_at_send == 0);
  CHECK_FALSE(ledger.AnyInFlight());
  CHECK(ledger[1].c_steps == 3);  // another fragment's snapshot: this one counts on
}

// Regression (a syncer restart): a lock-step learner resyncing with nothing in flight trained on
// past its skipped firings and ran rounds ahead of the fleet (test_virtual_run.cpp).
TEST_CASE("ledger: a firing skipped during a resync blocks as a delta in flight would, until the resync ends",
          "[unit][ledger]") {
  FragmentLedger ledger(2, FoldRule::kOverwrite, 4);
  ledger.OnSkipped(0, /*step=*/8);
  ledger.OnSkipped(0, /*step=*/16);  // the first skipped firing counts
  CHECK(ledger[0].skipped_step == 8);
  CHECK_FALSE(ledger.AnyInFlight());
  CHECK_FALSE(ledger.Blocks(0, 9, /*block_after=*/2));
  CHECK(ledger.Blocks(0, 10, 2));
  CHECK(ledger.Blocks(0, 9, 0));                                      // diloco: at once
  CHECK_FALSE(ledger.Blocks(0, 1000, std::numeric_limits<long>::max()));  // decoupled: never
  CHECK_FALSE(ledger.Blocks(1, 10, 2));
  ledger.OnSend(1, 12, 3);
  ledger.OnSkipped(1, 12);  // in flight: the firing had nothing to skip
  CHECK(ledger[1].skipped_step == -1);
  ledger.OnResynced();
  CHECK_FALSE(ledger.Blocks(0, 10, 2));
  ledger.OnSkipped(0, 20);
  ledger.OnSnapshot(0, 3);  // a fragment installed: nothing skipped any more
  CHECK_FALSE(ledger.Blocks(0, 30, 2));
}

}  // namespace
}  // namespace diloco
