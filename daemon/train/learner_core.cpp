#include "daemon/train/learner_core.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

#include "daemon/net/wire_transport.h"
#include "daemon/sync/decide.h"
#include "daemon/sync/drop_reasons.h"
#include "daemon/sync/fold.h"
#include "daemon/sync/merge.h"
#include "daemon/sync/protocol.h"
#include "daemon/train/trainer.h"
#include "daemon/util/crc32c.h"

namespace diloco {

namespace {

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

double Seconds(SyncTime::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

LearnerCore::LearnerCore(const LearnerOptions& o, TrainingBackend& backend0, OuterState& outer,
                         std::vector<Fragment> frags, uint64_t incarnation, LearnerPort* port)
    : o_(o),
      cfg_(*o.config),
      tc_(cfg_.train),
      sc_(cfg_.sync),
      me_(LearnerName(o.index)),
      backend_(backend0),
      outer_(outer),
      port_(port),
      frags_(std::move(frags)),
      shards_(ShardMap::Of(frags_, sc_.syncers)),
      P_((int)frags_.size()),
      H_(sc_.inner_steps),
      ledger_(P_, sc_.fold, sc_.max_staleness),
      bases_(P_),
      up_codec_(UplinkCodec(sc_)),
      up_topk_ef_(up_codec_, LinkFeedback(sc_)),
      block_after_(sc_.mode == SyncMode::kDiloco      ? 0
                   : sc_.mode == SyncMode::kStreaming ? sc_.overlap
                                                      : std::numeric_limits<long>::max()),
      incarnation_(incarnation),
      seq_(shards_.shards(), 0),
      dealer_seq_(shards_.shards(), 0),
      welcomed_(shards_.shards(), false),
      downlink_seen_(shards_.shards(), false),
      last_word_seq_(shards_.shards(), 0),
      last_word_heard_(shards_.shards(), false),
      last_loss_(std::numeric_limits<float>::quiet_NaN()),
      step_(o.start_step),
      tokens_per_step_((long)LearnerTokensPerStep(cfg_)) {
  res_.steps = o.start_step;
  progress_.index = o.index;
  expect_.job_id = o.job_id;
  expect_.accept = MessageBit(MessageType::kGlobal) | MessageBit(MessageType::kSyncerStatus);
  expect_.model_params = backend_.num_params();
  expect_.allowed_senders = shards_.Names();
}

LearnerCore::~LearnerCore() = default;

ParseOptions LearnerCore::dealer_expect() const {
  ParseOptions d = expect_;
  d.accept = MessageBit(MessageType::kWelcome) | MessageBit(MessageType::kSnapshot);
  return d;
}

void LearnerCore::Describe(const std::string& device, int ranks) {
  progress_.device = device;
  progress_.ranks = ranks;
}

Status LearnerCore::SetUp() {
  std::vector<std::vector<ParamRange>> ranges;
  for (const Fragment& frag : frags_) ranges.push_back(RangesOf(frag));
  DL_RETURN_IF_ERROR(outer_.Setup(ranges, sc_.codec.block).WithContext(me_));
  for (int p = 0; p < P_; p++) {
    bases_[p].resize(frags_[p].numel);
    DL_RETURN_IF_ERROR(outer_.ReadBase(p, bases_[p].data()).WithContext(me_));
  }
  return Status::Ok();
}

// ---- Startup ----

Status LearnerCore::OnJoinTimer() {
  if (!join_reported_) {
    join_reported_ = true;
    Report(LearnerState::kJoining);
  }
  const SyncTime now = port_->Now();
  if (Elapsed(last_join_beat_, now, 20)) {
    DL_RETURN_IF_ERROR(Heartbeat(LearnerState::kJoining));
    last_join_beat_ = now;
  }
  if (Elapsed(last_hello_, now, 50)) {
    for (int s = 0; s < shards_.shards(); s++)
      if (!welcomed_[s]) DL_RETURN_IF_ERROR(SendToDealer(s, Hello()));
    last_hello_ = now;
  }
  return Status::Ok();
}

bool LearnerCore::Joined() const {
  for (int s = 0; s < shards_.shards(); s++)
    if (!ShardJoined(s)) return false;
  return true;
}

bool LearnerCore::ShardJoined(int shard) const { return welcomed_[shard] && downlink_seen_[shard]; }

HelloMsg LearnerCore::Hello() const {
  HelloMsg hello;
  hello.role = PeerRole::kLearner;
  hello.tensor_table_digest = backend_.table().digest();
  hello.num_params = backend_.num_params();
  hello.num_fragments = (uint32_t)P_;
  hello.fragment_layout_digest = FragmentsDigest(frags_);
  hello.build = "dilocod learner";
  return hello;
}

Status LearnerCore::Start(bool join_from_snapshot) {
  started_ = true;
  if (join_from_snapshot) {
    // Train only once the snapshot is in; Globals are buffered meanwhile.
    resync_reason_ = "join";
    Report(LearnerState::kResyncing);
    return RequestSnapshotIfDue();
  }
  // Version 0 of every fragment is init_params; Globals buffered so far apply now.
  std::map<uint64_t, uint64_t> zero;
  for (int p = 0; p < P_; p++) zero[(uint64_t)p] = 0;
  return ApplyBufferedGlobals(zero);
}

// A learner rejoining a lock-step fleet (diloco, streaming) from a snapshot starts at the fleet's
// cadence step (the snapshot's, RoundBook::CadenceStep: the step before the earliest round not
// merged yet), so its fragments fire into the rounds still to merge. Resuming at its own old step
// put it out of step with every round, and the lock-step rounds then waited on each other (found
// by `dilococtl dst --seed 444`). A snapshot without a cadence (no merge since the syncer
// started) keeps the own step.
//
// A decoupled learner keeps its own progress but takes the fleet's phase: its step moves forward
// (at most H - 1 steps, not trained) to the next step in step with the cadence modulo H, so its
// fragments fire when the fleet's do. Rejoining half a cycle out of phase, each of its deltas
// came H/2 steps after the fleet's: every round either waited for it (bunching the merges into
// gaps of twice the merge interval: uptime 0.918 under chaos.sh's learner kills) or merged
// without it.
long LearnerCore::StartStep() const {
  if (!o_.join_from_snapshot || cadence_step_ == 0) return o_.start_step;
  if (block_after_ != std::numeric_limits<long>::max()) return cadence_step_;  // at most train.steps
  const long ahead = ((cadence_step_ - o_.start_step) % H_ + H_) % H_;
  return std::min<long>(o_.start_step + ahead, tc_.steps);
}

Status LearnerCore::BeginTraining() {
  if (training_) return Status::Ok();
  training_ = true;
  step_ = StartStep();  // its first heartbeat as a trainer says where it starts
  res_.steps = step_;
  DL_RETURN_IF_ERROR(Heartbeat(StateNow()));
  last_beat_ = port_->Now();
  Report(StateNow());
  train_start_ = port_->Now();
  res_.train_start_unix_ms = port_->UnixMs();
  return Status::Ok();
}

// ---- The end ----

// Flush, so no work is lost at the end: the work of every fragment with no delta in flight goes
// out at once, and on every timer after (the work left when a delta in flight was merged or
// lost); the learner stays until the syncer has merged it all (within flush_timeout_ms), and
// says it is stopping (StateNow), so rounds stop waiting for it. Sending only once every delta
// in flight was merged, two learners at their end each waited for a round that needed the
// other's remaining work, or for a learner with nothing more to send (a quorum of 3 at the end of
// a decoupled run: the 60 s end stall of `dilococtl dst --seed 139`).
Status LearnerCore::BeginFlush() {
  flushing_ = true;
  flush_deadline_ = port_->Now() + std::chrono::milliseconds(o_.flush_timeout_ms);
  return SendRemaining();
}

bool LearnerCore::Flushed() const {
  return (!ledger_.AnyInFlight() && !clone_.awaiting_snapshot() && lost_deltas_.empty()) ||
         port_->Now() > flush_deadline_;
}

Status LearnerCore::SendRemaining() {
  if (!clone_.awaiting_snapshot())
    for (int p = 0; p < P_; p++)
      if (!ledger_[p].in_flight && ledger_[p].c_steps > 0) DL_RETURN_IF_ERROR(SendDelta(p, step_));
  return Status::Ok();
}

Status LearnerCore::SendLastWord() {
  if (res_.crashed) return Status::Ok();
  last_word_ = res_.stopped ? LearnerState::kStopping : LearnerState::kFinished;
  last_word_deadline_ = port_->Now() + std::chrono::milliseconds(sc_.heartbeat_timeout_ms);
  DL_RETURN_IF_ERROR(RepeatLastWord());
  // Every message from here on is a copy of the last word: an ack of any of them will do (one
  // that waited for the latest copy chased it on a link slower than the repeats: dst --seed 1963).
  last_word_seq_ = seq_;
  return Status::Ok();
}

Status LearnerCore::RepeatLastWord() {
  last_beat_ = port_->Now();
  return Heartbeat(*last_word_);
}

bool LearnerCore::LastWordHeard() const {
  return res_.crashed || !last_word_ ||
         std::all_of(last_word_heard_.begin(), last_word_heard_.end(), [](bool b) { return b; }) ||
         port_->Now() > last_word_deadline_;
}

// The end: crashed, the work lost with it; else the last word's state.
Status LearnerCore::Finish() {
  if (flushing_)
    for (int p = 0; p < P_; p++)
      if (ledger_[p].in_flight)
        port_->Note("fragment " + std::to_string(p) + "'s last delta was not merged within " +
                    std::to_string(o_.flush_timeout_ms) + " ms of the end");
  if (res_.crashed) {
    Report(LearnerState::kFailed);
    res_ = CrashedResult();
    return Status::Ok();
  }
  if (!last_word_) DL_RETURN_IF_ERROR(SendLastWord());
  Report(*last_word_);
  res_.end_unix_ms = port_->UnixMs();
  return Status::Ok();
}

LearnerResult LearnerCore::CrashedResult() const {
  LearnerResult r = res_;
  r.crashed = true;
  r.crashed_unix_ms = port_->UnixMs();
  r.unsent_tokens_at_crash.clear();
  for (int p = 0; p < P_; p++) {
    const LedgerFragment& f = ledger_[p];
    r.unsent_tokens_at_crash.push_back(f.c_tokens - (f.in_flight ? std::min(f.c_tokens, f.c_tokens_at_send) : 0));
  }
  return r;
}

void LearnerCore::MarkCrashed() {
  EndWait();
  res_.crashed = true;
}

void LearnerCore::MarkStopped() {
  EndWait();
  res_.stopped = true;
}

// ---- Sending ----

Status LearnerCore::Build(uint64_t* sq, const MessageBody& body, std::shared_ptr<std::vector<uint8_t>> payload,
                          net::Message* out) {
  EnvelopeHeader h;
  h.job_id = o_.job_id;
  h.sender = me_;
  h.seq = ++*sq;
  h.incarnation = incarnation_;
  h.sent_unix_ms = (uint64_t)port_->UnixMs();
  OutgoingMessage om;
  std::span<const uint8_t> bytes;
  if (payload) bytes = {payload->data(), payload->size()};
  // The payload CRC is computed as the chunks go out (PubChannel), not before.
  DL_RETURN_IF_ERROR(BuildMessage(h, body, bytes, &om, BuildOptions{.defer_payload_crc = true}));
  res_.bytes_up += om.wire_bytes();
  *out = net::ToMessage(std::move(om), payload);
  return Status::Ok();
}

Status LearnerCore::Send(int shard, const MessageBody& body, std::shared_ptr<std::vector<uint8_t>> payload) {
  net::Message m;
  DL_RETURN_IF_ERROR(Build(&seq_[shard], body, std::move(payload), &m));
  port_->SendUplink(shard, std::move(m));
  return Status::Ok();
}

Status LearnerCore::SendToDealer(int shard, const MessageBody& body) {
  net::Message m;
  DL_RETURN_IF_ERROR(Build(&dealer_seq_[shard], body, nullptr, &m));
  port_->SendDealer(shard, std::move(m));
  return Status::Ok();
}

Status LearnerCore::Heartbeat(LearnerState state) {
  HeartbeatMsg hb;
  hb.state = state;
  hb.step = step_;
  hb.tokens = res_.tokens;
  hb.loss = last_loss_;
  hb.tokens_per_s = (float)NominalTokensPerS((double)res_.tokens, res_.provisioned_s);
  hb.step_time_ms = (float)step_ms_ema_;
  hb.interval_ms = o_.heartbeat_interval_ms;
  for (int p = 0; p < P_; p++) {
    const LedgerFragment& f = ledger_[p];
    hb.fragments.push_back({(uint32_t)p, f.base_version, f.c_steps, f.c_tokens, f.in_flight});
  }
  port_->OnHeartbeat(hb);
  for (int s = 0; s < shards_.shards(); s++) DL_RETURN_IF_ERROR(Send(s, hb, nullptr));  // each shard's liveness
  return Status::Ok();
}

Status LearnerCore::BeatIfDue() {
  const SyncTime now = port_->Now();
  if (!Elapsed(last_beat_, now, o_.heartbeat_interval_ms)) return Status::Ok();
  last_beat_ = now;
  return Heartbeat(StateNow());
}

Status LearnerCore::SendDelta(int p, long at_step) {
  const LedgerFragment& f = ledger_[p];
  const Fragment& frag = frags_[p];
  auto payload = std::make_shared<std::vector<uint8_t>>();
  std::vector<uint64_t> tensor_bytes;
  bool encoded = false;
  DL_RETURN_IF_ERROR(EncodeUplink(p, payload.get(), &tensor_bytes, &encoded));
  if (!encoded)
    return Status::Error(me_ + ": the delta of fragment " + std::to_string(p) + " at step " +
                         std::to_string(at_step) + " is NaN or Inf (or overflows the codec); try a lower train.lr");
  DeltaMsg d;
  d.fragment = (uint32_t)p;
  d.base_version = f.base_version;
  d.c_steps = f.c_steps;
  d.c_tokens = f.c_tokens;
  d.learner_step = (uint64_t)at_step;
  d.payload = FragmentPayloadInfo(frag, up_codec_, tensor_bytes);
  const int owner = shards_.OwnerOf(p);
  DL_RETURN_IF_ERROR(Send(owner, d, payload));
  ledger_.OnSend(p, at_step, seq_[owner]);  // the delta's number on its shard's main stream
  res_.deltas_sent++;
  progress_.last_fragment_sent = p;
  return Status::Ok();
}

// Δ = base − θ (θ at send is kept where the parameters live), encoded with error feedback:
// dense codecs with the plain residual by the backend; sparse codecs (top-k, topk_chunked) and the
// decaying accumulator (sync.codec.feedback: accumulate) on the host from the backend's exact fp32
// Δ + residual, whose residual is then zero (fp32 loses nothing), the host one kept in
// up_topk_ef_. false when a value is not finite. (topk_chunked's records have a device encoder,
// cuda::sparse_encode, byte-identical to the host's; using it here needs this residual on the
// device first, so a CUDA learner still ships Δ to the host in fp32.)
Status LearnerCore::EncodeUplink(int p, std::vector<uint8_t>* payload, std::vector<uint64_t>* tensor_bytes,
                                 bool* encoded) {
  if (!IsSparseCodec(up_codec_) && up_topk_ef_.feedback().rule == FeedbackRule::kResidual)
    return outer_.EncodeDelta(p, SyncCodecOf(up_codec_.kind), up_codec_.block_size, payload, tensor_bytes, encoded)
        .WithContext(me_);
  DL_RETURN_IF_ERROR(
      outer_.EncodeDelta(p, SyncCodec::kFp32, up_codec_.block_size, payload, tensor_bytes, encoded).WithContext(me_));
  if (!*encoded) return Status::Ok();
  up_values_.resize(payload->size() / sizeof(float));
  std::memcpy(up_values_.data(), payload->data(), up_values_.size() * sizeof(float));
  *encoded = up_topk_ef_.Encode((uint32_t)p, up_values_, FragmentNumels(frags_[p]), payload, tensor_bytes).ok();
  return Status::Ok();
}

// Drops what error feedback carries for fragment p (its delta was dropped, lost or resynced).
void LearnerCore::ResetResidual(int p) {
  if (Status st = outer_.ResetResidual(p); !st.ok() && outer_error_.ok()) outer_error_ = st.WithContext(me_);
  up_topk_ef_.Reset((uint32_t)p);
}

// The fragments whose cadence fires after step done. No deltas while a snapshot is awaited: the
// bases are about to change (the firing is skipped, and blocks a lock-step learner: the ledger).
Status LearnerCore::SendFiringDeltas(long done) {
  for (int p = 0; p < P_; p++) {
    if (!Fires(p, done, H_, P_) || ledger_[p].in_flight) continue;
    if (clone_.awaiting_snapshot()) ledger_.OnSkipped(p, done);
    else DL_RETURN_IF_ERROR(SendDelta(p, done));
  }
  return Status::Ok();
}

// Lost deltas go again with all the work since their base (not while a snapshot is awaited:
// the bases are about to change, and the snapshot settles what is in flight).
Status LearnerCore::ResendLost() {
  if (clone_.awaiting_snapshot()) return Status::Ok();
  std::vector<int> lost;
  lost.swap(lost_deltas_);
  for (int p : lost)
    if (!ledger_[p].in_flight && ledger_[p].c_steps > 0) DL_RETURN_IF_ERROR(SendDelta(p, step_));
  return Status::Ok();
}

Status LearnerCore::OnTimer() {
  if (last_word_) {  // said: only the last word again, until it is heard
    if (!LastWordHeard() && Elapsed(last_beat_, port_->Now(), o_.heartbeat_interval_ms)) return RepeatLastWord();
    return Status::Ok();
  }
  if (flushing_) DL_RETURN_IF_ERROR(SendRemaining());  // what a merged or lost delta left
  if (started_) DL_RETURN_IF_ERROR(BeatIfDue());
  DL_RETURN_IF_ERROR(RequestSnapshotIfDue());
  return ResendLost();
}

// ---- Receiving ----

// A downlink message (m, its frames in r): a Global or a SyncerStatus.
Status LearnerCore::OnDownlink(net::Received& r, const ParsedMessage& m) {
  const int shard = ShardOf(m);
  if (shard < 0) return Status::Ok();  // the checks let only the shards' names through
  downlink_seen_[shard] = true;
  res_.bytes_down += m.wire_bytes;
  if (const GlobalMsg* g = m.get<GlobalMsg>()) {
    if (!shards_.Owns(shard, g->fragment)) {
      port_->Note("ignoring a Global of fragment " + std::to_string(g->fragment) + " from " + m.header.sender +
                  ", which does not merge it; do the syncers run the job's sync.syncers?");
      return Status::Ok();
    }
    DL_RETURN_IF_ERROR(HandleGlobal(r, m));
  }
  if (const SyncerStatusMsg* st = m.get<SyncerStatusMsg>()) HandleStatus(shard, *st);
  return RequestSnapshotIfDue();
}

// A Global from the downlink: applied when it is the next version of its fragment, buffered while
// a snapshot is awaited, a gap otherwise.
Status LearnerCore::HandleGlobal(net::Received& r, const ParsedMessage& m) {
  const GlobalMsg* g = m.get<GlobalMsg>();
  if ((int)g->fragment >= P_) return Status::Ok();
  net::VersionedUpdate u;
  u.key = g->fragment;
  u.version = g->version;
  u.full = false;  // the syncer sends updates only; a full Global would be applied as a gap
  u.message = std::move(r.message);
  std::vector<net::VersionedUpdate> apply;
  const net::CloneVerdict v = clone_.OnUpdate(std::move(u), &apply);
  if (v == net::CloneVerdict::kApply) return ApplyGlobal(m);
  if (v == net::CloneVerdict::kGap) {
    res_.gaps++;
    NeedSnapshot("gap in the global stream of fragment " + std::to_string(g->fragment));
  }
  return Status::Ok();
}

// Applies one Global that is the next version of its fragment (the CloneClient said so).
Status LearnerCore::ApplyGlobal(const ParsedMessage& m) {
  const GlobalMsg* g = m.get<GlobalMsg>();
  const int p = (int)g->fragment;
  std::vector<float>& base = bases_[p];
  const Fragment& frag = frags_[p];
  // An update that does not decode, or is not finite, would poison every parameter it touches:
  // refuse it and resync from a snapshot.
  if (Status decoded = DecodeFiniteUpdate(frag, *g, m); !decoded.ok()) {
    res_.globals_refused++;
    port_->Note("refusing Global " + std::to_string(g->version) + " of fragment " + std::to_string(p) + " (" +
                decoded.message() + "); resyncing");
    NeedSnapshot("refused global of fragment " + std::to_string(p));
    return Status::Ok();
  }
  const bool included_self = std::any_of(g->contributors.begin(), g->contributors.end(),
                                         [&](const Contributor& c) { return c.learner == me_; });
  ApplyUpdate(scratch_.data(), frag.numel, base.data());
  // A dense update is applied from its encoded bytes (on a GPU only those cross); a top-k one,
  // which the backend does not decode, from its decoded values (scratch_) as an fp32 payload.
  const bool topk = g->payload.topk_fraction != 0 || g->payload.codec == CodecKind::kTopkChunked;
  if (!topk) ContiguousPayload(m, &contiguous_);
  const uint8_t* update = topk ? reinterpret_cast<const uint8_t*>(scratch_.data()) : contiguous_.data();
  const size_t update_bytes = topk ? frag.numel * sizeof(float) : contiguous_.size();
  bool applied = false;
  DL_RETURN_IF_ERROR(outer_
                         .ApplyUpdate(p, update, update_bytes,
                                      topk ? SyncCodec::kFp32 : SyncCodecOf(g->payload.codec), g->payload.block_size,
                                      &applied)
                         .WithContext(me_));
  if (!applied)
    return Status::Error(me_ + ": the backend refused the Global of fragment " + std::to_string(p) +
                         " that the wire codec accepted; this is a bug");
  if (Crc32c(base.data(), frag.numel * sizeof(float)) != g->fragment_crc32c) {
    // Our copy of Θ_p is not the syncer's: fetch it (the local θ_p, and a delta in flight,
    // stay until then: a lock-step learner keeps waiting for the snapshot).
    ledger_.OnCrcMismatch(p, g->version);
    res_.crc_mismatches++;
    NeedSnapshot("crc mismatch on fragment " + std::to_string(p) + " version " + std::to_string(g->version));
    return Status::Ok();
  }
  const GlobalFold fold = ledger_.OnGlobal(p, g->version, included_self);
  DL_RETURN_IF_ERROR(outer_
                         .Fold(p, FoldModeOf(sc_.fold), sc_.alpha,
                               fold.ours_included ? FoldIncluded::kAtSend : FoldIncluded::kPreviousBase)
                         .WithContext(me_));
  if (fold.shift_at_send) DL_RETURN_IF_ERROR(outer_.ShiftAtSend(p).WithContext(me_));
  // mix keeps α of the local progress: the rest is thrown away.
  const double kept = sc_.fold == FoldRule::kMix ? sc_.alpha : 0;
  if (fold.replaced_tokens > 0 && kept < 1)
    res_.discarded.push_back({port_->UnixMs(), p, (double)fold.replaced_tokens * (1 - kept)});
  MarkChanged(p);
  res_.globals_applied++;
  progress_.last_fragment_folded = p;
  return Status::Ok();
}

// A Global's update decoded into scratch_; an error when it does not decode or is not finite.
Status LearnerCore::DecodeFiniteUpdate(const Fragment& frag, const GlobalMsg& g, const ParsedMessage& m) {
  Status decoded = DecodeFragmentPayload(frag, g.payload, m, &scratch_);
  if (decoded.ok() && !std::all_of(scratch_.begin(), scratch_.end(), [](float x) { return std::isfinite(x); }))
    decoded = Status::Error("its update is not finite");
  return decoded;
}

// A SyncerStatus (fragment_ledger.h, Status and Drop):
//  - a drop notice for our in-flight delta: no Global will include it, so stop waiting; the next
//    delta of that fragment carries all the progress since its base (the error-feedback
//    residual of the dropped one goes too). A base from the future: the syncer went back: resync;
//  - a version that differs from our base: we missed a Global (or the syncer went back): resync;
//  - an in-flight delta the syncer has heard past and does not hold: lost; sent again at once
//    (lost_deltas_), so a lock-step round is not left waiting for it.
void LearnerCore::HandleStatus(int shard, const SyncerStatusMsg& st) {
  const LearnerAck* ack = AckOf(st);
  if (last_word_ && ack && ack->heard_seq >= last_word_seq_[shard]) last_word_heard_[shard] = true;
  HandleDropNotices(shard, st.recent_drops);
  bool others_progress = false;
  for (size_t i = 0; i < st.live_steps.size() && i < st.live_learners.size(); i++) {
    if (st.live_learners[i] == me_ || st.live_steps[i] == 0) continue;
    uint64_t& known = known_steps_[st.live_learners[i]];
    others_progress |= st.live_steps[i] > known;
    known = st.live_steps[i];
  }
  // Flushing, the wait ends after flush_timeout_ms without progress, not of waiting: a lock-step
  // round at the end waits for a slow learner still at work (dilococtl dst --seed 313: learners
  // gave up 60 s after their end, before the last merge, and never applied it).
  if (flushing_ && others_progress)
    flush_deadline_ = port_->Now() + std::chrono::milliseconds(o_.flush_timeout_ms);
  if (clone_.awaiting_snapshot()) return;  // Globals are buffered: the bases are not current
  CheckVersionsAndAcks(shard, st);
}

void LearnerCore::HandleDropNotices(int shard, const std::vector<DroppedDelta>& drops) {
  for (const DroppedDelta& d : drops) {
    if (d.learner != me_ || !shards_.Owns(shard, d.fragment)) continue;
    if (!ledger_.OnDrop((int)d.fragment, d.base_version, d.reason == kAlreadyMerged)) continue;
    ResetResidual((int)d.fragment);
    res_.deltas_dropped++;
    port_->Note("the syncer dropped our delta of fragment " + std::to_string(d.fragment) + " (base " +
                std::to_string(d.base_version) + "): " + d.reason);
    if (d.reason == ToString(StalenessVerdict::kFromTheFuture))
      NeedSnapshot("the syncer is behind our base of fragment " + std::to_string(d.fragment));
  }
}

// This incarnation's ack in a status (nullptr: none).
const LearnerAck* LearnerCore::AckOf(const SyncerStatusMsg& st) const {
  for (const LearnerAck& a : st.acks)
    if (a.learner == me_ && a.incarnation == incarnation_) return &a;
  return nullptr;
}

void LearnerCore::CheckVersionsAndAcks(int shard, const SyncerStatusMsg& st) {
  const StatusVerdict v = ledger_.OnStatus(st.versions, AckOf(st), shards_.FragmentsOf(shard));
  if (!v.missed.empty()) {
    res_.globals_missed += v.missed.size();
    const int p = v.missed.front();
    NeedSnapshot("fragment " + std::to_string(p) + " is at version " + std::to_string(st.versions[p]) +
                 " at the syncer, ours is " + std::to_string(ledger_[p].base_version));
  }
  for (int p : v.lost) {
    ResetResidual(p);
    res_.deltas_lost++;
    lost_deltas_.push_back(p);
    port_->Note("our delta of fragment " + std::to_string(p) + " (base " + std::to_string(ledger_[p].sent_base) +
                ") never reached the syncer; sending again");
  }
}

// A DEALER message: a Welcome or a part of the snapshot asked for.
Status LearnerCore::OnDealer(ParsedMessage& m) {
  const int shard = ShardOf(m);
  if (shard < 0) return Status::Ok();
  res_.bytes_down += m.wire_bytes;
  if (const WelcomeMsg* w = m.get<WelcomeMsg>()) {
    if (w->result == JoinResult::kAccepted) {
      welcomed_[shard] = true;
    } else if (w->result != JoinResult::kBusy) {
      const std::string at = shard < (int)o_.syncers.size() ? " (at " + o_.syncers[shard].snapshot + ")" : "";
      return Status::Error(me_ + ": " + m.header.sender + at + " refused this learner: " + w->reason);
    }
    return Status::Ok();
  }
  if (m.get<SnapshotMsg>() && request_outstanding_) DL_RETURN_IF_ERROR(AddSnapshotPart(shard, m));
  return RequestSnapshotIfDue();
}

// A part of the snapshot asked for, from the shard that merges its fragment; the snapshot
// installs once every shard's part is whole.
Status LearnerCore::AddSnapshotPart(int shard, ParsedMessage& m) {
  const SnapshotMsg& sm = *m.get<SnapshotMsg>();
  ShardSnapshot& ss = snapshot_[shard];
  if (sm.request_id != ss.request_id || !ss.assembler) return Status::Ok();  // an older answer
  if (!shards_.Owns(shard, sm.fragment)) {
    port_->Note("dropping a snapshot part of fragment " + std::to_string(sm.fragment) + " from " + m.header.sender +
                ", which does not merge it");
    return Status::Ok();
  }
  if (Status st = ss.assembler->Add(std::move(m)); !st.ok()) {
    port_->Note("dropping a snapshot part (" + st.message() + "); will ask again");
    return Status::Ok();
  }
  ss.heard_at = port_->Now();  // progress: the retry timer starts again
  if (!ss.assembler->complete()) return Status::Ok();
  ss.parts = ss.assembler->Take();
  ss.assembler.reset();
  for (const ShardSnapshot& other : snapshot_)
    if (other.assembler) return Status::Ok();  // another shard's part is still on its way
  return InstallSnapshot();
}

// ---- Snapshots ----

void LearnerCore::NeedSnapshot(const std::string& why) {
  clone_.BeginSnapshot();
  resync_reason_ = why;
}

// Once started, while a snapshot is awaited: one request outstanding, each shard asked again
// after snapshot_retry_ms without a part of its answer (not from the request: a large model's
// snapshot takes longer than that to arrive, and asking again threw away the parts in, so it
// never completed).
Status LearnerCore::RequestSnapshotIfDue() {
  if (!started_ || !clone_.awaiting_snapshot()) return Status::Ok();
  if (!request_outstanding_) {
    request_outstanding_ = true;
    snapshot_.clear();
    snapshot_.resize(shards_.shards());
    for (int s = 0; s < shards_.shards(); s++) DL_RETURN_IF_ERROR(RequestSnapshot(s));
    return Status::Ok();
  }
  const SyncTime now = port_->Now();
  for (int s = 0; s < shards_.shards(); s++)
    if (snapshot_[s].assembler && now - snapshot_[s].heard_at > std::chrono::milliseconds(o_.snapshot_retry_ms))
      DL_RETURN_IF_ERROR(RequestSnapshot(s));
  return Status::Ok();
}

// Asks shard for its fragments (an empty list: all it merges).
Status LearnerCore::RequestSnapshot(int shard) {
  SnapshotRequestMsg rq;
  rq.request_id = ++request_id_;
  rq.reason = resync_reason_;
  ShardSnapshot& ss = snapshot_[shard];
  ss.request_id = request_id_;
  ss.assembler = std::make_unique<SnapshotAssembler>(request_id_, backend_.num_params() * sizeof(float) + (1 << 20));
  ss.parts.clear();
  ss.heard_at = port_->Now();
  return SendToDealer(shard, rq);
}

// A complete snapshot (every shard's part): install the fragments that differ, then the
// buffered newer Globals. Each fragment's version is its own shard's cut; the fleet's cadence
// is the earliest any shard knows (a shard that knows none says 0).
Status LearnerCore::InstallSnapshot() {
  std::map<uint64_t, uint64_t> versions;
  uint64_t cadence = 0;
  for (int s = 0; s < shards_.shards(); s++) {
    for (ParsedMessage& part : snapshot_[s].parts) DL_RETURN_IF_ERROR(InstallSnapshotPart(part));
    const SnapshotMsg& first = *snapshot_[s].parts.front().get<SnapshotMsg>();
    for (const uint32_t p : shards_.FragmentsOf(s)) versions[p] = first.versions[p];
    if (first.cadence_step > 0) cadence = cadence == 0 ? first.cadence_step : std::min(cadence, first.cadence_step);
  }
  snapshot_.clear();
  cadence_step_ = (long)std::min<uint64_t>(cadence, (uint64_t)tc_.steps);
  res_.snapshots_installed++;
  request_outstanding_ = false;
  return ApplyBufferedGlobals(versions);
}

// One fragment of a snapshot, checked; installed when it differs from what this learner holds.
Status LearnerCore::InstallSnapshotPart(ParsedMessage& part) {
  const SnapshotMsg& sm = *part.get<SnapshotMsg>();
  if ((int)sm.fragment >= P_ || sm.versions.size() != (size_t)P_)
    return Status::Error(me_ + ": snapshot has " + std::to_string(sm.versions.size()) + " fragments, this learner " +
                         std::to_string(P_) + "; are the syncer and the learner running the same config?");
  const Fragment& frag = frags_[sm.fragment];
  DL_RETURN_IF_ERROR(DecodeFragmentPayload(frag, sm.payload, part, &scratch_)
                         .WithContext(me_ + ": snapshot part for fragment " + std::to_string(sm.fragment)));
  if (Crc32c(scratch_.data(), frag.numel * sizeof(float)) != sm.fragment_crc32c)
    return Status::Error(me_ + ": snapshot fragment " + std::to_string(sm.fragment) + " fails its CRC32C");
  const int p = (int)sm.fragment;
  if (!std::all_of(scratch_.begin(), scratch_.end(), [](float x) { return std::isfinite(x); }))
    return Status::Error(me_ + ": snapshot fragment " + std::to_string(p) + " is not finite");
  const bool same = !ledger_[p].bad && ledger_[p].base_version == sm.version &&
                    Crc32c(bases_[p].data(), frag.numel * sizeof(float)) == sm.fragment_crc32c;
  if (!same) {
    bases_[p] = scratch_;
    DL_RETURN_IF_ERROR(outer_.Install(p, bases_[p].data()).WithContext(me_));
    up_topk_ef_.Reset((uint32_t)p);
    MarkChanged(p);
    ledger_.OnSnapshot(p, sm.version);
  }
  return Status::Ok();
}

// The state is now at versions (a snapshot's cut, or version 0): the buffered Globals newer than
// that apply, in order.
Status LearnerCore::ApplyBufferedGlobals(const std::map<uint64_t, uint64_t>& versions) {
  std::vector<net::VersionedUpdate> apply;
  clone_.OnSnapshot(versions, &apply);
  if (!clone_.awaiting_snapshot()) ledger_.OnResynced();
  ParsedMessage m;
  for (auto& u : apply) {
    const auto spans = u.message.spans();
    DL_RETURN_IF_ERROR(ParseEnvelope(spans, expect_, &m).WithContext(me_ + ": a buffered global"));
    DL_RETURN_IF_ERROR(ApplyGlobal(m));
  }
  return Status::Ok();
}

// ---- Steps ----

Status LearnerCore::BeforeStep(long at, StepControl* control) {
  step_ = at;
  res_.steps = at;
  DL_RETURN_IF_ERROR(outer_error_);
  DL_RETURN_IF_ERROR(BeginTraining());
  if (TimeLimitReached()) {
    EndWait();
    control->stop = true;
    return Status::Ok();
  }
  DL_RETURN_IF_ERROR(ResendLost());
  // Lock-step modes: wait for fragments in flight too long, as long as the syncer is there (a
  // lost delta or Global is found through its status and sent or fetched again). The runtime
  // waits and calls again; the ranges changed meanwhile go with that call.
  if (Blocked()) {
    if (!waiting_) {
      waiting_ = true;
      wait_start_ = port_->Now();
      wait_start_unix_ms_ = port_->UnixMs();
    }
    return Status::Ok();
  }
  EndWait();
  DL_RETURN_IF_ERROR(BeatIfDue());
  control->changed.insert(control->changed.end(), changed_.begin(), changed_.end());
  changed_.clear();
  // The fleet's progress: the mean step of this learner and the others it has heard of.
  if (sc_.lr_clock == LrClock::kGlobal && !known_steps_.empty()) {
    double sum = (double)at;
    for (const auto& [name, step] : known_steps_) sum += (double)step;
    control->lr_step = std::lround(sum / (double)(known_steps_.size() + 1));
  }
  return Status::Ok();
}

int LearnerCore::BlockingFragment() const {
  for (int p = 0; p < P_; p++)
    if (ledger_.Blocks(p, step_, block_after_)) return p;
  return -1;
}

void LearnerCore::EndWait() {
  if (!waiting_) return;
  waiting_ = false;
  res_.wait_s += Seconds(port_->Now() - wait_start_);
  res_.blocked_unix_ms.push_back({wait_start_unix_ms_, port_->UnixMs()});
}

// train.time_limit_s: that many seconds since training started (never when 0): since the first
// incarnation's start when the learner was restarted (LearnerOptions::time_budget_start_unix_ms).
bool LearnerCore::TimeLimitReached() const {
  if (tc_.time_limit_s <= 0) return false;
  if (o_.time_budget_start_unix_ms > 0)
    return (double)(port_->UnixMs() - o_.time_budget_start_unix_ms) / 1e3 >= tc_.time_limit_s;
  return Seconds(port_->Now() - train_start_) >= tc_.time_limit_s;
}

Status LearnerCore::AfterStep(const StepResult& r, double step_s, double provisioned_s) {
  DL_RETURN_IF_ERROR(outer_error_);
  const StepStats& st = r.stats;
  if (!st.applied)
    return Status::Error(me_ + ": training diverged at step " + std::to_string(step_) +
                         " (loss or gradient NaN/Inf). Try a lower train.lr or sync.outer.lr");
  res_.provisioned_s += provisioned_s;
  step_ms_ema_ = step_ms_ema_ == 0 ? step_s * 1e3 : step_ms_ema_ + 0.2 * (step_s * 1e3 - step_ms_ema_);
  res_.train_s += step_s;
  res_.tokens += tokens_per_step_;
  last_loss_ = (float)st.loss;
  recent_sum_ += st.loss;
  recent_n_++;
  ledger_.OnStep((uint64_t)tokens_per_step_);
  const long done = r.step + 1;
  step_ = done;
  res_.steps = done;
  DL_RETURN_IF_ERROR(SendFiringDeltas(done));
  Report(StateNow());
  DL_RETURN_IF_ERROR(SaveMomentsIfDue(done));
  if (done % tc_.log_every == 0 || done == tc_.steps) LogStep(r, done, step_s);
  return Status::Ok();
}

// The learner's own moments, for a restart (its parameters then come from a snapshot).
Status LearnerCore::SaveMomentsIfDue(long done) {
  if (tc_.checkpoint_every > 0 && done % tc_.checkpoint_every == 0)
    DL_RETURN_IF_ERROR(port_->SaveMoments(done).WithContext(me_ + ": saving its moments"));
  return Status::Ok();
}

// Every log_every steps: the mean loss since the last time, and a metrics line.
void LearnerCore::LogStep(const StepResult& r, long done, double step_s) {
  res_.final_train_loss = recent_sum_ / recent_n_;
  recent_sum_ = 0;
  recent_n_ = 0;
  port_->WriteMetrics({{"learner", o_.index},
                       {"step", done},
                       {"loss", r.stats.loss},
                       {"lr", r.lr},
                       {"grad_norm", r.stats.grad_norm},
                       {"tokens", res_.tokens},
                       {"step_ms", step_s * 1e3},
                       {"tok_per_s", res_.tokens / res_.train_s},
                       {"time_ms", port_->UnixMs()},
                       {"bytes_up", res_.bytes_up},
                       {"bytes_down", res_.bytes_down},
                       {"versions", BaseVersions()}});
}

// ---- State ----

// The parameters of fragment p changed on rank 0: the ring copies them before the next step.
void LearnerCore::MarkChanged(int p) {
  if (outer_.SpreadsParameters()) return;  // every rank already holds the new θ_p
  for (const FragmentRange& r : frags_[p].ranges) changed_.push_back({r.offset, r.numel});
}

void LearnerCore::Report(LearnerState state) {
  // What a restart continues from (a few times a second; a step is cheap to lose).
  const SyncTime now = port_->Now();
  if (Elapsed(last_step_save_, now, 250)) {
    last_step_save_ = now;
    port_->SaveStep(step_);
  }
  progress_.state = state;
  progress_ = progress();
  if (o_.on_progress) o_.on_progress(progress_);
}

// The counters as they are now; the state as last reported.
LearnerProgress LearnerCore::progress() const {
  LearnerProgress p = progress_;
  p.step = step_;
  p.tokens = res_.tokens;
  p.loss = last_loss_;
  p.tokens_per_s = res_.train_s > 0 ? res_.tokens / res_.train_s : 0;
  p.base_versions = BaseVersions();
  p.deltas_sent = res_.deltas_sent;
  p.globals_applied = res_.globals_applied;
  p.snapshots_installed = res_.snapshots_installed;
  return p;
}

// Flushing at its end, a learner is stopping: the syncer's rounds stop waiting for it (it may
// have nothing more for a fragment), while its remaining deltas are still merged.
LearnerState LearnerCore::StateNow() const {
  if (last_word_) return *last_word_;
  if (clone_.awaiting_snapshot()) return LearnerState::kResyncing;
  return flushing_ ? LearnerState::kStopping : LearnerState::kTraining;
}

// Per fragment: the version of the global it last folded.
std::vector<uint64_t> LearnerCore::BaseVersions() const {
  std::vector<uint64_t> v;
  for (int p = 0; p < P_; p++) v.push_back(ledger_[p].base_version);
  return v;
}

// Never happened, or at least ms ago.
bool LearnerCore::Elapsed(const std::optional<SyncTime>& since, SyncTime now, double ms) {
  return !since || now - *since >= std::chrono::duration<double, std::milli>(ms);
}

}  // namespace diloco
