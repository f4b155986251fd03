// dilococtl: the user's tool. Wiring only: flags -> command structs -> run.
// Exit codes: 0 ok, 1 failed, 2 usage.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "apps/dilococtl/dst_command.h"
#include "apps/dilococtl/job_commands.h"
#include "apps/dilococtl/plan_command.h"
#include "daemon/config/run_config.h"
#include "daemon/ctl/commands.h"

namespace {
// --daemon CONFIG / --socket PATH on every command that talks to the local dilocod.
void AddDaemonOptions(CLI::App* cmd, diloco::DaemonRef* ref) {
  cmd->add_option("--daemon", ref->config, "The local dilocod's config (default $DILOCOD_CONFIG or /etc/dilocod/dilocod.yaml)");
  cmd->add_option("--socket", ref->socket, "The local dilocod's control socket (instead of --daemon)");
}
}  // namespace

int main(int argc, char** argv) {
  using namespace diloco;
  CLI::App app{"dilococtl: train and drive Decoupled DiLoCo jobs"};
  app.require_subcommand(1);

  TrainCommand train;
  CLI::App* train_cmd = app.add_subcommand("train", "Train a model from a YAML run config");
  train_cmd->add_option("config", train.config_path, "Run config (YAML)")->required()->check(CLI::ExistingFile);
  train_cmd->add_option("--set", train.overrides, "Override a config key: --set train.lr=3e-4 (repeatable)");
  train_cmd->add_option("--out", train.out_dir, "Run directory (default: runs/<config>-<time>)");
  train_cmd->add_flag("--resume", train.resume, "Continue the run in --out from its checkpoint");
  train_cmd->add_flag("--json", train.json, "Print the summary as one JSON object on the last line");

  PlanCommand plan;
  CLI::App* plan_cmd = app.add_subcommand("plan", "Per-rank memory of a run's learner, and whether it fits a device");
  plan_cmd->add_option("config", plan.config_path, "Run config (YAML)")->required()->check(CLI::ExistingFile);
  plan_cmd->add_option("--set", plan.overrides, "Override a config key: --set train.shard=gradients (repeatable)");
  plan_cmd->add_option("--device-memory", plan.device_memory_gib,
                       "GiB per device (default: cpu this machine's MemTotal, cuda an H200's 141)");
  plan_cmd->add_flag("--json", plan.json, "Print one JSON object");

  SampleCommand sample;
  CLI::App* sample_cmd = app.add_subcommand("sample", "Generate text from a checkpoint");
  sample_cmd->add_option("--checkpoint", sample.checkpoint, "checkpoint.bin of a run")->required();
  sample_cmd->add_option("--prompt", sample.prompt, "Text to continue");
  sample_cmd->add_option("--tokens", sample.tokens, "Bytes to generate")->capture_default_str();
  sample_cmd->add_option("--temperature", sample.temperature, "0 = greedy")->capture_default_str();
  sample_cmd->add_option("--seed", sample.seed, "Sampling seed")->capture_default_str();

  ClusterDemoCommand demo;
  CLI::App* demo_cmd = app.add_subcommand(
      "demo", "Start 3 dilocod on loopback (2 learner sites, 1 syncer site), run configs/demo.yaml, stop them");
  demo_cmd->add_option("--config", demo.config_path, "Another run config (with a placement)");
  demo_cmd->add_option("--set", demo.overrides, "Override a config key (repeatable)");
  demo_cmd->add_option("--dir", demo.dir, "Directory for the sites' configs, keys and state (default: a new temp dir)");
  demo_cmd->add_flag("--json", demo.json, "Print the summary as one JSON object on the last line");

  SubmitCommand submit;
  CLI::App* submit_cmd = app.add_subcommand("submit", "Submit a run config (with a placement) to the local dilocod");
  submit_cmd->add_option("config", submit.config_path, "Run config (YAML)")->required()->check(CLI::ExistingFile);
  submit_cmd->add_option("--set", submit.overrides, "Override a config key (repeatable)");
  submit_cmd->add_flag("--json", submit.json, "Print {job, run_dir} as JSON");
  AddDaemonOptions(submit_cmd, &submit.daemon);

  ListCommand list;
  CLI::App* list_cmd = app.add_subcommand("list", "The jobs the local dilocod knows");
  list_cmd->add_flag("--json", list.json, "Print JSON");
  AddDaemonOptions(list_cmd, &list.daemon);

  StatusCommand status;
  CLI::App* status_cmd = app.add_subcommand("status", "A job's learners and syncer (no JOB: the job list)");
  status_cmd->add_option("job", status.job, "Job id");
  status_cmd->add_flag("--watch", status.watch, "Refresh every second until the job ends");
  status_cmd->add_flag("--json", status.json, "Print JSON (one object per refresh)");
  status_cmd->add_option("--report", status.report, "--watch: write the job's report here when it ends (default report-JOB.html)");
  status_cmd->add_flag("--no-report", status.no_report, "--watch: no report at the end");
  AddDaemonOptions(status_cmd, &status.daemon);

  StopCommand stop;
  CLI::App* stop_cmd = app.add_subcommand("stop", "Stop a job on every site (roles save their state)");
  stop_cmd->add_option("job", stop.job, "Job id")->required();
  AddDaemonOptions(stop_cmd, &stop.daemon);

  LogsCommand logs;
  CLI::App* logs_cmd = app.add_subcommand("logs", "A job's log lines from every site");
  logs_cmd->add_option("job", logs.job, "Job id")->required();
  logs_cmd->add_option("--tail", logs.tail, "Lines per site")->capture_default_str();
  logs_cmd->add_flag("--json", logs.json, "Print {job, text} as JSON");
  AddDaemonOptions(logs_cmd, &logs.daemon);

  ChaosCommand chaos;
  CLI::App* chaos_cmd = app.add_subcommand(
      "chaos", "Inject a fault into a running job on one site (its daemon config must say chaos: true)");
  chaos_cmd->add_option("job", chaos.job, "Job id")->required();
  chaos_cmd->add_option("action", chaos.action, "kill, restart, slow, partition, heal, drop or corrupt")
      ->required()
      ->check(CLI::IsMember({"kill", "restart", "slow", "partition", "heal", "drop", "corrupt"}));
  chaos_cmd->add_option("site", chaos.site, "The site whose roles it hits")->required();
  chaos_cmd->add_option("--learner", chaos.learner, "Only this learner of the job (default: every role on SITE)");
  chaos_cmd->add_flag("--syncer", chaos.syncer, "Only the job's syncer (kill, restart)");
  chaos_cmd->add_flag("--process", chaos.process, "kill: SIGKILL the site's dilocod itself (its supervisor restarts it)");
  chaos_cmd->add_option("--restart-after", chaos.restart_after_s, "kill: restart the roles after this many seconds");
  chaos_cmd->add_option("--factor", chaos.factor, "slow: step-time multiplier (0: back to the config's)");
  chaos_cmd->add_option("--prob", chaos.prob, "drop, corrupt: per-message probability (0: back to normal)");
  chaos_cmd->add_option("--duration", chaos.duration_s, "slow, partition, drop, corrupt: undo after this many seconds");
  AddDaemonOptions(chaos_cmd, &chaos.daemon);

  ExportCommand export_;
  CLI::App* export_cmd = app.add_subcommand(
      "export", "Write a model (checkpoint, run directory or job) as safetensors that PyTorch / Hugging Face load");
  export_cmd->add_option("model", export_.model, "A checkpoint file, a run directory, or a job id")->required();
  export_cmd->add_option("--format", export_.format, "Output format")->capture_default_str();
  export_cmd->add_option("--layout", export_.layout, "Tensor names: nanogpt or hf-gpt2 (+ config.json)")
      ->capture_default_str();
  export_cmd->add_option("-o,--out", export_.out, "Output file (hf-gpt2: a directory unless it ends in .safetensors)")
      ->required();
  export_cmd->add_flag("--json", export_.json, "Print the export summary as JSON");
  AddDaemonOptions(export_cmd, &export_.daemon);

  SimulateCommand simulate;
  CLI::App* simulate_cmd = app.add_subcommand(
      "simulate", "Simulate a deployment's goodput with the daemon's own learner and syncer cores (configs/simulate/)");
  simulate_cmd->add_option("scenario", simulate.scenario, "Scenario (YAML)")->required()->check(CLI::ExistingFile);
  simulate_cmd->add_option("--mode", simulate.modes, "ddp, elastic-ddp, diloco, streaming, decoupled (repeatable)")
      ->allow_extra_args(false);
  simulate_cmd->add_option("--learners", simulate.learners, "Learner counts M (repeatable)")->allow_extra_args(false);
  simulate_cmd->add_option("--syncers", simulate.syncers, "Syncer shard counts S (repeatable; each a host of its own)")
      ->allow_extra_args(false)
      ->check(CLI::PositiveNumber);
  simulate_cmd->add_option("--chips", simulate.chips, "Chips in total (repeatable: a sweep; default the scenario's)")
      ->allow_extra_args(false);
  simulate_cmd->add_option("--plot", simulate.plot, "Write goodput against chips as an SVG file");
  simulate_cmd->add_option("--hours", simulate.hours, "Simulated hours (instead of the scenario's)");
  simulate_cmd->add_option("--set", simulate.overrides,
                           "Override a run config key, or a scenario key: balanced_fragments=false (repeatable)");
  simulate_cmd->add_option("--merge-bench", simulate.merge_bench,
                           "Take the merge throughput from a `dilococtl bench syncer --json` output (its merge_GBps)");
  simulate_cmd->add_flag("--json", simulate.json, "One JSON object per mode and learner count");
  simulate_cmd->add_option("--jobs", simulate.jobs, "Rows simulated at once, one core each (rows print in order)")
      ->check(CLI::Range(1, 256));

  DstCommand dst;
  CLI::App* dst_cmd = app.add_subcommand(
      "dst", "Deterministic simulation testing: drawn deployments and faults on the real cores under the virtual clock");
  dst_cmd->add_option("--seeds", dst.seeds, "How many seeds to run")->capture_default_str();
  dst_cmd->add_option("--first", dst.first, "The first seed")->capture_default_str();
  dst_cmd->add_option("--seed", dst.seed, "Replay this one seed, described in full");
  dst_cmd->add_option("--config", dst.config, "Draw over this run config's model and corpus (default: a tiny one)")
      ->check(CLI::ExistingFile);
  dst_cmd->add_option("--scratch", dst.scratch, "Run the cases in this directory (default: a temporary one)");
  dst_cmd->add_flag("--json", dst.json, "Last line: one JSON object");

  EvalCommand eval;
  CLI::App* eval_cmd = app.add_subcommand("eval", "Validation loss of a model on its run's corpus split");
  eval_cmd->add_option("model", eval.model, "A checkpoint file, a run directory, or a job id")->required();
  eval_cmd->add_option("--batches", eval.batches, "Sampled validation batches (default: the run's eval.batches)");
  eval_cmd->add_flag("--full", eval.full, "The whole validation split in consecutive windows");
  eval_cmd->add_flag("--json", eval.json, "Print one JSON object");
  eval_cmd->add_option("--device", eval.device, "cpu, cuda or cuda:N")->capture_default_str();
  eval_cmd->add_option("--threads", eval.threads, "CPU threads (default: every core)");
  AddDaemonOptions(eval_cmd, &eval.daemon);

  ReportCommand report;
  CLI::App* report_cmd = app.add_subcommand("report", "Overlay runs in one self-contained HTML page");
  report_cmd
      ->add_option("runs", report.runs,
                   "Runs: a run directory (dilococtl train --out), DIR,DIR,... (the sites' run directories of one "
                   "daemon job), or JOB (a job of the local dilocod)")
      ->required();
  report_cmd->add_option("-o,--out", report.out, "Output HTML file")->required();
  report_cmd->add_option("--label", report.labels, "A name per run, in order (repeatable; default: dir name or job id)")
      ->allow_extra_args(false);  // one value per --label, so runs and labels may alternate
  AddDaemonOptions(report_cmd, &report.daemon);

  BenchEngineCommand bench_engine;
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (prints a line, or JSON with --json)");
  bench->require_subcommand(1);
  CLI::App* engine = bench->add_subcommand("engine", "Training-step throughput of the CPU engine");
  engine->add_option("--config", bench_engine.preset, "Model preset: tiny, small or gpt2ish")->capture_default_str();
  engine->add_option("--threads", bench_engine.threads, "Threads")->capture_default_str();
  engine->add_option("--steps", bench_engine.steps, "Timed steps (0: the preset's default)");
  engine->add_option("--warmup", bench_engine.warmup, "Untimed steps first (0: the preset's default)");
  engine->add_flag("--json", bench_engine.json, "Print one JSON object");

  BenchGemmCommand bench_gemm;
  CLI::App* gemm = bench->add_subcommand("gemm", "GFLOP/s of the engine's sgemm, the ceiling for the engine");
  gemm->add_option("-m", bench_gemm.m, "Rows of A")->capture_default_str();
  gemm->add_option("-n", bench_gemm.n, "Columns of B")->capture_default_str();
  gemm->add_option("-k", bench_gemm.k, "Inner dimension")->capture_default_str();
  gemm->add_option("--threads", bench_gemm.threads, "Threads")->capture_default_str();
  gemm->add_flag("--json", bench_gemm.json, "Print one JSON object");

  BenchCodecCommand bench_codec;
  CLI::App* codec = bench->add_subcommand("codec", "Encode/decode GB/s (one thread) and error of each delta codec");
  codec->add_option("--mib", bench_codec.size_mib, "MiB of fp32 Gaussian input")->capture_default_str();
  codec->add_option("--block", bench_codec.block_size, "int8/int4 block size")->capture_default_str();
  codec->add_option("--repeats", bench_codec.repeats, "Timed runs (median)")->capture_default_str();
  codec->add_flag("--json", bench_codec.json, "Print one JSON object on the last line");

  BenchTransportCommand bench_transport;
  CLI::App* transport = bench->add_subcommand("transport", "A delta through the full stack vs raw ZeroMQ (tcp, ipc, CURVE)");
  transport->add_option("--mib", bench_transport.size_mib, "MiB of fp32 delta payload")->capture_default_str();
  transport->add_option("--transfers", bench_transport.transfers, "Timed runs (median)")->capture_default_str();
  transport->add_option("--stream", bench_transport.stream_depth, "Deltas back to back (0: skip); per sender in the aggregate (>= 1)")->capture_default_str();
  transport->add_option("--senders", bench_transport.senders, "Senders at once into one receiving socket (aggregate)")
      ->capture_default_str();
  transport->add_option("--io-threads", bench_transport.io_threads,
                        "Receiving context's ZeroMQ I/O threads (0: as the daemon, min(4, cores))")
      ->capture_default_str();
  transport->add_flag("--no-curve", bench_transport.no_curve, "Skip the CURVE run");
  transport->add_flag("--json", bench_transport.json, "Print one JSON object on the last line");

  BenchSyncerCommand bench_syncer;
  CLI::App* syncer = bench->add_subcommand("syncer", "Merge GB/s of the syncer (decode, RDA, Nesterov, downlink) vs memcpy");
  syncer->add_option("--params", bench_syncer.params, "Parameters of the synthetic model")->capture_default_str();
  syncer->add_option("--learners", bench_syncer.learners, "Learners M (one delta each per fragment)")->capture_default_str();
  syncer->add_option("--fragments", bench_syncer.fragments, "Fragments P")->capture_default_str();
  syncer->add_option("--open-rounds", bench_syncer.open_rounds, "Rounds open at once (0: every fragment's)")->capture_default_str();
  syncer->add_option("--codec", bench_syncer.codec, "Uplink codec: fp32, bf16, int8 or int4")->capture_default_str();
  syncer->add_option("--down-codec", bench_syncer.down_codec, "Downlink codec")->capture_default_str();
  syncer->add_option("--threads", bench_syncer.threads, "Merge threads (0: sync.merge_threads' default)")->capture_default_str();
  syncer->add_option("--syncers", bench_syncer.syncers, "Shards S merging their fragments at once (each --threads)")
      ->capture_default_str();
  syncer->add_option("--rounds", bench_syncer.rounds, "Timed rounds (median)")->capture_default_str();
  syncer->add_flag("--json", bench_syncer.json, "Print one JSON object");

  CLI::App* config_cmd = app.add_subcommand("config", "About run configs");
  config_cmd->require_subcommand(1);
  CLI::App* config_keys = config_cmd->add_subcommand(
      "keys", "Every run-config key: type, default, range, meaning (Markdown; README's key list)");

  KeygenCommand keygen;
  CLI::App* keygen_cmd = app.add_subcommand("keygen", "Write a CURVE key pair (DIR/key.public, DIR/key.secret)");
  keygen_cmd->add_option("--out", keygen.out_dir, "Directory for the key files")->required();
  keygen_cmd->add_flag("--force", keygen.force, "Replace an existing key pair");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (train_cmd->parsed()) return RunTrainCommand(train);
  if (plan_cmd->parsed()) return RunPlanCommand(plan);
  if (sample_cmd->parsed()) return RunSampleCommand(sample);
  if (demo_cmd->parsed()) return RunClusterDemoCommand(demo);
  if (submit_cmd->parsed()) return RunSubmitCommand(submit);
  if (list_cmd->parsed()) return RunListCommand(list);
  if (status_cmd->parsed()) return RunStatusCommand(status);
  if (stop_cmd->parsed()) return RunStopCommand(stop);
  if (logs_cmd->parsed()) return RunLogsCommand(logs);
  if (chaos_cmd->parsed()) return RunChaosCommand(chaos);
  if (export_cmd->parsed()) return RunExportCommand(export_);
  if (eval_cmd->parsed()) return RunEvalCommand(eval);
  if (report_cmd->parsed()) return RunReportCommand(report);
  if (simulate_cmd->parsed()) return RunSimulateCommand(simulate);
  if (dst_cmd->parsed()) return RunDstCommand(dst);
  if (engine->parsed()) return RunBenchEngineCommand(bench_engine);
  if (gemm->parsed()) return RunBenchGemmCommand(bench_gemm);
  if (codec->parsed()) return RunBenchCodecCommand(bench_codec);
  if (transport->parsed()) return RunBenchTransportCommand(bench_transport);
  if (syncer->parsed()) return RunBenchSyncerCommand(bench_syncer);
  if (keygen_cmd->parsed()) return RunKeygenCommand(keygen);
  if (config_keys->parsed()) return std::fputs(RunConfigKeysMarkdown().c_str(), stdout) < 0 ? 1 : 0;
  return 2;
}
