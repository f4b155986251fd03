#include "daemon/sync/shards.h"

#include <algorithm>

#include "daemon/sync/protocol.h"

namespace diloco {

ShardMap ShardMap::Of(const std::vector<Fragment>& fragments, int shards) {
  ShardMap m(fragments.size());
  if (shards <= 1) return m;
  m.owned_.assign(shards, {});
  std::vector<uint64_t> bytes(shards, 0);
  for (size_t p = 0; p < fragments.size(); p++) {
    const int s = (int)(std::min_element(bytes.begin(), bytes.end()) - bytes.begin());
    m.owner_[p] = s;
    bytes[s] += fragments[p].numel;
    m.owned_[s].push_back((uint32_t)p);
  }
  return m;
}

std::string SyncerShardName(int shard, int shards) {
  return shards == 1 ? std::string(kSyncerName) : std::string(kSyncerName) + "-" + std::to_string(shard);
}

bool IsSyncerRoleName(const std::string& name) {
  const std::string prefix = std::string(kSyncerName) + "-";
  if (name == kSyncerName) return true;
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return false;
  return std::all_of(name.begin() + (long)prefix.size(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string ShardMap::NameOf(int shard) const { return SyncerShardName(shard, shards()); }

int ShardMap::ShardNamed(const std::string& name) const {
  for (int s = 0; s < shards(); s++)
    if (NameOf(s) == name) return s;
  return -1;
}

std::vector<std::string> ShardMap::Names() const {
  std::vector<std::string> names;
  for (int s = 0; s < shards(); s++) names.push_back(NameOf(s));
  return names;
}

GlobalState JoinShardStates(const std::vector<const GlobalState*>& states, const ShardMap& shards) {
  GlobalState joined = *states.front();
  if (states.size() == 1) return joined;
  joined.ledger.clear();
  joined.merges = joined.dropped_deltas = joined.rejected_deltas = 0;
  for (size_t p = 0; p < joined.fragments.size(); p++) joined.fragments[p] = states[shards.OwnerOf(p)]->fragments[p];
  for (const GlobalState* st : states) {
    joined.merges += st->merges;
    joined.dropped_deltas += st->dropped_deltas;
    joined.rejected_deltas += st->rejected_deltas;
    for (const LedgerEntry& e : st->ledger) {
      LedgerEntry& j = LedgerFor(&joined, e.learner);
      j.tokens += e.tokens;
      j.steps += e.steps;
      j.merged += e.merged;
      j.dropped += e.dropped;
      j.rejected += e.rejected;
    }
  }
  return joined;
}

}  // namespace diloco
