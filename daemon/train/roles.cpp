#include "daemon/train/roles.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "daemon/sync/live_goodput.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/shard_fetch.h"
#include "daemon/sync/shards.h"
#include "daemon/sync/syncer.h"
#include "daemon/sync/syncer_store.h"
#include "daemon/sync/global_state.h"
#include "daemon/train/checkpoint.h"
#include "daemon/train/trainer.h"
#include "daemon/train/data.h"
#include "daemon/util/proc_stats.h"
#include "daemon/util/unix_time.h"
#include "daemon/train/learner.h"
#include "daemon/train/learner_link.h"
#include "daemon/train/local_ring.h"
#include "daemon/train/ring_member.h"
#include "daemon/train/run_dir.h"
#include "daemon/train/run_frame.h"
#include "kernels/comm/comm_store.h"
#include "daemon/util/atomic_file.h"
#include "daemon/util/jsonl_writer.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* StateName(LearnerState s) {
  switch (s) {
    case LearnerState::kJoining: return "joining";
    case LearnerState::kTraining: return "training";
    case LearnerState::kResyncing: return "resyncing";
    case LearnerState::kStopping: return "stopping";
    case LearnerState::kFinished: return "finished";
    case LearnerState::kFailed: return "failed";
  }
  return "unknown";
}

// The syncer's counters as its status and its result both show them (SyncerStatusSnapshot
// while it runs, SyncerResult at its end: the same fields).
template <typename Counters>
nlohmann::json SyncerCountersJson(const Counters& c) {
  return {{"merges", c.merges},
          {"dropped_deltas", c.dropped_deltas},
          {"rejected_deltas", c.rejected_deltas},
          {"bytes_received", c.bytes_received},
          {"bytes_published", c.bytes_published},
          {"snapshots_served", c.snapshots_served},
          {"versions", c.versions}};
}

}  // namespace

struct Role::Impl {
  RoleOptions options;
  bool is_syncer = false;
  // Set on the role's thread once its start-up is over: the syncer built (live), the learner's
  // model initialized (started). Before that Progress says "starting".
  std::atomic<Syncer*> live{nullptr};
  std::atomic<bool> started{false};
  std::atomic<double> startup_s{0};
  std::vector<float> init;  // the initial model when it is not handed in (InitialModel)
  // Syncer role. The merge tape outlives the syncer that feeds it.
  MergeTape merges;
  std::unique_ptr<Syncer> syncer;
  std::unique_ptr<LiveGoodput> goodput;
  std::unique_ptr<Corpus> corpus;
  // Learner role.
  int index = -1;
  LearnerResult learner_result;  // written by its thread; read once done
  std::atomic<bool> stop{false}, crash{false};
  std::atomic<double> slowdown{1};
  std::shared_ptr<net::Link> link;  // options.link, or made for options.chaos_link
  JsonlWriter metrics;

  // The syncer's start-up, on its thread: the corpus (for the final evaluation), the initial
  // model, the syncer itself (binding its sockets; restoring global_state.bin on a resume) and
  // its goodput readers. A restart may find its ports still held by the role it replaces: it
  // tries again for options.bind_retry_s.
  Status BuildSyncer(net::NetContext& context) {
    const RunConfig& cfg = options.config;
    if (options.evaluate)
      DL_RETURN_IF_ERROR(Corpus::Load(cfg.data.corpus, CorpusOptionsOf(cfg, 0, cfg.sync.learners), &corpus));
    const TensorTable table = gpt_tensor_table(GptConfigOf(cfg.model));
    const float* init_params = InitialModel();
    SyncerOptions so;
    so.sync = cfg.sync;
    so.job_id = options.job_id;
    so.shard = options.shard;
    if (options.shard < 0 || options.shard >= (int)options.syncers.size())
      return Status::Error("no endpoints for syncer shard " + std::to_string(options.shard));
    so.endpoints = options.syncers[options.shard];
    so.run_dir = options.run_dir;
    so.count_limits = CountLimitsOf(cfg);
    so.allow_plaintext = options.allow_plaintext;
    so.curve = options.curve;
    if (so.curve) so.curve->server = true;
    so.learner_keys = options.learner_keys;
    if (so.curve) so.home_key = options.syncers.front().curve_server_key;
    // A dilocod job's other shards stay to hand the home their final fragments (it evaluates the
    // joined model); local mode joins its shards in-process (evaluate false).
    if (options.evaluate && cfg.sync.syncers > 1 && options.shard != 0) so.serve_home_ms = 180000;
    so.resume = options.resume &&
                fs::exists(fs::path(ShardStoreDir(options.run_dir, options.shard, cfg.sync.syncers)) / "global_state.bin");
    so.exit_when_all_finished = true;
    // A resumed syncer's job keeps the merges it made before (status, goodput).
    if (Status st = merges.Load((fs::path(options.run_dir) / "events.log").string()); !st.ok())
      Log("the merges before this start are not in the job's accounts: " + st.message());
    so.on_merge = merges.Listener();
    if (options.tune_syncer) options.tune_syncer(&so);
    const auto give_up = Clock::now() + std::chrono::milliseconds((int64_t)(options.bind_retry_s * 1000));
    for (;;) {
      Status st = Syncer::Create(context, so, table, init_params, &syncer);
      const bool port_busy = st.code() == StatusCode::kAddressInUse;
      if (!port_busy || Clock::now() >= give_up || crash) DL_RETURN_IF_ERROR(st);
      if (st.ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    LiveGoodputOptions go;
    go.learners = cfg.sync.learners;
    // A shard accounts its own fragments, as if they were the model (JoinShardResults weighs the
    // shards' figures by their shares).
    const std::vector<double> weights = FragmentWeights(syncer->fragments());
    go.fragment_weights.assign(weights.size(), 0.0);
    double share = 0;
    for (uint32_t p : syncer->owned_fragments()) share += weights[p];
    for (uint32_t p : syncer->owned_fragments()) go.fragment_weights[p] = weights[p] / share;
    go.tokens_per_step = (double)LearnerTokensPerStep(cfg);
    go.inner_steps = cfg.sync.inner_steps;
    go.merges = &merges;
    go.start_unix_ms = UnixMsNow();
    goodput = std::make_unique<LiveGoodput>(go);
    return Status::Ok();
  }
  // The home shard (shard 0 of a dilocod job's several): the other shards' final fragments into
  // flat and versions (sync/shard_fetch.h).
  Status FetchOtherShards(net::NetContext& context, float* flat, std::vector<uint64_t>* versions) {
    ShardFetchOptions fo;
    fo.job_id = options.job_id;
    fo.syncers = options.syncers;
    fo.allow_plaintext = options.allow_plaintext;
    fo.curve = options.curve;
    fo.model_params = gpt_tensor_table(GptConfigOf(options.config.model)).total_numel();
    Log("taking the other shards' final fragments for the joined model");
    return FetchShardFragments(context, fo, syncer->fragments(), syncer->shards(), flat, versions)
        .WithContext("the joined model");
  }
  std::mutex metrics_mu;
  mutable std::mutex progress_mu;
  LearnerProgress progress;
  long start_step = 0;
  // A ring across hosts (guarded by progress_mu): host 0's learner's incarnation and how many
  // ended; a member's progress and the ring it follows (to abort it on a kill or shutdown).
  bool member = false;
  std::string ring_incarnation, ring_last_error;
  int ring_restarts = 0;
  RingMemberProgress member_progress;
  LocalRing* member_ring = nullptr;
  void Log(const std::string& line) const {
    if (options.log) options.log(line);
  }
  // The run's initial model: handed in (local mode), else made from train.seed on first use.
  const float* InitialModel() {
    if (options.init_params) return options.init_params;
    if (init.empty()) {
      const GptConfig gc = GptConfigOf(options.config.model);
      init.resize(gpt_tensor_table(gc).total_numel());
      gpt_init_params(gc, options.config.train.seed, init.data());
    }
    return init.data();
  }
};

std::unique_ptr<Role> Role::Make(const std::string& name, const RoleOptions& options, int index) {
  std::unique_ptr<Role> role(new Role());
  role->name_ = name;
  role->impl_ = std::make_unique<Impl>();
  role->impl_->options = options;
  role->impl_->index = index;
  return role;
}

Status Role::StartSyncer(net::NetContext& context, const RoleOptions& options, std::unique_ptr<Role>* out) {
  std::unique_ptr<Role> role = Make(SyncerShardName(options.shard, options.config.sync.syncers), options, -1);
  Impl& im = *role->impl_;
  im.is_syncer = true;
  DL_RETURN_IF_ERROR(PrepareRunDir(options.run_dir, options.config));
  // The rest (corpus, model, sockets, a restored state) on the role's thread: the daemon's
  // control loop goes on answering meanwhile (status shows the role as "starting").
  Role* r = role.get();
  role->thread_ = std::thread([r, &context] { r->RunToEnd([&](nlohmann::json* result) { return r->RunSyncer(context, result); }); });
  *out = std::move(role);
  return Status::Ok();
}

Status Role::RunSyncer(net::NetContext& context, nlohmann::json* result) {
  Impl& im = *impl_;
  const auto started = Clock::now();
  DL_RETURN_IF_ERROR(im.BuildSyncer(context).WithContext("starting the syncer"));
  im.startup_s = std::chrono::duration<double>(Clock::now() - started).count();
  // Visible to Progress, RequestStop and Kill from here; what they asked for meanwhile applies now.
  im.live = im.syncer.get();
  if (killed_) im.syncer->Abort();
  if (im.stop || im.crash) im.syncer->RequestStop();
  Status st = im.syncer->Run();
  // As the learners left it (before the evaluation below).
  nlohmann::json goodput;
  Observe();
  if (GoodputReport g; im.goodput->Report(UnixMsNow(), &g).ok()) goodput = GoodputToJson(g);
  const std::string state_path = im.syncer->state_path();
  // Killed on purpose (chaos): nothing saved, as after kill -9; the update log holds every
  // published version.
  if (killed_) return Status::Error("killed (chaos)");
  if (im.crash) {
    // The daemon is going down: Run may have ended on the closed context before its own last
    // save, so save here what a restart resumes from (versions never go back).
    DL_RETURN_IF_ERROR(SaveGlobalState(state_path, im.syncer->state()));
    return Status::Error("interrupted by the daemon's shutdown");
  }
  DL_RETURN_IF_ERROR(st);
  const SyncerResult& sr = im.syncer->result();
  // Local mode: its run frame evaluates and saves (run_frame.h); a shard other than the home: the
  // home evaluates the joined model.
  if (!im.options.evaluate || im.options.shard != 0) {
    *result = SyncerCountersJson(sr);
    if (im.options.evaluate && !goodput.is_null()) (*result)["goodput"] = goodput;  // its fragments'
    return Status::Ok();
  }
  const RunConfig& cfg = im.options.config;
  const GptConfig gc = GptConfigOf(cfg.model);
  const BatchSampler val = ValSampler(*im.corpus, cfg.train.batch_size, cfg.model.block_size, cfg.train.seed);
  omp_set_num_threads(std::max(1, im.options.threads));
  std::vector<float> global(gpt_tensor_table(gc).total_numel());
  im.syncer->GlobalParams(global.data());
  std::vector<uint64_t> versions = sr.versions;
  if (cfg.sync.syncers > 1) DL_RETURN_IF_ERROR(im.FetchOtherShards(context, global.data(), &versions));
  // The merged model as a trainer checkpoint too, for `dilococtl sample` and the demo.
  std::string ckpt_path;
  DL_RETURN_IF_ERROR(SaveMergedCheckpoint(im.options.run_dir, cfg, global.data(), sr.merges, &ckpt_path));
  // On the device the role plan gives it (train/role_plan.h): its site's first learner's, or the CPU.
  const std::string eval_device = im.options.device.empty() ? "cpu" : im.options.device;
  double initial_val_loss = 0, final_val_loss = 0;
  DL_RETURN_IF_ERROR(EvaluateParams(eval_device, gc, im.InitialModel(), val, cfg.eval.batches, &initial_val_loss));
  DL_RETURN_IF_ERROR(EvaluateParams(eval_device, gc, global.data(), val, cfg.eval.batches, &final_val_loss));
  *result = SyncerCountersJson(sr);
  (*result)["versions"] = versions;
  result->update({{"initial_val_loss", initial_val_loss},
                  {"final_val_loss", final_val_loss},
                  {"final_val_batches", cfg.eval.batches},
                  {"global_state", state_path},
                  {"checkpoint", ckpt_path},
                  {"wall_s", std::chrono::duration<double>(Clock::now() - started).count()},
                  {"peak_rss_mb", peak_rss_mb()}});
  if (!goodput.is_null()) (*result)["goodput"] = goodput;
  return Status::Ok();
}

Status Role::StartLearner(net::NetContext& context, const RoleOptions& options, int index,
                          std::unique_ptr<Role>* out) {
  std::unique_ptr<Role> role = Make(LearnerName(index), options, index);
  Impl& im = *role->impl_;
  DL_RETURN_IF_ERROR(PrepareRunDir(options.run_dir, options.config));
  const RunConfig& cfg = options.config;
  TrainConfig ring = cfg.train;
  if (!options.device.empty()) ring.device = options.device;
  DL_RETURN_IF_ERROR(CheckTrainDevice(ring).WithContext(LearnerName(index)));
  if (options.start_step >= 0) {
    im.start_step = options.start_step;
  } else if (options.resume) {
    DL_RETURN_IF_ERROR(ReadLearnerStep(options.run_dir, index, &im.start_step));
  }
  if (!options.metrics) DL_RETURN_IF_ERROR(im.metrics.Open(LearnerMetricsPath(options.run_dir, index)));
  im.progress.index = index;
  im.progress.step = im.start_step;
  im.slowdown = SlowdownOf(cfg.learners, index);
  im.link = options.link;
  if (!im.link && options.chaos_link)
    DL_RETURN_IF_ERROR(CreateLearnerLink(context, cfg, index, net::LinkParams{}, &im.link));
  Role* r = role.get();
  role->thread_ = std::thread([r, &context] { r->RunToEnd([&](nlohmann::json* result) { return r->RunLearnerRole(context, result); }); });
  *out = std::move(role);
  return Status::Ok();
}

// Host 0's learner whose ring spans train.hosts hosts: one incarnation after another until one
// ends otherwise than by its ring's failure (roles.h).
Status Role::RunLearnerAcrossHosts(net::NetContext& context, LearnerOptions lo, LearnerResult* res) {
  Impl& im = *impl_;
  const RunConfig& cfg = im.options.config;
  if (!im.options.ring_store) return Status::Error(name_ + ": train.hosts " + std::to_string(cfg.train.hosts) + ": no ring store");
  const int64_t boot_ms = UnixMsNow();
  const std::shared_ptr<CommStore> pointer = im.options.ring_store(RingPointerName(im.index), &im.crash);
  for (int attempt = 0;; attempt++) {
    const std::string name = RingIncarnationName(im.options.job_id, im.index, boot_ms, attempt);
    {
      std::lock_guard<std::mutex> lock(im.progress_mu);
      im.ring_incarnation = name;
    }
    im.Log(name_ + ": ring incarnation " + name + " starts: waiting for the site's " + std::to_string(cfg.train.hosts) +
           " hosts");
    Status st;
    if (CommStatus cs = pointer->set(kRingIncarnationKey, std::vector<char>(name.begin(), name.end())); !cs.ok())
      st = Status::Error("ring " + name + ": publishing its name: " + cs.error);
    if (st.ok()) {
      lo.make_ring = [&](const LocalRingOptions& ro, std::unique_ptr<LocalRing>* out) {
        RingAcrossHosts across;
        across.host = 0;
        across.hosts = cfg.train.hosts;
        across.ring_name = name;
        across.ring_address = im.options.ring_address;
        across.timeout_ms = im.options.ring_timeout_ms;
        across.store = im.options.ring_store(name, &im.crash);
        Status made = LocalRing::CreateAcrossHosts(ro, across, out);
        if (made.ok()) im.Log(name_ + ": ring incarnation " + name + " joined by every host");
        return made;
      };
      *res = LearnerResult{};
      st = RunLearner(context, lo, res);
    }
    if (st.ok()) return st;
    // Stopped, killed, the daemon going down, or a failure of the learner itself: the end.
    if (im.stop || im.crash || killed_ || st.message().find(name) == std::string::npos) return st;
    {
      std::lock_guard<std::mutex> lock(im.progress_mu);
      im.ring_restarts++;
      im.ring_last_error = st.message();
      im.progress.state = LearnerState::kJoining;
    }
    im.Log(name_ + ": ring incarnation " + name + " ended: " + st.message() +
           "; the next one starts once the site's hosts are back, and rejoins from the syncer's snapshot");
    for (int i = 0; i < 10 && !im.crash && !im.stop; i++) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (im.stop || im.crash) return st;
    lo.join_from_snapshot = true;
    long step = 0;
    if (ReadLearnerStep(im.options.run_dir, im.index, &step).ok()) lo.start_step = step;
    im.start_step = lo.start_step;
  }
}

Status Role::StartRingMember(net::NetContext& context, const RoleOptions& options, int index, std::unique_ptr<Role>* out) {
  std::unique_ptr<Role> role = Make(LearnerName(index), options, index);
  Impl& im = *role->impl_;
  im.member = true;
  (void)context;
  const RunConfig& cfg = options.config;
  if (options.ring_host < 1 || options.ring_host >= cfg.train.hosts)
    return Status::Error(LearnerName(index) + ": host " + std::to_string(options.ring_host) +
                         " is not a member of its ring of train.hosts " + std::to_string(cfg.train.hosts));
  if (!options.ring_store) return Status::Error(LearnerName(index) + ": no ring store");
  DL_RETURN_IF_ERROR(PrepareRunDir(options.run_dir, options.config));
  Role* r = role.get();
  role->thread_ = std::thread([r] { r->RunToEnd([&](nlohmann::json* result) { return r->RunRingMemberRole(result); }); });
  *out = std::move(role);
  return Status::Ok();
}

Status Role::RunRingMemberRole(nlohmann::json* result) {
  Impl& im = *impl_;
  RingMemberOptions mo;
  mo.index = im.index;
  mo.config = &im.options.config;
  mo.host = im.options.ring_host;
  mo.ring_address = im.options.ring_address;
  mo.timeout_ms = im.options.ring_timeout_ms;
  mo.threads = std::max(1, im.options.threads);
  mo.store_of = [&im](const std::string& ring) { return im.options.ring_store(ring, &im.crash); };
  mo.stop = &im.crash;  // a stop comes through the ring from host 0; the daemon going down or a kill end it here
  mo.on_ring = [&im](LocalRing* ring) {
    std::lock_guard<std::mutex> lock(im.progress_mu);
    im.member_ring = ring;
    if (ring && im.crash) ring->Abort("this host's dilocod is stopping the ring member");
  };
  mo.on_progress = [&im, this](const RingMemberProgress& p) {
    std::string line;
    {
      std::lock_guard<std::mutex> lock(im.progress_mu);
      if (p.state != im.member_progress.state || p.incarnation != im.member_progress.incarnation)
        line = name_ + " (ring member, host " + std::to_string(im.options.ring_host) + "): " + p.state +
               (p.incarnation.empty() ? "" : " " + p.incarnation) +
               (p.state == "waiting" && !p.last_error.empty() ? " (last ring: " + p.last_error + ")" : "");
      im.member_progress = p;
    }
    if (!line.empty()) im.Log(line);
  };
  RingMemberResult res;
  DL_RETURN_IF_ERROR(RunRingMember(mo, &res));
  if (killed_) return Status::Error("killed (chaos)");
  if (im.crash && res.stopped) return Status::Error("interrupted by the daemon's shutdown");
  *result = {{"ring_member", true},
             {"host", im.options.ring_host},
             {"incarnations", res.incarnations},
             {"steps", res.steps},
             {"stopped", res.stopped}};
  return Status::Ok();
}

Status Role::RunLearnerRole(net::NetContext& context, nlohmann::json* result) {
  Impl& im = *impl_;
  // The initial model on this thread (seconds for a big one), not on the daemon's loop.
  const auto started = Clock::now();
  const float* init = im.InitialModel();
  im.startup_s = std::chrono::duration<double>(Clock::now() - started).count();
  im.started = true;
  LearnerOptions lo;
  lo.index = im.index;
  lo.config = &im.options.config;
  lo.job_id = im.options.job_id;
  lo.syncers = im.options.syncers;
  lo.allow_plaintext = im.options.allow_plaintext;
  lo.curve = im.options.curve;
  lo.init_params = init;
  lo.join_from_snapshot = im.options.resume;
  lo.start_step = im.start_step;
  lo.time_budget_start_unix_ms = im.options.time_budget_start_unix_ms;
  lo.threads = std::max(1, im.options.threads);
  lo.run_dir = im.options.run_dir;
  lo.device = im.options.device;
  lo.metrics = im.options.metrics ? im.options.metrics : &im.metrics;
  lo.metrics_mu = im.options.metrics ? im.options.metrics_mu : &im.metrics_mu;
  lo.stop = &im.stop;
  lo.crash = &im.crash;
  lo.slowdown = &im.slowdown;
  lo.link = im.link;
  lo.on_progress = [&im](const LearnerProgress& p) {
    std::lock_guard<std::mutex> lock(im.progress_mu);
    im.progress = p;
  };
  if (im.options.tune) im.options.tune(&lo);
  LearnerResult& res = im.learner_result;
  if (im.options.config.train.hosts <= 1) {
    DL_RETURN_IF_ERROR(RunLearner(context, lo, &res));
  } else {
    DL_RETURN_IF_ERROR(RunLearnerAcrossHosts(context, lo, &res));
  }
  *result = {{"steps", res.steps},
             {"start_step", im.start_step},
             {"tokens", res.tokens},
             {"train_s", res.train_s},
             {"final_train_loss", res.final_train_loss},
             {"bytes_up", res.bytes_up},
             {"bytes_down", res.bytes_down},
             {"deltas_sent", res.deltas_sent},
             {"globals_applied", res.globals_applied},
             {"snapshots_installed", res.snapshots_installed},
             {"wait_s", res.wait_s},
             {"crashed", res.crashed},
             {"peak_rss_mb", peak_rss_mb()},
             {"stopped", res.stopped}};
  return Status::Ok();
}

void Role::RunToEnd(const std::function<Status(nlohmann::json* result)>& body) {
  Status st;
  nlohmann::json result;
  try {
    st = body(&result);
  } catch (const std::exception& e) {
    st = Status::Error(name_ + " failed: " + e.what());
  }
  std::lock_guard<std::mutex> lock(mu_);
  outcome_ = st;
  result_ = std::move(result);
  done_ = true;
}

Role::~Role() {
  RequestShutdown();
  Join();
}

Status Role::outcome() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outcome_;
}

nlohmann::json Role::result() const {
  std::lock_guard<std::mutex> lock(mu_);
  return result_;
}

nlohmann::json Role::Progress() const {
  const Impl& im = *impl_;
  if (im.is_syncer) {
    const Syncer* syncer = im.live;
    if (!syncer) return {{"role", "syncer"}, {"phase", "starting"}};
    const SyncerStatusSnapshot s = syncer->CurrentStatus();
    nlohmann::json learners = nlohmann::json::array();
    for (const LearnerStatusEntry& l : s.learners) {
      learners.push_back({{"learner", l.learner},
                          {"heard", l.heard},
                          {"live", l.live},
                          {"state", StateName(l.state)},
                          {"step", l.step},
                          {"tokens", l.tokens},
                          {"loss", l.loss},
                          {"tokens_per_s", l.tokens_per_s},
                          {"last_heard_unix_ms", l.last_heard_unix_ms},
                          {"merged", l.ledger.merged},
                          {"merged_tokens", l.ledger.tokens},
                          {"dropped", l.ledger.dropped},
                          {"rejected", l.ledger.rejected}});
    }
    nlohmann::json out = SyncerCountersJson(s);
    out.update({{"role", "syncer"},
                {"shard", im.options.shard},
                {"fragments", syncer->owned_fragments()},
                {"running", s.running},
                {"impostor_messages", s.impostors},
                {"learners", learners},
                {"startup_s", im.startup_s.load()}});
    im.merges.AddStatsTo(&out);
    GoodputReport g;
    if (im.goodput->Report(UnixMsNow(), &g).ok()) out["goodput"] = GoodputToJson(g);
    return out;
  }
  LearnerProgress p;
  nlohmann::json ring;
  {
    std::lock_guard<std::mutex> lock(im.progress_mu);
    p = im.progress;
    if (im.member)
      return {{"role", "ring-member"},
              {"learner", im.index},
              {"host", im.options.ring_host},
              {"hosts", im.options.config.train.hosts},
              {"state", im.member_progress.state},
              {"incarnation", im.member_progress.incarnation},
              {"incarnations", im.member_progress.incarnations},
              {"last_error", im.member_progress.last_error}};
    if (im.options.config.train.hosts > 1)
      ring = {{"hosts", im.options.config.train.hosts},
              {"incarnation", im.ring_incarnation},
              {"restarts", im.ring_restarts},
              {"last_error", im.ring_last_error}};
  }
  const TrainConfig& tc = im.options.config.train;
  if (!im.started) {
    nlohmann::json out = {{"role", LearnerName(im.index)}, {"learner", im.index}, {"phase", "starting"}, {"step", p.step}};
    if (!ring.is_null()) out["ring"] = ring;
    return out;
  }
  nlohmann::json out = {{"role", LearnerName(im.index)},
          {"learner", im.index},
          {"device", p.device.empty() ? tc.device : p.device},
          {"ranks", tc.ranks * std::max(1, tc.hosts)},  // the whole ring, over the site's hosts
          {"state", StateName(p.state)},
          {"step", p.step},
          {"steps", im.options.config.train.steps},
          {"tokens", p.tokens},
          {"loss", p.loss},
          {"tokens_per_s", p.tokens_per_s},
          {"last_fragment_sent", p.last_fragment_sent},
          {"last_fragment_folded", p.last_fragment_folded},
          {"base_versions", p.base_versions},
          {"deltas_sent", p.deltas_sent},
          {"globals_applied", p.globals_applied},
          {"snapshots_installed", p.snapshots_installed},
          {"startup_s", im.startup_s.load()}};
  if (!ring.is_null()) out["ring"] = ring;
  return out;
}

// The flag first, then the syncer if it is live: a syncer still starting sees the flag when
// it goes live (its thread sets live, then reads the flags).
void Role::RequestStop() {
  impl_->stop = true;
  if (Syncer* s = impl_->live) s->RequestStop();
}

void Role::RequestShutdown() {
  impl_->crash = true;
  AbortMemberRing();
  if (Syncer* s = impl_->live) s->RequestStop();
}

void Role::Observe() {
  Impl& im = *impl_;
  if (Syncer* s = im.live) im.goodput->Observe(s->CurrentStatus(), UnixMsNow());
}

void Role::AbortMemberRing() {
  std::lock_guard<std::mutex> lock(impl_->progress_mu);
  if (impl_->member_ring) impl_->member_ring->Abort("this host's dilocod is stopping the ring member");
}

void Role::Kill() {
  killed_ = true;
  impl_->crash = true;
  AbortMemberRing();
  if (Syncer* s = impl_->live) s->Abort();
}

Status Role::SetSlowdown(double factor) {
  Impl& im = *impl_;
  if (im.is_syncer) return Status::Error("the syncer takes no slowdown");
  im.slowdown = factor > 0 ? factor : SlowdownOf(im.options.config.learners, im.index);
  return Status::Ok();
}

Status Role::ShapeLink(const std::function<void(net::LinkParams*)>& change) {
  Impl& im = *impl_;
  if (!im.link)
    return Status::Error(name_ + " has no emulated link to cut: it started before this site's config said chaos: true");
  return im.link->Change(change);
}

Syncer* Role::syncer() const { return impl_->live; }

long Role::step() const {
  std::lock_guard<std::mutex> lock(impl_->progress_mu);
  return impl_->progress.step;
}

const LearnerResult& Role::learner_result() const { return impl_->learner_result; }

void Role::Join() {
  if (thread_.joinable()) thread_.join();
}

}  // namespace diloco
