#include "apps/dilococtl/model_arg.h"

#include <filesystem>

#include "daemon/control/client.h"
#include "daemon/control/job_store.h"

namespace diloco {
namespace {
namespace fs = std::filesystem;

// The job's training steps as its status reports them: the summary's (a completed job), else
// every learner's step when all of them report one.
std::optional<uint64_t> StatusSteps(const nlohmann::json& status) {
  if (status.contains("summary") && status["summary"].is_object()) {
    const auto it = status["summary"].find("steps");
    if (it != status["summary"].end() && it->is_number_unsigned()) return it->get<uint64_t>();
  }
  const auto learners = status.value("learners", nlohmann::json::array());
  if (!learners.is_array() || learners.empty()) return std::nullopt;
  uint64_t sum = 0;
  for (const auto& l : learners) {
    if (l.contains("result") && l["result"].is_object() && l["result"].value("steps", -1L) >= 0)
      sum += l["result"].value("steps", 0L);
    else if (l.contains("progress") && l["progress"].is_object() && l["progress"].value("step", -1L) >= 0)
      sum += l["progress"].value("step", 0L);
    else
      return std::nullopt;
  }
  return sum;
}

}  // namespace

Status ResolveModelArgument(const std::string& arg, const DaemonRef& daemon, ModelArgument* out, bool* usage) {
  *usage = false;
  ModelArgument m;
  std::error_code ec;
  if (fs::exists(arg, ec) || !IsJobId(arg) || arg.find('/') != std::string::npos) {
    m.path = arg;  // OpenModelSource names a missing path
    *out = std::move(m);
    return Status::Ok();
  }
  std::string socket;
  if (Status st = ResolveControlSocket(daemon.config, daemon.socket, &socket); !st.ok())
    return Status::Error("'" + arg + "' is not a file or directory here, and there is no local dilocod to ask for a job of that id (" +
                         st.message() + "): pass a checkpoint file, a run directory, or a job id with --daemon/--socket");
  ControlArgs reply;
  Status st = CallDaemon(socket, "status", arg, {}, &reply);
  nlohmann::json status;
  if (st.ok()) status = nlohmann::json::parse(reply["json"], nullptr, false);
  if (!st.ok()) {
    *usage = reply.count("usage") || st.message().find("unknown job") != std::string::npos;
    return Status::Error("'" + arg + "' is not a file or directory here; as a job: " + st.message());
  }
  if (status.is_discarded() || !status.is_object()) return Status::Error("job " + arg + ": bad status reply from the daemon");
  m.path = status.value("run_dir", "");
  m.from_job = true;
  m.syncer_site = status.value("syncer_site", "?");
  m.options.job_id = arg;
  m.options.training_steps_hint = StatusSteps(status);
  if (m.path.empty()) return Status::Error("job " + arg + " has no run directory on this site (its status names none)");
  *out = std::move(m);
  return Status::Ok();
}

Status OpenModelArgument(const ModelArgument& arg, ModelSource* out) {
  Status st = OpenModelSource(arg.path, arg.options, out);
  if (!st.ok() && arg.from_job)
    return st.WithContext("job " + arg.options.job_id + " (its merged model is on the syncer's site, " +
                          arg.syncer_site + ": run this there)");
  return st;
}

}  // namespace diloco
