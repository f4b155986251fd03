// The home shard's end of a sharded dilocod job (shards.h): the other shards' final fragments,
// asked for over their snapshot endpoints as a joining learner asks (SnapshotRequest -> one
// Snapshot part per fragment, each checked against its CRC32C), so the home evaluates and saves
// the joined model. Each other shard answers only once it has merged its last deltas (its
// SyncerCore says final), and waits for the ask a while (SyncerOptions::serve_home_ms).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "daemon/net/context.h"
#include "daemon/net/socket.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/shards.h"
#include "daemon/sync/syncer_endpoints.h"
#include "daemon/util/status.h"

namespace diloco {

struct ShardFetchOptions {
  std::string job_id;
  std::vector<SyncerEndpoints> syncers;  // every shard's (index = shard); each has its key with CURVE
  bool allow_plaintext = false;
  std::optional<net::CurveOptions> curve;  // the home site's key pair (client)
  uint64_t model_params = 0;
  int retry_ms = 3000;     // a shard that has not answered whole is asked again
  int timeout_ms = 180000;  // then the fetch fails, naming the shard
};

// Fills each other shard's fragments of flat (the model's parameters, scattered) and versions
// (per fragment; the home's own are left as they are).
Status FetchShardFragments(net::NetContext& context, const ShardFetchOptions& options,
                           const std::vector<Fragment>& fragments, const ShardMap& shards, float* flat,
                           std::vector<uint64_t>* versions);

}  // namespace diloco
