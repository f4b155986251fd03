// AdamW (PyTorch semantics): bias-corrected moments, weight decay decoupled
// from the gradient. The caller passes weight_decay = 0 for tensors that
// must not decay (biases, LayerNorm).
#pragma once

#include <cstddef>

namespace diloco {

struct AdamWHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;  // multiplies every gradient first (global-norm clipping)
};

// In place over n elements; t is the 1-based step used for bias correction:
//   g = grad_scale * grads
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd * p)
void adamw_update(float* params, float* m, float* v, const float* grads,
                  size_t n, const AdamWHyper& hp, long t);

}  // namespace diloco
