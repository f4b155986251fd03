// dilococtl's commands that drive dilocod: submit, list, status, stop, logs, export, eval, and the
// 3-daemon demo (export and eval take a path too, and then need no daemon). They talk to the
// local daemon over its control socket (control/client.h).
// Each returns the exit code: 0 ok, 1 failed, 2 usage (bad flags, bad config, unknown job).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/util/status.h"

namespace diloco {

// Which daemon: --daemon CONFIG (its control_socket) or --socket PATH.
struct DaemonRef {
  std::string config;
  std::string socket;
};

struct SubmitCommand {
  DaemonRef daemon;
  std::string config_path;
  std::vector<std::string> overrides;
  bool json = false;  // print {"job", "run_dir"}
};
int RunSubmitCommand(const SubmitCommand& cmd);

struct ListCommand {
  DaemonRef daemon;
  bool json = false;
};
int RunListCommand(const ListCommand& cmd);

struct StatusCommand {
  DaemonRef daemon;
  std::string job;  // empty: the list
  bool watch = false;  // redraw every second until the job ends
  bool json = false;   // one JSON object (per refresh with --watch)
  int interval_ms = 1000;
  std::string report;  // --watch: where the report goes when the job ends ("" = report-<job>.html)
  bool no_report = false;
};
int RunStatusCommand(const StatusCommand& cmd);

struct StopCommand {
  DaemonRef daemon;
  std::string job;
};
int RunStopCommand(const StopCommand& cmd);

struct LogsCommand {
  DaemonRef daemon;
  std::string job;
  int tail = 50;
  bool json = false;  // {"job", "text"}
};
int RunLogsCommand(const LogsCommand& cmd);

// Faults into a running job on one site (control/site_chaos.h; the site's daemon config must say
// chaos: true).
struct ChaosCommand {
  DaemonRef daemon;
  std::string job;
  std::string action;  // kill, restart, slow, partition, heal, drop, corrupt
  std::string site;
  int learner = -1;
  bool syncer = false;
  bool process = false;
  double restart_after_s = -1;
  double factor = 0;  // slow
  double prob = 0;    // drop, corrupt
  double duration_s = -1;
};
int RunChaosCommand(const ChaosCommand& cmd);

// dilococtl export JOB|RUN_DIR|CHECKPOINT --format safetensors [--layout nanogpt|hf-gpt2] -o OUT:
// the model as safetensors people load (daemon/export/export_run.h); a path needs no daemon.
struct ExportCommand {
  DaemonRef daemon;
  std::string model;  // a checkpoint file, a run directory or a job id (apps/dilococtl/model_arg.h)
  std::string format = "safetensors";
  std::string layout = "nanogpt";
  std::string out;
  bool json = false;  // print the export summary object
};
int RunExportCommand(const ExportCommand& cmd);

// dilococtl eval CHECKPOINT|RUN_DIR|JOB [--batches N | --full] [--json]: validation loss on the
// run's corpus split (daemon/export/model_eval.h).
struct EvalCommand {
  DaemonRef daemon;
  std::string model;
  int batches = 0;     // 0: the run's eval.batches
  bool full = false;   // the whole validation split
  bool json = false;   // one JSON object on stdout
  std::string device = "cpu";
  int threads = 0;     // 0: every core
};
int RunEvalCommand(const EvalCommand& cmd);

// dilococtl report RUN_DIR... -o FILE: the runs overlaid in one self-contained HTML page.
struct ReportCommand {
  DaemonRef daemon;               // for runs given as a job id
  std::vector<std::string> runs;  // DIR, DIR,DIR,... (one run's parts) or JOB
  std::string out;
  std::vector<std::string> labels;  // one per run, in order; missing ones: the dir's name or job id
};
int RunReportCommand(const ReportCommand& cmd);
// The report of one job from its status (the sites' run directories readable here), for
// `status --watch` and the demo when the job ends.
Status WriteJobReport(const nlohmann::json& status, const std::string& path);

struct SimulateCommand {
  std::string scenario;
  std::vector<std::string> overrides;  // run config keys, after the scenario's `set` (or scenario keys)
  std::string merge_bench;             // a `bench syncer --json` output: the merge throughput
  std::vector<std::string> modes;      // empty: the run config's sync.mode
  std::vector<int> learners;           // empty: sync.learners
  std::vector<int> syncers;            // syncer shards S; empty: sync.syncers
  std::vector<double> chips;           // empty: the scenario's
  double hours = 0;
  std::string plot;                    // goodput against chips as an SVG file
  bool json = false;
  int jobs = 1;                        // rows simulated at once (each on a thread of its own)
};
int RunSimulateCommand(const SimulateCommand& cmd);

struct ClusterDemoCommand {
  std::string config_path;  // empty: configs/demo.yaml of the source tree
  std::vector<std::string> overrides;
  std::string dir;  // empty: a fresh temp directory
  bool json = false;
  bool keep = false;  // (unused) the directory is always kept: it holds the run
};
int RunClusterDemoCommand(const ClusterDemoCommand& cmd);

// j[key] when it is a number, else fallback (NaN travels as JSON null; fields may be missing).
template <typename T>
T Num(const nlohmann::json& j, const char* key, T fallback) {
  if (!j.is_object()) return fallback;
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<T>() : fallback;
}

// The status screen of one job (the daemon's status JSON) as text.
std::string RenderJobStatus(const nlohmann::json& status, bool color);

}  // namespace diloco
