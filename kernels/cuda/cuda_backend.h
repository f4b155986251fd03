// The CUDA training backend (kernels/backend.h): the GPT of kernels/gpt.h
// on one GPU with the kernels of this folder and cuBLASLt GEMMs.
// Precision: fp32 master weights, AdamW moments and parameter gradients;
// a bf16 copy of the weights (refreshed by AdamW and on upload) for the
// forward and backward; bf16 activations and activation gradients; fp32
// LayerNorm statistics, attention log-sum-exp and losses.
// Deterministic: one stream, no atomics, fixed reduction orders.
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.h"

namespace diloco::cuda {

// Makes the backend on CUDA device `device` (which must exist). Returns an
// empty string on success (see CreateBackend in kernels/backend.h).
std::string CreateCudaBackend(int device, const BackendOptions& options, std::unique_ptr<TrainingBackend>* out);

}  // namespace diloco::cuda
