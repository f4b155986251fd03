#include "daemon/sync/fold.h"

#include <cstring>

#include "kernels/check.h"

namespace diloco {

void FoldGlobal(FoldRule rule, double alpha, const float* global, const float* included,
                float* local, size_t n) {
  switch (rule) {
    case FoldRule::kOverwrite:
      std::memcpy(local, global, n * sizeof(float));
      return;
    case FoldRule::kReplay:
      DL_CHECK(included != nullptr, "fold replay needs theta as of the delta Θ includes");
      for (size_t i = 0; i < n; ++i) local[i] = global[i] + (local[i] - included[i]);
      return;
    case FoldRule::kMix: {
      const float a = (float)alpha, b = (float)(1.0 - alpha);
      for (size_t i = 0; i < n; ++i) local[i] = a * local[i] + b * global[i];
      return;
    }
  }
}

}  // namespace diloco
