// The wall-clock runtime around SyncerCore (syncer_core.h): ZeroMQ sockets, a poll and drain
// loop, the status copy other threads read, and behind the core's port the update log,
// events.log and the checkpoint writer. Every decision is the core's.
#include "daemon/sync/syncer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>

#include "daemon/net/channel.h"
#include "daemon/net/wire_transport.h"
#include "daemon/sync/core_clock.h"
#include "daemon/sync/event_log.h"
#include "daemon/sync/syncer_core.h"
#include "daemon/sync/syncer_store.h"
#include "daemon/util/log.h"

namespace diloco {

// The runtime's state, and the core's port: what the core publishes goes to the sockets, what it
// logs to run_dir.
struct Syncer::Impl final : public SyncerPort {
  SyncerOptions options;
  ShardMap shards;   // which shard merges which fragment
  std::string name;  // this shard's (shards.h): "syncer" when it is the only one
  std::unique_ptr<net::SubChannel> uplink;
  std::unique_ptr<net::PubChannel> downlink;
  std::unique_ptr<net::RouterChannel> router;
  std::shared_ptr<ParsedMessage> parsed = std::make_shared<ParsedMessage>();
  std::shared_ptr<ParsedMessage> router_parsed = std::make_shared<ParsedMessage>();
  std::vector<net::Socket*> sockets;  // polled: the uplink, the router
  std::vector<bool> ready;
  EventLog events;
  bool have_events = false;
  // Durability (see the header): every update is in the log before it is published; checkpoints
  // are written by a thread of their own.
  std::unique_ptr<SyncerStore> store;
  std::unique_ptr<SyncerCore> core;
  Status port_error;  // the first failure of a port call that cannot return one (events.log)
  SyncTime last_refresh = SyncClock::now() - std::chrono::hours(1);  // refresh on the first turn

  // SyncerPort.
  SyncTime Now() override { return WallClock().Now(); }
  int64_t UnixMs() override { return WallClock().UnixMs(); }
  void Publish(net::Message&& m) override { (void)downlink->Publish(options.job_id, m); }
  void Reply(const std::string& peer, net::Message&& m) override {
    if (router) (void)router->SendTo(peer, m, 0);  // a peer gone meanwhile: it will ask again
  }
  Status LogUpdate(const UpdateRecord& record) override { return store->LogUpdate(record); }
  void OnMerge(const MergeEvent& event) override {
    if (have_events && port_error.ok()) port_error = events.Append(event);
    if (options.on_merge) options.on_merge(event);
  }
  void Checkpoint(const GlobalState& state) override {
    (void)store->Checkpoint(state, [this](const std::string& line) { Note(line); });
  }
  void Note(const std::string& line) override { LogToStderr(LogWho(name, options.job_id), line); }

  // Run's loop.
  Status Loop(Syncer& syncer);
  bool ShouldLeave(const Syncer& syncer);
  Status ServeHome(const Syncer& syncer);
  Status Receive(SyncTime wake, bool* closed);
  bool DrainUplink();
  Status DrainRouter();
};

namespace {

net::SocketOptions SyncerSocket(const SyncerOptions& o, const std::string& name) {
  net::SocketOptions so;
  so.name = name;
  so.allow_plaintext = o.allow_plaintext;
  if (o.curve) {
    so.curve = o.curve;
    so.curve->server = true;
  }
  return so;
}

}  // namespace

Syncer::~Syncer() = default;

Status CheckShard(const SyncerOptions& options) {
  if (options.shard < 0 || options.shard >= options.sync.syncers)
    return Status::Error("syncer: shard " + std::to_string(options.shard) + " of sync.syncers " +
                         std::to_string(options.sync.syncers) + " does not exist");
  return Status::Ok();
}

Status Syncer::Create(net::NetContext& context, const SyncerOptions& options, const TensorTable& table,
                      const float* init_params, std::unique_ptr<Syncer>* out) {
  DL_RETURN_IF_ERROR(CheckShard(options));
  if (!options.learner_keys.empty() && (int)options.learner_keys.size() != options.sync.learners)
    return Status::Error("syncer: " + std::to_string(options.learner_keys.size()) + " learner keys for " +
                         std::to_string(options.sync.learners) + " learners");
  std::unique_ptr<Syncer> s(new Syncer());
  s->impl_ = std::make_unique<Impl>();
  Impl& im = *s->impl_;
  im.options = options;
  const SyncConfig& sc = options.sync;
  DL_RETURN_IF_ERROR(PartitionFragments(table, EffectiveFragments(sc), &s->fragments_));
  const size_t P = s->fragments_.size();
  im.shards = ShardMap::Of(s->fragments_, sc.syncers);
  im.name = im.shards.NameOf(options.shard);
  SyncerStoreOptions store = ShardStoreOptions(options.run_dir, im.shards, options.shard);
  store.resume = options.resume;
  uint64_t replayed = 0;
  DL_RETURN_IF_ERROR(SyncerStore::Open(store, table, s->fragments_, init_params, &s->state_, &replayed, &im.store));
  if (replayed > 0)
    im.Note("replayed " + std::to_string(replayed) + " published updates from the update log after the checkpoint");
  if (!im.store->open_note().empty()) im.Note(im.store->open_note());

  ParseOptions expect;
  expect.job_id = options.job_id;
  expect.accept = MessageBit(MessageType::kDelta) | MessageBit(MessageType::kHeartbeat);
  expect.model_params = table.total_numel();
  for (int i = 0; i < sc.learners; i++) expect.allowed_senders.push_back(LearnerName(i));
  net::ReceiveOptions ro;
  // Deltas are verified and decoded where ZeroMQ received them (no copy of the payload).
  ro.validator = net::EnvelopeValidatorInPlace(expect, im.parsed);
  ro.sequence_per_topic = true;  // the main and the liveness stream are numbered apart (protocol.h)
  net::SocketOptions up = SyncerSocket(options, im.name + ".uplink");
  up.recv_hwm_msgs = net::kUplinkHwmMsgs;
  DL_RETURN_IF_ERROR(net::SubChannel::Create(context, up, ro, &im.uplink));
  DL_RETURN_IF_ERROR(im.uplink->Subscribe(""));
  DL_RETURN_IF_ERROR(im.uplink->Bind(options.endpoints.uplink).WithContext(im.name + " uplink"));
  net::SocketOptions down = SyncerSocket(options, im.name + ".downlink");
  // Per subscriber, a few models' worth of Globals (one per fragment merge): one that never
  // reads cannot grow the syncer without bound; one that falls behind resyncs by snapshot.
  const int few_models = std::max(64, 4 * EffectiveFragments(options.sync));
  // A Global of two chunks or more is published as one message per 4 MiB chunk plus a seal
  // (chunk_frame.h): count those messages, at most 2 per fragment plus the fp32 model's chunks.
  const uint64_t messages_per_model =
      2 * uint64_t(EffectiveFragments(options.sync)) + table.total_numel() * 4 / kChunkBytes;
  down.send_hwm_msgs = int(std::min<uint64_t>(std::max<uint64_t>(few_models, 4 * messages_per_model), 1 << 20));
  DL_RETURN_IF_ERROR(net::PubChannel::Create(context, down, &im.downlink));
  DL_RETURN_IF_ERROR(im.downlink->Bind(options.endpoints.downlink).WithContext(im.name + " downlink"));
  if (!options.endpoints.snapshot.empty()) {
    ParseOptions rexpect = expect;
    rexpect.accept = MessageBit(MessageType::kHello) | MessageBit(MessageType::kSnapshotRequest);
    if (options.shard != 0) rexpect.allowed_senders.push_back(im.shards.NameOf(0));  // the home, at the end
    net::ReceiveOptions rro;
    rro.validator = net::EnvelopeValidator(rexpect, im.router_parsed);
    net::SocketOptions ros = SyncerSocket(options, im.name + ".snapshot");
    ros.send_hwm_msgs = few_models;  // snapshots are throttled per learner too
    DL_RETURN_IF_ERROR(net::RouterChannel::Create(context, ros, rro, &im.router));
    DL_RETURN_IF_ERROR(im.router->Bind(options.endpoints.snapshot).WithContext(im.name + " snapshot endpoint"));
  }
  im.sockets.push_back(&im.uplink->socket());
  if (im.router) im.sockets.push_back(&im.router->socket());

  if (!options.run_dir.empty()) {
    // The run's one events.log, which every shard appends to.
    DL_RETURN_IF_ERROR(im.events.Open((std::filesystem::path(options.run_dir) / "events.log").string()));
    im.have_events = true;
  }
  // The decisions (syncer_core.h), on this runtime's clock and sockets; a new incarnation per start.
  const uint64_t incarnation = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
  im.core = std::make_unique<SyncerCore>(options, s->fragments_, &s->state_, table, incarnation, &im);
  std::vector<MergeEvent> merges;
  DL_RETURN_IF_ERROR(im.store->RecalledMerges(&merges));
  im.core->RecallMerges(merges);
  s->result_.versions.assign(P, 0);
  for (size_t p = 0; p < P; p++) s->result_.versions[p] = s->state_.fragments[p].version;
  s->RefreshStatus(false);
  *out = std::move(s);
  return Status::Ok();
}

const ShardMap& Syncer::shards() const { return impl_->shards; }
const std::string& Syncer::state_path() const { return impl_->store->state_path(); }
const std::vector<uint32_t>& Syncer::owned_fragments() const { return impl_->shards.FragmentsOf(impl_->options.shard); }

void Syncer::GlobalParams(float* flat) const {
  for (uint32_t p : impl_->shards.FragmentsOf(impl_->options.shard))
    ScatterFragment(fragments_[p], state_.fragments[p].theta.data(), flat);
}

SyncerStatusSnapshot Syncer::CurrentStatus() const {
  std::lock_guard<std::mutex> lock(status_mu_);
  return status_;
}

void Syncer::RefreshStatus(bool running) {
  const SyncerCore& core = *impl_->core;
  const SyncerCounters& c = core.counters();
  SyncerStatusSnapshot st;
  st.running = running;
  st.taken = impl_->Now();
  for (const auto& f : state_.fragments) st.versions.push_back(f.version);
  st.merges = state_.merges;
  st.dropped_deltas = state_.dropped_deltas;
  st.rejected_deltas = state_.rejected_deltas;
  st.snapshots_served = c.snapshots_served;
  st.welcomes = c.welcomes;
  st.refusals = c.refusals;
  st.impostors = c.impostors;
  st.bytes_received = c.bytes_received;
  st.bytes_published = c.bytes_published;
  st.learners = core.learners();
  for (auto& l : st.learners) {
    for (const auto& e : state_.ledger)
      if (e.learner == l.learner) l.ledger = e;
    l.live = core.book().Live(l.learner, st.taken);
  }
  std::lock_guard<std::mutex> lock(status_mu_);
  status_ = std::move(st);
}

Status Syncer::Run() {
  Impl& im = *impl_;
  const Status st = im.Loop(*this);
  // Also after an abort or an error: what was published and received so far.
  const SyncerCounters& c = im.core->counters();
  result_.bytes_received = c.bytes_received;
  result_.bytes_published = c.bytes_published;
  result_.snapshots_served = c.snapshots_served;
  for (size_t p = 0; p < state_.fragments.size(); p++) result_.versions[p] = state_.fragments[p].version;
  return st;
}

// Each turn: the core's timers, the status copy, then messages until the core's next deadline
// (20 ms at most, so RequestStop and Abort are seen).
Status Syncer::Impl::Loop(Syncer& syncer) {
  for (;;) {
    if (syncer.abort_) return Status::Ok();
    const SyncTime now = Now();
    SyncTime wake = now + std::chrono::milliseconds(20);
    DL_RETURN_IF_ERROR(core->OnTimer(&wake));
    DL_RETURN_IF_ERROR(port_error);
    if (now - last_refresh >= std::chrono::milliseconds(50)) {
      syncer.RefreshStatus(true);
      last_refresh = now;
    }
    if (ShouldLeave(syncer)) break;
    bool closed = false;
    DL_RETURN_IF_ERROR(Receive(wake, &closed));
    if (closed) break;
  }
  DL_RETURN_IF_ERROR(core->Flush());
  DL_RETURN_IF_ERROR(port_error);
  DL_RETURN_IF_ERROR(store->SaveFinal(syncer.state_));
  DL_RETURN_IF_ERROR(ServeHome(syncer));
  syncer.result_.merges = syncer.state_.merges;
  syncer.result_.dropped_deltas = syncer.state_.dropped_deltas;
  syncer.result_.rejected_deltas = syncer.state_.rejected_deltas;
  syncer.RefreshStatus(false);
  return Status::Ok();
}

// A shard other than the home answers the home's request for its final fragments (syncer_core:
// only from now on), for at most serve_home_ms; learners' requests are answered meanwhile too.
Status Syncer::Impl::ServeHome(const Syncer& syncer) {
  if (options.serve_home_ms <= 0 || options.shard == 0 || !router) return Status::Ok();
  const SyncTime give_up = Now() + std::chrono::milliseconds(options.serve_home_ms);
  Note("final: waiting up to " + std::to_string(options.serve_home_ms / 1000) + " s for " + shards.NameOf(0) +
       " to take this shard's fragments");
  std::vector<net::Socket*> only_router = {&router->socket()};
  while (core->counters().home_fetches == 0 && Now() < give_up && !syncer.abort_) {
    if (net::PollReadable(only_router, 20, &ready)) DL_RETURN_IF_ERROR(DrainRouter());
  }
  if (core->counters().home_fetches == 0) Note(shards.NameOf(0) + " did not ask for this shard's fragments");
  return Status::Ok();
}

// Every learner finished (local mode), or RequestStop and a quiet uplink.
bool Syncer::Impl::ShouldLeave(const Syncer& syncer) {
  if (core->AllDone() && options.exit_when_all_finished) return true;
  return syncer.stop_ && Now() - core->last_message() > std::chrono::milliseconds(options.idle_exit_ms);
}

// Waits until wake (20 ms at most) for a message. *closed: the uplink closed.
Status Syncer::Impl::Receive(SyncTime wake, bool* closed) {
  const SyncTime now = Now();
  const int64_t to_wake_ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count();
  const int timeout_ms = wake <= now ? 0 : (int)std::min<int64_t>(20, to_wake_ms + 1);
  if (!net::PollReadable(sockets, timeout_ms, &ready)) return Status::Ok();
  // Drain a bounded batch from each socket, then decide again.
  *closed = DrainUplink();
  return DrainRouter();
}

// True when the uplink closed.
bool Syncer::Impl::DrainUplink() {
  net::Received r;
  bool closed = false;
  for (int i = 0; i < 256; i++) {
    const net::RecvResult rr = uplink->Receive(&r, 0);
    closed = rr == net::RecvResult::kClosed;
    if (rr != net::RecvResult::kMessage) break;
    core->OnUplink(r, *parsed);
  }
  return closed;
}

Status Syncer::Impl::DrainRouter() {
  if (!router) return Status::Ok();
  net::Received r;
  for (int i = 0; i < 64; i++) {
    if (router->Receive(&r, 0) != net::RecvResult::kMessage) break;
    DL_RETURN_IF_ERROR(core->OnRequest(r, *router_parsed));
  }
  return Status::Ok();
}

}  // namespace diloco
