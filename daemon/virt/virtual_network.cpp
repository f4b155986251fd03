#include "daemon/virt/virtual_network.h"

#include <utility>

#include "kernels/rng.h"

namespace diloco {

net::Message CopyMessage(const net::Message& m) {
  net::Message copy;
  for (size_t i = 0; i < m.size(); i++) {
    const std::span<const uint8_t> f = m.frame(i);
    copy.AddCopy(f.data(), f.size());
  }
  return copy;
}

VirtualNetwork::VirtualNetwork(VirtualScheduler& scheduler, const RunConfig& config, VirtualReceivers receivers)
    : scheduler_(scheduler), receivers_(std::move(receivers)) {
  const int M = config.sync.learners;
  for (int i = 0; i < M; i++) {
    const LearnerConfig lc = LearnerConfigOf(config.learners, i);
    const LinkConfig& link = lc.has_link ? lc.link : config.timing.link;
    uplinks_.push_back(std::make_unique<VirtualLink>(link, mix_seed(config.timing.seed, 2 * i + 1, 0x11)));
    downlinks_.push_back(std::make_unique<VirtualLink>(link, mix_seed(config.timing.seed, 2 * i + 2, 0x11)));
  }
  up_.assign(M, true);
  epoch_.assign(M, 0);
  syncer_up_.assign(config.sync.syncers, true);
  syncer_epoch_.assign(config.sync.syncers, 0);
  const LinkConfig nic{config.timing.syncer_gbps * 1e3, 0, 0, 0};
  nic_limited_ = config.timing.syncer_gbps > 0;
  for (int s = 0; s < config.sync.syncers; s++) {
    shard_in_.push_back(std::make_unique<VirtualLink>(nic, mix_seed(config.timing.seed, 2 * s + 1, 0x51c)));
    shard_out_.push_back(std::make_unique<VirtualLink>(nic, mix_seed(config.timing.seed, 2 * s + 2, 0x51c)));
  }
}

void VirtualNetwork::Disconnect(int learner) {
  up_[learner] = false;
  epoch_[learner]++;
}

void VirtualNetwork::Reconnect(int learner) {
  up_[learner] = true;
  epoch_[learner]++;
}

void VirtualNetwork::SetCut(int learner, bool cut) {
  uplinks_[learner]->SetCut(cut);
  downlinks_[learner]->SetCut(cut);
}

void VirtualNetwork::CountWindows(int64_t window_ns) {
  for (auto& l : uplinks_) l->CountWindows(window_ns);
  for (auto& l : downlinks_) l->CountWindows(window_ns);
  for (auto& l : shard_in_) l->CountWindows(window_ns);
  for (auto& l : shard_out_) l->CountWindows(window_ns);
}

void VirtualNetwork::ThroughIngress(int shard, size_t bytes, bool payload, std::function<void()> deliver) {
  const int64_t at = *shard_in_[shard]->Send(scheduler_.now_ns(), bytes, payload);  // a NIC loses nothing
  if (!nic_limited_) return deliver();
  scheduler_.At(at, [this, shard, epoch = syncer_epoch_[shard], deliver = std::move(deliver)] {
    if (epoch == syncer_epoch_[shard]) deliver();
  });
}

int64_t VirtualNetwork::ThroughEgress(int shard, int64_t t_ns, size_t bytes, bool payload) {
  const int64_t out = *shard_out_[shard]->Send(t_ns, bytes, payload);  // a NIC loses nothing
  return nic_limited_ ? out : t_ns;
}

void VirtualNetwork::SyncerDown(int shard) {
  syncer_up_[shard] = false;
  syncer_epoch_[shard]++;
}

void VirtualNetwork::SyncerUp(int shard) {
  syncer_up_[shard] = true;
  syncer_epoch_[shard]++;
}

void VirtualNetwork::SetFaults(const LinkFaults& faults, uint64_t seed) {
  for (size_t i = 0; i < uplinks_.size(); i++) {
    uplinks_[i]->SetFaults(faults, mix_seed(seed, 2 * i + 1, 0xfa17));
    downlinks_[i]->SetFaults(faults, mix_seed(seed, 2 * i + 2, 0xfa17));
  }
}

void VirtualNetwork::Carry(VirtualLink& link, int64_t t_ns, size_t bytes, bool payload, int learner, int to_shard,
                           net::Message&& m, std::function<void(net::Message&&)> deliver) {
  const auto at = link.Send(t_ns, bytes, payload);
  if (!at) return;
  const uint64_t syncer_epoch = to_shard >= 0 ? syncer_epoch_[to_shard] : 0;
  auto arrive = [this, learner, to_shard, bytes, payload, epoch = epoch_[learner], syncer_epoch, deliver](
                    const std::shared_ptr<net::Message>& msg) {
    return [this, learner, to_shard, bytes, payload, epoch, syncer_epoch, deliver, msg] {
      if (epoch != epoch_[learner]) return;
      if (to_shard < 0) return deliver(std::move(*msg));
      if (syncer_epoch == syncer_epoch_[to_shard])
        ThroughIngress(to_shard, bytes, payload, [deliver, msg] { deliver(std::move(*msg)); });
    };
  };
  if (const auto copy = link.duplicate_ns()) scheduler_.At(*copy, arrive(std::make_shared<net::Message>(CopyMessage(m))));
  scheduler_.At(*at, arrive(std::make_shared<net::Message>(std::move(m))));
}

void VirtualNetwork::LearnerPublish(int learner, int shard, const std::string& topic, net::Message&& m,
                                    size_t charged_bytes) {
  if (shard != kEveryShard) return PublishToShard(learner, shard, topic, std::move(m), charged_bytes);
  for (int s = 0; s + 1 < shards(); s++) PublishToShard(learner, s, topic, CopyMessage(m), charged_bytes);
  PublishToShard(learner, shards() - 1, topic, std::move(m), charged_bytes);
}

void VirtualNetwork::PublishToShard(int learner, int shard, const std::string& topic, net::Message&& m,
                                    size_t charged_bytes) {
  if (!syncer_up_[shard]) return;  // nobody listens: the PUB drops it
  const size_t bytes = charged_bytes > 0 ? charged_bytes : m.bytes() + topic.size();
  const bool payload = charged_bytes > 0;
  Carry(*uplinks_[learner], scheduler_.now_ns(), bytes, payload, learner, shard, std::move(m),
        [this, shard, learner, topic](net::Message&& msg) {
          receivers_.syncer_uplink(shard, learner, topic, std::move(msg));
        });
}

void VirtualNetwork::LearnerRequest(int learner, int shard, net::Message&& m) {
  if (!syncer_up_[shard]) return;
  const size_t bytes = m.bytes();
  Carry(*uplinks_[learner], scheduler_.now_ns(), bytes, false, learner, shard, std::move(m),
        [this, shard, learner](net::Message&& msg) { receivers_.syncer_router(shard, learner, std::move(msg)); });
}

// A copy to each learner (a PUB over TCP sends one per subscriber), each through the shard's NIC
// and then the learner's downlink.
void VirtualNetwork::SyncerPublish(int shard, int64_t t_ns, const net::Message& m, size_t charged_bytes) {
  const size_t bytes = charged_bytes > 0 ? charged_bytes : m.bytes();
  for (int i = 0; i < learners(); i++) {
    if (!up_[i]) continue;
    Carry(*downlinks_[i], ThroughEgress(shard, t_ns, bytes, charged_bytes > 0), bytes, charged_bytes > 0, i, -1,
          CopyMessage(m),
          [this, i](net::Message&& msg) { receivers_.learner_downlink(i, std::move(msg)); });
  }
}

void VirtualNetwork::SyncerReply(int shard, int64_t t_ns, int learner, net::Message&& m) {
  if (!up_[learner]) return;
  const size_t bytes = m.bytes();
  Carry(*downlinks_[learner], ThroughEgress(shard, t_ns, bytes, false), bytes, false, learner, -1, std::move(m),
        [this, learner](net::Message&& msg) { receivers_.learner_dealer(learner, std::move(msg)); });
}

}  // namespace diloco
