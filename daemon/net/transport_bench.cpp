#include "daemon/net/transport_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "daemon/net/channel.h"
#include "daemon/net/context.h"
#include "daemon/net/curve.h"
#include "daemon/net/envelope.h"
#include "daemon/net/wire_transport.h"

namespace diloco::net {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

struct Keys {
  CurveKeyPair server, client;
};

// One path (tcp, ipc or curve_tcp): a learner side and a syncer side, each with its own context
// (as two processes would have), the stack sockets and the raw sockets.
class PathBench {
 public:
  PathBench(const TransportBenchOptions& o, std::shared_ptr<std::vector<uint8_t>> payload)
      : o_(o), payload_(std::move(payload)) {}

  Status Setup(const std::string& name, const std::string& stack_bind, const std::string& raw_bind, const Keys* keys) {
    name_ = name;
    NetContextOptions co;
    co.io_threads = std::max(1, o_.io_threads / 2);
    DL_RETURN_IF_ERROR(NetContext::Create(co, &send_ctx_));
    DL_RETURN_IF_ERROR(NetContext::Create(co, &recv_ctx_));

    SocketOptions recv_opts, send_opts;
    recv_opts.name = "bench.syncer";
    send_opts.name = "bench.learner";
    recv_opts.recv_hwm_msgs = send_opts.send_hwm_msgs = 64;
    recv_opts.linger_ms = send_opts.linger_ms = 0;
    recv_opts.max_frame_bytes = kChunkBytes + (1 << 20);
    if (keys) {
      DL_RETURN_IF_ERROR(recv_ctx_->SetAllowlist("dilocod", {keys->client.public_z85}));
      recv_opts.curve = CurveOptions{keys->server.public_z85, keys->server.secret_z85, true, "dilocod", ""};
      send_opts.curve = CurveOptions{keys->client.public_z85, keys->client.secret_z85, false, "", keys->server.public_z85};
    } else {
      recv_opts.allow_plaintext = send_opts.allow_plaintext = true;
    }

    ParseOptions expect;
    expect.job_id = "bench";
    expect.model_params = payload_->size() / 4;
    expect.accept = MessageBit(MessageType::kDelta) | MessageBit(MessageType::kHeartbeat);
    expect.max_payload_bytes = payload_->size();
    parsed_ = std::make_shared<ParsedMessage>();
    ReceiveOptions ro;
    // ParseEnvelope, timed.
    Validator parse = o_.in_place ? EnvelopeValidatorInPlace(expect, parsed_) : EnvelopeValidator(expect, parsed_);
    ro.validator = [this, v = std::move(parse)](const Message& m, MessageMeta* meta) {
      const auto t0 = Clock::now();
      Status st = v(m, meta);
      last_parse_s_ = Seconds(t0, Clock::now());
      return st;
    };
    DL_RETURN_IF_ERROR(SubChannel::Create(*recv_ctx_, recv_opts, ro, &sub_));
    DL_RETURN_IF_ERROR(sub_->Bind(stack_bind));
    DL_RETURN_IF_ERROR(sub_->Subscribe("bench"));
    DL_RETURN_IF_ERROR(PubChannel::Create(*send_ctx_, send_opts, &pub_));
    DL_RETURN_IF_ERROR(pub_->Connect(sub_->endpoint()));
    DL_RETURN_IF_ERROR(Socket::Create(*recv_ctx_, SocketType::kPull, recv_opts, &pull_));
    DL_RETURN_IF_ERROR(pull_->Bind(raw_bind));
    DL_RETURN_IF_ERROR(Socket::Create(*send_ctx_, SocketType::kPush, send_opts, &push_));
    DL_RETURN_IF_ERROR(push_->Connect(pull_->endpoint()));

    // The message every run sends: one fp32 tensor over the whole payload.
    delta_.fragment = 0;
    delta_.base_version = 1;
    delta_.c_steps = 24;
    delta_.c_tokens = 24 * 4096;
    delta_.payload.codec = CodecKind::kFp32;
    delta_.payload.tensors = {{"all", 0, payload_->size() / 4, payload_->size()}};
    header_.job_id = "bench";
    header_.sender = "learner-0";
    header_.incarnation = 1;
    // The raw path sends the same frames: a header of the same size, then the chunks.
    DL_RETURN_IF_ERROR(Build(&raw_template_));

    // PUB/SUB joins asynchronously: heartbeats until one arrives.
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    for (;;) {
      HeartbeatMsg hb;
      OutgoingMessage out;
      EnvelopeHeader h = header_;
      h.seq = ++seq_;
      DL_RETURN_IF_ERROR(BuildMessage(h, hb, {}, &out));
      Message m = ToMessage(std::move(out), nullptr);
      pub_->Publish("bench", m);
      Received r;
      if (sub_->Receive(&r, 20) == RecvResult::kMessage) break;
      if (Clock::now() > deadline) return Status::Error(name + ": the subscriber never joined");
    }
    // Heartbeats still on the way (several go out while the subscription lands) would be taken
    // for the first delta: drain them.
    Received r;
    while (sub_->Receive(&r, 100) == RecvResult::kMessage) {
    }
    return Status::Ok();
  }

  // One delta, build to parsed. Returns seconds.
  Status StackOnce(double* seconds, double* build_s, double* parse_s) {
    const auto t0 = Clock::now();
    OutgoingMessage out;
    DL_RETURN_IF_ERROR(Build(&out));
    *build_s = Seconds(t0, Clock::now());
    Message m = ToMessage(std::move(out), payload_);
    if (pub_->Publish("bench", m) != SendResult::kSent) return Status::Error(name_ + ": publish failed");
    DL_RETURN_IF_ERROR(ReceiveDelta());
    *seconds = Seconds(t0, Clock::now());
    *parse_s = last_parse_s_;
    return Status::Ok();
  }

  Status RawOnce(double* seconds) {
    const auto t0 = Clock::now();
    Message m = RawMessage();
    if (push_->Send(m, 10000) != SendResult::kSent) return Status::Error(name_ + ": raw send failed");
    DL_RETURN_IF_ERROR(ReceiveRaw());
    *seconds = Seconds(t0, Clock::now());
    return Status::Ok();
  }

  // depth messages back to back: a sender thread builds and sends, this thread receives.
  Status StackStream(double* seconds) {
    const int depth = o_.stream_depth;
    Status send_status;
    const auto t0 = Clock::now();
    std::thread sender([&] {
      for (int i = 0; i < depth; ++i) {
        OutgoingMessage out;
        Status st = Build(&out);
        if (!st.ok()) {
          send_status = st;
          return;
        }
        Message m = ToMessage(std::move(out), payload_);
        if (pub_->Publish("bench", m) != SendResult::kSent) {
          send_status = Status::Error(name_ + ": publish failed");
          return;
        }
      }
    });
    Status st;
    for (int i = 0; i < depth && st.ok(); ++i) st = ReceiveDelta();
    sender.join();
    DL_RETURN_IF_ERROR(send_status);
    DL_RETURN_IF_ERROR(st);
    *seconds = Seconds(t0, Clock::now());
    return Status::Ok();
  }

  Status RawStream(double* seconds) {
    const int depth = o_.stream_depth;
    bool send_ok = true;
    const auto t0 = Clock::now();
    std::thread sender([&] {
      for (int i = 0; i < depth && send_ok; ++i) {
        Message m = RawMessage();
        send_ok = push_->Send(m, 10000) == SendResult::kSent;
      }
    });
    Status st;
    for (int i = 0; i < depth && st.ok(); ++i) st = ReceiveRaw();
    sender.join();
    if (!send_ok) return Status::Error(name_ + ": raw send failed");
    DL_RETURN_IF_ERROR(st);
    *seconds = Seconds(t0, Clock::now());
    return Status::Ok();
  }

  ~PathBench() {
    sub_.reset();
    pub_.reset();
    pull_.reset();
    push_.reset();
  }

 private:
  // Called from one thread at a time (the sender thread owns seq_ while streaming).
  Status Build(OutgoingMessage* out) {
    EnvelopeHeader h = header_;
    h.seq = ++seq_;
    delta_.learner_step = h.seq;
    return BuildMessage(h, delta_, *payload_, out);
  }

  Message RawMessage() {
    Message m;
    m.AddCopy(raw_template_.header.data(), raw_template_.header.size());
    for (const auto& c : raw_template_.chunks) m.AddShared(payload_, c.data(), c.size());
    return m;
  }

  Status ReceiveDelta() {
    Received r;
    const RecvResult rr = sub_->Receive(&r, 30000);
    if (rr != RecvResult::kMessage) return Status::Error(name_ + ": no delta received (" + ToString(rr) + ")");
    if (parsed_->type() != MessageType::kDelta || parsed_->payload_size() != payload_->size()) {
      return Status::Error(name_ + ": received something else than the delta");
    }
    // In place, let the frames go now, as a receiver does once it has decoded them (the copy's
    // buffer is reused): frames held across the next transfer would make it allocate fresh memory.
    parsed_->payload_chunks.clear();
    parsed_->payload_owner.reset();
    return Status::Ok();
  }

  Status ReceiveRaw() {
    Message got;
    const RecvResult rr = pull_->Receive(&got, 30000);
    if (rr != RecvResult::kMessage) return Status::Error(name_ + ": no raw message received (" + ToString(rr) + ")");
    if (got.bytes() != raw_template_.wire_bytes()) return Status::Error(name_ + ": raw message has the wrong size");
    return Status::Ok();
  }

  const TransportBenchOptions& o_;
  std::shared_ptr<std::vector<uint8_t>> payload_;
  std::string name_;
  std::unique_ptr<NetContext> send_ctx_, recv_ctx_;  // declared first: destroyed last
  std::unique_ptr<PubChannel> pub_;
  std::unique_ptr<SubChannel> sub_;
  std::unique_ptr<Socket> push_, pull_;
  std::shared_ptr<ParsedMessage> parsed_;
  EnvelopeHeader header_;
  DeltaMsg delta_;
  OutgoingMessage raw_template_;
  uint64_t seq_ = 0;
  double last_parse_s_ = 0;
};

Status RunPath(const TransportBenchOptions& o, std::shared_ptr<std::vector<uint8_t>> payload, const std::string& name,
               const std::string& stack_bind, const std::string& raw_bind, const Keys* keys, TransportBenchPath* row) {
  PathBench b(o, payload);
  DL_RETURN_IF_ERROR(b.Setup(name, stack_bind, raw_bind, keys));
  std::vector<double> stack, raw, stack_stream, raw_stream, build, parse;
  // One at a time first, then streams, each interleaved (alternating which goes first) so drift
  // hits stack and raw alike; the warm-up lets the allocator settle on reusing freed buffers.
  for (int i = 0; i < o.warmup + o.transfers; ++i) {
    double s, r, bs, ps;
    if (i % 2) {
      DL_RETURN_IF_ERROR(b.RawOnce(&r));
      DL_RETURN_IF_ERROR(b.StackOnce(&s, &bs, &ps));
    } else {
      DL_RETURN_IF_ERROR(b.StackOnce(&s, &bs, &ps));
      DL_RETURN_IF_ERROR(b.RawOnce(&r));
    }
    if (i < o.warmup) continue;
    stack.push_back(s);
    raw.push_back(r);
    build.push_back(bs);
    parse.push_back(ps);
  }
  for (int i = 0; o.stream_depth > 0 && i < std::min(o.warmup, 1) + o.transfers; ++i) {
    double ss, rs;
    if (i % 2) {
      DL_RETURN_IF_ERROR(b.RawStream(&rs));
      DL_RETURN_IF_ERROR(b.StackStream(&ss));
    } else {
      DL_RETURN_IF_ERROR(b.StackStream(&ss));
      DL_RETURN_IF_ERROR(b.RawStream(&rs));
    }
    if (i < std::min(o.warmup, 1)) continue;
    stack_stream.push_back(ss);
    raw_stream.push_back(rs);
  }
  const double bytes = static_cast<double>(payload->size());
  row->name = name;
  row->stack_ms = Median(stack) * 1e3;
  row->raw_ms = Median(raw) * 1e3;
  row->build_ms = Median(build) * 1e3;
  row->parse_ms = Median(parse) * 1e3;
  row->stack_GBps = bytes / Median(stack) / 1e9;
  row->raw_zmq_GBps = bytes / Median(raw) / 1e9;
  row->ratio = row->stack_GBps / row->raw_zmq_GBps;
  if (o.stream_depth > 0) {
    row->stack_stream_GBps = bytes * o.stream_depth / Median(stack_stream) / 1e9;
    row->raw_stream_GBps = bytes * o.stream_depth / Median(raw_stream) / 1e9;
    row->stream_ratio = row->stack_stream_GBps / row->raw_stream_GBps;
  }
  return Status::Ok();
}

}  // namespace

Status RunTransportBench(const TransportBenchOptions& o, std::vector<TransportBenchPath>* out) {
  if (o.payload_bytes < 4 || o.payload_bytes % 4 != 0) {
    return Status::Error("payload_bytes must be a positive multiple of 4 (fp32 values)");
  }
  if (o.transfers < 1 || o.warmup < 0 || o.stream_depth < 0) {
    return Status::Error("transfers must be >= 1, warmup and stream_depth >= 0");
  }
  auto payload = std::make_shared<std::vector<uint8_t>>(o.payload_bytes);
  std::mt19937 rng(1);
  std::normal_distribution<float> gauss(0.f, 1e-3f);
  for (size_t i = 0; i + 4 <= payload->size(); i += 4) {
    const float v = gauss(rng);
    std::memcpy(payload->data() + i, &v, 4);
  }

  std::string tmpl = (std::filesystem::temp_directory_path() / "dilocod_bench_XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) return Status::Error("cannot create a temp dir for ipc sockets");
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{tmpl};

  out->clear();
  TransportBenchPath row;
  DL_RETURN_IF_ERROR(RunPath(o, payload, "tcp", "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", nullptr, &row));
  out->push_back(row);
  DL_RETURN_IF_ERROR(
      RunPath(o, payload, "ipc", "ipc://" + tmpl + "/stack.sock", "ipc://" + tmpl + "/raw.sock", nullptr, &row));
  out->push_back(row);
  if (o.curve) {
    Keys keys;
    DL_RETURN_IF_ERROR(GenerateCurveKeyPair(&keys.server));
    DL_RETURN_IF_ERROR(GenerateCurveKeyPair(&keys.client));
    DL_RETURN_IF_ERROR(RunPath(o, payload, "curve_tcp", "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", &keys, &row));
    out->push_back(row);
  }
  return Status::Ok();
}

std::string TransportBenchJson(const std::vector<TransportBenchPath>& paths) {
  std::string s = "{";
  char buf[512];
  for (size_t i = 0; i < paths.size(); ++i) {
    const TransportBenchPath& p = paths[i];
    std::snprintf(buf, sizeof buf,
                  "%s\"%s\": {\"stack_GBps\": %.3f, \"raw_zmq_GBps\": %.3f, \"ratio\": %.3f, \"stack_ms\": %.2f, "
                  "\"raw_ms\": %.2f, \"build_ms\": %.2f, \"parse_ms\": %.2f, \"stack_stream_GBps\": %.3f, "
                  "\"raw_stream_GBps\": %.3f, \"stream_ratio\": %.3f}",
                  i ? ", " : "", p.name.c_str(), p.stack_GBps, p.raw_zmq_GBps, p.ratio, p.stack_ms, p.raw_ms, p.build_ms,
                  p.parse_ms, p.stack_stream_GBps, p.raw_stream_GBps, p.stream_ratio);
    s += buf;
  }
  return s + "}";
}

}  // namespace diloco::net
