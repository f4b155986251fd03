// The in-process gradient all-reduce of local ddp runs.
#include "daemon/train/thread_ring.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace diloco {
namespace {

TEST_CASE("thread ring: every member gets the same mean, summed in member order", "[unit]") {
  const int M = 3;
  const size_t n = 1001;  // not a multiple of M: the last chunk is short
  ThreadRing ring(M, n);
  std::vector<std::vector<float>> grads(M, std::vector<float>(n));
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  for (int round = 0; round < 3; round++) {
    for (auto& g : grads)
      for (float& x : g) x = dist(rng);
    std::vector<float> want(n);
    for (size_t i = 0; i < n; i++) want[i] = (grads[0][i] + grads[1][i] + grads[2][i]) * (1.0f / 3);
    std::vector<std::thread> threads;
    std::vector<int> ok(M, 0);
    for (int k = 0; k < M; k++) threads.emplace_back([&, k] { ok[k] = ring.MeanInPlace(k, grads[k].data()); });
    for (auto& t : threads) t.join();
    CHECK(ok == std::vector<int>{1, 1, 1});
    for (int k = 0; k < M; k++) CHECK(std::memcmp(grads[k].data(), want.data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("thread ring: Abort releases a member waiting for the others", "[unit]") {
  ThreadRing ring(2, 8);
  std::vector<float> g(8, 1.f);
  bool result = true;
  std::thread waiter([&] { result = ring.MeanInPlace(0, g.data()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ring.Abort();
  waiter.join();
  CHECK_FALSE(result);
  CHECK_FALSE(ring.MeanInPlace(1, g.data()));
}

TEST_CASE("thread ring: wire bytes of a ring all-reduce of fp32 values", "[unit]") {
  CHECK(ThreadRing::RingBytesPerMember(1, 1000) == 0);
  CHECK(ThreadRing::RingBytesPerMember(2, 1000) == 4000);  // 2 * 1/2 * 4 bytes * n
  CHECK(ThreadRing::RingBytesPerMember(4, 1000) == 6000);  // 2 * 3/4 * 4 bytes * n
}

}  // namespace
}  // namespace diloco
