#include "daemon/sync/syncer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <random>

#include "daemon/net/channel.h"
#include "daemon/net/codec.h"
#include "daemon/net/wire_transport.h"
#include "daemon/sync/decide.h"
#include "daemon/sync/event_log.h"
#include "daemon/sync/merge.h"
#include "daemon/util/crc32c.h"

namespace diloco {

std::vector<uint64_t> FragmentNumels(const Fragment& fragment) {
  std::vector<uint64_t> n;
  n.reserve(fragment.ranges.size());
  for (const auto& r : fragment.ranges) n.push_back(r.numel);
  return n;
}

PayloadInfo FragmentPayloadInfo(const Fragment& fragment, CodecKind codec, int block_size,
                                const std::vector<uint64_t>& tensor_bytes) {
  PayloadInfo info;
  info.codec = codec;
  info.block_size = block_size;
  for (size_t i = 0; i < fragment.ranges.size(); i++) {
    const auto& r = fragment.ranges[i];
    info.tensors.push_back({RangeName(r), r.offset, r.numel, tensor_bytes[i]});
  }
  return info;
}

Status DecodeFragmentPayload(const Fragment& fragment, const PayloadInfo& info,
                             const ParsedMessage& message, std::vector<float>* out) {
  if (info.tensors.size() != fragment.ranges.size())
    return Status::Error("payload has " + std::to_string(info.tensors.size()) + " tensors, fragment " +
                         std::to_string(fragment.index) + " has " + std::to_string(fragment.ranges.size()));
  std::vector<uint64_t> numels, bytes;
  for (size_t i = 0; i < info.tensors.size(); i++) {
    const auto& t = info.tensors[i];
    const auto& r = fragment.ranges[i];
    if (t.offset != r.offset || t.numel != r.numel)
      return Status::Error("payload tensor " + std::to_string(i) + " does not match fragment " +
                           std::to_string(fragment.index) + " (" + RangeName(r) + ")");
    numels.push_back(t.numel);
    bytes.push_back(t.encoded_bytes);
  }
  out->resize(fragment.numel);
  CodecOptions opt{info.codec, info.block_size, info.topk_fraction};
  return DecodeTensors(opt, message.payload_spans(), numels, bytes, *out);
}

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

int LearnerIndexOf(const std::string& name) {
  if (name.rfind("learner-", 0) != 0) return -1;
  try {
    return std::stoi(name.substr(8));
  } catch (...) {
    return -1;
  }
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
  uint64_t incarnation = 0;
  uint64_t seq = 0;

  struct Pending {
    int learner = 0;
    uint64_t base_version = 0;
    ContributionCounts counts;
    std::vector<float> delta;
    SyncTime at;
  };
  std::vector<std::vector<Pending>> pending;      // per fragment
  std::vector<std::vector<SkippedDelta>> skipped;  // per fragment, since its last merge
  // Deltas dropped or rejected since the last SyncerStatus: that status tells their learners,
  // which then stop waiting for a Global that will never include them and send again.
  std::vector<DroppedDelta> recent_drops;
  std::vector<NormFilter> filters;
  std::vector<SyncTime> last_heard;
  std::vector<bool> finished;  // said kStopping / kFinished: not waited for
  std::vector<bool> done;      // said kFinished
  std::vector<LearnerStatusEntry> learners;  // what each learner last reported
  // Each learner's last heartbeat, for the forecast of its next delta per fragment.
  struct LastBeat {
    bool have = false;
    SyncTime at;
    uint64_t step = 0;
    double step_ms = 0;
    std::vector<bool> in_flight;  // per fragment
  };
  std::vector<LastBeat> beats;
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
  } else {
    if (init_params == nullptr) return Status::Error("syncer: no initial parameters and not resuming");
    s->state_ = InitialGlobalState(table, s->fragments_, init_params);
  }
  im.pending.resize(P);
  im.skipped.resize(P);
  NormFilterOptions nf;
  nf.max_ratio = sc.norm_limit;
  im.filters.assign(P, NormFilter(nf));
  im.last_heard.assign(sc.learners, Clock::now());
  im.finished.assign(sc.learners, false);
  im.done.assign(sc.learners, false);
  im.learners.resize(sc.learners);
  im.beats.resize(sc.learners);
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
    l.live = l.heard && !im.finished[l.learner] &&
             now - im.last_heard[l.learner] <= std::chrono::milliseconds(im.options.sync.heartbeat_timeout_ms);
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
      if (im.learners[l].heard && !im.finished[l] &&
          now - im.last_heard[l] <= std::chrono::milliseconds(sc.heartbeat_timeout_ms))
        st.live_learners.push_back(LearnerName(l));
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
  std::vector<uint64_t> uplink_incarnation(M, 0);
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
    } else if (uplink_incarnation[learner] != m.header.incarnation) {
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

  // A delta that will not be merged: logged with the next merge of its fragment, counted in the
  // ledger, and (tell_learner) named in the next SyncerStatus so its learner stops waiting for it.
  auto drop_delta = [&](int learner, size_t p, uint64_t base_version, const std::string& why,
                        const std::string& detail, bool rejected, bool tell_learner) {
    im.skipped[p].push_back({learner, why, detail});
    if (tell_learner) im.recent_drops.push_back({LearnerName(learner), (uint32_t)p, base_version, why});
    LedgerEntry& le = LedgerFor(&state_, learner);
    if (rejected) {
      le.rejected++;
      state_.rejected_deltas++;
    } else {
      le.dropped++;
      state_.dropped_deltas++;
    }
  };

  auto handle_delta = [&](int learner, const ParsedMessage& m, SyncTime now) {
    const DeltaMsg& d = *m.get<DeltaMsg>();
    if (d.fragment >= P) {
      LedgerFor(&state_, learner).rejected++;
      state_.rejected_deltas++;
      return;
    }
    const size_t p = d.fragment;
    Impl::Pending pd;
    pd.learner = learner;
    pd.base_version = d.base_version;
    pd.counts = {(double)d.c_tokens, (double)d.c_steps};
    pd.at = now;
    auto skip = [&](const std::string& why, const std::string& detail, bool rejected) {
      drop_delta(learner, p, d.base_version, why, detail, rejected, /*tell_learner=*/true);
    };
    if (Status st = DecodeFragmentPayload(fragments_[p], d.payload, m, &pd.delta); !st.ok()) {
      skip("bad_payload", st.message(), true);
      return;
    }
    if (im.options.reject_delta && im.options.reject_delta(learner, d.fragment)) {
      skip("test_rejected", "rejected by the test hook", true);
      return;
    }
    if (const CountsVerdict cv = CheckCounts(d.c_steps, d.c_tokens, d.learner_step, im.options.count_limits);
        cv != CountsVerdict::kPlausible) {
      skip("implausible_counts",
           std::string(ToString(cv)) + ": c_steps " + std::to_string(d.c_steps) + ", c_tokens " +
               std::to_string(d.c_tokens) + ", learner step " + std::to_string(d.learner_step),
           true);
      return;
    }
    const StalenessCheck sc_check = CheckStaleness(state_.fragments[p].version, d.base_version, sc.max_staleness);
    if (!sc_check.accepted()) {
      skip(ToString(sc_check.verdict),
           "base " + std::to_string(d.base_version) + ", current " + std::to_string(state_.fragments[p].version),
           false);
      return;
    }
    const FilterResult fr = im.filters[p].Check(pd.delta.data(), pd.delta.size(), (double)d.c_steps);
    if (!fr.accepted()) {
      skip(fr.verdict == FilterVerdict::kNonFinite ? "non_finite" : "norm_too_large", fr.reason, true);
      return;
    }
    auto& pend = im.pending[p];
    for (auto& old : pend) {
      if (old.learner == learner) {  // a newer delta from the same learner replaces the older one
        // Not told: the learner waits for its newer delta, which is pending.
        drop_delta(learner, p, old.base_version, "replaced",
                   "base " + std::to_string(old.base_version) + " replaced by base " + std::to_string(d.base_version),
                   false, /*tell_learner=*/false);
        old = std::move(pd);
        return;
      }
    }
    pend.push_back(std::move(pd));
  };

  auto merge = [&](size_t p, const std::string& reason, double grace_ms) -> Status {
    const auto t0 = Clock::now();
    FragmentGlobal& fg = state_.fragments[p];
    auto& pend = im.pending[p];
    // Re-check staleness: the fragment may have advanced since the delta arrived.
    std::vector<Impl::Pending> ok;
    for (auto& pd : pend) {
      const StalenessCheck c = CheckStaleness(fg.version, pd.base_version, sc.max_staleness);
      if (c.accepted()) {
        ok.push_back(std::move(pd));
      } else {
        drop_delta(pd.learner, p, pd.base_version, ToString(c.verdict),
                   "base " + std::to_string(pd.base_version) + ", current " + std::to_string(fg.version), false,
                   /*tell_learner=*/true);
      }
    }
    pend.clear();
    if (ok.empty()) return Status::Ok();
    // Learner order, not arrival order: the merge's sums, the Global's contributor list and the
    // event are the same whichever delta came first.
    std::sort(ok.begin(), ok.end(), [](const Impl::Pending& a, const Impl::Pending& b) { return a.learner < b.learner; });
    std::vector<Contribution> contributions;
    for (const auto& pd : ok) contributions.push_back({pd.learner, pd.counts, pd.delta.data()});
    const Fragment& frag = fragments_[p];
    const size_t n = frag.numel;
    std::vector<float> merged(n), update(n), decoded(n);
    std::vector<double> weights;
    DL_RETURN_IF_ERROR(MergeContributions(frag, &contributions, sc.weighting, sc.merge, merged.data(), &weights));
    OuterNesterovUpdate(merged.data(), n, sc.outer.lr, sc.outer.momentum, fg.momentum.data(), update.data());
    const std::vector<uint64_t> numels = FragmentNumels(frag);
    auto payload = std::make_shared<std::vector<uint8_t>>();
    std::vector<uint64_t> tensor_bytes;
    DL_RETURN_IF_ERROR(down_ef.Encode((uint32_t)p, update, numels, payload.get(), &tensor_bytes)
                           .WithContext("syncer: encoding the update of fragment " + std::to_string(p)));
    DL_RETURN_IF_ERROR(DecodeTensors(down_codec, *payload, numels, tensor_bytes, decoded));
    ApplyUpdate(decoded.data(), n, fg.theta.data());
    fg.version++;
    result_.versions[p] = fg.version;
    state_.merges++;

    GlobalMsg g;
    g.fragment = (uint32_t)p;
    g.version = fg.version;
    g.base_version = fg.version - 1;
    g.is_full = false;
    g.fragment_crc32c = Crc32c(fg.theta.data(), n * sizeof(float));
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
    if (!im.state_path.empty() && sc.checkpoint_every > 0 && state_.merges % sc.checkpoint_every == 0)
      DL_RETURN_IF_ERROR(SaveGlobalState(im.state_path, state_));
    im.timings.sync_ms.Add(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    return Status::Ok();
  };

  // When learner l's delta for fragment p should arrive, from its last heartbeat: the steps until
  // p fires, plus one step of slack for jitter and the heartbeat's age. None while its delta for p is
  // in flight (it sends no other until it folds) or nothing is known yet.
  auto expected_delta_at = [&](int l, size_t p) -> std::optional<SyncTime> {
    const Impl::LastBeat& b = im.beats[l];
    if (!b.have || b.step_ms <= 0 || p >= b.in_flight.size() || b.in_flight[p]) return std::nullopt;
    const long steps = StepsUntilFires((int)p, (long)b.step, sc.inner_steps, (int)P) + 1;
    return b.at + std::chrono::duration_cast<SyncClock::duration>(
                      std::chrono::duration<double, std::milli>(steps * b.step_ms));
  };

  auto decide_all = [&](SyncTime now, SyncTime* next_wake) -> Status {
    for (size_t p = 0; p < P; p++) {
      if (im.pending[p].empty()) continue;
      RoundState rs;
      rs.timings = im.timings;
      for (int l = 0; l < M; l++) {
        LearnerPresence lp;
        lp.learner = l;
        lp.last_heard = im.last_heard[l];
        for (const auto& pd : im.pending[p])
          if (pd.learner == l) lp.contributed_at = pd.at;
        if (im.finished[l] && !lp.contributed_at) continue;  // not waited for any more
        if (im.finished[l]) lp.last_heard = now;             // its last delta is in: counts as live
        if (!lp.contributed_at) lp.expected_at = expected_delta_at(l, p);
        rs.learners.push_back(lp);
      }
      const Decision d = Decide(now, rs, dopt);
      if (d.action == DecideAction::kMerge) {
        // ξ_quorum: round open (first arrival) -> the arrival that made the quorum.
        std::vector<SyncTime> at;
        for (const auto& pd : im.pending[p]) at.push_back(pd.at);
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

  // One uplink message: liveness, heartbeats, deltas.
  auto handle_uplink = [&](SyncTime now) {
    const ParsedMessage& m = *im.parsed;
    result_.bytes_received += m.wire_bytes;
    const int learner = LearnerIndexOf(m.header.sender);
    if (learner < 0 || learner >= M) return;
    im.last_heard[learner] = now;
    LearnerStatusEntry& ls = im.learners[learner];
    ls.heard = true;
    ls.last_heard_unix_ms = UnixMs();
    if (uplink_incarnation[learner] != m.header.incarnation) {
      // A new incarnation (a restart): waited for again until it says otherwise.
      uplink_incarnation[learner] = m.header.incarnation;
      ls.incarnation = m.header.incarnation;
      im.finished[learner] = false;
      im.done[learner] = false;
      im.beats[learner] = Impl::LastBeat();
    }
    if (const HeartbeatMsg* hb = m.get<HeartbeatMsg>()) {
      if (hb->step_time_ms > 0) im.timings.step_ms.Add(hb->step_time_ms);
      Impl::LastBeat& b = im.beats[learner];
      b.have = true;
      b.at = now;
      b.step = hb->step;
      b.step_ms = hb->step_time_ms;
      b.in_flight.assign(P, false);
      for (const FragmentCounters& fc : hb->fragments)
        if (fc.fragment < P) b.in_flight[fc.fragment] = fc.in_flight;
      ls.state = hb->state;
      ls.step = hb->step;
      ls.tokens = hb->tokens;
      ls.loss = hb->loss;
      ls.tokens_per_s = hb->tokens_per_s;
      ls.step_time_ms = hb->step_time_ms;
      im.finished[learner] = hb->state == LearnerState::kFinished || hb->state == LearnerState::kStopping ||
                             hb->state == LearnerState::kFailed;
      im.done[learner] = hb->state == LearnerState::kFinished;
    } else if (m.get<DeltaMsg>()) {
      im.finished[learner] = false;
      im.done[learner] = false;
      // In flight from now on: no forecast for this fragment until a heartbeat says otherwise.
      const uint32_t f = m.get<DeltaMsg>()->fragment;
      if (f < im.beats[learner].in_flight.size()) im.beats[learner].in_flight[f] = true;
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
    SyncTime now = Clock::now();
    SyncTime wake = now + std::chrono::milliseconds(20);
    DL_RETURN_IF_ERROR(decide_all(now, &wake));
    if (now - last_refresh >= std::chrono::milliseconds(50)) {
      RefreshStatus(true);
      last_refresh = now;
    }
    if (!im.recent_drops.empty() || (im.options.status_interval_ms > 0 &&
                                     now - last_status >= std::chrono::milliseconds(im.options.status_interval_ms))) {
      DL_RETURN_IF_ERROR(publish_status());
      last_status = now;
    }
    const bool all_finished = std::all_of(im.done.begin(), im.done.end(), [](bool f) { return f; });
    if (all_finished && im.options.exit_when_all_finished) break;
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
      handle_uplink(now);
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
    if (!im.pending[p].empty()) DL_RETURN_IF_ERROR(merge(p, "flush", 0));
  if (!im.state_path.empty()) DL_RETURN_IF_ERROR(SaveGlobalState(im.state_path, state_));
  result_.merges = state_.merges;
  result_.dropped_deltas = state_.dropped_deltas;
  result_.rejected_deltas = state_.rejected_deltas;
  RefreshStatus(false);
  return Status::Ok();
}

}  // namespace diloco
