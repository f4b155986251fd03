// A sharded dilocod job's one view (issue 45, item 4): the shards' results joined as one syncer's.
#include <catch2/catch.hpp>

#include "daemon/control/job_metrics.h"

namespace diloco {
namespace {

TEST_CASE("the syncer shards' results join: counters summed, versions from owners, goodput by share", "[unit]") {
  RunConfig cfg;
  cfg.model = {.n_layer = 2, .n_embd = 32, .n_head = 4, .block_size = 32};
  cfg.sync.learners = 3;
  cfg.sync.fragments = 4;
  cfg.sync.syncers = 2;
  const ShardLayout layout = ShardLayoutOf(cfg);
  REQUIRE(layout.map.shards() == 2);
  REQUIRE(layout.shares.size() == 2);
  CHECK(layout.shares[0] + layout.shares[1] == Approx(1.0));
  // Each shard knows only its own fragments' versions (the others stay 0 there).
  nlohmann::json home = {{"merges", 10},          {"dropped_deltas", 1},  {"rejected_deltas", 0},
                         {"bytes_received", 100}, {"bytes_published", 50}, {"snapshots_served", 2},
                         {"final_val_loss", 2.5}, {"versions", nlohmann::json::array()},
                         {"goodput", {{"goodput", 0.8}, {"uptime", 1.0}, {"waste", {{"down", 0.0}}}}}};
  nlohmann::json other = {{"merges", 7},          {"dropped_deltas", 2},  {"rejected_deltas", 1},
                          {"bytes_received", 70}, {"bytes_published", 30}, {"snapshots_served", 1},
                          {"versions", nlohmann::json::array()},
                          {"goodput", {{"goodput", 0.4}, {"uptime", 0.5}, {"waste", {{"down", 0.5}}}}}};
  for (int p = 0; p < 4; p++) {
    home["versions"].push_back(layout.map.OwnerOf(p) == 0 ? 5 + p : 0);
    other["versions"].push_back(layout.map.OwnerOf(p) == 1 ? 3 + p : 0);
  }
  const nlohmann::json j = JoinShardResults({home, other}, layout);
  CHECK(j["merges"] == 17);
  CHECK(j["dropped_deltas"] == 3);
  CHECK(j["rejected_deltas"] == 1);
  CHECK(j["bytes_received"] == 170);
  CHECK(j["shard_merges"] == nlohmann::json::array({10, 7}));
  for (int p = 0; p < 4; p++) CHECK(j["versions"][p] == (layout.map.OwnerOf(p) == 0 ? 5 + p : 3 + p));
  CHECK(j["final_val_loss"] == 2.5);  // the home's evaluation of the joined model
  const double s0 = layout.shares[0], s1 = layout.shares[1];
  CHECK(j["goodput"]["goodput"].get<double>() == Approx(0.8 * s0 + 0.4 * s1));
  CHECK(j["goodput"]["uptime"].get<double>() == Approx(s0 + 0.5 * s1));
  CHECK(j["goodput"]["waste"]["down"].get<double>() == Approx(0.5 * s1));
  // A shard without a goodput figure: none joined, rather than a part passed off as the whole.
  other.erase("goodput");
  CHECK_FALSE(JoinShardResults({home, other}, layout).contains("goodput"));
}

}  // namespace
}  // namespace diloco
