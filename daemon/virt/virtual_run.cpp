#include "daemon/virt/virtual_run.h"

#include <omp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "daemon/sync/protocol.h"
#include "daemon/train/ddp_run.h"
#include "daemon/train/data.h"
#include "daemon/train/role_plan.h"
#include "daemon/train/run_dir.h"
#include "daemon/train/run_summary.h"
#include "daemon/util/jsonl_writer.h"
#include "daemon/virt/virtual_world.h"
#include "kernels/gpt.h"
#include "kernels/rng.h"

namespace diloco {

namespace {

namespace fs = std::filesystem;

// What a virtual run cannot do yet, as a clear error before anything starts.
Status CheckVirtualRunnable(const TrainOptions& options) {
  const RunConfig& cfg = options.config;
  if (options.resume) return Status::Error("sync.clock: virtual cannot resume a run yet; start a new one");
  if (!cfg.chaos.empty())
    return Status::Error("sync.clock: virtual does not play chaos: events yet; remove them or use sync.clock: wall");
  for (int i = 0; i < cfg.sync.learners; i++) {
    std::string device;
    DL_RETURN_IF_ERROR(LearnerDevice(cfg.train, i, cfg.sync.learners, &device));
  }
  if (cfg.train.hosts > 1) return Status::Error("sync.clock: virtual runs every learner in this process: train.hosts must be 1");
  return Status::Ok();
}

}  // namespace

Status RunVirtual(const TrainOptions& options, TrainSummary* summary, LocalRunDetails* details,
                  VirtualRunStats* stats) {
  const auto wall_start = std::chrono::steady_clock::now();
  if (options.config.sync.mode == SyncMode::kDdp) {
    // ddp has no syncer and no messages to time: its learners run in lock step, so its result does
    // not depend on time. It runs on the wall clock (the same bits), so that `--set sync.mode=ddp`
    // on a virtual-clock config (configs/shakespeare-m4.yaml) still gives the ddp reference.
    std::fprintf(stderr, "sync.clock: virtual: ddp has no syncer to time; this run is on the wall clock (sync.clock: wall)\n");
    TrainOptions wall = options;
    wall.config.sync.clock = ClockSource::kWall;
    if (stats) *stats = {};
    return RunLocalDdp(wall, summary, details);
  }
  DL_RETURN_IF_ERROR(CheckVirtualRunnable(options));
  const RunConfig& cfg = options.config;
  const int M = cfg.sync.learners;
  if (fs::exists(fs::path(options.run_dir) / "global_state.bin"))
    return Status::Error("run directory '" + options.run_dir + "' already holds a run (global_state.bin): choose another --out");
  DL_RETURN_IF_ERROR(PrepareRunDir(options.run_dir, cfg));
  JsonlWriter metrics;  // the run's lines; each learner's go to its learner-<i>.jsonl (run_dir.h)
  DL_RETURN_IF_ERROR(metrics.Open((fs::path(options.run_dir) / "metrics.jsonl").string()));
  LearnerMetricsFiles learner_metrics;
  DL_RETURN_IF_ERROR(learner_metrics.Open(options.run_dir, M));

  std::unique_ptr<Corpus> corpus;
  DL_RETURN_IF_ERROR(Corpus::Load(cfg.data.corpus, CorpusOptionsOf(cfg, 0, M), &corpus));
  const GptConfig gc = GptConfigOf(cfg.model);
  const TensorTable table = gpt_tensor_table(gc);
  std::vector<float> init(table.total_numel());
  gpt_init_params(gc, cfg.train.seed, init.data());
  const BatchSampler val = ValSampler(*corpus, cfg.train.batch_size, cfg.model.block_size, cfg.train.seed);
  // Every learner computes alone (the baton), so each gets all of train.threads.
  const int threads = cfg.train.threads > 0 ? cfg.train.threads : omp_get_num_procs();
  omp_set_num_threads(threads);
  TrainSummary s;
  s.learners = M;
  s.run_dir = options.run_dir;
  // Evaluated where local mode evaluates (the role plan's choice, train/role_plan.h).
  const RolePlan plan = PlanLocal(cfg, LearnersOwnDevices(cfg.train, M), threads);
  DL_RETURN_IF_ERROR(EvaluateParams(plan.eval_device, gc, init.data(), val, cfg.eval.batches, &s.initial_val_loss));
  DL_RETURN_IF_ERROR(metrics.Write({{"event", "start"},
                                    {"clock", "virtual"},
                                    {"step", 0},
                                    {"params", table.total_numel()},
                                    {"learners", M},
                                    {"mode", std::string(ToString(cfg.sync.mode))},
                                    {"val_loss", s.initial_val_loss},
                                    {"threads", threads}}));

  VirtualWorldOptions wo;
  wo.config = &cfg;
  wo.run_dir = options.run_dir;
  wo.table = &table;
  wo.init_params = init.data();
  wo.threads = threads;
  wo.metrics = &learner_metrics;
  std::unique_ptr<VirtualWorld> world;
  DL_RETURN_IF_ERROR(VirtualWorld::Create(wo, &world));
  DL_RETURN_IF_ERROR(world->Run());
  DL_RETURN_IF_ERROR(world->FinishSyncer());
  VirtualScheduler& scheduler = world->scheduler();
  VirtualSyncer* syncer = &world->syncer();
  const int64_t end_unix_ms = scheduler.unix_ms();

  std::vector<std::vector<const LearnerResult*>> incarnations(M);
  for (int i = 0; i < M; i++)
    for (const auto& l : world->incarnations(i)) incarnations[i].push_back(&l->result());
  DL_RETURN_IF_ERROR(SummarizeLearners(cfg, incarnations, metrics, &s, details));
  const GlobalState& gs = syncer->state();
  s.outer_steps = gs.merges;
  s.dropped_deltas = gs.dropped_deltas;
  s.rejected_deltas = gs.rejected_deltas;
  for (const auto& f : gs.fragments) s.versions.push_back(f.version);
  std::vector<float> global(table.total_numel());
  syncer->GlobalParams(global.data());
  omp_set_num_threads(threads);
  DL_RETURN_IF_ERROR(EvaluateParams(plan.eval_device, gc, global.data(), val, cfg.eval.batches, &s.final_val_loss));
  s.final_val_batches = cfg.eval.batches;
  s.checkpoint = (fs::path(options.run_dir) / "global_state.bin").string();
  DL_RETURN_IF_ERROR(metrics.Write({{"event", "eval"}, {"step", s.steps}, {"val_loss", s.final_val_loss}}));
  s.tokens_per_s = s.train_s > 0 ? s.tokens / s.train_s : 0;
  GoodputReport g;
  if (Status st = AccountGoodput(cfg, world->merge_tape(), incarnations, world->down_spans(), end_unix_ms, &g); st.ok())
    s.goodput = g;
  else
    std::fprintf(stderr, "goodput not accounted: %s\n", st.message().c_str());
  s.wall_s = (double)(end_unix_ms - VirtualScheduler::kEpochUnixMs) / 1e3;
  s.peak_rss_mb = 0;
  nlohmann::json ev = TrainSummaryObject(s);
  ev["event"] = "summary";
  DL_RETURN_IF_ERROR(metrics.Write(ev));
  if (stats) {
    stats->events = scheduler.events_run();
    stats->virtual_s = s.wall_s;
    stats->wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  }
  *summary = s;
  return Status::Ok();
}

}  // namespace diloco
