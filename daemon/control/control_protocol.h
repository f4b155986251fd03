// The control protocol of dilocod (DESIGN.md §4): requests and replies are wire Envelopes whose
// body is a ControlMsg {name, request_id, args} (a job spec travels as a JobSpec body). A daemon
// serves them on
//   <control_socket>   the local CLI: an AF_UNIX stream socket (net/local_socket.h: a cap on a
//                      whole request, checked from its length prefix; bounded connections), mode
//                      0660, so only local users of the daemon's group reach it; and
//   tcp://...          other daemons: a ZeroMQ ROUTER, CURVE with the ZAP allowlist of the peers'
//                      keys (a daemon calling a peer uses a DEALER).
// Both run every message through the same envelope checks (ControlParseOptions).
// Replies carry args {"ok": "1"} or {"error": "what went wrong; what to do"}, plus e.g.
// {"json": "<json text>"}.
//
// Commands over ipc (the CLI): ping, submit {config_yaml, source, base_dir, overrides}, list,
// status [job], stop job, logs job [tail], run_dir job.
// Between daemons (tcp): JobSpec (start this job's roles placed on you), peer_status job,
// peer_stop job, peer_logs job.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "daemon/net/context.h"
#include "daemon/net/envelope.h"
#include "daemon/net/socket.h"
#include "daemon/util/status.h"

namespace diloco {

using ControlArgs = std::map<std::string, std::string>;

// The envelope job id of requests that concern no job.
inline constexpr const char* kNoJob = "-";

struct ControlTarget {
  std::string endpoint;                  // ipc://PATH or tcp://HOST:PORT
  std::string sender = "dilococtl";      // the envelope's sender (a site name between daemons)
  std::optional<net::CurveOptions> curve;  // client keys + the server's public key
  int timeout_ms = 5000;                 // for the whole exchange
};

// Sends request (a ControlMsg or JobSpecMsg body) for job_id and waits for the reply's args.
// An {"error": ...} reply becomes an error Status with that text; no reply in time: an error
// naming the endpoint.
Status CallControl(net::NetContext& context, const ControlTarget& target, const std::string& job_id,
                   const MessageBody& request, ControlArgs* reply);
// The same for a ControlMsg named name with args.
Status CallControl(net::NetContext& context, const ControlTarget& target, const std::string& name,
                   const std::string& job_id, const ControlArgs& args, ControlArgs* reply);

// The same over the local control socket at socket_path (what dilococtl does): one connection,
// one request, its reply within timeout_ms.
Status CallControlLocal(const std::string& socket_path, const std::string& sender, const std::string& job_id,
                        const MessageBody& request, int timeout_ms, ControlArgs* reply);

// The request envelope for job_id (request_id goes into a ControlMsg body) and the request's name
// ("job_spec" for a JobSpec), as CallControl sends it.
Status BuildControlRequest(const std::string& sender, const std::string& job_id, const MessageBody& request,
                           uint64_t request_id, net::Message* out, std::string* name);

ControlMsg MakeControl(const std::string& name, const ControlArgs& args, uint64_t request_id = 0);
ControlArgs ArgsOf(const ControlMsg& msg);

// Parse limits for control traffic (no payloads; any job id; Control and JobSpec bodies).
ParseOptions ControlParseOptions();

// Builds a control reply for request_id into a sendable message.
Status BuildControlReply(const std::string& sender, const std::string& job_id, const std::string& name,
                         uint64_t request_id, const ControlArgs& args, net::Message* out);

}  // namespace diloco
