// PeerViews (control/peer_views.h) with a fake fetch: first answers are waited for briefly,
// later ones come from the cache at once, failures are kept apart from the last good view, and a
// slow or dead peer never makes Get wait longer than its first-answer bound.
#include "daemon/control/peer_views.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

namespace diloco {
namespace {

using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

}  // namespace

TEST_CASE("peer views: a first answer is waited for, then served from the cache and refreshed", "[unit]") {
  std::atomic<int> calls{0};
  std::atomic<bool> fail{false};
  PeerViews::Options o;
  o.refresh_ms = 50;
  PeerViews views(
      [&](const std::string& site, const std::string& job, nlohmann::json* view) {
        calls++;
        if (fail) return Status::Error(site + " is down");
        *view = {{"site", site}, {"job", job}, {"n", calls.load()}};
        return Status::Ok();
      },
      o);
  PeerViews::View v = views.Get("site-b", "j1");
  REQUIRE(v.ok);
  CHECK(v.json["job"] == "j1");
  CHECK(v.error.empty());
  const int first = v.json["n"];
  // A live peer: every waiting Get sees a view fetched after it asked (status shows what just
  // happened, e.g. a learner that completed a moment ago).
  CHECK(views.Get("site-b", "j1").json["n"].get<int>() > first);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  v = views.Get("site-b", "j1", /*wait=*/false);
  CHECK(v.json["n"].get<int>() > first);  // refreshed in the background
  CHECK(v.age_ms >= 0);
  CHECK(v.age_ms < 300);
  // A failure keeps the last good view and says what went wrong.
  fail = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  v = views.Get("site-b", "j1", false);
  CHECK(v.ok);
  CHECK(v.error == "site-b is down");
  fail = false;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(views.Get("site-b", "j1", false).error.empty());
}

TEST_CASE("peer views: a peer that does not answer costs Get at most its first wait", "[unit]") {
  PeerViews::Options o;
  o.fresh_wait_ms = 100;
  PeerViews views(
      [&](const std::string&, const std::string&, nlohmann::json*) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // a dead peer's timeout
        return Status::Error("no reply within 1500 ms");
      },
      o);
  const auto t0 = Clock::now();
  PeerViews::View v = views.Get("site-x", "j1");
  CHECK(MsSince(t0) < 1000);
  CHECK_FALSE(v.ok);
  CHECK(v.age_ms == -1);
  // Asked again while the first call still hangs: at once, no answer.
  const auto t1 = Clock::now();
  v = views.Get("site-x", "j1");
  CHECK(MsSince(t1) < 1000);
  CHECK_FALSE(v.ok);
}

TEST_CASE("peer views: views nobody asks for stop being fetched", "[unit]") {
  std::atomic<int> calls{0};
  PeerViews::Options o;
  o.refresh_ms = 20;
  o.keep_wanted_ms = 100;
  PeerViews views(
      [&](const std::string&, const std::string&, nlohmann::json* view) {
        calls++;
        *view = nlohmann::json::object();
        return Status::Ok();
      },
      o);
  REQUIRE(views.Get("site-b", "j1").ok);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int settled = calls;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(calls == settled);  // no longer wanted: no more calls
}

}  // namespace diloco
