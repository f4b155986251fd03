// Where one syncer shard listens (shards.h): the three sockets it binds and learners connect to.
// A run with S shards has S of these, indexed by shard.
#pragma once

#include <string>
#include <vector>

namespace diloco {

struct SyncerEndpoints {
  std::string uplink;    // SUB: learners' PUB connect here (Delta, Heartbeat)
  std::string downlink;  // PUB: learners' SUB connect here (Global, SyncerStatus)
  std::string snapshot;  // ROUTER: learners' DEALER connect here (Hello, SnapshotRequest)
  // With CURVE: this shard's public key (z85), which the learners check it by; empty: the
  // server key of the learner's own CurveOptions (one syncer, or every shard on one site).
  std::string curve_server_key;
};

// "uplink U, downlink D, snapshot S": the endpoints in an error message.
inline std::string DescribeEndpoints(const SyncerEndpoints& e) {
  return "uplink " + e.uplink + ", downlink " + e.downlink + ", snapshot " + e.snapshot;
}

}  // namespace diloco
