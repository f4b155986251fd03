// Process statistics for reports.
#pragma once

namespace diloco {

// Peak resident set size of this process so far, in MiB.
double peak_rss_mb();

}  // namespace diloco
