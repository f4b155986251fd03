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

double Norm(const float* x, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += (double)x[i] * x[i];
  return std::sqrt(sum);
}

void WeightedMean(const std::vector<const float*>& deltas, const std::vector<double>& weights,
                  size_t begin, size_t n, float* out) {
  for (size_t i = begin; i < begin + n; ++i) {
    double sum = 0;
    for (size_t m = 0; m < deltas.size(); ++m) sum += weights[m] * deltas[m][i];
    out[i] = (float)sum;
  }
}

void RadialDirectional(const std::vector<const float*>& deltas, const std::vector<double>& weights,
                       size_t begin, size_t n, float* out) {
  const size_t count = deltas.size();
  // Scale of each direction: w_m / |Δ_m| (a zero delta has no direction).
  std::vector<double> scale(count, 0.0);
  double radius = 0;
  for (size_t m = 0; m < count; ++m) {
    const double norm = Norm(deltas[m] + begin, n);
    radius += weights[m] * norm;
    if (norm > 0) scale[m] = weights[m] / norm;
  }
  double s_squared = 0;
  for (size_t i = begin; i < begin + n; ++i) {
    double s = 0;
    for (size_t m = 0; m < count; ++m) s += scale[m] * deltas[m][i];
    s_squared += s * s;
  }
  const double s_norm = std::sqrt(s_squared);
  if (s_norm < kMinDirectionNorm) {
    WeightedMean(deltas, weights, begin, n, out);
    return;
  }
  const double factor = radius / s_norm;
  for (size_t i = begin; i < begin + n; ++i) {
    double s = 0;
    for (size_t m = 0; m < count; ++m) s += scale[m] * deltas[m][i];
    out[i] = (float)(factor * s);
  }
}

std::string Number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", v);
  return text;
}

}  // namespace

Status ContributionWeights(const std::vector<ContributionCounts>& counts, Weighting weighting,
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
    w[m] = weighting == Weighting::kUniform ? 1.0 : c.tokens * c.tokens / c.steps;
    total += w[m];
  }
  if (!(total > 0) || !std::isfinite(total)) {
    return Status::Error("contribution weights sum to " + Number(total) +
                         ": every contribution has 0 tokens");
  }
  for (double& x : w) x /= total;
  *weights = std::move(w);
  return Status::Ok();
}

void MergeDeltas(const Fragment& fragment, const std::vector<const float*>& deltas,
                 const std::vector<double>& weights, MergeRule rule, float* out) {
  DL_CHECK(!deltas.empty() && deltas.size() == weights.size(), "%zu deltas, %zu weights",
           deltas.size(), weights.size());
  for (const FragmentRange& r : fragment.ranges) {
    if (r.embedding || rule == MergeRule::kMean) {
      WeightedMean(deltas, weights, r.packed_offset, r.numel, out);
    } else {
      RadialDirectional(deltas, weights, r.packed_offset, r.numel, out);
    }
  }
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
  result.norm = Norm(delta, n) / std::max(1.0, steps);
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

Status MergeContributions(const Fragment& fragment, std::vector<Contribution>* contributions, Weighting weighting,
                          MergeRule rule, float* out, std::vector<double>* weights) {
  std::stable_sort(contributions->begin(), contributions->end(),
                   [](const Contribution& a, const Contribution& b) { return a.learner < b.learner; });
  std::vector<ContributionCounts> counts;
  std::vector<const float*> deltas;
  for (const Contribution& c : *contributions) {
    counts.push_back(c.counts);
    deltas.push_back(c.delta);
  }
  std::vector<double> w;
  DL_RETURN_IF_ERROR(ContributionWeights(counts, weighting, &w));
  MergeDeltas(fragment, deltas, w, rule, out);
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
