// The deadlines of the rings' collectives and rendezvous (gloo_comm.cpp, comm_store.cpp).
#pragma once

#include <chrono>
#include <cstdint>

namespace diloco::comm_deadline {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Milliseconds until deadline (negative once past it).
inline int64_t ms_left(Clock::time_point deadline) {
  return std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
}

}  // namespace diloco::comm_deadline
