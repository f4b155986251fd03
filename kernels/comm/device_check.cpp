#include "kernels/comm/device_check.h"

#include <algorithm>

namespace diloco {

namespace {
thread_local int engine_depth = 0;
}  // namespace

DeviceAllocations::EngineScope::EngineScope() { engine_depth++; }
DeviceAllocations::EngineScope::~EngineScope() { engine_depth--; }

void DeviceAllocations::Add(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  const char* b = static_cast<const char*>(p);
  regions_.push_back({b, b + bytes});
}

void DeviceAllocations::Remove(const void* p) {
  std::lock_guard<std::mutex> lk(mu_);
  regions_.erase(std::remove_if(regions_.begin(), regions_.end(),
                                [p](const Region& r) { return r.begin == static_cast<const char*>(p); }),
                 regions_.end());
}

bool DeviceAllocations::Admits(const void* p, size_t bytes) const {
  if (engine_depth > 0) return true;
  const char* b = static_cast<const char*>(p);
  std::lock_guard<std::mutex> lk(mu_);
  for (const Region& r : regions_)
    if (b >= r.begin && b + bytes <= r.end) return true;
  return false;
}

}  // namespace diloco
