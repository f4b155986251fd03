// train.outer_state: host (kernels/outer_place.h) on the CUDA backend: the outer-sync state in
// pinned host memory, used in place by the same kernels, must give the device placement's bytes
// (payloads, bases, parameters) through setup, encode, apply, fold, shift and install, and take
// its 16 B a parameter off the GPU. [cuda] tests skip where no device is visible.
#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/device.h"
#include "tests/kernels/cuda_testing.h"
#include "tests/kernels/op_testing.h"

namespace diloco {

TEST_CASE("cuda: outer state in pinned host memory gives the device placement's bytes", "[cuda][outer]") {
  REQUIRE_CUDA_DEVICE();
  BackendOptions o;
  o.model.vocab_size = 64;
  o.model.block_size = 16;
  o.model.n_layer = 2;
  o.model.n_embd = 256;
  o.model.n_head = 4;
  o.max_batch = 2;
  std::unique_ptr<TrainingBackend> on_device, on_host;
  REQUIRE(CreateBackend("cuda", o, &on_device).empty());
  o.outer_state = OuterStatePlace::kHost;
  REQUIRE(CreateBackend("cuda", o, &on_host).empty());
  const size_t n = on_device->num_params();
  const std::vector<float> theta = testing::random_vec<float>(n, 11, 0.1);
  // Two fragments: the first and second halves, the second cut in two ranges.
  const std::vector<std::vector<ParamRange>> fragments = {{{0, n / 2}}, {{n / 2, n / 4}, {n / 2 + n / 4, n - n / 2 - n / 4}}};
  size_t before = cuda::device_memory_used_bytes();
  on_host->upload_params(theta.data());
  on_host->sync_setup(fragments);
  const size_t host_taken = cuda::device_memory_used_bytes() - before;
  before = cuda::device_memory_used_bytes();
  on_device->upload_params(theta.data());
  on_device->sync_setup(fragments);
  const size_t device_taken = cuda::device_memory_used_bytes() - before;
  CHECK(on_host->allocated().outer_state_host == 16 * n);
  CHECK(on_device->allocated().outer_state_host == 0);
  CHECK(on_host->allocated().outer_state == on_device->allocated().outer_state);
  // The 16 B a parameter left the GPU (cudaMemGetInfo counts 2 MiB pages: 4 MiB of slack).
  INFO("GPU memory taken by sync_setup: host placement " << host_taken << ", device " << device_taken << " bytes, "
                                                          << n << " parameters");
  CHECK(device_taken + (size_t{4} << 20) >= host_taken + 16 * n);

  // A few inner steps' worth of change, then every sync op on both, comparing bytes.
  const std::vector<float> moved = testing::random_vec<float>(n, 12, 0.1);
  for (int round = 0; round < 3; round++) {
    for (TrainingBackend* b : {on_device.get(), on_host.get()}) b->upload_params(moved.data());
    for (int p = 0; p < 2; p++) {
      const SyncCodec kind = round == 0 ? SyncCodec::kFp32 : SyncCodec::kInt8;
      std::vector<uint8_t> pay_d, pay_h;
      std::vector<uint64_t> bytes_d, bytes_h;
      REQUIRE(on_device->sync_encode_delta(p, kind, 64, &pay_d, &bytes_d));
      REQUIRE(on_host->sync_encode_delta(p, kind, 64, &pay_h, &bytes_h));
      CHECK(pay_d == pay_h);
      CHECK(bytes_d == bytes_h);
      REQUIRE(on_device->sync_apply_update(p, pay_d.data(), pay_d.size(), kind, 64));
      REQUIRE(on_host->sync_apply_update(p, pay_h.data(), pay_h.size(), kind, 64));
      on_device->sync_shift_at_send(p);
      on_host->sync_shift_at_send(p);
      on_device->sync_fold(p, FoldMode::kReplay, 0.0, FoldIncluded::kAtSend);
      on_host->sync_fold(p, FoldMode::kReplay, 0.0, FoldIncluded::kAtSend);
      const size_t numel = p == 0 ? n / 2 : n - n / 2;
      std::vector<float> base_d(numel), base_h(numel);
      on_device->sync_read_base(p, base_d.data());
      on_host->sync_read_base(p, base_h.data());
      CHECK(base_d == base_h);
    }
    std::vector<float> params_d(n), params_h(n);
    on_device->download_params(params_d.data());
    on_host->download_params(params_h.data());
    CHECK(params_d == params_h);
  }
  // Install and a residual reset (the host placement zeroes on the host).
  std::vector<float> packed(n / 2, 0.25f);
  on_device->sync_install(0, packed.data());
  on_host->sync_install(0, packed.data());
  on_device->sync_reset_residual(1);
  on_host->sync_reset_residual(1);
  std::vector<uint8_t> pay_d, pay_h;
  std::vector<uint64_t> bytes_d, bytes_h;
  REQUIRE(on_device->sync_encode_delta(0, SyncCodec::kBf16, 64, &pay_d, &bytes_d));
  REQUIRE(on_host->sync_encode_delta(0, SyncCodec::kBf16, 64, &pay_h, &bytes_h));
  CHECK(pay_d == pay_h);
}

}  // namespace diloco
