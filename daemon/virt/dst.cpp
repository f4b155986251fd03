#include "daemon/virt/dst.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "daemon/sync/protocol.h"
#include "daemon/train/learner.h"
#include "daemon/train/trainer.h"
#include "daemon/virt/virtual_world.h"
#include "kernels/gpt.h"
#include "kernels/rng.h"

namespace diloco {

namespace {

namespace fs = std::filesystem;

double LogUniform(Rng& r, double lo, double hi) { return lo * std::pow(hi / lo, r.uniform()); }

// The invariants watched while the case runs (the syncer's Globals as they are published).
class DstWatch {
 public:
  DstWatch(VirtualWorld& world, std::vector<DstViolation>* out) : world_(world), out_(out) {}

  void OnGlobal(const GlobalMsg& g) {
    const double t = world_.scheduler().now_ns() / 1e9;
    uint64_t& last = versions_[g.fragment];
    if (g.version != last + 1)
      Add("versions", "fragment " + std::to_string(g.fragment) + " published version " + std::to_string(g.version) +
                          " after " + std::to_string(last), t);
    last = std::max(last, g.version);
    // A learner's step is merged at most once per fragment, whichever incarnation sent it (a
    // delta sent twice, or steps a restarted learner did again).
    for (const Contributor& c : g.contributors) {
      if (!merged_.insert({c.learner, g.fragment, c.learner_step}).second)
        Add("merged-once", c.learner + "'s delta of fragment " + std::to_string(g.fragment) + " sent at step " +
                               std::to_string(c.learner_step) + " (base " + std::to_string(c.base_version) + ", " +
                               std::to_string(c.c_steps) + " steps) merged again into version " +
                               std::to_string(g.version), t);
    }
  }

  void Add(const std::string& invariant, const std::string& detail, double at_s) {
    if (out_->size() < 20) out_->push_back({invariant, detail, at_s});
  }

 private:
  VirtualWorld& world_;
  std::vector<DstViolation>* out_;
  std::map<uint32_t, uint64_t> versions_;
  std::set<std::tuple<std::string, uint32_t, uint64_t>> merged_;  // learner, fragment, learner_step
};

// How long the end may take after the last learner's last step: a merge interval of the slowest
// learner, the grace window, the links' round trips, and a heartbeat timeout for the last word.
double EndBoundS(const RunConfig& cfg) {
  double slowest = 1;
  for (int i = 0; i < cfg.sync.learners; i++) slowest = std::max(slowest, SlowdownOf(cfg.learners, i));
  const double step_s = cfg.timing.step_ms / 1e3 * slowest * (1 + cfg.timing.step_jitter);
  const double interval_s = step_s * std::max(1.0, (double)cfg.sync.inner_steps / EffectiveFragments(cfg.sync));
  double link_s = 0;
  for (int i = 0; i < cfg.sync.learners; i++) {
    const LearnerConfig lc = LearnerConfigOf(cfg.learners, i);
    const LinkConfig& l = lc.has_link ? lc.link : cfg.timing.link;
    link_s = std::max(link_s, (l.latency_ms + l.jitter_ms) / 1e3);
  }
  return 2 * interval_s + cfg.sync.grace.cap_ms / 1e3 + 8 * link_s + cfg.sync.heartbeat_timeout_ms / 1e3 +
         4 * cfg.timing.heartbeat_ms / 1e3;
}

}  // namespace

Status DstBaseConfig(const std::string& dir, RunConfig* out) {
  fs::create_directories(dir);
  const std::string corpus = (fs::path(dir) / "dst-corpus.txt").string();
  if (!fs::exists(corpus)) {
    // Words from a fixed generator: enough text for a tiny model's batches, the same everywhere.
    std::ofstream f(corpus);
    Rng r(0xc0ffee);
    static const char* kWords[] = {"the", "syncer", "merges", "a", "delta", "from", "each", "learner", "and",
                                   "every", "fragment", "moves", "on", "when", "its", "quorum", "is", "in"};
    for (int i = 0; i < 40000; i++) f << kWords[r.below(18)] << (r.below(12) == 0 ? ".\n" : " ");
    if (!f) return Status::Error("dst: cannot write '" + corpus + "'");
  }
  RunConfig c;
  c.model = {1, 16, 2, 16, 256};
  c.data.corpus = corpus;
  c.train.batch_size = 2;
  c.train.warmup_steps = 2;
  c.train.threads = 1;
  c.train.log_every = 1000;
  c.eval.batches = 1;
  c.sync.clock = ClockSource::kVirtual;
  *out = c;
  return Status::Ok();
}

DstCase DrawDstCase(uint64_t seed, const RunConfig& base) {
  Rng r(mix_seed(seed, 0xd57));
  DstCase c;
  c.seed = seed;
  c.config = base;
  RunConfig& cfg = c.config;
  SyncConfig& sc = cfg.sync;
  const double mode = r.uniform();
  sc.mode = mode < 0.6 ? SyncMode::kDecoupled : mode < 0.8 ? SyncMode::kStreaming : SyncMode::kDiloco;
  sc.learners = 2 + (int)r.below(4);
  sc.fragments = 1 + (int)r.below(4);
  sc.inner_steps = std::max(2, sc.fragments * (1 + (int)r.below(5)) + (int)r.below(4));
  sc.overlap = 1 + (int)r.below(std::min(3, sc.inner_steps - 1));
  sc.quorum = 1 + (int)r.below(sc.learners);
  sc.grace.gamma = r.uniform();
  sc.grace.cap_ms = 50 + (int)r.below(3000);
  sc.grace.forecast = r.below(2) == 0;
  sc.max_staleness = 1 + (int)r.below(6);
  sc.fold = r.below(3) == 0 ? FoldRule::kReplay : FoldRule::kOverwrite;
  static const CodecKind kUp[] = {CodecKind::kFp32, CodecKind::kInt8, CodecKind::kInt4, CodecKind::kTopkChunked};
  static const CodecKind kDown[] = {CodecKind::kFp32, CodecKind::kInt8, CodecKind::kInt4};
  sc.codec.up = kUp[r.below(4)];
  sc.codec.down = kDown[r.below(3)];
  sc.codec.chunk = 256;
  sc.codec.keep = 8;
  sc.codec.feedback = r.below(2) == 0 ? FeedbackRule::kResidual : FeedbackRule::kAccumulate;
  cfg.train.steps = 20 + (int)r.below(60);
  cfg.timing.step_ms = LogUniform(r, 20, 2000);
  cfg.timing.step_jitter = r.uniform() * 0.3;
  cfg.timing.heartbeat_ms = 50 + (double)r.below(400);
  cfg.timing.merge_gbps = LogUniform(r, 0.01, 10);
  cfg.timing.seed = r.next_u64();
  cfg.timing.link.bandwidth_mbps = LogUniform(r, 1, 10000);
  cfg.timing.link.latency_ms = LogUniform(r, 0.1, 300);
  cfg.timing.link.jitter_ms = r.below(2) == 0 ? 0 : r.uniform() * 50;
  cfg.timing.link.loss = r.below(2) == 0 ? 0 : r.uniform() * 0.05;
  sc.heartbeat_timeout_ms = std::max(3000, (int)(10 * cfg.timing.heartbeat_ms));
  cfg.learners.clear();
  double slowest = 1;
  for (int i = 0; i < sc.learners; i++) {
    LearnerConfig lc;
    if (r.below(3) == 0) lc.slowdown = 1 + 3 * r.uniform();
    slowest = std::max(slowest, lc.slowdown);
    cfg.learners.push_back(lc);
  }
  const double run_s = cfg.train.steps * cfg.timing.step_ms / 1e3 * slowest;
  const int kills = (int)r.below(3), cuts = (int)r.below(3);
  for (int k = 0; k < kills + cuts; k++) {
    DstFault f;
    f.kind = k < kills ? DstFault::kKill : DstFault::kPartition;
    f.learner = (int)r.below(sc.learners);
    f.at_s = r.uniform() * run_s;
    f.for_s = 0.5 + r.uniform() * std::max(1.0, run_s / 4);
    c.faults.push_back(f);
  }
  // The faults added later come from a generator of their own, so that every seed still draws the
  // deployment, kills and cuts it drew before (and the seeds of past fixes still test them).
  Rng x(mix_seed(seed, 0xfa17));
  if (x.below(3) == 0) {
    sc.checkpoint_every = 1 + (int)x.below(6);  // the restart reads a checkpoint and the log after it
    const int syncer_kills = 1 + (int)x.below(2);
    for (int k = 0; k < syncer_kills; k++) {
      DstFault f;
      f.kind = DstFault::kSyncerKill;
      f.at_s = x.uniform() * run_s;
      f.for_s = 0.2 + x.uniform() * std::max(1.0, run_s / 8);
      c.faults.push_back(f);
    }
  }
  const bool dup = x.below(3) == 0, reorder = x.below(3) == 0;
  if (dup || reorder) {
    c.links.duplicate = dup ? 0.01 + 0.1 * x.uniform() : 0;
    c.links.reorder = reorder ? 0.01 + 0.1 * x.uniform() : 0;
    c.links.window_ms = LogUniform(x, 1, 1000);
  }
  if (x.below(3) == 0) {
    const int jumps = 1 + (int)x.below(2);
    for (int k = 0; k < jumps; k++) {
      DstFault f;
      f.kind = DstFault::kClockJump;
      f.learner = (int)x.below(sc.learners + 1) - 1;
      f.at_s = x.uniform() * run_s;
      f.for_s = LogUniform(x, 0.05, 3.0 * sc.heartbeat_timeout_ms / 1e3);
      c.faults.push_back(f);
    }
  }
  // Syncer shards, from a generator of their own as above: a third of the seeds with two or more
  // fragments run 2..P shards, and each syncer kill or syncer clock jump hits one of them.
  Rng y(mix_seed(seed, 0x5a4d));
  if (EffectiveFragments(sc) >= 2 && y.below(3) == 0) sc.syncers = 2 + (int)y.below(EffectiveFragments(sc) - 1);
  for (DstFault& f : c.faults) {
    if (f.kind == DstFault::kSyncerKill) f.learner = (int)y.below(sc.syncers);
    if (f.kind == DstFault::kClockJump && f.learner < 0) f.learner = -1 - (int)y.below(sc.syncers);
  }
  return c;
}

std::string DescribeDstCase(const DstCase& c) {
  const RunConfig& cfg = c.config;
  const SyncConfig& sc = cfg.sync;
  std::ostringstream o;
  o << "seed " << c.seed << ": " << ToString(sc.mode) << " M=" << sc.learners << " P=" << sc.fragments
    << " H=" << sc.inner_steps << " K=" << sc.quorum << (sc.syncers > 1 ? " S=" + std::to_string(sc.syncers) : "") << " steps=" << cfg.train.steps << " up=" << CodecName(sc.codec.up)
    << " down=" << CodecName(sc.codec.down) << " step=" << std::lround(cfg.timing.step_ms) << "ms link="
    << cfg.timing.link.bandwidth_mbps << "Mbit/s+" << cfg.timing.link.latency_ms << "ms loss=" << cfg.timing.link.loss;
  auto tenths = [](double s) { return std::lround(s * 10) / 10.0; };
  for (const DstFault& f : c.faults) {
    switch (f.kind) {
      case DstFault::kKill: o << " kill(" << f.learner; break;
      case DstFault::kPartition: o << " cut(" << f.learner; break;
      case DstFault::kSyncerKill: o << " syncer-kill(" << (sc.syncers > 1 ? std::to_string(f.learner) : ""); break;
      case DstFault::kClockJump:
        o << " jump("
          << (f.learner >= 0 ? std::to_string(f.learner)
              : sc.syncers > 1 ? "syncer-" + std::to_string(-1 - f.learner)
                               : std::string("syncer"));
        break;
    }
    o << "@" << tenths(f.at_s) << "s+" << tenths(f.for_s) << "s)";
  }
  if (c.links.duplicate > 0) o << " dup=" << c.links.duplicate;
  if (c.links.reorder > 0) o << " reorder=" << c.links.reorder;
  if (c.links.any()) o << " window=" << c.links.window_ms << "ms";
  if (std::any_of(c.faults.begin(), c.faults.end(), [](const DstFault& f) { return f.kind == DstFault::kSyncerKill; }))
    o << " checkpoint_every=" << sc.checkpoint_every;
  return o.str();
}

Status RunDstCase(const DstCase& c, const std::string& scratch_dir, DstCaseResult* out) {
  *out = {};
  std::error_code ec;
  fs::remove_all(scratch_dir, ec);
  fs::create_directories(scratch_dir);
  const RunConfig& cfg = c.config;
  // A drawn config must be one the config reader accepts.
  RunConfig reread;
  DL_RETURN_IF_ERROR(ParseRunConfig(RunConfigToYaml(cfg), "dst seed " + std::to_string(c.seed), "", {}, &reread)
                         .WithContext("dst: the drawn config is invalid (a bug in the draw)"));
  const VirtualModel model = VirtualModelOf(cfg);
  VirtualWorldOptions wo;
  wo.config = &cfg;
  wo.run_dir = scratch_dir;
  wo.table = &model.table;
  wo.init_params = model.init.data();
  wo.threads = 1;
  for (const DstFault& f : c.faults) wo.durable_syncer |= f.kind == DstFault::kSyncerKill;
  // Every learner's steps at its slowest, each fault's time, and the flush timeout, twice over.
  double slowest = 1, faults_s = 0;
  for (int i = 0; i < cfg.sync.learners; i++) slowest = std::max(slowest, SlowdownOf(cfg.learners, i));
  for (const DstFault& f : c.faults) faults_s += f.kind == DstFault::kClockJump ? 0 : f.for_s;
  wo.max_virtual_s = 2 * (cfg.train.steps * cfg.timing.step_ms / 1e3 * slowest * 1.5 + faults_s + 120);
  std::unique_ptr<VirtualWorld> world;
  DL_RETURN_IF_ERROR(VirtualWorld::Create(wo, &world));
  DstWatch watch(*world, &out->violations);
  world->OnGlobal([&](const GlobalMsg& g) { watch.OnGlobal(g); });
  for (const DstFault& f : c.faults) {
    const int64_t at = (int64_t)(f.at_s * 1e9), len = (int64_t)(f.for_s * 1e9);
    switch (f.kind) {
      case DstFault::kKill: world->KillLearnerAt(at, f.learner, len); break;
      case DstFault::kPartition: world->PartitionAt(at, f.learner, len); break;
      case DstFault::kSyncerKill: world->KillSyncerAt(at, len, f.learner); break;
      case DstFault::kClockJump: world->JumpClockAt(at, f.learner, len); break;
    }
  }
  if (c.links.any()) world->network().SetFaults(c.links, mix_seed(cfg.timing.seed, 0xd0b));
  const Status run = world->Run();
  const double end_s = world->scheduler().now_ns() / 1e9;
  out->events = world->scheduler().events_run();
  out->virtual_s = end_s;
  for (int s = 0; s < world->shards(); s++)
    if (world->syncer_running(s)) out->merges += world->syncer(s).state().merges;
  if (!run.ok()) {
    watch.Add("error", run.message(), end_s);
    return Status::Ok();
  }
  double last_step_s = 0;
  int requests_at_end = 0;
  for (int i = 0; i < world->learners(); i++) {
    requests_at_end = std::max(requests_at_end, world->incarnations(i).back()->requests_after_last_step());
    const auto& incs = world->incarnations(i);
    for (const auto& l : incs) {
      const LearnerResult& r = l->result();
      if (r.crc_mismatches > 0 || r.globals_refused > 0)
        watch.Add("same-bits", LearnerName(i) + " found " + std::to_string(r.crc_mismatches) + " CRC mismatches and refused " +
                                   std::to_string(r.globals_refused) + " Globals", end_s);
      last_step_s = std::max(last_step_s, l->last_step_ns() / 1e9);
    }
    const LearnerResult& last = incs.back()->result();
    if (last.crashed || last.steps != cfg.train.steps)
      watch.Add("progress", LearnerName(i) + " ended at step " + std::to_string(last.steps) + " of " +
                                std::to_string(cfg.train.steps) + (last.crashed ? " (crashed)" : ""), end_s);
    uint64_t applied = 0;
    for (const auto& l : incs) applied += l->result().globals_applied + l->result().snapshots_installed;
    if (out->merges > 0 && applied == 0)
      watch.Add("progress", LearnerName(i) + " applied none of the " + std::to_string(out->merges) + " merges", end_s);
  }
  // A learner cut off at its end can hand in its last deltas only once the cut heals: the end is
  // timed from the later of the last step and the last heal (dilococtl dst --seed 175); the same
  // for a syncer down at the end, from its restart, and for a learner killed while it flushed
  // after its last step: the run waits for its next incarnation (dilococtl dst --seed 1018).
  // The restarts that happened (a kill of a learner that had ended does nothing).
  double heal_s = 0;
  for (const DstFault& f : c.faults)
    if (f.kind == DstFault::kPartition) heal_s = std::max(heal_s, f.at_s + f.for_s);
  for (const auto& spans : world->down_spans())
    for (const auto& [down_ms, up_ms] : spans)
      heal_s = std::max(heal_s, (double)(up_ms - VirtualScheduler::kEpochUnixMs) / 1e3);
  for (int64_t restart_ns : world->syncer_restarts_ns()) heal_s = std::max(heal_s, restart_ns / 1e9);
  const double from_s = std::max(last_step_s, heal_s);
  double bound_s = EndBoundS(cfg);
  // A held-back message is late by up to the window: as much again on every round trip counted.
  if (c.links.any()) bound_s += 8 * c.links.window_ms / 1e3;
  // A learner that missed a Global at its end resyncs, and every snapshot it asks for again (its
  // request or a part was lost: a lossy link, a syncer down) costs a retry period: counted, not
  // guessed (dilococtl dst --seed 27: one retry; --seed 531: five in a row on a 4% lossy link).
  if (requests_at_end > 1)
    bound_s += (requests_at_end - 1) * (LearnerOptions().snapshot_retry_ms + cfg.timing.heartbeat_ms) / 1e3;
  // A design limit, not a bug: a syncer that restarts after a learner finished never hears from
  // that learner again (its last word went to the old incarnation, and neither global_state.bin
  // nor the update log says who finished). The new syncer waits one heartbeat timeout for every
  // learner it has not heard (RoundBook: one not heard yet counts as heard at the start, so that
  // a restarted syncer does not close rounds without learners about to speak), and never sees
  // every learner done, so the run ends one heartbeat timeout (VirtualWorld::Run's linger) after
  // the last learner. The end bound allows both for that combination only (dilococtl dst --seed
  // 245).
  const int64_t first_end_ns = *std::min_element(world->ended_ns().begin(), world->ended_ns().end());
  for (int64_t restart_ns : world->syncer_restarts_ns())
    if (first_end_ns >= 0 && restart_ns > first_end_ns) {
      bound_s += 2 * cfg.sync.heartbeat_timeout_ms / 1e3;
      break;
    }
  if (end_s - from_s > bound_s)
    watch.Add("end", "the job ended " + std::to_string(end_s - from_s) + " s after its last learner's last step" +
                         (from_s > last_step_s ? " and the last heal or restart" : "") + " (bound " +
                         std::to_string(bound_s) + " s)", end_s);
  return Status::Ok();
}

}  // namespace diloco
