// Device memory and streams for code outside the .cu files (the backend,
// tests, benchmarks), without CUDA headers. Failures of the CUDA runtime
// abort with the error (CUDA_CHECK), except device_count(), which answers
// 0 on a machine without a driver or device.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kernels/cuda/ops.h"

namespace diloco::cuda {

// Usable CUDA devices; 0 when there is no driver or no device.
int device_count();
// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)".
std::string device_description(int device);
void set_device(int device);
// Peak dense bf16 tensor FLOP/s of the current device for MFU: a table of
// known parts (H100/H200 SXM: 989.4e12); 0 when unknown.
double peak_bf16_flops();

void* device_malloc(size_t bytes);
void device_free(void* p);
// Pinned host memory mapped into every device's address space (unified
// addressing): kernels read and write it in place, over the host link.
void* pinned_host_malloc(size_t bytes);
void pinned_host_free(void* p);
// Copies infer their direction from the pointers (cudaMemcpyDefault), so
// either side may also be pinned host memory.
// Host <-> device copies return when the copy is done (they wait for the
// stream's earlier work too).
void copy_to_device(void* dst, const void* src, size_t bytes, Stream stream = nullptr);
void copy_to_host(void* dst, const void* src, size_t bytes, Stream stream = nullptr);
// Asynchronous on the stream.
void copy_device_to_device(void* dst, const void* src, size_t bytes, Stream stream = nullptr);
void fill_bytes(void* dst, int value, size_t bytes, Stream stream = nullptr);
void synchronize(Stream stream = nullptr);
Stream create_stream();
void destroy_stream(Stream stream);
size_t device_memory_used_bytes();

// Times work enqueued on a stream with CUDA events.
class EventTimer {
 public:
  explicit EventTimer(Stream stream = nullptr);
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start();
  // Milliseconds since start(); waits for the stream.
  double stop_ms();

 private:
  Stream stream_;
  void* begin_ = nullptr;
  void* end_ = nullptr;
};

// An event for ordering work across streams without the host waiting (no timing): record marks
// the work enqueued so far on a stream; wait makes the later work of another stream wait for
// what the latest record marked (nothing, if never recorded). Created on the current device.
class StreamEvent {
 public:
  StreamEvent();
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  void record(Stream stream);
  void wait(Stream waiter) const;

 private:
  void* event_ = nullptr;
};

// Where a DeviceArray lives: device memory, or pinned host memory that
// kernels use in place (pinned_host_malloc).
enum class Memory { kDevice, kPinnedHost };

// An owned array of T that kernels can use: on the device, or pinned host.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n, Memory where = Memory::kDevice) : n_(n), where_(where) {
    if (n) ptr_ = static_cast<T*>(where == Memory::kDevice ? device_malloc(n * sizeof(T)) : pinned_host_malloc(n * sizeof(T)));
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { release(); }
  DeviceArray(DeviceArray&& o) noexcept : ptr_(o.ptr_), n_(o.n_), where_(o.where_) { o.ptr_ = nullptr, o.n_ = 0; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      release();
      ptr_ = o.ptr_, n_ = o.n_, where_ = o.where_;
      o.ptr_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  Memory where() const { return where_; }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() { return ptr_; }
  const T* get() const { return ptr_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) { copy_to_device(ptr_, host.data(), host.size() * sizeof(T)); }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_) copy_to_host(host.data(), ptr_, n_ * sizeof(T));
    return host;
  }
  // Every byte = value (tests poison outputs with 0xff: NaN for floats).
  void fill(int value) {
    if (n_) fill_bytes(ptr_, value, n_ * sizeof(T));
    synchronize();
  }

 private:
  void release() {
    if (where_ == Memory::kDevice) {
      device_free(ptr_);
    } else {
      pinned_host_free(ptr_);
    }
  }
  T* ptr_ = nullptr;
  size_t n_ = 0;
  Memory where_ = Memory::kDevice;
};

}  // namespace diloco::cuda
