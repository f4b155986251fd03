// Sample messages of every type for the wire tests (test_wire.cpp, test_wire_fuzz.cpp).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "daemon/net/envelope.h"
#include "daemon/util/crc32c.h"

namespace diloco::wire_test {

inline constexpr uint64_t kModelParams = 1 << 20;
inline constexpr char kJob[] = "job-7";

struct Sample {
  EnvelopeHeader header;
  MessageBody body;
  std::vector<uint8_t> payload;
};

inline ParseOptions SampleOptions() {
  ParseOptions o;
  o.job_id = kJob;
  o.model_params = kModelParams;
  o.max_fragments = 64;
  return o;
}

inline std::vector<std::span<const uint8_t>> Frames(const OutgoingMessage& m) {
  std::vector<std::span<const uint8_t>> f;
  f.push_back(m.header);
  for (const auto& c : m.chunks) f.push_back(c);
  return f;
}

inline std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

inline EnvelopeHeader Header(const std::string& sender, uint64_t seq) {
  EnvelopeHeader h;
  h.job_id = kJob;
  h.sender = sender;
  h.seq = seq;
  h.incarnation = 0x1234567890abcdefull;
  h.sent_unix_ms = 1764700000000ull + seq;
  return h;
}

// Dense tensors at the given (offset, numel) ranges; payload random of the right size.
inline PayloadInfo Dense(CodecKind codec, int block, std::vector<std::pair<uint64_t, uint64_t>> ranges) {
  PayloadInfo p;
  p.codec = codec;
  p.block_size = block;
  int i = 0;
  for (auto [offset, numel] : ranges) {
    std::string name = "t";  // (not "t" + ...: GCC 12 -O3 warns -Wrestrict on that)
    name += std::to_string(i++);
    name += ".weight";
    p.tensors.push_back({name, offset, numel, EncodedBytes(codec, numel, block)});
  }
  return p;
}

inline uint64_t PayloadSize(const PayloadInfo& p) {
  uint64_t n = 0;
  for (const auto& t : p.tensors) n += t.encoded_bytes;
  return n;
}

// One sample of every message type (payload messages in several codecs). `scale` multiplies
// the tensor sizes (1: a few KiB of payload).
inline std::vector<Sample> AllSamples(std::mt19937_64& rng, uint64_t scale = 1) {
  std::vector<Sample> s;
  uint64_t seq = 1;
  auto add = [&](const std::string& sender, MessageBody body) {
    Sample x{Header(sender, seq++), std::move(body), {}};
    if (const PayloadInfo* p = PayloadOf(x.body)) x.payload = RandomBytes(rng, PayloadSize(*p));
    if (auto* snap = std::get_if<SnapshotMsg>(&x.body)) {
      snap->fragment_crc32c = Crc32c(x.payload.data(), x.payload.size());
    }
    s.push_back(std::move(x));
  };

  HelloMsg hello;
  hello.tensor_table_digest = 0xfeedfacecafebeefull;
  hello.num_params = kModelParams;
  hello.param_dtype = ParamDType::kBf16;
  hello.num_fragments = 4;
  hello.fragment_layout_digest = 42;
  hello.build = "dilocod 0.1 (test)";
  add("learner-0", hello);

  WelcomeMsg welcome;
  welcome.result = JoinResult::kAccepted;
  welcome.learner = "learner-0";
  welcome.tensor_table_digest = 0xfeedfacecafebeefull;
  welcome.num_params = kModelParams;
  welcome.num_fragments = 4;
  welcome.versions = {3, 0, 7, 1};
  welcome.heartbeat_interval_ms = 500;
  welcome.heartbeat_timeout_ms = 1500;
  add("syncer", welcome);

  WelcomeMsg refused;
  refused.result = JoinResult::kTableMismatch;
  refused.reason = "tensor table digest 0x1 != 0x2: same model config on every site?";
  refused.learner = "learner-9";
  add("syncer", refused);

  HeartbeatMsg hb;
  hb.step = 1234;
  hb.tokens = 1234 * 8192;
  hb.loss = 2.25f;
  hb.tokens_per_s = 51234.5f;
  hb.step_time_ms = 160.25f;
  hb.interval_ms = 500;
  hb.fragments = {{0, 3, 24, 196608, true}, {1, 2, 17, 139264, false}, {3, 0, 5, 40960, false}};
  add("learner-1", hb);

  HeartbeatMsg hb0;  // first heartbeat: no loss yet, nothing per fragment
  hb0.state = LearnerState::kJoining;
  add("learner-2", hb0);

  DeltaMsg d4;
  d4.fragment = 2;
  d4.base_version = 7;
  d4.c_steps = 24;
  d4.c_tokens = 24 * 8192;
  d4.learner_step = 480;
  d4.payload = Dense(CodecKind::kInt4, 64, {{1000, 777 * scale}, {1000 + 777 * scale, 64 * scale}, {5000 * scale, 1}});
  add("learner-1", d4);

  DeltaMsg d8 = d4;
  d8.payload = Dense(CodecKind::kInt8, 128, {{0, 3000 * scale}});
  add("learner-2", d8);

  DeltaMsg dk = d4;  // top-k int4: sizes within the wire's bounds
  dk.payload.codec = CodecKind::kInt4;
  dk.payload.topk_fraction = 0.1;
  dk.payload.tensors = {{"wte", 0, 4096 * scale, 16 + 4096 * scale / 8 + EncodedBytes(CodecKind::kInt4, 410 * scale, 64)}};
  add("learner-3", dk);

  DeltaMsg dc = d4;  // topk_chunked, chunk 4096, keep 64, 2 bits: exact sizes (within the bounds)
  dc.payload.codec = CodecKind::kTopkChunked;
  dc.payload.block_size = 4096;
  dc.payload.tensors = {{"wte", 0, 10000 * scale, TopkChunkedBytes(10000 * scale, 4096, 64, 2)},
                        {"ln.b", 10000 * scale, 96, TopkChunkedBytes(96, 4096, 64, 2)}};
  add("learner-0", dc);

  GlobalMsg g;
  g.fragment = 2;
  g.version = 8;
  g.base_version = 7;
  g.fragment_crc32c = 0xdeadbeef;
  g.contributors = {{"learner-1", 7, 24, 196608, 0.75f}, {"learner-2", 6, 8, 65536, 0.25f}};
  g.payload = Dense(CodecKind::kInt8, 64, {{1000, 777 * scale}, {1000 + 777 * scale, 64 * scale}});
  add("syncer", g);

  GlobalMsg gf = g;
  gf.is_full = true;
  gf.base_version = 0;
  gf.contributors.clear();
  gf.payload = Dense(CodecKind::kFp32, 64, {{1000, 841 * scale}});
  add("syncer", gf);

  GlobalMsg gb = g;
  gb.payload = Dense(CodecKind::kBf16, 64, {{kModelParams - 100, 100}});
  add("syncer", gb);

  SnapshotRequestMsg req;
  req.request_id = 99;
  req.fragments = {0, 2, 3};
  req.reason = "gap in the global stream";
  add("learner-3", req);

  SnapshotMsg snap;
  snap.request_id = 99;
  snap.snapshot_id = 5;
  snap.part = 1;
  snap.num_parts = 3;
  snap.fragment = 2;
  snap.versions = {3, 0, 7, 1};
  snap.version = 7;
  snap.payload = Dense(CodecKind::kFp32, 64, {{1000, 300 * scale}, {2000 * scale, 12}});
  add("syncer", snap);

  JobSpecMsg job;
  job.config_yaml = "sync:\n  mode: decoupled\n  learners: 4\n";
  add("ctl", job);

  ControlMsg ctl;
  ctl.name = "chaos.partition";
  ctl.request_id = 17;
  ctl.args = {{"link", "site-a:site-s"}, {"on", "true"}, {"empty", ""}};
  add("ctl", ctl);

  SyncerStatusMsg st;
  st.versions = {3, 0, 7, 1};
  st.live_learners = {"learner-0", "learner-1"};
  st.live_steps = {120, 97};
  st.merges = 11;
  st.dropped_deltas = 2;
  st.recent_drops = {{"learner-3", 1, 0, "stale: base 0, current 4, max_staleness 2"}};
  add("syncer", st);
  return s;
}

}  // namespace diloco::wire_test
