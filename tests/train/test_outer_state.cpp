// The outer-sync state sharded over a ring (daemon/train/outer_state.h) against one backend holding
// all of it: the same payload bytes, bases and folded parameters, for every codec and ring size,
// with each rank holding its pieces only.
#include "daemon/train/outer_state.h"

#include <catch2/catch.hpp>
#include <cstring>

#include "kernels/rng.h"

namespace diloco {
namespace {

GptConfig SmallModel() {
  GptConfig c;
  c.vocab_size = 67;  // odd sizes, so ranges end in partial blocks
  c.block_size = 9;
  c.n_layer = 2;
  c.n_embd = 24;
  c.n_head = 2;
  return c;
}

std::vector<float> Noise(size_t n, uint64_t seed, double scale) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = (float)(rng.normal() * scale);
  return v;
}

// Three fragments of the table: the embeddings, then the blocks split in two (a fragment of
// several ranges of every size).
std::vector<std::vector<ParamRange>> Fragments(const TensorTable& table) {
  std::vector<std::vector<ParamRange>> f(3);
  for (size_t i = 0; i < table.tensors().size(); i++) {
    const TensorInfo& t = table.tensors()[i];
    f[i < 2 ? 0 : (i < 14 ? 1 : 2)].push_back({t.offset, t.numel});
  }
  return f;
}

size_t Numel(const std::vector<ParamRange>& ranges) {
  size_t n = 0;
  for (const ParamRange& r : ranges) n += r.count;
  return n;
}

struct Outcome {
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<std::vector<float>> bases;
  std::vector<float> params;  // rank 0's at the end (every rank's must equal it)
  bool ranks_equal = true;
  std::vector<size_t> outer_bytes;  // per rank
};

// The same script of outer-sync operations on a ring of R ranks (sharded when shard is set).
Outcome RunScript(int R, ShardMode shard, SyncCodec kind, int block) {
  LocalRingOptions ro;
  ro.ranks = R;
  ro.model = SmallModel();
  ro.shard = shard;
  // The ring stands in for a GPU ring: a host buffer handed to a device collective fails here
  // as it would fault on NCCL (issue 44, item 1).
  ro.check_device_memory = true;
  std::unique_ptr<LocalRing> ring;
  REQUIRE(LocalRing::Create(ro, &ring).ok());
  const size_t n = ring->backend(0).num_params();
  const auto fragments = Fragments(ring->backend(0).table());
  const std::vector<float> start = Noise(n, 1, 0.1);
  ring->Upload(start.data());
  std::unique_ptr<OuterState> outer = MakeOuterState(*ring, shard);
  std::vector<std::unique_ptr<RingCommandHandler>> followers(R);
  for (int r = 1; r < R; r++) followers[r] = MakeOuterStateFollower(ring->backend(r), ring->comm(r));
  Outcome out;
  // One session of commands: rank 0 runs `script`, the others serve it.
  auto session = [&](const std::function<void()>& script) {
    REQUIRE(ring
                ->Run([&](int rank) -> Status {
                  if (rank > 0) return OuterStateSharded(*ring, shard) ? ServeRing(ring->comm(rank), *followers[rank]) : Status::Ok();
                  script();
                  return outer->Release();
                })
                .ok());
  };
  auto moved = [&](uint64_t seed) {  // training moved θ the same on every rank
    std::vector<float> theta = start;
    const std::vector<float> step = Noise(n, seed, 0.01);
    for (size_t i = 0; i < n; i++) theta[i] += step[i];
    ring->Upload(theta.data());
  };
  session([&] { REQUIRE(outer->Setup(fragments, block).ok()); });
  for (int round = 0; round < 2; round++) {
    moved(10 + round);
    session([&] {
      for (int p = 0; p < 3; p++) {
        std::vector<uint8_t> payload;
        std::vector<uint64_t> range_bytes;
        bool ok = false;
        REQUIRE(outer->EncodeDelta(p, kind, block, &payload, &range_bytes, &ok).ok());
        REQUIRE(ok);
        out.payloads.push_back(payload);
        // A Global: an update encoded with the same codec, then a replay fold of our delta.
        std::vector<float> update = Noise(Numel(fragments[p]), 100 + p + 10 * round, 0.02), residual(update.size());
        std::vector<uint8_t> global;
        size_t at = 0, bytes = 0, value = 0;
        for (const ParamRange& r : fragments[p]) bytes += sync_payload_bytes(kind, r.count, block);
        global.resize(bytes);
        for (const ParamRange& r : fragments[p]) {
          REQUIRE(sync_encode(global.data() + at, residual.data() + value, update.data() + value, kind, block, r.count));
          at += sync_payload_bytes(kind, r.count, block);
          value += r.count;
        }
        bool applied = false;
        REQUIRE(outer->ApplyUpdate(p, global.data(), global.size(), kind, block, &applied).ok());
        REQUIRE(applied);
        REQUIRE(outer->Fold(p, FoldMode::kReplay, 0.5, FoldIncluded::kAtSend).ok());
        REQUIRE(outer->ShiftAtSend(p).ok());
        if (p == 1) REQUIRE(outer->ResetResidual(p).ok());
        std::vector<float> base(Numel(fragments[p]));
        REQUIRE(outer->ReadBase(p, base.data()).ok());
        out.bases.push_back(base);
      }
      // A snapshot of fragment 2.
      const std::vector<float> snapshot = Noise(Numel(fragments[2]), 7 + round, 0.1);
      REQUIRE(outer->Install(2, snapshot.data()).ok());
      std::vector<float> base(snapshot.size());
      REQUIRE(outer->ReadBase(2, base.data()).ok());
      CHECK(std::memcmp(base.data(), snapshot.data(), base.size() * sizeof(float)) == 0);
    });
    if (!outer->SpreadsParameters()) {  // what the inner loop's changed ranges do
      std::vector<float> theta(n);
      ring->backend(0).download_params(theta.data());
      ring->Upload(theta.data());
    }
  }
  out.params.resize(n);
  ring->backend(0).download_params(out.params.data());
  for (int r = 0; r < R; r++) {
    std::vector<float> theta(n);
    ring->backend(r).download_params(theta.data());
    out.ranks_equal = out.ranks_equal && std::memcmp(theta.data(), out.params.data(), n * sizeof(float)) == 0;
    out.outer_bytes.push_back(ring->backend(r).allocated().outer_state);
  }
  return out;
}

TEST_CASE("sharded outer-sync state: the payloads, bases and folds of one backend, byte for byte", "[unit]") {
  for (SyncCodec kind : {SyncCodec::kInt4, SyncCodec::kInt8, SyncCodec::kBf16, SyncCodec::kFp32}) {
    for (int block : {64, 6}) {
      const Outcome whole = RunScript(1, ShardMode::kNone, kind, block);
      for (int R : {2, 3, 4}) {
        CAPTURE((int)kind, block, R);
        const Outcome sharded = RunScript(R, ShardMode::kOptimizer, kind, block);
        REQUIRE(sharded.payloads.size() == whole.payloads.size());
        for (size_t i = 0; i < whole.payloads.size(); i++) CHECK(sharded.payloads[i] == whole.payloads[i]);
        for (size_t i = 0; i < whole.bases.size(); i++)
          CHECK(std::memcmp(sharded.bases[i].data(), whole.bases[i].data(), whole.bases[i].size() * sizeof(float)) == 0);
        CHECK(std::memcmp(sharded.params.data(), whole.params.data(), whole.params.size() * sizeof(float)) == 0);
        CHECK(sharded.ranks_equal);
        // Each rank holds about 1/R of the state (pieces are whole blocks, so not exactly).
        for (size_t b : sharded.outer_bytes) CHECK((double)b < 1.5 * whole.outer_bytes[0] / R + 4096);
      }
    }
  }
}

}  // namespace
}  // namespace diloco
