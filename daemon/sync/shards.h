// The syncer as S shards (sync.syncers): each shard is a syncer role of its own that owns a fixed
// set of fragments, merges only those, and keeps its own update log and checkpoint. Learners send
// each fragment's delta to its owner, take each fragment's Globals and snapshot pieces from it,
// and send their heartbeats to every shard (each shard's quorum, grace and staleness rules need
// every learner's liveness).
//
// Which shard owns which fragment is one rule, computed the same way by every role from the
// fragments and S: fragment by fragment, in order, each to the shard holding the fewest bytes so
// far (ties: the lower shard). Bytes stay within one fragment of balanced, and since the
// partition rule makes fragments nearly equal, that is nearly fragment p on shard p mod S: the
// fragments that fire one after the other land on different shards, whose merges then overlap.
//
// Names: one shard is "syncer" (what every run before shards called it); S > 1 are "syncer-<s>".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/sync/fragments.h"
#include "daemon/sync/global_state.h"

namespace diloco {

// Shard shard's name in a run of shards shards. Shard 0 is the job's home: in a dilocod job its
// site keeps the run's metrics and summary and evaluates the joined model.
std::string SyncerShardName(int shard, int shards);
// "syncer" or "syncer-<s>": a syncer role's name.
bool IsSyncerRoleName(const std::string& name);

class ShardMap {
 public:
  // One shard owning fragments fragments.
  explicit ShardMap(size_t fragments = 0) : owner_(fragments, 0), owned_(1) {
    for (size_t p = 0; p < fragments; p++) owned_[0].push_back((uint32_t)p);
  }
  // S shards (1 <= S <= fragments.size(), checked by the run config).
  static ShardMap Of(const std::vector<Fragment>& fragments, int shards);

  int shards() const { return (int)owned_.size(); }
  int OwnerOf(size_t fragment) const { return fragment < owner_.size() ? owner_[fragment] : -1; }
  bool Owns(int shard, size_t fragment) const { return OwnerOf(fragment) == shard; }
  const std::vector<uint32_t>& FragmentsOf(int shard) const { return owned_[shard]; }

  std::string NameOf(int shard) const;
  // The shard named name, or -1.
  int ShardNamed(const std::string& name) const;
  std::vector<std::string> Names() const;

 private:
  std::vector<int> owner_;                   // per fragment
  std::vector<std::vector<uint32_t>> owned_;  // per shard, ascending
};

// The run's global state from its shards' (shard s's state at index s): each fragment from the
// shard that merges it; the counters and every learner's ledger summed over the shards.
GlobalState JoinShardStates(const std::vector<const GlobalState*>& states, const ShardMap& shards);

}  // namespace diloco
