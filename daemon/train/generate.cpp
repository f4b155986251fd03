#include "daemon/train/generate.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/rng.h"

namespace diloco {

std::string Generate(TrainingBackend& model, const std::string& prompt, const GenerateOptions& options,
                     const std::function<void(char)>& emit) {
  const int V = model.config().vocab_size, block = model.config().block_size;
  std::vector<int> context;
  for (unsigned char c : prompt.empty() ? std::string("\n") : prompt) context.push_back(c);
  Rng rng(options.seed);
  std::string out;
  std::vector<double> probs(V);
  std::vector<float> logit_row(V);
  for (int i = 0; i < options.tokens; i++) {
    const int T = std::min<int>(context.size(), block);
    model.next_token_logits(context.data() + context.size() - T, T, logit_row.data());
    const float* logits = logit_row.data();
    int next = (int)(std::max_element(logits, logits + V) - logits);
    if (options.temperature > 0) {
      // Softmax of logits / temperature, then one draw.
      const double maxv = logits[next];
      double sum = 0;
      for (int v = 0; v < V; v++) sum += probs[v] = std::exp((logits[v] - maxv) / options.temperature);
      double r = rng.uniform() * sum;
      for (next = 0; next < V - 1 && (r -= probs[next]) >= 0; next++) {
      }
    }
    context.push_back(next);
    out.push_back((char)next);
    if (emit) emit((char)next);
  }
  return out;
}

}  // namespace diloco
