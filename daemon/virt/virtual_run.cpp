#include "daemon/virt/virtual_run.h"

#include <omp.h>

#include <chrono>
#include <filesystem>
#include <memory>

#include "daemon/sync/protocol.h"
#include "daemon/train/data.h"
#include "daemon/train/run_dir.h"
#include "daemon/train/run_summary.h"
#include "daemon/util/jsonl_writer.h"
#include "daemon/virt/baton.h"
#include "daemon/virt/virtual_learner.h"
#include "daemon/virt/virtual_network.h"
#include "daemon/virt/virtual_syncer.h"
#include "kernels/gpt.h"
#include "kernels/rng.h"

namespace diloco {

namespace {

namespace fs = std::filesystem;

// What a virtual run cannot do yet, as a clear error before anything starts.
Status CheckVirtualRunnable(const TrainOptions& options) {
  const RunConfig& cfg = options.config;
  if (cfg.sync.mode == SyncMode::kDdp)
    return Status::Error("sync.clock: virtual runs the syncer modes (diloco, streaming, decoupled); ddp has no "
                         "syncer: use sync.clock: wall");
  if (options.resume) return Status::Error("sync.clock: virtual cannot resume a run yet; start a new one");
  if (!cfg.chaos.empty()) return Status::Error("sync.clock: virtual does not play chaos: events yet; remove them or use sync.clock: wall");
  if (cfg.train.hosts > 1) return Status::Error("sync.clock: virtual runs every learner in this process: train.hosts must be 1");
  return Status::Ok();
}

SyncerOptions VirtualSyncerOptions(const TrainOptions& options) {
  const RunConfig& cfg = options.config;
  SyncerOptions so;
  so.sync = cfg.sync;
  so.run_dir = options.run_dir;
  so.count_limits = CountLimitsOf(cfg);
  so.heartbeat_interval_ms = (int)cfg.timing.heartbeat_ms;
  so.exit_when_all_finished = true;
  return so;
}

}  // namespace

Status RunVirtual(const TrainOptions& options, TrainSummary* summary, LocalRunDetails* details,
                  VirtualRunStats* stats) {
  const auto wall_start = std::chrono::steady_clock::now();
  DL_RETURN_IF_ERROR(CheckVirtualRunnable(options));
  const RunConfig& cfg = options.config;
  const int M = cfg.sync.learners;
  if (fs::exists(fs::path(options.run_dir) / "global_state.bin"))
    return Status::Error("run directory '" + options.run_dir + "' already holds a run (global_state.bin): choose another --out");
  DL_RETURN_IF_ERROR(PrepareRunDir(options.run_dir, cfg));
  JsonlWriter metrics;
  DL_RETURN_IF_ERROR(metrics.Open((fs::path(options.run_dir) / "metrics.jsonl").string()));

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
  DL_RETURN_IF_ERROR(EvaluateParams(cfg.train.device, gc, init.data(), val, cfg.eval.batches, &s.initial_val_loss));
  DL_RETURN_IF_ERROR(metrics.Write({{"event", "start"},
                                    {"clock", "virtual"},
                                    {"step", 0},
                                    {"params", table.total_numel()},
                                    {"learners", M},
                                    {"mode", std::string(ToString(cfg.sync.mode))},
                                    {"val_loss", s.initial_val_loss},
                                    {"threads", threads}}));

  VirtualScheduler scheduler;
  Baton baton;
  std::unique_ptr<VirtualSyncer> syncer;
  std::vector<std::unique_ptr<VirtualLearner>> learners;
  VirtualReceivers receivers;
  receivers.syncer_uplink = [&](int i, const std::string& topic, net::Message&& m) {
    syncer->OnUplink(i, topic, std::move(m));
  };
  receivers.syncer_router = [&](int i, net::Message&& m) { syncer->OnRequest(i, std::move(m)); };
  receivers.learner_downlink = [&](int i, net::Message&& m) { learners[i]->DeliverDownlink(std::move(m)); };
  receivers.learner_dealer = [&](int i, net::Message&& m) { learners[i]->DeliverDealer(std::move(m)); };
  VirtualNetwork network(scheduler, cfg, receivers);
  DL_RETURN_IF_ERROR(VirtualSyncer::Create(scheduler, network, VirtualSyncerOptions(options), cfg.timing.merge_gbps,
                                           table, init.data(), &syncer));
  for (int i = 0; i < M; i++) {
    LearnerOptions lo;
    lo.index = i;
    lo.config = &cfg;
    lo.init_params = init.data();
    lo.threads = threads;
    lo.run_dir = options.run_dir;
    lo.heartbeat_interval_ms = (int)cfg.timing.heartbeat_ms;
    DL_RETURN_IF_ERROR(LearnerDevice(cfg.train, i, M, &lo.device));
    learners.push_back(std::make_unique<VirtualLearner>(scheduler, baton, network, lo,
                                                        mix_seed(cfg.timing.seed, 0x1ea7, (uint64_t)i), &metrics));
  }
  syncer->Start();
  for (auto& l : learners) l->Launch();

  // Until every learner has ended and the syncer has heard them finish (or a heartbeat timeout
  // of virtual time more: a lost last word must not keep the run going).
  int64_t all_ended_ns = -1;
  auto all_ended = [&] {
    for (auto& l : learners)
      if (!l->done()) return false;
    return true;
  };
  Status failed;
  while (scheduler.RunNext()) {
    if (!syncer->error().ok()) break;
    for (auto& l : learners)
      if (l->done() && !l->status().ok() && failed.ok()) failed = l->status();
    if (!failed.ok()) break;
    if (all_ended_ns < 0 && all_ended()) all_ended_ns = scheduler.now_ns();
    if (all_ended_ns >= 0 && (syncer->AllDone() ||
                              scheduler.now_ns() - all_ended_ns > (int64_t)cfg.sync.heartbeat_timeout_ms * 1000000))
      break;
  }
  if (failed.ok() && !all_ended())
    failed = Status::Error("the virtual run stalled at " + std::to_string(scheduler.now_ns() / 1e9) +
                           " virtual s with learners still running; this is a bug");
  // Learners still on their threads (an error elsewhere) wake and unwind; their destructors join.
  if (!failed.ok() || !syncer->error().ok()) baton.Abort();
  DL_RETURN_IF_ERROR(failed);
  DL_RETURN_IF_ERROR(syncer->error());
  DL_RETURN_IF_ERROR(syncer->Finish());
  const int64_t end_unix_ms = scheduler.unix_ms();

  std::vector<std::vector<const LearnerResult*>> incarnations(M);
  for (int i = 0; i < M; i++) incarnations[i].push_back(&learners[i]->result());
  DL_RETURN_IF_ERROR(SummarizeLearners(cfg, incarnations, metrics, &s, details));
  const GlobalState& gs = syncer->state();
  s.outer_steps = gs.merges;
  s.dropped_deltas = gs.dropped_deltas;
  s.rejected_deltas = gs.rejected_deltas;
  for (const auto& f : gs.fragments) s.versions.push_back(f.version);
  std::vector<float> global(table.total_numel());
  syncer->GlobalParams(global.data());
  omp_set_num_threads(threads);
  DL_RETURN_IF_ERROR(EvaluateParams(cfg.train.device, gc, global.data(), val, cfg.eval.batches, &s.final_val_loss));
  s.final_val_batches = cfg.eval.batches;
  s.checkpoint = (fs::path(options.run_dir) / "global_state.bin").string();
  DL_RETURN_IF_ERROR(metrics.Write({{"event", "eval"}, {"step", s.steps}, {"val_loss", s.final_val_loss}}));
  s.tokens_per_s = s.train_s > 0 ? s.tokens / s.train_s : 0;
  GoodputReport g;
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> down(M);
  if (Status st = AccountGoodput(cfg, options.run_dir, incarnations, down, end_unix_ms, &g); st.ok())
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
