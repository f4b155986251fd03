// The syncer's maths for one fragment: contribution weights, the merge of
// the learners' deltas (RDA or a plain weighted mean), a filter that rejects
// broken deltas, and the outer Nesterov step. Deltas are packed fragment
// vectors (fragments.h) holding Δ = base − θ_local. Sums run in double.
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <vector>

#include "daemon/config/sync_config.h"
#include "daemon/sync/fragments.h"
#include "daemon/util/status.h"
#include "daemon/util/task_pool.h"

namespace diloco {

// How much a learner did for this fragment since it last folded it.
struct ContributionCounts {
  double tokens = 0;  // c_tokens
  double steps = 0;   // c_steps
  double age = 0;     // versions between its base and the version it merges into
};

// How contributions are weighed: sync.weighting, sync.age_power's age-aware scaling, and the
// factor sync.partial: share puts on a partial round (k/M; 1 = the whole merged delta).
struct WeightRule {
  WeightRule(Weighting w, double age_power = 0, double round_share = 1)
      : weighting(w), age_power(age_power), round_share(round_share) {}
  Weighting weighting;
  double age_power;
  double round_share;
};

// Normalized weights (sum 1): w_m ∝ c_tok²/c_steps (quantity × efficiency:
// tokens per step) for kTokens, equal for kUniform; then, when age_power > 0, each times
// (1 + age)^-age_power, and each times round_share, after the normalization (so the sum is
// below 1 when some are stale or the round is partial).
// Errors on an empty list, steps <= 0, tokens < 0, age < 0 or non-finite counts, or when every
// weight is 0.
Status ContributionWeights(const std::vector<ContributionCounts>& counts, WeightRule rule,
                           std::vector<double>* weights);

// Σ x² in double over 32 interleaved partial sums, joined in a fixed order: the same bits on
// every machine and run, and a loop the compiler vectorizes into independent adds (one running
// sum is bound by the latency of an add; 32 lanes are four AVX-512 or eight AVX2 registers).
// Fed in pieces, it sums as one Add of their concatenation when every piece but the last is a
// multiple of kLanes long.
class SquareSum {
 public:
  static constexpr size_t kLanes = 32;
  template <typename T>
  void Add(const T* __restrict x, size_t n) {
    double l[kLanes];
    for (size_t j = 0; j < kLanes; ++j) l[j] = lane_[j];
    size_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (size_t j = 0; j < kLanes; ++j) l[j] += (double)x[i + j] * (double)x[i + j];
    for (size_t j = 0; i < n; ++i, ++j) l[j] += (double)x[i] * (double)x[i];
    for (size_t j = 0; j < kLanes; ++j) lane_[j] = l[j];
  }
  double Total() const {
    double sum = 0;
    for (size_t j = 0; j < kLanes; ++j) sum += lane_[j];
    return sum;
  }

 private:
  double lane_[kLanes] = {};
};

// SquareSum of x[0..n): the filter's norm of a delta is its root.
double SumSquares(const float* x, size_t n);
// |x| of one range as a merge takes it (RDA's |Δ_m|): SumSquares per kMergeChunk chunk, the chunks
// added in order, so a delta decoded a chunk at a time gets the same bits.
double RangeNorm(const float* x, size_t n);

// One contribution's values as a merge reads them: a chunk at a time, so a delta held encoded
// (held_delta.h) is decoded chunk by chunk into a thread's scratch, never as a whole.
class DeltaReader {
 public:
  virtual ~DeltaReader() = default;
  // Values [begin, begin + n) of the fragment's range `range` (offsets inside the range): sets
  // *values to them, either in the reader's own memory or in *scratch (which it may resize).
  // Called from several threads at once, each with its own scratch.
  virtual Status Read(size_t range, size_t begin, size_t n, std::vector<float>* scratch,
                      const float** values) const = 0;
  // |Δ| over the whole range (RangeNorm of its values).
  virtual double RangeNorm(size_t range) const = 0;
};

// The merge works on chunks of this many values of a range (the last one of a range may be
// shorter). Fixed, so that the sums per chunk (and so the bits) never depend on the threads.
inline constexpr size_t kMergeChunk = size_t{1} << 16;
// Inside a chunk the learners' deltas are summed this many values at a time: the sums (double)
// and one decoded delta stay in L1. Per value the sum runs in learner order all the same.
inline constexpr size_t kMergeTile = 2048;
static_assert(kMergeTile % SquareSum::kLanes == 0, "tiles must keep a chunk's square sums");

// The fragment's ranges cut into kMergeChunk pieces, range by range in order: the units a merge
// (and a held delta's check) works on. first_of_range (R + 1 entries) receives where each
// range's chunks begin, and the total last.
struct MergeChunk {
  size_t range = 0, begin = 0, n = 0;
};
std::vector<MergeChunk> ChunkFragment(const Fragment& fragment, std::vector<size_t>* first_of_range);

// out (fragment.numel) = the merged delta. Per range of the fragment (a whole
// tensor, or the rows of a split tensor that this fragment holds, each range
// on its own: the pieces of one tensor in other fragments merge at other
// times anyway): the embedding ranges (wte/wpe and their pieces) and
// MergeRule::kMean take the weighted mean Σ w_m Δ_m; kRda takes radial-
// directional averaging: (Σ w_m |Δ_m|) · s/|s| with s = Σ w_m Δ_m/|Δ_m|, so
// near-orthogonal deltas do not shrink as 1/√M; when |s| vanishes (deltas
// cancel) it falls back to the weighted mean. weights as above (sum 1).
// Sums over learners run in double, in the order given, per value; |s|² adds per chunk
// (kMergeChunk), then the chunks in order; s is kept as float between |s| and the scaling. So the
// bits depend only on the deltas, their order and the weights: not on the threads of pool (null:
// the calling thread) nor on which delta a reader decodes when.
// scale_later (may be null): the RDA ranges' last step (out = radius/|s| · s) is left to the
// caller, who applies it in its own pass over out: out holds s there and (*scale_later)[r] the
// factor, out[j] ← (float)(factor · (double)out[j]) the same bits as MergeDeltas would write; 1 for
// the other ranges (where that expression leaves out as it is).
Status MergeDeltas(const Fragment& fragment, const std::vector<const DeltaReader*>& deltas,
                   const std::vector<double>& weights, MergeRule rule, float* out, TaskPool* pool = nullptr,
                   std::vector<double>* scale_later = nullptr);
// out[j] for j in [0, n) of range r as MergeDeltas writes it, from scale_later's factor.
inline float ScaledLater(double factor, float value) { return (float)(factor * (double)value); }
// The same over decoded deltas (fragment.numel floats each).
void MergeDeltas(const Fragment& fragment, const std::vector<const float*>& deltas,
                 const std::vector<double>& weights, MergeRule rule, float* out);

// One learner's contribution to a merge: its decoded delta, or a reader of it.
struct Contribution {
  int learner = 0;
  ContributionCounts counts;
  const float* delta = nullptr;           // the fragment's packed delta, or
  const DeltaReader* reader = nullptr;    // when delta is null
};

// The merged delta of a round (ContributionWeights, then MergeDeltas) in LEARNER order, whatever
// order the deltas arrived in: float sums depend on their order, so the same deltas must merge
// to the same bits on every run and after a restart. Sorts *contributions by learner; weights
// (may be null) receives their weights in that order.
Status MergeContributions(const Fragment& fragment, std::vector<Contribution>* contributions, WeightRule weigh,
                          MergeRule rule, float* out, std::vector<double>* weights = nullptr,
                          TaskPool* pool = nullptr, std::vector<double>* scale_later = nullptr);

// Rejects deltas with NaN/Inf, or whose L2 norm per inner step (norm /
// c_steps) exceeds max_ratio × the median of the last `history` accepted ones
// (once min_history are known). Per step, because a delta's norm grows with
// the steps it covers: a delta of 1 step must not make the next 25-step ones
// look like outliers. Keep one per fragment: norms differ between fragments.
// A lock-out is bounded: after max_rejections_in_a_row rejections with no accepted delta between
// them, the history no longer describes the deltas arriving (the scale moved: a learner resent
// its whole progress after a drop, or every learner's steps grew), so it restarts from the next
// finite delta. An outlier among accepted deltas stays rejected: each acceptance resets the run.
struct NormFilterOptions {
  double max_ratio = 10;  // k; 0 = no norm limit (non-finite values are still rejected)
  int history = 32;
  int min_history = 3;
  int max_rejections_in_a_row = 8;  // 0 = never restart (a delta can then be refused forever)
};

enum class FilterVerdict { kAccepted, kNonFinite, kNormTooLarge };
const char* ToString(FilterVerdict verdict);

struct FilterResult {
  FilterVerdict verdict = FilterVerdict::kAccepted;
  double norm = 0;
  double limit = 0;    // k × median in force; 0 when none
  std::string reason;  // for logs: what was wrong, with the numbers
  bool accepted() const { return verdict == FilterVerdict::kAccepted; }
};

class NormFilter {
 public:
  explicit NormFilter(const NormFilterOptions& options = {}) : options_(options) {}
  // Checks delta[0..n), the work of `steps` inner steps (< 1 counts as 1); an accepted norm per
  // step joins the history. FilterResult::norm and limit are per step.
  FilterResult Check(const float* delta, size_t n, double steps = 1);
  // The same for a delta whose norm is known (e.g. from its ranges' norms): a non-finite norm
  // is a non-finite delta.
  FilterResult CheckNorm(double norm, double steps = 1);
  double Median() const;  // of the history; 0 when empty

 private:
  NormFilterOptions options_;
  std::deque<double> norms_;
  int rejections_in_a_row_ = 0;
};

// The outer Nesterov step on one fragment, split so that a lossy downlink
// codec can sit between computing the update and applying it:
//   u ← μ·u + Δ;  update = −η·(Δ + μ·u)   (= Θ_new − Θ_old)
void OuterNesterovUpdate(const float* delta, size_t n, double lr, double momentum,
                         float* momentum_buffer, float* update);
// Θ += update (the exact, possibly decoded, update every learner applies).
void ApplyUpdate(const float* update, size_t n, float* theta);

}  // namespace diloco
