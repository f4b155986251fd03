// Codecs: see codec.h for the formats. The dense codecs (per block: scale, codes, levels) are
// kernels/sync_ops.h's sync_encode_dense / sync_decode_dense, THE implementation (its header
// pins the arithmetic); this file adds what the wire needs around them: option and size checks,
// Status errors that name the index, top-k, several tensors per payload and error feedback.
#include "daemon/net/codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

namespace diloco {
namespace {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian");
static_assert(static_cast<int>(CodecKind::kFp32) == static_cast<int>(SyncCodec::kFp32) &&
                  static_cast<int>(CodecKind::kBf16) == static_cast<int>(SyncCodec::kBf16) &&
                  static_cast<int>(CodecKind::kInt8) == static_cast<int>(SyncCodec::kInt8) &&
                  static_cast<int>(CodecKind::kInt4) == static_cast<int>(SyncCodec::kInt4),
              "CodecKind and SyncCodec share the wire's numbering");

// Payload bytes have no alignment: every multi-byte access is a memcpy.
template <typename T>
inline T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
inline void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint8_t kIndexBitmap = 1;
constexpr uint8_t kIndexDelta = 2;

std::string KindName(CodecKind kind) { return std::string(CodecName(kind)); }

SyncCodec ToSync(CodecKind kind) { return static_cast<SyncCodec>(static_cast<int>(kind)); }

Status CheckBlockSize(int block_size) {
  if (block_size < kMinCodecBlockSize || block_size > kMaxCodecBlockSize || block_size % 2 != 0) {
    return Status::Error("codec block_size " + std::to_string(block_size) + " is invalid: use an even number in [" +
                         std::to_string(kMinCodecBlockSize) + ", " + std::to_string(kMaxCodecBlockSize) +
                         "] (64-256 is typical)");
  }
  return Status::Ok();
}

// ---- errors ----

Status NonFiniteError(float value, size_t i) {
  return Status::Error("value at index " + std::to_string(i) + " is " + (std::isnan(value) ? "NaN" : "Inf") +
                       ": a delta must be finite; check the learner's loss and gradients");
}

// Why a dense encode refused `value`, the one at `index`.
Status EncodeFaultError(SyncFault fault, float value, size_t index) {
  if (fault == SyncFault::kBf16Overflow)
    return Status::Error("value at index " + std::to_string(index) + " (" + std::to_string(value) +
                         ") overflows bf16; use fp32 for such values");
  return NonFiniteError(value, index);
}

Status PayloadError(const char* what, CodecKind kind, size_t index) {
  return Status::Error(KindName(kind) + " payload: " + what + " at index " + std::to_string(index) +
                       "; the sender's encoder or the link corrupted it (drop the message)");
}

// ---- top-k ----

size_t VarintBytes(uint64_t v) {
  size_t bytes = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++bytes;
  }
  return bytes;
}

uint8_t* PutVarint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

// The k values of largest |x| (ties: lower index first), ascending indices. x must be finite.
// Radix select on the sign-cleared bits: a histogram of the high 16 bits finds the threshold's
// bin, a second one of the low 16 bits within that bin finds the threshold itself.
void SelectTopk(const float* x, size_t n, size_t k, std::vector<size_t>* indices) {
  indices->clear();
  if (k == 0) return;
  std::vector<size_t> hist(65536, 0);
  for (size_t i = 0; i < n; ++i) ++hist[(std::bit_cast<uint32_t>(x[i]) & kAbsMask) >> 16];
  size_t above = 0;
  uint32_t hi = 65535;
  for (;; --hi) {
    if (above + hist[hi] >= k) break;
    above += hist[hi];
  }
  std::fill(hist.begin(), hist.end(), 0);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(x[i]) & kAbsMask;
    if ((b >> 16) == hi) ++hist[b & 0xffffu];
  }
  uint32_t lo = 65535;
  for (;; --lo) {
    if (above + hist[lo] >= k) break;
    above += hist[lo];
  }
  const uint32_t threshold = (hi << 16) | lo;
  size_t ties = k - above;  // values equal to the threshold still to keep
  indices->reserve(k);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(x[i]) & kAbsMask;
    if (b > threshold) {
      indices->push_back(i);
    } else if (b == threshold && ties > 0) {
      indices->push_back(i);
      --ties;
    }
  }
}

Status EncodeTopk(const CodecOptions& opt, std::span<const float> in, std::vector<uint8_t>* out) {
  const size_t n = in.size();
  if (n > UINT32_MAX) {
    return Status::Error("top-k of " + std::to_string(n) + " values: at most 2^32 - 1 per tensor; split the tensor");
  }
  // SelectTopk orders by magnitude bits: NaN/Inf first refused here, by index.
  const auto bad = std::find_if(in.begin(), in.end(), [](float v) { return !std::isfinite(v); });
  if (bad != in.end()) return NonFiniteError(*bad, static_cast<size_t>(bad - in.begin()));
  const size_t k = TopkCount(opt.topk_fraction, n);
  std::vector<size_t> indices;
  SelectTopk(in.data(), n, k, &indices);

  const size_t bitmap_bytes = (n + 7) / 8;
  size_t delta_bytes = 0;
  for (size_t j = 0; j < k; ++j) delta_bytes += VarintBytes(indices[j] - (j == 0 ? 0 : indices[j - 1] + 1));
  const bool delta = delta_bytes < bitmap_bytes;
  const size_t index_bytes = delta ? delta_bytes : bitmap_bytes;  // <= bitmap_bytes < 2^29
  const size_t value_bytes = EncodedBytes(opt.kind, k, opt.block_size);
  out->assign(kTopkHeaderBytes + index_bytes + value_bytes, 0);

  uint8_t* p = out->data();
  p[0] = delta ? kIndexDelta : kIndexBitmap;
  p[1] = static_cast<uint8_t>(opt.kind);
  Store<uint32_t>(p + 4, static_cast<uint32_t>(index_bytes));
  Store<uint32_t>(p + 8, static_cast<uint32_t>(k));
  Store<uint32_t>(p + 12, static_cast<uint32_t>(n));
  uint8_t* index = p + kTopkHeaderBytes;
  if (delta) {
    uint8_t* q = index;
    for (size_t j = 0; j < k; ++j) q = PutVarint(q, indices[j] - (j == 0 ? 0 : indices[j - 1] + 1));
  } else {
    for (size_t i : indices) index[i / 8] = static_cast<uint8_t>(index[i / 8] | (1u << (i % 8)));
  }
  std::vector<float> values(k);
  for (size_t j = 0; j < k; ++j) values[j] = in[indices[j]];
  return EncodeDense(opt.kind, opt.block_size, values,
                     std::span<uint8_t>(out->data() + kTopkHeaderBytes + index_bytes, value_bytes));
}

Status TopkError(const std::string& what) {
  return Status::Error("top-k payload: " + what + "; the sender's encoder or the link corrupted it (drop the message)");
}

Status DecodeTopk(const CodecOptions& opt, std::span<const uint8_t> in, std::span<float> out) {
  const size_t n = out.size();
  if (in.size() < kTopkHeaderBytes) {
    return TopkError(std::to_string(in.size()) + " bytes is shorter than the " + std::to_string(kTopkHeaderBytes) +
                     "-byte header");
  }
  const uint8_t* p = in.data();
  const uint8_t format = p[0];
  const uint32_t index_bytes = Load<uint32_t>(p + 4);
  const size_t k = Load<uint32_t>(p + 8);
  const size_t numel = Load<uint32_t>(p + 12);
  if (format != kIndexBitmap && format != kIndexDelta)
    return TopkError("unknown index format " + std::to_string(format));
  if (p[1] != static_cast<uint8_t>(opt.kind)) {
    return TopkError("values are codec " + std::to_string(p[1]) + ", expected " + KindName(opt.kind));
  }
  if (p[2] != 0 || p[3] != 0) return TopkError("reserved header bytes are not zero");
  if (numel != n) return TopkError("holds " + std::to_string(numel) + " values, expected " + std::to_string(n));
  if (k > n) return TopkError("keeps " + std::to_string(k) + " of " + std::to_string(n) + " values");
  if (format == kIndexBitmap && index_bytes != (n + 7) / 8) {
    return TopkError("bitmap of " + std::to_string(index_bytes) + " bytes for " + std::to_string(n) + " values");
  }
  const size_t value_bytes = EncodedBytes(opt.kind, k, opt.block_size);
  if (index_bytes > in.size() - kTopkHeaderBytes || in.size() - kTopkHeaderBytes - index_bytes != value_bytes) {
    return TopkError(std::to_string(in.size()) + " bytes, but the header says " +
                     std::to_string(kTopkHeaderBytes + size_t{index_bytes} + value_bytes));
  }
  std::vector<float> values(k);
  DL_RETURN_IF_ERROR(DecodeDense(opt.kind, opt.block_size, in.subspan(kTopkHeaderBytes + index_bytes), values)
                         .WithContext("top-k values"));
  std::fill(out.begin(), out.end(), 0.0f);
  const uint8_t* index = p + kTopkHeaderBytes;
  size_t count = 0;
  if (format == kIndexBitmap) {
    if (n % 8 != 0 && (index[index_bytes - 1] >> (n % 8)) != 0) return TopkError("bitmap bits set past the end");
    for (size_t byte = 0; byte < index_bytes; ++byte) {
      unsigned bits = index[byte];
      while (bits != 0) {
        if (count == k) return TopkError("bitmap has more than k = " + std::to_string(k) + " bits set");
        const int bit = std::countr_zero(bits);
        bits &= bits - 1;
        out[byte * 8 + bit] = values[count++];
      }
    }
  } else {
    size_t pos = 0;
    size_t next = 0;  // the smallest index the next gap may reach
    while (pos < index_bytes) {
      uint64_t gap = 0;
      int shift = 0;
      for (;;) {
        if (pos == index_bytes || shift > 63) return TopkError("truncated or overlong varint in the index");
        const uint8_t byte = index[pos++];
        if (shift == 63 && byte > 1) return TopkError("varint in the index overflows 64 bits");
        gap |= static_cast<uint64_t>(byte & 0x7f) << shift;
        shift += 7;
        if ((byte & 0x80) == 0) break;
      }
      if (count == k) return TopkError("index has more than k = " + std::to_string(k) + " entries");
      if (gap >= n - next) return TopkError("index past the end of " + std::to_string(n) + " values");
      const size_t i = next + gap;
      out[i] = values[count++];
      next = i + 1;
    }
  }
  if (count != k) return TopkError("index has " + std::to_string(count) + " entries, header says " + std::to_string(k));
  return Status::Ok();
}


// ---- chunked top-k (kTopkChunked) ----

constexpr uint8_t kChunkedFormat = 1;

Status ChunkedError(const std::string& what) {
  return Status::Error("topk_chunked payload: " + what +
                       "; the sender's encoder or the link corrupted it (drop the message)");
}

Status EncodeChunked(const CodecOptions& opt, std::span<const float> in, std::vector<uint8_t>* out) {
  const auto bad = std::find_if(in.begin(), in.end(), [](float v) { return !std::isfinite(v); });
  if (bad != in.end()) return NonFiniteError(*bad, static_cast<size_t>(bad - in.begin()));
  const size_t n = in.size(), C = static_cast<size_t>(opt.block_size), keep = static_cast<size_t>(opt.keep);
  const size_t bytes = TopkChunkedBytes(n, opt.block_size, opt.keep, opt.value_bits);
  if (bytes != kTopkChunkedHeaderBytes + sparse_records_bytes(n, C, keep, opt.value_bits)) {
    return Status::Error("internal: topk_chunked layout of " + std::to_string(n) +
                         " values disagrees between codec_kind.h and kernels/sync_sparse (a bug)");
  }
  out->assign(bytes, 0);
  uint8_t* p = out->data();
  p[0] = kChunkedFormat;
  p[1] = static_cast<uint8_t>(opt.value_bits);
  Store<uint32_t>(p + 4, static_cast<uint32_t>(keep));
  p += kTopkChunkedHeaderBytes;
  std::vector<uint64_t> scratch(2 * std::min(C, std::max<size_t>(n, 1)));
  for (size_t lo = 0; lo < n; lo += C) {
    const size_t len = std::min(C, n - lo), kc = sparse_keep_of(len, C, keep);
    sparse_encode_chunk(p, in.data() + lo, len, kc, C, opt.value_bits, scratch.data());
    p += sparse_record_bytes(kc, C, opt.value_bits);
  }
  return Status::Ok();
}

Status DecodeChunked(const CodecOptions& opt, std::span<const uint8_t> in, std::span<float> out) {
  const size_t n = out.size(), C = static_cast<size_t>(opt.block_size);
  if (in.size() < kTopkChunkedHeaderBytes) {
    return ChunkedError(std::to_string(in.size()) + " bytes is shorter than the " +
                        std::to_string(kTopkChunkedHeaderBytes) + "-byte header");
  }
  const uint8_t* p = in.data();
  if (p[0] != kChunkedFormat) return ChunkedError("unknown format " + std::to_string(p[0]));
  const int bits = p[1];
  if (bits != 2 && bits != 4 && bits != 8) return ChunkedError("value bits " + std::to_string(bits) + " (2, 4 or 8)");
  if (p[2] != 0 || p[3] != 0) return ChunkedError("reserved header bytes are not zero");
  const uint32_t keep = Load<uint32_t>(p + 4);
  if (keep < 1 || keep > C) {
    return ChunkedError("keeps " + std::to_string(keep) + " values of each chunk of " + std::to_string(C));
  }
  const size_t want = TopkChunkedBytes(n, opt.block_size, static_cast<int>(keep), bits);
  if (in.size() != want) {
    return ChunkedError(std::to_string(in.size()) + " bytes, but " + std::to_string(n) + " values (chunk " +
                        std::to_string(C) + ", keep " + std::to_string(keep) + ", " + std::to_string(bits) +
                        " bits) take " + std::to_string(want));
  }
  p += kTopkChunkedHeaderBytes;
  for (size_t lo = 0; lo < n; lo += C) {
    const size_t len = std::min(C, n - lo), kc = sparse_keep_of(len, C, keep);
    size_t at = 0;
    const SparseFault fault = sparse_decode_chunk(out.data() + lo, p, len, kc, C, bits, &at);
    if (fault != SparseFault::kNone) {
      const std::string where = " in the chunk at value " + std::to_string(lo) + " (kept value " +
                                std::to_string(at) + ")";
      switch (fault) {
        case SparseFault::kBadScale:
          return ChunkedError("bin width is negative, NaN, Inf or too large" + where);
        case SparseFault::kBadIndex:
          return ChunkedError("index past the chunk's end or not above the one before" + where);
        case SparseFault::kBadCode:
          return ChunkedError("a zero chunk with a nonzero code" + where);
        case SparseFault::kBadPad:
        default:
          return ChunkedError("nonzero pad bits" + where);
      }
    }
    p += sparse_record_bytes(kc, C, bits);
  }
  return Status::Ok();
}

}  // namespace

Status ValidateDecodeOptions(CodecOptions opt) {
  if (opt.kind == CodecKind::kTopkChunked) {
    opt.keep = 1;
    opt.value_bits = 2;
  }
  return ValidateCodecOptions(opt);
}

Status ValidateCodecOptions(const CodecOptions& opt) {
  if (!IsValidCodecKind(static_cast<uint8_t>(opt.kind))) {
    return Status::Error("unknown codec " + std::to_string(static_cast<int>(opt.kind)) +
                         ": use fp32, bf16, int8, int4 or topk_chunked");
  }
  DL_RETURN_IF_ERROR(CheckBlockSize(opt.block_size));
  if (opt.kind == CodecKind::kTopkChunked) {
    if (opt.topk_fraction != 0)
      return Status::Error("topk_chunked picks its own values: top-k fraction must be 0, not " +
                           std::to_string(opt.topk_fraction));
    if (opt.keep < 1 || opt.keep > opt.block_size)
      return Status::Error("topk_chunked keep " + std::to_string(opt.keep) + " is invalid: use 1.." +
                           std::to_string(opt.block_size) + " (the chunk), e.g. 64 of 4096");
    if (opt.value_bits != 2 && opt.value_bits != 4 && opt.value_bits != 8)
      return Status::Error("topk_chunked value bits " + std::to_string(opt.value_bits) + " is invalid: use 2, 4 or 8");
  }
  if (!(opt.topk_fraction == 0 || (opt.topk_fraction > 0 && opt.topk_fraction < 1))) {
    return Status::Error("top-k fraction " + std::to_string(opt.topk_fraction) +
                         " is invalid: use 0 (dense) or a value in (0, 1), e.g. 0.1");
  }
  return Status::Ok();
}

size_t TopkCount(double fraction, size_t numel) {
  if (numel == 0) return 0;
  const double k = std::round(fraction * static_cast<double>(numel));
  if (!(k >= 1)) return 1;
  if (k >= static_cast<double>(numel)) return numel;
  return static_cast<size_t>(k);
}

size_t MaxEncodedBytes(const CodecOptions& opt, size_t numel) {
  if (opt.kind == CodecKind::kTopkChunked) return TopkChunkedBytes(numel, opt.block_size, opt.keep, opt.value_bits);
  if (opt.topk_fraction == 0) return EncodedBytes(opt.kind, numel, opt.block_size);
  return kTopkHeaderBytes + (numel + 7) / 8 +
         EncodedBytes(opt.kind, TopkCount(opt.topk_fraction, numel), opt.block_size);
}

Status EncodeDense(CodecKind kind, int block_size, std::span<const float> in, std::span<uint8_t> out) {
  if (!IsDenseCodecKind(kind))
    return Status::Error("unknown codec " + std::to_string(static_cast<int>(kind)));
  if (CodecUsesBlocks(kind)) DL_RETURN_IF_ERROR(CheckBlockSize(block_size));
  const size_t n = in.size();
  const size_t want = EncodedBytes(kind, n, block_size);
  if (sync_payload_bytes(ToSync(kind), n, block_size) != want) {
    return Status::Error("internal: " + KindName(kind) + " layout is " +
                         std::to_string(sync_payload_bytes(ToSync(kind), n, block_size)) +
                         " bytes but EncodedBytes says " + std::to_string(want) +
                         "; kernels/sync_ops and codec_kind.h disagree");
  }
  if (out.size() != want) {
    return Status::Error(KindName(kind) + " of " + std::to_string(n) + " values needs a " + std::to_string(want) +
                         "-byte buffer, got " + std::to_string(out.size()));
  }
  size_t i = 0;
  const SyncFault fault = sync_encode_dense(out.data(), in.data(), ToSync(kind), block_size, n, &i);
  return fault == SyncFault::kNone ? Status::Ok() : EncodeFaultError(fault, in[i], i);
}

namespace {

// Where value lo of a tensor of numel values (lo a multiple of B) lies in its int8 / int4
// encoding, the tensor's ceil(numel / B) fp32 scales then its codes: the byte offsets of its
// block's scale and of its code.
struct BlockBytes {
  size_t scales, codes;
};
BlockBytes BlockBytesOf(CodecKind kind, int B, size_t numel, size_t lo) {
  return {lo / B * sizeof(float), (numel + B - 1) / B * sizeof(float) + (kind == CodecKind::kInt4 ? lo / 2 : lo)};
}

Status DecodeFaultStatus(SyncFault fault, CodecKind kind, size_t i) {
  switch (fault) {
    case SyncFault::kNone:
      return Status::Ok();
    case SyncFault::kBadScale:
      return PayloadError("scale is negative, NaN, Inf or too large", kind, i);
    case SyncFault::kBadCode:
      return PayloadError("code -128", kind, i);
    case SyncFault::kBadPad:
      return PayloadError("nonzero pad nibble", kind, i);
    case SyncFault::kNonFinite:
    default:
      return PayloadError("NaN/Inf", kind, i);
  }
}

}  // namespace

Status DecodeDense(CodecKind kind, int block_size, std::span<const uint8_t> in, std::span<float> out) {
  if (!IsDenseCodecKind(kind))
    return Status::Error("unknown codec " + std::to_string(static_cast<int>(kind)));
  if (CodecUsesBlocks(kind)) DL_RETURN_IF_ERROR(CheckBlockSize(block_size));
  const size_t n = out.size();
  const size_t want = EncodedBytes(kind, n, block_size);
  if (sync_payload_bytes(ToSync(kind), n, block_size) != want) {
    return Status::Error("internal: " + KindName(kind) + " layout disagrees with EncodedBytes");
  }
  if (in.size() != want) {
    return Status::Error(KindName(kind) + " payload is " + std::to_string(in.size()) + " bytes, " + std::to_string(n) +
                         " values need " + std::to_string(want) +
                         "; the message's shape and payload disagree (drop it)");
  }
  size_t i = 0;
  const SyncFault fault = sync_decode_dense(out.data(), in.data(), ToSync(kind), block_size, n, &i);
  return DecodeFaultStatus(fault, kind, i);
}

Status DecodeTensorBlocks(CodecKind kind, int block_size, std::span<const uint8_t> tensor, size_t numel, size_t lo,
                          std::span<float> out) {
  if (!CodecUsesBlocks(kind))
    return Status::Error("internal: DecodeTensorBlocks takes int8 or int4, not " + KindName(kind));
  DL_RETURN_IF_ERROR(CheckBlockSize(block_size));
  const size_t n = out.size(), B = (size_t)block_size;
  if (lo % B != 0 || lo > numel || n > numel - lo || (lo + n != numel && n % B != 0))
    return Status::Error("internal: values [" + std::to_string(lo) + ", " + std::to_string(lo + n) + ") of " +
                         std::to_string(numel) + " are not whole blocks of " + std::to_string(B));
  if (tensor.size() != EncodedBytes(kind, numel, block_size))
    return Status::Error(KindName(kind) + " tensor of " + std::to_string(numel) + " values is " +
                         std::to_string(tensor.size()) + " bytes, not " +
                         std::to_string(EncodedBytes(kind, numel, block_size)));
  const BlockBytes at = BlockBytesOf(kind, block_size, numel, lo);
  size_t i = 0;
  const SyncFault fault =
      sync_decode_blocks(out.data(), tensor.data() + at.scales, tensor.data() + at.codes, ToSync(kind), block_size, n, &i);
  return DecodeFaultStatus(fault, kind, lo + i);
}

Status Encode(const CodecOptions& opt, std::span<const float> in, std::vector<uint8_t>* out) {
  DL_RETURN_IF_ERROR(ValidateCodecOptions(opt));
  Status st;
  if (opt.kind == CodecKind::kTopkChunked) {
    st = EncodeChunked(opt, in, out);
  } else if (opt.topk_fraction == 0) {
    out->resize(EncodedBytes(opt.kind, in.size(), opt.block_size));
    st = EncodeDense(opt.kind, opt.block_size, in, *out);
  } else {
    st = EncodeTopk(opt, in, out);
  }
  if (!st.ok()) out->clear();
  return st;
}

Status Decode(const CodecOptions& opt, std::span<const uint8_t> in, std::span<float> out) {
  DL_RETURN_IF_ERROR(ValidateDecodeOptions(opt));
  if (opt.kind == CodecKind::kTopkChunked) return DecodeChunked(opt, in, out);
  if (opt.topk_fraction == 0) return DecodeDense(opt.kind, opt.block_size, in, out);
  return DecodeTopk(opt, in, out);
}

Status EncodeTensors(const CodecOptions& opt, std::span<const float> in, std::span<const uint64_t> numels,
                     std::vector<uint8_t>* out, std::vector<uint64_t>* tensor_bytes) {
  out->clear();
  tensor_bytes->clear();
  DL_RETURN_IF_ERROR(ValidateCodecOptions(opt));
  uint64_t total = 0;
  for (uint64_t numel : numels) total += numel;
  if (total != in.size()) {
    return Status::Error("tensor sizes add up to " + std::to_string(total) + " values but the input has " +
                         std::to_string(in.size()));
  }
  Status st;
  size_t offset = 0;
  if (!IsSparseCodec(opt)) {
    size_t bytes = 0;
    for (uint64_t numel : numels) bytes += EncodedBytes(opt.kind, numel, opt.block_size);
    out->resize(bytes);
    size_t at = 0;
    for (size_t t = 0; t < numels.size() && st.ok(); ++t) {
      const size_t b = EncodedBytes(opt.kind, numels[t], opt.block_size);
      st = EncodeDense(opt.kind, opt.block_size, in.subspan(offset, numels[t]), std::span(out->data() + at, b));
      if (!st.ok()) st = st.WithContext("tensor " + std::to_string(t));
      tensor_bytes->push_back(b);
      offset += numels[t];
      at += b;
    }
  } else {
    std::vector<uint8_t> part;
    for (size_t t = 0; t < numels.size() && st.ok(); ++t) {
      st = opt.kind == CodecKind::kTopkChunked ? EncodeChunked(opt, in.subspan(offset, numels[t]), &part)
                                               : EncodeTopk(opt, in.subspan(offset, numels[t]), &part);
      if (!st.ok()) st = st.WithContext("tensor " + std::to_string(t));
      out->insert(out->end(), part.begin(), part.end());
      tensor_bytes->push_back(part.size());
      offset += numels[t];
    }
  }
  if (!st.ok()) {
    out->clear();
    tensor_bytes->clear();
  }
  return st;
}

Status DecodeTensors(const CodecOptions& opt, std::span<const uint8_t> in, std::span<const uint64_t> numels,
                     std::span<const uint64_t> tensor_bytes, std::span<float> out) {
  DL_RETURN_IF_ERROR(ValidateDecodeOptions(opt));
  if (numels.size() != tensor_bytes.size()) {
    return Status::Error(std::to_string(numels.size()) + " tensor sizes but " + std::to_string(tensor_bytes.size()) +
                         " encoded sizes");
  }
  size_t offset = 0, at = 0;
  for (size_t t = 0; t < numels.size(); ++t) {
    if (numels[t] > out.size() - offset || tensor_bytes[t] > in.size() - at) {
      return Status::Error("tensor " + std::to_string(t) + " runs past the end of the payload or the output");
    }
    DL_RETURN_IF_ERROR(Decode(opt, in.subspan(at, tensor_bytes[t]), out.subspan(offset, numels[t]))
                           .WithContext("tensor " + std::to_string(t)));
    offset += numels[t];
    at += tensor_bytes[t];
  }
  if (offset != out.size() || at != in.size()) {
    return Status::Error("tensors cover " + std::to_string(offset) + " values in " + std::to_string(at) +
                         " bytes, but the output has " + std::to_string(out.size()) + " values and the payload " +
                         std::to_string(in.size()) + " bytes");
  }
  return Status::Ok();
}

Status DecodeTensors(const CodecOptions& opt, std::span<const std::span<const uint8_t>> chunks,
                     std::span<const uint64_t> numels, std::span<const uint64_t> tensor_bytes, std::span<float> out) {
  if (chunks.size() == 1) return DecodeTensors(opt, chunks[0], numels, tensor_bytes, out);
  DL_RETURN_IF_ERROR(ValidateDecodeOptions(opt));
  if (numels.size() != tensor_bytes.size()) {
    return Status::Error(std::to_string(numels.size()) + " tensor sizes but " + std::to_string(tensor_bytes.size()) +
                         " encoded sizes");
  }
  uint64_t in_bytes = 0;
  for (const auto& c : chunks) in_bytes += c.size();
  std::vector<uint8_t> scratch;
  size_t offset = 0, chunk = 0;
  uint64_t at = 0, chunk_begin = 0;  // payload positions: the tensor's, the current chunk's
  for (size_t t = 0; t < numels.size(); ++t) {
    if (numels[t] > out.size() - offset || tensor_bytes[t] > in_bytes - at) {
      return Status::Error("tensor " + std::to_string(t) + " runs past the end of the payload or the output");
    }
    while (chunk < chunks.size() && at >= chunk_begin + chunks[chunk].size() && tensor_bytes[t] > 0) {
      chunk_begin += chunks[chunk++].size();
    }
    std::span<const uint8_t> in;
    if (tensor_bytes[t] == 0) {
      in = {};
    } else if (at + tensor_bytes[t] <= chunk_begin + chunks[chunk].size()) {
      in = chunks[chunk].subspan(at - chunk_begin, tensor_bytes[t]);  // inside one chunk: no copy
    } else {
      // Across chunks: gather this tensor's bytes.
      scratch.resize(tensor_bytes[t]);
      uint64_t got = 0, pos = at - chunk_begin;
      for (size_t c = chunk; got < scratch.size(); ++c, pos = 0) {
        const uint64_t take = std::min<uint64_t>(chunks[c].size() - pos, scratch.size() - got);
        std::memcpy(scratch.data() + got, chunks[c].data() + pos, take);
        got += take;
      }
      in = scratch;
    }
    DL_RETURN_IF_ERROR(Decode(opt, in, out.subspan(offset, numels[t])).WithContext("tensor " + std::to_string(t)));
    offset += numels[t];
    at += tensor_bytes[t];
  }
  if (offset != out.size() || at != in_bytes) {
    return Status::Error("tensors cover " + std::to_string(offset) + " values in " + std::to_string(at) +
                         " bytes, but the output has " + std::to_string(out.size()) + " values and the payload " +
                         std::to_string(in_bytes) + " bytes");
  }
  return Status::Ok();
}

void ErrorFeedback::Sum(float* sum, const float* residual, const float* delta, size_t n) const {
  if (feedback_.rule == FeedbackRule::kAccumulate) {
    sync_accumulate(sum, residual, delta, static_cast<float>(feedback_.decay), n);
  } else if (residual != nullptr) {
    const float* __restrict r = residual;
    float* __restrict s = sum;
    for (size_t i = 0; i < n; ++i) s[i] = r[i] + delta[i];
  } else {
    std::copy(delta, delta + n, sum);
  }
}

Status ErrorFeedback::Encode(uint32_t fragment, std::span<const float> delta, std::vector<uint8_t>* payload) {
  const uint64_t n = delta.size();
  return Encode(fragment, delta, std::span(&n, 1), payload, &one_tensor_bytes_);
}

Status ErrorFeedback::Encode(uint32_t fragment, std::span<const float> delta, std::span<const uint64_t> numels,
                             std::vector<uint8_t>* payload, std::vector<uint64_t>* tensor_bytes, TaskPool* pool) {
  const size_t n = delta.size();
  const std::string context = "fragment " + std::to_string(fragment);
  auto it = residual_.find(fragment);
  if (it != residual_.end() && it->second.size() != n) {
    return Status::Error(context + " had " + std::to_string(it->second.size()) + " values, now " + std::to_string(n) +
                         "; Reset(fragment) when its layout changes");
  }
  if (pool != nullptr && pool->threads() > 1 && !IsSparseCodec(opt_)) {
    decoded_.resize(n);
    return EncodeInPieces(
        fragment, numels, [&](size_t, const Piece& p, float* values) { std::copy_n(delta.data() + p.offset, p.n, values); },
        [&](size_t, const Piece& p, const float* decoded) { std::copy_n(decoded, p.n, decoded_.data() + p.offset); },
        payload, tensor_bytes, pool);
  }
  sum_.resize(n);
  Sum(sum_.data(), it != residual_.end() ? it->second.data() : nullptr, delta.data(), n);
  DL_RETURN_IF_ERROR(EncodeTensors(opt_, sum_, numels, payload, tensor_bytes).WithContext(context));
  decoded_.resize(n);
  DL_RETURN_IF_ERROR(DecodeTensors(opt_, *payload, numels, *tensor_bytes, decoded_).WithContext(context));
  std::vector<float>& r = residual_[fragment];
  r.resize(n);
  float* __restrict rp = r.data();
  const float* __restrict s = sum_.data();
  const float* __restrict d = decoded_.data();
  for (size_t i = 0; i < n; ++i) rp[i] = s[i] - d[i];
  return Status::Ok();
}

namespace {

// Error feedback works on pieces of about this many values (whole codec blocks), so that one big
// tensor spreads over the pool and each piece's sum, payload and decoded values stay in L2.
constexpr size_t kFeedbackPiece = 16384;

// Values [lo, lo + n) of a tensor encoded at `tensor` (numel values; lo a multiple of the block):
// encoded in place, then decoded into out; *index: the offending value (within the piece). The
// payload's layout as EncodeDense writes it: fp32 / bf16 values; int8 / int4 the tensor's scales,
// then its codes.
SyncFault EncodePiece(CodecKind kind, int B, size_t numel, size_t lo, const float* x, size_t n, uint8_t* tensor,
                      float* out, size_t* index) {
  const SyncCodec k = ToSync(kind);
  if (!CodecUsesBlocks(kind)) {
    uint8_t* bytes = tensor + lo * (kind == CodecKind::kBf16 ? 2 : 4);
    const SyncFault f = sync_encode_dense(bytes, x, k, B, n, index);
    return f != SyncFault::kNone ? f : sync_decode_dense(out, bytes, k, B, n, index);
  }
  const BlockBytes at = BlockBytesOf(kind, B, numel, lo);
  uint8_t* scales = tensor + at.scales;
  uint8_t* codes = tensor + at.codes;
  const SyncFault f = sync_encode_blocks(scales, codes, x, k, B, n, index);
  return f != SyncFault::kNone ? f : sync_decode_blocks(out, scales, codes, k, B, n, index);
}

}  // namespace

std::vector<ErrorFeedback::Piece> ErrorFeedback::Pieces(const CodecOptions& opt, std::span<const uint64_t> numels) {
  const int B = opt.block_size;
  const size_t piece = CodecUsesBlocks(opt.kind) && B > 0 ? (kFeedbackPiece + B - 1) / B * B : kFeedbackPiece;
  std::vector<Piece> pieces;
  size_t offset = 0;
  for (size_t t = 0; t < numels.size(); t++) {
    for (size_t lo = 0; lo < numels[t]; lo += piece) pieces.push_back({t, lo, offset + lo, std::min<size_t>(piece, numels[t] - lo)});
    offset += numels[t];
  }
  return pieces;
}

// Per piece (Pieces: whole blocks, in parallel over the pool): the caller's delta values, sum =
// residual + delta, its encoding in its place in the payload, decoded, sum - decoded into the new
// residual, and the decoded values to the caller, while the piece is in cache. Once every piece is
// done the new residual replaces the old (a swap: the old one is the next call's buffer). Per value
// the same operations as encoding tensor by tensor, and blocks never span pieces: the same bits.
Status ErrorFeedback::EncodeInPieces(uint32_t fragment, std::span<const uint64_t> numels, const PieceProducer& produce,
                                     const PieceConsumer& consume, std::vector<uint8_t>* payload,
                                     std::vector<uint64_t>* tensor_bytes, TaskPool* pool) {
  const std::string context = "fragment " + std::to_string(fragment);
  DL_RETURN_IF_ERROR(ValidateCodecOptions(opt_).WithContext(context));
  if (IsSparseCodec(opt_)) return Status::Error(context + ": EncodeInPieces takes dense codecs only (internal)");
  const size_t T = numels.size();
  const int B = opt_.block_size;
  std::vector<size_t> byte_at(T + 1, 0);
  size_t n = 0;
  for (size_t t = 0; t < T; t++) {
    byte_at[t + 1] = byte_at[t] + EncodedBytes(opt_.kind, numels[t], B);
    n += numels[t];
  }
  auto it = residual_.find(fragment);
  if (it != residual_.end() && it->second.size() != n) {
    return Status::Error(context + " had " + std::to_string(it->second.size()) + " values, now " + std::to_string(n) +
                         "; Reset(fragment) when its layout changes");
  }
  const float* residual = it == residual_.end() ? nullptr : it->second.data();
  const std::vector<Piece> pieces = Pieces(opt_, numels);
  size_t longest = 0;
  for (const Piece& p : pieces) longest = std::max(longest, p.n);
  sum_.resize(n);
  payload->resize(byte_at[T]);
  const int workers = pool != nullptr ? pool->threads() : 1;
  std::vector<std::vector<float>> values(workers, std::vector<float>(longest)), decoded(workers, std::vector<float>(longest));
  std::vector<Status> errors(pieces.size());  // one writer each
  RunTasks(pool, pieces.size(), [&](size_t i, int worker) {
    const Piece& p = pieces[i];
    const size_t b = p.offset, m = p.n;
    float* __restrict v = values[worker].data();
    produce(i, p, v);
    float* __restrict s = sum_.data() + b;
    Sum(s, residual ? residual + b : nullptr, v, m);
    float* __restrict d = decoded[worker].data();
    size_t at = 0;
    const SyncFault fault = EncodePiece(opt_.kind, B, numels[p.tensor], p.lo, s, m, payload->data() + byte_at[p.tensor], d, &at);
    if (fault != SyncFault::kNone) {
      errors[i] = EncodeFaultError(fault, s[at], p.lo + at).WithContext("tensor " + std::to_string(p.tensor));
      return;
    }
    for (size_t j = 0; j < m; ++j) s[j] = s[j] - d[j];
    consume(i, p, d);
  });
  for (const Status& st : errors) {  // the first in tensor and index order
    if (!st.ok()) {
      payload->clear();
      tensor_bytes->clear();
      return st.WithContext(context);
    }
  }
  tensor_bytes->assign(T, 0);
  for (size_t t = 0; t < T; t++) (*tensor_bytes)[t] = byte_at[t + 1] - byte_at[t];
  residual_[fragment].swap(sum_);
  return Status::Ok();
}

std::span<const float> ErrorFeedback::residual(uint32_t fragment) const {
  auto it = residual_.find(fragment);
  if (it == residual_.end()) return {};
  return it->second;
}

}  // namespace diloco
