// LearnerCore (learner_core.h) driven directly: a fake port records what the core sends, saves and
// prints; time is a hand-advanced clock; the syncer's side is played by the test with real
// envelopes (BuildMessage, then ParseEnvelope with the core's own checks, as a runtime would).
// The model is a tiny GPT on the CPU; steps are fake StepResults (the parameters move by hand).
#include <catch2/catch.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/net/codec.h"
#include "daemon/net/envelope.h"
#include "daemon/net/wire_transport.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/merge.h"
#include "daemon/sync/protocol.h"
#include "daemon/train/learner_core.h"
#include "daemon/sync/drop_reasons.h"
#include "daemon/train/local_ring.h"
#include "daemon/train/outer_state.h"
#include "daemon/train/trainer.h"
#include "daemon/util/crc32c.h"
#include "kernels/rng.h"

namespace diloco {
namespace {

using std::chrono::milliseconds;

constexpr const char* kJob = "lcore-test";

class FakePort final : public LearnerPort {
 public:
  SyncTime now = SyncTime(std::chrono::seconds(1000));
  static constexpr int64_t kUnixStartMs = 1767225600000;

  SyncTime Now() override { return now; }
  int64_t UnixMs() override {
    return kUnixStartMs + std::chrono::duration_cast<milliseconds>(now.time_since_epoch()).count();
  }
  void SendUplink(int shard, net::Message&& m) override {
    uplink_shards.push_back(shard);
    uplink.push_back(std::move(m));
  }
  void SendDealer(int shard, net::Message&& m) override {
    dealer_shards.push_back(shard);
    dealer.push_back(std::move(m));
  }
  void OnHeartbeat(const HeartbeatMsg& hb) override { beats.push_back(hb); }
  void SaveStep(long step) override { saved_steps.push_back(step); }
  Status SaveMoments(long done) override {
    moments.push_back(done);
    return Status::Ok();
  }
  void WriteMetrics(const nlohmann::json& line) override { metrics.push_back(line); }
  void Note(const std::string& line) override { notes.push_back(line); }

  void Advance(int ms) { now += milliseconds(ms); }

  std::vector<net::Message> uplink, dealer;
  std::vector<int> uplink_shards, dealer_shards;  // the syncer shard each went to
  std::vector<HeartbeatMsg> beats;
  std::vector<long> saved_steps, moments;
  std::vector<nlohmann::json> metrics;
  std::vector<std::string> notes;
};

// Every frame of every message, length-prefixed: what went on the wire, byte for byte.
std::vector<uint8_t> WireBytes(const std::vector<net::Message>& messages) {
  std::vector<uint8_t> out;
  for (const net::Message& m : messages)
    for (const auto& f : m.spans()) {
      const uint64_t n = f.size();
      const auto* len = reinterpret_cast<const uint8_t*>(&n);
      out.insert(out.end(), len, len + sizeof n);
      out.insert(out.end(), f.begin(), f.end());
    }
  return out;
}

RunConfig TinyConfig(SyncMode mode, int fragments, int inner_steps) {
  RunConfig c;
  c.model = {.n_layer = 1, .n_embd = 16, .n_head = 2, .block_size = 8, .vocab_size = 64};
  c.train.batch_size = 2;
  c.train.steps = 100;
  c.train.log_every = 5;
  c.train.checkpoint_every = 0;
  c.sync.learners = 2;
  c.sync.mode = mode;
  c.sync.fragments = fragments;
  c.sync.inner_steps = inner_steps;
  c.sync.codec.up = CodecKind::kFp32;  // the delta decodes to base − θ exactly
  return c;
}

// One learner core on a tiny CPU ring, and the syncer's side of the conversation.
struct Fixture {
  RunConfig cfg;
  LearnerOptions o;
  std::unique_ptr<LocalRing> ring;
  std::unique_ptr<OuterState> outer;
  std::vector<Fragment> frags;
  std::vector<float> init;
  FakePort port;
  std::unique_ptr<LearnerCore> core;
  uint64_t down_seq = 0, dealer_seq = 0;
  std::vector<std::vector<float>> global;  // the syncer's Θ per fragment (packed)
  std::string syncer_name = kSyncerName;   // who sends what the fixture sends (a shard's name)

  explicit Fixture(const RunConfig& config, uint64_t incarnation = 0xC0DE) : cfg(config) {
    o.index = 0;
    o.config = &cfg;
    o.job_id = kJob;
    o.syncers = {SyncerEndpoints{"inproc://unused", "inproc://unused", "inproc://unused", ""}};
    REQUIRE(LocalRing::Create(LocalRingOptionsOf(cfg, 1), &ring).ok());
    init.resize(ring->backend(0).num_params());
    Rng rng(11);
    for (float& x : init) x = (float)(0.02 * rng.normal());
    ring->Upload(init.data());
    outer = MakeOuterState(*ring, ShardMode::kNone);
    REQUIRE(PartitionFragments(ring->backend(0).table(), EffectiveFragments(cfg.sync), &frags).ok());
    for (const Fragment& f : frags) global.push_back(Packed(f, init));
    core = std::make_unique<LearnerCore>(o, ring->backend(0), *outer, frags, incarnation, &port);
    REQUIRE(core->SetUp().ok());
  }

  static std::vector<float> Packed(const Fragment& f, const std::vector<float>& params) {
    std::vector<float> out;
    for (const FragmentRange& r : f.ranges) out.insert(out.end(), &params[r.offset], &params[r.offset] + r.numel);
    return out;
  }

  // θ moves away from the base by a small noise (as training would).
  void MoveParameters(uint64_t seed) {
    std::vector<float> theta(init.size());
    ring->backend(0).download_params(theta.data());
    Rng rng(seed);
    for (float& x : theta) x += (float)(0.001 * rng.normal());
    ring->Upload(theta.data());
  }

  EnvelopeHeader SyncerHeader(uint64_t* seq) {
    EnvelopeHeader h;
    h.job_id = kJob;
    h.sender = syncer_name;
    h.seq = ++*seq;
    h.incarnation = 77;
    h.sent_unix_ms = (uint64_t)port.UnixMs();
    return h;
  }

  // The syncer publishes body on the downlink; the core gets it as the runtime would hand it over.
  Status Downlink(const MessageBody& body, const std::vector<uint8_t>& payload = {}) {
    OutgoingMessage om;
    REQUIRE(BuildMessage(SyncerHeader(&down_seq), body, payload, &om).ok());
    net::Received r;
    r.topic = kJob;
    r.message = net::ToMessage(std::move(om), nullptr);
    ParsedMessage parsed;
    const auto spans = r.message.spans();
    REQUIRE(ParseEnvelope(spans, core->downlink_expect(), &parsed).ok());
    r.seq.verdict = down_seq == 1 ? net::SeqVerdict::kFirst : net::SeqVerdict::kInOrder;
    return core->OnDownlink(r, parsed);
  }

  // Part p of a snapshot (one fragment each) answering request_id: the syncer's Θ_p moved by 0.01,
  // appended to *values.
  Status SnapshotPart(int p, uint64_t request_id, const std::vector<uint64_t>& versions, uint64_t cadence_step,
                      std::vector<std::vector<float>>* values) {
    CodecOptions fp32;
    fp32.kind = CodecKind::kFp32;
    std::vector<float> v = global[p];
    for (float& x : v) x += 0.01f;
    std::vector<uint8_t> payload;
    std::vector<uint64_t> tensor_bytes;
    REQUIRE(EncodeTensors(fp32, v, FragmentNumels(frags[p]), &payload, &tensor_bytes).ok());
    SnapshotMsg sm;
    sm.request_id = request_id;
    sm.snapshot_id = 1;
    sm.part = (uint32_t)p;
    sm.num_parts = (uint32_t)frags.size();
    sm.fragment = (uint32_t)p;
    sm.version = versions[p];
    sm.versions = versions;
    sm.cadence_step = cadence_step;
    sm.fragment_crc32c = Crc32c(v.data(), v.size() * sizeof(float));
    sm.payload = FragmentPayloadInfo(frags[p], fp32, tensor_bytes);
    values->push_back(std::move(v));
    return Dealer(sm, payload);
  }

  // The syncer's ROUTER replies on the learner's DEALER.
  Status Dealer(const MessageBody& body, const std::vector<uint8_t>& payload = {}) {
    OutgoingMessage om;
    REQUIRE(BuildMessage(SyncerHeader(&dealer_seq), body, payload, &om).ok());
    const net::Message msg = net::ToMessage(std::move(om), nullptr);
    ParsedMessage parsed;
    const auto spans = msg.spans();
    REQUIRE(ParseEnvelope(spans, core->dealer_expect(), &parsed).ok());
    return core->OnDealer(parsed);
  }

  Status Welcome(JoinResult result = JoinResult::kAccepted, const std::string& reason = "") {
    WelcomeMsg w;
    w.result = result;
    w.reason = reason;
    w.learner = LearnerName(0);
    w.num_params = init.size();
    w.num_fragments = (uint32_t)frags.size();
    w.versions.assign(frags.size(), 0);
    return Dealer(w);
  }

  Status PublishStatus(const std::vector<uint64_t>& versions) {
    SyncerStatusMsg st;
    st.versions = versions;
    st.live_learners = {LearnerName(0)};
    return Downlink(st);
  }

  // The whole startup exchange, then a start from init_params.
  void JoinAndStart() {
    REQUIRE(core->OnJoinTimer().ok());
    REQUIRE(Welcome().ok());
    REQUIRE(PublishStatus(std::vector<uint64_t>(frags.size(), 0)).ok());
    REQUIRE(core->Joined());
    REQUIRE(core->Start(false).ok());
    REQUIRE(core->BeginTraining().ok());
  }

  // Steps [from, to): BeforeStep (must not block), 50 ms of "compute", AfterStep.
  void Steps(long from, long to) {
    for (long at = from; at < to; at++) {
      StepControl control;
      REQUIRE(core->BeforeStep(at, &control).ok());
      REQUIRE_FALSE(control.stop);
      REQUIRE_FALSE(core->Blocked());
      port.Advance(50);
      StepResult r;
      r.step = at;
      r.stats.loss = 3.0f;
      r.stats.applied = true;
      r.lr = 1e-3f;
      r.step_s = 0.05;
      REQUIRE(core->AfterStep(r, 0.05, 0.05).ok());
    }
  }

  // Messages the core sent, parsed as the syncer would.
  std::vector<ParsedMessage> Sent(const std::vector<net::Message>& messages, uint32_t accept) const {
    ParseOptions expect;
    expect.job_id = kJob;
    expect.accept = accept;
    expect.model_params = init.size();
    std::vector<ParsedMessage> out;
    for (const net::Message& m : messages) {
      ParsedMessage parsed;
      const auto spans = m.spans();
      REQUIRE(ParseEnvelope(spans, expect, &parsed).ok());
      out.push_back(std::move(parsed));
    }
    return out;
  }
  std::vector<ParsedMessage> Uplink() const {
    return Sent(port.uplink, MessageBit(MessageType::kDelta) | MessageBit(MessageType::kHeartbeat));
  }
  std::vector<ParsedMessage> Deltas() const {
    std::vector<ParsedMessage> out;
    for (ParsedMessage& m : Uplink())
      if (m.get<DeltaMsg>()) out.push_back(std::move(m));
    return out;
  }

  // The syncer merges one delta alone with outer LR 1 (Θ ← Θ − Δ) and publishes the Global, the
  // update in the downlink codec, its CRC over Θ as every learner will compute it.
  Status PublishGlobalOf(const ParsedMessage& delta_msg, uint64_t version) {
    const DeltaMsg& d = *delta_msg.get<DeltaMsg>();
    const Fragment& f = frags[d.fragment];
    std::vector<float> delta;
    REQUIRE(DecodeFragmentPayload(f, d.payload, delta_msg, &delta).ok());
    std::vector<float> update(delta.size());
    for (size_t i = 0; i < delta.size(); i++) update[i] = -delta[i];
    const CodecOptions codec = DownlinkCodec(cfg.sync);
    std::vector<uint8_t> payload;
    std::vector<uint64_t> tensor_bytes;
    const std::vector<uint64_t> numels = FragmentNumels(f);
    REQUIRE(EncodeTensors(codec, update, numels, &payload, &tensor_bytes).ok());
    std::vector<float> decoded(update.size());
    REQUIRE(DecodeTensors(codec, payload, numels, tensor_bytes, decoded).ok());
    ApplyUpdate(decoded.data(), decoded.size(), global[d.fragment].data());
    GlobalMsg g;
    g.fragment = d.fragment;
    g.version = version;
    g.base_version = version - 1;
    g.fragment_crc32c = Crc32c(global[d.fragment].data(), global[d.fragment].size() * sizeof(float));
    g.contributors = {{LearnerName(0), d.base_version, d.c_steps}};
    g.payload = FragmentPayloadInfo(f, codec, tensor_bytes);
    return Downlink(g, payload);
  }
};

TEST_CASE("LearnerCore: the join handshake (Heartbeat(kJoining) and Hello on their timers, then Welcome and "
          "a downlink message)",
          "[unit]") {
  Fixture fx(TinyConfig(SyncMode::kDecoupled, 2, 10));
  REQUIRE(fx.core->OnJoinTimer().ok());
  {
    const auto up = fx.Uplink();
    REQUIRE(up.size() == 1);
    REQUIRE(up[0].get<HeartbeatMsg>());
    CHECK(up[0].get<HeartbeatMsg>()->state == LearnerState::kJoining);
    CHECK(up[0].header.sender == "learner-0");
    CHECK(up[0].header.incarnation == 0xC0DE);
    const auto hello = fx.Sent(fx.port.dealer, MessageBit(MessageType::kHello));
    REQUIRE(hello.size() == 1);
    CHECK(hello[0].get<HelloMsg>()->num_params == fx.init.size());
    CHECK(hello[0].get<HelloMsg>()->num_fragments == 2);
    CHECK(hello[0].get<HelloMsg>()->fragment_layout_digest == FragmentsDigest(fx.frags));
  }
  // Beats every 20 ms, Hellos every 50 ms, by the port's clock only.
  fx.port.Advance(10);
  REQUIRE(fx.core->OnJoinTimer().ok());
  CHECK(fx.port.uplink.size() == 1);
  fx.port.Advance(10);
  REQUIRE(fx.core->OnJoinTimer().ok());
  CHECK(fx.port.uplink.size() == 2);
  CHECK(fx.port.dealer.size() == 1);
  fx.port.Advance(30);
  REQUIRE(fx.core->OnJoinTimer().ok());
  CHECK(fx.port.uplink.size() == 3);
  CHECK(fx.port.dealer.size() == 2);

  CHECK_FALSE(fx.core->Joined());
  REQUIRE(fx.Welcome(JoinResult::kBusy, "busy").ok());  // busy: keep asking
  CHECK_FALSE(fx.core->Joined());
  REQUIRE(fx.Welcome().ok());
  CHECK_FALSE(fx.core->Joined());  // the downlink is not known to be up yet
  REQUIRE(fx.PublishStatus({0, 0}).ok());
  CHECK(fx.core->Joined());

  REQUIRE(fx.core->Start(false).ok());
  CHECK_FALSE(fx.core->AwaitingSnapshot());
  CHECK(fx.core->StateNow() == LearnerState::kTraining);
  CHECK(fx.port.beats.back().state == LearnerState::kJoining);  // the liveness stream's latest
  REQUIRE(fx.core->BeginTraining().ok());
  CHECK(fx.port.beats.back().state == LearnerState::kTraining);
  CHECK(fx.core->result().train_start_unix_ms == fx.port.UnixMs());
  CHECK(fx.core->result().bytes_down > 0);
}

TEST_CASE("LearnerCore: a refused Welcome is an error naming the reason", "[unit]") {
  Fixture fx(TinyConfig(SyncMode::kDecoupled, 2, 10));
  REQUIRE(fx.core->OnJoinTimer().ok());
  const Status st = fx.Welcome(JoinResult::kTableMismatch, "tensor table differs");
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().find("learner-0") != std::string::npos);
  CHECK(st.message().find("tensor table differs") != std::string::npos);
}

TEST_CASE("LearnerCore: the firing fragment's delta goes out with the ledger's counts", "[unit]") {
  Fixture fx(TinyConfig(SyncMode::kDecoupled, 2, 10));
  fx.JoinAndStart();
  const std::vector<float> base1 = Fixture::Packed(fx.frags[1], fx.init);
  fx.MoveParameters(5);
  std::vector<float> theta(fx.init.size());
  fx.ring->backend(0).download_params(theta.data());

  // P = 2, H = 10: fragment 1 fires after step 5, fragment 0 after step 10.
  fx.Steps(0, 4);
  CHECK(fx.Deltas().empty());
  fx.Steps(4, 5);
  auto deltas = fx.Deltas();
  REQUIRE(deltas.size() == 1);
  const long tokens_per_step = (long)LearnerTokensPerStep(fx.cfg);
  {
    const DeltaMsg& d = *deltas[0].get<DeltaMsg>();
    CHECK(d.fragment == 1);
    CHECK(d.base_version == 0);
    CHECK(d.c_steps == 5);
    CHECK(d.c_tokens == (uint64_t)(5 * tokens_per_step));
    CHECK(d.learner_step == 5);
    // Δ = base − θ, exactly in fp32.
    std::vector<float> delta;
    REQUIRE(DecodeFragmentPayload(fx.frags[1], d.payload, deltas[0], &delta).ok());
    const std::vector<float> theta1 = Fixture::Packed(fx.frags[1], theta);
    REQUIRE(delta.size() == base1.size());
    bool exact = true;
    for (size_t i = 0; i < delta.size(); i++) exact = exact && delta[i] == base1[i] - theta1[i];
    CHECK(exact);
  }
  fx.Steps(5, 10);
  deltas = fx.Deltas();
  REQUIRE(deltas.size() == 2);
  CHECK(deltas[1].get<DeltaMsg>()->fragment == 0);
  CHECK(deltas[1].get<DeltaMsg>()->c_steps == 10);
  CHECK(deltas[1].get<DeltaMsg>()->c_tokens == (uint64_t)(10 * tokens_per_step));
  // The deltas' numbers on the main stream follow the heartbeats'; the counters and the metrics.
  CHECK(deltas[1].header.seq > deltas[0].header.seq);
  CHECK(fx.core->result().deltas_sent == 2);
  CHECK(fx.core->result().tokens == 10 * tokens_per_step);
  CHECK(fx.core->progress().last_fragment_sent == 0);
  REQUIRE(fx.port.metrics.size() == 2);  // log_every 5
  CHECK(fx.port.metrics[1]["step"] == 10);
  CHECK(fx.port.metrics[1]["time_ms"] == fx.port.UnixMs());

  // Decoupled never blocks; the Global of fragment 1 folds in and its ranges go to the ring.
  REQUIRE(fx.PublishGlobalOf(deltas[0], 1).ok());
  CHECK(fx.core->result().globals_applied == 1);
  CHECK(fx.core->result().crc_mismatches == 0);
  CHECK(fx.core->progress().base_versions == std::vector<uint64_t>{0, 1});
  StepControl control;
  REQUIRE(fx.core->BeforeStep(10, &control).ok());
  CHECK(control.changed.size() == fx.frags[1].ranges.size());
}

// A status that acks this learner's main stream up to heard_seq.
SyncerStatusMsg AckStatus(const Fixture& fx, uint64_t heard_seq, uint64_t incarnation = 0xC0DE) {
  SyncerStatusMsg st;
  st.versions.assign(fx.frags.size(), 0);
  st.live_learners = {LearnerName(0)};
  LearnerAck a;
  a.learner = LearnerName(0);
  a.incarnation = incarnation;
  a.heard_seq = heard_seq;
  st.acks = {a};
  return st;
}

TEST_CASE("LearnerCore: the last word is said again until a status acks it, or the heartbeat timeout",
          "[unit]") {
  RunConfig cfg = TinyConfig(SyncMode::kDecoupled, 1, 10);
  cfg.train.steps = 2;
  cfg.sync.heartbeat_timeout_ms = 3000;
  Fixture fx(cfg);
  fx.JoinAndStart();
  fx.Steps(0, 2);
  REQUIRE(fx.core->BeginFlush().ok());
  auto last_beat = [&] { return *fx.Uplink().back().get<HeartbeatMsg>(); };
  auto last_seq = [&] { return fx.Uplink().back().header.seq; };

  SECTION("acked") {
    const ParsedMessage delta = fx.Deltas().back();  // the work left at the end
    REQUIRE(fx.PublishGlobalOf(delta, 1).ok());
    REQUIRE(fx.core->Flushed());
    REQUIRE(fx.core->SendLastWord().ok());
    CHECK(last_beat().state == LearnerState::kFinished);
    CHECK_FALSE(fx.core->LastWordHeard());
    const uint64_t first = last_seq();
    // Lost: said again after a heartbeat interval (and nothing else is said meanwhile).
    fx.port.Advance(fx.o.heartbeat_interval_ms / 2);
    REQUIRE(fx.core->OnTimer().ok());
    CHECK(last_seq() == first);
    fx.port.Advance(fx.o.heartbeat_interval_ms);
    REQUIRE(fx.core->OnTimer().ok());
    CHECK(last_seq() > first);
    CHECK(last_beat().state == LearnerState::kFinished);
    // An ack of what came before, or of another incarnation, is not enough; an ack of the first
    // copy is (every copy says the same: waiting for the latest chased it on a slow link).
    REQUIRE(fx.Downlink(AckStatus(fx, first - 1)).ok());
    CHECK_FALSE(fx.core->LastWordHeard());
    REQUIRE(fx.Downlink(AckStatus(fx, last_seq(), 0xBEEF)).ok());
    CHECK_FALSE(fx.core->LastWordHeard());
    REQUIRE(fx.Downlink(AckStatus(fx, first)).ok());
    CHECK(fx.core->LastWordHeard());
    const size_t sent = fx.port.uplink.size();
    fx.port.Advance(fx.o.heartbeat_interval_ms * 2);
    REQUIRE(fx.core->OnTimer().ok());
    CHECK(fx.port.uplink.size() == sent);  // heard: quiet
    REQUIRE(fx.core->Finish().ok());
    CHECK(fx.core->progress().state == LearnerState::kFinished);
  }
  SECTION("never acked: given up after the heartbeat timeout") {
    REQUIRE(fx.core->SendLastWord().ok());
    fx.port.Advance(2900);
    CHECK_FALSE(fx.core->LastWordHeard());
    fx.port.Advance(200);
    CHECK(fx.core->LastWordHeard());
  }
}

TEST_CASE("LearnerCore: a delta dropped as already merged leaves nothing to send at the end", "[unit]") {
  // dilococtl dst --seed 8359: a restarted learner redid a step its earlier incarnation's delta
  // had brought in; the syncer drops it as already merged, and the learner must not send the
  // same steps again at its flush.
  RunConfig cfg = TinyConfig(SyncMode::kDecoupled, 1, 10);
  cfg.train.steps = 1;
  Fixture fx(cfg);
  fx.JoinAndStart();
  fx.Steps(0, 1);
  REQUIRE(fx.core->BeginFlush().ok());
  REQUIRE(fx.Deltas().size() == 1);
  SyncerStatusMsg st = AckStatus(fx, fx.Deltas().back().header.seq);
  st.recent_drops = {{LearnerName(0), 0, 0, std::string(kAlreadyMerged)}};
  REQUIRE(fx.Downlink(st).ok());
  CHECK(fx.core->Flushed());
  REQUIRE(fx.core->SendRemaining().ok());
  CHECK(fx.Deltas().size() == 1);  // nothing sent again
}

TEST_CASE("LearnerCore: in diloco mode the step after a send blocks until its Global arrives", "[unit]") {
  Fixture fx(TinyConfig(SyncMode::kDiloco, 1, 4));
  REQUIRE(fx.frags.size() == 1);
  fx.JoinAndStart();
  fx.MoveParameters(9);
  fx.Steps(0, 4);
  const auto deltas = fx.Deltas();
  REQUIRE(deltas.size() == 1);

  StepControl control;
  REQUIRE(fx.core->BeforeStep(4, &control).ok());
  CHECK_FALSE(control.stop);
  CHECK(fx.core->Blocked());
  CHECK(fx.core->BlockingFragment() == 0);
  // Time passes, a status without the Global: still blocked.
  fx.port.Advance(30);
  REQUIRE(fx.core->OnTimer().ok());
  REQUIRE(fx.PublishStatus({0}).ok());
  REQUIRE(fx.core->BeforeStep(4, &control).ok());
  CHECK(fx.core->Blocked());
  fx.port.Advance(40);

  REQUIRE(fx.PublishGlobalOf(deltas[0], 1).ok());
  CHECK_FALSE(fx.core->Blocked());
  CHECK(fx.core->result().globals_applied == 1);
  CHECK(fx.core->result().crc_mismatches == 0);
  REQUIRE(fx.core->BeforeStep(4, &control).ok());
  CHECK_FALSE(fx.core->Blocked());
  CHECK_FALSE(control.changed.empty());  // the folded fragment goes to the ring
  // The wait is counted from the first BeforeStep that blocked to the one after the Global.
  CHECK(fx.core->result().wait_s == Approx(0.070));
  REQUIRE(fx.core->result().blocked_unix_ms.size() == 1);
  CHECK(fx.core->result().blocked_unix_ms[0].second - fx.core->result().blocked_unix_ms[0].first == 70);
  // The host mirror of the base is the syncer's Θ (the CRC matched), and so is the backend's base.
  std::vector<float> base(fx.frags[0].numel);
  REQUIRE(fx.outer->ReadBase(0, base.data()).ok());
  CHECK(base == fx.global[0]);

  // The flush: the work left (the one step since the fold) goes at once, and the learner says it
  // is stopping; SendRemaining after has nothing more to send.
  fx.Steps(4, 5);
  REQUIRE(fx.core->BeginFlush().ok());
  CHECK(fx.Deltas().size() == 2);
  CHECK_FALSE(fx.core->Flushed());
  CHECK(fx.core->StateNow() == LearnerState::kStopping);
  REQUIRE(fx.core->SendRemaining().ok());
  CHECK(fx.Deltas().size() == 2);
  fx.port.Advance(fx.o.flush_timeout_ms + 1);
  CHECK(fx.core->Flushed());  // flush_timeout_ms gives up
  REQUIRE(fx.core->Finish().ok());
  CHECK(fx.port.beats.back().state == LearnerState::kFinished);
  CHECK_FALSE(fx.port.notes.empty());  // the last delta was not merged
}

TEST_CASE("LearnerCore: joining from a snapshot installs it before training", "[unit]") {
  Fixture fx(TinyConfig(SyncMode::kDecoupled, 2, 10));
  REQUIRE(fx.core->OnJoinTimer().ok());
  REQUIRE(fx.Welcome().ok());
  REQUIRE(fx.PublishStatus({3, 5}).ok());
  REQUIRE(fx.core->Start(true).ok());
  CHECK(fx.core->AwaitingSnapshot());
  CHECK(fx.core->StateNow() == LearnerState::kResyncing);
  const auto requests = fx.Sent(fx.port.dealer, MessageBit(MessageType::kHello) | MessageBit(MessageType::kSnapshotRequest));
  REQUIRE(requests.back().get<SnapshotRequestMsg>());
  const SnapshotRequestMsg rq = *requests.back().get<SnapshotRequestMsg>();
  CHECK(rq.reason == "join");

  // Unanswered, the request goes again after snapshot_retry_ms (and not before).
  const size_t sent = fx.port.dealer.size();
  fx.port.Advance(fx.o.snapshot_retry_ms);
  REQUIRE(fx.core->OnTimer().ok());
  CHECK(fx.port.dealer.size() == sent);
  fx.port.Advance(1);
  REQUIRE(fx.core->OnTimer().ok());
  REQUIRE(fx.port.dealer.size() == sent + 1);
  const uint64_t request_id = rq.request_id + 1;
  // Each part in starts the retry timer again (a large snapshot takes longer than it to arrive).
  fx.port.Advance(fx.o.snapshot_retry_ms / 2);

  const std::vector<uint64_t> versions = {3, 5};
  std::vector<std::vector<float>> values;
  for (int p = 0; p < 2; p++) {
    REQUIRE(fx.SnapshotPart(p, request_id, versions, 0, &values).ok());
    if (p == 0) {
      fx.port.Advance(fx.o.snapshot_retry_ms / 2 + fx.o.snapshot_retry_ms / 4);  // past the request's retry
      REQUIRE(fx.core->OnTimer().ok());
      CHECK(fx.port.dealer.size() == sent + 1);  // not asked again: the parts in are kept
    }
  }
  CHECK_FALSE(fx.core->AwaitingSnapshot());
  CHECK(fx.core->result().snapshots_installed == 1);
  REQUIRE(fx.core->BeginTraining().ok());
  CHECK(fx.core->progress().base_versions == versions);
  for (int p = 0; p < 2; p++) {
    std::vector<float> base(fx.frags[p].numel);
    REQUIRE(fx.outer->ReadBase(p, base.data()).ok());
    CHECK(base == values[p]);
  }
  StepControl control;
  REQUIRE(fx.core->BeforeStep(0, &control).ok());
  CHECK(control.changed.size() == fx.frags[0].ranges.size() + fx.frags[1].ranges.size());
}

// The step a learner of this mode starts at when it rejoins at start_step from a snapshot whose
// cadence is cadence_step (H = 10).
long RejoinStartStep(SyncMode mode, long start_step, uint64_t cadence_step) {
  Fixture fx(TinyConfig(mode, mode == SyncMode::kDiloco ? 1 : 2, 10));
  fx.o.start_step = start_step;
  fx.o.join_from_snapshot = true;
  fx.core = std::make_unique<LearnerCore>(fx.o, fx.ring->backend(0), *fx.outer, fx.frags, 0xC0DE, &fx.port);
  REQUIRE(fx.core->SetUp().ok());
  REQUIRE(fx.core->OnJoinTimer().ok());
  REQUIRE(fx.Welcome().ok());
  REQUIRE(fx.core->Start(true).ok());
  const auto requests =
      fx.Sent(fx.port.dealer, MessageBit(MessageType::kHello) | MessageBit(MessageType::kSnapshotRequest));
  REQUIRE(requests.back().get<SnapshotRequestMsg>());
  const uint64_t request_id = requests.back().get<SnapshotRequestMsg>()->request_id;
  std::vector<std::vector<float>> values;
  const std::vector<uint64_t> versions(fx.frags.size(), 4);
  for (int p = 0; p < (int)fx.frags.size(); p++)
    REQUIRE(fx.SnapshotPart(p, request_id, versions, cadence_step, &values).ok());
  REQUIRE_FALSE(fx.core->AwaitingSnapshot());
  return fx.core->StartStep();
}

// Two syncer shards (sync.syncers: 2): the learner joins both, sends each its fragments' deltas
// and every heartbeat, and assembles its snapshot from both, asking a slow shard again alone.
TEST_CASE("LearnerCore: with two syncer shards, joins both, routes deltas to owners, assembles the snapshot",
          "[unit]") {
  RunConfig cfg = TinyConfig(SyncMode::kDecoupled, 4, 8);
  cfg.sync.syncers = 2;
  Fixture fx(cfg);
  const ShardMap& shards = fx.core->shards();
  REQUIRE(shards.shards() == 2);
  REQUIRE(fx.core->OnJoinTimer().ok());
  CHECK(fx.port.dealer_shards == std::vector<int>{0, 1});  // a Hello to each
  CHECK(fx.port.uplink_shards == std::vector<int>{0, 1});  // a joining heartbeat to each
  fx.syncer_name = "syncer-0";
  REQUIRE(fx.Welcome().ok());
  REQUIRE(fx.PublishStatus({0, 0, 0, 0}).ok());
  CHECK_FALSE(fx.core->Joined());  // syncer-1 has not answered
  fx.syncer_name = "syncer-1";
  REQUIRE(fx.Welcome().ok());
  REQUIRE(fx.PublishStatus({0, 0, 0, 0}).ok());
  CHECK(fx.core->Joined());

  REQUIRE(fx.core->Start(true).ok());
  const size_t asked = fx.port.dealer.size();
  REQUIRE(fx.port.dealer_shards.size() == asked);
  CHECK(std::vector<int>(fx.port.dealer_shards.end() - 2, fx.port.dealer_shards.end()) == std::vector<int>{0, 1});
  const auto requests = fx.Sent(fx.port.dealer, MessageBit(MessageType::kHello) | MessageBit(MessageType::kSnapshotRequest));
  const uint64_t id0 = requests[asked - 2].get<SnapshotRequestMsg>()->request_id;
  // Shard s answers with its fragments' parts; what it says of the other shard's versions is ignored.
  std::vector<std::vector<float>> values(fx.frags.size());
  auto answer = [&](int s, uint64_t request_id, uint64_t version) {
    fx.syncer_name = shards.NameOf(s);
    const std::vector<uint32_t>& mine = shards.FragmentsOf(s);
    std::vector<uint64_t> versions(fx.frags.size(), 99);
    for (uint32_t p : mine) versions[p] = version;
    for (size_t i = 0; i < mine.size(); i++) {
      const uint32_t p = mine[i];
      std::vector<float> v = fx.global[p];
      for (float& x : v) x += 0.01f * (float)(s + 1);
      CodecOptions fp32;
      fp32.kind = CodecKind::kFp32;
      std::vector<uint8_t> payload;
      std::vector<uint64_t> tensor_bytes;
      REQUIRE(EncodeTensors(fp32, v, FragmentNumels(fx.frags[p]), &payload, &tensor_bytes).ok());
      SnapshotMsg sm;
      sm.request_id = request_id;
      sm.snapshot_id = 1;
      sm.part = (uint32_t)i;
      sm.num_parts = (uint32_t)mine.size();
      sm.fragment = p;
      sm.version = version;
      sm.versions = versions;
      sm.fragment_crc32c = Crc32c(v.data(), v.size() * sizeof(float));
      sm.payload = FragmentPayloadInfo(fx.frags[p], fp32, tensor_bytes);
      values[p] = v;
      REQUIRE(fx.Dealer(sm, payload).ok());
    }
  };
  answer(0, id0, 3);
  CHECK(fx.core->AwaitingSnapshot());
  // syncer-1 stays silent past the retry period: it alone is asked again.
  fx.port.Advance(fx.o.snapshot_retry_ms + 1);
  REQUIRE(fx.core->OnTimer().ok());
  REQUIRE(fx.port.dealer.size() == asked + 1);
  CHECK(fx.port.dealer_shards.back() == 1);
  const auto again = fx.Sent(fx.port.dealer, MessageBit(MessageType::kHello) | MessageBit(MessageType::kSnapshotRequest));
  answer(1, again.back().get<SnapshotRequestMsg>()->request_id, 7);
  CHECK_FALSE(fx.core->AwaitingSnapshot());
  CHECK(fx.core->result().snapshots_installed == 1);
  std::vector<uint64_t> want(fx.frags.size());
  for (size_t p = 0; p < fx.frags.size(); p++) {
    want[p] = shards.OwnerOf(p) == 0 ? 3 : 7;
    std::vector<float> base(fx.frags[p].numel);
    REQUIRE(fx.outer->ReadBase((int)p, base.data()).ok());
    CHECK(base == values[p]);
  }
  CHECK(fx.core->progress().base_versions == want);

  // Each fragment's delta goes to the shard that merges it; heartbeats to both.
  REQUIRE(fx.core->BeginTraining().ok());
  const size_t before = fx.port.uplink.size();
  fx.MoveParameters(5);
  fx.Steps(0, 8);
  const auto sent = fx.Sent(fx.port.uplink, MessageBit(MessageType::kDelta) | MessageBit(MessageType::kHeartbeat));
  int deltas = 0, beats[2] = {0, 0};
  for (size_t k = before; k < sent.size(); k++) {
    if (const DeltaMsg* d = sent[k].get<DeltaMsg>()) {
      deltas++;
      CHECK(fx.port.uplink_shards[k] == shards.OwnerOf(d->fragment));
    } else {
      beats[fx.port.uplink_shards[k]]++;
    }
  }
  CHECK(deltas == 4);  // every fragment fired once in 8 steps (H = 8)
  CHECK(beats[0] == beats[1]);
  CHECK(beats[0] > 0);
}

TEST_CASE("LearnerCore: rejoining from a snapshot, a learner takes the fleet's cadence", "[unit]") {
  // The fleet's cadence is at step 52 (H = 10); the learner resumes at its step 37. Lock-step: it
  // starts at the fleet's step. Decoupled: its own progress, moved forward into the phase of 52.
  CHECK(RejoinStartStep(SyncMode::kDiloco, 37, 52) == 52);
  CHECK(RejoinStartStep(SyncMode::kStreaming, 37, 52) == 52);
  CHECK(RejoinStartStep(SyncMode::kDecoupled, 37, 52) == 42);
  // Ahead of the cadence it moves forward too, never back: its earlier incarnation's deltas up to
  // its step may be merged already.
  CHECK(RejoinStartStep(SyncMode::kDecoupled, 55, 52) == 62);
  CHECK(RejoinStartStep(SyncMode::kDecoupled, 52, 52) == 52);
  // No cadence (no merge yet): its own step.
  CHECK(RejoinStartStep(SyncMode::kDecoupled, 37, 0) == 37);
}

TEST_CASE("LearnerCore: the same events at the same times send the same bytes", "[unit]") {
  auto run = [] {
    Fixture fx(TinyConfig(SyncMode::kDecoupled, 2, 4));
    fx.JoinAndStart();
    fx.MoveParameters(3);
    fx.Steps(0, 4);
    const auto deltas = fx.Deltas();
    REQUIRE(fx.PublishGlobalOf(deltas[0], 1).ok());
    fx.port.Advance(250);
    REQUIRE(fx.core->OnTimer().ok());
    fx.Steps(4, 8);
    REQUIRE(fx.core->BeginFlush().ok());
    REQUIRE(fx.core->SendRemaining().ok());
    REQUIRE(fx.core->Finish().ok());
    return std::make_pair(WireBytes(fx.port.uplink), WireBytes(fx.port.dealer));
  };
  const auto a = run(), b = run();
  CHECK(a.first.size() > 0);
  CHECK(a == b);
}

}  // namespace
}  // namespace diloco
