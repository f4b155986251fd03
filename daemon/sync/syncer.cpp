#include "daemon/sync/syncer.h"

#include <algorithm>
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

double L2(const float* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
  return std::sqrt(s);
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
  uint64_t welcomes = 0, refusals = 0;
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
  RoundBookOptions bo;
  bo.learners = sc.learners;
  bo.fragments = (int)P;
  bo.inner_steps = sc.inner_steps;
  bo.max_staleness = sc.max_staleness;
  bo.heartbeat_timeout_ms = sc.heartbeat_timeout_ms;
  bo.count_limits = options.count_limits;
  bo.norm_limit = sc.norm_limit;
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
  down.send_hwm_msgs = 100000;
  DL_RETURN_IF_ERROR(net::PubChannel::Create(context, down, &im.downlink));
  DL_RETURN_IF_ERROR(im.downlink->Bind(options.downlink_endpoint).WithContext("syncer downlink"));
  if (!options.snapshot_endpoint.empty()) {
    ParseOptions rexpect = expect;
    rexpect.accept = MessageBit(MessageType::kHello) | MessageBit(MessageType::kSnapshotRequest);
    net::ReceiveOptions rro;
    rro.validator = net::EnvelopeValidator(rexpect, im.router_parsed);
    net::SocketOptions ros = SyncerSocket(options, "syncer.snapshot");
    ros.send_hwm_msgs = 100000;
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

Status Syncer::Run() {
  Impl& im = *impl_;
  const SyncConfig& sc = im.options.sync;
  const int M = sc.learners;
  const size_t P = fragments_.size();
  DecideOptions dopt;
  dopt.mode = sc.mode;
  dopt.quorum = EffectiveQuorum(sc);
  dopt.overlap_steps = sc.overlap;
  dopt.grace_gamma = sc.grace.gamma;
  dopt.grace_cap_ms = sc.grace.cap_ms;
  dopt.heartbeat_timeout_ms = sc.heartbeat_timeout_ms;
  const CodecOptions down_codec{sc.codec.down, sc.codec.block, 0};
  // Error feedback on the downlink too: what the codec drops from one update of a fragment goes
  // out with its next one, so Θ stays within one message's rounding of the unquantized
  // trajectory. Not checkpointed: a restarted syncer loses at most that one rounding.
  ErrorFeedback down_ef(down_codec);
  uint64_t router_seq = 0;
  auto header = [&](uint64_t* seq) {
    EnvelopeHeader h;
    h.job_id = im.options.job_id;
    h.sender = kSyncerName;
    h.seq = ++*seq;
    h.incarnation = im.incarnation;
    h.sent_unix_ms = (uint64_t)UnixMs();
    return h;
  };
  auto publish_status = [&]() -> Status {
    SyncerStatusMsg st;
    for (const auto& f : state_.fragments) st.versions.push_back(f.version);
    const auto now = Clock::now();
    for (int l = 0; l < M; l++)
      if (im.book->Live(l, now)) st.live_learners.push_back(LearnerName(l));
    st.acks = im.book->Acks();
    st.merges = state_.merges;
    st.dropped_deltas = state_.dropped_deltas;
    const size_t n_drops = std::min<size_t>(im.recent_drops.size(), 1024);
    st.recent_drops.assign(im.recent_drops.begin(), im.recent_drops.begin() + n_drops);
    im.recent_drops.erase(im.recent_drops.begin(), im.recent_drops.begin() + n_drops);
    OutgoingMessage om;
    DL_RETURN_IF_ERROR(BuildMessage(header(&im.seq), st, {}, &om));
    result_.bytes_published += om.wire_bytes();
    net::Message msg = net::ToMessage(std::move(om), nullptr);
    (void)im.downlink->Publish(im.options.job_id, msg);
    return Status::Ok();
  };
  auto reply = [&](const std::string& peer, const MessageBody& body,
                   std::shared_ptr<std::vector<uint8_t>> payload) -> Status {
    OutgoingMessage om;
    std::span<const uint8_t> bytes;
    if (payload) bytes = {payload->data(), payload->size()};
    DL_RETURN_IF_ERROR(BuildMessage(header(&router_seq), body, bytes, &om));
    result_.bytes_published += om.wire_bytes();
    net::Message msg = net::ToMessage(std::move(om), payload);
    (void)im.router->SendTo(peer, msg, 0);  // a peer gone meanwhile: it will ask again
    return Status::Ok();
  };
  const uint64_t fragments_digest = FragmentsDigest(fragments_);

  // Hello -> Welcome (see the header): layout checks, then wait for the learner's uplink.
  auto handle_hello = [&](int learner, const std::string& peer, const ParsedMessage& m) -> Status {
    const HelloMsg& h = *m.get<HelloMsg>();
    WelcomeMsg w;
    w.learner = m.header.sender;
    w.tensor_table_digest = im.table_digest;
    w.num_params = im.num_params;
    w.num_fragments = (uint32_t)P;
    w.fragment_layout_digest = fragments_digest;
    for (const auto& f : state_.fragments) w.versions.push_back(f.version);
    w.heartbeat_interval_ms = (uint32_t)im.options.heartbeat_interval_ms;
    w.heartbeat_timeout_ms = (uint32_t)sc.heartbeat_timeout_ms;
    auto hex = [](uint64_t v) {
      char b[24];
      std::snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
      return std::string(b);
    };
    if (h.tensor_table_digest != im.table_digest || h.num_params != im.num_params) {
      w.result = JoinResult::kTableMismatch;
      w.reason = "model differs: learner has " + std::to_string(h.num_params) + " parameters (table digest " +
                 hex(h.tensor_table_digest) + "), the syncer " + std::to_string(im.num_params) + " (" +
                 hex(im.table_digest) + "); use the job's model config";
    } else if (h.param_dtype != ParamDType::kFp32) {
      w.result = JoinResult::kDTypeMismatch;
      w.reason = "the syncer holds fp32 parameters only";
    } else if (h.num_fragments != P || h.fragment_layout_digest != fragments_digest) {
      w.result = JoinResult::kLayoutMismatch;
      w.reason = "fragment layout differs: learner has " + std::to_string(h.num_fragments) + " fragments (" +
                 hex(h.fragment_layout_digest) + "), the syncer " + std::to_string(P) + " (" + hex(fragments_digest) +
                 "); use the job's sync.fragments and sync.mode";
    } else if (!im.book->Heard(learner) || im.book->Incarnation(learner) != m.header.incarnation) {
      w.result = JoinResult::kBusy;
      w.reason = "no heartbeat from this incarnation of " + m.header.sender + " on the uplink yet; try again";
    }
    if (w.result == JoinResult::kAccepted) {
      im.welcomes++;
    } else if (w.result != JoinResult::kBusy) {
      im.refusals++;
      std::fprintf(stderr, "syncer: refused %s: %s\n", m.header.sender.c_str(), w.reason.c_str());
    }
    DL_RETURN_IF_ERROR(reply(peer, w, nullptr));
    if (w.result == JoinResult::kAccepted) DL_RETURN_IF_ERROR(publish_status());
    return Status::Ok();
  };

  // SnapshotRequest -> one Snapshot part per fragment, all cut at the same versions.
  auto handle_snapshot_request = [&](const std::string& peer, const ParsedMessage& m) -> Status {
    const SnapshotRequestMsg& rq = *m.get<SnapshotRequestMsg>();
    std::vector<uint32_t> wanted = rq.fragments;
    if (wanted.empty())
      for (uint32_t p = 0; p < P; p++) wanted.push_back(p);
    wanted.erase(std::remove_if(wanted.begin(), wanted.end(), [&](uint32_t p) { return p >= P; }), wanted.end());
    if (wanted.empty()) return Status::Ok();
    std::vector<uint64_t> versions;
    for (const auto& f : state_.fragments) versions.push_back(f.version);
    const uint64_t snapshot_id = ++im.snapshot_ids;
    const CodecOptions fp32{CodecKind::kFp32, sc.codec.block, 0};
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
      sm.payload = FragmentPayloadInfo(fragments_[p], CodecKind::kFp32, sc.codec.block, tensor_bytes);
      DL_RETURN_IF_ERROR(reply(peer, sm, payload));
    }
    result_.snapshots_served++;
    return Status::Ok();
  };

  // Deltas that will not be merged (the book's drops): logged with the next merge of their
  // fragment, counted in the ledger, and (tell_learner) named in the next SyncerStatus so their
  // learner stops waiting for them.
  auto apply_drops = [&] {
    for (DeltaDrop& d : im.book->TakeDrops()) {
      if (d.tell_learner) im.recent_drops.push_back({LearnerName(d.learner), d.fragment, d.base_version, d.why});
      LedgerEntry& le = LedgerFor(&state_, d.learner);
      if (d.rejected) {
        le.rejected++;
        state_.rejected_deltas++;
      } else {
        le.dropped++;
        state_.dropped_deltas++;
      }
      if (d.fragment < P)
        im.skipped[d.fragment].push_back({d.learner, std::move(d.why), std::move(d.detail), d.tokens});
    }
  };

  auto handle_delta = [&](int learner, const ParsedMessage& m, SyncTime now) {
    const DeltaMsg& d = *m.get<DeltaMsg>();
    if (d.fragment >= P) {
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
    if (Status st = DecodeFragmentPayload(fragments_[d.fragment], d.payload, m, &a.delta); !st.ok()) {
      im.book->Reject(learner, d.fragment, d.base_version, "bad_payload", st.message());
    } else if (im.options.reject_delta && im.options.reject_delta(learner, d.fragment)) {
      im.book->Reject(learner, d.fragment, d.base_version, "test_rejected", "rejected by the test hook");
    } else {
      im.book->Admit(std::move(a), state_.fragments[d.fragment].version, now);
    }
    apply_drops();
  };

  // A checkpoint off the merge path: a copy of the state goes to the writer's thread (skipped
  // while the previous one is still being written); the log segment it covers is dropped once
  // the file is durable.
  auto checkpoint = [&] {
    if (im.state_writer->busy()) return;
    if (!im.update_log->HasPrevious()) {
      if (Status st = im.update_log->Rotate(); !st.ok()) {
        std::fprintf(stderr, "syncer: skipping a checkpoint: %s\n", st.message().c_str());
        return;
      }
    }
    UpdateLog* log = im.update_log.get();
    im.state_writer->Submit(state_, [log](Status st) {
      if (st.ok()) (void)log->DropPrevious();
      else std::fprintf(stderr, "syncer: checkpoint failed (the update log keeps everything): %s\n", st.message().c_str());
    });
  };

  auto merge = [&](size_t p, const std::string& reason, double grace_ms) -> Status {
    const auto t0 = Clock::now();
    FragmentGlobal& fg = state_.fragments[p];
    // Fresh deltas in learner order (not arrival order: the merge's sums, the Global's
    // contributor list and the event are the same whichever delta came first).
    const std::vector<PendingDelta> ok = im.book->TakeForMerge((uint32_t)p, fg.version);
    apply_drops();
    if (ok.empty()) return Status::Ok();
    std::vector<Contribution> contributions;
    for (const auto& pd : ok) contributions.push_back({pd.learner, pd.counts, pd.delta.data()});
    const Fragment& frag = fragments_[p];
    const size_t n = frag.numel;
    std::vector<float> merged(n), update(n), decoded(n);
    std::vector<double> weights;
    DL_RETURN_IF_ERROR(MergeContributions(frag, &contributions, sc.weighting, sc.merge, merged.data(), &weights));
    OuterNesterovUpdate(merged.data(), n, sc.outer.lr, sc.outer.momentum, fg.momentum.data(), update.data());
    const std::vector<uint64_t> numels = FragmentNumels(frag);
    UpdateRecord record;
    DL_RETURN_IF_ERROR(down_ef.Encode((uint32_t)p, update, numels, &record.payload, &record.tensor_bytes)
                           .WithContext("syncer: encoding the update of fragment " + std::to_string(p)));
    DL_RETURN_IF_ERROR(DecodeTensors(down_codec, record.payload, numels, record.tensor_bytes, decoded));
    ApplyUpdate(decoded.data(), n, fg.theta.data());
    fg.version++;
    result_.versions[p] = fg.version;
    state_.merges++;
    const uint32_t theta_crc = Crc32c(fg.theta.data(), n * sizeof(float));
    if (im.update_log) {
      // Durable before it is published: a syncer killed after this point comes back at this version.
      record.fragment = (uint32_t)p;
      record.version = fg.version;
      record.theta_crc32c = theta_crc;
      record.codec = down_codec;
      DL_RETURN_IF_ERROR(im.update_log->Append(record).WithContext("syncer: logging version " +
                                                                   std::to_string(fg.version) + " of fragment " +
                                                                   std::to_string(p)));
    }
    const std::vector<uint64_t> tensor_bytes = record.tensor_bytes;
    auto payload = std::make_shared<std::vector<uint8_t>>(std::move(record.payload));
    if (im.options.nan_global_update && im.options.nan_global_update((uint32_t)p, fg.version) &&
        down_codec.kind == CodecKind::kFp32 && payload->size() >= sizeof(float)) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(payload->data(), &nan, sizeof nan);
    }

    GlobalMsg g;
    g.fragment = (uint32_t)p;
    g.version = fg.version;
    g.base_version = fg.version - 1;
    g.is_full = false;
    g.fragment_crc32c = theta_crc;
    if (im.options.corrupt_global_crc && im.options.corrupt_global_crc((uint32_t)p, fg.version)) g.fragment_crc32c ^= 1;
    g.payload = FragmentPayloadInfo(frag, down_codec.kind, down_codec.block_size, tensor_bytes);
    MergeEvent ev;
    ev.time_ms = UnixMs();
    ev.fragment = (int)p;
    ev.version = fg.version;
    ev.reason = reason;
    ev.grace_ms = grace_ms;
    ev.delta_norm = L2(merged.data(), n);
    ev.update_norm = L2(decoded.data(), n);
    for (size_t i = 0; i < ok.size(); i++) {
      const auto& pd = ok[i];
      g.contributors.push_back({LearnerName(pd.learner), pd.base_version, (uint64_t)pd.counts.steps,
                                (uint64_t)pd.counts.tokens, (float)weights[i]});
      ev.contributors.push_back({pd.learner, weights[i], fg.version - 1 - pd.base_version, pd.base_version,
                                 pd.counts.tokens, pd.counts.steps});
      LedgerEntry& le = LedgerFor(&state_, pd.learner);
      le.tokens += (uint64_t)pd.counts.tokens;
      le.steps += (uint64_t)pd.counts.steps;
      le.merged++;
    }
    ev.skipped = std::move(im.skipped[p]);
    im.skipped[p].clear();

    OutgoingMessage om;
    DL_RETURN_IF_ERROR(BuildMessage(header(&im.seq), g, *payload, &om));
    result_.bytes_published += om.wire_bytes();
    net::Message msg = net::ToMessage(std::move(om), payload);
    (void)im.downlink->Publish(im.options.job_id, msg);
    if (im.have_events) DL_RETURN_IF_ERROR(im.events.Append(ev));
    if (im.state_writer && sc.checkpoint_every > 0 && state_.merges % sc.checkpoint_every == 0) checkpoint();
    im.timings.sync_ms.Add(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    return Status::Ok();
  };

  auto decide_all = [&](SyncTime now, SyncTime* next_wake) -> Status {
    for (size_t p = 0; p < P; p++) {
      if (!im.book->HasPending((uint32_t)p)) continue;
      const RoundState rs = im.book->Round((uint32_t)p, now, im.timings);
      const Decision d = Decide(now, rs, dopt);
      if (d.action == DecideAction::kMerge) {
        // ξ_quorum: round open (first arrival) -> the arrival that made the quorum.
        std::vector<SyncTime> at;
        for (const LearnerPresence& lp : rs.learners)
          if (lp.contributed_at) at.push_back(*lp.contributed_at);
        std::sort(at.begin(), at.end());
        const size_t k = std::min(at.size(), (size_t)std::max(1, d.quorum)) - 1;
        im.timings.quorum_ms.Add(std::chrono::duration<double, std::milli>(at[k] - at[0]).count());
        DL_RETURN_IF_ERROR(merge(p, ToString(d.reason), d.grace_ms));
      } else {
        *next_wake = std::min(*next_wake, d.wait_until);
      }
    }
    return Status::Ok();
  };

  bool status_due = false;  // publish a SyncerStatus at the next turn of the loop
  // One uplink message: liveness, heartbeats, deltas (the main stream or the liveness stream).
  auto handle_uplink = [&](const net::Received& r, SyncTime now) {
    const ParsedMessage& m = *im.parsed;
    result_.bytes_received += m.wire_bytes;
    const int learner = LearnerIndexOf(m.header.sender);
    if (learner < 0 || learner >= M) return;
    LearnerStatusEntry& ls = im.learners[learner];
    ls.heard = true;
    ls.last_heard_unix_ms = UnixMs();
    if (im.book->OnHeard(learner, m.header.incarnation, now)) {
      // A new incarnation (a restart): waited for again until it says otherwise.
      ls = LearnerStatusEntry();
      ls.learner = learner;
      ls.heard = true;
      ls.last_heard_unix_ms = UnixMs();
      ls.incarnation = m.header.incarnation;
    }
    if (r.topic == im.options.job_id) {
      im.book->OnStreamSeq(learner, m.header.seq);
      // A gap in a learner's main stream may be a lost delta: the next status (now) tells it.
      if (r.seq.verdict == net::SeqVerdict::kGap) status_due = true;
    }
    if (const HeartbeatMsg* hb = m.get<HeartbeatMsg>()) {
      if (hb->step_time_ms > 0) im.timings.step_ms.Add(hb->step_time_ms);
      im.book->OnHeartbeat(learner, *hb, now);
      if (hb->step >= ls.step) {  // the liveness stream may deliver an older beat late
        ls.state = hb->state;
        ls.step = hb->step;
        ls.tokens = hb->tokens;
        ls.loss = hb->loss;
        ls.tokens_per_s = hb->tokens_per_s;
        ls.step_time_ms = hb->step_time_ms;
      }
    } else if (const DeltaMsg* d = m.get<DeltaMsg>()) {
      im.book->OnDeltaSeen(learner, d->fragment);
      handle_delta(learner, m, now);
    }
  };
  auto handle_router = [&](const net::Received& r) -> Status {
    const ParsedMessage& m = *im.router_parsed;
    result_.bytes_received += m.wire_bytes;
    const int learner = LearnerIndexOf(m.header.sender);
    if (learner < 0 || learner >= M) return Status::Ok();
    if (m.get<HelloMsg>()) return handle_hello(learner, r.peer, m);
    if (m.get<SnapshotRequestMsg>()) return handle_snapshot_request(r.peer, m);
    return Status::Ok();
  };

  auto last_message = Clock::now();
  auto last_status = Clock::now();
  auto last_refresh = Clock::now() - std::chrono::hours(1);
  net::Received r;
  std::vector<net::Socket*> sockets{&im.uplink->socket()};
  if (im.router) sockets.push_back(&im.router->socket());
  std::vector<bool> ready;
  for (;;) {
    if (abort_) return Status::Ok();
    SyncTime now = Clock::now();
    SyncTime wake = now + std::chrono::milliseconds(20);
    DL_RETURN_IF_ERROR(decide_all(now, &wake));
    if (now - last_refresh >= std::chrono::milliseconds(50)) {
      RefreshStatus(true);
      last_refresh = now;
    }
    if (status_due || !im.recent_drops.empty() || (im.options.status_interval_ms > 0 &&
                                     now - last_status >= std::chrono::milliseconds(im.options.status_interval_ms))) {
      DL_RETURN_IF_ERROR(publish_status());
      last_status = now;
      status_due = false;
    }
    if (im.book->AllDone() && im.options.exit_when_all_finished) break;
    if (stop_ && Clock::now() - last_message > std::chrono::milliseconds(im.options.idle_exit_ms)) break;
    now = Clock::now();
    const int timeout_ms =
        wake <= now ? 0 : (int)std::min<int64_t>(20, std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1);
    if (!net::PollReadable(sockets, timeout_ms, &ready)) continue;
    // Drain a bounded batch from each socket, then decide again.
    bool closed = false;
    for (int i = 0; i < 256; i++) {
      const net::RecvResult rr = im.uplink->Receive(&r, 0);
      closed = rr == net::RecvResult::kClosed;
      if (rr != net::RecvResult::kMessage) break;
      now = Clock::now();
      last_message = now;
      handle_uplink(r, now);
    }
    if (im.router) {
      for (int i = 0; i < 64; i++) {
        const net::RecvResult rr = im.router->Receive(&r, 0);
        if (rr != net::RecvResult::kMessage) break;
        last_message = Clock::now();
        DL_RETURN_IF_ERROR(handle_router(r));
      }
    }
    if (closed) break;
  }
  // Flush: whatever is still pending is merged now (the run is over).
  for (size_t p = 0; p < P; p++)
    if (im.book->HasPending((uint32_t)p)) DL_RETURN_IF_ERROR(merge(p, "flush", 0));
  if (im.state_writer) {
    (void)im.state_writer->Wait();
    DL_RETURN_IF_ERROR(SaveGlobalState(im.state_path, state_));
    // The final state covers every logged update.
    if (!im.update_log->HasPrevious()) DL_RETURN_IF_ERROR(im.update_log->Rotate());
    DL_RETURN_IF_ERROR(im.update_log->DropPrevious());
  }
  result_.merges = state_.merges;
  result_.dropped_deltas = state_.dropped_deltas;
  result_.rejected_deltas = state_.rejected_deltas;
  RefreshStatus(false);
  return Status::Ok();
}

}  // namespace diloco
