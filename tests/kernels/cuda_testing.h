// What every [cuda] test file needs: skip (with a warning) where no device is visible.
#pragma once

#include "kernels/cuda/device.h"

namespace diloco::testing {

inline bool have_cuda_device() {
  static const int n = cuda::device_count();
  return n > 0;
}

}  // namespace diloco::testing

#define REQUIRE_CUDA_DEVICE()                                            \
  do {                                                                   \
    if (!::diloco::testing::have_cuda_device()) {                        \
      WARN("no CUDA device on this machine: skipping this [cuda] test"); \
      return;                                                            \
    }                                                                    \
  } while (0)
