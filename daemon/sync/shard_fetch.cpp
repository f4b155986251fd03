#include "daemon/sync/shard_fetch.h"

#include <chrono>
#include <cmath>
#include <random>

#include "daemon/net/channel.h"
#include "daemon/net/envelope.h"
#include "daemon/net/wire_transport.h"
#include "daemon/sync/protocol.h"
#include "daemon/util/crc32c.h"
#include "daemon/util/unix_time.h"

namespace diloco {
namespace {

using Clock = std::chrono::steady_clock;

// One shard's answer, asked again every retry_ms until whole.
class ShardAsker {
 public:
  ShardAsker(const ShardFetchOptions& o, const ShardMap& shards, int shard)
      : o_(o), shards_(shards), shard_(shard), me_(shards.NameOf(0)), incarnation_(std::random_device{}()) {}

  Status Connect(net::NetContext& context) {
    ParseOptions expect;
    expect.job_id = o_.job_id;
    expect.accept = MessageBit(MessageType::kSnapshot);
    expect.allowed_senders = {shards_.NameOf(shard_)};
    expect.model_params = o_.model_params;
    net::ReceiveOptions ro;
    ro.validator = net::EnvelopeValidator(expect, parsed_);
    ro.track_sequence = false;
    net::SocketOptions so;
    so.name = me_ + ".fetch@" + shards_.NameOf(shard_);
    so.allow_plaintext = o_.allow_plaintext;
    so.linger_ms = 0;
    so.recv_hwm_msgs = 100000;
    if (o_.curve) {
      so.curve = o_.curve;
      so.curve->server = false;
      if (!o_.syncers[shard_].curve_server_key.empty()) so.curve->server_public_key_z85 = o_.syncers[shard_].curve_server_key;
    }
    DL_RETURN_IF_ERROR(net::DealerChannel::Create(context, so, ro, &dealer_));
    return dealer_->Connect(o_.syncers[shard_].snapshot).WithContext(so.name);
  }

  Status AskIfDue() {
    if (assembler_ && Clock::now() - asked_ < std::chrono::milliseconds(o_.retry_ms)) return Status::Ok();
    SnapshotRequestMsg rq;
    rq.request_id = ++request_id_;
    rq.reason = "the home shard evaluates the joined model";
    for (uint32_t p : shards_.FragmentsOf(shard_)) rq.fragments.push_back(p);
    EnvelopeHeader h;
    h.job_id = o_.job_id;
    h.sender = me_;
    h.seq = ++seq_;
    h.incarnation = incarnation_;
    h.sent_unix_ms = (uint64_t)UnixMsNow();
    OutgoingMessage om;
    DL_RETURN_IF_ERROR(BuildMessage(h, rq, {}, &om));
    net::Message m = net::ToMessage(std::move(om), nullptr);
    (void)dealer_->Send(m, 0);
    assembler_ = std::make_unique<SnapshotAssembler>(request_id_, o_.model_params * sizeof(float) + (1 << 20));
    asked_ = Clock::now();
    return Status::Ok();
  }

  // Takes what arrived; *whole: every fragment of the shard is in flat.
  Status Receive(const std::vector<Fragment>& fragments, float* flat, std::vector<uint64_t>* versions, bool* whole) {
    net::Received r;
    while (!*whole && dealer_->Receive(&r, 0) == net::RecvResult::kMessage) {
      if (!assembler_ || !assembler_->Add(std::move(*parsed_)).ok() || !assembler_->complete()) continue;
      for (ParsedMessage& part : assembler_->Take()) DL_RETURN_IF_ERROR(Install(part, fragments, flat, versions));
      *whole = true;
    }
    return Status::Ok();
  }

  net::Socket& socket() { return dealer_->socket(); }

 private:
  Status Install(ParsedMessage& part, const std::vector<Fragment>& fragments, float* flat,
                 std::vector<uint64_t>* versions) {
    const SnapshotMsg& sm = *part.get<SnapshotMsg>();
    const std::string who = shards_.NameOf(shard_) + "'s fragment " + std::to_string(sm.fragment);
    if (sm.fragment >= fragments.size() || shards_.OwnerOf(sm.fragment) != shard_)
      return Status::Error(shards_.NameOf(shard_) + " sent fragment " + std::to_string(sm.fragment) +
                           ", which it does not merge; do the sites run the same job config?");
    const Fragment& frag = fragments[sm.fragment];
    DL_RETURN_IF_ERROR(DecodeFragmentPayload(frag, sm.payload, part, &scratch_).WithContext(who));
    if (Crc32c(scratch_.data(), frag.numel * sizeof(float)) != sm.fragment_crc32c)
      return Status::Error(who + " fails its CRC32C");
    for (float x : scratch_)
      if (!std::isfinite(x)) return Status::Error(who + " is not finite");
    ScatterFragment(frag, scratch_.data(), flat);
    (*versions)[sm.fragment] = sm.version;
    return Status::Ok();
  }

  const ShardFetchOptions& o_;
  const ShardMap& shards_;
  const int shard_;
  const std::string me_;
  const uint64_t incarnation_;
  std::shared_ptr<ParsedMessage> parsed_ = std::make_shared<ParsedMessage>();
  std::unique_ptr<net::DealerChannel> dealer_;
  std::unique_ptr<SnapshotAssembler> assembler_;
  Clock::time_point asked_{};
  uint64_t request_id_ = 0, seq_ = 0;
  std::vector<float> scratch_;
};

}  // namespace

Status FetchShardFragments(net::NetContext& context, const ShardFetchOptions& options,
                           const std::vector<Fragment>& fragments, const ShardMap& shards, float* flat,
                           std::vector<uint64_t>* versions) {
  versions->resize(fragments.size(), 0);
  std::vector<std::unique_ptr<ShardAsker>> askers;
  std::vector<int> whom;
  for (int s = 1; s < shards.shards(); s++) {
    askers.push_back(std::make_unique<ShardAsker>(options, shards, s));
    whom.push_back(s);
    DL_RETURN_IF_ERROR(askers.back()->Connect(context));
  }
  std::vector<bool> whole(askers.size(), false);
  std::vector<net::Socket*> sockets;
  for (auto& a : askers) sockets.push_back(&a->socket());
  std::vector<bool> ready;
  const auto give_up = Clock::now() + std::chrono::milliseconds(options.timeout_ms);
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < askers.size(); i++) {
      if (whole[i]) continue;
      all = false;
      DL_RETURN_IF_ERROR(askers[i]->AskIfDue());
    }
    if (all) return Status::Ok();
    if (Clock::now() > give_up) {
      for (size_t i = 0; i < askers.size(); i++)
        if (!whole[i])
          return Status::Error("no final fragments from " + shards.NameOf(whom[i]) + " at " +
                               options.syncers[whom[i]].snapshot + " within " +
                               std::to_string(options.timeout_ms / 1000) +
                               " s: is its site up? (the joined model cannot be evaluated without them)");
    }
    (void)net::PollReadable(sockets, 50, &ready);
    for (size_t i = 0; i < askers.size(); i++) {
      bool w = whole[i];
      DL_RETURN_IF_ERROR(askers[i]->Receive(fragments, flat, versions, &w));
      whole[i] = w;
    }
  }
}

}  // namespace diloco
