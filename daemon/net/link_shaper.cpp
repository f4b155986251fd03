#include "daemon/net/link_shaper.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "daemon/net/context.h"
#include "daemon/net/net_log.h"

namespace diloco::net {
namespace {

using Clock = std::chrono::steady_clock;

Clock::duration Seconds(double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); }

constexpr int kMaxReadsPerWake = 64;  // per socket and loop, so no input starves the others

}  // namespace

Status ValidateLinkParams(const LinkParams& p) {
  if (!(p.bandwidth_bytes_per_s >= 0) || !std::isfinite(p.bandwidth_bytes_per_s)) {
    return Status::Error("link bandwidth must be >= 0 bytes/s (0: unlimited)");
  }
  if (!(p.latency_ms >= 0) || !std::isfinite(p.latency_ms)) return Status::Error("link latency must be >= 0 ms");
  if (!(p.jitter_ms >= 0) || !std::isfinite(p.jitter_ms)) return Status::Error("link jitter must be >= 0 ms");
  if (!(p.loss >= 0 && p.loss <= 1)) return Status::Error("link loss must be a probability in [0, 1]");
  return Status::Ok();
}

const char* ToString(LinkDirection d) { return d == LinkDirection::kUp ? "up" : "down"; }

LinkDrop DecideDrop(const LinkParams& p, std::mt19937_64& rng) {
  if (p.partitioned) return LinkDrop::kPartition;
  if (p.loss > 0 && std::uniform_real_distribution<double>(0.0, 1.0)(rng) < p.loss) return LinkDrop::kLoss;
  return LinkDrop::kNone;
}

SteadyTime ArrivalTime(SteadyTime departure, const LinkParams& p, SteadyTime previous_arrival, std::mt19937_64& rng) {
  double delay_ms = p.latency_ms;
  if (p.jitter_ms > 0) delay_ms += std::uniform_real_distribution<double>(-p.jitter_ms, p.jitter_ms)(rng);
  return std::max(departure + Seconds(std::max(0.0, delay_ms) / 1000.0), previous_arrival);
}

void FairShareSchedule::Advance(SteadyTime now, std::vector<Departure>* out) {
  if (!started_) {
    clock_ = now;
    started_ = true;
  }
  if (now <= clock_) return;
  while (waiting_ > 0 && bytes_per_s_ > 0) {
    size_t active = 0;
    double min_left = std::numeric_limits<double>::infinity();
    for (const auto& [flow, q] : flows_) {
      if (q.empty()) continue;
      ++active;
      min_left = std::min(min_left, q.front());
    }
    const double rate = bytes_per_s_ / static_cast<double>(active);  // per flow
    // Rounded up to the clock's tick, so the message it waits for is surely done then.
    const auto dt = std::chrono::ceil<Clock::duration>(std::chrono::duration<double>(min_left / rate));
    const bool finishes = clock_ + dt <= now;
    const auto step = finishes ? dt : now - clock_;
    const double served = rate * std::chrono::duration<double>(step).count();
    clock_ += step;
    for (auto& [flow, q] : flows_) {
      if (q.empty()) continue;
      q.front() -= served;
      if (q.front() <= 1e-6) {
        q.pop_front();
        --waiting_;
        out->push_back({flow, clock_});
      }
    }
    if (!finishes) break;
  }
  clock_ = std::max(clock_, now);
}

void FairShareSchedule::SetBandwidth(SteadyTime now, double bytes_per_s, std::vector<Departure>* out) {
  Advance(now, out);
  bytes_per_s_ = bytes_per_s;
  if (bytes_per_s_ > 0) return;
  for (auto& [flow, q] : flows_) {  // unlimited: everything waiting leaves now, in flow order
    for (; !q.empty(); q.pop_front()) out->push_back({flow, clock_});
  }
  waiting_ = 0;
}

void FairShareSchedule::Enqueue(int flow, size_t bytes, SteadyTime now, std::vector<Departure>* out) {
  Advance(now, out);
  if (bytes_per_s_ <= 0) {
    out->push_back({flow, clock_});
    return;
  }
  // A zero-byte message still waits behind the flow's earlier ones.
  flows_[flow].push_back(std::max<double>(static_cast<double>(bytes), 1e-3));
  ++waiting_;
}

std::optional<SteadyTime> FairShareSchedule::NextDeparture() const {
  if (waiting_ == 0 || bytes_per_s_ <= 0) return std::nullopt;
  size_t active = 0;
  double min_left = std::numeric_limits<double>::infinity();
  for (const auto& [flow, q] : flows_) {
    if (q.empty()) continue;
    ++active;
    min_left = std::min(min_left, q.front());
  }
  const double rate = bytes_per_s_ / static_cast<double>(active);
  return clock_ + std::chrono::ceil<Clock::duration>(std::chrono::duration<double>(min_left / rate));
}

struct Link::Pair {
  struct Waiting {
    Message message;
    size_t bytes = 0;
  };
  struct InFlight {
    SteadyTime arrival;
    Message message;
    size_t bytes = 0;
  };
  struct Direction {
    std::deque<Waiting> waiting;     // in the schedule, not yet departed (FIFO)
    std::deque<InFlight> in_flight;  // departed, arriving in order
    SteadyTime last_arrival{};
  };
  SocketType app_type;
  std::unique_ptr<Socket> inner;  // inproc, facing the app's socket
  std::unique_ptr<Socket> outer;  // the real endpoint
  bool up = false;                // inner -> outer is shaped data
  bool down = false;              // outer -> inner is shaped data
  Direction dir[2];
};

Link::Link(NetContext& context, const LinkOptions& options, int wake_fd)
    : context_(context), options_(options), wake_fd_(wake_fd) {
  params_[0] = current_[0] = options.up;
  params_[1] = current_[1] = options.down;
  schedule_[0] = FairShareSchedule(options.up.bandwidth_bytes_per_s);
  schedule_[1] = FairShareSchedule(options.down.bandwidth_bytes_per_s);
  rng_[0].seed(options.seed * 2 + 0);
  rng_[1].seed(options.seed * 2 + 1);
}

Status Link::Create(NetContext& context, const LinkOptions& options, std::shared_ptr<Link>* out) {
  DL_RETURN_IF_ERROR(ValidateLinkParams(options.up).WithContext(options.name + " up"));
  DL_RETURN_IF_ERROR(ValidateLinkParams(options.down).WithContext(options.name + " down"));
  if (options.max_queued_bytes < 1) return Status::Error(options.name + ": max_queued_bytes must be positive");
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return Status::Error(options.name + ": eventfd failed");
  std::shared_ptr<Link> link(new Link(context, options, fd));
  link->thread_ = std::thread(&Link::Run, link.get());
  *out = std::move(link);
  return Status::Ok();
}

Link::~Link() {
  stop_ = true;
  Wake();
  if (thread_.joinable()) thread_.join();
  ::close(wake_fd_);
}

void Link::Wake() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

Status Link::SetParams(LinkDirection direction, const LinkParams& params) {
  DL_RETURN_IF_ERROR(ValidateLinkParams(params).WithContext(options_.name));
  {
    std::lock_guard<std::mutex> lock(mu_);
    params_[static_cast<int>(direction)] = params;
  }
  Wake();
  return Status::Ok();
}

Status Link::Change(const std::function<void(LinkParams*)>& change) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    LinkParams next[2] = {params_[0], params_[1]};
    for (LinkParams& p : next) {
      change(&p);
      DL_RETURN_IF_ERROR(ValidateLinkParams(p).WithContext(options_.name));
    }
    params_[0] = next[0];
    params_[1] = next[1];
  }
  Wake();
  return Status::Ok();
}

LinkParams Link::params(LinkDirection direction) const {
  std::lock_guard<std::mutex> lock(mu_);
  return params_[static_cast<int>(direction)];
}

void Link::SetPartitioned(bool partitioned) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (params_[0].partitioned != partitioned) {
      NetLogf("net.link", "%s: %s", options_.name.c_str(), partitioned ? "partitioned" : "healed");
    }
    params_[0].partitioned = partitioned;
    params_[1].partitioned = partitioned;
  }
  Wake();
}

LinkStats Link::stats(LinkDirection direction) const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_[static_cast<int>(direction)];
}

Status Link::Attach(SocketType app_type, const SocketOptions& options, const std::string& endpoint,
                    std::string* relay_endpoint) {
  auto req = std::make_unique<AttachRequest>();
  req->app_type = app_type;
  req->options = options;
  req->options.link.reset();  // the outer socket is not shaped again (and holds no cycle)
  req->endpoint = endpoint;
  auto done = req->done.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_) return Status::Error(options_.name + ": the link has stopped (context shutting down)");
    requests_.push_back(std::move(req));
  }
  Wake();
  auto [status, ep] = done.get();
  if (status.ok()) *relay_endpoint = ep;
  return status;
}

std::pair<Status, std::string> Link::DoAttach(const AttachRequest& req) {
  auto pair = std::make_unique<Pair>();
  pair->app_type = req.app_type;
  SocketType inner_type, outer_type;
  switch (req.app_type) {
    case SocketType::kPub:
      inner_type = SocketType::kXSub;
      outer_type = SocketType::kXPub;
      pair->up = true;
      break;
    case SocketType::kSub:
      inner_type = SocketType::kXPub;
      outer_type = SocketType::kXSub;
      pair->down = true;
      break;
    case SocketType::kDealer:
      inner_type = SocketType::kDealer;
      outer_type = SocketType::kDealer;
      pair->up = pair->down = true;
      break;
    case SocketType::kPush:
      inner_type = SocketType::kPull;
      outer_type = SocketType::kPush;
      pair->up = true;
      break;
    default:
      return {Status::Error(options_.name + ": cannot shape a " + SocketTypeName(req.app_type) + " socket"), ""};
  }
  SocketOptions inner_opts;
  inner_opts.name = req.options.name + ".relay";
  inner_opts.linger_ms = 0;
  inner_opts.send_hwm_msgs = req.options.send_hwm_msgs;
  inner_opts.recv_hwm_msgs = req.options.recv_hwm_msgs;
  inner_opts.max_frame_bytes = -1;  // the app's own messages; the outer socket enforces the limit
  SocketOptions outer_opts = req.options;
  outer_opts.name = req.options.name + " via " + options_.name;
  outer_opts.linger_ms = 0;
  if (Status st = CheckEndpointSecurity(req.endpoint, outer_opts); !st.ok()) return {st, ""};
  const std::string inproc = "inproc://dl-link-" + std::to_string(context_.NextId());
  Status st = Socket::Create(context_, inner_type, inner_opts, &pair->inner);
  if (st.ok()) st = Socket::Create(context_, outer_type, outer_opts, &pair->outer);
  if (st.ok()) st = pair->inner->Bind(inproc);
  if (st.ok()) st = pair->outer->Connect(req.endpoint);
  if (st.ok() && req.app_type == SocketType::kPub) st = pair->inner->Subscribe("");  // take everything the app sends
  if (!st.ok()) return {st, ""};
  pairs_.push_back(std::move(pair));
  return {Status::Ok(), inproc};
}

namespace {

// m with one byte of its last frame flipped (a bit error that got past the network's checks).
Message CorruptedCopy(const Message& m, std::mt19937_64& rng) {
  Message out;
  for (size_t i = 0; i < m.size(); i++) {
    const std::span<const uint8_t> f = m.frame(i);
    std::vector<uint8_t> bytes(f.begin(), f.end());
    if (i + 1 == m.size() && !bytes.empty()) bytes[rng() % bytes.size()] ^= 0x5a;
    out.AddOwned(std::move(bytes));
  }
  return out;
}

}  // namespace

void Link::Admit(int d, size_t pair, Message&& m, SteadyTime now) {
  const size_t bytes = m.bytes();
  const LinkDrop drop = DecideDrop(current_[d], rng_[d]);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (drop == LinkDrop::kPartition) {
      ++stats_[d].dropped_partition;
      return;
    }
    if (drop == LinkDrop::kLoss) {
      ++stats_[d].dropped_loss;
      return;
    }
    ++stats_[d].queued;
    stats_[d].queued_bytes += bytes;
  }
  if (current_[d].corrupt > 0 && !m.empty() &&
      std::uniform_real_distribution<double>(0, 1)(rng_[d]) < current_[d].corrupt) {
    m = CorruptedCopy(m, rng_[d]);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_[d].corrupted;
  }
  pairs_[pair]->dir[d].waiting.push_back({std::move(m), bytes});
  std::vector<FairShareSchedule::Departure> departed;
  schedule_[d].Enqueue(static_cast<int>(pair), bytes, now, &departed);
  Depart(d, departed);
}

void Link::Depart(int d, const std::vector<FairShareSchedule::Departure>& departures) {
  for (const auto& dep : departures) {
    Pair::Direction& dir = pairs_[dep.flow]->dir[d];
    Pair::Waiting w = std::move(dir.waiting.front());
    dir.waiting.pop_front();
    const SteadyTime arrival = ArrivalTime(dep.time, current_[d], dir.last_arrival, rng_[d]);
    dir.last_arrival = arrival;
    dir.in_flight.push_back({arrival, std::move(w.message), w.bytes});
  }
}

SteadyTime Link::Release(int d, Pair* p, SteadyTime now) {
  Socket* target = d == 0 ? p->outer.get() : p->inner.get();
  auto& queue = p->dir[d].in_flight;
  while (!queue.empty() && queue.front().arrival <= now) {
    Pair::InFlight& q = queue.front();
    bool delivered = false;
    if (!current_[d].partitioned) {
      const SendResult r = target->Send(q.message, 0);
      if (r == SendResult::kWouldBlock) {
        retry_soon_ = true;  // the receiver is slow: keep the message, try again shortly
        break;
      }
      delivered = r == SendResult::kSent;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --stats_[d].queued;
      stats_[d].queued_bytes -= q.bytes;
      if (delivered) {
        ++stats_[d].delivered;
        stats_[d].delivered_bytes += q.bytes;
      } else {
        ++stats_[d].dropped_partition;
      }
    }
    queue.pop_front();
  }
  return queue.empty() ? SteadyTime::max() : queue.front().arrival;
}

void Link::SyncParams(SteadyTime now) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    current_[0] = params_[0];
    current_[1] = params_[1];
  }
  for (int d = 0; d < 2; ++d) {
    if (schedule_[d].bandwidth() == current_[d].bandwidth_bytes_per_s) continue;
    std::vector<FairShareSchedule::Departure> departed;
    schedule_[d].SetBandwidth(now, current_[d].bandwidth_bytes_per_s, &departed);
    Depart(d, departed);
  }
}

void Link::Run() {
  std::vector<zmq::pollitem_t> items;
  for (;;) {
    // Attach requests.
    std::vector<std::unique_ptr<AttachRequest>> reqs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reqs.swap(requests_);
    }
    for (auto& r : reqs) r->done.set_value(DoAttach(*r));
    if (stop_) break;

    // Take in parameter changes, let the links carry what they can, hand on what has arrived.
    const SteadyTime now = Clock::now();
    SyncParams(now);
    SteadyTime next = SteadyTime::max();
    retry_soon_ = false;
    for (int d = 0; d < 2; ++d) {
      std::vector<FairShareSchedule::Departure> departed;
      schedule_[d].Advance(now, &departed);
      Depart(d, departed);
      if (const auto t = schedule_[d].NextDeparture()) next = std::min(next, *t);
    }
    for (auto& p : pairs_) {
      if (p->up) next = std::min(next, Release(0, p.get(), now));
      if (p->down) next = std::min(next, Release(1, p.get(), now));
    }
    bool read_up, read_down;
    {
      std::lock_guard<std::mutex> lock(mu_);
      read_up = static_cast<int64_t>(stats_[0].queued_bytes) < options_.max_queued_bytes;
      read_down = static_cast<int64_t>(stats_[1].queued_bytes) < options_.max_queued_bytes;
    }

    items.clear();
    items.push_back({nullptr, wake_fd_, ZMQ_POLLIN, 0});
    for (auto& p : pairs_) {
      // inner carries app data (up) or subscriptions (SUB); outer carries network data (down) or
      // subscriptions (PUB: drained).
      const bool inner_in = p->up ? read_up : true;
      const bool outer_in = p->down ? read_down : true;
      items.push_back({p->inner->ref().handle(), 0, static_cast<short>(inner_in ? ZMQ_POLLIN : 0), 0});
      items.push_back({p->outer->ref().handle(), 0, static_cast<short>(outer_in ? ZMQ_POLLIN : 0), 0});
    }
    int timeout_ms = -1;
    if (next != SteadyTime::max()) {
      const auto us = std::chrono::duration_cast<std::chrono::microseconds>(next - Clock::now()).count();
      timeout_ms = us <= 0 ? 0 : static_cast<int>((us + 999) / 1000);
    }
    if (retry_soon_) timeout_ms = timeout_ms < 0 ? 1 : std::min(timeout_ms, 1);
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(timeout_ms));
    } catch (const zmq::error_t& e) {
      break;  // ETERM: the context is shutting down
    }
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t v;
      (void)!::read(wake_fd_, &v, sizeof v);
    }
    // Messages read below were sent after any parameter change that woke us: they get it.
    SyncParams(Clock::now());
    bool closed = false;
    for (size_t i = 0; i < pairs_.size() && !closed; ++i) {
      Pair& p = *pairs_[i];
      const bool inner_ready = items[1 + 2 * i].revents & ZMQ_POLLIN;
      const bool outer_ready = items[2 + 2 * i].revents & ZMQ_POLLIN;
      for (int k = 0; inner_ready && k < kMaxReadsPerWake; ++k) {
        Message m;
        const RecvResult r = p.inner->Receive(&m, 0);
        if (r == RecvResult::kClosed) closed = true;
        if (r != RecvResult::kMessage) break;
        if (p.up) {
          Admit(0, i, std::move(m), Clock::now());
        } else if (p.app_type == SocketType::kSub) {
          (void)p.outer->Send(m, 0);  // a (un)subscription from the app: pass it upstream
        }
      }
      for (int k = 0; outer_ready && k < kMaxReadsPerWake; ++k) {
        Message m;
        const RecvResult r = p.outer->Receive(&m, 0);
        if (r == RecvResult::kClosed) closed = true;
        if (r != RecvResult::kMessage) break;
        if (p.down) Admit(1, i, std::move(m), Clock::now());
        // PUB: subscriptions from remote subscribers; the relay's XSUB already takes everything.
      }
    }
    if (closed) break;
  }
  pairs_.clear();  // closes the relay's sockets
  std::lock_guard<std::mutex> lock(mu_);
  running_ = false;
  for (auto& r : requests_) r->done.set_value({Status::Error(options_.name + ": the link has stopped"), ""});
  requests_.clear();
}

}  // namespace diloco::net
