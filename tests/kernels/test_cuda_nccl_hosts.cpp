// NCCL rings across hosts (kernels/cuda/nccl_comm.h, NcclCommGroup::CreateAcrossHosts): the
// processes meet through a CommStore (here a DirectoryCommStore in a temp dir; dilocod's is its
// control channel). On one GPU: a ring of one process, and a ring whose second host never comes
// (it must fail within its deadline, not hang). With two GPUs: two "hosts" (threads), one GPU
// each, whose all-reduce is the sum. [cuda] tests skip where no device is visible.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "kernels/comm/comm_store.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/nccl_comm.h"
#include "tests/kernels/cuda_testing.h"
#include "tests/kernels/op_testing.h"
#include "tests/temp_dir.h"

namespace diloco {
namespace {

using cuda::DeviceArray;
using testing::random_vec;

cuda::NcclAcrossHostsOptions Across(const std::string& store_dir, std::vector<int> devices, int world, int first,
                                     int64_t timeout_ms) {
  cuda::NcclAcrossHostsOptions o;
  o.ring_name = "test-ring";
  o.devices = std::move(devices);
  o.world_size = world;
  o.first_rank = first;
  o.timeout_ms = timeout_ms;
  o.store = std::make_shared<DirectoryCommStore>(store_dir);
  return o;
}

}  // namespace

TEST_CASE("cuda: an NCCL ring across hosts of one process runs every collective", "[cuda][nccl][hosts]") {
  REQUIRE_CUDA_DEVICE();
  testing::TempDir dir;
  std::unique_ptr<cuda::NcclCommGroup> group;
  const std::string err = cuda::NcclCommGroup::CreateAcrossHosts(Across(dir.file("store"), {0}, 1, 0, 30000), {}, &group);
  REQUIRE(err.empty());
  CHECK(group->world_size() == 1);
  std::unique_ptr<LocalComm> comm = group->comm(0);
  CHECK(comm->rank() == 0);
  const auto x = random_vec<float>(4099, 5);
  DeviceArray<float> dx(x);
  REQUIRE(comm->all_reduce(dx.get(), x.size(), ReduceOp::kSum).ok());
  CHECK(dx.download() == x);
  REQUIRE(comm->reduce_scatter(dx.get(), {x.size()}, ReduceOp::kMean).ok());
  REQUIRE(comm->all_gather(dx.get(), {x.size()}).ok());
  CHECK(dx.download() == x);
  REQUIRE(comm->barrier().ok());
  group->abort("test: host 1 declared dead");
  const CommStatus st = comm->all_reduce(dx.get(), x.size(), ReduceOp::kSum);
  CHECK_FALSE(st.ok());
  CHECK(st.error.find("host 1 declared dead") != std::string::npos);
}

TEST_CASE("cuda: an NCCL ring whose other host never joins fails within its deadline", "[cuda][nccl][hosts]") {
  REQUIRE_CUDA_DEVICE();
  testing::TempDir dir;
  std::unique_ptr<cuda::NcclCommGroup> group;
  const auto t0 = std::chrono::steady_clock::now();
  // Host 0 of 2: draws the id, publishes it, waits for rank 1.
  std::string err = cuda::NcclCommGroup::CreateAcrossHosts(Across(dir.file("store"), {0}, 2, 0, 2000), {}, &group);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK_THAT(err, Catch::Contains("not every host joined within 2000 ms"));
  CHECK(s < 20.0);
  // Host 1 of 2 on an empty store: no id comes.
  testing::TempDir empty;
  err = cuda::NcclCommGroup::CreateAcrossHosts(Across(empty.file("store"), {0}, 2, 1, 500), {}, &group);
  CHECK_THAT(err, Catch::Contains("waiting for NCCL's unique id"));
}

TEST_CASE("cuda: two hosts of one GPU each sum their buffers", "[cuda][nccl][hosts]") {
  REQUIRE_CUDA_DEVICE();
  if (cuda::device_count() < 2) {
    WARN("one GPU: NCCL refuses two ranks on one device; skipping the two-host ring");
    return;
  }
  testing::TempDir dir;
  const auto a = random_vec<float>(3001, 1), b = random_vec<float>(3001, 2);
  std::vector<float> out[2];
  std::string errs[2];
  auto host = [&](int h) {
    std::unique_ptr<cuda::NcclCommGroup> group;
    errs[h] = cuda::NcclCommGroup::CreateAcrossHosts(Across(dir.file("store"), {h}, 2, h, 30000), {}, &group);
    if (!errs[h].empty()) return;
    std::unique_ptr<LocalComm> comm = group->comm(0);
    cuda::set_device(h);
    DeviceArray<float> d(h == 0 ? a : b);
    const CommStatus st = comm->all_reduce(d.get(), a.size(), ReduceOp::kSum);
    if (!st.ok()) errs[h] = st.error;
    out[h] = d.download();
  };
  std::thread h1(host, 1);
  host(0);
  h1.join();
  REQUIRE(errs[0].empty());
  REQUIRE(errs[1].empty());
  for (size_t i = 0; i < a.size(); i++) {
    CHECK(out[0][i] == a[i] + b[i]);
    CHECK(out[1][i] == a[i] + b[i]);
  }
}

}  // namespace diloco
