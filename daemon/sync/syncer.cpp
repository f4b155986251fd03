#include "daemon/sync/syncer.h"

#include <algorithm>
#include <map>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>

#include "daemon/net/channel.h"
#include "daemon/net/codec.h"
#include "daemon/net/wire_transport.h"
#include "daemon/sync/decide.h"
#include "daemon/sync/event_log.h"
#include "daemon/sync/merge.h"
#include "daemon/sync/merger.h"
#include "daemon/sync/round_book.h"
#include "daemon/sync/state_writer.h"
#include "daemon/sync/update_log.h"
#include "daemon/util/crc32c.h"

namespace diloco {

namespace {

using Clock = std::chrono::steady_clock;

int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}



}  // namespace

struct Syncer::Impl {
  SyncerOptions options;
  std::unique_ptr<net::SubChannel> uplink;
  std::unique_ptr<net::PubChannel> downlink;
  std::unique_ptr<net::RouterChannel> router;
  std::shared_ptr<ParsedMessage> parsed = std::make_shared<ParsedMessage>();
  std::shared_ptr<ParsedMessage> router_parsed = std::make_shared<ParsedMessage>();
  uint64_t table_digest = 0;
  uint64_t num_params = 0;
  uint64_t snapshot_ids = 0;
  EventLog events;
  bool have_events = false;
  std::string state_path;
  // Durability (see the header): every update is in the log before it is published; checkpoints
  // are written by a thread of their own.
  std::unique_ptr<UpdateLog> update_log;
  std::unique_ptr<AsyncStateWriter> state_writer;
  uint64_t incarnation = 0;
  uint64_t seq = 0;

  std::unique_ptr<RoundBook> book;  // learners, pending deltas, drops (round_book.h)
  std::vector<std::vector<SkippedDelta>> skipped;  // per fragment, since its last merge
  // Deltas dropped or rejected since the last SyncerStatus: that status tells their learners,
  // which then stop waiting for a Global that will never include them and send again.
  std::vector<DroppedDelta> recent_drops;
  std::vector<LearnerStatusEntry> learners;  // what each learner last reported
  RoundTimings timings;
  uint64_t welcomes = 0, refusals = 0, impostors = 0, snapshots_throttled = 0;

  class Loop;  // Run()'s event loop (below)
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

Status Syncer::Create(net::NetContext& context, const SyncerOptions& options, const TensorTable& table,
                      const float* init_params, std::unique_ptr<Syncer>* out) {
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
  if (options.resume) {
    if (options.run_dir.empty()) return Status::Error("syncer: resume needs a run directory");
    const std::string path = (std::filesystem::path(options.run_dir) / "global_state.bin").string();
    DL_RETURN_IF_ERROR(LoadGlobalState(path, &s->state_).WithContext("syncer: resuming"));
    DL_RETURN_IF_ERROR(CheckGlobalStateFits(s->state_, table, s->fragments_)
                           .WithContext("syncer: resuming from '" + path + "'"));
    // The checkpoint may be older than what was published: the update log has the rest.
    ReplayReport replay;
    auto decode = [](const Fragment& frag, const UpdateRecord& r, std::span<float> update) {
      return DecodeTensors(r.codec, r.payload, FragmentNumels(frag), r.tensor_bytes, update);
    };
    DL_RETURN_IF_ERROR(ReplayUpdateLogs(options.run_dir, s->fragments_, decode, &s->state_, &replay)
                           .WithContext("syncer: replaying the update log over '" + path + "'"));
    uint64_t replayed = 0;
    for (uint64_t n : replay.replayed) replayed += n;
    if (replayed > 0)
      std::fprintf(stderr, "syncer: replayed %llu published updates from the update log after the checkpoint\n",
                   (unsigned long long)replayed);
  } else {
    if (init_params == nullptr) return Status::Error("syncer: no initial parameters and not resuming");
    s->state_ = InitialGlobalState(table, s->fragments_, init_params);
  }
  RoundBookOptions bo = RoundBookOptionsFor(sc, (int)P);
  bo.count_limits = options.count_limits;
  im.book = std::make_unique<RoundBook>(bo, Clock::now());
  im.skipped.resize(P);
  im.learners.resize(sc.learners);
  for (int i = 0; i < sc.learners; i++) im.learners[i].learner = i;
  im.incarnation = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);

  ParseOptions expect;
  expect.job_id = options.job_id;
  expect.accept = MessageBit(MessageType::kDelta) | MessageBit(MessageType::kHeartbeat);
  expect.model_params = table.total_numel();
  for (int i = 0; i < sc.learners; i++) expect.allowed_senders.push_back(LearnerName(i));
  net::ReceiveOptions ro;
  // Deltas are verified and decoded where ZeroMQ received them (no copy of the payload).
  ro.validator = net::EnvelopeValidatorInPlace(expect, im.parsed);
  ro.sequence_per_topic = true;  // the main and the liveness stream are numbered apart (protocol.h)
  net::SocketOptions up = SyncerSocket(options, "syncer.uplink");
  up.recv_hwm_msgs = 100000;
  DL_RETURN_IF_ERROR(net::SubChannel::Create(context, up, ro, &im.uplink));
  DL_RETURN_IF_ERROR(im.uplink->Subscribe(""));
  DL_RETURN_IF_ERROR(im.uplink->Bind(options.uplink_endpoint).WithContext("syncer uplink"));
  net::SocketOptions down = SyncerSocket(options, "syncer.downlink");
  // Per subscriber, a few models' worth of Globals (one per fragment merge): one that never
  // reads cannot grow the syncer without bound; one that falls behind resyncs by snapshot.
  const int few_models = std::max(64, 4 * EffectiveFragments(options.sync));
  down.send_hwm_msgs = few_models;
  DL_RETURN_IF_ERROR(net::PubChannel::Create(context, down, &im.downlink));
  DL_RETURN_IF_ERROR(im.downlink->Bind(options.downlink_endpoint).WithContext("syncer downlink"));
  if (!options.snapshot_endpoint.empty()) {
    ParseOptions rexpect = expect;
    rexpect.accept = MessageBit(MessageType::kHello) | MessageBit(MessageType::kSnapshotRequest);
    net::ReceiveOptions rro;
    rro.validator = net::EnvelopeValidator(rexpect, im.router_parsed);
    net::SocketOptions ros = SyncerSocket(options, "syncer.snapshot");
    ros.send_hwm_msgs = few_models;  // snapshots are throttled per learner too
    DL_RETURN_IF_ERROR(net::RouterChannel::Create(context, ros, rro, &im.router));
    DL_RETURN_IF_ERROR(im.router->Bind(options.snapshot_endpoint).WithContext("syncer snapshot endpoint"));
  }
  im.table_digest = table.digest();
  im.num_params = table.total_numel();

  if (!options.run_dir.empty()) {
    namespace fs = std::filesystem;
    DL_RETURN_IF_ERROR(im.events.Open((fs::path(options.run_dir) / "events.log").string()));
    im.have_events = true;
    im.state_path = (fs::path(options.run_dir) / "global_state.bin").string();
    if (!options.resume) {
      // A new run: its version 0 is the base the update log replays over; no old log applies.
      std::error_code ec;
      fs::remove(UpdateLogPath(options.run_dir), ec);
      fs::remove(PreviousUpdateLogPath(options.run_dir), ec);
      DL_RETURN_IF_ERROR(SaveGlobalState(im.state_path, s->state_));
    }
    DL_RETURN_IF_ERROR(UpdateLog::Open(options.run_dir, {}, &im.update_log));
    if (!im.update_log->note().empty()) std::fprintf(stderr, "syncer: %s\n", im.update_log->note().c_str());
    im.state_writer = std::make_unique<AsyncStateWriter>(im.state_path);
  }
  s->result_.versions.assign(P, 0);
  for (size_t p = 0; p < P; p++) s->result_.versions[p] = s->state_.fragments[p].version;
  s->RefreshStatus(false);
  *out = std::move(s);
  return Status::Ok();
}

void Syncer::GlobalParams(float* flat) const {
  for (size_t p = 0; p < fragments_.size(); p++) ScatterFragment(fragments_[p], state_.fragments[p].theta.data(), flat);
}

SyncerStatusSnapshot Syncer::CurrentStatus() const {
  std::lock_guard<std::mutex> lock(status_mu_);
  return status_;
}

void Syncer::RefreshStatus(bool running) {
  Impl& im = *impl_;
  SyncerStatusSnapshot st;
  st.running = running;
  st.taken = Clock::now();
  for (const auto& f : state_.fragments) st.versions.push_back(f.version);
  st.merges = state_.merges;
  st.dropped_deltas = state_.dropped_deltas;
  st.rejected_deltas = state_.rejected_deltas;
  st.snapshots_served = result_.snapshots_served;
  st.welcomes = im.welcomes;
  st.refusals = im.refusals;
  st.impostors = im.impostors;
  st.bytes_received = result_.bytes_received;
  st.bytes_published = result_.bytes_published;
  st.learners = im.learners;
  const auto now = Clock::now();
  for (auto& l : st.learners) {
    for (const auto& e : state_.ledger)
      if (e.learner == l.learner) l.ledger = e;
    l.live = im.book->Live(l.learner, now);
  }
  std::lock_guard<std::mutex> lock(status_mu_);
  status_ = std::move(st);
}

// Run's event loop (CONVENTIONS.md): its state is these members, each message, timer and merge a
// named method. What outlives it is Impl's (sockets, the round book, the logs) and the Syncer's
// (Θ, the result, the status copy).
class Syncer::Impl::Loop {
 public:
  explicit Loop(Syncer& syncer);
  Status Run();

 private:
  // Timers, once per turn.
  Status DecideAll(SyncTime now, SyncTime* next_wake);
  void RecordQuorumTime(const RoundState& rs, int quorum);
  void RefreshStatusIfDue(SyncTime now);
  Status PublishStatusIfDue(SyncTime now);
  bool ShouldLeave() const;
  // Receiving.
  Status Receive(SyncTime wake, bool* closed);
  bool DrainUplink();
  Status DrainRouter();
  void HandleUplink(const net::Received& r, SyncTime now);
  bool Impostor(int learner, const std::string& key);
  void NoteHeard(int learner, const ParsedMessage& m, SyncTime now);
  void HandleHeartbeat(int learner, const HeartbeatMsg& hb, SyncTime now);
  void HandleDelta(int learner, const ParsedMessage& m, SyncTime now);
  void ApplyDrops();
  Status HandleRouter(const net::Received& r);
  Status HandleHello(int learner, const std::string& peer, const ParsedMessage& m);
  WelcomeMsg WelcomeFor(int learner, const ParsedMessage& m) const;
  Status HandleSnapshotRequest(const std::string& peer, const ParsedMessage& m);
  // Sending.
  EnvelopeHeader Header(uint64_t* seq) const;
  Status PublishStatus();
  Status Reply(const std::string& peer, const MessageBody& body, std::shared_ptr<std::vector<uint8_t>> payload);
  // Merging.
  Status Merge(size_t p, const std::string& reason, double grace_ms);
  Status LogUpdate(size_t p, uint32_t theta_crc, UpdateRecord* record);
  std::shared_ptr<std::vector<uint8_t>> GlobalPayload(size_t p, std::vector<uint8_t>&& bytes) const;
  GlobalMsg GlobalOf(size_t p, uint32_t theta_crc, const std::vector<uint64_t>& tensor_bytes) const;
  void Credit(const std::vector<PendingDelta>& ok, const std::vector<double>& weights, GlobalMsg* g, MergeEvent* ev);
  Status PublishGlobal(const GlobalMsg& g, std::shared_ptr<std::vector<uint8_t>> payload);
  void Checkpoint();
  // The end.
  Status MergeAllPending();
  Status SaveFinalState();

  Syncer& syncer_;
  Impl& im_;
  GlobalState& state_;
  SyncerResult& result_;
  const std::vector<Fragment>& fragments_;
  const SyncConfig& sc_;
  const int M_;     // learners
  const size_t P_;  // fragments
  DecideOptions dopt_;
  const CodecOptions down_codec_;
  // The merges (merger.h), with error feedback on the downlink too: what the codec drops from
  // one update of a fragment goes out with its next one, so Θ stays within one message's
  // rounding of the unquantized trajectory. Not checkpointed: a restarted syncer loses at most
  // that one rounding.
  FragmentMerger merger_;
  HeldDeltaRecycler recycler_;  // the buffers of merged deltas, for the next ones
  uint64_t router_seq_ = 0;
  const uint64_t fragments_digest_;
  static constexpr int kSnapshotMinIntervalMs = 1000;
  std::map<int, SyncTime> last_snapshot_;  // by learner: when its last snapshot went out

  bool status_due_ = false;  // publish a SyncerStatus at the next turn of the loop
  Clock::time_point last_message_ = Clock::now();
  Clock::time_point last_status_ = Clock::now();
  Clock::time_point last_refresh_ = Clock::now() - std::chrono::hours(1);
  std::vector<net::Socket*> sockets_;
  std::vector<bool> ready_;
};

Syncer::Impl::Loop::Loop(Syncer& syncer)
    : syncer_(syncer),
      im_(*syncer.impl_),
      state_(syncer.state_),
      result_(syncer.result_),
      fragments_(syncer.fragments_),
      sc_(im_.options.sync),
      M_(sc_.learners),
      P_(fragments_.size()),
      down_codec_(DownlinkCodec(sc_)),
      merger_(sc_),
      recycler_(P_ * ((size_t)std::max(1, sc_.learners) + 1)),
      fragments_digest_(FragmentsDigest(fragments_)) {
  dopt_ = DecideOptionsFor(sc_);
  sockets_.push_back(&im_.uplink->socket());
  if (im_.router) sockets_.push_back(&im_.router->socket());
}

Status Syncer::Run() {
  Impl::Loop loop(*this);
  return loop.Run();
}

Status Syncer::Impl::Loop::Run() {
  for (;;) {
    if (syncer_.abort_) return Status::Ok();
    const SyncTime now = Clock::now();
    SyncTime wake = now + std::chrono::milliseconds(20);
    DL_RETURN_IF_ERROR(DecideAll(now, &wake));
    RefreshStatusIfDue(now);
    DL_RETURN_IF_ERROR(PublishStatusIfDue(now));
    if (ShouldLeave()) break;
    bool closed = false;
    DL_RETURN_IF_ERROR(Receive(wake, &closed));
    if (closed) break;
  }
  DL_RETURN_IF_ERROR(MergeAllPending());
  DL_RETURN_IF_ERROR(SaveFinalState());
  result_.merges = state_.merges;
  result_.dropped_deltas = state_.dropped_deltas;
  result_.rejected_deltas = state_.rejected_deltas;
  syncer_.RefreshStatus(false);
  return Status::Ok();
}

Status Syncer::Impl::Loop::DecideAll(SyncTime now, SyncTime* next_wake) {
  for (size_t p = 0; p < P_; p++) {
    if (!im_.book->HasPending((uint32_t)p)) continue;
    const RoundState rs = im_.book->Round((uint32_t)p, now, im_.timings);
    const Decision d = Decide(now, rs, dopt_);
    if (d.action == DecideAction::kMerge) {
      RecordQuorumTime(rs, d.quorum);
      DL_RETURN_IF_ERROR(Merge(p, ToString(d.reason), d.grace_ms));
    } else {
      *next_wake = std::min(*next_wake, d.wait_until);
    }
  }
  return Status::Ok();
}

// ξ_quorum: round open (first arrival) -> the arrival that made the quorum.
void Syncer::Impl::Loop::RecordQuorumTime(const RoundState& rs, int quorum) {
  std::vector<SyncTime> at;
  for (const LearnerPresence& lp : rs.learners)
    if (lp.contributed_at) at.push_back(*lp.contributed_at);
  std::sort(at.begin(), at.end());
  const size_t k = std::min(at.size(), (size_t)std::max(1, quorum)) - 1;
  im_.timings.quorum_ms.Add(std::chrono::duration<double, std::milli>(at[k] - at[0]).count());
}

void Syncer::Impl::Loop::RefreshStatusIfDue(SyncTime now) {
  if (now - last_refresh_ < std::chrono::milliseconds(50)) return;
  syncer_.RefreshStatus(true);
  last_refresh_ = now;
}

Status Syncer::Impl::Loop::PublishStatusIfDue(SyncTime now) {
  if (status_due_ || !im_.recent_drops.empty() ||
      (im_.options.status_interval_ms > 0 &&
       now - last_status_ >= std::chrono::milliseconds(im_.options.status_interval_ms))) {
    DL_RETURN_IF_ERROR(PublishStatus());
    last_status_ = now;
    status_due_ = false;
  }
  return Status::Ok();
}

// Every learner finished (local mode), or RequestStop and a quiet uplink.
bool Syncer::Impl::Loop::ShouldLeave() const {
  if (im_.book->AllDone() && im_.options.exit_when_all_finished) return true;
  return syncer_.stop_ && Clock::now() - last_message_ > std::chrono::milliseconds(im_.options.idle_exit_ms);
}

// Waits until wake (20 ms at most) for a message. *closed: the uplink closed.
Status Syncer::Impl::Loop::Receive(SyncTime wake, bool* closed) {
  const SyncTime now = Clock::now();
  const int64_t to_wake_ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count();
  const int timeout_ms = wake <= now ? 0 : (int)std::min<int64_t>(20, to_wake_ms + 1);
  if (!net::PollReadable(sockets_, timeout_ms, &ready_)) return Status::Ok();
  // Drain a bounded batch from each socket, then decide again.
  *closed = DrainUplink();
  return DrainRouter();
}

// True when the uplink closed.
bool Syncer::Impl::Loop::DrainUplink() {
  net::Received r;
  bool closed = false;
  for (int i = 0; i < 256; i++) {
    const net::RecvResult rr = im_.uplink->Receive(&r, 0);
    closed = rr == net::RecvResult::kClosed;
    if (rr != net::RecvResult::kMessage) break;
    const SyncTime now = Clock::now();
    last_message_ = now;
    HandleUplink(r, now);
  }
  return closed;
}

Status Syncer::Impl::Loop::DrainRouter() {
  if (!im_.router) return Status::Ok();
  net::Received r;
  for (int i = 0; i < 64; i++) {
    const net::RecvResult rr = im_.router->Receive(&r, 0);
    if (rr != net::RecvResult::kMessage) break;
    last_message_ = Clock::now();
    DL_RETURN_IF_ERROR(HandleRouter(r));
  }
  return Status::Ok();
}

// One uplink message: liveness, heartbeats, deltas (the main stream or the liveness stream).
void Syncer::Impl::Loop::HandleUplink(const net::Received& r, SyncTime now) {
  const ParsedMessage& m = *im_.parsed;
  result_.bytes_received += m.wire_bytes;
  const int learner = LearnerIndexOf(m.header.sender);
  if (learner < 0 || learner >= M_ || Impostor(learner, r.peer_key)) return;
  NoteHeard(learner, m, now);
  if (r.topic == im_.options.job_id) {
    im_.book->OnStreamSeq(learner, m.header.seq);
    // A gap in a learner's main stream may be a lost delta: the next status (now) tells it.
    if (r.seq.verdict == net::SeqVerdict::kGap) status_due_ = true;
  }
  if (const HeartbeatMsg* hb = m.get<HeartbeatMsg>()) {
    HandleHeartbeat(learner, *hb, now);
  } else if (const DeltaMsg* d = m.get<DeltaMsg>()) {
    im_.book->OnDeltaSeen(learner, d->fragment);
    HandleDelta(learner, m, now);
  }
}

void Syncer::Impl::Loop::NoteHeard(int learner, const ParsedMessage& m, SyncTime now) {
  LearnerStatusEntry& ls = im_.learners[learner];
  ls.heard = true;
  ls.last_heard_unix_ms = UnixMs();
  if (im_.book->OnHeard(learner, m.header.incarnation, now)) {
    // A new incarnation (a restart): waited for again until it says otherwise.
    ls = LearnerStatusEntry();
    ls.learner = learner;
    ls.heard = true;
    ls.last_heard_unix_ms = UnixMs();
    ls.incarnation = m.header.incarnation;
  }
}

void Syncer::Impl::Loop::HandleHeartbeat(int learner, const HeartbeatMsg& hb, SyncTime now) {
  LearnerStatusEntry& ls = im_.learners[learner];
  if (hb.step_time_ms > 0) im_.timings.step_ms.Add(hb.step_time_ms);
  im_.book->OnHeartbeat(learner, hb, now);
  if (hb.step >= ls.step) {  // the liveness stream may deliver an older beat late
    ls.state = hb.state;
    ls.step = hb.step;
    ls.tokens = hb.tokens;
    ls.loss = hb.loss;
    ls.tokens_per_s = hb.tokens_per_s;
    ls.step_time_ms = hb.step_time_ms;
  }
}

void Syncer::Impl::Loop::HandleDelta(int learner, const ParsedMessage& m, SyncTime now) {
  const DeltaMsg& d = *m.get<DeltaMsg>();
  if (d.fragment >= P_) {
    LedgerFor(&state_, learner).rejected++;
    state_.rejected_deltas++;
    return;
  }
  DeltaArrival a;
  a.learner = learner;
  a.fragment = d.fragment;
  a.base_version = d.base_version;
  a.c_steps = d.c_steps;
  a.c_tokens = d.c_tokens;
  a.learner_step = d.learner_step;
  const Fragment& frag = fragments_[d.fragment];
  // Held encoded, checked chunk by chunk as it is taken in (held_delta.h).
  std::vector<uint64_t> tensor_bytes;
  Status st = CheckFragmentPayload(frag, d.payload, &tensor_bytes);
  if (st.ok()) {
    const bool as_values = d.payload.topk_fraction != 0 || d.payload.codec == CodecKind::kFp32 ||
                           d.payload.codec == CodecKind::kTopkChunked;
    a.held = recycler_.Take(as_values ? 0 : m.payload_size(), as_values ? frag.numel : 0);
  }
  if (st.ok())
    st = HoldPayload(frag, CodecOptions{d.payload.codec, d.payload.block_size, d.payload.topk_fraction},
                     m.payload_spans(), tensor_bytes, &a.held, merger_.pool());
  if (!st.ok()) {
    im_.book->Reject(learner, d.fragment, d.base_version, "bad_payload", st.message());
  } else if (im_.options.reject_delta && im_.options.reject_delta(learner, d.fragment)) {
    im_.book->Reject(learner, d.fragment, d.base_version, "test_rejected", "rejected by the test hook");
  } else {
    im_.book->Admit(std::move(a), state_.fragments[d.fragment].version, now);
  }
  ApplyDrops();
}

// Deltas that will not be merged (the book's drops): logged with the next merge of their
// fragment, counted in the ledger, and (tell_learner) named in the next SyncerStatus so their
// learner stops waiting for them.
void Syncer::Impl::Loop::ApplyDrops() {
  for (DeltaDrop& d : im_.book->TakeDrops()) {
    if (d.tell_learner) im_.recent_drops.push_back({LearnerName(d.learner), d.fragment, d.base_version, d.why});
    LedgerEntry& le = LedgerFor(&state_, d.learner);
    if (d.rejected) {
      le.rejected++;
      state_.rejected_deltas++;
    } else {
      le.dropped++;
      state_.dropped_deltas++;
    }
    if (d.fragment < P_)
      im_.skipped[d.fragment].push_back({d.learner, std::move(d.why), std::move(d.detail), d.tokens});
  }
}

// A message naming learner i must come with the key of the site the job placed it on: a peer
// holding another site's key cannot speak for it (end it with a forged "finished", replace its
// pending delta, bump its incarnation).
bool Syncer::Impl::Loop::Impostor(int learner, const std::string& key) {
  const std::vector<std::string>& keys = im_.options.learner_keys;
  if (keys.empty() || key == keys[learner]) return false;
  if (++im_.impostors <= 10 || im_.impostors % 1000 == 0)
    std::fprintf(stderr, "syncer: dropped a message naming %s sent with key %s, not its site's (%llu so far)\n",
                 LearnerName(learner).c_str(), key.empty() ? "(none)" : key.c_str(),
                 static_cast<unsigned long long>(im_.impostors));
  return true;
}

Status Syncer::Impl::Loop::HandleRouter(const net::Received& r) {
  const ParsedMessage& m = *im_.router_parsed;
  result_.bytes_received += m.wire_bytes;
  const int learner = LearnerIndexOf(m.header.sender);
  if (learner < 0 || learner >= M_ || Impostor(learner, r.peer_key)) return Status::Ok();
  if (m.get<HelloMsg>()) return HandleHello(learner, r.peer, m);
  if (m.get<SnapshotRequestMsg>()) {
    // At most one snapshot per learner per kSnapshotMinIntervalMs: each encodes the whole model.
    // A learner whose answer got lost asks again after its retry period.
    SyncTime& last = last_snapshot_[learner];
    const SyncTime now = Clock::now();
    if (now - last < std::chrono::milliseconds(kSnapshotMinIntervalMs)) {
      im_.snapshots_throttled++;
      return Status::Ok();
    }
    last = now;
    return HandleSnapshotRequest(r.peer, m);
  }
  return Status::Ok();
}

// Hello -> Welcome (see the header): layout checks, then wait for the learner's uplink.
Status Syncer::Impl::Loop::HandleHello(int learner, const std::string& peer, const ParsedMessage& m) {
  const WelcomeMsg w = WelcomeFor(learner, m);
  if (w.result == JoinResult::kAccepted) {
    im_.welcomes++;
  } else if (w.result != JoinResult::kBusy) {
    im_.refusals++;
    std::fprintf(stderr, "syncer: refused %s: %s\n", m.header.sender.c_str(), w.reason.c_str());
  }
  DL_RETURN_IF_ERROR(Reply(peer, w, nullptr));
  if (w.result == JoinResult::kAccepted) DL_RETURN_IF_ERROR(PublishStatus());
  return Status::Ok();
}

WelcomeMsg Syncer::Impl::Loop::WelcomeFor(int learner, const ParsedMessage& m) const {
  const HelloMsg& h = *m.get<HelloMsg>();
  WelcomeMsg w;
  w.learner = m.header.sender;
  w.tensor_table_digest = im_.table_digest;
  w.num_params = im_.num_params;
  w.num_fragments = (uint32_t)P_;
  w.fragment_layout_digest = fragments_digest_;
  for (const auto& f : state_.fragments) w.versions.push_back(f.version);
  w.heartbeat_interval_ms = (uint32_t)im_.options.heartbeat_interval_ms;
  w.heartbeat_timeout_ms = (uint32_t)sc_.heartbeat_timeout_ms;
  auto hex = [](uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
    return std::string(b);
  };
  if (h.tensor_table_digest != im_.table_digest || h.num_params != im_.num_params) {
    w.result = JoinResult::kTableMismatch;
    w.reason = "model differs: learner has " + std::to_string(h.num_params) + " parameters (table digest " +
               hex(h.tensor_table_digest) + "), the syncer " + std::to_string(im_.num_params) + " (" +
               hex(im_.table_digest) + "); use the job's model config";
  } else if (h.param_dtype != ParamDType::kFp32) {
    w.result = JoinResult::kDTypeMismatch;
    w.reason = "the syncer holds fp32 parameters only";
  } else if (h.num_fragments != P_ || h.fragment_layout_digest != fragments_digest_) {
    w.result = JoinResult::kLayoutMismatch;
    w.reason = "fragment layout differs: learner has " + std::to_string(h.num_fragments) + " fragments (" +
               hex(h.fragment_layout_digest) + "), the syncer " + std::to_string(P_) + " (" +
               hex(fragments_digest_) + "); use the job's sync.fragments and sync.mode";
  } else if (!im_.book->Heard(learner) || im_.book->Incarnation(learner) != m.header.incarnation) {
    w.result = JoinResult::kBusy;
    w.reason = "no heartbeat from this incarnation of " + m.header.sender + " on the uplink yet; try again";
  }
  return w;
}

// SnapshotRequest -> one Snapshot part per fragment, all cut at the same versions.
Status Syncer::Impl::Loop::HandleSnapshotRequest(const std::string& peer, const ParsedMessage& m) {
  const SnapshotRequestMsg& rq = *m.get<SnapshotRequestMsg>();
  std::vector<uint32_t> wanted = rq.fragments;
  if (wanted.empty())
    for (uint32_t p = 0; p < P_; p++) wanted.push_back(p);
  wanted.erase(std::remove_if(wanted.begin(), wanted.end(), [&](uint32_t p) { return p >= P_; }), wanted.end());
  if (wanted.empty()) return Status::Ok();
  std::vector<uint64_t> versions;
  for (const auto& f : state_.fragments) versions.push_back(f.version);
  const uint64_t snapshot_id = ++im_.snapshot_ids;
  const CodecOptions fp32{CodecKind::kFp32, sc_.codec.block, 0};
  for (size_t i = 0; i < wanted.size(); i++) {
    const uint32_t p = wanted[i];
    const FragmentGlobal& fg = state_.fragments[p];
    auto payload = std::make_shared<std::vector<uint8_t>>();
    std::vector<uint64_t> tensor_bytes;
    DL_RETURN_IF_ERROR(EncodeTensors(fp32, fg.theta, FragmentNumels(fragments_[p]), payload.get(), &tensor_bytes));
    SnapshotMsg sm;
    sm.request_id = rq.request_id;
    sm.snapshot_id = snapshot_id;
    sm.part = (uint32_t)i;
    sm.num_parts = (uint32_t)wanted.size();
    sm.fragment = p;
    sm.version = fg.version;
    sm.fragment_crc32c = Crc32c(fg.theta.data(), fg.theta.size() * sizeof(float));
    sm.versions = versions;
    sm.payload = FragmentPayloadInfo(fragments_[p], fp32, tensor_bytes);
    DL_RETURN_IF_ERROR(Reply(peer, sm, payload));
  }
  result_.snapshots_served++;
  return Status::Ok();
}

EnvelopeHeader Syncer::Impl::Loop::Header(uint64_t* seq) const {
  EnvelopeHeader h;
  h.job_id = im_.options.job_id;
  h.sender = kSyncerName;
  h.seq = ++*seq;
  h.incarnation = im_.incarnation;
  h.sent_unix_ms = (uint64_t)UnixMs();
  return h;
}

Status Syncer::Impl::Loop::PublishStatus() {
  SyncerStatusMsg st;
  for (const auto& f : state_.fragments) st.versions.push_back(f.version);
  const auto now = Clock::now();
  for (int l = 0; l < M_; l++)
    if (im_.book->Live(l, now)) {
      st.live_learners.push_back(LearnerName(l));
      st.live_steps.push_back(im_.book->LastStep(l));
    }
  st.acks = im_.book->Acks();
  st.merges = state_.merges;
  st.dropped_deltas = state_.dropped_deltas;
  const size_t n_drops = std::min<size_t>(im_.recent_drops.size(), 1024);
  st.recent_drops.assign(im_.recent_drops.begin(), im_.recent_drops.begin() + n_drops);
  im_.recent_drops.erase(im_.recent_drops.begin(), im_.recent_drops.begin() + n_drops);
  OutgoingMessage om;
  DL_RETURN_IF_ERROR(BuildMessage(Header(&im_.seq), st, {}, &om));
  result_.bytes_published += om.wire_bytes();
  net::Message msg = net::ToMessage(std::move(om), nullptr);
  (void)im_.downlink->Publish(im_.options.job_id, msg);
  return Status::Ok();
}

Status Syncer::Impl::Loop::Reply(const std::string& peer, const MessageBody& body,
                                 std::shared_ptr<std::vector<uint8_t>> payload) {
  OutgoingMessage om;
  std::span<const uint8_t> bytes;
  if (payload) bytes = {payload->data(), payload->size()};
  DL_RETURN_IF_ERROR(BuildMessage(Header(&router_seq_), body, bytes, &om));
  result_.bytes_published += om.wire_bytes();
  net::Message msg = net::ToMessage(std::move(om), payload);
  (void)im_.router->SendTo(peer, msg, 0);  // a peer gone meanwhile: it will ask again
  return Status::Ok();
}

Status Syncer::Impl::Loop::Merge(size_t p, const std::string& reason, double grace_ms) {
  const auto t0 = Clock::now();
  FragmentGlobal& fg = state_.fragments[p];
  // Fresh deltas in learner order (not arrival order: the merge's sums, the Global's
  // contributor list and the event are the same whichever delta came first).
  std::vector<PendingDelta> ok = im_.book->TakeForMerge((uint32_t)p, fg.version);
  ApplyDrops();
  if (ok.empty()) return Status::Ok();
  MergeOutcome mo;
  DL_RETURN_IF_ERROR(merger_.Merge(fragments_[p], (uint32_t)p, ok, &fg, &mo));
  fg.version++;
  result_.versions[p] = fg.version;
  state_.merges++;
  UpdateRecord record;
  record.payload = std::move(mo.payload);
  record.tensor_bytes = std::move(mo.tensor_bytes);
  const uint32_t theta_crc = mo.theta_crc32c;
  DL_RETURN_IF_ERROR(LogUpdate(p, theta_crc, &record));
  const std::vector<uint64_t> tensor_bytes = record.tensor_bytes;
  auto payload = GlobalPayload(p, std::move(record.payload));

  GlobalMsg g = GlobalOf(p, theta_crc, tensor_bytes);
  MergeEvent ev;
  ev.time_ms = UnixMs();
  ev.fragment = (int)p;
  ev.version = fg.version;
  ev.reason = reason;
  ev.grace_ms = grace_ms;
  ev.delta_norm = mo.delta_norm;
  ev.update_norm = mo.update_norm;
  Credit(ok, mo.weights, &g, &ev);
  for (PendingDelta& pd : ok) recycler_.Give(std::move(pd.held));
  ev.skipped = std::move(im_.skipped[p]);
  im_.skipped[p].clear();

  DL_RETURN_IF_ERROR(PublishGlobal(g, payload));
  if (im_.have_events) DL_RETURN_IF_ERROR(im_.events.Append(ev));
  if (im_.state_writer && sc_.checkpoint_every > 0 && state_.merges % sc_.checkpoint_every == 0) Checkpoint();
  im_.timings.sync_ms.Add(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  return Status::Ok();
}

Status Syncer::Impl::Loop::LogUpdate(size_t p, uint32_t theta_crc, UpdateRecord* record) {
  if (!im_.update_log) return Status::Ok();
  // Durable before it is published: a syncer killed after this point comes back at this version.
  const uint64_t version = state_.fragments[p].version;
  record->fragment = (uint32_t)p;
  record->version = version;
  record->theta_crc32c = theta_crc;
  record->codec = down_codec_;
  return im_.update_log->Append(*record).WithContext("syncer: logging version " + std::to_string(version) +
                                                     " of fragment " + std::to_string(p));
}

// The update as it goes out; the nan_global_update test hook puts a NaN in it.
std::shared_ptr<std::vector<uint8_t>> Syncer::Impl::Loop::GlobalPayload(size_t p, std::vector<uint8_t>&& bytes) const {
  auto payload = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  if (im_.options.nan_global_update && im_.options.nan_global_update((uint32_t)p, state_.fragments[p].version) &&
      down_codec_.kind == CodecKind::kFp32 && payload->size() >= sizeof(float)) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(payload->data(), &nan, sizeof nan);
  }
  return payload;
}

// The Global of fragment p's new version (its contributors come with Credit); the
// corrupt_global_crc test hook spoils its CRC32C.
GlobalMsg Syncer::Impl::Loop::GlobalOf(size_t p, uint32_t theta_crc, const std::vector<uint64_t>& tensor_bytes) const {
  const uint64_t version = state_.fragments[p].version;
  GlobalMsg g;
  g.fragment = (uint32_t)p;
  g.version = version;
  g.base_version = version - 1;
  g.is_full = false;
  g.fragment_crc32c = theta_crc;
  if (im_.options.corrupt_global_crc && im_.options.corrupt_global_crc((uint32_t)p, version)) g.fragment_crc32c ^= 1;
  g.payload = FragmentPayloadInfo(fragments_[p], down_codec_, tensor_bytes);
  return g;
}

// Each merged delta: its learner named in the Global and the event, its work in the ledger.
void Syncer::Impl::Loop::Credit(const std::vector<PendingDelta>& ok, const std::vector<double>& weights,
                                GlobalMsg* g, MergeEvent* ev) {
  for (size_t i = 0; i < ok.size(); i++) {
    const auto& pd = ok[i];
    g->contributors.push_back({LearnerName(pd.learner), pd.base_version, (uint64_t)pd.counts.steps,
                               (uint64_t)pd.counts.tokens, (float)weights[i]});
    ev->contributors.push_back({pd.learner, weights[i], g->version - 1 - pd.base_version, pd.base_version,
                                pd.counts.tokens, pd.counts.steps});
    LedgerEntry& le = LedgerFor(&state_, pd.learner);
    le.tokens += (uint64_t)pd.counts.tokens;
    le.steps += (uint64_t)pd.counts.steps;
    le.merged++;
  }
}

Status Syncer::Impl::Loop::PublishGlobal(const GlobalMsg& g, std::shared_ptr<std::vector<uint8_t>> payload) {
  OutgoingMessage om;
  DL_RETURN_IF_ERROR(BuildMessage(Header(&im_.seq), g, *payload, &om));
  result_.bytes_published += om.wire_bytes();
  net::Message msg = net::ToMessage(std::move(om), payload);
  (void)im_.downlink->Publish(im_.options.job_id, msg);
  return Status::Ok();
}

// A checkpoint off the merge path: a copy of the state goes to the writer's thread (skipped
// while the previous one is still being written); the log segment it covers is dropped once
// the file is durable.
void Syncer::Impl::Loop::Checkpoint() {
  if (im_.state_writer->busy()) return;
  if (!im_.update_log->HasPrevious()) {
    if (Status st = im_.update_log->Rotate(); !st.ok()) {
      std::fprintf(stderr, "syncer: skipping a checkpoint: %s\n", st.message().c_str());
      return;
    }
  }
  UpdateLog* log = im_.update_log.get();
  im_.state_writer->Submit(state_, [log](Status st) {
    if (st.ok()) (void)log->DropPrevious();
    else std::fprintf(stderr, "syncer: checkpoint failed (the update log keeps everything): %s\n", st.message().c_str());
  });
}

// Flush: whatever is still pending is merged now (the run is over).
Status Syncer::Impl::Loop::MergeAllPending() {
  for (size_t p = 0; p < P_; p++)
    if (im_.book->HasPending((uint32_t)p)) DL_RETURN_IF_ERROR(Merge(p, "flush", 0));
  return Status::Ok();
}

Status Syncer::Impl::Loop::SaveFinalState() {
  if (!im_.state_writer) return Status::Ok();
  (void)im_.state_writer->Wait();
  DL_RETURN_IF_ERROR(SaveGlobalState(im_.state_path, state_));
  // The final state covers every logged update.
  if (!im_.update_log->HasPrevious()) DL_RETURN_IF_ERROR(im_.update_log->Rotate());
  return im_.update_log->DropPrevious();
}

}  // namespace diloco
