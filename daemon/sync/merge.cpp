#include "daemon/sync/merge.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "kernels/check.h"

namespace diloco {
namespace {

// |s| below this (s is a weighted mean of unit vectors, so |s| <= 1) means
// the directions cancel and RDA has no direction to scale.
constexpr double kMinDirectionNorm = 1e-6;

template <typename T>
double SumSquaresOf(const T* x, size_t n) {
  SquareSum sum;
  sum.Add(x, n);
  return sum.Total();
}

double Norm(const float* x, size_t n) { return std::sqrt(SumSquaresOf(x, n)); }

// acc[j] += k[0]·v[0][j], then += k[1]·v[1][j], ... for G learners in one pass over acc: per
// value the same operations in the same order as one pass per learner.
constexpr size_t kGroup = 4;
template <size_t G>
void AddGroupOf(const double* k, const float* const* v, size_t n, double* __restrict acc) {
  for (size_t j = 0; j < n; j++) {
    double a = acc[j];
    for (size_t q = 0; q < G; q++) a += k[q] * v[q][j];
    acc[j] = a;
  }
}
// The same, and w[j] += k[q] for every value v[q][j] that was sent (not 0): the weight of the
// deltas that sent each coordinate (MergeRule::kContributors).
template <size_t G>
void AddGroupSentOf(const double* k, const float* const* v, size_t n, double* __restrict acc, double* __restrict w) {
  for (size_t j = 0; j < n; j++) {
    double a = acc[j], s = w[j];
    for (size_t q = 0; q < G; q++) {
      a += k[q] * v[q][j];
      s += v[q][j] != 0 ? k[q] : 0.0;
    }
    acc[j] = a;
    w[j] = s;
  }
}
void AddGroupSent(size_t g, const double* k, const float* const* v, size_t n, double* acc, double* w) {
  switch (g) {
    case 1: return AddGroupSentOf<1>(k, v, n, acc, w);
    case 2: return AddGroupSentOf<2>(k, v, n, acc, w);
    case 3: return AddGroupSentOf<3>(k, v, n, acc, w);
    default: return AddGroupSentOf<kGroup>(k, v, n, acc, w);
  }
}

void AddGroup(size_t g, const double* k, const float* const* v, size_t n, double* acc) {
  switch (g) {
    case 1: return AddGroupOf<1>(k, v, n, acc);
    case 2: return AddGroupOf<2>(k, v, n, acc);
    case 3: return AddGroupOf<3>(k, v, n, acc);
    default: return AddGroupOf<kGroup>(k, v, n, acc);
  }
}

// A decoded delta (fragment.numel floats) as a reader.
class PointerReader final : public DeltaReader {
 public:
  PointerReader(const Fragment& fragment, const float* delta) : fragment_(fragment), delta_(delta) {}
  Status Read(size_t range, size_t begin, size_t, std::vector<float>*, const float** values) const override {
    *values = delta_ + fragment_.ranges[range].packed_offset + begin;
    return Status::Ok();
  }
  double RangeNorm(size_t range) const override {
    const FragmentRange& r = fragment_.ranges[range];
    return diloco::RangeNorm(delta_ + r.packed_offset, r.numel);
  }

 private:
  const Fragment& fragment_;
  const float* delta_;
};

using Chunk = MergeChunk;

std::string Number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", v);
  return text;
}

}  // namespace

std::vector<MergeChunk> ChunkFragment(const Fragment& fragment, std::vector<size_t>* first_of_range) {
  const size_t R = fragment.ranges.size();
  std::vector<MergeChunk> chunks;
  first_of_range->assign(R + 1, 0);
  for (size_t r = 0; r < R; r++) {
    (*first_of_range)[r] = chunks.size();
    const size_t n = fragment.ranges[r].numel;
    for (size_t b = 0; b < n; b += kMergeChunk) chunks.push_back({r, b, std::min(kMergeChunk, n - b)});
  }
  (*first_of_range)[R] = chunks.size();
  return chunks;
}

Status ContributionWeights(const std::vector<ContributionCounts>& counts, WeightRule rule,
                           std::vector<double>* weights) {
  if (counts.empty()) return Status::Error("no contributions to weigh");
  std::vector<double> w(counts.size());
  double total = 0;
  for (size_t m = 0; m < counts.size(); ++m) {
    const ContributionCounts& c = counts[m];
    if (!std::isfinite(c.tokens) || !std::isfinite(c.steps) || c.steps <= 0 || c.tokens < 0) {
      return Status::Error("contribution " + std::to_string(m) + " has c_tokens " +
                           Number(c.tokens) + " and c_steps " + Number(c.steps) +
                           ": a delta needs steps > 0 and tokens >= 0");
    }
    if (!std::isfinite(c.age) || c.age < 0)
      return Status::Error("contribution " + std::to_string(m) + " has age " + Number(c.age) +
                           ": versions behind must be >= 0");
    w[m] = rule.weighting == Weighting::kUniform ? 1.0 : c.tokens * c.tokens / c.steps;
    total += w[m];
  }
  if (!(total > 0) || !std::isfinite(total)) {
    return Status::Error("contribution weights sum to " + Number(total) +
                         ": every contribution has 0 tokens");
  }
  for (double& x : w) x /= total;
  if (rule.age_power > 0)
    for (size_t m = 0; m < w.size(); ++m) w[m] *= std::pow(1.0 + counts[m].age, -rule.age_power);
  if (rule.round_share != 1)
    for (double& x : w) x *= rule.round_share;
  *weights = std::move(w);
  return Status::Ok();
}

double SumSquares(const float* x, size_t n) { return SumSquaresOf(x, n); }
double RangeNorm(const float* x, size_t n) {
  double sum = 0;
  for (size_t b = 0; b < n; b += kMergeChunk) sum += SumSquaresOf(x + b, std::min(kMergeChunk, n - b));
  return std::sqrt(sum);
}

Status MergeDeltas(const Fragment& fragment, const std::vector<const DeltaReader*>& deltas,
                   const std::vector<double>& weights, MergeRule rule, float* out, TaskPool* pool,
                   std::vector<double>* scale_later) {
  DL_CHECK(!deltas.empty() && deltas.size() == weights.size(), "%zu deltas, %zu weights", deltas.size(),
           weights.size());
  const size_t M = deltas.size(), R = fragment.ranges.size();
  // Per range: RDA or the mean; for RDA each direction's scale w_m / |Δ_m| (a zero delta has no
  // direction) and the radius Σ w_m |Δ_m|, in learner order.
  std::vector<uint8_t> rda(R, 0), fallback(R, 0);
  std::vector<double> scales(R * M, 0.0), radius(R, 0.0), factor(R, 0.0);
  for (size_t r = 0; r < R; r++) {
    rda[r] = !(fragment.ranges[r].embedding || rule != MergeRule::kRda);
    if (!rda[r]) continue;
    for (size_t m = 0; m < M; m++) {
      const double norm = deltas[m]->RangeNorm(r);
      radius[r] += weights[m] * norm;
      if (norm > 0) scales[r * M + m] = weights[m] / norm;
    }
  }
  std::vector<size_t> first_chunk;
  const std::vector<Chunk> chunks = ChunkFragment(fragment, &first_chunk);

  std::vector<double> s_squared(chunks.size(), 0.0);
  std::vector<Status> errors(chunks.size());
  // Per worker: a tile's sums and kGroup readers' decoded values. (Not thread_local: LeakSanitizer
  // reported the pool threads' copies as leaked.)
  const int workers = pool != nullptr ? pool->threads() : 1;
  std::vector<std::vector<double>> accs(workers, std::vector<double>(kMergeTile));
  std::vector<std::vector<double>> sent(rule == MergeRule::kContributors ? workers : 0, std::vector<double>(kMergeTile));
  // kContributors: a coordinate's sum over the weight of the deltas that sent it, times the
  // round's total weight (1, or the round's share: the dense case is the plain weighted mean).
  double total_weight = 0;
  for (double w : weights) total_weight += w;
  std::vector<std::vector<std::vector<float>>> scratches(workers, std::vector<std::vector<float>>(kGroup));
  // out = Σ_m coef[m] · Δ_m over the chunk, in learner order per value, a tile at a time (so the
  // tile's sums and the decoded deltas stay in L1) and kGroup learners a pass over the sums;
  // *squares (may be null) gets Σ of the sums².
  auto accumulate = [&](const Chunk& c, const double* coef, int worker, SquareSum* squares) -> Status {
    double* ap = accs[worker].data();
    double* wp = sent.empty() ? nullptr : sent[worker].data();
    float* o = out + fragment.ranges[c.range].packed_offset + c.begin;
    for (size_t t = 0; t < c.n; t += kMergeTile) {
      const size_t n = std::min(kMergeTile, c.n - t);
      std::fill_n(ap, n, 0.0);
      if (wp != nullptr) std::fill_n(wp, n, 0.0);
      for (size_t m = 0; m < M; m += kGroup) {
        const size_t g = std::min(kGroup, M - m);
        const float* v[kGroup] = {};
        for (size_t q = 0; q < g; q++)
          DL_RETURN_IF_ERROR(deltas[m + q]->Read(c.range, c.begin + t, n, &scratches[worker][q], &v[q]));
        if (wp != nullptr) AddGroupSent(g, coef + m, v, n, ap, wp);
        else AddGroup(g, coef + m, v, n, ap);
      }
      if (wp != nullptr)
        for (size_t j = 0; j < n; j++) ap[j] = wp[j] > 0 ? ap[j] * (total_weight / wp[j]) : 0.0;
      if (squares != nullptr) squares->Add(ap, n);
      for (size_t j = 0; j < n; j++) o[t + j] = (float)ap[j];
    }
    return Status::Ok();
  };
  // 1. The mean ranges, and s (as float in out) and |s|² per chunk of the RDA ranges.
  RunTasks(pool, chunks.size(), [&](size_t t, int worker) {
    const Chunk& c = chunks[t];
    if (!rda[c.range]) {
      errors[t] = accumulate(c, weights.data(), worker, nullptr);
      return;
    }
    SquareSum squares;
    errors[t] = accumulate(c, &scales[c.range * M], worker, &squares);
    s_squared[t] = squares.Total();
  });
  for (const Status& st : errors) DL_RETURN_IF_ERROR(st);
  // 2. Per RDA range: |s| from its chunks in order; out = radius/|s| · s, or the mean when the
  // directions cancel.
  std::vector<size_t> second;
  if (scale_later != nullptr) scale_later->assign(R, 1.0);
  for (size_t r = 0; r < R; r++) {
    if (!rda[r]) continue;
    double sq = 0;
    for (size_t t = first_chunk[r]; t < first_chunk[r + 1]; t++) sq += s_squared[t];
    const double s_norm = std::sqrt(sq);
    if (s_norm < kMinDirectionNorm) fallback[r] = 1;
    else factor[r] = radius[r] / s_norm;
    if (scale_later != nullptr && !fallback[r]) {
      (*scale_later)[r] = factor[r];  // the caller's pass scales
      continue;
    }
    for (size_t t = first_chunk[r]; t < first_chunk[r + 1]; t++) second.push_back(t);
  }
  RunTasks(pool, second.size(), [&](size_t i, int worker) {
    const size_t t = second[i];
    const Chunk& c = chunks[t];
    if (fallback[c.range]) {
      errors[t] = accumulate(c, weights.data(), worker, nullptr);
      return;
    }
    float* o = out + fragment.ranges[c.range].packed_offset + c.begin;
    const double f = factor[c.range];
    for (size_t j = 0; j < c.n; j++) o[j] = ScaledLater(f, o[j]);
  });
  for (const Status& st : errors) DL_RETURN_IF_ERROR(st);
  return Status::Ok();
}

void MergeDeltas(const Fragment& fragment, const std::vector<const float*>& deltas,
                 const std::vector<double>& weights, MergeRule rule, float* out) {
  std::vector<PointerReader> readers;
  readers.reserve(deltas.size());
  for (const float* d : deltas) readers.emplace_back(fragment, d);
  std::vector<const DeltaReader*> pointers;
  for (const PointerReader& r : readers) pointers.push_back(&r);
  const Status st = MergeDeltas(fragment, pointers, weights, rule, out, nullptr);
  DL_CHECK(st.ok(), "merging decoded deltas: %s", st.message().c_str());
}

const char* ToString(FilterVerdict verdict) {
  switch (verdict) {
    case FilterVerdict::kAccepted:
      return "accepted";
    case FilterVerdict::kNonFinite:
      return "non_finite";
    case FilterVerdict::kNormTooLarge:
      return "norm_too_large";
  }
  return "invalid";
}

double NormFilter::Median() const {
  if (norms_.empty()) return 0;
  std::vector<double> sorted(norms_.begin(), norms_.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t mid = sorted.size() / 2;
  return sorted.size() % 2 ? sorted[mid] : 0.5 * (sorted[mid - 1] + sorted[mid]);
}

FilterResult NormFilter::Check(const float* delta, size_t n, double steps) {
  FilterResult result;
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += !std::isfinite(delta[i]);
  if (bad > 0) {
    result.verdict = FilterVerdict::kNonFinite;
    result.reason = std::to_string(bad) + " of " + std::to_string(n) + " values are NaN or Inf";
    return result;
  }
  return CheckNorm(Norm(delta, n), steps);
}

FilterResult NormFilter::CheckNorm(double norm, double steps) {
  FilterResult result;
  if (!std::isfinite(norm)) {
    result.verdict = FilterVerdict::kNonFinite;
    result.reason = "the delta's norm is NaN or Inf";
    return result;
  }
  result.norm = norm / std::max(1.0, steps);
  if (options_.max_rejections_in_a_row > 0 && rejections_in_a_row_ >= options_.max_rejections_in_a_row) {
    norms_.clear();  // the scale moved: start again from this delta
    rejections_in_a_row_ = 0;
  }
  // (A median of 0, from all-zero deltas, gives no scale to compare with.)
  if (options_.max_ratio > 0 && (int)norms_.size() >= std::max(1, options_.min_history) &&
      Median() > 0) {
    result.limit = options_.max_ratio * Median();
    if (result.norm > result.limit) {
      result.verdict = FilterVerdict::kNormTooLarge;
      result.reason = "norm per step " + Number(result.norm) + " is above " + Number(options_.max_ratio) +
                      " x the median " + Number(Median()) + " of the last " +
                      std::to_string(norms_.size()) + " deltas";
      rejections_in_a_row_++;
      return result;
    }
  }
  rejections_in_a_row_ = 0;
  norms_.push_back(result.norm);
  while ((int)norms_.size() > std::max(1, options_.history)) norms_.pop_front();
  return result;
}

Status MergeContributions(const Fragment& fragment, std::vector<Contribution>* contributions, WeightRule weigh,
                          MergeRule rule, float* out, std::vector<double>* weights, TaskPool* pool,
                          std::vector<double>* scale_later) {
  std::stable_sort(contributions->begin(), contributions->end(),
                   [](const Contribution& a, const Contribution& b) { return a.learner < b.learner; });
  std::vector<ContributionCounts> counts;
  std::vector<PointerReader> decoded;
  decoded.reserve(contributions->size());
  for (const Contribution& c : *contributions) {
    counts.push_back(c.counts);
    if (c.reader == nullptr) {
      if (c.delta == nullptr)
        return Status::Error("learner " + std::to_string(c.learner) + "'s contribution has no delta");
      decoded.emplace_back(fragment, c.delta);
    }
  }
  std::vector<const DeltaReader*> readers;
  size_t next_decoded = 0;
  for (const Contribution& c : *contributions) readers.push_back(c.reader ? c.reader : &decoded[next_decoded++]);
  std::vector<double> w;
  DL_RETURN_IF_ERROR(ContributionWeights(counts, weigh, &w));
  DL_RETURN_IF_ERROR(MergeDeltas(fragment, readers, w, rule, out, pool, scale_later));
  if (weights) *weights = std::move(w);
  return Status::Ok();
}

void OuterNesterovUpdate(const float* delta, size_t n, double lr, double momentum,
                         float* momentum_buffer, float* update) {
  for (size_t i = 0; i < n; ++i) {
    const double u = momentum * momentum_buffer[i] + delta[i];
    momentum_buffer[i] = (float)u;
    update[i] = (float)(-lr * (delta[i] + momentum * u));
  }
}

void ApplyUpdate(const float* update, size_t n, float* theta) {
  for (size_t i = 0; i < n; ++i) theta[i] += update[i];
}

}  // namespace diloco
