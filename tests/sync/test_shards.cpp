// ShardMap (shards.h): which syncer shard merges which fragment, and the run's state joined back.
#include <catch2/catch.hpp>

#include <vector>

#include "daemon/sync/global_state.h"
#include "daemon/sync/shards.h"

namespace diloco {
namespace {

std::vector<Fragment> Sized(const std::vector<uint64_t>& numels) {
  std::vector<Fragment> frags;
  for (uint64_t n : numels) {
    Fragment f;
    f.numel = n;
    frags.push_back(f);
  }
  return frags;
}

}  // namespace

TEST_CASE("ShardMap: one syncer owns every fragment and keeps its name", "[unit][sync]") {
  const ShardMap m = ShardMap::Of(Sized({5, 5, 5}), 1);
  CHECK(m.shards() == 1);
  CHECK(m.FragmentsOf(0) == std::vector<uint32_t>{0, 1, 2});
  CHECK(m.NameOf(0) == "syncer");
  CHECK(m.ShardNamed("syncer") == 0);
  CHECK(m.ShardNamed("syncer-0") == -1);
}

TEST_CASE("ShardMap: equal fragments go round the shards, so neighbours in time land apart", "[unit][sync]") {
  const ShardMap m = ShardMap::Of(Sized({8, 8, 8, 8, 8, 8, 8, 8}), 3);
  CHECK(m.FragmentsOf(0) == std::vector<uint32_t>{0, 3, 6});
  CHECK(m.FragmentsOf(1) == std::vector<uint32_t>{1, 4, 7});
  CHECK(m.FragmentsOf(2) == std::vector<uint32_t>{2, 5});
  for (uint32_t p = 0; p < 8; p++) CHECK(m.OwnerOf(p) == (int)p % 3);
  CHECK(m.Names() == std::vector<std::string>{"syncer-0", "syncer-1", "syncer-2"});
  CHECK(m.ShardNamed("syncer-2") == 2);
  CHECK(m.ShardNamed("syncer") == -1);
  CHECK(m.OwnerOf(8) == -1);
}

TEST_CASE("ShardMap: unequal fragments are balanced by bytes, in fragment order", "[unit][sync]") {
  // Each to the lighter shard: 3 -> s0, 10 -> s1, 1 -> s0 (3 < 10), 7 -> s0 (4 < 10), 4 -> s1 (10 < 11).
  const ShardMap m = ShardMap::Of(Sized({3, 10, 1, 7, 4}), 2);
  CHECK(m.FragmentsOf(0) == std::vector<uint32_t>{0, 2, 3});
  CHECK(m.FragmentsOf(1) == std::vector<uint32_t>{1, 4});
}

TEST_CASE("JoinShardStates: each fragment from its shard, the counters and ledgers summed", "[unit][sync]") {
  const ShardMap m = ShardMap::Of(Sized({2, 2}), 2);
  GlobalState a, b;
  a.fragments = {{3, {1, 1}, {0, 0}}, {0, {9, 9}, {0, 0}}};
  b.fragments = {{0, {9, 9}, {0, 0}}, {5, {2, 2}, {0, 0}}};
  a.merges = 3;
  b.merges = 5;
  b.dropped_deltas = 1;
  LedgerFor(&a, 0).tokens = 10;
  LedgerFor(&b, 0).tokens = 20;
  LedgerFor(&b, 1).merged = 4;
  const GlobalState j = JoinShardStates({&a, &b}, m);
  CHECK(j.fragments[0].version == 3);
  CHECK(j.fragments[0].theta == std::vector<float>{1, 1});
  CHECK(j.fragments[1].version == 5);
  CHECK(j.fragments[1].theta == std::vector<float>{2, 2});
  CHECK(j.merges == 8);
  CHECK(j.dropped_deltas == 1);
  REQUIRE(j.ledger.size() == 2);
  CHECK(j.ledger[0].tokens == 30);
  CHECK(j.ledger[1].merged == 4);
}

}  // namespace diloco
