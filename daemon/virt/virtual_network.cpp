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
}

void VirtualNetwork::SyncerDown() {
  syncer_up_ = false;
  syncer_epoch_++;
}

void VirtualNetwork::SyncerUp() {
  syncer_up_ = true;
  syncer_epoch_++;
}

void VirtualNetwork::SetFaults(const LinkFaults& faults, uint64_t seed) {
  for (size_t i = 0; i < uplinks_.size(); i++) {
    uplinks_[i]->SetFaults(faults, mix_seed(seed, 2 * i + 1, 0xfa17));
    downlinks_[i]->SetFaults(faults, mix_seed(seed, 2 * i + 2, 0xfa17));
  }
}

void VirtualNetwork::Carry(VirtualLink& link, int64_t t_ns, size_t bytes, bool payload, int learner, bool to_syncer,
                           net::Message&& m, std::function<void(net::Message&&)> deliver) {
  const auto at = link.Send(t_ns, bytes, payload);
  if (!at) return;
  const uint64_t syncer_epoch = to_syncer ? syncer_epoch_ : 0;
  auto arrive = [this, learner, to_syncer, epoch = epoch_[learner], syncer_epoch, deliver](
                    const std::shared_ptr<net::Message>& msg) {
    return [this, learner, to_syncer, epoch, syncer_epoch, deliver, msg] {
      if (epoch == epoch_[learner] && (!to_syncer || syncer_epoch == syncer_epoch_)) deliver(std::move(*msg));
    };
  };
  if (const auto copy = link.duplicate_ns()) scheduler_.At(*copy, arrive(std::make_shared<net::Message>(CopyMessage(m))));
  scheduler_.At(*at, arrive(std::make_shared<net::Message>(std::move(m))));
}

void VirtualNetwork::LearnerPublish(int learner, const std::string& topic, net::Message&& m, size_t charged_bytes) {
  if (!syncer_up_) return;  // nobody listens: the PUB drops it
  const size_t bytes = charged_bytes > 0 ? charged_bytes : m.bytes() + topic.size();
  Carry(*uplinks_[learner], scheduler_.now_ns(), bytes, charged_bytes > 0, learner, true, std::move(m),
        [this, learner, topic](net::Message&& msg) { receivers_.syncer_uplink(learner, topic, std::move(msg)); });
}

void VirtualNetwork::LearnerRequest(int learner, net::Message&& m) {
  if (!syncer_up_) return;
  const size_t bytes = m.bytes();
  Carry(*uplinks_[learner], scheduler_.now_ns(), bytes, false, learner, true, std::move(m),
        [this, learner](net::Message&& msg) { receivers_.syncer_router(learner, std::move(msg)); });
}

void VirtualNetwork::SyncerPublish(int64_t t_ns, const net::Message& m, size_t charged_bytes) {
  for (int i = 0; i < learners(); i++) {
    if (!up_[i]) continue;
    Carry(*downlinks_[i], t_ns, charged_bytes > 0 ? charged_bytes : m.bytes(), charged_bytes > 0, i, false, CopyMessage(m),
          [this, i](net::Message&& msg) { receivers_.learner_downlink(i, std::move(msg)); });
  }
}

void VirtualNetwork::SyncerReply(int64_t t_ns, int learner, net::Message&& m) {
  if (!up_[learner]) return;
  const size_t bytes = m.bytes();
  Carry(*downlinks_[learner], t_ns, bytes, false, learner, false, std::move(m),
        [this, learner](net::Message&& msg) { receivers_.learner_dealer(learner, std::move(msg)); });
}

}  // namespace diloco
