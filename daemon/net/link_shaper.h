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
//
// The model, per direction. Each socket attached to the link is a flow (as each ZeroMQ socket is
// its own TCP connection); a flow is FIFO, and the flows with messages waiting share the bandwidth
// equally (processor sharing), so a heartbeat socket is not stuck behind a 64 MiB delta on another
// socket, while two deltas on one socket go one after the other. For each message, in order:
//   dropped      when the direction is partitioned, or with probability `loss` (seeded RNG);
//   corrupted    with probability `corrupt`: one byte of its last frame flipped (the receiver's
//                checks must catch it);
//   departure    when the flow's share of the bandwidth has carried all its bytes (one flow
//                alone: departure = max(now, flow busy until) + bytes / bandwidth);
//   arrival      = max(departure + latency + U(-jitter, +jitter), the flow's previous arrival);
// and it is handed on at its arrival time (dropped then if the link got partitioned meanwhile).
// When more than max_queued_bytes wait in a direction, the relay stops reading that direction, so
// the app's socket meets its HWM as it would on a slow link (PUB drops, DEALER blocks).
// Parameters can change at run time from any thread: bandwidth from the moment of the change, the
// other parameters for messages departing after it. Subscriptions pass unshaped.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <functional>
#include <map>
#include <memory>
#include <optional>
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
  double loss = 0;                   // probability that a whole ZeroMQ message is dropped, in [0, 1]
                                     // (a chunked delta is n + 1 of them: chunk_frame.h)
  bool partitioned = false;          // drop everything
  double corrupt = 0;                // probability that one byte of a message is flipped, in [0, 1]

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
  uint64_t corrupted = 0;  // delivered with one byte flipped (params.corrupt)
  uint64_t queued = 0;  // messages waiting now
  uint64_t queued_bytes = 0;
};

// Pure: whether a message offered to a link direction is dropped. Draws from rng only when
// loss > 0 (so a seed gives the same drops for the same message order).
enum class LinkDrop { kNone, kLoss, kPartition };
LinkDrop DecideDrop(const LinkParams& params, std::mt19937_64& rng);

// Pure: when a message that departed at `departure` arrives: latency plus jitter, never before the
// flow's previous arrival (a flow is a TCP stream: no reordering). Draws from rng only when
// jitter > 0.
SteadyTime ArrivalTime(SteadyTime departure, const LinkParams& params, SteadyTime previous_arrival,
                       std::mt19937_64& rng);

// Pure: one direction's bandwidth shared fairly by its flows (processor sharing); FIFO per flow.
// Time only moves forward through the calls; every call first serves the flows up to `now`.
class FairShareSchedule {
 public:
  struct Departure {
    int flow = 0;
    SteadyTime time{};  // when the message's last byte left
  };
  explicit FairShareSchedule(double bytes_per_s = 0) : bytes_per_s_(bytes_per_s) {}

  // Messages that finished by now are appended to out (in departure order).
  void Advance(SteadyTime now, std::vector<Departure>* out);
  // A new rate from now on (0: unlimited, everything waiting departs now).
  void SetBandwidth(SteadyTime now, double bytes_per_s, std::vector<Departure>* out);
  // A message of `bytes` joins the end of flow's queue at now (with unlimited bandwidth it departs
  // at once, appended to out).
  void Enqueue(int flow, size_t bytes, SteadyTime now, std::vector<Departure>* out);
  // When the next message will have departed, if nothing else joins; nullopt when idle.
  std::optional<SteadyTime> NextDeparture() const;
  size_t waiting() const { return waiting_; }
  double bandwidth() const { return bytes_per_s_; }

 private:
  double bytes_per_s_;
  SteadyTime clock_{};
  bool started_ = false;
  size_t waiting_ = 0;
  std::map<int, std::deque<double>> flows_;  // remaining bytes of each waiting message
};

class Link {
 public:
  static Status Create(NetContext& context, const LinkOptions& options, std::shared_ptr<Link>* out);
  ~Link();  // stops the relay (its sockets close with linger 0)
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  Status SetParams(LinkDirection direction, const LinkParams& params);
  LinkParams params(LinkDirection direction) const;
  // change applied to each direction's params at once (chaos: partition, loss, corruption);
  // nothing changes when the result is invalid.
  Status Change(const std::function<void(LinkParams*)>& change);
  // Partitions or heals both directions.
  void SetPartitioned(bool partitioned);
  LinkStats stats(LinkDirection direction) const;
  const std::string& name() const { return options_.name; }

  // For Socket::Connect: starts relaying an app socket of app_type (PUB, SUB, DEALER or PUSH) to
  // endpoint with options' security and limits; the app socket connects to *relay_endpoint.
  Status Attach(SocketType app_type, const SocketOptions& options, const std::string& endpoint,
                std::string* relay_endpoint);

 private:
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
  // A message enters direction dir of pair p (dropped, or queued for the link).
  void Admit(int dir, size_t pair, Message&& m, SteadyTime now);
  // Copies params_ for the relay; a bandwidth change applies from now.
  void SyncParams(SteadyTime now);
  // Moves departed messages to in-flight with their arrival time.
  void Depart(int dir, const std::vector<FairShareSchedule::Departure>& departures);
  // Hands on in-flight messages that have arrived; returns the next arrival (or max).
  SteadyTime Release(int dir, Pair* p, SteadyTime now);

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
  FairShareSchedule schedule_[2];
  LinkParams current_[2];  // the parameters the relay works with (copied from params_ each loop)
  std::mt19937_64 rng_[2];
  bool retry_soon_ = false;
};

}  // namespace diloco::net
