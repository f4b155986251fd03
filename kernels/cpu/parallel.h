// Small helpers over OpenMP for the CPU backend.
#pragma once

#include <omp.h>

#include <algorithm>

namespace diloco {

// Splits [0, n) into one contiguous chunk per thread and calls fn(begin, end)
// on each. Used for reductions over rows where each thread owns a range of
// output columns: every output is then summed in the same order whatever the
// thread count, so results are bitwise independent of it.
template <typename Fn>
void ParallelForChunks(int n, Fn&& fn) {
#pragma omp parallel
  {
    const int nt = omp_get_num_threads();
    const int id = omp_get_thread_num();
    const int per = (n + nt - 1) / nt;
    const int begin = std::min(n, id * per);
    const int end = std::min(n, begin + per);
    if (begin < end) fn(begin, end);
  }
}

}  // namespace diloco
