#include "daemon/virt/virtual_run.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "daemon/sync/protocol.h"
#include "daemon/train/ddp_run.h"
#include "daemon/train/run_frame.h"
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
  // Every learner computes alone (the baton), so each gets all of train.threads; the model is
  // evaluated where local mode evaluates it (the role plan's choice, train/role_plan.h).
  std::unique_ptr<RunFrame> frame;
  DL_RETURN_IF_ERROR(RunFrame::Open(options, &frame));
  DL_RETURN_IF_ERROR(frame->Begin(false, {{"clock", "virtual"}}));

  VirtualWorldOptions wo;
  wo.config = &cfg;
  wo.run_dir = options.run_dir;
  wo.table = &frame->table();
  wo.init_params = frame->init().data();
  wo.threads = frame->threads();
  wo.metrics = &frame->learner_metrics();
  std::unique_ptr<VirtualWorld> world;
  DL_RETURN_IF_ERROR(VirtualWorld::Create(wo, &world));
  DL_RETURN_IF_ERROR(world->Run());
  DL_RETURN_IF_ERROR(world->FinishSyncers());
  VirtualScheduler& scheduler = world->scheduler();
  const int64_t end_unix_ms = scheduler.unix_ms();

  RunEnd end;
  end.incarnations.resize(M);
  for (int i = 0; i < M; i++)
    for (const auto& l : world->incarnations(i)) end.incarnations[i].push_back(&l->result());
  end.down = world->down_spans();
  end.merges = &world->merge_tape();
  const GlobalState gs = world->JoinedState();
  end.outer_steps = gs.merges;
  if (world->shards() > 1)
    for (int sh = 0; sh < world->shards(); sh++) end.shard_merges.push_back(world->syncer(sh).state().merges);
  end.dropped_deltas = gs.dropped_deltas;
  end.rejected_deltas = gs.rejected_deltas;
  for (const auto& f : gs.fragments) end.versions.push_back(f.version);
  std::vector<float> global(frame->table().total_numel());
  world->GlobalParams(global.data());
  end.global_params = global.data();
  end.end_unix_ms = end_unix_ms;
  end.wall_s = (double)(end_unix_ms - VirtualScheduler::kEpochUnixMs) / 1e3;  // virtual
  end.peak_rss_mb = 0;  // machine-dependent: not in a summary any machine reproduces
  TrainSummary s;
  DL_RETURN_IF_ERROR(frame->Finish(end, details, &s));
  if (stats) {
    stats->events = scheduler.events_run();
    stats->virtual_s = s.wall_s;
    stats->wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  }
  *summary = s;
  return Status::Ok();
}

}  // namespace diloco
