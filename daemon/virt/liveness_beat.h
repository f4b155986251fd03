// The liveness stream's beat of a virtual learner (the wall runtime's liveness thread sends it):
// the core's latest heartbeat, again, on LivenessTopic(job), numbered on its own stream.
#pragma once

#include <cstdint>
#include <string>

#include "daemon/net/envelope.h"
#include "daemon/net/socket.h"
#include "daemon/net/wire_transport.h"

namespace diloco {

inline Status BuildLivenessBeat(const std::string& job_id, const std::string& sender, uint64_t seq,
                                uint64_t incarnation, int64_t unix_ms, const HeartbeatMsg& hb, net::Message* out) {
  EnvelopeHeader h;
  h.job_id = job_id;
  h.sender = sender;
  h.seq = seq;
  h.incarnation = incarnation;
  h.sent_unix_ms = (uint64_t)unix_ms;
  OutgoingMessage om;
  DL_RETURN_IF_ERROR(BuildMessage(h, hb, {}, &om));
  *out = net::ToMessage(std::move(om), nullptr);
  return Status::Ok();
}

}  // namespace diloco
