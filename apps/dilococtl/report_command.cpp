// dilococtl report: each run is a run directory, the directories of one run joined with
// commas (a daemon job's sites, copied here), or a job of the local dilocod (its sites' run
// directories that this machine can read). Loading is forgiving: damage becomes a note in
// the page. Exit 1 when a run cannot be found or the page cannot be written, 2 on usage
// errors.
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <vector>

#include "apps/dilococtl/job_commands.h"
#include "daemon/control/client.h"
#include "daemon/report/html_report.h"
#include "daemon/report/job_report.h"
#include "daemon/report/run_data.h"

namespace diloco {
namespace {

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

// A run argument that names no directory: a job of the local daemon.
Status LoadJobArgument(const std::string& arg, const DaemonRef& daemon, const std::string& label, RunData* out) {
  std::string socket;
  nlohmann::json status;
  Status st = ResolveControlSocket(daemon.config, daemon.socket, &socket);
  if (st.ok()) st = CallDaemonJson(socket, "status", arg, {}, &status);
  if (!st.ok()) {
    return Status::Error("'" + arg + "' is not a run directory, nor a job of the local dilocod (" + st.message() +
                         ")");
  }
  return LoadJobRun(status, label, out);
}

Status LoadReportRun(const std::string& arg, const DaemonRef& daemon, const std::string& label, RunData* out) {
  std::error_code ec;
  if (std::filesystem::is_directory(arg, ec)) return LoadRunDir(arg, label, out);
  if (arg.find(',') != std::string::npos) return LoadRunParts(SplitCommas(arg), label, out);
  if (arg.find('/') != std::string::npos) return LoadRunDir(arg, label, out);  // a path: says it is missing
  return LoadJobArgument(arg, daemon, label, out);
}

}  // namespace

Status WriteJobReport(const nlohmann::json& status, const std::string& path) {
  RunData run;
  DL_RETURN_IF_ERROR(LoadJobRun(status, "", &run));
  return WriteHtmlReport({run}, path);
}

int RunReportCommand(const ReportCommand& cmd) {
  if (cmd.labels.size() > cmd.runs.size()) {
    std::fprintf(stderr, "dilococtl report: %zu --label for %zu runs; give at most one per run\n", cmd.labels.size(),
                 cmd.runs.size());
    return 2;
  }
  std::vector<RunData> runs(cmd.runs.size());
  for (size_t i = 0; i < cmd.runs.size(); ++i) {
    const std::string label = i < cmd.labels.size() ? cmd.labels[i] : "";
    if (Status st = LoadReportRun(cmd.runs[i], cmd.daemon, label, &runs[i]); !st.ok()) {
      std::fprintf(stderr, "dilococtl report: %s\n", st.message().c_str());
      return 1;
    }
    for (const std::string& note : runs[i].notes)
      std::fprintf(stderr, "dilococtl report: %s: %s\n", runs[i].label.c_str(), note.c_str());
  }
  if (Status st = WriteHtmlReport(runs, cmd.out); !st.ok()) {
    std::fprintf(stderr, "dilococtl report: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("report: %s (%zu runs)\n", cmd.out.c_str(), runs.size());
  return 0;
}

}  // namespace diloco
