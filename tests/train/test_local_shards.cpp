// Local mode with the syncer as shards (sync.syncers, shards.h): each shard a syncer role of its
// own on its own endpoints, the learners routing each fragment to its owner.
#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "daemon/sync/global_state.h"
#include "daemon/train/local_run.h"
#include "tests/temp_dir.h"
#include "tests/train/local_run_testing.h"

namespace diloco {
namespace {
namespace fs = std::filesystem;
using diloco::testing::ReadJsonl;
using diloco::testing::TempDir;
using diloco::testing::TinyRun;

TrainOptions ShardedRun(const TempDir& tmp, int learners) {
  TrainOptions o = TinyRun(tmp, learners);
  o.config.sync.fragments = 4;
  o.config.sync.syncers = 2;  // fragments 0 and 2 on syncer-0, 1 and 3 on syncer-1 (equal sizes)
  return o;
}

// Each merge's (fragment, version), checking no version is issued twice.
std::map<int, std::vector<int64_t>> MergeTimesByFragment(const TrainOptions& o) {
  std::map<int, std::vector<int64_t>> times;
  std::set<std::pair<int, uint64_t>> seen;
  for (const auto& ev : ReadJsonl(fs::path(o.run_dir) / "events.log")) {
    INFO(ev.dump());
    CHECK(seen.insert({ev["fragment"].get<int>(), ev["version"].get<uint64_t>()}).second);
    times[ev["fragment"].get<int>()].push_back(ev["time_ms"].get<int64_t>());
  }
  return times;
}

TEST_CASE("local run: two syncer shards each merge their own fragments into one model", "[e2e][shards]") {
  TempDir tmp;
  TrainOptions o = ShardedRun(tmp, 3);
  TrainSummary s;
  const Status st = RunLocal(o, &s);
  INFO(st.message());
  REQUIRE(st.ok());
  REQUIRE(s.versions.size() == 4);
  for (uint64_t v : s.versions) CHECK(v >= 1);
  REQUIRE(s.shard_merges.size() == 2);
  CHECK(s.shard_merges[0] >= 2);
  CHECK(s.shard_merges[1] >= 2);
  CHECK(s.shard_merges[0] + s.shard_merges[1] == s.outer_steps);
  CHECK(s.final_val_loss < s.initial_val_loss - 0.5);

  // One events.log for the run, every version once; each fragment's last version as the summary's.
  const std::map<int, std::vector<int64_t>> times = MergeTimesByFragment(o);
  size_t merges = 0;
  for (const auto& [p, t] : times) merges += t.size();
  CHECK(merges == s.outer_steps);
  for (int p = 0; p < 4; p++) {
    const size_t n = times.count(p) ? times.at(p).size() : 0;
    CHECK(n == s.versions[p]);
  }
  // Each shard's checkpoint in its own directory, and the joined model in the run's.
  for (const char* shard : {"syncer-0", "syncer-1"}) {
    GlobalState gs;
    REQUIRE(LoadGlobalState((fs::path(o.run_dir) / shard / "global_state.bin").string(), &gs).ok());
  }
  GlobalState joined;
  REQUIRE(LoadGlobalState((fs::path(o.run_dir) / "global_state.bin").string(), &joined).ok());
  REQUIRE(joined.fragments.size() == 4);
  for (int p = 0; p < 4; p++) CHECK(joined.fragments[p].version == s.versions[p]);
  CHECK(joined.merges == s.outer_steps);
}

// A shard's failure stays its own (issue 45, item 3): while syncer-1 is down the learners keep
// training and syncer-0's fragments keep merging; syncer-1 comes back from its own store at its
// last versions, and the learners' deltas for its fragments go to it again.
TEST_CASE("local run: while one syncer shard is down the other's fragments keep merging", "[e2e][shards][chaos]") {
  TempDir tmp;
  TrainOptions o = ShardedRun(tmp, 2);
  o.config.train.steps = 300;
  o.config.sync.checkpoint_every = 1000;  // syncer-1 comes back from its start plus the update log
  ChaosEvent kill;
  kill.kind = ChaosEventKind::kSyncerKill;
  kill.shard = 1;
  kill.at_s = 0.6;
  kill.restart_after_s = 1.5;
  o.config.chaos.events = {kill};
  LocalRunHooks paced;  // about 3 s of training: the outage lands mid-run
  paced.before_step = [](int, long) { std::this_thread::sleep_for(std::chrono::milliseconds(10)); };
  TrainSummary s;
  const Status st = RunLocal(o, &s, paced);
  INFO(st.message());
  REQUIRE(st.ok());
  const std::map<int, std::vector<int64_t>> times = MergeTimesByFragment(o);
  REQUIRE(times.count(1));
  REQUIRE(times.count(3));
  // The outage: the longest silence of syncer-1's fragments (about 1.5 s; at most 0.3 s otherwise).
  std::vector<int64_t> down = times.at(1);
  down.insert(down.end(), times.at(3).begin(), times.at(3).end());
  std::sort(down.begin(), down.end());
  int64_t gap_from = 0, gap_to = 0;
  for (size_t i = 1; i < down.size(); i++)
    if (down[i] - down[i - 1] > gap_to - gap_from) gap_from = down[i - 1], gap_to = down[i];
  INFO("syncer-1 silent for " << gap_to - gap_from << " ms");
  CHECK(gap_to - gap_from >= 1000);
  // syncer-0 merged throughout it, and syncer-1 merged again after it.
  int during = 0;
  for (int p : {0, 2})
    for (int64_t t : times.at(p)) during += t > gap_from + 200 && t < gap_to - 200;
  CHECK(during >= 4);
  CHECK(std::count_if(down.begin(), down.end(), [&](int64_t t) { return t >= gap_to; }) >= 2);
  REQUIRE(s.shard_merges.size() == 2);
  CHECK(s.shard_merges[1] > 0);
}

}  // namespace
}  // namespace diloco
