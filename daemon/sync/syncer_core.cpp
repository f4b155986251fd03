#include "daemon/sync/syncer_core.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <limits>

#include "daemon/net/codec.h"
#include "daemon/net/wire_transport.h"
#include "daemon/sync/merge.h"
#include "daemon/sync/protocol.h"
#include "daemon/util/crc32c.h"

namespace diloco {

namespace {

double MsBetween(SyncTime from, SyncTime to) { return std::chrono::duration<double, std::milli>(to - from).count(); }

RoundBookOptions BookOptions(const SyncerOptions& o, size_t fragments, const ShardMap& shards) {
  RoundBookOptions bo = RoundBookOptionsFor(o.sync, (int)fragments);
  bo.count_limits = o.count_limits;
  if (shards.shards() > 1) bo.owned = shards.FragmentsOf(o.shard);
  return bo;
}

}  // namespace

SyncerCore::SyncerCore(const SyncerOptions& options, const std::vector<Fragment>& fragments, GlobalState* state,
                       const TensorTable& table, uint64_t incarnation, SyncerPort* port)
    : options_(options),
      sc_(options_.sync),
      fragments_(fragments),
      shards_(ShardMap::Of(fragments, sc_.syncers)),
      name_(shards_.NameOf(options_.shard)),
      state_(*state),
      port_(*port),
      M_(sc_.learners),
      P_(fragments.size()),
      dopt_(DecideOptionsFor(sc_)),
      down_codec_(DownlinkCodec(sc_)),
      table_digest_(table.digest()),
      num_params_(table.total_numel()),
      fragments_digest_(FragmentsDigest(fragments)),
      incarnation_(incarnation),
      book_(BookOptions(options_, fragments.size(), shards_), port->Now()),
      skipped_(fragments.size()),
      learners_(std::max(0, sc_.learners)),
      merger_(sc_),
      recycler_(P_ * ((size_t)std::max(1, sc_.learners) + 1)) {
  for (int i = 0; i < M_; i++) learners_[i].learner = i;
  last_message_ = last_status_ = port_.Now();
}

SyncerCore::~SyncerCore() = default;

void SyncerCore::RecallMerges(const std::vector<MergeEvent>& merges) {
  for (const MergeEvent& e : merges) {
    if (e.fragment < 0 || (size_t)e.fragment >= P_ || e.version > state_.fragments[e.fragment].version) continue;
    for (const MergeContributor& c : e.contributors) book_.RecallMerged(c.learner, (uint32_t)e.fragment, c.learner_step);
  }
}

// ---- Timers ----

Status SyncerCore::OnTimer(SyncTime* next_wake) {
  const SyncTime now = port_.Now();
  DL_RETURN_IF_ERROR(DecideAll(now, next_wake));
  return PublishStatusIfDue(now, next_wake);
}

Status SyncerCore::DecideAll(SyncTime now, SyncTime* next_wake) {
  for (size_t p = 0; p < P_; p++) {
    if (!book_.HasPending((uint32_t)p)) continue;
    const RoundState rs = book_.Round((uint32_t)p, now, timings_);
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
void SyncerCore::RecordQuorumTime(const RoundState& rs, int quorum) {
  std::vector<SyncTime> at;
  for (const LearnerPresence& lp : rs.learners)
    if (lp.contributed_at) at.push_back(*lp.contributed_at);
  if (at.empty()) return;
  std::sort(at.begin(), at.end());
  const size_t k = std::min(at.size(), (size_t)std::max(1, quorum)) - 1;
  timings_.quorum_ms.Add(MsBetween(at[0], at[k]));
}

Status SyncerCore::PublishStatusIfDue(SyncTime now, SyncTime* next_wake) {
  const auto interval = std::chrono::milliseconds(options_.status_interval_ms);
  if (status_due_ || !recent_drops_.empty() || (options_.status_interval_ms > 0 && now - last_status_ >= interval)) {
    DL_RETURN_IF_ERROR(PublishStatus());
    last_status_ = now;
    status_due_ = false;
  }
  if (options_.status_interval_ms > 0) *next_wake = std::min(*next_wake, last_status_ + interval);
  return Status::Ok();
}

// Flush: whatever is still pending is merged now (the run is over).
Status SyncerCore::Flush() {
  for (size_t p = 0; p < P_; p++)
    if (book_.HasPending((uint32_t)p)) DL_RETURN_IF_ERROR(Merge(p, "flush", 0));
  flushed_ = true;
  return Status::Ok();
}

// ---- Receiving ----

// One uplink message: liveness, heartbeats, deltas (the main stream or the liveness stream).
void SyncerCore::OnUplink(const net::Received& r, const ParsedMessage& m) {
  const SyncTime now = port_.Now();
  last_message_ = now;
  counters_.bytes_received += m.wire_bytes;
  const int learner = LearnerIndexOf(m.header.sender);
  if (learner < 0 || learner >= M_ || Impostor(learner, r.peer_key)) return;
  NoteHeard(learner, m, now);
  if (r.topic == options_.job_id) {
    book_.OnStreamSeq(learner, m.header.seq);
    // A gap in a learner's main stream may be a lost delta: the next status (now) tells it.
    if (r.seq.verdict == net::SeqVerdict::kGap) status_due_ = true;
  }
  if (const HeartbeatMsg* hb = m.get<HeartbeatMsg>()) {
    HandleHeartbeat(learner, *hb, now);
  } else if (const DeltaMsg* d = m.get<DeltaMsg>()) {
    book_.OnDeltaSeen(learner, d->fragment);
    HandleDelta(learner, m, now);
  }
}

void SyncerCore::NoteHeard(int learner, const ParsedMessage& m, SyncTime now) {
  LearnerStatusEntry& ls = learners_[learner];
  const int64_t unix_ms = port_.UnixMs();
  ls.heard = true;
  ls.last_heard_unix_ms = unix_ms;
  if (book_.OnHeard(learner, m.header.incarnation, now)) {
    // A new incarnation (a restart): waited for again until it says otherwise.
    ls = LearnerStatusEntry();
    ls.learner = learner;
    ls.heard = true;
    ls.last_heard_unix_ms = unix_ms;
    ls.incarnation = m.header.incarnation;
  }
}

void SyncerCore::HandleHeartbeat(int learner, const HeartbeatMsg& hb, SyncTime now) {
  LearnerStatusEntry& ls = learners_[learner];
  if (hb.step_time_ms > 0) timings_.step_ms.Add(hb.step_time_ms);
  // A learner's last word waits for the ack in a status: the next one goes out now.
  if (hb.state == LearnerState::kFinished || hb.state == LearnerState::kStopping) status_due_ = true;
  book_.OnHeartbeat(learner, hb, now);
  if (hb.step >= ls.step) {  // the liveness stream may deliver an older beat late
    ls.state = hb.state;
    ls.step = hb.step;
    ls.tokens = hb.tokens;
    ls.loss = hb.loss;
    ls.tokens_per_s = hb.tokens_per_s;
    ls.step_time_ms = hb.step_time_ms;
  }
}

void SyncerCore::HandleDelta(int learner, const ParsedMessage& m, SyncTime now) {
  const DeltaMsg& d = *m.get<DeltaMsg>();
  if (d.fragment >= P_ || !Owns(d.fragment)) {
    if (d.fragment < P_)
      port_.Note("dropped " + LearnerName(learner) + "'s delta of fragment " + std::to_string(d.fragment) +
                 ", which " + shards_.NameOf(shards_.OwnerOf(d.fragment)) +
                 " merges; does the learner run the job's sync.syncers?");
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
    book_.Reject(learner, d.fragment, d.base_version, "bad_payload", st.message());
  } else if (options_.reject_delta && options_.reject_delta(learner, d.fragment)) {
    book_.Reject(learner, d.fragment, d.base_version, "test_rejected", "rejected by the test hook");
  } else {
    book_.Admit(std::move(a), state_.fragments[d.fragment].version, now);
  }
  ApplyDrops();
}

// Deltas that will not be merged (the book's drops): logged with the next merge of their
// fragment, counted in the ledger, and (tell_learner) named in the next SyncerStatus so their
// learner stops waiting for them.
void SyncerCore::ApplyDrops() {
  for (DeltaDrop& d : book_.TakeDrops()) {
    if (d.tell_learner) recent_drops_.push_back({LearnerName(d.learner), d.fragment, d.base_version, d.why});
    LedgerEntry& le = LedgerFor(&state_, d.learner);
    if (d.rejected) {
      le.rejected++;
      state_.rejected_deltas++;
    } else {
      le.dropped++;
      state_.dropped_deltas++;
    }
    if (d.fragment < P_) skipped_[d.fragment].push_back({d.learner, std::move(d.why), std::move(d.detail), d.tokens});
  }
}

// A message naming learner i must come with the key of the site the job placed it on: a peer
// holding another site's key cannot speak for it (end it with a forged "finished", replace its
// pending delta, bump its incarnation).
bool SyncerCore::Impostor(int learner, const std::string& key) {
  const std::vector<std::string>& keys = options_.learner_keys;
  if (keys.empty() || key == keys[learner]) return false;
  if (++counters_.impostors <= 10 || counters_.impostors % 1000 == 0)
    port_.Note("dropped a message naming " + LearnerName(learner) + " sent with key " +
               (key.empty() ? std::string("(none)") : key) + ", not its site's (" +
               std::to_string(counters_.impostors) + " so far)");
  return true;
}

Status SyncerCore::OnRequest(const net::Received& r, const ParsedMessage& m) {
  const SyncTime now = port_.Now();
  last_message_ = now;
  counters_.bytes_received += m.wire_bytes;
  const int learner = LearnerIndexOf(m.header.sender);
  if (learner < 0 && m.header.sender == shards_.NameOf(0) && options_.shard != 0) return HandleHomeRequest(r, m);
  if (learner < 0 || learner >= M_ || Impostor(learner, r.peer_key)) return Status::Ok();
  if (m.get<HelloMsg>()) return HandleHello(learner, r.peer, m);
  if (m.get<SnapshotRequestMsg>()) {
    // A learner whose answer got lost asks again after its retry period.
    auto last = last_snapshot_.find(learner);
    if (last != last_snapshot_.end() && now - last->second < std::chrono::milliseconds(kSnapshotMinIntervalMs)) {
      counters_.snapshots_throttled++;
      return Status::Ok();
    }
    last_snapshot_[learner] = now;
    return HandleSnapshotRequest(r.peer, m);
  }
  return Status::Ok();
}

// Only a snapshot request, only with the home site's key, and only once this shard is final: the
// home asks again until then.
Status SyncerCore::HandleHomeRequest(const net::Received& r, const ParsedMessage& m) {
  if (!options_.home_key.empty() && r.peer_key != options_.home_key) {
    port_.Note("dropped a request naming " + m.header.sender + " sent with key " +
               (r.peer_key.empty() ? std::string("(none)") : r.peer_key) + ", not its site's");
    return Status::Ok();
  }
  if (!m.get<SnapshotRequestMsg>() || !flushed_) return Status::Ok();
  counters_.home_fetches++;
  return HandleSnapshotRequest(r.peer, m);
}

// Hello -> Welcome (see syncer.h): layout checks, then wait for the learner's uplink.
Status SyncerCore::HandleHello(int learner, const std::string& peer, const ParsedMessage& m) {
  const WelcomeMsg w = WelcomeFor(learner, m);
  if (w.result == JoinResult::kAccepted) {
    counters_.welcomes++;
  } else if (w.result != JoinResult::kBusy) {
    counters_.refusals++;
    port_.Note("refused " + m.header.sender + ": " + w.reason);
  }
  DL_RETURN_IF_ERROR(Reply(peer, w, nullptr));
  if (w.result == JoinResult::kAccepted) DL_RETURN_IF_ERROR(PublishStatus());
  return Status::Ok();
}

WelcomeMsg SyncerCore::WelcomeFor(int learner, const ParsedMessage& m) const {
  const HelloMsg& h = *m.get<HelloMsg>();
  WelcomeMsg w;
  w.learner = m.header.sender;
  w.tensor_table_digest = table_digest_;
  w.num_params = num_params_;
  w.num_fragments = (uint32_t)P_;
  w.fragment_layout_digest = fragments_digest_;
  for (const auto& f : state_.fragments) w.versions.push_back(f.version);
  w.heartbeat_interval_ms = (uint32_t)options_.heartbeat_interval_ms;
  w.heartbeat_timeout_ms = (uint32_t)sc_.heartbeat_timeout_ms;
  auto hex = [](uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
    return std::string(b);
  };
  if (h.tensor_table_digest != table_digest_ || h.num_params != num_params_) {
    w.result = JoinResult::kTableMismatch;
    w.reason = "model differs: learner has " + std::to_string(h.num_params) + " parameters (table digest " +
               hex(h.tensor_table_digest) + "), the syncer " + std::to_string(num_params_) + " (" +
               hex(table_digest_) + "); use the job's model config";
  } else if (h.param_dtype != ParamDType::kFp32) {
    w.result = JoinResult::kDTypeMismatch;
    w.reason = "the syncer holds fp32 parameters only";
  } else if (h.num_fragments != P_ || h.fragment_layout_digest != fragments_digest_) {
    w.result = JoinResult::kLayoutMismatch;
    w.reason = "fragment layout differs: learner has " + std::to_string(h.num_fragments) + " fragments (" +
               hex(h.fragment_layout_digest) + "), the syncer " + std::to_string(P_) + " (" +
               hex(fragments_digest_) + "); use the job's sync.fragments and sync.mode";
  } else if (!book_.Heard(learner) || book_.Incarnation(learner) != m.header.incarnation) {
    w.result = JoinResult::kBusy;
    w.reason = "no heartbeat from this incarnation of " + m.header.sender + " on the uplink yet; try again";
  }
  return w;
}

// SnapshotRequest -> one Snapshot part per fragment, all cut at the same versions.
Status SyncerCore::HandleSnapshotRequest(const std::string& peer, const ParsedMessage& m) {
  const SnapshotRequestMsg& rq = *m.get<SnapshotRequestMsg>();
  std::vector<uint32_t> wanted = rq.fragments;
  if (wanted.empty()) wanted = shards_.FragmentsOf(options_.shard);  // all this shard owns
  wanted.erase(std::remove_if(wanted.begin(), wanted.end(), [&](uint32_t p) { return p >= P_ || !Owns(p); }),
               wanted.end());
  if (wanted.empty()) return Status::Ok();
  std::vector<uint64_t> versions;
  for (const auto& f : state_.fragments) versions.push_back(f.version);
  const uint64_t snapshot_id = ++snapshot_ids_;
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
    sm.cadence_step = book_.options().lock_step ? book_.CadenceStep() : book_.FleetStep(port_.Now());
    sm.payload = FragmentPayloadInfo(fragments_[p], fp32, tensor_bytes);
    DL_RETURN_IF_ERROR(Reply(peer, sm, payload));
  }
  counters_.snapshots_served++;
  return Status::Ok();
}

// ---- Sending ----

EnvelopeHeader SyncerCore::Header(uint64_t* seq) {
  EnvelopeHeader h;
  h.job_id = options_.job_id;
  h.sender = name_;
  h.seq = ++*seq;
  h.incarnation = incarnation_;
  h.sent_unix_ms = (uint64_t)port_.UnixMs();
  return h;
}

Status SyncerCore::PublishStatus() {
  SyncerStatusMsg st;
  for (const auto& f : state_.fragments) st.versions.push_back(f.version);
  const SyncTime now = port_.Now();
  for (int l = 0; l < M_; l++)
    if (book_.Live(l, now)) {
      st.live_learners.push_back(LearnerName(l));
      st.live_steps.push_back(book_.LastStep(l));
    }
  st.acks = book_.Acks();
  st.merges = state_.merges;
  st.dropped_deltas = state_.dropped_deltas;
  const size_t n_drops = std::min<size_t>(recent_drops_.size(), 1024);
  st.recent_drops.assign(recent_drops_.begin(), recent_drops_.begin() + n_drops);
  recent_drops_.erase(recent_drops_.begin(), recent_drops_.begin() + n_drops);
  OutgoingMessage om;
  DL_RETURN_IF_ERROR(BuildMessage(Header(&seq_), st, {}, &om));
  counters_.bytes_published += om.wire_bytes();
  port_.Publish(net::ToMessage(std::move(om), nullptr));
  return Status::Ok();
}

Status SyncerCore::Reply(const std::string& peer, const MessageBody& body,
                         std::shared_ptr<std::vector<uint8_t>> payload) {
  OutgoingMessage om;
  std::span<const uint8_t> bytes;
  if (payload) bytes = {payload->data(), payload->size()};
  DL_RETURN_IF_ERROR(BuildMessage(Header(&router_seq_), body, bytes, &om));
  counters_.bytes_published += om.wire_bytes();
  port_.Reply(peer, net::ToMessage(std::move(om), payload));  // a peer gone meanwhile asks again
  return Status::Ok();
}

// ---- Merging ----

Status SyncerCore::Merge(size_t p, const std::string& reason, double grace_ms) {
  const SyncTime t0 = port_.Now();
  FragmentGlobal& fg = state_.fragments[p];
  // Fresh deltas in learner order (not arrival order: the merge's sums, the Global's
  // contributor list and the event are the same whichever delta came first).
  std::vector<PendingDelta> ok = book_.TakeForMerge((uint32_t)p, fg.version);
  ApplyDrops();
  if (ok.empty()) return Status::Ok();
  MergeOutcome mo;
  DL_RETURN_IF_ERROR(merger_.Merge(fragments_[p], (uint32_t)p, ok, &fg, &mo));
  fg.version++;
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
  ev.time_ms = port_.UnixMs();
  ev.fragment = (int)p;
  ev.version = fg.version;
  ev.reason = reason;
  ev.grace_ms = grace_ms;
  ev.delta_norm = mo.delta_norm;
  ev.update_norm = mo.update_norm;
  Credit(ok, mo.weights, &g, &ev);
  for (PendingDelta& pd : ok) recycler_.Give(std::move(pd.held));
  ev.skipped = std::move(skipped_[p]);
  skipped_[p].clear();

  DL_RETURN_IF_ERROR(PublishGlobal(g, payload));
  port_.OnMerge(ev);
  if (sc_.checkpoint_every > 0 && state_.merges % sc_.checkpoint_every == 0) port_.Checkpoint(state_);
  timings_.sync_ms.Add(MsBetween(t0, port_.Now()));
  return Status::Ok();
}

Status SyncerCore::LogUpdate(size_t p, uint32_t theta_crc, UpdateRecord* record) {
  // Durable before it is published: a syncer killed after this point comes back at this version.
  const uint64_t version = state_.fragments[p].version;
  record->fragment = (uint32_t)p;
  record->version = version;
  record->theta_crc32c = theta_crc;
  record->codec = down_codec_;
  return port_.LogUpdate(*record).WithContext("syncer: logging version " + std::to_string(version) +
                                              " of fragment " + std::to_string(p));
}

// The update as it goes out; the nan_global_update test hook puts a NaN in it.
std::shared_ptr<std::vector<uint8_t>> SyncerCore::GlobalPayload(size_t p, std::vector<uint8_t>&& bytes) const {
  auto payload = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  if (options_.nan_global_update && options_.nan_global_update((uint32_t)p, state_.fragments[p].version) &&
      down_codec_.kind == CodecKind::kFp32 && payload->size() >= sizeof(float)) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(payload->data(), &nan, sizeof nan);
  }
  return payload;
}

// The Global of fragment p's new version (its contributors come with Credit); the
// corrupt_global_crc test hook spoils its CRC32C.
GlobalMsg SyncerCore::GlobalOf(size_t p, uint32_t theta_crc, const std::vector<uint64_t>& tensor_bytes) const {
  const uint64_t version = state_.fragments[p].version;
  GlobalMsg g;
  g.fragment = (uint32_t)p;
  g.version = version;
  g.base_version = version - 1;
  g.is_full = false;
  g.fragment_crc32c = theta_crc;
  if (options_.corrupt_global_crc && options_.corrupt_global_crc((uint32_t)p, version)) g.fragment_crc32c ^= 1;
  g.payload = FragmentPayloadInfo(fragments_[p], down_codec_, tensor_bytes);
  return g;
}

// Each merged delta: its learner named in the Global and the event, its work in the ledger.
void SyncerCore::Credit(const std::vector<PendingDelta>& ok, const std::vector<double>& weights, GlobalMsg* g,
                        MergeEvent* ev) {
  for (size_t i = 0; i < ok.size(); i++) {
    const auto& pd = ok[i];
    g->contributors.push_back({LearnerName(pd.learner), pd.base_version, (uint64_t)pd.counts.steps,
                               (uint64_t)pd.counts.tokens, (float)weights[i], pd.learner_step});
    ev->contributors.push_back({pd.learner, weights[i], g->version - 1 - pd.base_version, pd.base_version,
                                pd.counts.tokens, pd.counts.steps, pd.learner_step});
    LedgerEntry& le = LedgerFor(&state_, pd.learner);
    le.tokens += (uint64_t)pd.counts.tokens;
    le.steps += (uint64_t)pd.counts.steps;
    le.merged++;
  }
}

Status SyncerCore::PublishGlobal(const GlobalMsg& g, std::shared_ptr<std::vector<uint8_t>> payload) {
  OutgoingMessage om;
  // The payload CRC is computed as the chunks go out (PubChannel), not before.
  DL_RETURN_IF_ERROR(BuildMessage(Header(&seq_), g, *payload, &om, BuildOptions{.defer_payload_crc = true}));
  counters_.bytes_published += om.wire_bytes();
  port_.Publish(net::ToMessage(std::move(om), payload));
  return Status::Ok();
}

}  // namespace diloco
