// Wire bytes are frozen: one message of every kind, every field set, built with fixed values,
// must give the same frame 0 (FlatBuffer + CRC32C) byte for byte as the bytes recorded in
// tests/fixtures/wire_golden.txt (written by the v1 hand-written builder). A change in how
// messages are written (a generator, a field order, a default) that moves one byte fails here.
// To record after an intended protocol change: DILOCO_RECORD_GOLDEN=1 net_wire_tests "[golden]"
// prints the fixture on stdout.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "daemon/net/envelope.h"
#include "daemon/util/crc32c.h"

namespace diloco {
namespace {

struct Golden {
  std::string name;
  EnvelopeHeader header;
  MessageBody body;
  std::vector<uint8_t> payload;
};

EnvelopeHeader FixedHeader(const std::string& sender, uint64_t seq) {
  EnvelopeHeader h;
  h.job_id = "job-golden";
  h.sender = sender;
  h.seq = seq;
  h.incarnation = 0x0123456789abcdefull;
  h.sent_unix_ms = 1764700000000ull + seq;
  return h;
}

std::vector<uint8_t> Pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + 7);
  return v;
}

uint64_t Sum(const PayloadInfo& p) {
  uint64_t n = 0;
  for (const auto& t : p.tensors) n += t.encoded_bytes;
  return n;
}

std::vector<Golden> Messages() {
  std::vector<Golden> out;
  uint64_t seq = 1;
  auto add = [&](const std::string& name, const std::string& sender, MessageBody body) {
    Golden g{name, FixedHeader(sender, seq++), std::move(body), {}};
    if (const PayloadInfo* p = PayloadOf(g.body)) g.payload = Pattern(Sum(*p));
    if (auto* s = std::get_if<SnapshotMsg>(&g.body)) {
      s->fragment_crc32c = Crc32c(g.payload.data(), g.payload.size());
    }
    out.push_back(std::move(g));
  };

  HelloMsg hello;
  hello.role = PeerRole::kDaemon;
  hello.tensor_table_digest = 0xfeedfacecafebeefull;
  hello.num_params = 1 << 20;
  hello.param_dtype = ParamDType::kBf16;
  hello.num_fragments = 3;
  hello.fragment_layout_digest = 0x1122334455667788ull;
  hello.build = "dilocod golden";
  add("hello", "learner-0", hello);
  add("hello-default", "learner-0", HelloMsg{});

  WelcomeMsg welcome;
  welcome.result = JoinResult::kAccepted;
  welcome.reason = "welcome back";
  welcome.learner = "learner-0";
  welcome.tensor_table_digest = 0xfeedfacecafebeefull;
  welcome.num_params = 1 << 20;
  welcome.param_dtype = ParamDType::kBf16;
  welcome.num_fragments = 3;
  welcome.fragment_layout_digest = 0x1122334455667788ull;
  welcome.versions = {4, 0, 9};
  welcome.heartbeat_interval_ms = 500;
  welcome.heartbeat_timeout_ms = 1500;
  add("welcome", "syncer", welcome);
  WelcomeMsg refused;
  refused.result = JoinResult::kLayoutMismatch;
  refused.reason = "fragment layout differs";
  refused.learner = "learner-9";
  add("welcome-refused", "syncer", refused);

  HeartbeatMsg hb;
  hb.state = LearnerState::kResyncing;
  hb.step = 1234;
  hb.tokens = 1234 * 8192;
  hb.loss = 2.25f;
  hb.tokens_per_s = 51234.5f;
  hb.step_time_ms = 160.25f;
  hb.interval_ms = 500;
  hb.fragments = {{0, 3, 24, 196608, true}, {2, 2, 17, 139264, false}};
  add("heartbeat", "learner-1", hb);
  add("heartbeat-default", "learner-1", HeartbeatMsg{});

  DeltaMsg delta;
  delta.fragment = 2;
  delta.base_version = 7;
  delta.c_steps = 24;
  delta.c_tokens = 24 * 8192;
  delta.learner_step = 480;
  delta.payload.codec = CodecKind::kInt8;
  delta.payload.block_size = 128;
  delta.payload.tensors = {{"h.0.attn", 100, 300, EncodedBytes(CodecKind::kInt8, 300, 128)},
                           {"", 500, 64, EncodedBytes(CodecKind::kInt8, 64, 128)}};
  add("delta", "learner-1", delta);
  DeltaMsg topk = delta;
  topk.payload.codec = CodecKind::kInt4;
  topk.payload.block_size = 64;
  topk.payload.topk_fraction = 0.125;
  topk.payload.tensors = {{"wte", 0, 4096, 16 + 4096 / 8 + EncodedBytes(CodecKind::kInt4, 512, 64)}};
  add("delta-topk", "learner-2", topk);
  DeltaMsg big = delta;  // two payload frames
  big.payload.codec = CodecKind::kFp32;
  big.payload.block_size = 64;
  big.payload.tensors = {{"wte", 0, 1200000, 4 * 1200000}};
  add("delta-2-chunks", "learner-3", big);

  GlobalMsg global;
  global.fragment = 1;
  global.version = 8;
  global.base_version = 7;
  global.fragment_crc32c = 0xdeadbeef;
  global.contributors = {{"learner-1", 7, 24, 196608, 0.75f}, {"learner-2", 6, 8, 65536, 0.25f}};
  global.payload.codec = CodecKind::kBf16;
  global.payload.block_size = 64;
  global.payload.tensors = {{"ln.w", 10, 77, 2 * 77}};
  add("global", "syncer", global);
  GlobalMsg full = global;
  full.is_full = true;
  full.base_version = 0;
  full.contributors.clear();
  add("global-full", "syncer", full);

  SnapshotRequestMsg req;
  req.request_id = 99;
  req.fragments = {0, 2};
  req.reason = "gap in the global stream";
  add("snapshot-request", "learner-3", req);

  SnapshotMsg snap;
  snap.request_id = 99;
  snap.snapshot_id = 5;
  snap.part = 1;
  snap.num_parts = 2;
  snap.fragment = 2;
  snap.versions = {3, 0, 7};
  snap.version = 7;
  snap.payload.codec = CodecKind::kFp32;
  snap.payload.block_size = 64;
  snap.payload.tensors = {{"a", 1000, 30, 120}, {"b", 2000, 12, 48}};
  add("snapshot", "syncer", snap);

  JobSpecMsg job;
  job.config_yaml = "sync:\n  mode: decoupled\n";
  add("job-spec", "ctl", job);

  ControlMsg ctl;
  ctl.name = "chaos.partition";
  ctl.request_id = 17;
  ctl.args = {{"link", "site-a:site-s"}, {"empty", ""}};
  add("control", "ctl", ctl);

  SyncerStatusMsg st;
  st.versions = {3, 0, 7};
  st.live_learners = {"learner-0", "learner-1"};
  st.merges = 11;
  st.dropped_deltas = 2;
  st.recent_drops = {{"learner-3", 1, 0, "stale"}};
  st.acks = {{"learner-0", 77, 12, {1, 2}, {5, 6}}, {"learner-1", 78, 0, {}, {}}};
  st.live_steps = {120, 97};
  add("syncer-status", "syncer", st);
  add("syncer-status-default", "syncer", SyncerStatusMsg{});
  return out;
}

std::string Hex(const std::vector<uint8_t>& v) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : v) {
    s += kDigits[b >> 4];
    s += kDigits[b & 15];
  }
  return s;
}

// One line per message: name, number of frames, frame 0 in hex.
std::string Line(const Golden& g, const OutgoingMessage& m) {
  return g.name + " " + std::to_string(m.num_frames()) + " " + Hex(m.header);
}

TEST_CASE("every message kind is written with the recorded v1 bytes", "[net][unit][golden]") {
  std::vector<std::string> lines;
  for (const Golden& g : Messages()) {
    OutgoingMessage m;
    Status st = BuildMessage(g.header, g.body, g.payload, &m);
    INFO(g.name << ": " << st.message());
    REQUIRE(st.ok());
    // The payload frames are the payload itself, cut at 4 MiB.
    size_t pos = 0;
    for (const auto& c : m.chunks) {
      REQUIRE(c.data() == g.payload.data() + pos);
      pos += c.size();
    }
    CHECK(pos == g.payload.size());
    lines.push_back(Line(g, m));
  }
  if (std::getenv("DILOCO_RECORD_GOLDEN") != nullptr) {
    for (const auto& l : lines) std::printf("%s\n", l.c_str());
    return;
  }
  const std::string path = std::string(DILOCO_SOURCE_DIR) + "/tests/fixtures/wire_golden.txt";
  std::ifstream in(path);
  REQUIRE(in.good());
  std::vector<std::string> want;
  for (std::string l; std::getline(in, l);) {
    if (!l.empty() && l[0] != '#') want.push_back(l);
  }
  REQUIRE(want.size() == lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    INFO(path << " line for " << want[i].substr(0, want[i].find(' ')));
    CHECK(lines[i] == want[i]);
  }
}

}  // namespace
}  // namespace diloco
