// LocalRing::CreateAcrossHosts (daemon/train/local_ring.h): two "hosts" (threads of this test)
// form one ring of 2 × 2 ranks over Gloo on 127.0.0.1, meeting through a DirectoryCommStore; the
// refusals name what to change; a GPU ring across hosts without its GPUs or its second host fails
// with what is missing.
#include <catch2/catch.hpp>

#include <thread>

#include "daemon/train/local_ring.h"
#include "daemon/train/ring_member.h"
#include "kernels/comm/comm_store.h"
#include "tests/temp_dir.h"

namespace diloco {
namespace {

LocalRingOptions Tiny(int hosts) {
  LocalRingOptions o;
  o.ranks = 2;
  o.hosts = hosts;
  o.model.vocab_size = 16;
  o.model.block_size = 4;
  o.model.n_layer = 1;
  o.model.n_embd = 8;
  o.model.n_head = 2;
  o.threads = 2;
  return o;
}

}  // namespace

#ifdef DILOCO_HAVE_GLOO
TEST_CASE("a ring across two hosts: global ranks, one all-reduce over every rank", "[net]") {
  testing::TempDir dir;
  auto store = std::make_shared<DirectoryCommStore>(dir.file("store"));
  std::vector<std::unique_ptr<LocalRing>> rings(2);
  std::vector<Status> made(2);
  std::vector<std::thread> hosts;
  for (int h = 0; h < 2; h++) {
    hosts.emplace_back([&, h] {
      RingAcrossHosts a;
      a.host = h;
      a.hosts = 2;
      a.ring_name = RingIncarnationName("job", 0, 1, 0);
      a.ring_address = "127.0.0.1";
      a.timeout_ms = 20000;
      a.store = store;
      made[h] = LocalRing::CreateAcrossHosts(Tiny(2), a, &rings[h]);
    });
  }
  for (auto& t : hosts) t.join();
  REQUIRE(made[0].ok());
  REQUIRE(made[1].ok());
  CHECK(rings[0]->ranks() == 2);
  CHECK(rings[0]->world_ranks() == 4);
  CHECK(rings[0]->first_rank() == 0);
  CHECK(rings[1]->first_rank() == 2);
  CHECK_THAT(rings[1]->description(), Catch::Contains("2 ranks of 4"));
  // Every global rank g contributes g + 1: the sum is 10 on every rank.
  std::vector<std::vector<float>> out(4);
  std::vector<Status> ran(2);
  hosts.clear();
  for (int h = 0; h < 2; h++) {
    hosts.emplace_back([&, h] {
      ran[h] = rings[h]->Run([&](int r) -> Status {
        const int g = rings[h]->first_rank() + r;
        std::vector<float> buf(5, (float)(g + 1));
        CommStatus cs = rings[h]->comm(r).all_reduce(buf.data(), buf.size(), ReduceOp::kSum);
        if (!cs.ok()) return Status::Error(cs.error);
        out[g] = buf;
        return Status::Ok();
      });
    });
  }
  for (auto& t : hosts) t.join();
  REQUIRE(ran[0].ok());
  REQUIRE(ran[1].ok());
  for (int g = 0; g < 4; g++) CHECK(out[g] == std::vector<float>(5, 10.0f));
}
#endif

TEST_CASE("a ring across hosts refuses what it cannot run, saying what to change", "[unit]") {
  RingAcrossHosts a;
  a.host = 2;
  a.hosts = 2;
  a.ring_name = "r";
  std::unique_ptr<LocalRing> ring;
  CHECK_THAT(LocalRing::CreateAcrossHosts(Tiny(2), a, &ring).message(), Catch::Contains("not among train.hosts 2"));
  a.host = 0;
  CHECK_THAT(LocalRing::CreateAcrossHosts(Tiny(2), a, &ring).message(), Catch::Contains("no rendezvous store"));
  // LocalRing::Create refuses hosts > 1: that ring needs its store and its hosts (dilocod's).
  CHECK_THAT(LocalRing::Create(Tiny(2), &ring).message(), Catch::Contains("site_hosts"));
}

TEST_CASE("a GPU ring across hosts says what is missing here: the GPUs, or the other host", "[unit]") {
  testing::TempDir dir;
  RingAcrossHosts a;
  a.host = 0;
  a.hosts = 2;
  a.ring_name = "gpu-ring";
  a.timeout_ms = 300;  // host 1 never comes
  a.store = std::make_shared<DirectoryCommStore>(dir.file("store"));
  LocalRingOptions gpu = Tiny(2);
  gpu.device = "cuda";
  std::unique_ptr<LocalRing> ring;
  const Status st = LocalRing::CreateAcrossHosts(gpu, a, &ring);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("ring gpu-ring (host 0 of 2)"));
  if (CheckDeviceAvailable("cuda", 2).empty()) {
    // Two GPUs here (scripts/gpu-check.sh on a lent machine): host 0 drew NCCL's id and waited.
    CHECK_THAT(st.message(), Catch::Contains("not every host joined within 300 ms"));
  } else {
    // No GPU (or no CUDA in this build): the backend of rank 0 says so before any rendezvous.
    CHECK_THAT(st.message(), Catch::Contains("train.device cuda (rank 0 of 4)"));
  }
}

TEST_CASE("ring incarnation names differ per attempt and per start of host 0", "[unit]") {
  CHECK(RingIncarnationName("j", 1, 100, 0) == "j.learner-1.100.0");
  CHECK(RingIncarnationName("j", 1, 100, 1) != RingIncarnationName("j", 1, 100, 0));
  CHECK(RingIncarnationName("j", 1, 101, 0) != RingIncarnationName("j", 1, 100, 0));
  CHECK(RingPointerName(1) == "learner-1");
}

}  // namespace diloco
