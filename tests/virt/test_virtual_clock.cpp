// The virtual clock's parts: the scheduler's order and the emulated link's timing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "daemon/virt/scheduler.h"
#include "daemon/virt/virtual_link.h"

namespace diloco {

TEST_CASE("the virtual scheduler runs events by time, ties in the order they were scheduled", "[virt]") {
  VirtualScheduler s;
  std::vector<int> order;
  s.At(30, [&] { order.push_back(3); });
  s.At(10, [&] { order.push_back(1); });
  s.At(10, [&] { order.push_back(2); });
  const uint64_t cancelled = s.At(20, [&] { order.push_back(99); });
  s.At(40, [&] {
    order.push_back(4);
    s.At(0, [&] { order.push_back(5); });  // the past runs now, after what is due now
    s.After(0, [&] { order.push_back(6); });
  });
  s.Cancel(cancelled);
  while (s.RunNext()) {
  }
  CHECK(order == std::vector<int>{1, 2, 3, 4, 5, 6});
  CHECK(s.now_ns() == 40);
  CHECK(s.events_run() == 6);
  CHECK(s.unix_ms() == VirtualScheduler::kEpochUnixMs);
  CHECK(VirtualScheduler::ToNs(s.now()) == 40);
}

TEST_CASE("a virtual link serialises at its bandwidth, adds latency and keeps order", "[virt]") {
  LinkConfig lc;
  lc.bandwidth_mbps = 8;  // 1 byte per microsecond
  lc.latency_ms = 30;
  VirtualLink link(lc, 1);
  const auto a = link.Send(0, 1000);       // 1 ms on the wire
  const auto b = link.Send(0, 1000);       // waits for a
  const auto c = link.Send(10000000, 10);  // 10 ms later: the link is free again
  REQUIRE(a);
  REQUIRE(b);
  REQUIRE(c);
  CHECK(*a == 1000000 + 30000000);
  CHECK(*b == 2000000 + 30000000);
  CHECK(*c == 10000000 + 10000 + 30000000);
  CHECK(link.bytes_sent() == 2010);
  CHECK(link.busy_ns() == 2010000);
}

TEST_CASE("a virtual link's losses and jitter repeat with its seed, and a cut loses everything", "[virt]") {
  LinkConfig lc;
  lc.latency_ms = 5;
  lc.jitter_ms = 20;
  lc.loss = 0.3;
  auto run = [&](uint64_t seed) {
    VirtualLink link(lc, seed);
    std::vector<int64_t> out;
    for (int i = 0; i < 200; i++) out.push_back(link.Send(i * 1000000, 100).value_or(-1));
    return out;
  };
  const auto a = run(7), b = run(7), c = run(8);
  CHECK(a == b);
  CHECK(a != c);
  const long lost = std::count(a.begin(), a.end(), -1);
  CHECK(lost > 30);
  CHECK(lost < 90);
  int64_t last = 0;
  for (int64_t t : a)
    if (t >= 0) {
      CHECK(t >= last);  // no reordering
      last = t;
    }
  VirtualLink cut(LinkConfig{}, 1);
  cut.SetCut(true);
  CHECK_FALSE(cut.Send(0, 10));
  cut.SetCut(false);
  CHECK(cut.Send(0, 10));
}

TEST_CASE("a virtual link's duplicates and reorderings repeat with their seed, and leave it as it was without", "[virt]") {
  LinkConfig lc;
  lc.latency_ms = 5;
  lc.jitter_ms = 2;
  lc.loss = 0.1;
  // (arrival, copy's arrival) per message; -1: none.
  auto run = [&](uint64_t seed, const LinkFaults* faults) {
    VirtualLink link(lc, 7);
    if (faults) link.SetFaults(*faults, seed);
    std::vector<std::pair<int64_t, int64_t>> out;
    for (int i = 0; i < 400; i++) {
      const int64_t at = link.Send(i * 1000000, 100).value_or(-1);
      out.push_back({at, at >= 0 && link.duplicate_ns() ? *link.duplicate_ns() : -1});
    }
    return out;
  };
  const auto plain = run(0, nullptr);
  const LinkFaults zero;
  const auto none = run(3, &zero);  // all 0: as without
  CHECK(none == plain);
  LinkFaults f;
  f.duplicate = 0.2;
  f.reorder = 0.2;
  f.window_ms = 30;
  const auto a = run(3, &f), b = run(3, &f), c = run(4, &f);
  CHECK(a == b);
  CHECK(a != c);
  int copies = 0, overtaken = 0;
  int64_t latest = -1;
  for (size_t i = 0; i < a.size(); i++) {
    CHECK((a[i].first < 0) == (plain[i].first < 0));  // the same messages are lost
    if (a[i].first < 0) continue;
    if (a[i].second >= 0) {
      copies++;
      CHECK(a[i].second >= a[i].first);
      CHECK(a[i].second <= a[i].first + 30000000);
    }
    overtaken += a[i].first < latest;  // a later message arrived before this one
    latest = std::max(latest, a[i].first);
  }
  CHECK(copies > 40);
  CHECK(copies < 110);
  CHECK(overtaken > 20);
}

}  // namespace diloco
