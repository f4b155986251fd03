// Fused softmax + cross-entropy over the vocabulary. Shapes: shapes.h.
#pragma once

namespace diloco {

// probs (N,V) = softmax(logits (N,V)); losses (N) = -log probs[n, targets[n]].
// probs may alias logits (computed in place).
template <typename F>
void softmax_crossentropy_forward(F* losses, F* probs, const F* logits,
                                  const int* targets, int N, int V);

// OVERWRITES dlogits (N,V) = (probs - onehot(targets)) * dloss, the gradient of
// dloss * sum(losses). dlogits may alias probs.
template <typename F>
void softmax_crossentropy_backward(F* dlogits, const F* probs,
                                   const int* targets, F dloss, int N, int V);

}  // namespace diloco
