#include "daemon/sync/protocol.h"

#include "daemon/net/codec.h"

namespace diloco {

int LearnerIndexOf(const std::string& name) {
  if (name.rfind("learner-", 0) != 0 || name.size() == 8 || name.size() > 8 + 9) return -1;
  int index = 0;
  for (size_t i = 8; i < name.size(); i++) {
    if (name[i] < '0' || name[i] > '9') return -1;
    index = index * 10 + (name[i] - '0');
  }
  return index;
}

std::vector<uint64_t> FragmentNumels(const Fragment& fragment) {
  std::vector<uint64_t> n;
  n.reserve(fragment.ranges.size());
  for (const auto& r : fragment.ranges) n.push_back(r.numel);
  return n;
}

PayloadInfo FragmentPayloadInfo(const Fragment& fragment, const CodecOptions& codec,
                                const std::vector<uint64_t>& tensor_bytes) {
  PayloadInfo info;
  info.codec = codec.kind;
  info.block_size = codec.block_size;
  info.topk_fraction = codec.topk_fraction;
  for (size_t i = 0; i < fragment.ranges.size(); i++) {
    const auto& r = fragment.ranges[i];
    info.tensors.push_back({RangeName(r), r.offset, r.numel, tensor_bytes[i]});
  }
  return info;
}

namespace {
CodecOptions LinkCodec(const SyncConfig& sync, CodecKind kind, double topk) {
  if (kind == CodecKind::kTopkChunked) return {kind, sync.codec.chunk, 0, sync.codec.keep, sync.codec.bits};
  return {kind, sync.codec.block, topk};
}
}  // namespace

CodecOptions UplinkCodec(const SyncConfig& sync) { return LinkCodec(sync, sync.codec.up, sync.codec.up_topk); }

CodecOptions DownlinkCodec(const SyncConfig& sync) { return LinkCodec(sync, sync.codec.down, sync.codec.down_topk); }

FeedbackOptions LinkFeedback(const SyncConfig& sync) { return {sync.codec.feedback, sync.codec.decay}; }

Status CheckFragmentPayload(const Fragment& fragment, const PayloadInfo& info, std::vector<uint64_t>* tensor_bytes) {
  if (info.tensors.size() != fragment.ranges.size())
    return Status::Error("payload has " + std::to_string(info.tensors.size()) + " tensors, fragment " +
                         std::to_string(fragment.index) + " has " + std::to_string(fragment.ranges.size()));
  tensor_bytes->clear();
  for (size_t i = 0; i < info.tensors.size(); i++) {
    const auto& t = info.tensors[i];
    const auto& r = fragment.ranges[i];
    if (t.offset != r.offset || t.numel != r.numel)
      return Status::Error("payload tensor " + std::to_string(i) + " does not match fragment " +
                           std::to_string(fragment.index) + " (" + RangeName(r) + ")");
    tensor_bytes->push_back(t.encoded_bytes);
  }
  return Status::Ok();
}

Status DecodeFragmentPayload(const Fragment& fragment, const PayloadInfo& info,
                             const ParsedMessage& message, std::vector<float>* out) {
  std::vector<uint64_t> bytes;
  DL_RETURN_IF_ERROR(CheckFragmentPayload(fragment, info, &bytes));
  out->resize(fragment.numel);
  CodecOptions opt{info.codec, info.block_size, info.topk_fraction};
  return DecodeTensors(opt, message.payload_spans(), FragmentNumels(fragment), bytes, *out);
}

}  // namespace diloco
