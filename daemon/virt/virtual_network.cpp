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

void VirtualNetwork::LearnerPublish(int learner, const std::string& topic, net::Message&& m, size_t charged_bytes) {
  const auto at = uplinks_[learner]->Send(scheduler_.now_ns(), charged_bytes > 0 ? charged_bytes : m.bytes() + topic.size(),
                                         charged_bytes > 0);
  if (!at) return;
  auto msg = std::make_shared<net::Message>(std::move(m));
  scheduler_.At(*at, [this, learner, topic, msg, epoch = epoch_[learner]] {
    if (epoch == epoch_[learner]) receivers_.syncer_uplink(learner, topic, std::move(*msg));
  });
}

void VirtualNetwork::LearnerRequest(int learner, net::Message&& m) {
  const auto at = uplinks_[learner]->Send(scheduler_.now_ns(), m.bytes());
  if (!at) return;
  auto msg = std::make_shared<net::Message>(std::move(m));
  scheduler_.At(*at, [this, learner, msg, epoch = epoch_[learner]] {
    if (epoch == epoch_[learner]) receivers_.syncer_router(learner, std::move(*msg));
  });
}

void VirtualNetwork::SyncerPublish(int64_t t_ns, const net::Message& m, size_t charged_bytes) {
  for (int i = 0; i < learners(); i++) {
    if (!up_[i]) continue;
    const auto at = downlinks_[i]->Send(t_ns, charged_bytes > 0 ? charged_bytes : m.bytes(), charged_bytes > 0);
    if (!at) continue;
    auto msg = std::make_shared<net::Message>(CopyMessage(m));
    scheduler_.At(*at, [this, i, msg, epoch = epoch_[i]] {
      if (epoch == epoch_[i]) receivers_.learner_downlink(i, std::move(*msg));
    });
  }
}

void VirtualNetwork::SyncerReply(int64_t t_ns, int learner, net::Message&& m) {
  if (!up_[learner]) return;
  const auto at = downlinks_[learner]->Send(t_ns, m.bytes());
  if (!at) return;
  auto msg = std::make_shared<net::Message>(std::move(m));
  scheduler_.At(*at, [this, learner, msg, epoch = epoch_[learner]] {
    if (epoch == epoch_[learner]) receivers_.learner_dealer(learner, std::move(*msg));
  });
}

}  // namespace diloco
