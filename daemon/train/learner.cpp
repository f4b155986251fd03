#include "daemon/train/learner.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
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
#include "daemon/sync/protocol.h"
#include "daemon/train/checkpoint.h"
#include "daemon/train/data.h"
#include "daemon/train/fragment_ledger.h"
#include "daemon/train/inner_loop.h"
#include "daemon/train/liveness_sender.h"
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
  // a mirror of each base, updated from the same decoded bytes, to check the Globals' CRC32C. The
  // ledger (fragment_ledger.h) keeps versions, counters and what is in flight.
  FragmentLedger ledger(P, sc.fold, sc.max_staleness);
  std::vector<std::vector<float>> bases(P);
  {
    std::vector<std::vector<ParamRange>> ranges;
    for (const Fragment& frag : frags) ranges.push_back(RangesOf(frag));
    backend.sync_setup(ranges);
  }
  for (int p = 0; p < P; p++) {
    bases[p].resize(frags[p].numel);
    backend.sync_read_base(p, bases[p].data());
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
    for (int p = 0; p < P; p++) progress.base_versions.push_back(ledger[p].base_version);
    progress.deltas_sent = res.deltas_sent;
    progress.globals_applied = res.globals_applied;
    progress.snapshots_installed = res.snapshots_installed;
    o.on_progress(progress);
  };
  std::unique_ptr<LivenessSender> liveness;  // started once the handshake is through
  auto heartbeat = [&](LearnerState state) -> Status {
    HeartbeatMsg hb;
    hb.state = state;
    hb.step = step;
    hb.tokens = res.tokens;
    hb.loss = last_loss;
    hb.tokens_per_s = res.train_s > 0 ? (float)(res.tokens / res.train_s) : 0.f;
    hb.step_time_ms = (float)step_ms_ema;
    hb.interval_ms = o.heartbeat_interval_ms;
    for (int p = 0; p < P; p++) {
      const LedgerFragment& f = ledger[p];
      hb.fragments.push_back({(uint32_t)p, f.base_version, f.c_steps, f.c_tokens, f.in_flight});
    }
    if (liveness) liveness->Update(hb);
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
    const int p = (int)g->fragment;
    std::vector<float>& base = bases[p];
    const Fragment& frag = frags[p];
    // An update that does not decode, or is not finite, would poison every parameter it touches:
    // refuse it and resync from a snapshot.
    Status decoded = DecodeFragmentPayload(frag, g->payload, m, &scratch);
    if (decoded.ok() && !std::all_of(scratch.begin(), scratch.end(), [](float x) { return std::isfinite(x); }))
      decoded = Status::Error("its update is not finite");
    if (!decoded.ok()) {
      res.globals_refused++;
      std::fprintf(stderr, "%s: refusing Global %llu of fragment %d (%s); resyncing\n", me.c_str(),
                   (unsigned long long)g->version, p, decoded.message().c_str());
      need_snapshot("refused global of fragment " + std::to_string(p));
      return Status::Ok();
    }
    if (g->payload.topk_fraction != 0)
      return Status::Error(me + ": a top-k Global (fragment " + std::to_string(g->fragment) +
                           ") cannot be applied where the parameters live; use a dense sync.codec.down");
    const bool included_self = std::any_of(g->contributors.begin(), g->contributors.end(),
                                           [&](const Contributor& c) { return c.learner == me; });
    ApplyUpdate(scratch.data(), frag.numel, base.data());
    ContiguousPayload(m, &contiguous);
    if (!backend.sync_apply_update((int)g->fragment, contiguous.data(), contiguous.size(),
                                   SyncCodecOf(g->payload.codec), g->payload.block_size))
      return Status::Error(me + ": the backend refused the Global of fragment " + std::to_string(g->fragment) +
                           " that the wire codec accepted; this is a bug");
    if (Crc32c(base.data(), frag.numel * sizeof(float)) != g->fragment_crc32c) {
      // Our copy of Θ_p is not the syncer's: fetch it (the local θ_p, and a delta in flight,
      // stay until then: a lock-step learner keeps waiting for the snapshot).
      ledger.OnCrcMismatch(p, g->version);
      res.crc_mismatches++;
      need_snapshot("crc mismatch on fragment " + std::to_string(g->fragment) + " version " +
                    std::to_string(g->version));
      return Status::Ok();
    }
    const GlobalFold fold = ledger.OnGlobal(p, g->version, included_self);
    backend.sync_fold(p, FoldModeOf(sc.fold), sc.alpha,
                      fold.ours_included ? FoldIncluded::kAtSend : FoldIncluded::kPreviousBase);
    if (fold.shift_at_send) backend.sync_shift_at_send(p);
    mark_changed(p);
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

  // A SyncerStatus (fragment_ledger.h, Status and Drop):
  //  - a drop notice for our in-flight delta: no Global will include it, so stop waiting; the next
  //    delta of that fragment carries all the progress since its base (the error-feedback
  //    residual of the dropped one goes too). A base from the future: the syncer went back: resync;
  //  - a version that differs from our base: we missed a Global (or the syncer went back): resync;
  //  - an in-flight delta the syncer has heard past and does not hold: lost; sent again at once
  //    (lost_deltas), so a lock-step round is not left waiting for it.
  std::vector<int> lost_deltas;
  auto last_downlink = Clock::now();
  auto handle_status = [&](const SyncerStatusMsg& st) {
    for (const DroppedDelta& d : st.recent_drops) {
      if (d.learner != me || d.fragment >= (uint32_t)P) continue;
      if (!ledger.OnDrop((int)d.fragment, d.base_version)) continue;
      backend.sync_reset_residual((int)d.fragment);
      res.deltas_dropped++;
      std::fprintf(stderr, "%s: the syncer dropped our delta of fragment %u (base %llu): %s\n", me.c_str(),
                   d.fragment, (unsigned long long)d.base_version, d.reason.c_str());
      if (d.reason == ToString(StalenessVerdict::kFromTheFuture))
        need_snapshot("the syncer is behind our base of fragment " + std::to_string(d.fragment));
    }
    if (clone.awaiting_snapshot()) return;  // Globals are buffered: the bases are not current
    const LearnerAck* ack = nullptr;
    for (const LearnerAck& a : st.acks)
      if (a.learner == me && a.incarnation == incarnation) ack = &a;
    const StatusVerdict v = ledger.OnStatus(st.versions, ack);
    if (!v.missed.empty()) {
      res.globals_missed += v.missed.size();
      const int p = v.missed.front();
      need_snapshot("fragment " + std::to_string(p) + " is at version " + std::to_string(st.versions[p]) +
                    " at the syncer, ours is " + std::to_string(ledger[p].base_version));
    }
    for (int p : v.lost) {
      backend.sync_reset_residual(p);
      res.deltas_lost++;
      lost_deltas.push_back(p);
      std::fprintf(stderr, "%s: our delta of fragment %d (base %llu) never reached the syncer; sending again\n",
                   me.c_str(), p, (unsigned long long)ledger[p].sent_base);
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
      const int p = (int)sm.fragment;
      if (!std::all_of(scratch.begin(), scratch.end(), [](float x) { return std::isfinite(x); }))
        return Status::Error(me + ": snapshot fragment " + std::to_string(p) + " is not finite");
      const bool same = !ledger[p].bad && ledger[p].base_version == sm.version &&
                        Crc32c(bases[p].data(), frag.numel * sizeof(float)) == sm.fragment_crc32c;
      if (!same) {
        bases[p] = scratch;
        backend.sync_install(p, bases[p].data());
        mark_changed(p);
        ledger.OnSnapshot(p, sm.version);
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
      last_downlink = Clock::now();
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
    const LedgerFragment& f = ledger[p];
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
    ledger.OnSend(p, at_step, seq);  // seq: the delta's number on the main stream
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
  // Lost deltas go again with all the work since their base (not while a snapshot is awaited:
  // the bases are about to change, and the snapshot settles what is in flight).
  auto resend_lost = [&]() -> Status {
    if (clone.awaiting_snapshot()) return Status::Ok();
    std::vector<int> lost;
    lost.swap(lost_deltas);
    for (int p : lost)
      if (!ledger[p].in_flight && ledger[p].c_steps > 0) DL_RETURN_IF_ERROR(send_delta(p, step));
    return Status::Ok();
  };
  // Poll (and beat) until done() or the syncer has been silent for syncer_timeout_ms. what names
  // the wait in the error and in the progress lines printed every 30 s.
  auto wait_until = [&](const std::function<bool()>& done, const std::string& what) -> Status {
    auto last_said = Clock::now();
    while (!done()) {
      if ((o.crash && o.crash->load())) return Status::Ok();
      DL_RETURN_IF_ERROR(beat_if_due());
      DL_RETURN_IF_ERROR(poll(10));
      DL_RETURN_IF_ERROR(resend_lost());
      const auto now = Clock::now();
      if (now - last_downlink > std::chrono::milliseconds(o.syncer_timeout_ms))
        return Status::Error(me + ": no word from the syncer (downlink " + o.downlink_endpoint + ") for " +
                             std::to_string(o.syncer_timeout_ms / 1000) + " s while " + what +
                             "; is it running? (LearnerOptions::syncer_timeout_ms)");
      if (now - last_said > std::chrono::seconds(30)) {
        std::fprintf(stderr, "%s: still %s\n", me.c_str(), what.c_str());
        last_said = now;
      }
    }
    return Status::Ok();
  };

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
  {
    // From here on liveness beats come from their own thread (liveness_sender.h).
    LivenessOptions lo;
    lo.job_id = o.job_id;
    lo.sender = me;
    lo.incarnation = incarnation;
    lo.endpoint = o.uplink_endpoint;
    lo.socket = LearnerSocket(o, me + ".liveness");
    lo.socket.linger_ms = 0;
    lo.interval_ms = o.heartbeat_interval_ms;
    lo.crash = o.crash;
    DL_RETURN_IF_ERROR(LivenessSender::Start(context, lo, &liveness));
    DL_RETURN_IF_ERROR(heartbeat(state_now()));  // gives the liveness thread its first beat
  }

  const auto train_start = Clock::now();
  res.train_start_unix_ms = (int64_t)UnixMs();
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
    DL_RETURN_IF_ERROR(resend_lost());
    // Lock-step modes: wait for fragments in flight too long, as long as the syncer is there (a
    // lost delta or Global is found through its status and sent or fetched again).
    for (int p = 0; p < P; p++) {
      if (!ledger.Blocks(p, step, block_after)) continue;
      const auto w0 = Clock::now();
      const int64_t w0_unix = (int64_t)UnixMs();
      DL_RETURN_IF_ERROR(wait_until([&] { return !ledger.Blocks(p, step, block_after) || stopping(); },
                                    "waiting for the global of fragment " + std::to_string(p) + " at step " +
                                        std::to_string(step)));
      res.wait_s += std::chrono::duration<double>(Clock::now() - w0).count();
      res.blocked_unix_ms.push_back({w0_unix, (int64_t)UnixMs()});
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
    const double slow = o.slowdown ? o.slowdown->load() : slowdown;
    if (slow > 1) std::this_thread::sleep_for(std::chrono::duration<double>((slow - 1) * r.step_s));
    const double step_s = r.step_s * std::max(1.0, slow);
    res.compute_s += r.step_s;
    step_ms_ema = step_ms_ema == 0 ? step_s * 1e3 : step_ms_ema + 0.2 * (step_s * 1e3 - step_ms_ema);
    res.train_s += step_s;
    res.tokens += tokens_per_step;
    last_loss = (float)st.loss;
    recent_sum += st.loss;
    recent_n++;
    ledger.OnStep((uint64_t)tokens_per_step);
    const long done = r.step + 1;
    step = done;
    // No deltas while a snapshot is awaited: the bases are about to change.
    for (int p = 0; p < P; p++)
      if (Fires(p, done, H, P) && !ledger[p].in_flight && !clone.awaiting_snapshot())
        DL_RETURN_IF_ERROR(send_delta(p, done));
    report(state_now());
    // The learner's own moments, for a restart (its parameters then come from a snapshot).
    if (!o.run_dir.empty() && tc.checkpoint_every > 0 && done % tc.checkpoint_every == 0)
      DL_RETURN_IF_ERROR(SaveCheckpoint(LearnerCheckpointPath(o.run_dir, o.index), backend, done, RunConfigToYaml(cfg))
                             .WithContext(me + ": saving its moments"));
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
                                   for (int p = 0; p < P; p++) v.push_back(ledger[p].base_version);
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
    // Flush, so no work is lost at the end: the deltas in flight are merged or let go (lost ones
    // go again), then the work since each fragment's last send goes out, and the learner stays
    // until the syncer has merged that too (within flush_timeout_ms).
    const auto deadline = Clock::now() + std::chrono::milliseconds(o.flush_timeout_ms);
    auto settled = [&] {
      return (!ledger.AnyInFlight() && !clone.awaiting_snapshot() && lost_deltas.empty()) ||
             Clock::now() > deadline;
    };
    DL_RETURN_IF_ERROR(wait_until(settled, "flushing: waiting for the globals of the deltas in flight"));
    if (!clone.awaiting_snapshot())
      for (int p = 0; p < P; p++)
        if (!ledger[p].in_flight && ledger[p].c_steps > 0) DL_RETURN_IF_ERROR(send_delta(p, step));
    DL_RETURN_IF_ERROR(wait_until(settled, "flushing: waiting for the syncer to merge the last deltas"));
    for (int p = 0; p < P; p++)
      if (ledger[p].in_flight)
        std::fprintf(stderr, "%s: fragment %d's last delta was not merged within %d ms of the end\n", me.c_str(), p,
                     o.flush_timeout_ms);
    res.crashed = o.crash && o.crash->load();
  }
  if (liveness) {
    liveness->Stop();  // the last beat below is the final word
    res.bytes_up += liveness->bytes_sent();
  }
  if (!res.crashed) {
    const LearnerState final_state = res.stopped ? LearnerState::kStopping : LearnerState::kFinished;
    DL_RETURN_IF_ERROR(heartbeat(final_state));
    DL_RETURN_IF_ERROR(poll(0));
    report(final_state);
    res.end_unix_ms = (int64_t)UnixMs();
  } else {
    report(LearnerState::kFailed);
    res.crashed_unix_ms = (int64_t)UnixMs();
    for (int p = 0; p < P; p++) {
      const LedgerFragment& f = ledger[p];
      res.unsent_tokens_at_crash.push_back(f.c_tokens - (f.in_flight ? std::min(f.c_tokens, f.c_tokens_at_send) : 0));
    }
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
  bool moments_restored = false;
  // A restarted learner takes its AdamW moments back from its own last checkpoint, when it has one
  // (the snapshot then replaces the parameters); else they start at zero.
  if (o.join_from_snapshot && !o.run_dir.empty() && std::filesystem::exists(LearnerCheckpointPath(o.run_dir, o.index))) {
    Checkpoint ckpt;
    DL_RETURN_IF_ERROR(LoadCheckpoint(LearnerCheckpointPath(o.run_dir, o.index), &ckpt).WithContext(me));
    DL_RETURN_IF_ERROR(CheckCheckpointFits(ckpt, GptConfigOf(cfg.model), true).WithContext(me));
    ring->Upload(ckpt.params.data(), &ckpt.optimizer);
    moments_restored = true;
  }
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
  result->moments_restored = moments_restored;
  return Status::Ok();
}

}  // namespace diloco
