// Text generation from a trained byte-level model (vocab 256): byte by byte, each step running
// the model on the last block_size tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kernels/backend.h"

namespace diloco {

struct GenerateOptions {
  int tokens = 200;
  double temperature = 1.0;  // 0 = always the most likely byte
  uint64_t seed = 1337;
};

// Continues prompt (an empty prompt starts from "\n"); calls emit with each
// new byte as soon as it is chosen and returns the continuation.
std::string Generate(TrainingBackend& model, const std::string& prompt, const GenerateOptions& options,
                     const std::function<void(char)>& emit = nullptr);

}  // namespace diloco
