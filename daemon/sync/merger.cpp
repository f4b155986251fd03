#include "daemon/sync/merger.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "daemon/sync/held_delta.h"
#include "daemon/sync/merge.h"
#include "daemon/sync/protocol.h"
#include "daemon/util/crc32c.h"

namespace diloco {

namespace {

// A delta re-anchored at the current version: Δ + shift, shift = Θ_current − Θ_base (packed).
class AnchoredReader final : public DeltaReader {
 public:
  AnchoredReader(const Fragment& fragment, const DeltaReader& inner, std::vector<float> shift)
      : fragment_(fragment), inner_(inner), shift_(std::move(shift)) {}

  // |Δ + shift| per range, as RangeNorm sums it (per kMergeChunk chunk, in order).
  Status ComputeNorms() {
    std::vector<float> scratch;
    for (size_t r = 0; r < fragment_.ranges.size(); r++) {
      double sq = 0;
      for (size_t b = 0; b < fragment_.ranges[r].numel; b += kMergeChunk) {
        const size_t n = std::min(kMergeChunk, fragment_.ranges[r].numel - b);
        const float* v = nullptr;
        DL_RETURN_IF_ERROR(Read(r, b, n, &scratch, &v));
        sq += SumSquares(v, n);
      }
      norms_.push_back(std::sqrt(sq));
    }
    return Status::Ok();
  }

  Status Read(size_t range, size_t begin, size_t n, std::vector<float>* scratch,
              const float** values) const override {
    const float* v = nullptr;
    DL_RETURN_IF_ERROR(inner_.Read(range, begin, n, scratch, &v));
    if (!scratch->empty() && v >= scratch->data() && v < scratch->data() + scratch->size()) {
      std::memmove(scratch->data(), v, n * sizeof(float));
      scratch->resize(n);
    } else {
      scratch->assign(v, v + n);
    }
    const float* shift = shift_.data() + fragment_.ranges[range].packed_offset + begin;
    for (size_t i = 0; i < n; i++) (*scratch)[i] += shift[i];
    *values = scratch->data();
    return Status::Ok();
  }
  double RangeNorm(size_t range) const override { return norms_[range]; }

 private:
  const Fragment& fragment_;
  const DeltaReader& inner_;
  std::vector<float> shift_;
  std::vector<double> norms_;
};

}  // namespace

FragmentMerger::FragmentMerger(const SyncConfig& sync)
    : sync_(sync),
      down_codec_(DownlinkCodec(sync)),
      pool_(std::max(1, sync.merge_threads)),
      down_ef_(down_codec_, LinkFeedback(sync)) {}

Status FragmentMerger::Merge(const Fragment& fragment, uint32_t fragment_index,
                             const std::vector<PendingDelta>& pending, FragmentGlobal* fg, MergeOutcome* out) {
  if (pending.empty()) return Status::Error("nothing to merge");
  const size_t n = fragment.numel;
  if (fg->theta.size() != n || fg->momentum.size() != n)
    return Status::Error("fragment " + std::to_string(fragment_index) + " state does not fit its layout");
  // Θ_p at the current version joins the history re-anchoring reads from.
  auto& history = history_[fragment_index];
  if (sync_.anchor == Anchor::kCurrent && (history.empty() || history.back().first != fg->version)) {
    history.emplace_back(fg->version, fg->theta);
    while (history.size() > (size_t)sync_.max_staleness + 1) history.pop_front();
  }
  std::vector<HeldDeltaReader> readers;
  std::deque<AnchoredReader> anchored;
  readers.reserve(pending.size());
  std::vector<Contribution> contributions;
  for (const PendingDelta& pd : pending) {
    readers.emplace_back(fragment, pd.held);
    ContributionCounts counts = pd.counts;
    counts.age = fg->version > pd.base_version ? (double)(fg->version - pd.base_version) : 0.0;
    const DeltaReader* reader = &readers.back();
    const auto base = std::find_if(history.begin(), history.end(), [&](const auto& h) { return h.first == pd.base_version; });
    if (pd.base_version != fg->version && base != history.end()) {
      std::vector<float> shift(n);
      for (size_t i = 0; i < n; i++) shift[i] = fg->theta[i] - base->second[i];
      anchored.emplace_back(fragment, *reader, std::move(shift));
      DL_RETURN_IF_ERROR(anchored.back().ComputeNorms());
      reader = &anchored.back();
    }
    contributions.push_back({pd.learner, counts, nullptr, reader});
  }
  if (merged_.size() < n) merged_.resize(n);
  float* merged = merged_.data();
  const double share = sync_.partial == PartialRound::kShare
                           ? std::min(1.0, (double)pending.size() / std::max(1, sync_.learners))
                           : 1.0;
  std::vector<double> range_scale;  // RDA's last scaling, done in the pass below
  DL_RETURN_IF_ERROR(MergeContributions(fragment, &contributions, {sync_.weighting, sync_.age_power, share},
                                        sync_.merge, merged, &out->weights, &pool_, &range_scale));
  if (sync_.outer.restart_every > 0 && fg->version > 0 && fg->version % sync_.outer.restart_every == 0)
    std::fill(fg->momentum.begin(), fg->momentum.end(), 0.0f);

  // Per piece of the downlink codec (a piece lies in one range), while it is in cache: the merged
  // delta's last RDA scaling and |merged|², u and the update, the update's encoding with error
  // feedback, Θ += the decoded update, |update|² and the CRC32C of Θ; the sums and the CRCs join
  // in piece order.
  const std::vector<uint64_t> numels = FragmentNumels(fragment);
  const std::vector<ErrorFeedback::Piece> pieces = ErrorFeedback::Pieces(down_codec_, numels);
  std::vector<double> delta_squares(pieces.size()), update_squares(pieces.size());
  std::vector<uint32_t> crcs(pieces.size());
  auto outer_step = [&](size_t i, const ErrorFeedback::Piece& p, float* update) {
    const double scale = range_scale[p.tensor];
    for (size_t j = 0; j < p.n; j++) update[j] = ScaledLater(scale, merged[p.offset + j]);
    delta_squares[i] = SumSquares(update, p.n);
    OuterNesterovUpdate(update, p.n, sync_.outer.lr, sync_.outer.momentum, fg->momentum.data() + p.offset, update);
  };
  auto apply = [&](size_t i, const ErrorFeedback::Piece& p, const float* decoded) {
    update_squares[i] = SumSquares(decoded, p.n);
    ApplyUpdate(decoded, p.n, fg->theta.data() + p.offset);
    crcs[i] = Crc32c(fg->theta.data() + p.offset, p.n * sizeof(float));
  };
  const std::string context = "syncer: encoding the update of fragment " + std::to_string(fragment_index);
  if (!IsSparseCodec(down_codec_)) {
    DL_RETURN_IF_ERROR(down_ef_.EncodeInPieces(fragment_index, numels, outer_step, apply, &out->payload,
                                               &out->tensor_bytes, &pool_)
                           .WithContext(context));
  } else {  // (chunked) top-k picks over whole tensors: the update in place, then its encoding, then Θ
    RunTasks(&pool_, pieces.size(), [&](size_t i, int) { outer_step(i, pieces[i], merged + pieces[i].offset); });
    DL_RETURN_IF_ERROR(down_ef_.Encode(fragment_index, std::span<const float>(merged, n), numels, &out->payload,
                                       &out->tensor_bytes, &pool_)
                           .WithContext(context));
    const float* decoded = down_ef_.decoded().data();
    RunTasks(&pool_, pieces.size(), [&](size_t i, int) { apply(i, pieces[i], decoded + pieces[i].offset); });
  }
  double sq = 0;
  for (double s : delta_squares) sq += s;
  out->delta_norm = std::sqrt(sq);
  sq = 0;
  Crc32cJoiner crc;
  for (size_t i = 0; i < pieces.size(); i++) {
    sq += update_squares[i];
    crc.Add(crcs[i], pieces[i].n * sizeof(float));
  }
  out->update_norm = std::sqrt(sq);
  out->theta_crc32c = n == 0 ? Crc32c(nullptr, 0) : crc.crc();
  return Status::Ok();
}

}  // namespace diloco
