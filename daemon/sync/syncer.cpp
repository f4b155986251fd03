#include "daemon/sync/syncer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
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
    info.tensors.push_back({r.tensor, r.offset, r.numel, tensor_bytes[i]});
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
                           std::to_string(fragment.index) + " (" + r.tensor + ")");
    numels.push_back(t.numel);
    bytes.push_back(t.encoded_bytes);
  }
  out->resize(fragment.numel);
  CodecOptions opt{info.codec, info.block_size, info.topk_fraction};
  return DecodeTensors(opt, {message.payload.data(), message.payload.size()}, numels, bytes, *out);
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
  std::shared_ptr<ParsedMessage> parsed = std::make_shared<ParsedMessage>();
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
  std::vector<NormFilter> filters;
  std::vector<SyncTime> last_heard;
  std::vector<bool> finished;
  RoundTimings timings;
};

Syncer::~Syncer() = default;

Status Syncer::Create(net::NetContext& context, const SyncerOptions& options, const TensorTable& table,
                      const float* init_params, std::unique_ptr<Syncer>* out) {
  std::unique_ptr<Syncer> s(new Syncer());
  s->impl_ = std::make_unique<Impl>();
  Impl& im = *s->impl_;
  im.options = options;
  const SyncConfig& sc = options.sync;
  DL_RETURN_IF_ERROR(PartitionFragments(table, EffectiveFragments(sc), &s->fragments_));
  s->state_ = InitialGlobalState(table, s->fragments_, init_params);
  const size_t P = s->fragments_.size();
  im.pending.resize(P);
  im.skipped.resize(P);
  NormFilterOptions nf;
  nf.max_ratio = sc.norm_limit;
  im.filters.assign(P, NormFilter(nf));
  im.last_heard.assign(sc.learners, Clock::now());
  im.finished.assign(sc.learners, false);
  im.incarnation = std::random_device{}() | (uint64_t{std::random_device{}()} << 32);

  ParseOptions expect;
  expect.job_id = options.job_id;
  expect.accept = MessageBit(MessageType::kDelta) | MessageBit(MessageType::kHeartbeat);
  expect.model_params = table.total_numel();
  for (int i = 0; i < sc.learners; i++) expect.allowed_senders.push_back(LearnerName(i));
  net::ReceiveOptions ro;
  ro.validator = net::EnvelopeValidator(expect, im.parsed);
  net::SocketOptions up;
  up.name = "syncer.uplink";
  up.allow_plaintext = options.allow_plaintext;
  up.recv_hwm_msgs = 100000;
  DL_RETURN_IF_ERROR(net::SubChannel::Create(context, up, ro, &im.uplink));
  DL_RETURN_IF_ERROR(im.uplink->Subscribe(""));
  DL_RETURN_IF_ERROR(im.uplink->Bind(options.uplink_endpoint));
  net::SocketOptions down;
  down.name = "syncer.downlink";
  down.allow_plaintext = options.allow_plaintext;
  down.send_hwm_msgs = 100000;
  DL_RETURN_IF_ERROR(net::PubChannel::Create(context, down, &im.downlink));
  DL_RETURN_IF_ERROR(im.downlink->Bind(options.downlink_endpoint));

  if (!options.run_dir.empty()) {
    namespace fs = std::filesystem;
    DL_RETURN_IF_ERROR(im.events.Open((fs::path(options.run_dir) / "events.log").string()));
    im.have_events = true;
    im.state_path = (fs::path(options.run_dir) / "global_state.bin").string();
  }
  s->result_.versions.assign(P, 0);
  *out = std::move(s);
  return Status::Ok();
}

void Syncer::GlobalParams(float* flat) const {
  for (size_t p = 0; p < fragments_.size(); p++) ScatterFragment(fragments_[p], state_.fragments[p].theta.data(), flat);
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

  auto handle_delta = [&](int learner, const ParsedMessage& m, SyncTime now) {
    const DeltaMsg& d = *m.get<DeltaMsg>();
    LedgerEntry& le = LedgerFor(&state_, learner);
    if (d.fragment >= P) {
      le.rejected++;
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
      im.skipped[p].push_back({learner, why, detail});
      if (rejected) {
        le.rejected++;
        state_.rejected_deltas++;
      } else {
        le.dropped++;
        state_.dropped_deltas++;
      }
    };
    if (Status st = DecodeFragmentPayload(fragments_[p], d.payload, m, &pd.delta); !st.ok()) {
      skip("bad_payload", st.message(), true);
      return;
    }
    const StalenessCheck sc_check = CheckStaleness(state_.fragments[p].version, d.base_version, sc.max_staleness);
    if (!sc_check.accepted()) {
      skip(ToString(sc_check.verdict),
           "base " + std::to_string(d.base_version) + ", current " + std::to_string(state_.fragments[p].version),
           false);
      return;
    }
    const FilterResult fr = im.filters[p].Check(pd.delta.data(), pd.delta.size());
    if (!fr.accepted()) {
      skip(fr.verdict == FilterVerdict::kNonFinite ? "non_finite" : "norm_too_large", fr.reason, true);
      return;
    }
    auto& pend = im.pending[p];
    for (auto& old : pend) {
      if (old.learner == learner) {  // a newer delta from the same learner replaces the older one
        skip("replaced", "base " + std::to_string(old.base_version) + " replaced by base " +
                             std::to_string(d.base_version), false);
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
        im.skipped[p].push_back({pd.learner, ToString(c.verdict),
                                 "base " + std::to_string(pd.base_version) + ", current " + std::to_string(fg.version)});
        LedgerFor(&state_, pd.learner).dropped++;
        state_.dropped_deltas++;
      }
    }
    pend.clear();
    if (ok.empty()) return Status::Ok();
    std::vector<ContributionCounts> counts;
    std::vector<const float*> ptrs;
    for (const auto& pd : ok) {
      counts.push_back(pd.counts);
      ptrs.push_back(pd.delta.data());
    }
    std::vector<double> weights;
    DL_RETURN_IF_ERROR(ContributionWeights(counts, sc.weighting, &weights));
    const Fragment& frag = fragments_[p];
    const size_t n = frag.numel;
    std::vector<float> merged(n), update(n), decoded(n);
    MergeDeltas(frag, ptrs, weights, sc.merge, merged.data());
    OuterNesterovUpdate(merged.data(), n, sc.outer.lr, sc.outer.momentum, fg.momentum.data(), update.data());
    const std::vector<uint64_t> numels = FragmentNumels(frag);
    auto payload = std::make_shared<std::vector<uint8_t>>();
    std::vector<uint64_t> tensor_bytes;
    DL_RETURN_IF_ERROR(EncodeTensors(down_codec, update, numels, payload.get(), &tensor_bytes)
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

    EnvelopeHeader h;
    h.job_id = im.options.job_id;
    h.sender = kSyncerName;
    h.seq = ++im.seq;
    h.incarnation = im.incarnation;
    h.sent_unix_ms = (uint64_t)UnixMs();
    OutgoingMessage om;
    DL_RETURN_IF_ERROR(BuildMessage(h, g, *payload, &om));
    result_.bytes_published += om.wire_bytes();
    net::Message msg = net::ToMessage(std::move(om), payload);
    (void)im.downlink->Publish(im.options.job_id, msg);
    if (im.have_events) DL_RETURN_IF_ERROR(im.events.Append(ev));
    if (!im.state_path.empty() && sc.checkpoint_every > 0 && state_.merges % sc.checkpoint_every == 0)
      DL_RETURN_IF_ERROR(SaveGlobalState(im.state_path, state_));
    im.timings.sync_ms.Add(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    return Status::Ok();
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

  auto last_message = Clock::now();
  net::Received r;
  for (;;) {
    SyncTime now = Clock::now();
    SyncTime wake = now + std::chrono::milliseconds(20);
    DL_RETURN_IF_ERROR(decide_all(now, &wake));
    const bool all_finished = std::all_of(im.finished.begin(), im.finished.end(), [](bool f) { return f; });
    if (all_finished) break;
    if (stop_ && Clock::now() - last_message > std::chrono::milliseconds(im.options.idle_exit_ms)) break;
    now = Clock::now();
    const int timeout_ms =
        wake <= now ? 0 : (int)std::min<int64_t>(20, std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1);
    const net::RecvResult rr = im.uplink->Receive(&r, timeout_ms);
    if (rr == net::RecvResult::kClosed) break;
    if (rr != net::RecvResult::kMessage) continue;
    now = Clock::now();
    last_message = now;
    const ParsedMessage& m = *im.parsed;
    result_.bytes_received += m.wire_bytes;
    const int learner = LearnerIndexOf(m.header.sender);
    if (learner < 0 || learner >= M) continue;
    im.last_heard[learner] = now;
    if (const HeartbeatMsg* hb = m.get<HeartbeatMsg>()) {
      if (hb->step_time_ms > 0) im.timings.step_ms.Add(hb->step_time_ms);
      if (hb->state == LearnerState::kFinished || hb->state == LearnerState::kStopping) im.finished[learner] = true;
    } else if (m.get<DeltaMsg>()) {
      im.finished[learner] = false;
      handle_delta(learner, m, now);
    }
  }
  // Flush: whatever is still pending is merged now (the run is over).
  for (size_t p = 0; p < P; p++)
    if (!im.pending[p].empty()) DL_RETURN_IF_ERROR(merge(p, "flush", 0));
  if (!im.state_path.empty()) DL_RETURN_IF_ERROR(SaveGlobalState(im.state_path, state_));
  result_.merges = state_.merges;
  result_.dropped_deltas = state_.dropped_deltas;
  result_.rejected_deltas = state_.rejected_deltas;
  return Status::Ok();
}

}  // namespace diloco
