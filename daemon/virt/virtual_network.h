// The messages of a virtual run: learner i <-> syncer over VirtualLinks (one each way, from
// timing.link or learners[i].link), delivered as scheduler events. What travels is the real
// envelope's frames (the receivers parse and check them as a socket's validator would); the
// learner's PUB streams and DEALER share its uplink, the syncer's PUB and ROUTER replies its
// downlink. A learner that is down receives nothing (Disconnect), nor does a syncer that is down
// (SyncerDown); what was on its way to either is lost with the process's connections. What a
// syncer sent before it died still arrives (it had left the process).
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
  std::function<void(int learner, const std::string& topic, net::Message&& m)> syncer_uplink;
  std::function<void(int learner, net::Message&& m)> syncer_router;
  std::function<void(int learner, net::Message&& m)> learner_downlink;
  std::function<void(int learner, net::Message&& m)> learner_dealer;
};

// The receivers of a world of one syncer and learners by incarnation (VirtualWorld, TimedWorld):
// the syncer's sockets go to *syncer, a learner's to its latest incarnation. Both are read at
// delivery time, so they may be filled after the network is made.
template <class Syncer, class Learner>
VirtualReceivers ReceiversOf(const std::unique_ptr<Syncer>* syncer,
                             const std::vector<std::vector<std::unique_ptr<Learner>>>* incarnations) {
  VirtualReceivers r;
  r.syncer_uplink = [syncer](int i, const std::string& topic, net::Message&& m) {
    (*syncer)->OnUplink(i, topic, std::move(m));
  };
  r.syncer_router = [syncer](int i, net::Message&& m) { (*syncer)->OnRequest(i, std::move(m)); };
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

  // Sent at the scheduler's current time. charged_bytes > 0: the link carries that many bytes
  // instead of the message's own (`dilococtl simulate`: a tiny model's Delta timed as the real
  // model's).
  void LearnerPublish(int learner, const std::string& topic, net::Message&& m, size_t charged_bytes = 0);
  void LearnerRequest(int learner, net::Message&& m);
  // Sent at t_ns (the syncer's own time: later than now while a merge keeps it busy).
  void SyncerPublish(int64_t t_ns, const net::Message& m, size_t charged_bytes = 0);  // to every learner that is up
  void SyncerReply(int64_t t_ns, int learner, net::Message&& m);

  // A learner killed: nothing reaches it, and what it sent before is lost with its connections
  // (messages in flight to or from it are dropped on arrival). Reconnect: its next incarnation.
  void Disconnect(int learner);
  void Reconnect(int learner);
  void SetCut(int learner, bool cut);  // a partition: both directions lose everything
  // The syncer process died / its next incarnation listens (VirtualWorld::KillSyncerAt).
  void SyncerDown();
  void SyncerUp();
  bool syncer_up() const { return syncer_up_; }
  // Every link duplicates and reorders (virtual_link.h), each from its own seed drawn from seed.
  void SetFaults(const LinkFaults& faults, uint64_t seed);

  // Every link counts its payload bytes (the messages charged a size) per window of window_ns
  // (VirtualLink::PeakGbps).
  void CountWindows(int64_t window_ns);

  int learners() const { return (int)up_.size(); }
  const VirtualLink& uplink(int learner) const { return *uplinks_[learner]; }
  const VirtualLink& downlink(int learner) const { return *downlinks_[learner]; }

 private:
  VirtualScheduler& scheduler_;
  VirtualReceivers receivers_;
  std::vector<std::unique_ptr<VirtualLink>> uplinks_, downlinks_;
  std::vector<bool> up_;
  std::vector<uint64_t> epoch_;  // per learner: its connections' generation
  bool syncer_up_ = true;
  uint64_t syncer_epoch_ = 0;  // the syncer's connections' generation

  // Sends m on link at t_ns; at each arrival (none when lost, two when duplicated), deliver gets
  // it if the learner's connections are still the ones it was sent on, and (to_syncer) the
  // syncer's too.
  void Carry(VirtualLink& link, int64_t t_ns, size_t bytes, bool payload, int learner, bool to_syncer,
             net::Message&& m, std::function<void(net::Message&&)> deliver);
};

// A copy of m's frames (a PUB delivers one message to each subscriber).
net::Message CopyMessage(const net::Message& m);

}  // namespace diloco
