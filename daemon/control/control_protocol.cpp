#include "daemon/control/control_protocol.h"

#include <chrono>
#include <random>

#include "daemon/net/channel.h"
#include "daemon/net/local_socket.h"
#include "daemon/net/wire_transport.h"

namespace diloco {
namespace {

uint64_t NowUnixMs() {
  return (uint64_t)std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

uint64_t RandomId() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) | rd();
}

}  // namespace

ControlMsg MakeControl(const std::string& name, const ControlArgs& args, uint64_t request_id) {
  ControlMsg m;
  m.name = name;
  m.request_id = request_id;
  for (const auto& [k, v] : args) m.args.push_back({k, v});
  return m;
}

ControlArgs ArgsOf(const ControlMsg& msg) {
  ControlArgs args;
  for (const KeyValue& kv : msg.args) args[kv.key] = kv.value;
  return args;
}

ParseOptions ControlParseOptions() {
  ParseOptions o;
  o.any_job = true;
  o.accept = MessageBit(MessageType::kControl) | MessageBit(MessageType::kJobSpec);
  o.max_header_bytes = size_t{1} << 20;
  return o;
}

Status BuildControlReply(const std::string& sender, const std::string& job_id, const std::string& name,
                         uint64_t request_id, const ControlArgs& args, net::Message* out) {
  EnvelopeHeader h;
  h.job_id = job_id.empty() ? kNoJob : job_id;
  h.sender = sender;
  h.seq = 1;
  h.incarnation = RandomId();
  h.sent_unix_ms = NowUnixMs();
  OutgoingMessage om;
  DL_RETURN_IF_ERROR(BuildMessage(h, MakeControl(name, args, request_id), {}, &om));
  *out = net::ToMessage(std::move(om), nullptr);
  return Status::Ok();
}

Status BuildControlRequest(const std::string& sender, const std::string& job_id, const MessageBody& request,
                           uint64_t request_id, net::Message* out, std::string* name) {
  MessageBody body = request;
  *name = "job_spec";
  if (auto* c = std::get_if<ControlMsg>(&body)) {
    c->request_id = request_id;
    *name = c->name;
  }
  EnvelopeHeader h;
  h.job_id = job_id.empty() ? kNoJob : job_id;
  h.sender = sender;
  h.seq = 1;
  h.incarnation = request_id;
  h.sent_unix_ms = NowUnixMs();
  OutgoingMessage om;
  DL_RETURN_IF_ERROR(BuildMessage(h, body, {}, &om));
  *out = net::ToMessage(std::move(om), nullptr);
  return Status::Ok();
}

Status CallControlLocal(const std::string& socket_path, const std::string& sender, const std::string& job_id,
                        const MessageBody& request, int timeout_ms, ControlArgs* reply) {
  const uint64_t request_id = RandomId();
  std::string name;
  net::Message m;
  DL_RETURN_IF_ERROR(BuildControlRequest(sender, job_id, request, request_id, &m, &name));
  net::Message answer;
  if (Status st = net::LocalCall(socket_path, m, timeout_ms, &answer); !st.ok()) {
    return Status::Error("no reply from the daemon at " + socket_path + " to '" + name + "': " + st.message());
  }
  // The reply passes the same checks as everything the daemon receives.
  ParsedMessage parsed;
  DL_RETURN_IF_ERROR(
      ParseEnvelope(answer.spans(), ControlParseOptions(), &parsed).WithContext("the reply to '" + name + "' from " + socket_path));
  const ControlMsg* c = parsed.get<ControlMsg>();
  // A JobSpec is answered with request id 0 (the spec has none).
  if (c == nullptr || (c->request_id != request_id && c->request_id != 0)) {
    return Status::Error("the reply to '" + name + "' from " + socket_path + " answers another request");
  }
  *reply = ArgsOf(*c);
  auto e = reply->find("error");
  if (e != reply->end()) return Status::Error(e->second);
  return Status::Ok();
}

Status CallControl(net::NetContext& context, const ControlTarget& target, const std::string& job_id,
                   const MessageBody& request, ControlArgs* reply) {
  auto parsed = std::make_shared<ParsedMessage>();
  net::ReceiveOptions ro;
  ro.validator = net::EnvelopeValidator(ControlParseOptions(), parsed);
  ro.track_sequence = false;
  net::SocketOptions so;
  so.name = "control-client";
  so.linger_ms = 0;
  so.allow_plaintext = !target.curve.has_value();
  so.curve = target.curve;
  so.max_frame_bytes = int64_t{2} << 20;
  std::unique_ptr<net::DealerChannel> dealer;
  DL_RETURN_IF_ERROR(net::DealerChannel::Create(context, so, ro, &dealer));
  DL_RETURN_IF_ERROR(dealer->Connect(target.endpoint));

  const uint64_t request_id = RandomId();
  std::string name;
  net::Message m;
  DL_RETURN_IF_ERROR(BuildControlRequest(target.sender, job_id, request, request_id, &m, &name));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(target.timeout_ms);
  auto timed_out = [&] {
    return Status::Error("no reply from " + target.endpoint + " to '" + name + "' within " +
                         std::to_string(target.timeout_ms) + " ms");
  };
  if (dealer->Send(m, target.timeout_ms) != net::SendResult::kSent) return timed_out();
  net::Received r;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return timed_out();
    if (dealer->Receive(&r, (int)left.count()) != net::RecvResult::kMessage) return timed_out();
    const ControlMsg* c = parsed->get<ControlMsg>();
    // A JobSpec is answered with request id 0 (the spec has none).
    if (c == nullptr || (c->request_id != request_id && c->request_id != 0)) continue;
    *reply = ArgsOf(*c);
    auto e = reply->find("error");
    if (e != reply->end()) return Status::Error(e->second);
    return Status::Ok();
  }
}

Status CallControl(net::NetContext& context, const ControlTarget& target, const std::string& name,
                   const std::string& job_id, const ControlArgs& args, ControlArgs* reply) {
  return CallControl(context, target, job_id, MessageBody(MakeControl(name, args)), reply);
}

}  // namespace diloco
