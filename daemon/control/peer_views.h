// What other sites say about a job (their peer_status views), kept fresh off the daemon's loop.
// Asking a peer takes a round trip, and a peer that is down takes the whole timeout: done on the
// control thread, one dead peer stalled every command. Here each peer site has a worker thread
// that refreshes the views asked for recently (about every refresh_ms). Get asks for a fresh view
// and waits for it only as long as the site has earned: up to fresh_wait_up_ms when its last
// answer came (a live peer answers in milliseconds, so status shows what just happened), up to
// fresh_wait_ms when its last call failed or it never answered (it may be down: status must not
// hang on it); then it returns the latest view it has.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "daemon/util/status.h"

namespace diloco {

class PeerViews {
 public:
  // Runs on a worker thread: site's view of job (or why there is none).
  using Fetch = std::function<Status(const std::string& site, const std::string& job, nlohmann::json* view)>;

  struct Options {
    int refresh_ms = 1000;         // a wanted view is asked for again this often
    int keep_wanted_ms = 30000;    // views nobody asked for this long are no longer refreshed
    int fresh_wait_ms = 150;     // Get's longest wait when the site's last call failed
    int fresh_wait_up_ms = 500;  // ... and when it answered
  };

  PeerViews(Fetch fetch, Options options);
  ~PeerViews();  // stops and joins the workers (each finishes its current fetch)

  struct View {
    bool ok = false;         // json holds an answer (maybe an old one: see age_ms)
    nlohmann::json json;
    std::string error;       // the last fetch's failure, if it failed
    int64_t age_ms = -1;     // since json was fetched; -1: never
  };
  // Also marks (site, job) as wanted. wait: false never waits (periodic checks, which take
  // what the background refresh has).
  View Get(const std::string& site, const std::string& job, bool wait = true);

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    View view;
    Clock::time_point fetched{};       // when view.json came
    Clock::time_point tried{};         // the last fetch's end, answered or not
    Clock::time_point tried_started{}; // ... and its start
    Clock::time_point wanted{};
    bool answered_once = false, tried_once = false;
    bool urgent = false;  // a Get waits for a fresh fetch
  };
  struct Site {
    std::map<std::string, Entry> jobs;  // guarded by mu_
    bool up = false;                    // its last call, for any job, was answered
    std::thread worker;
  };
  void Work(const std::string& site);

  const Fetch fetch_;
  const Options options_;
  std::mutex mu_;
  std::condition_variable cv_;  // a new wish, an answer, or stop
  bool stop_ = false;
  std::map<std::string, std::unique_ptr<Site>> sites_;
};

}  // namespace diloco
