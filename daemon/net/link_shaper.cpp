#include "daemon/net/link_shaper.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

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

LinkVerdict LinkSchedule::Admit(SteadyTime now, size_t bytes, const LinkParams& p, std::mt19937_64& rng) {
  LinkVerdict v;
  if (p.partitioned) {
    v.kind = LinkVerdict::kDropPartition;
    return v;
  }
  if (p.loss > 0 && std::uniform_real_distribution<double>(0.0, 1.0)(rng) < p.loss) {
    v.kind = LinkVerdict::kDropLoss;
    return v;
  }
  const SteadyTime start = std::max(now, link_free_at_);
  v.departure = start;
  if (p.bandwidth_bytes_per_s > 0) v.departure += Seconds(static_cast<double>(bytes) / p.bandwidth_bytes_per_s);
  link_free_at_ = v.departure;
  double delay_ms = p.latency_ms;
  if (p.jitter_ms > 0) delay_ms += std::uniform_real_distribution<double>(-p.jitter_ms, p.jitter_ms)(rng);
  v.arrival = v.departure + Seconds(std::max(0.0, delay_ms) / 1000.0);
  v.arrival = std::max(v.arrival, last_arrival_);
  last_arrival_ = v.arrival;
  v.kind = LinkVerdict::kDeliver;
  return v;
}

struct Link::Pair {
  SocketType app_type;
  std::unique_ptr<Socket> inner;  // inproc, facing the app's socket
  std::unique_ptr<Socket> outer;  // the real endpoint
  bool up = false;                // inner -> outer is shaped data
  bool down = false;              // outer -> inner is shaped data
  std::deque<Queued> up_queue;
  std::deque<Queued> down_queue;
};

Link::Link(NetContext& context, const LinkOptions& options, int wake_fd)
    : context_(context), options_(options), wake_fd_(wake_fd) {
  params_[0] = options.up;
  params_[1] = options.down;
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

void Link::Admit(LinkDirection dir, Message&& m, std::deque<Queued>* queue, SteadyTime now) {
  const int d = static_cast<int>(dir);
  const size_t bytes = m.bytes();
  LinkParams p;
  {
    std::lock_guard<std::mutex> lock(mu_);
    p = params_[d];
  }
  const LinkVerdict v = schedule_[d].Admit(now, bytes, p, rng_[d]);
  std::lock_guard<std::mutex> lock(mu_);
  if (v.kind == LinkVerdict::kDropPartition) {
    ++stats_[d].dropped_partition;
    return;
  }
  if (v.kind == LinkVerdict::kDropLoss) {
    ++stats_[d].dropped_loss;
    return;
  }
  ++stats_[d].queued;
  stats_[d].queued_bytes += bytes;
  queue->push_back({v.arrival, std::move(m), bytes});
}

SteadyTime Link::Release(LinkDirection dir, std::deque<Queued>* queue, Socket* target, SteadyTime now) {
  const int d = static_cast<int>(dir);
  while (!queue->empty() && queue->front().arrival <= now) {
    Queued& q = queue->front();
    bool partitioned;
    {
      std::lock_guard<std::mutex> lock(mu_);
      partitioned = params_[d].partitioned;
    }
    bool delivered = false;
    if (!partitioned) {
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
    queue->pop_front();
  }
  return queue->empty() ? SteadyTime::max() : queue->front().arrival;
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

    // Release what is due; find the next deadline.
    const SteadyTime now = Clock::now();
    SteadyTime next = SteadyTime::max();
    retry_soon_ = false;
    for (auto& p : pairs_) {
      if (p->up) next = std::min(next, Release(LinkDirection::kUp, &p->up_queue, p->outer.get(), now));
      if (p->down) next = std::min(next, Release(LinkDirection::kDown, &p->down_queue, p->inner.get(), now));
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
          Admit(LinkDirection::kUp, std::move(m), &p.up_queue, Clock::now());
        } else if (p.app_type == SocketType::kSub) {
          (void)p.outer->Send(m, 0);  // a (un)subscription from the app: pass it upstream
        }
      }
      for (int k = 0; outer_ready && k < kMaxReadsPerWake; ++k) {
        Message m;
        const RecvResult r = p.outer->Receive(&m, 0);
        if (r == RecvResult::kClosed) closed = true;
        if (r != RecvResult::kMessage) break;
        if (p.down) Admit(LinkDirection::kDown, std::move(m), &p.down_queue, Clock::now());
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
