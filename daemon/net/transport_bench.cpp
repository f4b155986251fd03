#include "daemon/net/transport_bench.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <latch>
#include <map>
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

// CPU seconds of every thread of this process (both ends of the bench, their I/O threads and
// the kernel's copies on their behalf): where it nears 2 × wall on 2 cores, the transfer is
// bound by CPU and any extra pass over the bytes shows in the wall time.
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Keys {
  CurveKeyPair server, client;
};

// One learner: its own context (one I/O thread, as a learner process has for its uplink), a PUB
// for the stack path and a PUSH for the raw one.
struct Sender {
  std::unique_ptr<NetContext> ctx;  // declared first: destroyed last
  std::unique_ptr<PubChannel> pub;
  std::unique_ptr<Socket> push;
  EnvelopeHeader header;
  OutgoingMessage raw_template;  // the raw path sends the same frames: this header, then the chunks
  uint64_t seq = 0;
};

// One path (tcp, ipc or curve_tcp): `senders` learner sides and a syncer side, each with its own
// context (as separate processes would have), the stack sockets and the raw sockets. Sender 0
// alone makes the one-at-a-time and stream figures.
class PathBench {
 public:
  PathBench(const TransportBenchOptions& o, std::shared_ptr<std::vector<uint8_t>> payload)
      : o_(o), payload_(std::move(payload)) {}

  Status Setup(const std::string& name, const std::string& stack_bind, const std::string& raw_bind, const Keys* keys) {
    name_ = name;
    NetContextOptions co;
    co.io_threads = io_threads();
    DL_RETURN_IF_ERROR(NetContext::Create(co, &recv_ctx_));

    SocketOptions recv_opts, send_opts;
    recv_opts.name = "bench.syncer";
    send_opts.name = "bench.learner";
    // The daemon's uplink queues: a stream of chunked deltas must not be dropped by PUB.
    recv_opts.recv_hwm_msgs = send_opts.send_hwm_msgs = kUplinkHwmMsgs;
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
    DL_RETURN_IF_ERROR(Socket::Create(*recv_ctx_, SocketType::kPull, recv_opts, &pull_));
    DL_RETURN_IF_ERROR(pull_->Bind(raw_bind));

    // The message every run sends: one fp32 tensor over the whole payload.
    delta_.fragment = 0;
    delta_.base_version = 1;
    delta_.c_steps = 24;
    delta_.c_tokens = 24 * 4096;
    delta_.payload.codec = CodecKind::kFp32;
    delta_.payload.tensors = {{"all", 0, payload_->size() / 4, payload_->size()}};

    NetContextOptions sender_co;
    sender_co.io_threads = 1;
    for (int i = 0; i < o_.senders; ++i) {
      auto s = std::make_unique<Sender>();
      DL_RETURN_IF_ERROR(NetContext::Create(sender_co, &s->ctx));
      DL_RETURN_IF_ERROR(PubChannel::Create(*s->ctx, send_opts, &s->pub));
      DL_RETURN_IF_ERROR(s->pub->Connect(sub_->endpoint()));
      DL_RETURN_IF_ERROR(Socket::Create(*s->ctx, SocketType::kPush, send_opts, &s->push));
      DL_RETURN_IF_ERROR(s->push->Connect(pull_->endpoint()));
      s->header.job_id = "bench";
      s->header.sender = "learner-" + std::to_string(i);
      s->header.incarnation = 1;
      DL_RETURN_IF_ERROR(Build(*s, &s->raw_template));
      sender_index_[s->header.sender] = i;
      senders_.push_back(std::move(s));
    }

    // PUB/SUB joins asynchronously: heartbeats from each sender until one of its arrives.
    std::vector<bool> joined(senders_.size(), false);
    size_t joined_count = 0;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (joined_count < senders_.size()) {
      for (size_t i = 0; i < senders_.size(); ++i) {
        if (joined[i]) continue;
        HeartbeatMsg hb;
        OutgoingMessage out;
        EnvelopeHeader h = senders_[i]->header;
        h.seq = ++senders_[i]->seq;
        DL_RETURN_IF_ERROR(BuildMessage(h, hb, {}, &out));
        Message m = ToMessage(std::move(out), nullptr);
        senders_[i]->pub->Publish("bench", m);
      }
      Received r;
      while (sub_->Receive(&r, 20) == RecvResult::kMessage) {
        const auto it = sender_index_.find(r.meta.sender);
        if (it != sender_index_.end() && !joined[it->second]) {
          joined[it->second] = true;
          ++joined_count;
        }
      }
      if (Clock::now() > deadline) return Status::Error(name + ": a subscriber never joined");
    }
    // Heartbeats still on the way (several go out while the subscription lands) would be taken
    // for the first delta: drain them.
    Received r;
    while (sub_->Receive(&r, 100) == RecvResult::kMessage) {
    }
    return Status::Ok();
  }

  int io_threads() const { return o_.io_threads > 0 ? o_.io_threads : DefaultIoThreads(); }
  int aggregate_depth() const { return std::max(1, o_.stream_depth); }

  // One delta, build to parsed. Returns seconds.
  Status StackOnce(double* seconds, double* build_s, double* parse_s) {
    Sender& s = *senders_[0];
    const auto t0 = Clock::now();
    OutgoingMessage out;
    DL_RETURN_IF_ERROR(Build(s, &out));
    *build_s = Seconds(t0, Clock::now());
    Message m = ToMessage(std::move(out), payload_);
    if (s.pub->Publish("bench", m) != SendResult::kSent) return Status::Error(name_ + ": publish failed");
    DL_RETURN_IF_ERROR(ReceiveDelta(nullptr));
    *seconds = Seconds(t0, Clock::now());
    *parse_s = last_parse_s_;
    return Status::Ok();
  }

  Status RawOnce(double* seconds) {
    Sender& s = *senders_[0];
    const auto t0 = Clock::now();
    Message m = RawMessage(s);
    if (s.push->Send(m, 10000) != SendResult::kSent) return Status::Error(name_ + ": raw send failed");
    DL_RETURN_IF_ERROR(ReceiveRaw(nullptr));
    *seconds = Seconds(t0, Clock::now());
    return Status::Ok();
  }

  // depth messages back to back: a sender thread builds and sends, this thread receives.
  Status StackStream(double* seconds) {
    Sender& s = *senders_[0];
    const int depth = o_.stream_depth;
    Status send_status;
    const auto t0 = Clock::now();
    std::thread sender([&] {
      for (int i = 0; i < depth; ++i) {
        OutgoingMessage out;
        Status st = Build(s, &out);
        if (!st.ok()) {
          send_status = st;
          return;
        }
        Message m = ToMessage(std::move(out), payload_);
        if (s.pub->Publish("bench", m) != SendResult::kSent) {
          send_status = Status::Error(name_ + ": publish failed");
          return;
        }
      }
    });
    Status st;
    for (int i = 0; i < depth && st.ok(); ++i) st = ReceiveDelta(nullptr);
    sender.join();
    DL_RETURN_IF_ERROR(send_status);
    DL_RETURN_IF_ERROR(st);
    *seconds = Seconds(t0, Clock::now());
    return Status::Ok();
  }

  Status RawStream(double* seconds) {
    Sender& s = *senders_[0];
    const int depth = o_.stream_depth;
    bool send_ok = true;
    const auto t0 = Clock::now();
    std::thread sender([&] {
      for (int i = 0; i < depth && send_ok; ++i) {
        Message m = RawMessage(s);
        send_ok = s.push->Send(m, 10000) == SendResult::kSent;
      }
    });
    Status st;
    for (int i = 0; i < depth && st.ok(); ++i) st = ReceiveRaw(nullptr);
    sender.join();
    if (!send_ok) return Status::Error(name_ + ": raw send failed");
    DL_RETURN_IF_ERROR(st);
    *seconds = Seconds(t0, Clock::now());
    return Status::Ok();
  }

  // Every sender at once, aggregate_depth() deltas each (built beforehand: that is the learners'
  // work, on their machines), into the one SUB; from the start signal to the last delta parsed.
  Status StackAggregate(double* seconds) {
    std::vector<std::vector<Message>> msgs(senders_.size());
    for (size_t i = 0; i < senders_.size(); ++i) {
      for (int k = 0; k < aggregate_depth(); ++k) {
        OutgoingMessage out;
        DL_RETURN_IF_ERROR(Build(*senders_[i], &out));
        msgs[i].push_back(ToMessage(std::move(out), payload_));
      }
    }
    return Aggregate(seconds, [&](size_t i) {
      for (Message& m : msgs[i])
        if (senders_[i]->pub->Publish("bench", m) != SendResult::kSent) return false;
      return true;
    }, [&](int* sender) { return ReceiveDelta(sender); });
  }

  Status RawAggregate(double* seconds) {
    return Aggregate(seconds, [&](size_t i) {
      for (int k = 0; k < aggregate_depth(); ++k) {
        Message m = RawMessage(*senders_[i]);
        if (senders_[i]->push->Send(m, 10000) != SendResult::kSent) return false;
      }
      return true;
    }, [&](int* sender) { return ReceiveRaw(sender); });
  }

  ~PathBench() {
    senders_.clear();
    sub_.reset();
    pull_.reset();
  }

 private:
  // Runs send(i) on one thread per sender, all released at once, and receive() on this thread
  // until every sender's aggregate_depth() messages arrived.
  template <class Send, class Receive>
  Status Aggregate(double* seconds, Send send, Receive receive) {
    const size_t n = senders_.size();
    std::latch start(1);
    std::unique_ptr<bool[]> send_ok(new bool[n]);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        start.wait();
        send_ok[i] = send(i);
      });
    }
    const auto t0 = Clock::now();
    start.count_down();
    std::vector<int> got(n, 0);
    Status st;
    for (size_t k = 0; k < n * aggregate_depth() && st.ok(); ++k) {
      int sender = -1;
      st = receive(&sender);
      if (st.ok()) ++got[sender];
    }
    const double s = Seconds(t0, Clock::now());
    for (std::thread& t : threads) t.join();
    for (size_t i = 0; i < n; ++i)
      if (!send_ok[i]) return Status::Error(name_ + ": sender " + std::to_string(i) + " could not send");
    DL_RETURN_IF_ERROR(st);
    for (size_t i = 0; i < n; ++i) {
      if (got[i] != aggregate_depth())
        return Status::Error(name_ + ": sender " + std::to_string(i) + " delivered " + std::to_string(got[i]) +
                             " of " + std::to_string(aggregate_depth()) + " messages");
    }
    *seconds = s;
    return Status::Ok();
  }

  // Called from one thread at a time per sender (its thread owns seq while streaming).
  Status Build(Sender& s, OutgoingMessage* out) {
    EnvelopeHeader h = s.header;
    h.seq = ++s.seq;
    DeltaMsg delta = delta_;
    delta.learner_step = h.seq;
    return BuildMessage(h, delta, *payload_, out, BuildOptions{.defer_payload_crc = true});
  }

  Message RawMessage(const Sender& s) {
    Message m;
    m.AddCopy(s.raw_template.header.data(), s.raw_template.header.size());
    for (const auto& c : s.raw_template.chunks) m.AddShared(payload_, c.data(), c.size());
    return m;
  }

  // *sender (when given): the index of the sender, from the envelope.
  Status ReceiveDelta(int* sender) {
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
    if (sender) {
      const auto it = sender_index_.find(r.meta.sender);
      if (it == sender_index_.end())
        return Status::Error(name_ + ": a delta from unknown sender '" + r.meta.sender + "'");
      *sender = it->second;
    }
    return Status::Ok();
  }

  // *sender (when given): the index of the sender whose header frame 0 is.
  Status ReceiveRaw(int* sender) {
    Message got;
    const RecvResult rr = pull_->Receive(&got, 30000);
    if (rr != RecvResult::kMessage) return Status::Error(name_ + ": no raw message received (" + ToString(rr) + ")");
    for (size_t i = 0; i < senders_.size(); ++i) {
      const OutgoingMessage& t = senders_[i]->raw_template;
      const std::span<const uint8_t> f0 = got.frame(0);
      if (got.bytes() == t.wire_bytes() && f0.size() == t.header.size() &&
          std::memcmp(f0.data(), t.header.data(), f0.size()) == 0) {
        if (sender) *sender = static_cast<int>(i);
        return Status::Ok();
      }
    }
    return Status::Error(name_ + ": raw message of the wrong size or from no sender");
  }

  const TransportBenchOptions& o_;
  std::shared_ptr<std::vector<uint8_t>> payload_;
  std::string name_;
  std::unique_ptr<NetContext> recv_ctx_;  // declared first: destroyed last
  std::unique_ptr<SubChannel> sub_;
  std::unique_ptr<Socket> pull_;
  std::vector<std::unique_ptr<Sender>> senders_;
  std::map<std::string, int> sender_index_;
  std::shared_ptr<ParsedMessage> parsed_;
  DeltaMsg delta_;
  double last_parse_s_ = 0;
};

Status RunPath(const TransportBenchOptions& o, std::shared_ptr<std::vector<uint8_t>> payload, const std::string& name,
               const std::string& stack_bind, const std::string& raw_bind, const Keys* keys, TransportBenchPath* row) {
  PathBench b(o, payload);
  DL_RETURN_IF_ERROR(b.Setup(name, stack_bind, raw_bind, keys));
  std::vector<double> stack, raw, stack_stream, raw_stream, build, parse, stack_cpu, raw_cpu;
  // One at a time first, then streams, each interleaved (alternating which goes first) so drift
  // hits stack and raw alike; the warm-up lets the allocator settle on reusing freed buffers.
  for (int i = 0; i < o.warmup + o.transfers; ++i) {
    double s = 0, r = 0, bs = 0, ps = 0, sc = 0, rc = 0;
    auto with_cpu = [](double* cpu_s, const auto& transfer) {
      const double c0 = ProcessCpuSeconds();
      const Status st = transfer();
      *cpu_s = ProcessCpuSeconds() - c0;
      return st;
    };
    auto raw_once = [&] { return with_cpu(&rc, [&] { return b.RawOnce(&r); }); };
    auto stack_once = [&] { return with_cpu(&sc, [&] { return b.StackOnce(&s, &bs, &ps); }); };
    if (i % 2) {
      DL_RETURN_IF_ERROR(raw_once());
      DL_RETURN_IF_ERROR(stack_once());
    } else {
      DL_RETURN_IF_ERROR(stack_once());
      DL_RETURN_IF_ERROR(raw_once());
    }
    if (i < o.warmup) continue;
    stack.push_back(s);
    raw.push_back(r);
    stack_cpu.push_back(sc);
    raw_cpu.push_back(rc);
    build.push_back(bs);
    parse.push_back(ps);
  }
  for (int i = 0; o.stream_depth > 0 && i < std::min(o.warmup, 1) + o.transfers; ++i) {
    double ss = 0, rs = 0;
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
  std::vector<double> stack_agg, raw_agg;
  for (int i = 0; i < std::min(o.warmup, 1) + o.transfers; ++i) {
    double sa = 0, ra = 0;
    if (i % 2) {
      DL_RETURN_IF_ERROR(b.RawAggregate(&ra));
      DL_RETURN_IF_ERROR(b.StackAggregate(&sa));
    } else {
      DL_RETURN_IF_ERROR(b.StackAggregate(&sa));
      DL_RETURN_IF_ERROR(b.RawAggregate(&ra));
    }
    if (i < std::min(o.warmup, 1)) continue;
    stack_agg.push_back(sa);
    raw_agg.push_back(ra);
  }
  const double bytes = static_cast<double>(payload->size());
  row->name = name;
  row->stack_ms = Median(stack) * 1e3;
  row->raw_ms = Median(raw) * 1e3;
  row->stack_cpu_ms = Median(stack_cpu) * 1e3;
  row->raw_cpu_ms = Median(raw_cpu) * 1e3;
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
  const double agg_bytes = bytes * o.senders * b.aggregate_depth();
  row->senders = o.senders;
  row->io_threads = b.io_threads();
  row->aggregate_GBps = agg_bytes / Median(stack_agg) / 1e9;
  row->raw_aggregate_GBps = agg_bytes / Median(raw_agg) / 1e9;
  row->aggregate_ratio = row->aggregate_GBps / row->raw_aggregate_GBps;
  row->per_sender_GBps = row->aggregate_GBps / o.senders;
  row->raw_per_sender_GBps = row->raw_aggregate_GBps / o.senders;
  return Status::Ok();
}

// Both paths on the allocator's steady state. glibc serves a 4 MiB message buffer from its heap
// only once its dynamic mmap threshold has risen past that size, which depends on what the
// process freed before; until then each buffer is a fresh mmap, page-faulted and zeroed on first
// touch. The raw path's time moved with whatever ran before it in the process (tcp: 44.6 ms after
// the old stack path, 27.1 ms after the chunked one; about 25 ms in both with this). A daemon reaches
// the same state after its first few messages.
void PinAllocator() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: every chunk buffer from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // and kept there between messages
}

}  // namespace

Status RunTransportBench(const TransportBenchOptions& o, std::vector<TransportBenchPath>* out) {
  if (o.payload_bytes < 4 || o.payload_bytes % 4 != 0) {
    return Status::Error("payload_bytes must be a positive multiple of 4 (fp32 values)");
  }
  if (o.transfers < 1 || o.warmup < 0 || o.stream_depth < 0) {
    return Status::Error("transfers must be >= 1, warmup and stream_depth >= 0");
  }
  if (o.stream_depth > 64) return Status::Error("stream_depth must be <= 64");
  if (o.senders < 1 || o.senders > 64) return Status::Error("senders must be in [1, 64]");
  if (o.io_threads < 0 || o.io_threads > 64) {
    return Status::Error("io_threads must be in [0, 64] (0: as the daemon, DefaultIoThreads())");
  }
  PinAllocator();
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
  char buf[1024];
  for (size_t i = 0; i < paths.size(); ++i) {
    const TransportBenchPath& p = paths[i];
    std::snprintf(buf, sizeof buf,
                  "%s\"%s\": {\"stack_GBps\": %.3f, \"raw_zmq_GBps\": %.3f, \"ratio\": %.3f, \"stack_ms\": %.2f, "
                  "\"raw_ms\": %.2f, \"stack_cpu_ms\": %.2f, \"raw_cpu_ms\": %.2f, \"build_ms\": %.2f, \"parse_ms\": %.2f, \"stack_stream_GBps\": %.3f, "
                  "\"raw_stream_GBps\": %.3f, \"stream_ratio\": %.3f, \"senders\": %d, \"io_threads\": %d, "
                  "\"aggregate_GBps\": %.3f, \"raw_aggregate_GBps\": %.3f, \"aggregate_ratio\": %.3f, "
                  "\"per_sender_GBps\": %.3f, \"raw_per_sender_GBps\": %.3f}",
                  i ? ", " : "", p.name.c_str(), p.stack_GBps, p.raw_zmq_GBps, p.ratio, p.stack_ms, p.raw_ms, p.stack_cpu_ms, p.raw_cpu_ms, p.build_ms,
                  p.parse_ms, p.stack_stream_GBps, p.raw_stream_GBps, p.stream_ratio, p.senders, p.io_threads,
                  p.aggregate_GBps, p.raw_aggregate_GBps, p.aggregate_ratio, p.per_sender_GBps, p.raw_per_sender_GBps);
    s += buf;
  }
  return s + "}";
}

}  // namespace diloco::net
