// The syncer's merge (merger.h) over held deltas: the same bits whatever the thread count and
// the arrival order, and the bits of merging the decoded deltas.
#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "daemon/net/codec.h"
#include "daemon/sync/held_delta.h"
#include "daemon/sync/merge.h"
#include "daemon/sync/merger.h"
#include "daemon/sync/protocol.h"
#include "daemon/util/crc32c.h"
#include "daemon/util/task_pool.h"
#include "kernels/rng.h"

namespace diloco {
namespace {

// Ranges across chunk boundaries (kMergeChunk), odd sizes, an embedding (mean) and RDA ones.
Fragment TestFragment() {
  Fragment f;
  const std::pair<const char*, size_t> tensors[] = {
      {"wte", 70001}, {"h.0.w", 2 * kMergeChunk + 333}, {"h.0.b", 7}, {"h.1.w", kMergeChunk}, {"h.1.b", 65}};
  for (const auto& [name, numel] : tensors) {
    FragmentRange r;
    r.tensor = name;
    r.offset = f.numel;
    r.numel = numel;
    r.packed_offset = f.numel;
    r.embedding = IsEmbeddingTensor(name);
    f.ranges.push_back(r);
    f.numel += numel;
  }
  return f;
}

struct Round {
  std::vector<PendingDelta> pending;
  std::vector<std::vector<float>> decoded;  // what each held delta decodes to
};

Round MakeRound(const Fragment& f, CodecKind codec, int learners, uint64_t seed, int block = 64) {
  Rng rng(seed);
  Round round;
  const CodecOptions opt{codec, block, 0};
  const std::vector<uint64_t> numels = FragmentNumels(f);
  for (int m = 0; m < learners; m++) {
    std::vector<float> delta(f.numel);
    for (float& x : delta) x = (float)(0.01 * (m + 1) * rng.normal());
    std::vector<uint8_t> payload;
    std::vector<uint64_t> tensor_bytes;
    REQUIRE(EncodeTensors(opt, delta, numels, &payload, &tensor_bytes).ok());
    std::vector<float> values(f.numel);
    REQUIRE(DecodeTensors(opt, payload, numels, tensor_bytes, values).ok());
    const std::span<const uint8_t> whole(payload);
    PendingDelta pd;
    pd.learner = m;
    pd.counts = {1000.0 * (m + 1), 10.0 + m};
    REQUIRE(HoldPayload(f, opt, std::span(&whole, 1), tensor_bytes, &pd.held).ok());
    round.pending.push_back(std::move(pd));
    round.decoded.push_back(std::move(values));
  }
  return round;
}

FragmentGlobal Start(const Fragment& f) {
  Rng rng(5);
  FragmentGlobal fg;
  fg.theta.resize(f.numel);
  for (float& x : fg.theta) x = (float)rng.normal();
  fg.momentum.assign(f.numel, 0.0f);
  return fg;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Two merges in a row (the second one carries the downlink's error feedback).
struct Result {
  FragmentGlobal fg;
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<uint32_t> crcs;
};

Result MergeTwice(const Fragment& f, SyncConfig sc, int threads, const std::vector<Round>& rounds,
                  const std::vector<int>& order) {
  sc.merge_threads = threads;
  FragmentMerger merger(sc);
  REQUIRE(merger.threads() == threads);
  Result r;
  r.fg = Start(f);
  for (const Round& round : rounds) {
    std::vector<PendingDelta> pending;
    for (int i : order) pending.push_back(round.pending[i]);
    MergeOutcome mo;
    REQUIRE(merger.Merge(f, 3, pending, &r.fg, &mo).ok());
    r.payloads.push_back(mo.payload);
    r.crcs.push_back(mo.theta_crc32c);
    REQUIRE(mo.theta_crc32c == Crc32c(r.fg.theta.data(), r.fg.theta.size() * sizeof(float)));
  }
  return r;
}

TEST_CASE("merger: the same held deltas merge to the same bits with 1 2 and 3 threads", "[unit][sync]") {
  const Fragment f = TestFragment();
  for (CodecKind up : {CodecKind::kInt4, CodecKind::kInt8, CodecKind::kBf16, CodecKind::kFp32}) {
    for (MergeRule rule : {MergeRule::kRda, MergeRule::kMean}) {
      INFO("codec " << CodecName(up) << " rule " << (int)rule);
      SyncConfig sc;
      sc.merge = rule;
      const std::vector<Round> rounds = {MakeRound(f, up, 5, 11), MakeRound(f, up, 3, 12)};
      const std::vector<int> order = {0, 1, 2};
      const Result one = MergeTwice(f, sc, 1, {rounds[0], rounds[1]}, {0, 1, 2});
      for (int threads : {2, 3}) {
        const Result many = MergeTwice(f, sc, threads, rounds, order);
        CHECK(SameBits(many.fg.theta, one.fg.theta));
        CHECK(SameBits(many.fg.momentum, one.fg.momentum));
        CHECK(many.payloads == one.payloads);
        CHECK(many.crcs == one.crcs);
      }
    }
  }
}

TEST_CASE("merger: the arrival order of held deltas does not change the bits", "[unit][sync]") {
  const Fragment f = TestFragment();
  SyncConfig sc;
  const std::vector<Round> rounds = {MakeRound(f, CodecKind::kInt4, 4, 21)};
  const Result first = MergeTwice(f, sc, 2, rounds, {0, 1, 2, 3});
  std::vector<int> order = {0, 1, 2, 3};
  while (std::next_permutation(order.begin(), order.end())) {
    const Result other = MergeTwice(f, sc, 2, rounds, order);
    CHECK(SameBits(other.fg.theta, first.fg.theta));
    CHECK(SameBits(other.fg.momentum, first.fg.momentum));
    CHECK(other.payloads == first.payloads);
  }
}

TEST_CASE("merger: held deltas merge to the bits of their decoded values", "[unit][sync]") {
  const Fragment f = TestFragment();
  // 6 learners: the merge sums 4 at a time, then 2. Block 96 does not divide a merge tile.
  for (auto [up, block] : {std::pair{CodecKind::kInt4, 64}, {CodecKind::kInt4, 96}, {CodecKind::kInt8, 96},
                           {CodecKind::kBf16, 64}}) {
    INFO("codec " << CodecName(up) << " block " << block);
    const Round round = MakeRound(f, up, 6, 31, block);
    std::vector<HeldDeltaReader> readers;
    for (const PendingDelta& pd : round.pending) readers.emplace_back(f, pd.held);
    std::vector<Contribution> held, decoded;
    for (size_t m = 0; m < round.pending.size(); m++) {
      held.push_back({(int)m, round.pending[m].counts, nullptr, &readers[m]});
      decoded.push_back({(int)m, round.pending[m].counts, round.decoded[m].data(), nullptr});
      std::vector<float> back;
      REQUIRE(DecodeHeld(f, round.pending[m].held, &back).ok());
      CHECK(SameBits(back, round.decoded[m]));
      CHECK(round.pending[m].held.bytes() < f.numel * sizeof(float) / 1.9);  // held encoded
    }
    std::vector<float> a(f.numel), b(f.numel);
    TaskPool pool(2);
    REQUIRE(MergeContributions(f, &held, Weighting::kTokens, MergeRule::kRda, a.data(), nullptr, &pool).ok());
    REQUIRE(MergeContributions(f, &decoded, Weighting::kTokens, MergeRule::kRda, b.data()).ok());
    CHECK(SameBits(a, b));
  }
}

TEST_CASE("merger: RDA scaling left to the caller gives the bits MergeDeltas writes", "[unit][sync]") {
  const Fragment f = TestFragment();
  Rng rng(41);
  std::vector<std::vector<float>> deltas(3, std::vector<float>(f.numel));
  for (auto& d : deltas)
    for (float& x : d) x = (float)(0.01 * rng.normal());
  // Range 1 cancels between learners 0 and 1 (and learner 2 sends zeros there): RDA falls back
  // to the mean in it, which MergeDeltas writes itself.
  const FragmentRange& r1 = f.ranges[1];
  for (size_t j = 0; j < r1.numel; j++) {
    deltas[1][r1.packed_offset + j] = -deltas[0][r1.packed_offset + j];
    deltas[2][r1.packed_offset + j] = 0.0f;
  }
  std::vector<Contribution> contributions;
  for (int m = 0; m < 3; m++) contributions.push_back({m, {1000.0, 10.0}, deltas[m].data(), nullptr});
  TaskPool pool(2);
  std::vector<float> whole(f.numel), later(f.numel);
  REQUIRE(MergeContributions(f, &contributions, Weighting::kUniform, MergeRule::kRda, whole.data(), nullptr, &pool).ok());
  std::vector<double> scale;
  REQUIRE(MergeContributions(f, &contributions, Weighting::kUniform, MergeRule::kRda, later.data(), nullptr, &pool,
                             &scale)
              .ok());
  REQUIRE(scale.size() == f.ranges.size());
  CHECK(scale[0] == 1.0);  // wte: the mean
  CHECK(scale[1] == 1.0);  // cancelled: the mean, written
  CHECK(scale[3] != 1.0);
  for (size_t r = 0; r < f.ranges.size(); r++)
    for (size_t j = 0; j < f.ranges[r].numel; j++) {
      float& v = later[f.ranges[r].packed_offset + j];
      v = ScaledLater(scale[r], v);
    }
  CHECK(SameBits(later, whole));
}

TEST_CASE("merger: a held payload is checked and measured as it is taken in", "[unit][sync]") {
  const Fragment f = TestFragment();
  const Round round = MakeRound(f, CodecKind::kInt8, 1, 41);
  const HeldDelta& h = round.pending[0].held;
  REQUIRE(h.range_norms.size() == f.ranges.size());
  for (size_t r = 0; r < f.ranges.size(); r++)
    CHECK(h.range_norms[r] == RangeNorm(round.decoded[0].data() + f.ranges[r].packed_offset, f.ranges[r].numel));
  std::vector<uint64_t> tensor_bytes;
  for (const FragmentRange& r : f.ranges) tensor_bytes.push_back(EncodedBytes(CodecKind::kInt8, r.numel, 64));
  HeldDelta out;
  std::vector<uint8_t> bad = h.payload;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bad.data() + h.payload_at[1] + 4 * 1000, &nan, sizeof nan);  // a scale deep in tensor 1
  std::span<const uint8_t> whole(bad);
  const Status bad_scale = HoldPayload(f, h.codec, std::span(&whole, 1), tensor_bytes, &out);
  CHECK_FALSE(bad_scale.ok());
  CHECK_THAT(bad_scale.message(), Catch::Contains("tensor 1") && Catch::Contains("scale") &&
                                      Catch::Contains("index 64000"));  // block 1000 of 64 values
  whole = std::span<const uint8_t>(h.payload).first(h.payload.size() - 1);
  CHECK_FALSE(HoldPayload(f, h.codec, std::span(&whole, 1), tensor_bytes, &out).ok());
  whole = std::span<const uint8_t>(h.payload);
  REQUIRE(HoldPayload(f, h.codec, std::span(&whole, 1), tensor_bytes, &out).ok());
  CHECK(out.payload == h.payload);
}

// The outer step as plain arithmetic: fp32 both ways, the plain mean, lr 1, no momentum, so a
// merge of one delta Δ moves Θ by exactly −Δ (up to float rounding).
SyncConfig PlainOuterStep() {
  SyncConfig sc;
  sc.codec.up = CodecKind::kFp32;
  sc.codec.down = CodecKind::kFp32;
  sc.merge = MergeRule::kMean;
  sc.weighting = Weighting::kUniform;
  sc.outer.lr = 1.0;
  sc.outer.momentum = 0.0;
  return sc;
}

PendingDelta DeltaOf(const Fragment& f, int learner, uint64_t base_version, const std::vector<float>& delta) {
  const CodecOptions opt{CodecKind::kFp32, 64, 0};
  std::vector<uint8_t> payload;
  std::vector<uint64_t> tensor_bytes;
  REQUIRE(EncodeTensors(opt, delta, FragmentNumels(f), &payload, &tensor_bytes).ok());
  const std::span<const uint8_t> whole(payload);
  PendingDelta pd;
  pd.learner = learner;
  pd.base_version = base_version;
  pd.counts = {1000.0, 10.0};
  REQUIRE(HoldPayload(f, opt, std::span(&whole, 1), tensor_bytes, &pd.held).ok());
  return pd;
}

std::vector<float> Noise(size_t n, uint64_t seed, double scale) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = (float)(scale * rng.normal());
  return v;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); i++) d = std::max(d, (double)std::fabs(a[i] - b[i]));
  return d;
}

TEST_CASE("merger: age-aware scaling and a partial round's share shrink the weights", "[unit][sync]") {
  const Fragment f = TestFragment();
  SyncConfig sc = PlainOuterStep();
  sc.age_power = 1.0;
  FragmentMerger merger(sc);
  FragmentGlobal fg = Start(f);
  fg.version = 5;
  const std::vector<PendingDelta> pending = {DeltaOf(f, 0, 5, Noise(f.numel, 1, 0.01)),
                                             DeltaOf(f, 1, 2, Noise(f.numel, 2, 0.01))};
  MergeOutcome mo;
  REQUIRE(merger.Merge(f, 0, pending, &fg, &mo).ok());
  REQUIRE(mo.weights.size() == 2);
  CHECK(mo.weights[0] == Approx(0.5));         // fresh: its share of the uniform weights
  CHECK(mo.weights[1] == Approx(0.5 / 4.0));   // 3 versions behind: (1 + 3)^-1
  // A partial round (2 of 8 learners) with sync.partial: share moves Θ by 2/8 of its merge.
  sc.learners = 8;
  sc.partial = PartialRound::kShare;
  FragmentMerger shared(sc);
  fg.version = 5;
  REQUIRE(shared.Merge(f, 0, pending, &fg, &mo).ok());
  CHECK(mo.weights[0] == Approx(0.5 * 0.25));
  CHECK(mo.weights[1] == Approx(0.5 / 4.0 * 0.25));
  sc.partial = PartialRound::kFull;
  sc.age_power = 0;
  FragmentMerger plain(sc);
  fg.version = 5;
  REQUIRE(plain.Merge(f, 0, pending, &fg, &mo).ok());
  CHECK(mo.weights == std::vector<double>{0.5, 0.5});
}

TEST_CASE("merger: outer momentum restarts before every restart_every-th merge", "[unit][sync]") {
  const Fragment f = TestFragment();
  SyncConfig sc = PlainOuterStep();
  sc.outer.momentum = 0.9;
  sc.outer.restart_every = 3;
  const std::vector<float> delta = Noise(f.numel, 3, 0.01);
  for (uint64_t version : {2, 3, 6}) {
    INFO("version " << version);
    FragmentMerger merger(sc);
    FragmentGlobal fg = Start(f);
    fg.version = version;
    fg.momentum = Noise(f.numel, 4, 1.0);
    const std::vector<float> before = fg.momentum;
    MergeOutcome mo;
    REQUIRE(merger.Merge(f, 0, {DeltaOf(f, 0, version, delta)}, &fg, &mo).ok());
    const bool restarted = version % 3 == 0;
    for (size_t i = 0; i < f.numel; i += 997) {
      const float expect = restarted ? delta[i] : (float)(0.9 * before[i] + delta[i]);
      REQUIRE(fg.momentum[i] == Approx(expect).margin(1e-6));
    }
  }
}

TEST_CASE("merger: anchor current re-anchors a stale delta at the current version", "[unit][sync]") {
  const Fragment f = TestFragment();
  for (Anchor anchor : {Anchor::kBase, Anchor::kCurrent}) {
    INFO("anchor " << ToString(anchor));
    SyncConfig sc = PlainOuterStep();
    sc.anchor = anchor;
    FragmentMerger merger(sc);
    FragmentGlobal fg = Start(f);
    const std::vector<float> theta0 = fg.theta;
    MergeOutcome mo;
    REQUIRE(merger.Merge(f, 0, {DeltaOf(f, 0, 0, Noise(f.numel, 5, 0.05))}, &fg, &mo).ok());
    fg.version = 1;
    const std::vector<float> theta1 = fg.theta;
    // Learner 1 started from version 0 and moved by −Δ: its θ is Θ_0 − Δ.
    const std::vector<float> delta = Noise(f.numel, 6, 0.05);
    REQUIRE(merger.Merge(f, 0, {DeltaOf(f, 1, 0, delta)}, &fg, &mo).ok());
    std::vector<float> expect(f.numel);
    for (size_t i = 0; i < f.numel; i++)
      expect[i] = anchor == Anchor::kCurrent ? theta0[i] - delta[i]   // Θ_2 = θ_learner
                                             : theta1[i] - delta[i];  // Θ_2 = Θ_1 − Δ
    CHECK(MaxAbsDiff(fg.theta, expect) < 1e-5);
  }
}

TEST_CASE("task pool: every task runs once per Run", "[unit][sync]") {
  TaskPool pool(3);
  for (int run = 0; run < 200; run++) {
    const size_t tasks = run % 17;
    std::vector<std::atomic<int>> hits(tasks);
    pool.Run(tasks, [&](size_t t, int worker) {
      CHECK(worker >= 0);
      CHECK(worker < 3);
      hits[t]++;
    });
    for (auto& h : hits) CHECK(h.load() == 1);
  }
}

}  // namespace
}  // namespace diloco
