#include "daemon/control/client.h"

#include <cstdlib>
#include <filesystem>

#include "daemon/config/daemon_config.h"

namespace diloco {

Status ResolveControlSocket(const std::string& daemon_config, const std::string& socket_path, std::string* out) {
  if (!socket_path.empty()) {
    *out = socket_path;
    return Status::Ok();
  }
  std::string path = daemon_config;
  if (path.empty()) {
    const char* env = std::getenv("DILOCOD_CONFIG");
    path = env && *env ? env : kDefaultDaemonConfig;
  }
  DaemonConfig config;
  Status st = LoadDaemonConfig(path, &config);
  if (!st.ok()) {
    return Status::Error(st.message() + " (name the local daemon with --daemon CONFIG, $DILOCOD_CONFIG or "
                                        "--socket PATH)");
  }
  *out = config.control_socket;
  return Status::Ok();
}

Status CallDaemon(const std::string& socket_path, const std::string& name, const std::string& job_id,
                  const ControlArgs& args, ControlArgs* reply, int timeout_ms) {
  std::error_code ec;
  if (!std::filesystem::exists(socket_path, ec)) {
    return Status::Error("no dilocod control socket at " + socket_path +
                         ": is the daemon running? (start it with `dilocod --config FILE`)");
  }
  return CallControlLocal(socket_path, "dilococtl", job_id, MessageBody(MakeControl(name, args)), timeout_ms, reply);
}

Status CallDaemonJson(const std::string& socket_path, const std::string& name, const std::string& job_id,
                      const ControlArgs& args, nlohmann::json* out, int timeout_ms) {
  ControlArgs reply;
  DL_RETURN_IF_ERROR(CallDaemon(socket_path, name, job_id, args, &reply, timeout_ms));
  auto it = reply.find("json");
  if (it == reply.end()) return Status::Error("the daemon's reply to '" + name + "' has no json");
  *out = nlohmann::json::parse(it->second, nullptr, false);
  if (out->is_discarded()) return Status::Error("the daemon's reply to '" + name + "' is not JSON");
  return Status::Ok();
}

}  // namespace diloco
