// dilococtl bench syncer: how fast the syncer turns learners' deltas into a new global version.
//
// A synthetic GPT-shaped model of --params parameters (an embedding, then blocks of 2-D weights
// and 1-D biases) is split into --fragments fragments, as the syncer splits a real one. By
// default every fragment's round is open at once (the syncer's worst case: every learner's delta
// of every fragment pending): for each fragment, each of --learners learners sends a delta
// encoded with --codec, which goes through what the syncer does with an arriving delta (hold it
// encoded, checked and measured chunk by chunk; the round book's checks); then each fragment
// merges (contribution weights, RDA / mean, outer Nesterov, the downlink codec with error
// feedback, Θ += the decoded update, CRC32C of Θ).
// Learner-side work (making and encoding the deltas) is not timed.
//
// --syncers S: the fragments split over S shards by the syncers' rule (sync/shards.h), each
// running its own fragments' rounds on threads of its own (--threads each) at the same time; the
// merge GB/s is then their sum (each shard's fp32 bytes over its median round).
//
// --open-rounds K: only K fragments' rounds open at a time (waves of K: their deltas, then their
// merges), as on the staggered schedule where a round closes about when the next fragment's opens.
//
// Figures: merge GB/s = learners × params × 4 bytes (the fp32 deltas merged) / the timed seconds
// of one round (the median of --rounds, after one untimed round); copy GB/s = memcpy of a 64 MiB
// buffer split over the same number of threads (the machine's DRAM copy bandwidth), measured
// right after each round, the median; ratio = the median over rounds of that round's merge GB/s
// over the copy GB/s measured beside it; peak RSS from getrusage and bytes/param = (peak RSS −
// RSS before the model) / params.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "daemon/ctl/commands.h"
#include "daemon/ctl/gaussian_data.h"
#include "daemon/net/codec.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/held_delta.h"
#include "daemon/sync/merge.h"
#include "daemon/sync/merger.h"
#include "daemon/sync/protocol.h"
#include "daemon/sync/round_book.h"
#include "daemon/sync/shards.h"
#include "daemon/util/crc32c.h"
#include "kernels/tensor_table.h"

namespace diloco {
namespace {

using BenchClock = std::chrono::steady_clock;

double Seconds(BenchClock::time_point t0) {
  return std::chrono::duration<double>(BenchClock::now() - t0).count();
}

// Resident MB now (/proc/self/statm).
double CurrentRssMb() {
  long pages_total = 0, pages_resident = 0;
  if (FILE* f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages_total, &pages_resident) != 2) pages_resident = 0;
    std::fclose(f);
  }
  return (double)pages_resident * 4096.0 / (1024.0 * 1024.0);
}

double PeakRssMb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_maxrss / 1024.0;  // KiB on Linux
}

// A GPT-like table of about n parameters: wte [n/16 / 512 rows, 512], then blocks of
// [512, 2048] and [2048, 512] weights with their biases until n is reached.
TensorTable SyntheticTable(size_t n) {
  constexpr int kC = 512;
  TensorTable t;
  const int vocab_rows = std::max<int>(1, (int)(n / 16 / kC));
  t.add("wte", {vocab_rows, kC});
  for (int layer = 0; t.total_numel() < n; layer++) {
    const std::string h = "h" + std::to_string(layer) + ".";
    const size_t left = n - t.total_numel();
    if (left >= (size_t)2 * kC * 4 * kC + 5 * kC) {
      t.add(h + "fc.w", {kC, 4 * kC});
      t.add(h + "fc.b", {4 * kC});
      t.add(h + "proj.w", {4 * kC, kC});
      t.add(h + "proj.b", {kC});
    } else {
      const int rows = (int)std::max<size_t>(1, left / kC);
      t.add(h + "rest.w", {rows, kC});
    }
  }
  return t;
}

// The machine's DRAM copy bandwidth, measured beside each round: memcpy GB/s (bytes copied / s)
// of a 64 MiB buffer (twice the L3 of the machines we run on) split over `threads`, best of 3.
// This VM's copy bandwidth moves between ~21 and ~35 GB/s from one second to the next (other
// tenants), so a ratio holds only against a copy measured at the same time. The buffers are
// made and touched before the base RSS is read: they are not counted as the syncer's.
class CopyProbe {
 public:
  explicit CopyProbe(int threads) : threads_(threads), src_(kBytes, 1), dst_(kBytes, 0) {}
  double GBps() {
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
      const auto t0 = BenchClock::now();
      std::vector<std::thread> pool;
      const size_t part = kBytes / threads_;
      for (int t = 0; t < threads_; t++) {
        const size_t begin = t * part, len = t + 1 == threads_ ? kBytes - begin : part;
        pool.emplace_back([this, begin, len] { std::memcpy(dst_.data() + begin, src_.data() + begin, len); });
      }
      for (auto& th : pool) th.join();
      best = std::min(best, Seconds(t0));
    }
    return (double)kBytes / best / 1e9;
  }

 private:
  static constexpr size_t kBytes = size_t{64} << 20;
  int threads_;
  std::vector<char> src_, dst_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// What every shard's rounds share: the model's fragments and state, the learners' deltas' source.
struct BenchSetup {
  const BenchSyncerCommand* cmd = nullptr;
  SyncConfig sc;
  CodecOptions up_codec;
  CodecKind up = CodecKind::kInt4;
  std::vector<Fragment> fragments;
  std::vector<float> source;  // the learners' deltas: shifted, scaled windows of it
  // The syncer's state per fragment (each shard touches only its own).
  std::vector<std::vector<float>> theta, momentum;
  std::vector<uint64_t> versions;
};

// One syncer shard's part: its fragments' rounds (one untimed, then cmd.rounds timed), as
// RunBenchSyncerCommand describes them. after_round (may be empty) runs after each timed round.
struct ShardRun {
  std::vector<uint32_t> owned;
  uint64_t fp32_bytes = 0;  // M × its parameters × 4: what one round merges
  std::vector<double> round_s, arrive_s, merge_s;
  uint32_t crc = 0;
  Status status;
};

Status RunShardRounds(BenchSetup& b, ShardRun* run, const std::function<void(double round_s)>& after_round) {
  const BenchSyncerCommand& cmd = *b.cmd;
  const int M = cmd.learners;
  const size_t P = b.fragments.size();
  FragmentMerger merger(b.sc);
  HeldDeltaRecycler recycler(run->owned.size() * ((size_t)M + 1));  // as the syncer keeps them
  RoundBookOptions bo;
  bo.learners = M;
  bo.fragments = (int)P;
  bo.inner_steps = b.sc.inner_steps;
  bo.max_staleness = b.sc.max_staleness;
  bo.norm_limit = b.sc.norm_limit;
  RoundBook book(bo, BenchClock::now());
  for (int m = 0; m < M; m++) book.OnHeard(m, 1, BenchClock::now());
  size_t largest = 0;
  for (uint32_t p : run->owned) largest = std::max(largest, b.fragments[p].numel);
  std::vector<float> delta(largest);
  std::vector<uint8_t> payload;
  std::vector<uint64_t> tensor_bytes;
  // Round 0 is not timed: it warms what a running syncer has warm (its recycled buffers, pages).
  const size_t n = run->owned.size();
  const size_t open = cmd.open_rounds > 0 ? std::min<size_t>(n, (size_t)cmd.open_rounds) : n;
  for (int round = 0; round <= cmd.rounds; round++) {
    double arrivals_timed = 0, merges_timed = 0;
    // Waves of `open` fragments: their deltas arrive, then they merge.
    for (size_t wave = 0; wave < n; wave += open) {
      const size_t wave_end = std::min(n, wave + open);
      for (size_t k = wave; k < wave_end; k++) {
        const uint32_t p = run->owned[k];
        const Fragment& frag = b.fragments[p];
        const std::vector<uint64_t> numels = FragmentNumels(frag);
        for (int m = 0; m < M; m++) {
          // The learner's side (not timed): its delta, encoded.
          const float scale = 1.0f + 0.1f * (float)((m + round) % 5);
          for (size_t i = 0; i < frag.numel; i++) delta[i] = scale * b.source[i + (size_t)m * 7919];
          DL_RETURN_IF_ERROR(EncodeTensors(b.up_codec, std::span(delta.data(), frag.numel), numels, &payload, &tensor_bytes));
          // The syncer's side of an arriving delta.
          const auto t0 = BenchClock::now();
          DeltaArrival a;
          a.learner = m;
          a.fragment = p;
          a.base_version = b.versions[p];
          a.c_steps = 10;
          a.c_tokens = 1000 * (uint64_t)(m + 1);
          a.learner_step = 10 * (uint64_t)(round + 1);
          const std::span<const uint8_t> whole(payload);
          const bool fp32 = b.up == CodecKind::kFp32;
          a.held = recycler.Take(fp32 ? 0 : payload.size(), fp32 ? frag.numel : 0);
          DL_RETURN_IF_ERROR(HoldPayload(frag, b.up_codec, std::span(&whole, 1), tensor_bytes, &a.held, merger.pool()));
          if (!book.Admit(std::move(a), b.versions[p], BenchClock::now())) {
            const std::vector<DeltaDrop> drops = book.TakeDrops();
            return Status::Error(std::string("a delta was refused: ") + (drops.empty() ? "" : drops[0].why + " " + drops[0].detail));
          }
          arrivals_timed += Seconds(t0);
        }
      }
      // The merges (Syncer::Merge's maths, as the syncer runs them).
      const auto t0 = BenchClock::now();
      for (size_t k = wave; k < wave_end; k++) {
        const uint32_t p = run->owned[k];
        std::vector<PendingDelta> ok = book.TakeForMerge(p, b.versions[p]);
        FragmentGlobal fg;
        fg.theta.swap(b.theta[p]);
        fg.momentum.swap(b.momentum[p]);
        MergeOutcome mo;
        const Status st = merger.Merge(b.fragments[p], p, ok, &fg, &mo);
        fg.theta.swap(b.theta[p]);
        fg.momentum.swap(b.momentum[p]);
        DL_RETURN_IF_ERROR(st);
        run->crc ^= mo.theta_crc32c;
        for (PendingDelta& pd : ok) recycler.Give(std::move(pd.held));
        b.versions[p]++;
      }
      merges_timed += Seconds(t0);
      (void)book.TakeDrops();
    }
    if (round == 0) continue;
    run->arrive_s.push_back(arrivals_timed);
    run->merge_s.push_back(merges_timed);
    run->round_s.push_back(arrivals_timed + merges_timed);
    if (after_round) after_round(run->round_s.back());
  }
  return Status::Ok();
}

}  // namespace

int RunBenchSyncerCommand(const BenchSyncerCommand& cmd) {
  BenchSetup b;
  b.cmd = &cmd;
  CodecKind down;
  if (!ParseCodecKind(cmd.codec, &b.up) || !ParseCodecKind(cmd.down_codec, &down)) {
    std::fprintf(stderr, "dilococtl bench syncer: codecs are fp32, bf16, int8 or int4\n");
    return 2;
  }
  if (cmd.params < 1000 || cmd.learners < 1 || cmd.fragments < 1 || cmd.rounds < 1 || cmd.threads < 0 ||
      cmd.syncers < 1 || cmd.syncers > cmd.fragments) {
    std::fprintf(stderr,
                 "dilococtl bench syncer: --params >= 1000, --learners, --fragments, --rounds >= 1, "
                 "--threads >= 0, 1 <= --syncers <= --fragments\n");
    return 2;
  }
  // The syncer's defaults: token weights, RDA, outer lr / momentum.
  if (cmd.threads > 0) b.sc.merge_threads = cmd.threads;
  const int threads = b.sc.merge_threads;
  const int S = cmd.syncers;
  CopyProbe copy(threads * S);
  const double base_rss_mb = CurrentRssMb();  // the process before any model state (libraries, the probe)
  const TensorTable table = SyntheticTable((size_t)cmd.params);
  if (Status st = PartitionFragments(table, cmd.fragments, &b.fragments); !st.ok()) {
    std::fprintf(stderr, "dilococtl bench syncer: %s\n", st.message().c_str());
    return 2;
  }
  const size_t N = table.total_numel();
  const int M = cmd.learners;
  const size_t P = b.fragments.size();
  size_t largest = 0;
  for (const Fragment& f : b.fragments) largest = std::max(largest, f.numel);
  b.sc.learners = M;
  b.sc.fragments = (int)P;
  b.sc.codec.down = down;
  b.up_codec = CodecOptions{b.up, b.sc.codec.block, 0};
  // The syncer's state: Θ_p, u_p per fragment (Θ from a Gaussian "model").
  b.theta.resize(P);
  b.momentum.resize(P);
  for (size_t p = 0; p < P; p++) {
    b.theta[p] = GaussianData(b.fragments[p].numel, 99 + p, 1e-3);
    b.momentum[p].assign(b.fragments[p].numel, 0.0f);
  }
  b.versions.assign(P, 0);
  // The learners' deltas come from one Gaussian vector, shifted and scaled per learner.
  b.source = GaussianData(largest + (size_t)M * 7919, 7, 1e-3);

  // The shards (sync.syncers' rule, shards.h), each on threads of its own, all at once: the
  // aggregate merge rate is the sum of theirs.
  const ShardMap shards = ShardMap::Of(b.fragments, S);
  std::vector<ShardRun> runs(S);
  for (int s = 0; s < S; s++) {
    runs[s].owned = shards.FragmentsOf(s);
    for (uint32_t p : runs[s].owned) runs[s].fp32_bytes += (uint64_t)M * b.fragments[p].numel * 4;
  }
  std::vector<double> copy_s, ratio_s;
  if (S == 1) {
    // The copy bandwidth right after each round, beside it (this VM's moves from second to second).
    runs[0].status = RunShardRounds(b, &runs[0], [&](double round_s) {
      copy_s.push_back(copy.GBps());
      ratio_s.push_back((double)M * (double)N * 4.0 / round_s / 1e9 / copy_s.back());
    });
  } else {
    std::vector<std::thread> pool;
    for (int s = 0; s < S; s++) pool.emplace_back([&, s] { runs[s].status = RunShardRounds(b, &runs[s], {}); });
    for (auto& t : pool) t.join();
  }
  uint32_t crc_sink = 0;
  for (const ShardRun& r : runs) {
    if (!r.status.ok()) {
      std::fprintf(stderr, "dilococtl bench syncer: %s\n", r.status.message().c_str());
      return 1;
    }
    crc_sink ^= r.crc;
  }
  double merge_gbps = 0, seconds = 0, arrivals = 0, merges = 0;
  for (const ShardRun& r : runs) {
    merge_gbps += (double)r.fp32_bytes / Median(r.round_s) / 1e9;
    seconds = std::max(seconds, Median(r.round_s));
    arrivals = std::max(arrivals, Median(r.arrive_s));
    merges = std::max(merges, Median(r.merge_s));
  }
  if (S > 1) {
    for (int r = 0; r < cmd.rounds; r++) copy_s.push_back(copy.GBps());
    ratio_s.push_back(merge_gbps / Median(copy_s));
  }
  const double peak_rss_mb = PeakRssMb();
  const double copy_gbps = Median(copy_s), ratio = Median(ratio_s);
  // The syncer's state and buffers: peak RSS above the process's own (the CUDA libraries dilococtl
  // links alone are ~150 MB).
  const double bytes_per_param = (peak_rss_mb - base_rss_mb) * 1024 * 1024 / (double)N;
  if (cmd.json) {
    nlohmann::ordered_json j;
    j["merge_GBps"] = merge_gbps;
    j["copy_GBps"] = copy_gbps;
    j["ratio"] = ratio;
    j["peak_rss_mb"] = peak_rss_mb;
    j["base_rss_mb"] = base_rss_mb;
    j["bytes_per_param"] = bytes_per_param;
    j["params"] = N;
    j["learners"] = M;
    j["fragments"] = P;
    j["syncers"] = S;
    j["open_rounds"] = cmd.open_rounds > 0 ? std::min<size_t>(P, (size_t)cmd.open_rounds) : P;
    j["codec"] = cmd.codec;
    j["down_codec"] = cmd.down_codec;
    j["threads"] = threads;
    j["round_s"] = seconds;
    j["arrivals_s"] = arrivals;
    j["merges_s"] = merges;
    j["crc"] = crc_sink;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "syncer: %zu params, %d learners, %zu fragments, %d shard(s) of %d thread(s), %s up / %s down: "
        "merge %.2f GB/s (%.3f s a round: arrivals %.3f, merges %.3f; the slowest shard's), copy %.2f GB/s "
        "(ratio %.2f), peak RSS %.0f MB (%.0f before the model; %.1f bytes/param above it)\n",
        N, M, P, S, threads, cmd.codec.c_str(), cmd.down_codec.c_str(), merge_gbps, seconds, arrivals, merges,
        copy_gbps, ratio, peak_rss_mb, base_rss_mb, bytes_per_param);
  }
  return 0;
}

}  // namespace diloco
