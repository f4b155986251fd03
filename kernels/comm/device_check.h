// What "device memory" means for a CPU ring that stands in for a GPU ring in tests
// (ThreadCommGroup's checking mode, LocalRingOptions::check_device_memory).
//
// On a GPU ring (NCCL) a collective's float buffers must be device memory that the engine
// allocated; a host std::vector handed to it makes NCCL fault (issue 44, item 1). Thread and Gloo
// rings work in host memory, so CPU tests would never see that. A DeviceAllocations is the list of
// buffers a stand-in engine declares as its device memory (its parameters and gradients); the
// checking ring refuses any other buffer, so such a slip fails a CPU test.
//
// The engine's own collectives (inside sharded_train_step) run inside an EngineScope: their
// buffers are the engine's own by construction (on a GPU its DeviceArrays), so they are admitted
// whatever their address.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

namespace diloco {

class DeviceAllocations {
 public:
  // Declares [p, p + bytes) device memory (until Remove(p)).
  void Add(const void* p, size_t bytes);
  void Remove(const void* p);
  // Whether [p, p + bytes) lies inside one declared buffer, or the calling thread is inside an
  // EngineScope.
  bool Admits(const void* p, size_t bytes) const;

  // While alive, the calling thread runs engine code: its buffers are admitted.
  class EngineScope {
   public:
    EngineScope();
    ~EngineScope();
    EngineScope(const EngineScope&) = delete;
    EngineScope& operator=(const EngineScope&) = delete;
  };

 private:
  struct Region {
    const char* begin;
    const char* end;
  };
  mutable std::mutex mu_;
  std::vector<Region> regions_;
};

}  // namespace diloco
