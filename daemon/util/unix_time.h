// The wall clock as Unix milliseconds (log lines, records, goodput spans).
#pragma once

#include <chrono>
#include <cstdint>

namespace diloco {

inline int64_t UnixMsNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace diloco
