// dilococtl export: the job's merged model as a safetensors file. The run directory of the
// syncer's site holds the model (global_state.bin + config.yaml); this machine must see it
// (the syncer runs on the local daemon's site, or on the same machine as in the demo).
#include <cstdio>
#include <filesystem>

#include "apps/dilococtl/job_commands.h"
#include "daemon/control/client.h"
#ifdef DILOCO_HAVE_EXPORT
#include "daemon/export/export_run.h"
#endif

namespace diloco {

int RunExportCommand(const ExportCommand& cmd) {
  if (cmd.format != "safetensors") {
    std::fprintf(stderr, "dilococtl export: --format %s is not supported; use --format safetensors\n",
                 cmd.format.c_str());
    return 2;
  }
  if (cmd.out.empty()) {
    std::fprintf(stderr, "dilococtl export: -o FILE is required\n");
    return 2;
  }
  std::string socket;
  if (Status st = ResolveControlSocket(cmd.daemon.config, cmd.daemon.socket, &socket); !st.ok()) {
    std::fprintf(stderr, "dilococtl export: %s\n", st.message().c_str());
    return 2;
  }
  ControlArgs reply;
  nlohmann::json status;
  Status st = CallDaemon(socket, "status", cmd.job, {}, &reply);
  if (st.ok()) status = nlohmann::json::parse(reply["json"], nullptr, false);
  if (!st.ok() || status.is_discarded()) {
    std::fprintf(stderr, "dilococtl export: %s\n", st.ok() ? "bad status reply" : st.message().c_str());
    return reply.count("usage") || st.message().find("unknown job") != std::string::npos ? 2 : 1;
  }
  const std::string run_dir = status.value("run_dir", "");
  if (run_dir.empty() || !std::filesystem::exists(std::filesystem::path(run_dir) / "global_state.bin")) {
    std::fprintf(stderr,
                 "dilococtl export: job %s has no merged model visible here (run directory '%s' of site %s); run "
                 "export on the syncer's site\n",
                 cmd.job.c_str(), run_dir.c_str(), status.value("syncer_site", "?").c_str());
    return 1;
  }
#ifdef DILOCO_HAVE_EXPORT
  ExportOptions options;
  options.job_id = cmd.job;
  ExportSummary summary;
  if (st = ExportRunDir(run_dir, cmd.out, options, &summary); !st.ok()) {
    std::fprintf(stderr, "dilococtl export: %s\n", st.message().c_str());
    return 1;
  }
  if (cmd.json) {
    std::printf("%s\n", ExportSummaryObject(summary).dump().c_str());
  } else {
    std::printf("%s\n", ExportSummaryLine(summary).c_str());
  }
  return 0;
#else
  std::fprintf(stderr, "dilococtl export: this build has no exporter (daemon/export)\n");
  return 1;
#endif
}

}  // namespace diloco
