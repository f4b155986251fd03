// SyncerCore (syncer_core.h) driven directly: a fake port records what the core publishes,
// replies, logs and reports; time is a hand-advanced clock; the learners' messages are real
// envelopes (BuildMessage, then ParseEnvelope as a runtime would).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/net/codec.h"
#include "daemon/net/envelope.h"
#include "daemon/net/wire_transport.h"
#include "daemon/sync/event_log.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/global_state.h"
#include "daemon/sync/merge.h"
#include "daemon/sync/protocol.h"
#include "daemon/sync/syncer_core.h"
#include "daemon/util/crc32c.h"
#include "kernels/gpt.h"
#include "kernels/rng.h"

namespace diloco {
namespace {

using std::chrono::milliseconds;

constexpr const char* kJob = "core-test";

// What the core did, in order, through its port; time is whatever the test sets.
class FakePort final : public SyncerPort {
 public:
  SyncTime now = SyncTime(std::chrono::seconds(1000));
  static constexpr int64_t kUnixStartMs = 1767225600000;

  SyncTime Now() override { return now; }
  int64_t UnixMs() override {
    return kUnixStartMs + std::chrono::duration_cast<milliseconds>(now.time_since_epoch()).count();
  }
  void Publish(net::Message&& m) override {
    calls.push_back("publish");
    published.push_back(std::move(m));
  }
  void Reply(const std::string& peer, net::Message&& m) override {
    calls.push_back("reply " + peer);
    replies.push_back(std::move(m));
  }
  Status LogUpdate(const UpdateRecord& record) override {
    calls.push_back("log");
    logged.push_back(record);
    return Status::Ok();
  }
  void OnMerge(const MergeEvent& event) override {
    calls.push_back("merge");
    merges.push_back(event);
  }
  void Checkpoint(const GlobalState&) override { checkpoints++; }
  void Note(const std::string& line) override { notes.push_back(line); }

  void Advance(int ms) { now += milliseconds(ms); }

  std::vector<std::string> calls;
  std::vector<net::Message> published, replies;
  std::vector<UpdateRecord> logged;
  std::vector<MergeEvent> merges;
  std::vector<std::string> notes;
  int checkpoints = 0;
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

// A tiny GPT, its fragments, Θ at version 0, and learners that speak to a core.
struct Fixture {
  SyncerOptions options;
  TensorTable table;
  std::vector<Fragment> fragments;
  GlobalState initial, state;
  FakePort port;
  std::unique_ptr<SyncerCore> core;
  std::map<int, uint64_t> seq;  // per learner, its main stream

  explicit Fixture(const SyncConfig& sync, uint64_t incarnation = 0x5eed, int shard = 0) {
    options.sync = sync;
    options.shard = shard;
    options.job_id = kJob;
    options.status_interval_ms = 0;  // SyncerStatus only when due (drops, gaps, Welcomes)
    table = gpt_tensor_table(GptConfig{.vocab_size = 64, .block_size = 8, .n_layer = 2, .n_embd = 16, .n_head = 2});
    REQUIRE(PartitionFragments(table, EffectiveFragments(sync), &fragments).ok());
    std::vector<float> params(table.total_numel());
    Rng rng(7);
    for (float& x : params) x = (float)(0.02 * rng.normal());
    initial = InitialGlobalState(table, fragments, params.data());
    state = initial;
    core = std::make_unique<SyncerCore>(options, fragments, &state, table, incarnation, &port);
  }

  static uint64_t Incarnation(int learner) { return 1000 + (uint64_t)learner; }

  // Builds learner's message as it would send it, parses it as the runtime would, hands it in.
  void Send(int learner, const MessageBody& body, const std::vector<uint8_t>& payload = {}) {
    EnvelopeHeader h;
    h.job_id = kJob;
    h.sender = LearnerName(learner);
    h.seq = ++seq[learner];
    h.incarnation = Incarnation(learner);
    h.sent_unix_ms = (uint64_t)port.UnixMs();
    OutgoingMessage om;
    REQUIRE(BuildMessage(h, body, payload, &om).ok());
    const net::Message msg = net::ToMessage(std::move(om), nullptr);
    ParseOptions expect;
    expect.job_id = kJob;
    expect.accept = MessageBit(MessageType::kDelta) | MessageBit(MessageType::kHeartbeat);
    expect.model_params = table.total_numel();
    ParsedMessage parsed;
    const auto spans = msg.spans();
    REQUIRE(ParseEnvelope(spans, expect, &parsed).ok());
    net::Received r;
    r.topic = kJob;
    r.seq.verdict = h.seq == 1 ? net::SeqVerdict::kFirst : net::SeqVerdict::kInOrder;
    core->OnUplink(r, parsed);
  }

  void Heartbeat(int learner, uint64_t step, float step_time_ms) {
    HeartbeatMsg hb;
    hb.state = LearnerState::kTraining;
    hb.step = step;
    hb.tokens = step * 64;
    hb.loss = 3.5f;
    hb.step_time_ms = step_time_ms;
    hb.interval_ms = 200;
    Send(learner, hb);
  }

  // A delta of fragment p on base_version, sent at learner_step (default: steps): small values
  // drawn from the learner's own seed.
  void Delta(int learner, uint32_t p, uint64_t base_version, uint64_t steps, uint64_t learner_step = 0) {
    const Fragment& f = fragments[p];
    std::vector<float> delta(f.numel);
    Rng rng(100 + learner * 17 + p);
    for (float& x : delta) x = (float)(0.001 * (learner + 1) * rng.normal());
    const CodecOptions codec = UplinkCodec(options.sync);
    std::vector<uint8_t> payload;
    std::vector<uint64_t> tensor_bytes;
    REQUIRE(EncodeTensors(codec, delta, FragmentNumels(f), &payload, &tensor_bytes).ok());
    DeltaMsg d;
    d.fragment = p;
    d.base_version = base_version;
    d.c_steps = steps;
    d.c_tokens = steps * 64;
    d.learner_step = learner_step > 0 ? learner_step : steps;
    d.payload = FragmentPayloadInfo(f, codec, tensor_bytes);
    Send(learner, d, payload);
  }

  // A request on the snapshot endpoint from learner (a Hello or a SnapshotRequest), as the
  // runtime hands it in; the core's answers land in port.replies.
  void Request(int learner, const MessageBody& body, MessageType type) {
    RequestAs(LearnerName(learner), Incarnation(learner), "", body, type);
  }
  // The same from any sender (another syncer shard), with the CURVE key it came with.
  void RequestAs(const std::string& sender, uint64_t incarnation, const std::string& peer_key, const MessageBody& body,
                 MessageType type) {
    EnvelopeHeader h;
    h.job_id = kJob;
    h.sender = sender;
    h.seq = 1;
    h.incarnation = incarnation;
    OutgoingMessage om;
    REQUIRE(BuildMessage(h, body, {}, &om).ok());
    const net::Message msg = net::ToMessage(std::move(om), nullptr);
    ParseOptions expect;
    expect.job_id = kJob;
    expect.accept = MessageBit(type);
    ParsedMessage parsed;
    const auto spans = msg.spans();
    REQUIRE(ParseEnvelope(spans, expect, &parsed).ok());
    net::Received r;
    r.peer = "peer-" + sender;
    r.peer_key = peer_key;
    REQUIRE(core->OnRequest(r, parsed).ok());
  }

  // The core's replies from `first` on, parsed as a learner would (each must be a `type`).
  std::vector<ParsedMessage> Replies(MessageType type, size_t first = 0) const {
    ParseOptions back;
    back.job_id = kJob;
    back.accept = MessageBit(type);
    back.model_params = table.total_numel();
    std::vector<ParsedMessage> out;
    for (size_t i = first; i < port.replies.size(); i++) {
      ParsedMessage parsed;
      const auto spans = port.replies[i].spans();
      REQUIRE(ParseEnvelope(spans, back, &parsed).ok());
      out.push_back(std::move(parsed));
    }
    return out;
  }

  // The messages the core published, parsed as a learner would.
  std::vector<ParsedMessage> Published() const {
    ParseOptions expect;
    expect.job_id = kJob;
    expect.accept = MessageBit(MessageType::kGlobal) | MessageBit(MessageType::kSyncerStatus);
    expect.model_params = table.total_numel();
    std::vector<ParsedMessage> out;
    for (const net::Message& m : port.published) {
      ParsedMessage parsed;
      const auto spans = m.spans();
      REQUIRE(ParseEnvelope(spans, expect, &parsed).ok());
      out.push_back(std::move(parsed));
    }
    return out;
  }

  // Decide once, as a runtime's timer would; returns the core's next wake.
  SyncTime Timer() {
    SyncTime wake = SyncTime::max();
    REQUIRE(core->OnTimer(&wake).ok());
    return wake;
  }
};

SyncConfig Decoupled(int learners, int quorum) {
  SyncConfig s;
  s.mode = SyncMode::kDecoupled;
  s.learners = learners;
  s.quorum = quorum;
  s.fragments = 2;
  s.inner_steps = 10;
  s.grace.forecast = false;  // the window from step times alone (forecasts are RoundBook's tests)
  s.merge_threads = 1;
  s.checkpoint_every = 1;
  return s;
}

TEST_CASE("SyncerCore: a quorum-1 round merges on arrival and publishes version 1", "[unit]") {
  SyncConfig s = Decoupled(2, 1);
  s.grace.cap_ms = 0;  // no grace window: the quorum closes the round
  Fixture fx(s);
  fx.Heartbeat(0, 10, 50);
  fx.Heartbeat(1, 10, 50);
  fx.port.Advance(5);
  CHECK(fx.Timer() == SyncTime::max());  // nothing pending, no status timer: only news wake it
  CHECK(fx.port.published.empty());

  fx.Delta(0, 0, 0, 10);
  CHECK(fx.port.merges.empty());  // arrivals only record; the timer decides
  fx.Timer();

  REQUIRE(fx.port.merges.size() == 1);
  const MergeEvent& ev = fx.port.merges[0];
  CHECK(ev.fragment == 0);
  CHECK(ev.version == 1);
  CHECK(ev.reason == "no_grace");
  REQUIRE(ev.contributors.size() == 1);
  CHECK(ev.contributors[0].learner == 0);
  CHECK(ev.time_ms == fx.port.UnixMs());
  // Durable before it is published; the checkpoint comes after the merge.
  CHECK(fx.port.calls == std::vector<std::string>{"log", "publish", "merge"});
  CHECK(fx.port.checkpoints == 1);
  REQUIRE(fx.port.logged.size() == 1);
  CHECK(fx.port.logged[0].version == 1);
  CHECK(fx.port.logged[0].fragment == 0);

  const std::vector<ParsedMessage> out = fx.Published();
  REQUIRE(out.size() == 1);
  const GlobalMsg* g = out[0].get<GlobalMsg>();
  REQUIRE(g != nullptr);
  CHECK(out[0].header.sender == kSyncerName);
  CHECK(out[0].header.incarnation == 0x5eed);
  CHECK(out[0].header.seq == 1);
  CHECK(g->fragment == 0);
  CHECK(g->version == 1);
  CHECK(g->base_version == 0);
  REQUIRE(g->contributors.size() == 1);
  CHECK(g->contributors[0].learner == "learner-0");
  CHECK(g->contributors[0].c_steps == 10);
  CHECK(g->contributors[0].weight == Approx(1.0f));
  CHECK(fx.state.fragments[0].version == 1);
  CHECK(fx.state.fragments[1].version == 0);
  CHECK(fx.state.merges == 1);

  // A learner holding version 0 that applies the Global's update lands on the CRC it names.
  std::vector<float> update;
  REQUIRE(DecodeFragmentPayload(fx.fragments[0], g->payload, out[0], &update).ok());
  std::vector<float> theta = fx.initial.fragments[0].theta;
  ApplyUpdate(update.data(), update.size(), theta.data());
  CHECK(Crc32c(theta.data(), theta.size() * sizeof(float)) == g->fragment_crc32c);
  CHECK(g->fragment_crc32c ==
        Crc32c(fx.state.fragments[0].theta.data(), fx.state.fragments[0].theta.size() * sizeof(float)));
  CHECK(fx.core->counters().bytes_published == fx.port.published[0].bytes());
}

TEST_CASE("SyncerCore: quorum 2 waits out the grace window, then merges", "[unit]") {
  SyncConfig s = Decoupled(3, 2);
  s.overlap = 2;
  s.grace.gamma = 0.5;
  s.grace.cap_ms = 2000;
  Fixture fx(s);
  const SyncTime t0 = fx.port.now;
  // Step time 1000 ms: window = γ·τ·ξ_step = 0.5 · 2 · 1000 ms (no quorum or merge time yet).
  for (int l = 0; l < 3; l++) fx.Heartbeat(l, 10, 1000);
  fx.port.Advance(10);
  fx.Delta(0, 1, 0, 10);
  // Below quorum: decide again when a missing learner would stop counting as live.
  CHECK(fx.Timer() == t0 + milliseconds(s.heartbeat_timeout_ms) + SyncClock::duration(1));
  fx.port.Advance(10);
  fx.Delta(1, 1, 0, 10);
  const SyncTime grace_end = t0 + milliseconds(20 + 1000);
  CHECK(fx.Timer() == grace_end);
  CHECK(fx.port.merges.empty());

  fx.port.now = t0 + milliseconds(500);
  CHECK(fx.Timer() == grace_end);
  fx.port.now = grace_end - milliseconds(1);
  CHECK(fx.Timer() == grace_end);
  CHECK(fx.port.merges.empty());
  CHECK(fx.port.published.empty());

  fx.port.now = grace_end;
  CHECK(fx.Timer() == SyncTime::max());
  REQUIRE(fx.port.merges.size() == 1);
  const MergeEvent& ev = fx.port.merges[0];
  CHECK(ev.fragment == 1);
  CHECK(ev.version == 1);
  CHECK(ev.reason == "grace_expired");
  CHECK(ev.grace_ms == Approx(1000));
  REQUIRE(ev.contributors.size() == 2);
  CHECK(ev.contributors[0].learner == 0);
  CHECK(ev.contributors[1].learner == 1);
  const std::vector<ParsedMessage> out = fx.Published();
  REQUIRE(out.size() == 1);
  const GlobalMsg* g = out[0].get<GlobalMsg>();
  REQUIRE(g != nullptr);
  REQUIRE(g->contributors.size() == 2);
  CHECK(g->contributors[0].learner == "learner-0");
  CHECK(g->contributors[1].learner == "learner-1");
  // ξ_quorum (10 ms between the two arrivals) and ξ_sync (0: the fake clock stood still) are in.
  CHECK(fx.core->timings().quorum_ms.value() == Approx(10));
  CHECK(fx.core->timings().sync_ms.has_value());
}

TEST_CASE("SyncerCore: a syncer shard merges its own fragments, signs as its shard, serves their snapshot",
          "[unit]") {
  SyncConfig s = Decoupled(2, 1);
  s.grace.cap_ms = 0;
  s.fragments = 4;
  s.syncers = 2;
  Fixture fx(s, 0x5eed, /*shard=*/1);
  const ShardMap shards = ShardMap::Of(fx.fragments, 2);
  const std::vector<uint32_t> mine = shards.FragmentsOf(1);
  const uint32_t theirs = shards.FragmentsOf(0).front();
  REQUIRE(mine.size() >= 1);
  CHECK(fx.core->name() == "syncer-1");
  fx.Heartbeat(0, 10, 50);
  fx.Delta(0, theirs, 0, 10);  // shard 0's fragment: a learner with another sync.syncers
  fx.Delta(0, mine[0], 0, 10);
  fx.Timer();
  REQUIRE(fx.port.merges.size() == 1);
  CHECK(fx.port.merges[0].fragment == (int)mine[0]);
  CHECK(fx.state.fragments[theirs].version == 0);
  CHECK(fx.state.rejected_deltas == 1);
  REQUIRE_FALSE(fx.port.notes.empty());
  CHECK_THAT(fx.port.notes.front(),
             Catch::Contains("fragment " + std::to_string(theirs) + ", which syncer-0 merges"));
  const std::vector<ParsedMessage> out = fx.Published();
  REQUIRE(out.size() == 1);
  CHECK(out[0].header.sender == "syncer-1");

  // A snapshot request listing no fragments gets this shard's, cut at its versions.
  SnapshotRequestMsg rq;
  rq.request_id = 9;
  fx.Request(0, rq, MessageType::kSnapshotRequest);
  std::vector<uint32_t> served;
  for (const ParsedMessage& part : fx.Replies(MessageType::kSnapshot)) {
    CHECK(part.header.sender == "syncer-1");
    served.push_back(part.get<SnapshotMsg>()->fragment);
    CHECK(part.get<SnapshotMsg>()->num_parts == mine.size());
  }
  CHECK(served == mine);
}

// A dilocod job's home shard takes the other shards' final fragments (shard_fetch.h): only once
// the shard is final (Flush ran), only with the home site's key.
TEST_CASE("SyncerCore: a shard hands its final fragments to the home shard, and only then", "[unit]") {
  SyncConfig s = Decoupled(2, 1);
  s.fragments = 4;
  s.syncers = 2;
  Fixture fx(s, 0x5eed, /*shard=*/1);
  fx.options.home_key = "HOME-KEY";
  fx.core = std::make_unique<SyncerCore>(fx.options, fx.fragments, &fx.state, fx.table, 0x5eed, &fx.port);
  const std::vector<uint32_t> mine = ShardMap::Of(fx.fragments, 2).FragmentsOf(1);
  SnapshotRequestMsg rq;
  rq.request_id = 3;
  fx.RequestAs("syncer-0", 77, "HOME-KEY", rq, MessageType::kSnapshotRequest);
  CHECK(fx.port.replies.empty());  // still merging: the home asks again
  REQUIRE(fx.core->Flush().ok());
  fx.RequestAs("syncer-0", 77, "ANOTHER-KEY", rq, MessageType::kSnapshotRequest);
  CHECK(fx.port.replies.empty());  // not the home site's key
  REQUIRE_FALSE(fx.port.notes.empty());
  CHECK_THAT(fx.port.notes.back(), Catch::Contains("naming syncer-0 sent with key ANOTHER-KEY"));
  fx.RequestAs("syncer-0", 77, "HOME-KEY", rq, MessageType::kSnapshotRequest);
  std::vector<uint32_t> served;
  for (const ParsedMessage& part : fx.Replies(MessageType::kSnapshot)) served.push_back(part.get<SnapshotMsg>()->fragment);
  CHECK(served == mine);
  CHECK(fx.core->counters().home_fetches == 1);
}

TEST_CASE("SyncerCore: Hello is answered busy until the learner's uplink is heard", "[unit]") {
  Fixture fx(Decoupled(2, 1));
  HelloMsg hello;
  hello.tensor_table_digest = fx.table.digest();
  hello.num_params = fx.table.total_numel();
  hello.num_fragments = (uint32_t)fx.fragments.size();
  hello.fragment_layout_digest = FragmentsDigest(fx.fragments);
  auto ask = [&] {
    fx.Request(1, hello, MessageType::kHello);
    const ParsedMessage answer = std::move(fx.Replies(MessageType::kWelcome, fx.port.replies.size() - 1).back());
    REQUIRE(answer.get<WelcomeMsg>() != nullptr);
    return *answer.get<WelcomeMsg>();
  };
  CHECK(ask().result == JoinResult::kBusy);
  CHECK(fx.port.published.empty());
  fx.Heartbeat(1, 0, 0);
  const WelcomeMsg w = ask();
  CHECK(w.result == JoinResult::kAccepted);
  CHECK(w.versions == std::vector<uint64_t>(fx.fragments.size(), 0));
  // An accepted Welcome is followed by a status on the downlink (both directions are up).
  CHECK(fx.port.calls.back() == "publish");
  const std::vector<ParsedMessage> out = fx.Published();
  REQUIRE(out.size() == 1);
  REQUIRE(out[0].get<SyncerStatusMsg>() != nullptr);
  CHECK(out[0].get<SyncerStatusMsg>()->live_learners == std::vector<std::string>{"learner-1"});
  CHECK(fx.core->counters().welcomes == 1);
  // A different model is refused, with a reason the learner can act on.
  hello.num_params++;
  CHECK(ask().result == JoinResult::kTableMismatch);
  CHECK(fx.core->counters().refusals == 1);
  REQUIRE(fx.port.notes.size() == 1);
  CHECK(fx.port.notes[0].find("refused learner-1: model differs") == 0);
}

// Three learners over two fragments: rounds closed by quorum, by grace, a stale delta dropped
// (a status names it), the flush at the end. Everything that left the core, as bytes.
std::vector<uint8_t> Scenario() {
  SyncConfig s = Decoupled(3, 2);
  s.grace.cap_ms = 300;
  s.max_staleness = 0;
  Fixture fx(s);
  for (int l = 0; l < 3; l++) fx.Heartbeat(l, 10, 100);
  fx.port.Advance(3);
  fx.Delta(2, 0, 0, 10);
  fx.port.Advance(4);
  fx.Delta(0, 0, 0, 10);
  fx.Delta(1, 1, 0, 10);
  fx.Timer();
  fx.port.Advance(7);
  fx.Delta(1, 0, 0, 10);  // all live in: merges now
  fx.Timer();
  fx.Delta(2, 1, 0, 12);
  fx.port.Advance(400);
  for (int l = 0; l < 3; l++) fx.Heartbeat(l, 20, 100);
  fx.Timer();  // fragment 1: grace expired
  fx.Delta(0, 0, 0, 20);  // base 0, current 1: too stale (max_staleness 0)
  fx.Delta(1, 0, 1, 10, 20);
  fx.port.Advance(11);
  fx.Timer();  // the drop goes out in a status
  REQUIRE(fx.core->Flush().ok());
  REQUIRE(fx.port.merges.size() == 3);
  CHECK(fx.port.merges[1].reason == "grace_expired");
  CHECK(fx.port.merges[2].reason == "flush");
  CHECK(fx.state.dropped_deltas == 1);
  std::vector<uint8_t> bytes = WireBytes(fx.port.published);
  for (const MergeEvent& ev : fx.port.merges) {
    const std::string line = MergeEventToJson(ev).dump();
    bytes.insert(bytes.end(), line.begin(), line.end());
  }
  for (const FragmentGlobal& f : fx.state.fragments) {
    const auto* b = reinterpret_cast<const uint8_t*>(f.theta.data());
    bytes.insert(bytes.end(), b, b + f.theta.size() * sizeof(float));
  }
  return bytes;
}

TEST_CASE("SyncerCore: the same events give the same bytes", "[unit]") {
  const std::vector<uint8_t> first = Scenario();
  const std::vector<uint8_t> second = Scenario();
  CHECK(first.size() > 1000);
  CHECK(first == second);
}

}  // namespace
}  // namespace diloco
