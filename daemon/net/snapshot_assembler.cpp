// SnapshotAssembler: the parts of one snapshot, checked to belong together.
#include <algorithm>
#include <string>

#include "daemon/net/envelope_checks.h"

namespace diloco {

using wire_io::Printable;
using wire_io::Str;

SnapshotAssembler::SnapshotAssembler(uint64_t request_id, uint64_t max_total_bytes)
    : request_id_(request_id), max_total_bytes_(max_total_bytes) {}

Status SnapshotAssembler::Add(ParsedMessage&& part) {
  part.MakeContiguous();  // parts outlive the frames they were received in
  const SnapshotMsg* s = part.get<SnapshotMsg>();
  if (s == nullptr) {
    return Status::Error("snapshot assembly: got a " + std::string(MessageTypeName(part.type())) +
                         " from " + Printable(part.header.sender) + ", not a snapshot part");
  }
  const std::string who = "snapshot part " + Str(s->part) + " from " + Printable(part.header.sender);
  if (s->request_id != request_id_) {
    return Status::Error(who + ": answers request " + Str(s->request_id) + ", not " + Str(request_id_));
  }
  if (s->num_parts == 0 || s->part >= s->num_parts || s->fragment >= s->versions.size() ||
      part.tensor_payload_offsets.empty() ||
      part.payload.size() != part.tensor_payload_offsets.back()) {
    return Status::Error(who + ": not a parsed snapshot part (use ParseEnvelope first)");
  }
  if (num_parts_ > 0) {
    if (s->snapshot_id != snapshot_id_) {
      return Status::Error(who + ": belongs to snapshot " + Str(s->snapshot_id) + ", not " + Str(snapshot_id_));
    }
    if (s->num_parts != num_parts_) {
      return Status::Error(who + ": says " + Str(s->num_parts) + " parts, earlier parts said " + Str(num_parts_));
    }
    if (s->versions != versions_) {
      return Status::Error(who + ": its fragment versions differ from the earlier parts'");
    }
    if (have_part_[s->part]) return Status::Error(who + ": duplicate part");
    if (have_fragment_[s->fragment]) {
      return Status::Error(who + ": fragment " + Str(s->fragment) + " already received");
    }
  }
  if (part.payload.size() > max_total_bytes_ - std::min(total_bytes_, max_total_bytes_)) {
    return Status::Error(who + ": snapshot exceeds " + Str(max_total_bytes_) + " bytes");
  }
  // Tensor ranges of all parts must be disjoint.
  std::vector<std::pair<uint64_t, uint64_t>> merged = ranges_;
  for (const TensorDescriptor& t : s->payload.tensors) merged.emplace_back(t.offset, t.offset + t.numel);
  std::sort(merged.begin(), merged.end());
  for (size_t i = 1; i < merged.size(); ++i) {
    if (merged[i].first < merged[i - 1].second) {
      return Status::Error(who + ": parameter range [" + Str(merged[i].first) + ", " +
                           Str(merged[i].second) + ") overlaps another part's");
    }
  }
  // Accept.
  if (num_parts_ == 0) {
    snapshot_id_ = s->snapshot_id;
    num_parts_ = s->num_parts;
    versions_ = s->versions;
    parts_.resize(num_parts_);
    have_part_.assign(num_parts_, false);
    have_fragment_.assign(versions_.size(), false);
  }
  have_part_[s->part] = true;
  have_fragment_[s->fragment] = true;
  ranges_ = std::move(merged);
  total_bytes_ += part.payload.size();
  const uint32_t index = s->part;
  parts_[index] = std::move(part);
  ++parts_received_;
  return Status::Ok();
}

std::vector<ParsedMessage> SnapshotAssembler::Take() {
  if (!complete()) return {};
  std::vector<ParsedMessage> out = std::move(parts_);
  *this = SnapshotAssembler(request_id_, max_total_bytes_);
  return out;
}

}  // namespace diloco
