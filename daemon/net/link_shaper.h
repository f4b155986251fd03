// Emulated WAN links under the transport, so several sites can run on one machine as if they were
// continents apart (e.g. 2 Gbit/s and 40 ms between a learner and the syncer).
//
// A Link is one learner <-> syncer path, with its own parameters per direction: `up` shapes what
// the app's sockets send (PUB, DEALER, PUSH), `down` shapes what they receive (SUB, DEALER).
// Sockets opt in with SocketOptions::link; their Connect() then goes through a relay:
//
//   app socket --inproc--> [relay: inner socket -> shaping queue -> outer socket] --real endpoint-->
//   app socket <--inproc-- [relay: inner socket <- shaping queue <- outer socket] <--real endpoint--
//
// One relay thread per Link owns all the inner/outer sockets of that link (one socket per thread);
// the app's sockets stay ordinary sockets in the app's thread. The outer socket carries the app's
// options (CURVE keys, HWMs, routing id), so the peer sees the app. Messages (multipart) stay whole.
// For each message taken from the app (or the network), in arrival order per direction:
//   dropped           when the direction is partitioned, or with probability `loss` (seeded RNG);
//   departure       = max(now, link_free_at) + bytes / bandwidth;   link_free_at = departure
//   arrival         = max(departure + latency + U(-jitter, +jitter), previous arrival)  (FIFO, like TCP)
// and it is handed on at its arrival time (dropped then if the link got partitioned meanwhile).
// When more than max_queued_bytes wait in a direction, the relay stops reading that direction, so
// the app's socket meets its HWM as it would on a slow link (PUB drops, DEALER blocks).
// Parameters can change at run time from any thread; a change applies to messages taken after it.
// Subscriptions pass unshaped.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "daemon/net/liveness.h"
#include "daemon/net/socket.h"
#include "daemon/util/status.h"

namespace diloco::net {

struct LinkParams {
  double bandwidth_bytes_per_s = 0;  // 0: unlimited
  double latency_ms = 0;             // one way
  double jitter_ms = 0;              // uniform in [-jitter, +jitter] around the latency
  double loss = 0;                   // probability that a whole message is dropped, in [0, 1]
  bool partitioned = false;          // drop everything

  // e.g. Wan(2.0, 40): 2 Gbit/s, 40 ms one way.
  static LinkParams Wan(double gbit_per_s, double latency_ms) {
    LinkParams p;
    p.bandwidth_bytes_per_s = gbit_per_s * 1e9 / 8;
    p.latency_ms = latency_ms;
    return p;
  }
};
Status ValidateLinkParams(const LinkParams& p);

enum class LinkDirection { kUp = 0, kDown = 1 };  // up: app -> network; down: network -> app
const char* ToString(LinkDirection d);

struct LinkOptions {
  std::string name = "link";  // in log lines, e.g. "learner-2<->syncer"
  LinkParams up;
  LinkParams down;
  uint64_t seed = 1;                              // loss and jitter are deterministic for a seed
  int64_t max_queued_bytes = int64_t{256} << 20;  // per direction, before back-pressure
};

struct LinkStats {
  uint64_t delivered = 0;
  uint64_t delivered_bytes = 0;
  uint64_t dropped_loss = 0;
  uint64_t dropped_partition = 0;
  uint64_t queued = 0;  // messages waiting now
  uint64_t queued_bytes = 0;
};

// Pure: the schedule of one direction of a link.
struct LinkVerdict {
  enum Kind { kDeliver, kDropLoss, kDropPartition } kind = kDeliver;
  SteadyTime departure{};
  SteadyTime arrival{};
};
class LinkSchedule {
 public:
  // A message of `bytes` offered at now. Draws from rng only for loss (when loss > 0) and jitter
  // (when jitter > 0).
  LinkVerdict Admit(SteadyTime now, size_t bytes, const LinkParams& params, std::mt19937_64& rng);

 private:
  SteadyTime link_free_at_{};
  SteadyTime last_arrival_{};
};

class Link {
 public:
  static Status Create(NetContext& context, const LinkOptions& options, std::shared_ptr<Link>* out);
  ~Link();  // stops the relay (its sockets close with linger 0)
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  Status SetParams(LinkDirection direction, const LinkParams& params);
  LinkParams params(LinkDirection direction) const;
  // Partitions or heals both directions.
  void SetPartitioned(bool partitioned);
  LinkStats stats(LinkDirection direction) const;
  const std::string& name() const { return options_.name; }

  // For Socket::Connect: starts relaying an app socket of app_type (PUB, SUB, DEALER or PUSH) to
  // endpoint with options' security and limits; the app socket connects to *relay_endpoint.
  Status Attach(SocketType app_type, const SocketOptions& options, const std::string& endpoint,
                std::string* relay_endpoint);

 private:
  struct Queued {
    SteadyTime arrival;
    Message message;
    size_t bytes = 0;
  };
  struct Pair;
  struct AttachRequest {
    SocketType app_type;
    SocketOptions options;
    std::string endpoint;
    std::promise<std::pair<Status, std::string>> done;
  };

  Link(NetContext& context, const LinkOptions& options, int wake_fd);
  void Run();
  void Wake();
  std::pair<Status, std::string> DoAttach(const AttachRequest& req);
  void Admit(LinkDirection dir, Message&& m, std::deque<Queued>* queue, SteadyTime now);
  // Hands on due messages; returns the time of the next due message (or max).
  SteadyTime Release(LinkDirection dir, std::deque<Queued>* queue, Socket* target, SteadyTime now);

  NetContext& context_;
  LinkOptions options_;
  const int wake_fd_;
  std::thread thread_;
  std::atomic<bool> stop_{false};

  mutable std::mutex mu_;  // guards params_, stats_, requests_, running_
  LinkParams params_[2];
  LinkStats stats_[2];
  std::vector<std::unique_ptr<AttachRequest>> requests_;
  bool running_ = true;

  // Relay thread only.
  std::vector<std::unique_ptr<Pair>> pairs_;
  LinkSchedule schedule_[2];
  std::mt19937_64 rng_[2];
  bool retry_soon_ = false;
};

}  // namespace diloco::net
