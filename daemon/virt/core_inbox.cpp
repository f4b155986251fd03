#include "daemon/virt/core_inbox.h"

namespace diloco {

Status CoreInbox::Drain(LearnerCore& core, const std::function<void(const std::string&)>& note) {
  while (!queue_.empty()) {
    auto [from_dealer, message] = std::move(queue_.front());
    queue_.pop_front();
    ParsedMessage parsed;
    const auto spans = message.spans();
    if (Status st = ParseEnvelope(spans, from_dealer ? dealer_expect_ : down_expect_, &parsed); !st.ok()) {
      note("dropping a message that fails its checks: " + st.message());
      continue;
    }
    if (from_dealer) {
      DL_RETURN_IF_ERROR(core.OnDealer(parsed));
      continue;
    }
    net::Received r;
    r.topic = topic_;
    r.seq = down_seq_.Observe(parsed.header.sender, parsed.header.incarnation, parsed.header.seq);
    if (!r.seq.deliver()) continue;
    r.message = std::move(message);
    DL_RETURN_IF_ERROR(core.OnDownlink(r, parsed));
  }
  return Status::Ok();
}

}  // namespace diloco
