// A CPU backend that stands in for a GPU one in tests (kernels/comm/device_check.h): its memory is
// MemorySpace::kDevice, its parameter and gradient buffers are declared device memory in
// `device`, and everything else is the wrapped backend's. With a checking ThreadCommGroup over the
// same DeviceAllocations, any host buffer that daemon code hands to a device collective fails
// the test, as it would fault on NCCL.
#pragma once

#include <memory>

#include "kernels/backend.h"
#include "kernels/comm/device_check.h"

namespace diloco {

std::unique_ptr<TrainingBackend> StandInForDevice(std::unique_ptr<TrainingBackend> host,
                                                  std::shared_ptr<DeviceAllocations> device);

}  // namespace diloco
