// The messages of a virtual run: learner i <-> each syncer shard (sync.syncers, shards.h) over
// VirtualLinks (one each way per learner, from timing.link or learners[i].link), delivered as
// scheduler events. What travels is the real envelope's frames (the receivers parse and check
// them as a socket's validator would); the learner's PUB streams and DEALER share its uplink, the
// shards' PUB and ROUTER replies its downlink. A learner that is down receives nothing
// (Disconnect), nor does a shard that is down (SyncerDown); what was on its way to either is lost
// with the process's connections. What a shard sent before it died still arrives (it had left
// the process).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/net/socket.h"
#include "daemon/virt/scheduler.h"
#include "daemon/virt/virtual_link.h"

namespace diloco {

struct VirtualReceivers {
  // Scheduler thread, at the arrival time.
  std::function<void(int shard, int learner, const std::string& topic, net::Message&& m)> syncer_uplink;
  std::function<void(int shard, int learner, net::Message&& m)> syncer_router;
  std::function<void(int learner, net::Message&& m)> learner_downlink;
  std::function<void(int learner, net::Message&& m)> learner_dealer;
};

// The receivers of a world of syncer shards and learners by incarnation (VirtualWorld,
// TimedWorld): shard s's sockets go to (*shards)[s], a learner's to its latest incarnation. Both
// are read at delivery time, so they may be filled after the network is made.
template <class Syncer, class Learner>
VirtualReceivers ReceiversOf(const std::vector<std::unique_ptr<Syncer>>* shards,
                             const std::vector<std::vector<std::unique_ptr<Learner>>>* incarnations) {
  VirtualReceivers r;
  r.syncer_uplink = [shards](int s, int i, const std::string& topic, net::Message&& m) {
    (*shards)[s]->OnUplink(i, topic, std::move(m));
  };
  r.syncer_router = [shards](int s, int i, net::Message&& m) { (*shards)[s]->OnRequest(i, std::move(m)); };
  r.learner_downlink = [incarnations](int i, net::Message&& m) {
    (*incarnations)[i].back()->DeliverDownlink(std::move(m));
  };
  r.learner_dealer = [incarnations](int i, net::Message&& m) {
    (*incarnations)[i].back()->DeliverDealer(std::move(m));
  };
  return r;
}

class VirtualNetwork {
 public:
  VirtualNetwork(VirtualScheduler& scheduler, const RunConfig& config, VirtualReceivers receivers);

  // Sent at the scheduler's current time to shard (kEveryShard: a copy to each, as a PUB sends
  // one to each subscriber). charged_bytes > 0: the link carries that many bytes instead of the
  // message's own (`dilococtl simulate`: a tiny model's Delta timed as the real model's).
  static constexpr int kEveryShard = -1;
  void LearnerPublish(int learner, int shard, const std::string& topic, net::Message&& m, size_t charged_bytes = 0);
  void LearnerRequest(int learner, int shard, net::Message&& m);
  // Sent by shard at t_ns (its own time: later than now while a merge keeps it busy).
  void SyncerPublish(int shard, int64_t t_ns, const net::Message& m, size_t charged_bytes = 0);  // every learner up
  void SyncerReply(int shard, int64_t t_ns, int learner, net::Message&& m);

  // A learner killed: nothing reaches it, and what it sent before is lost with its connections
  // (messages in flight to or from it are dropped on arrival). Reconnect: its next incarnation.
  void Disconnect(int learner);
  void Reconnect(int learner);
  void SetCut(int learner, bool cut);  // a partition: both directions lose everything
  // Shard s's process died / its next incarnation listens (VirtualWorld::KillSyncerAt).
  void SyncerDown(int shard);
  void SyncerUp(int shard);
  bool syncer_up(int shard) const { return syncer_up_[shard]; }
  int shards() const { return (int)syncer_up_.size(); }
  // Every link duplicates and reorders (virtual_link.h), each from its own seed drawn from seed.
  void SetFaults(const LinkFaults& faults, uint64_t seed);

  // Every link counts its payload bytes (the messages charged a size) per window of window_ns
  // (VirtualLink::PeakGbps).
  void CountWindows(int64_t window_ns);
  // Shard s's host NIC (timing.syncer_gbps), into and out of it: what every learner sends it and
  // what it sends every learner passes through them, one message after the other.
  const VirtualLink& shard_ingress(int shard) const { return *shard_in_[shard]; }
  const VirtualLink& shard_egress(int shard) const { return *shard_out_[shard]; }

  int learners() const { return (int)up_.size(); }
  const VirtualLink& uplink(int learner) const { return *uplinks_[learner]; }
  const VirtualLink& downlink(int learner) const { return *downlinks_[learner]; }

 private:
  VirtualScheduler& scheduler_;
  VirtualReceivers receivers_;
  std::vector<std::unique_ptr<VirtualLink>> uplinks_, downlinks_;
  std::vector<std::unique_ptr<VirtualLink>> shard_in_, shard_out_;  // per shard: its host's NIC
  bool nic_limited_ = false;  // timing.syncer_gbps > 0: the NICs take time (else they only count)
  std::vector<bool> up_;
  std::vector<uint64_t> epoch_;  // per learner: its connections' generation
  std::vector<bool> syncer_up_;          // per shard
  std::vector<uint64_t> syncer_epoch_;   // per shard: its connections' generation

  // Sends m on link at t_ns; at each arrival (none when lost, two when duplicated), deliver gets
  // it if the learner's connections are still the ones it was sent on, and (to_shard >= 0) that
  // shard's too, once it has passed the shard's NIC.
  void Carry(VirtualLink& link, int64_t t_ns, size_t bytes, bool payload, int learner, int to_shard,
             net::Message&& m, std::function<void(net::Message&&)> deliver);
  void PublishToShard(int learner, int shard, const std::string& topic, net::Message&& m, size_t charged_bytes);
  // A message for shard that arrived at its host at now: through its NIC, then deliver.
  void ThroughIngress(int shard, size_t bytes, bool payload, std::function<void()> deliver);
  // A message shard hands its NIC at t_ns: when it leaves the host.
  int64_t ThroughEgress(int shard, int64_t t_ns, size_t bytes, bool payload);
};

// A copy of m's frames (a PUB delivers one message to each subscriber).
net::Message CopyMessage(const net::Message& m);

}  // namespace diloco
