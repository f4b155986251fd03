#include "daemon/util/proc_stats.h"

#include <sys/resource.h>

namespace diloco {

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;  // ru_maxrss is in KiB on Linux
}

}  // namespace diloco
