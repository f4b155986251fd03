#include "daemon/train/local_run.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include "daemon/net/context.h"
#include "daemon/net/link_shaper.h"
#include "daemon/sync/global_state.h"
#include "daemon/sync/shards.h"
#include "daemon/sync/syncer.h"
#include "daemon/sync/syncer_store.h"
#include "daemon/train/ddp_run.h"
#include "daemon/train/learner.h"
#include "daemon/train/learner_link.h"
#include "daemon/train/local_fleet.h"
#include "daemon/train/role_plan.h"
#include "daemon/train/run_frame.h"
#include "daemon/train/run_summary.h"
#include "daemon/util/proc_stats.h"
#include "daemon/virt/virtual_run.h"
#include "kernels/gpt.h"

namespace diloco {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

bool HasLink(const LinkConfig& l) {
  return l.bandwidth_mbps > 0 || l.latency_ms > 0 || l.jitter_ms > 0 || l.loss > 0;
}

bool NeedsTcp(const ChaosConfig& chaos) {
  for (const ChaosEvent& e : chaos.events)
    if (e.kind == ChaosEventKind::kSyncerKill) return true;
  return false;
}

// tcp://127.0.0.1:PORT with a port free now (the kernel's pick).
std::string LoopbackEndpoint() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  if (fd >= 0) ::close(fd);
  return "tcp://127.0.0.1:" + std::to_string(port);
}

// Every syncer shard's endpoints in this process: inproc, or loopback TCP when a syncer may be
// killed and started again (loopback TCP reconnects, inproc does not).
std::vector<SyncerEndpoints> LocalEndpoints(int shards, const std::string& tag, bool tcp) {
  std::vector<SyncerEndpoints> out(shards);
  for (int s = 0; s < shards; s++) {
    const std::string name = tag + (shards > 1 ? "-" + std::to_string(s) : "");
    out[s] = tcp ? SyncerEndpoints{LoopbackEndpoint(), LoopbackEndpoint(), LoopbackEndpoint(), ""}
                 : SyncerEndpoints{"inproc://dilocod-uplink-" + name, "inproc://dilocod-downlink-" + name,
                                   "inproc://dilocod-snapshot-" + name, ""};
  }
  return out;
}

// Each shard's global_state.bin (one: the run directory's own).
std::vector<std::string> ShardStatePaths(const std::string& run_dir, int shards) {
  std::vector<std::string> paths;
  for (int s = 0; s < shards; s++) paths.push_back((fs::path(ShardStoreDir(run_dir, s, shards)) / "global_state.bin").string());
  return paths;
}

// The run's global model as its shards last saved it (for a resumed run's evaluation baseline).
Status LoadShardStates(const std::vector<std::string>& paths, const TensorTable& table,
                       const std::vector<Fragment>& frags, GlobalState* joined) {
  std::vector<GlobalState> states(paths.size());
  std::vector<const GlobalState*> parts;
  for (size_t s = 0; s < paths.size(); s++) {
    DL_RETURN_IF_ERROR(LoadGlobalState(paths[s], &states[s]).WithContext("cannot resume"));
    DL_RETURN_IF_ERROR(CheckGlobalStateFits(states[s], table, frags)
                           .WithContext("cannot resume from '" + paths[s] + "' with this config"));
    parts.push_back(&states[s]);
  }
  *joined = JoinShardStates(parts, ShardMap::Of(frags, (int)paths.size()));
  return Status::Ok();
}

}  // namespace

Status RunLocal(const TrainOptions& options, TrainSummary* summary, const LocalRunHooks& hooks,
                LocalRunDetails* details) {
  const auto run_start = Clock::now();
  const RunConfig& cfg = options.config;
  const SyncConfig& sc = cfg.sync;
  const int M = sc.learners;
  if (sc.clock == ClockSource::kVirtual) return RunVirtual(options, summary, details);
  if (sc.mode == SyncMode::kDdp) return RunLocalDdp(options, summary, details, hooks);
  std::string device_check;  // the learners' devices exist, or they may share them (LearnerDevice)
  DL_RETURN_IF_ERROR(LearnerDevice(cfg.train, 0, M, &device_check));

  const std::vector<std::string> state_paths = ShardStatePaths(options.run_dir, sc.syncers);
  const fs::path state_path = state_paths.front();
  std::vector<long> start_steps(M, 0);
  if (options.resume) {
    if (!fs::exists(state_path))
      return Status::Error("cannot resume: run directory '" + options.run_dir +
                           "' holds no global_state.bin (was it a run with sync.learners > 1 in a syncer mode?)");
    bool any_step = false;
    for (int i = 0; i < M; i++) {
      DL_RETURN_IF_ERROR(ReadLearnerStep(options.run_dir, i, &start_steps[i]));
      any_step = any_step || fs::exists(LearnerStepPath(options.run_dir, i));
    }
    // Every learner that started wrote one; none means a run directory of an older dilocod.
    if (!any_step)
      return Status::Error("cannot resume: run directory '" + options.run_dir +
                           "' holds no learner-<i>.step files, so where each learner got to is unknown (a run of "
                           "an older dilocod?); start a new run with --out DIR");
  } else if (fs::exists(state_path)) {
    return Status::Error("run directory '" + options.run_dir +
                         "' already holds a run (global_state.bin): pass --resume to continue it, or choose another --out");
  }
  std::unique_ptr<RunFrame> frame;  // the run directory, the initial model, the run's lines
  DL_RETURN_IF_ERROR(RunFrame::Open(options, &frame));
  const TensorTable& table = frame->table();
  std::vector<float>& init = frame->init();
  const RolePlan& plan = frame->plan();
  if (options.resume) {
    // The model to start from is the syncer's global state; init only feeds the evaluation.
    GlobalState gs;
    std::vector<Fragment> frags;
    DL_RETURN_IF_ERROR(PartitionFragments(table, EffectiveFragments(sc), &frags));
    DL_RETURN_IF_ERROR(LoadShardStates(state_paths, table, frags, &gs));
    for (size_t p = 0; p < frags.size(); p++) ScatterFragment(frags[p], gs.fragments[p].theta.data(), init.data());
  }
  DL_RETURN_IF_ERROR(frame->Begin(options.resume, {{"start_steps", start_steps}}));

  std::unique_ptr<net::NetContext> ctx;
  DL_RETURN_IF_ERROR(net::NetContext::Create({}, &ctx));
  const std::string tag = std::to_string(ctx->NextId());
  // Every role is the daemon's (train/roles.h), on this process's endpoints.
  RoleOptions base;
  base.job_id = SyncerOptions{}.job_id;
  base.config = cfg;
  base.run_dir = options.run_dir;
  base.threads = plan.threads_per_role;
  base.allow_plaintext = true;  // inproc or loopback, in this process
  base.resume = options.resume;
  base.init_params = init.data();
  base.syncers = LocalEndpoints(sc.syncers, tag, NeedsTcp(cfg.chaos));
  // The syncer: the run frame evaluates the model and saves its checkpoint.
  RoleOptions sro = base;
  sro.evaluate = false;
  MergeTape merges;  // this process's merges, for its goodput (before the syncer: it outlives it)
  sro.tune_syncer = [&hooks, &merges, &sc](SyncerOptions* so) {
    so->on_merge = merges.Listener();
    so->idle_exit_ms = 500 + (int)(2 * (sc.link.latency_ms + sc.link.jitter_ms));
    if (hooks.corrupt_crc_version > 0)
      so->corrupt_global_crc = [f = hooks.corrupt_crc_fragment, v = hooks.corrupt_crc_version](uint32_t fragment,
                                                                                            uint64_t version) {
        return fragment == f && version == v;
      };
    if (hooks.reject_first_delta_learner >= 0)
      so->reject_delta = [l = hooks.reject_first_delta_learner, f = hooks.reject_first_delta_fragment,
                          done = false](int learner, uint32_t fragment) mutable {
        if (done || learner != l || fragment != f) return false;
        return done = true;
      };
    if (hooks.nan_global_version > 0)
      so->nan_global_update = [f = hooks.nan_global_fragment, v = hooks.nan_global_version](uint32_t fragment,
                                                                                           uint64_t version) {
        return fragment == f && version == v;
      };
  };
  LocalSyncers syncers;
  DL_RETURN_IF_ERROR(syncers.Start(*ctx, sro));

  std::vector<std::shared_ptr<net::Link>> links;
  const net::LinkParams base_link = LinkParamsOf(sc.link);
  if (HasLink(sc.link) || !cfg.chaos.empty()) {
    links.resize(M);
    for (int i = 0; i < M; i++) DL_RETURN_IF_ERROR(CreateLearnerLink(*ctx, cfg, i, base_link, &links[i]));
  }

  // Each learner, handed this process's links (LocalFleet), initial model and metrics files.
  auto role_options = [&](int i) {
    RoleOptions ro = base;
    ro.device = plan.Find(LearnerName(i))->device;
    if (options.resume) {
      // Resumed learners take the global model from a snapshot and go on from the step they had
      // logged; their AdamW moments start again at zero (only the syncer's state is on disk).
      ro.init_params = nullptr;
      ro.start_step = std::min<long>(start_steps[i], cfg.train.steps);
    }
    ro.metrics = frame->learner_metrics().writer(i);
    ro.metrics_mu = frame->learner_metrics().mu(i);
    return ro;
  };
  LocalFleet fleet(*ctx, M, role_options, &syncers, links, base_link);

  // Test hooks: one learner crashes; the others may be held until the syncer counts it out.
  std::mutex hold_mu;
  std::condition_variable hold_cv;
  // Latched once the crashed learner has stopped and the syncer no longer counts it as live:
  // from then on the others train without it. Both the hold and the restart key off this one
  // latch, so a restarted incarnation (live again) cannot keep the others held, and the merges
  // counted before a restart are merges made without the crashed learner. (The restart used to
  // count merges from the moment the crashed thread ended; the crashed learner's own last
  // deltas, merged just after it stopped, satisfied that count, so it restarted while the
  // others were still held, kept itself live and trained alone to the end: the event log then
  // showed no stretch without it, and the restart test failed about 2 runs in 3.)
  std::atomic<bool> crashed_out{false};
  const int crashing = hooks.crash_learner >= 0 && hooks.crash_learner < M ? hooks.crash_learner : -1;
  // The syncer's view must postdate the crash: a status taken before the crashed learner was
  // even heard also says "not live" (that stale answer released the others early too).
  Clock::time_point crashed_at{};
  auto out_of_quorum = [&] {  // call with hold_mu held
    if (crashed_out) return true;
    if (!fleet.Ended(crashing)) return false;
    if (crashed_at == Clock::time_point{}) crashed_at = Clock::now();
    const SyncerStatusSnapshot st = syncers.CurrentStatus(0);  // every shard hears every learner
    if (st.taken > crashed_at && !st.learners.empty() && !st.learners[crashing].live) crashed_out = true;
    return crashed_out.load();
  };
  for (int i = 0; i < M; i++) {
    RoleOptions ro = role_options(i);
    ro.tune = [&, i](LearnerOptions* lo) {
      if (i == crashing) lo->crash_after_steps = hooks.crash_after_steps;
      if (hooks.before_step) lo->before_step = [&hooks, i](long step) { hooks.before_step(i, step); };
      if (crashing >= 0 && i != crashing && hooks.hold_others_at_step >= 0) {
        lo->before_step = [&, i, at = hooks.hold_others_at_step](long step) {
          if (hooks.before_step) hooks.before_step(i, step);
          if (step != at) return;
          // Until it has stopped and the syncer no longer counts it as live (heartbeat timeout).
          const auto t0 = Clock::now();
          std::unique_lock<std::mutex> lock(hold_mu);
          while (Clock::now() - t0 < std::chrono::seconds(60) && !out_of_quorum())
            hold_cv.wait_for(lock, std::chrono::milliseconds(10));
        };
      }
    };
    fleet.Start(i, ro);
  }

  // Chaos (config chaos:), played from the start of training.
  std::unique_ptr<ChaosRunner> chaos;
  if (!cfg.chaos.empty()) {
    const std::vector<ChaosAction> actions = ExpandChaos(cfg.chaos, M, /*horizon_s=*/7 * 24 * 3600.0);
    // The timeline, unless random failures over the horizon make it long.
    if (!options.quiet && actions.size() <= 40)
      std::fprintf(stderr, "chaos schedule:\n%s", ChaosSummary(actions).c_str());
    else if (!options.quiet)
      std::fprintf(stderr, "chaos schedule: %zu actions (random failures included)\n", actions.size());
    chaos = std::make_unique<ChaosRunner>(actions, &fleet, [&](double t_s, const ChaosAction& a) {
      std::string who;  // appended, not " " + name: GCC 12 warns falsely (-Wrestrict) on that
      if (a.learner >= 0) who.append(" ").append(LearnerName(a.learner));
      if (a.shard >= 0) who.append(" ").append(SyncerShardName(a.shard, sc.syncers));
      std::fprintf(stderr, "chaos: t=%.1fs %s%s\n", t_s, std::string(ToString(a.kind)).c_str(), who.c_str());
      (void)frame->metrics().Write(ChaosEventJson(t_s, a));
    });
    chaos->Start();
  }

  // Restart the crashed learner (hooks) from a snapshot once the others have moved the model on.
  if (crashing >= 0 && hooks.restart_after_merges > 0) {
    fleet.WaitEnded(crashing);
    auto others_done = [&] {
      for (int i = 0; i < M; i++)
        if (i != crashing && !fleet.Ended(i)) return false;
      return true;
    };
    {
      std::unique_lock<std::mutex> lock(hold_mu);
      while (!others_done() && !out_of_quorum()) hold_cv.wait_for(lock, std::chrono::milliseconds(10));
      const uint64_t merges0 = syncers.Merges();
      while (!others_done() && syncers.Merges() < merges0 + hooks.restart_after_merges)
        hold_cv.wait_for(lock, std::chrono::milliseconds(10));
    }
    const std::vector<const LearnerResult*> first = fleet.Results()[crashing];
    if (first.back()->crashed) {
      RoleOptions ro = role_options(crashing);
      ro.init_params = nullptr;
      ro.resume = true;  // from the syncer's snapshot
      ro.start_step = first.back()->steps;
      fleet.Start(crashing, ro);
    }
  }
  fleet.JoinAll(chaos.get());
  if (chaos) chaos->Stop();
  const Status syncer_status = syncers.Stop();
  DL_RETURN_IF_ERROR(fleet.FirstError());
  DL_RETURN_IF_ERROR(syncer_status.WithContext("syncer"));
  std::vector<const GlobalState*> shard_states;
  for (int s = 0; s < syncers.shards(); s++) {
    const Syncer* shard = syncers.get(s);
    if (shard == nullptr)
      return Status::Error(SyncerShardName(s, syncers.shards()) + " was killed and never restarted (chaos)");
    shard_states.push_back(&shard->state());
  }

  RunEnd end;
  end.incarnations = fleet.Results();
  end.down = fleet.DownSpans();
  end.end_unix_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  end.merges = &merges;
  // The shards' states as one (each fragment from its owner, counters summed).
  const GlobalState joined = JoinShardStates(shard_states, syncers.get(0)->shards());
  if (syncers.shards() > 1) {
    DL_RETURN_IF_ERROR(SaveGlobalState((fs::path(options.run_dir) / "global_state.bin").string(), joined));
    for (const GlobalState* st : shard_states) end.shard_merges.push_back(st->merges);
  }
  end.outer_steps = joined.merges;
  end.dropped_deltas = joined.dropped_deltas;
  end.rejected_deltas = joined.rejected_deltas;
  for (const FragmentGlobal& f : joined.fragments) end.versions.push_back(f.version);
  std::vector<float> global(table.total_numel());
  for (int s = 0; s < syncers.shards(); s++) syncers.get(s)->GlobalParams(global.data());
  end.global_params = global.data();
  end.peak_rss_mb = peak_rss_mb();
  links.clear();
  end.wall_s = std::chrono::duration<double>(Clock::now() - run_start).count();
  return frame->Finish(end, details, summary);
}

}  // namespace diloco
