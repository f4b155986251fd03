// How dilococtl reaches the dilocod of its own site: over the daemon's local control socket
// (control_protocol.h), found from the daemon config (--daemon FILE, $DILOCOD_CONFIG, or
// /etc/dilocod/dilocod.yaml) or given directly (--socket PATH).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "daemon/control/control_protocol.h"
#include "daemon/util/status.h"

namespace diloco {

inline constexpr const char* kDefaultDaemonConfig = "/etc/dilocod/dilocod.yaml";

// The control socket path: socket_path when given, else the control_socket of the daemon config
// (daemon_config when given, else $DILOCOD_CONFIG, else kDefaultDaemonConfig).
Status ResolveControlSocket(const std::string& daemon_config, const std::string& socket_path, std::string* out);

// One request to the daemon at socket_path (its AF_UNIX control socket). A reply {"error": ...}
// becomes an error Status with that text; a daemon that does not answer: an error saying so.
Status CallDaemon(const std::string& socket_path, const std::string& name, const std::string& job_id,
                  const ControlArgs& args, ControlArgs* reply, int timeout_ms = 10000);
// The same, parsing the reply's "json" argument into *out.
Status CallDaemonJson(const std::string& socket_path, const std::string& name, const std::string& job_id,
                      const ControlArgs& args, nlohmann::json* out, int timeout_ms = 10000);

}  // namespace diloco
