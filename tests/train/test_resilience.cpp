// The job never stops: local runs under lost messages, long steps, a poisoned Global, killed and
// partitioned learners and a killed syncer (issue 13's failure modes, end to end).
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <thread>

#include "daemon/train/local_run.h"
#include "tests/train/local_run_testing.h"

namespace diloco {
namespace {
namespace fs = std::filesystem;
using testing::ReadJsonl;
using testing::TempDir;
using testing::TinyRun;

std::vector<nlohmann::json> Merges(const TrainOptions& o) { return ReadJsonl(fs::path(o.run_dir) / "events.log"); }

// Every learner's steps take at least ms milliseconds (the tiny model alone is far faster), so
// faults timed in seconds land while the learners train.
LocalRunHooks Paced(int ms) {
  LocalRunHooks hooks;
  hooks.before_step = [ms](int, long) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
  return hooks;
}

nlohmann::json Summary(const TrainOptions& o) {
  for (const auto& line : ReadJsonl(fs::path(o.run_dir) / "metrics.jsonl"))
    if (line.value("event", "") == "summary") return line;
  return {};
}

// Failure mode 1: with 5% of all messages lost on every link (deltas, Globals, statuses,
// heartbeats), every mode finishes and every fragment keeps advancing: a lost delta is found
// through the syncer's acks and sent again, a lost Global through its status versions.
TEST_CASE("local run: under 5% message loss every mode finishes and every fragment advances", "[e2e][resilience]") {
  for (SyncMode mode : {SyncMode::kDecoupled, SyncMode::kDiloco, SyncMode::kStreaming}) {
    DYNAMIC_SECTION("mode " << ToString(mode)) {
      TempDir tmp;
      TrainOptions o = TinyRun(tmp, 2);
      o.config.sync.mode = mode;
      o.config.sync.link.loss = 0.05;
      TrainSummary s;
      LocalRunDetails d;
      const Status st = RunLocal(o, &s, Paced(20), &d);
      INFO(st.message());
      REQUIRE(st.ok());
      // 60 steps, H = 10: 6 rounds per fragment. Lock-step modes merge every round; decoupled
      // learners do not wait, so a fragment whose delta is still in flight skips a fire point.
      for (uint64_t v : s.versions) CHECK(v >= (mode == SyncMode::kDecoupled ? 3u : 6u));
      uint64_t recovered = 0;
      for (int i = 0; i < 2; i++) recovered += d.deltas_lost[i] + d.globals_missed[i] + d.gaps[i];
      INFO("lost deltas, missed globals and gaps seen: " << recovered);
      CHECK(s.final_val_loss < s.initial_val_loss - 0.5);
    }
  }
}

// Failure mode 2: liveness follows the process, not the training thread. Learner 1's steps
// before each outer step take 1.2 s, three heartbeat timeouts; in lock-step mode a learner
// counted dead would let a round close without it.
TEST_CASE("local run: steps longer than the heartbeat timeout do not make a learner dead", "[e2e][resilience]") {
  TempDir tmp;
  TrainOptions o = TinyRun(tmp, 2);
  o.config.sync.mode = SyncMode::kDiloco;
  o.config.sync.heartbeat_timeout_ms = 400;
  o.config.train.steps = 40;
  LocalRunHooks hooks;
  hooks.before_step = [](int learner, long step) {
    if (learner == 1 && step % 10 == 9) std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  };
  TrainSummary s;
  const Status st = RunLocal(o, &s, hooks);
  INFO(st.message());
  REQUIRE(st.ok());
  REQUIRE(s.versions == std::vector<uint64_t>{4});
  for (const auto& ev : Merges(o)) {
    INFO(ev.dump());
    CHECK(ev["contributors"].size() == 2);
  }
}

// Failure mode 6 (the learner's side): a Global whose update is not finite is refused, not
// applied; the learner resyncs from a snapshot and the run goes on.
TEST_CASE("local run: a Global with a NaN update is refused and the learners resync", "[e2e][resilience]") {
  TempDir tmp;
  TrainOptions o = TinyRun(tmp, 2);
  o.config.sync.mode = SyncMode::kDiloco;
  o.config.sync.codec.down = CodecKind::kFp32;
  LocalRunHooks hooks;
  hooks.nan_global_fragment = 0;
  hooks.nan_global_version = 3;
  TrainSummary s;
  LocalRunDetails d;
  const Status st = RunLocal(o, &s, hooks, &d);
  INFO(st.message());
  REQUIRE(st.ok());
  CHECK(d.globals_refused == std::vector<uint64_t>{1, 1});
  CHECK(d.snapshots_installed == std::vector<uint64_t>{1, 1});
  CHECK(s.versions == std::vector<uint64_t>{6});
  CHECK(std::isfinite(s.final_val_loss));
  CHECK(s.final_val_loss < s.initial_val_loss - 0.5);
}

// Failure mode 7: the last flush leaves nothing behind. Every token a learner trained on
// reaches the global model through a merge, for every fragment (replay fold: a merged delta's
// counts leave the learner's, so nothing is counted twice), including the fragments whose
// delta was still in flight when training ended.
TEST_CASE("local run: at the end every learner's work is merged into every fragment", "[e2e][resilience]") {
  TempDir tmp;
  TrainOptions o = TinyRun(tmp, 2);
  o.config.sync.fold = FoldRule::kReplay;
  o.config.sync.fragments = 3;
  o.config.train.steps = 65;  // not a multiple of H: work is left after the last fire
  TrainSummary s;
  const Status st = RunLocal(o, &s);
  INFO(st.message());
  REQUIRE(st.ok());
  REQUIRE(s.dropped_deltas == 0);
  std::map<std::pair<int, int>, double> merged;  // (fragment, learner) -> tokens
  for (const auto& ev : Merges(o))
    for (const auto& c : ev["contributors"]) merged[{ev["fragment"].get<int>(), c["learner"].get<int>()}] += c["tokens"].get<double>();
  for (int p = 0; p < 3; p++)
    for (int l = 0; l < 2; l++) {
      INFO("fragment " << p << " learner " << l);
      CHECK(merged[{p, l}] == (double)s.learner_tokens[l]);
    }
  CHECK(Summary(o)["goodput"].get<double>() > 0);
}

// Chaos in local mode: a learner killed and restarted, another partitioned, a third slowed; the
// run finishes, the killed learner comes back as a second incarnation, and goodput accounts for
// its down time.
TEST_CASE("local run: chaos kills and partitions and slows learners and the run finishes", "[e2e][resilience][chaos]") {
  TempDir tmp;
  TrainOptions o = TinyRun(tmp, 3);
  o.config.train.steps = 400;
  o.config.sync.quorum = 2;
  o.config.sync.heartbeat_timeout_ms = 500;
  ChaosEvent kill;
  kill.kind = ChaosEventKind::kKill;
  kill.at_step = 60;
  kill.learner = 1;
  kill.restart_after_s = 1;
  ChaosEvent partition;
  partition.kind = ChaosEventKind::kPartition;
  partition.at_step = 80;
  partition.learner = 2;
  partition.duration_s = 1;
  ChaosEvent slow;
  slow.kind = ChaosEventKind::kSlow;
  slow.at_step = 50;
  slow.learner = 0;
  slow.factor = 3;
  slow.duration_s = 1;
  o.config.chaos.events = {kill, partition, slow};
  o.config.train.checkpoint_every = 20;  // the learners keep their moments for a restart
  TrainSummary s;
  LocalRunDetails d;
  const Status st = RunLocal(o, &s, Paced(5), &d);
  INFO(st.message());
  REQUIRE(st.ok());
  CHECK(d.incarnations == std::vector<int>{1, 2, 1});
  CHECK(d.snapshots_installed[1] >= 1);
  for (long t : s.learner_tokens) CHECK(t > 0);
  const nlohmann::json summary = Summary(o);
  INFO(summary.dump());
  CHECK(summary["waste"]["down"].get<double>() > 0);
  // The pacing sleeps are not compute, so goodput against the compute rate is low here; it is
  // bounded all the same.
  CHECK(summary["goodput"].get<double>() > 0);
  CHECK(summary["goodput"].get<double>() <= 1.0);
  std::set<std::string> played;
  for (const auto& line : ReadJsonl(fs::path(o.run_dir) / "metrics.jsonl"))
    if (line.value("event", "") == "chaos") played.insert(line["action"].get<std::string>());
  CHECK(played == std::set<std::string>{"kill", "restart", "partition_start", "partition_end", "slow_start", "slow_end"});
  // The restarted learner took its AdamW moments back from its own checkpoint.
  for (const auto& line : ReadJsonl(fs::path(o.run_dir) / "metrics.jsonl"))
    if (line.value("event", "") == "learner_done") CHECK(line["moments_restored"] == (line["learner"] == 1));
}

// Failure modes 3 and 8 in local mode: the syncer is killed (no flush, no save) while lock-step
// learners wait for it, and comes back from its checkpoint plus the update log: the learners
// wait through the outage (no fixed time limit), their lost deltas go again, every round is
// merged with both learners, and no version is issued twice.
TEST_CASE("local run: a killed syncer comes back at its last versions and lock-step learners wait for it",
          "[e2e][resilience][chaos]") {
  TempDir tmp;
  TrainOptions o = TinyRun(tmp, 2);
  o.config.sync.mode = SyncMode::kDiloco;
  o.config.sync.checkpoint_every = 1000;  // the checkpoint is the start; the log has the rest
  o.config.train.steps = 200;
  ChaosEvent kill;
  kill.kind = ChaosEventKind::kSyncerKill;
  kill.at_s = 0.5;
  kill.restart_after_s = 2;
  o.config.chaos.events = {kill};
  TrainSummary s;
  LocalRunDetails d;
  const Status st = RunLocal(o, &s, Paced(10), &d);  // about 2 s of training: the kill lands mid-run
  INFO(st.message());
  REQUIRE(st.ok());
  CHECK(s.versions == std::vector<uint64_t>{20});
  std::set<uint64_t> seen;
  for (const auto& ev : Merges(o)) {
    INFO(ev.dump());
    CHECK(seen.insert(ev["version"].get<uint64_t>()).second);
    CHECK(ev["contributors"].size() == 2);
  }
  CHECK(seen.size() == 20);
}

}  // namespace
}  // namespace diloco

namespace diloco {
namespace {

// Data parallel under the same chaos: a killed learner stops every rank until it is back, and
// the job resumes from its last checkpoint; the rolled-back steps are discarded work and the
// others' wait is blocked time.
// train.time_limit_s is the run's budget: a restarted learner keeps the first incarnation's (it
// started a new one, training 0.5 + 2 s against the other's 2 s).
TEST_CASE("local run: a restarted learner keeps the run's train.time_limit_s", "[e2e][resilience][chaos]") {
  TempDir tmp;
  TrainOptions o = TinyRun(tmp, 2);
  o.config.train.steps = 1000000;
  o.config.train.time_limit_s = 2.0;
  ChaosEvent kill;
  kill.kind = ChaosEventKind::kKill;
  kill.at_s = 0.5;
  kill.learner = 1;
  kill.restart_after_s = 1.0;
  o.config.chaos.events = {kill};
  TrainSummary s;
  LocalRunDetails d;
  const Status st = RunLocal(o, &s, {}, &d);
  INFO(st.message());
  REQUIRE(st.ok());
  REQUIRE(d.incarnations == std::vector<int>{1, 2});
  REQUIRE(s.learner_tokens.size() == 2);
  INFO("tokens " << s.learner_tokens[0] << " and " << s.learner_tokens[1]);
  // Learner 1 trained about 0.5 + 0.5 of the 2 s (half of learner 0's tokens); with a budget of
  // its own it trained 0.5 + 2 s.
  CHECK(s.learner_tokens[1] < 0.8 * s.learner_tokens[0]);
}

TEST_CASE("local ddp: a killed learner stops the ring which resumes from its checkpoint", "[e2e][resilience][chaos]") {
  TempDir tmp;
  TrainOptions o = TinyRun(tmp, 2);
  o.config.sync.mode = SyncMode::kDdp;
  o.config.train.steps = 60;
  o.config.train.checkpoint_every = 10;
  ChaosEvent kill;
  kill.kind = ChaosEventKind::kKill;
  kill.at_step = 25;
  kill.learner = 1;
  kill.restart_after_s = 0.5;
  ChaosEvent partition;  // a cut-off learner stops the ring too, until its link is back
  partition.kind = ChaosEventKind::kPartition;
  partition.at_step = 45;
  partition.learner = 0;
  partition.duration_s = 0.3;
  o.config.chaos.events = {kill, partition};
  TrainSummary s;
  const Status st = RunLocal(o, &s, Paced(10));
  INFO(st.message());
  REQUIRE(st.ok());
  CHECK(s.versions == std::vector<uint64_t>{60});
  const nlohmann::json summary = Summary(o);
  INFO(summary.dump());
  CHECK(summary["waste"]["down"].get<double>() > 0);
  CHECK(summary["waste"]["blocked"].get<double>() > 0);
  CHECK(summary["waste"]["discarded"].get<double>() > 0);
  int resumes = 0;
  for (const auto& line : ReadJsonl(fs::path(o.run_dir) / "metrics.jsonl"))
    if (line.value("event", "") == "resume") resumes++;
  CHECK(resumes == 2);
}

}  // namespace
}  // namespace diloco
