#include "daemon/virt/virtual_syncer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "daemon/sync/protocol.h"
#include "daemon/train/trainer.h"
#include "kernels/rng.h"

namespace diloco {

SyncerOptions VirtualSyncerOptions(const RunConfig& cfg, const std::string& run_dir, int shard) {
  SyncerOptions so;
  so.sync = cfg.sync;
  so.shard = shard;
  so.run_dir = run_dir;
  so.count_limits = CountLimitsOf(cfg);
  so.heartbeat_interval_ms = (int)cfg.timing.heartbeat_ms;
  so.exit_when_all_finished = true;
  return so;
}

Status VirtualSyncer::Create(VirtualScheduler& scheduler, VirtualNetwork& network, const SyncerOptions& options,
                             double merge_gbps, const TensorTable& table, const float* init_params,
                             std::unique_ptr<VirtualSyncer>* out, bool durable, uint64_t start) {
  if (options.resume && (!durable || options.run_dir.empty()))
    return Status::Error("syncer: a virtual run resumes only a durable syncer with a run directory");
  if (durable && options.run_dir.empty()) return Status::Error("syncer: a durable virtual syncer needs a run directory");
  DL_RETURN_IF_ERROR(CheckShard(options));
  std::unique_ptr<VirtualSyncer> s(new VirtualSyncer(scheduler, network));
  s->options_ = options;
  s->merge_bytes_per_ns_ = merge_gbps;  // GB/s = bytes/ns
  DL_RETURN_IF_ERROR(PartitionFragments(table, EffectiveFragments(options.sync), &s->fragments_));
  s->shards_ = ShardMap::Of(s->fragments_, options.sync.syncers);
  SyncerStoreOptions store;
  if (durable) store = ShardStoreOptions(options.run_dir, s->shards_, options.shard);
  store.resume = options.resume;
  store.async_checkpoints = false;  // the virtual clock does not run while it writes
  store.sync_log = false;           // a simulated crash loses no page cache
  uint64_t replayed = 0;
  DL_RETURN_IF_ERROR(SyncerStore::Open(store, table, s->fragments_, init_params, &s->state_, &replayed, &s->store_));
  const int M = options.sync.learners;
  s->uplink_expect_.job_id = options.job_id;
  s->uplink_expect_.accept = MessageBit(MessageType::kDelta) | MessageBit(MessageType::kHeartbeat);
  s->uplink_expect_.model_params = table.total_numel();
  for (int i = 0; i < M; i++) s->uplink_expect_.allowed_senders.push_back(LearnerName(i));
  s->router_expect_ = s->uplink_expect_;
  s->router_expect_.accept = MessageBit(MessageType::kHello) | MessageBit(MessageType::kSnapshotRequest);
  s->published_expect_.job_id = options.job_id;
  s->published_expect_.accept = MessageBit(MessageType::kGlobal) | MessageBit(MessageType::kSyncerStatus);
  s->published_expect_.model_params = table.total_numel();
  if (!options.run_dir.empty()) {
    DL_RETURN_IF_ERROR(s->events_.Open((std::filesystem::path(options.run_dir) / "events.log").string()));
    s->have_events_ = true;
  }
  const uint64_t incarnation = mix_seed(options.sync.learners, 0x5e7c, 1 + start) ^ (uint64_t)options.shard;
  s->core_ = std::make_unique<SyncerCore>(s->options_, s->fragments_, &s->state_, table, incarnation, s.get());
  std::vector<MergeEvent> merges;
  DL_RETURN_IF_ERROR(s->store_->RecalledMerges(&merges));
  s->core_->RecallMerges(merges);
  *out = std::move(s);
  return Status::Ok();
}

VirtualSyncer::~VirtualSyncer() {
  if (timer_ != 0) scheduler_.Cancel(timer_);
  if (drain_timer_ != 0) scheduler_.Cancel(drain_timer_);
}

void VirtualSyncer::Start() { Tick(); }

void VirtualSyncer::JumpClock(int64_t jump_ns) {
  clock_offset_ns_ += std::max<int64_t>(0, jump_ns);
  if (!draining_) Tick();  // the timer was set on the old clock: what is due now runs now
}

Status VirtualSyncer::LogUpdate(const UpdateRecord& record) { return store_->LogUpdate(record); }

void VirtualSyncer::Checkpoint(const GlobalState& state) {
  After(store_->Checkpoint(state, [this](const std::string& line) { Note(line); }));
}

// A message that arrives while a merge keeps the syncer busy waits, as in its socket's queue.
// When the merge is done, every waiting message is taken, then the core decides: the wall
// syncer's loop (a batch of messages, then OnTimer), so merges that follow each other cannot
// starve a waiting message (a rejoining learner's Hello waited forever behind a busy syncer).
bool VirtualSyncer::Busy(std::function<void()> again) {
  if (scheduler_.now_ns() >= busy_until_ns_) return false;
  deferred_.push_back(std::move(again));
  ScheduleDrain();
  return true;
}

void VirtualSyncer::ScheduleDrain() {
  if (drain_timer_ != 0) return;  // Drain looks again if the merge was extended meanwhile
  drain_timer_ = scheduler_.At(busy_until_ns_, [this] {
    drain_timer_ = 0;
    Drain();
  });
}

void VirtualSyncer::Drain() {
  if (scheduler_.now_ns() < busy_until_ns_) {
    ScheduleDrain();
    return;
  }
  draining_ = true;
  while (!deferred_.empty()) {
    std::function<void()> handle = std::move(deferred_.front());
    deferred_.pop_front();
    handle();
  }
  draining_ = false;
  Tick();
}

void VirtualSyncer::OnUplink(int learner, const std::string& topic, net::Message&& m) {
  auto msg = std::make_shared<net::Message>(std::move(m));
  if (Busy([this, learner, topic, msg] { OnUplink(learner, topic, std::move(*msg)); })) return;
  bytes_received_ += msg->bytes();
  ParsedMessage parsed;
  const auto spans = msg->spans();
  if (Status st = ParseEnvelope(spans, uplink_expect_, &parsed); !st.ok()) {
    Note("dropping an uplink message from " + LearnerName(learner) + ": " + st.message());
    return;
  }
  net::Received r;
  r.topic = topic;
  r.seq = uplink_seq_[topic].Observe(parsed.header.sender, parsed.header.incarnation, parsed.header.seq);
  if (!r.seq.deliver()) return;
  r.message = std::move(*msg);
  core_->OnUplink(r, parsed);
  if (!draining_) Tick();
}

void VirtualSyncer::OnRequest(int learner, net::Message&& m) {
  auto msg = std::make_shared<net::Message>(std::move(m));
  if (Busy([this, learner, msg] { OnRequest(learner, std::move(*msg)); })) return;
  bytes_received_ += msg->bytes();
  ParsedMessage parsed;
  const auto spans = msg->spans();
  if (Status st = ParseEnvelope(spans, router_expect_, &parsed); !st.ok()) {
    Note("dropping a request from " + LearnerName(learner) + ": " + st.message());
    return;
  }
  net::Received r;
  r.peer = LearnerName(learner);
  r.message = std::move(*msg);
  After(core_->OnRequest(r, parsed));
  if (!draining_) Tick();
}

void VirtualSyncer::Tick() {
  if (!error_.ok()) return;
  if (scheduler_.now_ns() < busy_until_ns_) {
    ScheduleDrain();  // decides once the merge is done and what waited is in
    return;
  }
  SyncTime wake = Now() + std::chrono::hours(1);
  After(core_->OnTimer(&wake));
  if (!error_.ok() || core_->AllDone()) return;
  const int64_t at =
      std::max(VirtualScheduler::ToNs(wake) - clock_offset_ns_, std::max(scheduler_.now_ns(), busy_until_ns_));
  if (timer_ != 0 && timer_at_ns_ == at) return;
  if (timer_ != 0) scheduler_.Cancel(timer_);
  timer_at_ns_ = at;
  timer_ = scheduler_.At(at, [this] {
    timer_ = 0;
    Drain();
  });
}

void VirtualSyncer::After(Status st) {
  if (!st.ok() && error_.ok()) error_ = st.WithContext("syncer");
}

// A Global costs the syncer its merge (the fragment's fp32 bytes times its contributors over
// timing.merge_gbps) before it leaves.
void VirtualSyncer::Publish(net::Message&& m) {
  ParsedMessage parsed;
  const auto spans = m.spans();
  size_t charged = 0;
  if (ParseEnvelope(spans, published_expect_, &parsed).ok())
    if (const GlobalMsg* g = parsed.get<GlobalMsg>(); g && g->fragment < fragments_.size()) {
      const bool charge = g->fragment < charged_merge_bytes_.size();
      const double fragment_bytes =
          charge ? charged_merge_bytes_[g->fragment] : (double)fragments_[g->fragment].numel * sizeof(float);
      const double bytes = fragment_bytes * (double)g->contributors.size();
      busy_until_ns_ = std::max(scheduler_.now_ns(), busy_until_ns_) + (int64_t)(bytes / merge_bytes_per_ns_);
      if (charge) charged = (size_t)charged_global_bytes_[g->fragment];
      if (on_global) on_global(*g);
    }
  bytes_published_ += m.bytes();
  network_.SyncerPublish(options_.shard, std::max(scheduler_.now_ns(), busy_until_ns_), m, charged);
}

void VirtualSyncer::Reply(const std::string& peer, net::Message&& m) {
  const int learner = LearnerIndexOf(peer);
  if (learner < 0 || learner >= network_.learners()) return;
  bytes_published_ += m.bytes();
  network_.SyncerReply(options_.shard, std::max(scheduler_.now_ns(), busy_until_ns_), learner, std::move(m));
}

void VirtualSyncer::OnMerge(const MergeEvent& event) {
  if (options_.on_merge) options_.on_merge(event);
  merges_.push_back(event);
  if (have_events_) After(events_.Append(event));
}

void VirtualSyncer::Note(const std::string& line) { std::fprintf(stderr, "%s: %s\n", core_->name().c_str(), line.c_str()); }

Status VirtualSyncer::Finish() {
  DL_RETURN_IF_ERROR(error_);
  if (timer_ != 0) scheduler_.Cancel(timer_);
  if (drain_timer_ != 0) scheduler_.Cancel(drain_timer_);
  timer_ = drain_timer_ = 0;
  DL_RETURN_IF_ERROR(core_->Flush().WithContext("syncer"));
  if (store_->durable()) return store_->SaveFinal(state_);
  // Not durable: the final state is still the run's model (the world joins the shards' own).
  if (!options_.run_dir.empty() && shards_.shards() == 1)
    DL_RETURN_IF_ERROR(SaveGlobalState((std::filesystem::path(options_.run_dir) / "global_state.bin").string(), state_));
  return Status::Ok();
}

std::string VirtualSyncer::Describe() {
  std::string out = core_->name() + ":";
  for (const uint32_t p : shards_.FragmentsOf(options_.shard)) {
    out += " fragment " + std::to_string(p) + " v" + std::to_string(state_.fragments[p].version) + " (" +
           std::to_string(core_->book().PendingCount((uint32_t)p)) + " pending";
    // Whose deltas the open round holds: learner@step/base, to see whom it waits for.
    for (const PendingDelta& pd : core_->book().Pending((uint32_t)p))
      out += " " + std::to_string(pd.learner) + "@" + std::to_string(pd.learner_step) + "/" +
             std::to_string(pd.base_version);
    out += ");";
  }
  for (int i = 0; i < options_.sync.learners; i++)
    out += " " + LearnerName(i) + (core_->book().Live(i, Now()) ? " live" : " not live") +
           (core_->learners()[i].heard ? "" : " (never heard)") + ";";
  return out;
}

void VirtualSyncer::GlobalParams(float* flat) const {
  for (const uint32_t p : shards_.FragmentsOf(options_.shard))
    ScatterFragment(fragments_[p], state_.fragments[p].theta.data(), flat);
}

}  // namespace diloco
