#include "daemon/train/learner.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <limits>
#include <random>
#include <thread>

#include "daemon/net/channel.h"
#include "daemon/net/clone.h"
#include "daemon/net/codec.h"
#include "daemon/net/wire_transport.h"
#include "daemon/sync/decide.h"
#include "daemon/sync/fold.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/merge.h"
#include "daemon/sync/syncer.h"
#include "daemon/train/data.h"
#include "daemon/train/inner_loop.h"
#include "daemon/train/local_ring.h"
#include "daemon/train/run_dir.h"
#include "daemon/train/trainer.h"
#include "daemon/util/crc32c.h"
#include "kernels/rng.h"

namespace diloco {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t UnixMs() {
  return (uint64_t)std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct FragState {
  std::vector<float> base;  // Θ_p as of base_version (the last global folded)
  uint64_t base_version = 0;
  uint64_t c_steps = 0, c_tokens = 0;
  bool in_flight = false;
  uint64_t sent_base = 0;
  long send_step = 0;
  uint64_t c_steps_at_send = 0, c_tokens_at_send = 0;
  bool bad = false;  // CRC mismatch: its base is wrong until a snapshot replaces it
};

net::SocketOptions LearnerSocket(const LearnerOptions& o, const std::string& name) {
  net::SocketOptions so;
  so.name = name;
  so.allow_plaintext = o.allow_plaintext;
  if (o.curve) {
    so.curve = o.curve;
    so.curve->server = false;
  }
  so.link = o.link;
  return so;
}

// A fragment as the backend's sync ops see it: its parameter ranges in packed order.
std::vector<ParamRange> RangesOf(const Fragment& frag) {
  std::vector<ParamRange> out;
  for (const FragmentRange& r : frag.ranges) out.push_back({r.offset, r.numel});
  return out;
}

// The wire codec's numbering is the sync ops' (kernels/sync_ops.h).
SyncCodec SyncCodecOf(CodecKind kind) { return static_cast<SyncCodec>(static_cast<int>(kind)); }

// A verified message's payload in one piece (it arrives in chunks): what the backend decodes.
void ContiguousPayload(const ParsedMessage& m, std::vector<uint8_t>* out) {
  out->clear();
  for (const auto& chunk : m.payload_spans()) out->insert(out->end(), chunk.begin(), chunk.end());
}

// The learner's hook on the inner loop (inner_loop.h): the outer sync around every step.
class LearnerHook final : public InnerLoopHook {
 public:
  std::function<Status(long, StepControl*)> before;
  std::function<Status(const StepResult&)> after;
  Status BeforeStep(long step, TrainingBackend&, StepControl* control) override { return before(step, control); }
  Status AfterStep(const StepResult& r, TrainingBackend&) override { return after(r); }
};

// Rank 0 of the learner's ring: everything of RunLearner but the followers.
// train: the learner's sampler (ranks × batch_size rows per step), shared with the followers.
Status RunLearnerLeader(net::NetContext& context, const LearnerOptions& o, const BatchSampler& train,
                        LocalRing& ring, bool* loop_entered, uint32_t* loop_end_crc, LearnerResult* result) {
  const RunConfig& cfg = *o.config;
  const TrainConfig& tc = cfg.train;
  const SyncConfig& sc = cfg.sync;
  const std::string me = LearnerName(o.index);
  TrainingBackend& backend = ring.backend(0);
  LearnerResult res;
  std::vector<ParamRange> changed;  // parameters rewritten since the ring last copied them

  std::vector<Fragment> frags;
  DL_RETURN_IF_ERROR(PartitionFragments(backend.table(), EffectiveFragments(sc), &frags));
  const int P = (int)frags.size();
  const int H = sc.inner_steps;
  // The outer-sync state lives on the backend (base, θ at send, residual: sync_*); the host keeps
  // a mirror of each base, updated from the same decoded bytes, to check the Globals' CRC32C.
  std::vector<FragState> fs(P);
  {
    std::vector<std::vector<ParamRange>> ranges;
    for (const Fragment& frag : frags) ranges.push_back(RangesOf(frag));
    backend.sync_setup(ranges);
  }
  for (int p = 0; p < P; p++) {
    fs[p].base.resize(frags[p].numel);
    backend.sync_read_base(p, fs[p].base.data());
  }
  // The parameters of fragment p changed on rank 0: the ring copies them before the next step.
  auto mark_changed = [&](int p) {
    for (const FragmentRange& r : frags[p].ranges) changed.push_back({r.offset, r.numel});
  };
  std::vector<uint8_t> contiguous;
  const long block_after = sc.mode == SyncMode::kDiloco      ? 0
                           : sc.mode == SyncMode::kStreaming ? sc.overlap
                                                             : std::numeric_limits<long>::max();

  // Sockets (this thread's): the downlink first, so nothing published after the handshake is missed.
  auto parsed = std::make_shared<ParsedMessage>();
  ParseOptions expect;
  expect.job_id = o.job_id;
  expect.accept = MessageBit(MessageType::kGlobal) | MessageBit(MessageType::kSyncerStatus);
  expect.model_params = backend.num_params();
  expect.allowed_senders = {kSyncerName};
  net::ReceiveOptions ro;
  // Globals are verified and decoded where ZeroMQ received them (no copy of the payload).
  ro.validator = net::EnvelopeValidatorInPlace(expect, parsed);
  net::SocketOptions so = LearnerSocket(o, me + ".downlink");
  so.recv_hwm_msgs = 100000;
  std::unique_ptr<net::SubChannel> down;
  DL_RETURN_IF_ERROR(net::SubChannel::Create(context, so, ro, &down));
  DL_RETURN_IF_ERROR(down->Subscribe(o.job_id));
  DL_RETURN_IF_ERROR(down->Connect(o.downlink_endpoint).WithContext(me + " downlink"));
  net::SocketOptions po = LearnerSocket(o, me + ".uplink");
  po.send_hwm_msgs = 100000;
  std::unique_ptr<net::PubChannel> up;
  DL_RETURN_IF_ERROR(net::PubChannel::Create(context, po, &up));
  DL_RETURN_IF_ERROR(up->Connect(o.uplink_endpoint).WithContext(me + " uplink"));
  auto dparsed = std::make_shared<ParsedMessage>();
  ParseOptions dexpect = expect;
  dexpect.accept = MessageBit(MessageType::kWelcome) | MessageBit(MessageType::kSnapshot);
  net::ReceiveOptions dro;
  dro.validator = net::EnvelopeValidator(dexpect, dparsed);
  dro.track_sequence = false;  // replies to requests: the syncer numbers them across all learners
  net::SocketOptions dso = LearnerSocket(o, me + ".snapshot");
  dso.recv_hwm_msgs = 100000;
  dso.linger_ms = 0;
  std::unique_ptr<net::DealerChannel> dealer;
  DL_RETURN_IF_ERROR(net::DealerChannel::Create(context, dso, dro, &dealer));
  if (o.snapshot_endpoint.empty())
    return Status::Error(me + ": no snapshot endpoint (the syncer's ROUTER) given");
  DL_RETURN_IF_ERROR(dealer->Connect(o.snapshot_endpoint).WithContext(me + " snapshot endpoint"));

  const uint64_t incarnation = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);
  uint64_t seq = 0, dealer_seq = 0;
  auto build = [&](uint64_t* sq, const MessageBody& body, std::shared_ptr<std::vector<uint8_t>> payload,
                   net::Message* out) -> Status {
    EnvelopeHeader h;
    h.job_id = o.job_id;
    h.sender = me;
    h.seq = ++*sq;
    h.incarnation = incarnation;
    h.sent_unix_ms = UnixMs();
    OutgoingMessage om;
    std::span<const uint8_t> bytes;
    if (payload) bytes = {payload->data(), payload->size()};
    DL_RETURN_IF_ERROR(BuildMessage(h, body, bytes, &om));
    res.bytes_up += om.wire_bytes();
    *out = net::ToMessage(std::move(om), payload);
    return Status::Ok();
  };
  auto send = [&](const MessageBody& body, std::shared_ptr<std::vector<uint8_t>> payload) -> Status {
    net::Message m;
    DL_RETURN_IF_ERROR(build(&seq, body, std::move(payload), &m));
    (void)up->Publish(o.job_id, m);
    return Status::Ok();
  };
  auto send_dealer = [&](const MessageBody& body) -> Status {
    net::Message m;
    DL_RETURN_IF_ERROR(build(&dealer_seq, body, nullptr, &m));
    (void)dealer->Send(m, 0);  // queued until connected; a full queue: retried later
    return Status::Ok();
  };

  double step_ms_ema = 0;
  float last_loss = std::numeric_limits<float>::quiet_NaN();
  long step = o.start_step;
  net::CloneClient clone;  // awaiting a snapshot until the start decides otherwise
  LearnerProgress progress;
  progress.index = o.index;
  progress.device = ring.description();
  progress.ranks = ring.ranks();
  auto last_step_save = Clock::now() - std::chrono::hours(1);
  auto report = [&](LearnerState state) {
    // What a restart continues from (a few times a second; a step is cheap to lose).
    if (!o.run_dir.empty() && Clock::now() - last_step_save > std::chrono::milliseconds(250)) {
      last_step_save = Clock::now();
      (void)SaveLearnerStep(o.run_dir, o.index, step);
    }
    if (!o.on_progress) return;
    progress.state = state;
    progress.step = step;
    progress.tokens = res.tokens;
    progress.loss = last_loss;
    progress.tokens_per_s = res.train_s > 0 ? res.tokens / res.train_s : 0;
    progress.base_versions.clear();
    for (const auto& f : fs) progress.base_versions.push_back(f.base_version);
    progress.deltas_sent = res.deltas_sent;
    progress.globals_applied = res.globals_applied;
    progress.snapshots_installed = res.snapshots_installed;
    o.on_progress(progress);
  };
  auto heartbeat = [&](LearnerState state) -> Status {
    HeartbeatMsg hb;
    hb.state = state;
    hb.step = step;
    hb.tokens = res.tokens;
    hb.loss = last_loss;
    hb.tokens_per_s = res.train_s > 0 ? (float)(res.tokens / res.train_s) : 0.f;
    hb.step_time_ms = (float)step_ms_ema;
    hb.interval_ms = o.heartbeat_interval_ms;
    for (int p = 0; p < P; p++)
      hb.fragments.push_back({(uint32_t)p, fs[p].base_version, fs[p].c_steps, fs[p].c_tokens, fs[p].in_flight});
    return send(hb, nullptr);
  };

  // Snapshot requests (Clone pattern): at most one outstanding; re-sent after snapshot_retry_ms.
  uint64_t request_id = 0;
  auto requested_at = Clock::now();
  bool request_outstanding = false;
  std::unique_ptr<SnapshotAssembler> assembler;
  std::string resync_reason = "join";
  auto request_snapshot = [&]() -> Status {
    SnapshotRequestMsg rq;
    rq.request_id = ++request_id;
    rq.reason = resync_reason;
    assembler = std::make_unique<SnapshotAssembler>(request_id, backend.num_params() * sizeof(float) + (1 << 20));
    request_outstanding = true;
    requested_at = Clock::now();
    return send_dealer(rq);
  };
  auto need_snapshot = [&](const std::string& why) {
    clone.BeginSnapshot();
    resync_reason = why;
  };

  std::vector<float> scratch;
  // Applies one Global that is the next version of its fragment (the CloneClient said so).
  auto apply_global = [&](const ParsedMessage& m) -> Status {
    const GlobalMsg* g = m.get<GlobalMsg>();
    FragState& f = fs[g->fragment];
    const Fragment& frag = frags[g->fragment];
    DL_RETURN_IF_ERROR(DecodeFragmentPayload(frag, g->payload, m, &scratch));
    if (g->payload.topk_fraction != 0)
      return Status::Error(me + ": a top-k Global (fragment " + std::to_string(g->fragment) +
                           ") cannot be applied where the parameters live; use a dense sync.codec.down");
    const bool included_self = std::any_of(g->contributors.begin(), g->contributors.end(),
                                           [&](const Contributor& c) { return c.learner == me; });
    ApplyUpdate(scratch.data(), frag.numel, f.base.data());
    ContiguousPayload(m, &contiguous);
    if (!backend.sync_apply_update((int)g->fragment, contiguous.data(), contiguous.size(),
                                   SyncCodecOf(g->payload.codec), g->payload.block_size))
      return Status::Error(me + ": the backend refused the Global of fragment " + std::to_string(g->fragment) +
                           " that the wire codec accepted; this is a bug");
    f.base_version = g->version;
    if (Crc32c(f.base.data(), frag.numel * sizeof(float)) != g->fragment_crc32c) {
      // Our copy of Θ_p is not the syncer's: fetch it (the local θ_p stays until then).
      f.bad = true;
      res.crc_mismatches++;
      need_snapshot("crc mismatch on fragment " + std::to_string(g->fragment) + " version " +
                    std::to_string(g->version));
      return Status::Ok();
    }
    const bool ours_included = included_self && f.in_flight;
    backend.sync_fold((int)g->fragment, FoldModeOf(sc.fold), sc.alpha,
                      ours_included ? FoldIncluded::kAtSend : FoldIncluded::kPreviousBase);
    mark_changed((int)g->fragment);
    if (sc.fold != FoldRule::kReplay) {
      f.c_steps = 0;
      f.c_tokens = 0;
    } else if (!ours_included) {
      // Replay of a Global without our delta: θ keeps all its local progress (and moved with
      // the base), so the counters stay, and θ at send moves by the same step to stay in the
      // frame the later fold of our delta subtracts it in.
      if (f.in_flight) backend.sync_shift_at_send((int)g->fragment);
    } else {
      // Our delta is in Θ: what is left locally is the progress since the send.
      f.c_steps -= std::min(f.c_steps, f.c_steps_at_send);
      f.c_tokens -= std::min(f.c_tokens, f.c_tokens_at_send);
    }
    if (f.in_flight && (included_self || g->version > f.sent_base + (uint64_t)sc.max_staleness + 1))
      f.in_flight = false;
    res.globals_applied++;
    progress.last_fragment_folded = (int)g->fragment;
    return Status::Ok();
  };

  // A Global from the downlink (its parse in *parsed, its frames in r).
  auto handle_global = [&](net::Received& r) -> Status {
    const GlobalMsg* g = parsed->get<GlobalMsg>();
    if ((int)g->fragment >= P) return Status::Ok();
    net::VersionedUpdate u;
    u.key = g->fragment;
    u.version = g->version;
    u.full = false;  // the syncer sends updates only; a full Global would be applied as a gap
    u.message = std::move(r.message);
    std::vector<net::VersionedUpdate> apply;
    const net::CloneVerdict v = clone.OnUpdate(std::move(u), &apply);
    if (v == net::CloneVerdict::kApply) return apply_global(*parsed);
    if (v == net::CloneVerdict::kGap) {
      res.gaps++;
      need_snapshot("gap in the global stream of fragment " + std::to_string(g->fragment));
    }
    return Status::Ok();
  };

  // A SyncerStatus naming our in-flight delta as dropped or rejected: no Global will include it,
  // so stop waiting; the next delta of that fragment carries all the progress since its base (the
  // error-feedback residual of the lost one goes too). A base from the future means the syncer
  // went back to an older checkpoint: resync.
  auto handle_status = [&](const SyncerStatusMsg& st) {
    for (const DroppedDelta& d : st.recent_drops) {
      if (d.learner != me || d.fragment >= (uint32_t)P) continue;
      FragState& f = fs[d.fragment];
      if (!f.in_flight || d.base_version != f.sent_base) continue;
      f.in_flight = false;
      backend.sync_reset_residual((int)d.fragment);
      res.deltas_dropped++;
      std::fprintf(stderr, "%s: the syncer dropped our delta of fragment %u (base %llu): %s\n", me.c_str(),
                   d.fragment, (unsigned long long)d.base_version, d.reason.c_str());
      if (d.reason == ToString(StalenessVerdict::kFromTheFuture))
        need_snapshot("the syncer is behind our base of fragment " + std::to_string(d.fragment));
    }
  };

  // A complete snapshot: install the fragments that differ, then the buffered newer Globals.
  auto install_snapshot = [&](std::vector<ParsedMessage>&& parts) -> Status {
    std::map<uint64_t, uint64_t> versions;
    for (ParsedMessage& part : parts) {
      const SnapshotMsg& sm = *part.get<SnapshotMsg>();
      if ((int)sm.fragment >= P || sm.versions.size() != (size_t)P)
        return Status::Error(me + ": snapshot has " + std::to_string(sm.versions.size()) + " fragments, this learner " +
                             std::to_string(P) + "; are the syncer and the learner running the same config?");
      const Fragment& frag = frags[sm.fragment];
      DL_RETURN_IF_ERROR(DecodeFragmentPayload(frag, sm.payload, part, &scratch)
                             .WithContext(me + ": snapshot part for fragment " + std::to_string(sm.fragment)));
      if (Crc32c(scratch.data(), frag.numel * sizeof(float)) != sm.fragment_crc32c)
        return Status::Error(me + ": snapshot fragment " + std::to_string(sm.fragment) + " fails its CRC32C");
      FragState& f = fs[sm.fragment];
      const bool same = !f.bad && f.base_version == sm.version &&
                        Crc32c(f.base.data(), frag.numel * sizeof(float)) == sm.fragment_crc32c;
      if (!same) {
        f.base = scratch;
        backend.sync_install((int)sm.fragment, f.base.data());
        mark_changed((int)sm.fragment);
        f.base_version = sm.version;
        f.c_steps = 0;
        f.c_tokens = 0;
        f.in_flight = false;
        f.bad = false;
      }
    }
    const std::vector<uint64_t>& cut = parts.front().get<SnapshotMsg>()->versions;
    for (int p = 0; p < P; p++) versions[(uint64_t)p] = cut[p];
    res.snapshots_installed++;
    request_outstanding = false;
    std::vector<net::VersionedUpdate> apply;
    clone.OnSnapshot(versions, &apply);
    ParsedMessage m;
    for (auto& u : apply) {
      const auto spans = u.message.spans();
      DL_RETURN_IF_ERROR(ParseEnvelope(spans, expect, &m).WithContext(me + ": a buffered global"));
      DL_RETURN_IF_ERROR(apply_global(m));
    }
    return Status::Ok();
  };

  // Startup exchange state (see the header).
  bool welcomed = false, downlink_seen = false;
  auto handle_dealer = [&]() -> Status {
    res.bytes_down += dparsed->wire_bytes;
    if (const WelcomeMsg* w = dparsed->get<WelcomeMsg>()) {
      if (w->result == JoinResult::kAccepted) {
        welcomed = true;
      } else if (w->result != JoinResult::kBusy) {
        return Status::Error(me + ": the syncer at " + o.snapshot_endpoint + " refused this learner: " + w->reason);
      }
      return Status::Ok();
    }
    if (dparsed->get<SnapshotMsg>() && assembler && request_outstanding) {
      if (dparsed->get<SnapshotMsg>()->request_id != request_id) return Status::Ok();  // an older answer
      if (Status st = assembler->Add(std::move(*dparsed)); !st.ok()) {
        std::fprintf(stderr, "%s: dropping a snapshot part (%s); will ask again\n", me.c_str(), st.message().c_str());
        return Status::Ok();
      }
      if (assembler->complete()) return install_snapshot(assembler->Take());
    }
    return Status::Ok();
  };

  std::vector<net::Socket*> sockets{&down->socket(), &dealer->socket()};
  std::vector<bool> ready;
  bool started = false;  // the start decided how to leave the initial "awaiting snapshot"
  auto poll = [&](int timeout_ms) -> Status {
    if (timeout_ms > 0 && !net::PollReadable(sockets, timeout_ms, &ready)) return Status::Ok();
    net::Received r;
    while (down->Receive(&r, 0) == net::RecvResult::kMessage) {
      downlink_seen = true;
      res.bytes_down += parsed->wire_bytes;
      if (parsed->get<GlobalMsg>()) DL_RETURN_IF_ERROR(handle_global(r));
      if (const SyncerStatusMsg* st = parsed->get<SyncerStatusMsg>()) handle_status(*st);
    }
    while (dealer->Receive(&r, 0) == net::RecvResult::kMessage) DL_RETURN_IF_ERROR(handle_dealer());
    if (started && clone.awaiting_snapshot() &&
        (!request_outstanding || Clock::now() - requested_at > std::chrono::milliseconds(o.snapshot_retry_ms)))
      DL_RETURN_IF_ERROR(request_snapshot());
    return Status::Ok();
  };

  auto send_delta = [&](int p, long at_step) -> Status {
    FragState& f = fs[p];
    const Fragment& frag = frags[p];
    auto payload = std::make_shared<std::vector<uint8_t>>();
    std::vector<uint64_t> tensor_bytes;
    // Δ = base − θ, encoded where the parameters live (θ at send is kept there too).
    if (!backend.sync_encode_delta(p, SyncCodecOf(sc.codec.up), sc.codec.block, payload.get(), &tensor_bytes))
      return Status::Error(me + ": the delta of fragment " + std::to_string(p) + " at step " +
                           std::to_string(at_step) + " is NaN or Inf (or overflows the codec); try a lower train.lr");
    DeltaMsg d;
    d.fragment = (uint32_t)p;
    d.base_version = f.base_version;
    d.c_steps = f.c_steps;
    d.c_tokens = f.c_tokens;
    d.learner_step = (uint64_t)at_step;
    d.payload = FragmentPayloadInfo(frag, sc.codec.up, sc.codec.block, tensor_bytes);
    DL_RETURN_IF_ERROR(send(d, payload));
    f.in_flight = true;
    f.sent_base = f.base_version;
    f.send_step = at_step;
    f.c_steps_at_send = f.c_steps;
    f.c_tokens_at_send = f.c_tokens;
    res.deltas_sent++;
    progress.last_fragment_sent = p;
    return Status::Ok();
  };

  const int B = tc.batch_size, T = cfg.model.block_size;
  const long tokens_per_step = (long)ring.ranks() * B * T;
  const double slowdown = SlowdownOf(cfg.learners, o.index);
  double recent_sum = 0;
  int recent_n = 0;
  auto last_beat = Clock::now() - std::chrono::hours(1);
  auto state_now = [&] { return clone.awaiting_snapshot() ? LearnerState::kResyncing : LearnerState::kTraining; };
  auto beat_if_due = [&]() -> Status {
    if (Clock::now() - last_beat < std::chrono::milliseconds(o.heartbeat_interval_ms)) return Status::Ok();
    last_beat = Clock::now();
    return heartbeat(state_now());
  };
  auto crashed = [&] {
    return (o.crash && o.crash->load()) || (o.crash_after_steps >= 0 && step >= o.crash_after_steps);
  };
  auto stopping = [&] { return o.stop && o.stop->load(); };

  // Startup exchange: Heartbeat(kJoining) on the uplink, Hello on the DEALER, until Welcome
  // and a downlink message (both directions up).
  report(LearnerState::kJoining);
  {
    HelloMsg hello;
    hello.role = PeerRole::kLearner;
    hello.tensor_table_digest = backend.table().digest();
    hello.num_params = backend.num_params();
    hello.num_fragments = (uint32_t)P;
    hello.fragment_layout_digest = FragmentsDigest(frags);
    hello.build = "dilocod learner";
    const auto t0 = Clock::now();
    auto last_hello = t0 - std::chrono::hours(1);
    auto last_join_beat = t0 - std::chrono::hours(1);
    while (!(welcomed && downlink_seen)) {
      if (crashed()) {
        res.crashed = true;
        *result = res;
        return Status::Ok();
      }
      if (stopping()) {
        res.stopped = true;
        *result = res;
        return Status::Ok();
      }
      const auto now = Clock::now();
      if (now - t0 > std::chrono::milliseconds(o.handshake_timeout_ms))
        return Status::Error(me + ": no answer from the syncer (uplink " + o.uplink_endpoint + ", downlink " +
                             o.downlink_endpoint + ", snapshot " + o.snapshot_endpoint + ") within " +
                             std::to_string(o.handshake_timeout_ms) + " ms; is it running, and are the keys right?");
      if (now - last_join_beat >= std::chrono::milliseconds(20)) {
        DL_RETURN_IF_ERROR(heartbeat(LearnerState::kJoining));
        last_join_beat = now;
      }
      if (now - last_hello >= std::chrono::milliseconds(50)) {
        DL_RETURN_IF_ERROR(send_dealer(hello));
        last_hello = now;
      }
      DL_RETURN_IF_ERROR(poll(10));
    }
  }
  started = true;
  if (o.join_from_snapshot) {
    // Train only once the snapshot is in (poll sends the request; Globals are buffered meanwhile).
    resync_reason = "join";
    report(LearnerState::kResyncing);
    const auto t0 = Clock::now();
    while (clone.awaiting_snapshot()) {
      if (crashed() || stopping()) {
        res.crashed = crashed();
        res.stopped = !res.crashed;
        *result = res;
        return Status::Ok();
      }
      DL_RETURN_IF_ERROR(beat_if_due());
      DL_RETURN_IF_ERROR(poll(10));
      if (Clock::now() - t0 > std::chrono::milliseconds(o.handshake_timeout_ms))
        return Status::Error(me + ": no snapshot from the syncer at " + o.snapshot_endpoint + " within " +
                             std::to_string(o.handshake_timeout_ms) + " ms");
    }
  } else {
    // Version 0 of every fragment is init_params; Globals buffered so far apply now.
    std::map<uint64_t, uint64_t> zero;
    for (int p = 0; p < P; p++) zero[(uint64_t)p] = 0;
    std::vector<net::VersionedUpdate> apply;
    clone.OnSnapshot(zero, &apply);
    ParsedMessage m;
    for (auto& u : apply) {
      const auto spans = u.message.spans();
      DL_RETURN_IF_ERROR(ParseEnvelope(spans, expect, &m).WithContext(me + ": a buffered global"));
      DL_RETURN_IF_ERROR(apply_global(m));
    }
  }
  DL_RETURN_IF_ERROR(heartbeat(state_now()));
  last_beat = Clock::now();
  report(state_now());

  const auto train_start = Clock::now();
  LearnerHook hook;
  hook.before = [&](long at, StepControl* control) -> Status {
    step = at;
    if (TimeLimitReached(tc, train_start)) {
      control->stop = true;
      return Status::Ok();
    }
    if (crashed()) {
      res.crashed = true;
      control->stop = true;
      return Status::Ok();
    }
    if (stopping()) {
      res.stopped = true;
      control->stop = true;
      return Status::Ok();
    }
    if (o.before_step) o.before_step(step);
    DL_RETURN_IF_ERROR(poll(0));
    // Lock-step modes: wait for fragments in flight too long.
    for (int p = 0; p < P; p++) {
      const auto w0 = Clock::now();
      while (fs[p].in_flight && step - fs[p].send_step >= block_after) {
        if ((o.crash && o.crash->load()) || stopping()) break;
        DL_RETURN_IF_ERROR(beat_if_due());
        DL_RETURN_IF_ERROR(poll(10));
        if (Clock::now() - w0 > std::chrono::seconds(120))
          return Status::Error(me + ": waited 120 s for the global of fragment " + std::to_string(p) +
                               " at step " + std::to_string(step) + "; is the syncer running?");
      }
      res.wait_s += std::chrono::duration<double>(Clock::now() - w0).count();
    }
    DL_RETURN_IF_ERROR(beat_if_due());
    control->changed = std::move(changed);
    changed.clear();
    return Status::Ok();
  };
  hook.after = [&](const StepResult& r) -> Status {
    const StepStats& st = r.stats;
    if (!st.applied)
      return Status::Error(me + ": training diverged at step " + std::to_string(step) +
                           " (loss or gradient NaN/Inf). Try a lower train.lr or sync.outer.lr");
    if (slowdown > 1) std::this_thread::sleep_for(std::chrono::duration<double>((slowdown - 1) * r.step_s));
    const double step_s = r.step_s * std::max(1.0, slowdown);
    step_ms_ema = step_ms_ema == 0 ? step_s * 1e3 : step_ms_ema + 0.2 * (step_s * 1e3 - step_ms_ema);
    res.train_s += step_s;
    res.tokens += tokens_per_step;
    last_loss = (float)st.loss;
    recent_sum += st.loss;
    recent_n++;
    for (auto& f : fs) {
      f.c_steps++;
      f.c_tokens += (uint64_t)tokens_per_step;
    }
    const long done = r.step + 1;
    step = done;
    // No deltas while a snapshot is awaited: the bases are about to change.
    for (int p = 0; p < P; p++)
      if (Fires(p, done, H, P) && !fs[p].in_flight && !clone.awaiting_snapshot())
        DL_RETURN_IF_ERROR(send_delta(p, done));
    report(state_now());
    if (done % tc.log_every == 0 || done == tc.steps) {
      res.final_train_loss = recent_sum / recent_n;
      recent_sum = 0;
      recent_n = 0;
      if (o.metrics) {
        std::lock_guard<std::mutex> lock(*o.metrics_mu);
        (void)o.metrics->Write({{"learner", o.index},
                                {"step", done},
                                {"loss", st.loss},
                                {"lr", r.lr},
                                {"grad_norm", st.grad_norm},
                                {"tokens", res.tokens},
                                {"step_ms", step_s * 1e3},
                                {"tok_per_s", res.tokens / res.train_s},
                                {"bytes_up", res.bytes_up},
                                {"bytes_down", res.bytes_down},
                                {"versions", [&] {
                                   std::vector<uint64_t> v;
                                   for (auto& f : fs) v.push_back(f.base_version);
                                   return v;
                                 }()}});
      }
    }
    return Status::Ok();
  };
  *loop_entered = true;
  DL_RETURN_IF_ERROR(RunInnerLoop(RankLoopOptions(cfg, train, 0, step), backend, ring.comm(0), &hook, &step));
  if (ring.ranks() > 1) *loop_end_crc = ParamsCrc32c(backend);  // before the last polls fold into rank 0
  res.steps = step;
  if (!o.run_dir.empty()) DL_RETURN_IF_ERROR(SaveLearnerStep(o.run_dir, o.index, step));
  if (!res.crashed) {
    // The work since each fragment's last send goes to the syncer too.
    DL_RETURN_IF_ERROR(poll(0));
    if (!clone.awaiting_snapshot())
      for (int p = 0; p < P; p++)
        if (!fs[p].in_flight && fs[p].c_steps > 0) DL_RETURN_IF_ERROR(send_delta(p, step));
    const LearnerState final_state = res.stopped ? LearnerState::kStopping : LearnerState::kFinished;
    DL_RETURN_IF_ERROR(heartbeat(final_state));
    DL_RETURN_IF_ERROR(poll(0));
    report(final_state);
  } else {
    report(LearnerState::kFailed);
  }
  *result = res;
  return Status::Ok();
}

}  // namespace

Status RunLearner(net::NetContext& context, const LearnerOptions& o, LearnerResult* result) {
  const RunConfig& cfg = *o.config;
  const std::string me = LearnerName(o.index);
  if (o.init_params == nullptr && !o.join_from_snapshot)
    return Status::Error(me + ": no initial parameters: give init_params or join_from_snapshot");
  std::unique_ptr<Corpus> corpus;
  DL_RETURN_IF_ERROR(Corpus::Load(cfg.data.corpus, CorpusOptionsOf(cfg, o.index, cfg.sync.learners), &corpus));
  std::unique_ptr<LocalRing> ring;
  LocalRingOptions ro = LocalRingOptionsOf(cfg, std::max(1, o.threads));
  if (!o.device.empty()) ro.device = o.device;
  DL_RETURN_IF_ERROR(LocalRing::Create(ro, &ring).WithContext(me));
  // A joining learner starts from the syncer's snapshot: rank 0 installs it, the ring copies it.
  if (o.init_params != nullptr) ring->Upload(o.init_params);
  const BatchSampler train = TrainSampler(*corpus, ring->ranks() * cfg.train.batch_size, cfg.model.block_size,
                                          mix_seed(cfg.train.seed, (uint64_t)o.index));
  std::vector<uint32_t> crcs(ring->ranks(), 0);
  DL_RETURN_IF_ERROR(ring->Run([&](int rank) -> Status {
    if (rank == 0) {
      bool loop_entered = false;
      Status st = RunLearnerLeader(context, o, train, *ring, &loop_entered, &crcs[0], result);
      // Ended before training (a crash or a stop during the handshake): release the followers.
      if (st.ok() && !loop_entered) (void)StopFollowers(ring->comm(0));
      return st;
    }
    long done = 0;  // a follower takes each step's number from rank 0
    DL_RETURN_IF_ERROR(
        RunInnerLoop(RankLoopOptions(cfg, train, rank, 0), ring->backend(rank), ring->comm(rank), nullptr, &done));
    crcs[rank] = ParamsCrc32c(ring->backend(rank));
    return Status::Ok();
  }));
  if (ring->ranks() > 1 && crcs[0] != 0) result->rank_param_crc32c = crcs;
  return Status::Ok();
}

}  // namespace diloco
