// CreateBackend: picks the backend by name. Its own library
// (diloco_backend) so that diloco_kernels does not depend on the CUDA
// backend, which depends on diloco_kernels.
#include <cstdlib>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#ifdef DILOCO_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device.h"
#endif

namespace diloco {

bool BackendCompiled(const std::string& kind) {
  if (kind == "cpu") return true;
#ifdef DILOCO_HAVE_CUDA
  if (kind == "cuda") return true;
#endif
  return false;
}

std::string CreateBackend(const std::string& device, const BackendOptions& options,
                          std::unique_ptr<TrainingBackend>* out) {
  const GptConfig& m = options.model;
  if (m.vocab_size < 1 || m.block_size < 1 || m.n_layer < 0 || m.n_embd < 1 || m.n_head < 1 ||
      m.n_embd % m.n_head != 0 || options.max_batch < 1) {
    return "invalid model for a backend (vocab " + std::to_string(m.vocab_size) + ", block " +
           std::to_string(m.block_size) + ", n_embd " + std::to_string(m.n_embd) + ", n_head " +
           std::to_string(m.n_head) + ", max_batch " + std::to_string(options.max_batch) +
           "): n_embd must be a multiple of n_head and every size positive";
  }
  if (device == "cpu") {
    *out = std::make_unique<CpuBackend>(options);
    return "";
  }
  if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
#ifdef DILOCO_HAVE_CUDA
    int index = 0;
    if (device.size() > 5) {
      char* end = nullptr;
      const long v = std::strtol(device.c_str() + 5, &end, 10);
      if (*end != '\0' || v < 0 || v > 1024) return "bad device \"" + device + "\": use cuda or cuda:N";
      index = (int)v;
    }
    const int count = cuda::device_count();
    if (count == 0) {
      return "device \"" + device +
             "\": no CUDA device is visible (check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES), "
             "or train on the cpu";
    }
    if (index >= count) {
      return "device \"" + device + "\": only " + std::to_string(count) + " CUDA device(s) visible (cuda:0.." +
             std::to_string(count - 1) + ")";
    }
    return cuda::CreateCudaBackend(index, options, out);
#else
    return "device \"" + device +
           "\": this build has no CUDA backend; rebuild with the CUDA toolkit installed "
           "(cmake -DDILOCO_CUDA=ON) or train on the cpu";
#endif
  }
  return "unknown device \"" + device + "\": use cpu, cuda or cuda:N";
}

}  // namespace diloco
