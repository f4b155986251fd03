#include "kernels/cuda/device.h"

#include <cstring>

#include "kernels/cuda/common.cuh"

namespace diloco::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error
    return 0;
  }
  return n;
}

std::string device_description(int device) {
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %d SMs, %.1f GiB)", p.name, p.major, p.minor, p.multiProcessorCount,
                p.totalGlobalMem / 1073741824.0);
  return buf;
}

void set_device(int device) { CUDA_CHECK(cudaSetDevice(device)); }

double peak_bf16_flops() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp p{};
  CUDA_CHECK(cudaGetDeviceProperties(&p, device));
  // Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets.
  if (std::strstr(p.name, "H200") || std::strstr(p.name, "H100 80GB HBM3") || std::strstr(p.name, "H100 SXM"))
    return 989.4e12;
  if (std::strstr(p.name, "H100")) return 756.0e12;  // PCIe
  if (std::strstr(p.name, "A100")) return 312.0e12;
  return 0.0;
}

void* device_malloc(size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) return nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc of %zu bytes failed: %s; use a smaller batch or model\n", bytes,
                 cudaGetErrorString(err));
    std::abort();
  }
  return p;
}

void device_free(void* p) {
  if (p) CUDA_CHECK(cudaFree(p));
}

void* pinned_host_malloc(size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) return nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (err != cudaSuccess) {
    std::fprintf(stderr, "cudaHostAlloc of %zu pinned bytes failed: %s; free host memory or set train.outer_state: device\n",
                 bytes, cudaGetErrorString(err));
    std::abort();
  }
  // Kernels dereference it directly: under unified addressing its device pointer is itself.
  void* on_device = nullptr;
  CUDA_CHECK(cudaHostGetDevicePointer(&on_device, p, 0));
  if (on_device != p) {
    std::fprintf(stderr, "pinned host memory is not unified-addressed on this system: set train.outer_state: device\n");
    std::abort();
  }
  return p;
}

void pinned_host_free(void* p) {
  if (p) CUDA_CHECK(cudaFreeHost(p));
}

void copy_to_device(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_cuda(stream)));
  CUDA_CHECK(cudaStreamSynchronize(as_cuda(stream)));
}

void copy_to_host(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_cuda(stream)));
  CUDA_CHECK(cudaStreamSynchronize(as_cuda(stream)));
}

void copy_device_to_device(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_cuda(stream)));
}

void fill_bytes(void* dst, int value, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, as_cuda(stream)));
}

void synchronize(Stream stream) { CUDA_CHECK(cudaStreamSynchronize(as_cuda(stream))); }

Stream create_stream() {
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreate(&s));
  return reinterpret_cast<Stream>(s);
}

void destroy_stream(Stream stream) {
  if (stream) CUDA_CHECK(cudaStreamDestroy(as_cuda(stream)));
}

size_t device_memory_used_bytes() {
  size_t free_bytes = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  return total - free_bytes;
}

StreamEvent::StreamEvent() {
  cudaEvent_t e;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  event_ = e;
}

StreamEvent::~StreamEvent() { cudaEventDestroy(static_cast<cudaEvent_t>(event_)); }

void StreamEvent::record(Stream stream) { CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), as_cuda(stream))); }

void StreamEvent::wait(Stream waiter) const {
  CUDA_CHECK(cudaStreamWaitEvent(as_cuda(waiter), static_cast<cudaEvent_t>(event_), 0));
}

EventTimer::EventTimer(Stream stream) : stream_(stream) {
  cudaEvent_t b, e;
  CUDA_CHECK(cudaEventCreate(&b));
  CUDA_CHECK(cudaEventCreate(&e));
  begin_ = b;
  end_ = e;
}

EventTimer::~EventTimer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(begin_));
  cudaEventDestroy(static_cast<cudaEvent_t>(end_));
}

void EventTimer::start() { CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(begin_), as_cuda(stream_))); }

double EventTimer::stop_ms() {
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(end_), as_cuda(stream_)));
  CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(end_)));
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(begin_), static_cast<cudaEvent_t>(end_)));
  return ms;
}

}  // namespace diloco::cuda
