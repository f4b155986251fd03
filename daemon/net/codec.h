// Delta codecs: float32 tensors <-> wire payload bytes, plus sender-side error feedback.
//
// Dense codecs (CodecKind, codec_kind.h); n values, block size B; all little-endian:
// | codec | payload                                                        | bytes/param | B=64   |
// | ----- | -------------------------------------------------------------- | ----------- | ------ |
// | fp32  | n float32 (a copy)                                             | 4           | 4      |
// | bf16  | n bfloat16, round-to-nearest-even                              | 2           | 2      |
// | int8  | ceil(n/B) float32 scales, then n int8 codes in [-127, 127]     | 1 + 4/B     | 1.0625 |
// | int4  | ceil(n/B) float32 scales, then ceil(n/2) bytes of int4 codes   | 0.5 + 4/B   | 0.5625 |
// |       | 0..15, two per byte, low nibble first (value 2j in the low     |             |        |
// |       | nibble of byte j; the pad nibble of an odd n is 0)             |             |        |
// (B = 32 / 128 / 256: int8 1.125 / 1.03125 / 1.015625, int4 0.625 / 0.53125 / 0.515625.)
// Blocks are consecutive runs of B values (the last one may be short), stored as fp32 scales:
//   int8  scale = absmax/127, code = round-half-even of the exact product x * (127/absmax), in
//         [-127, 127], value = code * scale;
//   int4  scale = absmax, code c = the nearest of the 16 levels kInt4Levels (below) to x / scale,
//         value = kInt4Levels[c] * scale. The levels are the Lloyd-Max quantizer of a Gaussian
//         (Max 1960), scaled so the outermost are -1 and +1: finer steps near zero, where most
//         values of a delta lie. On N(0, 1) data that is 9.0% / 9.6% / 10.3% relative L2 error at
//         B = 64 / 128 / 256, where a uniform grid (+-7 steps of absmax/7) gave 11% / 12% / 13.6%.
//         Every code is valid; the block's absmax decodes exactly.
// An all-zero block has scale 0 and decodes to zeros; so does a block whose absmax is below
// ~3.7e-37 (127 / FLT_MAX): error feedback carries such values on. The payload size
// is exactly EncodedBytes(kind, n, B) (codec_kind.h), the wire's size check.
// The dense codecs are kernels/sync_ops.h's (sync_encode_dense / sync_decode_dense), which pins
// every rounding step (ties included) so that sites built with any flags, CPU or CUDA, write
// and read the same bytes; this file adds top-k, tensors, error feedback and Status errors.
//
// Top-k (CodecOptions::topk_fraction = f in (0, 1)): keeps k = clamp(round(f*n), 1, n) values of
// largest magnitude (ties go to the lower index), in index order. Payload:
//   16-byte header {u8 index_format (1 = bitmap, 2 = delta), u8 codec (CodecKind), u16 0,
//                   u32 index_bytes, u32 k, u32 n}           (so top-k takes n < 2^32 per call)
//   index_bytes of indices: bitmap = ceil(n/8) bytes, bit i%8 of byte i/8 set when i is kept;
//     delta = LEB128 varints of the gaps (first index, then index[j] - index[j-1] - 1).
//     The encoder writes whichever is smaller (delta on a strict win, else the bitmap).
//   EncodedBytes(codec, k, B) bytes: the kept values, a dense payload of the chosen codec.
// Bytes/param = f * (codec bytes/param) + min(1/8, f * bytes per gap) + 16/n; with random
// positions at f = 0.1 nearly every gap fits in one byte, so int4 B=64 top-0.1 costs
// 0.05625 + 0.1 = 0.156 (delta; the bitmap would be 0.181). The bitmap wins from f ~ 1/8 up.
// Top-k is not self-describing: the decoder must be told (by the message's codec fields) that a
// payload is top-k; k and n come from its header. At most MaxEncodedBytes() bytes.
//
// Chunked top-k (CodecKind::kTopkChunked, the SparseLoCo layout): each tensor is cut into chunks
// of C = block_size values; of each chunk the kc = keep (min(len, ceil(keep * len / C)) for a short
// last chunk) values of largest magnitude (ties to the lower index) travel as packed in-chunk
// indices and b-bit codes over 2^b equal bins of +-1.25 sigma of the kept values. Payload per tensor:
//   8-byte header {u8 format (1), u8 bits (2, 4 or 8), u16 0, u32 keep (1..C)}
//   one record per chunk, in order: f32 bin width, ceil(kc * ib / 8) bytes of ib-bit indices
//     (ib = bit_width(C - 1): 12 for C = 4096), ceil(kc * b / 8) bytes of b-bit codes
// (kernels/sync_sparse.h: the records and their pinned arithmetic). Exactly TopkChunkedBytes(n, C,
// keep, b) bytes: 0.0283 bytes/param at C 4096, keep 64, b 2 (116 bytes per chunk; 141x under
// fp32, 20x under int4 B=64). The decoder takes keep and bits from the header (the wire carries
// the codec and C only) and checks every field: header, exact size, scales, indices (in range,
// strictly increasing), codes and pad bits.
//
// Errors (Status, nothing thrown, nothing sent): encoders reject NaN/Inf input, naming the first
// bad index, and bf16 also finite values that round to Inf; on error Encode leaves *out empty
// (EncodeDense: the buffer's contents are unspecified). Decoders check the payload size, the
// scales (finite, >= 0, small enough that code * scale stays finite), the codes (int8 -128 is
// never written, so it is rejected; the int4 pad nibble must be 0), bf16/fp32 values (finite), top-k headers and indices
// (in range, strictly increasing, k of them). Every decode overwrites its output (=).
//
// Speed, one core of an AVX-512 EPYC (GCC 12 -O3 -march=native), 64 MiB of N(0, 1), GB/s of
// fp32 input: int8 encode and decode at 13-19 GB/s, int4 encode ~10 (seven compares per value)
// and decode ~18, bf16 ~10/20, top-k 0.1 encode ~1 (a radix select); `dilococtl bench codec`
// measures. The kernels (kernels/cpu/sync_ops.cpp) are plain loops GCC vectorizes, except the
// int4 decoder's table lookup (AVX-512 vpermps when built for it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "daemon/net/codec_kind.h"
#include "daemon/util/status.h"
#include "daemon/util/task_pool.h"
#include "kernels/sync_ops.h"
#include "kernels/sync_sparse.h"

namespace diloco {

struct CodecOptions {
  CodecKind kind = CodecKind::kInt4;    // the paper's uplink codec
  int block_size = kDefaultCodecBlock;  // values per fp32 scale (int8/int4); even, in [2, 65536]
  double topk_fraction = 0;             // 0: dense; in (0, 1): top-k, keep this fraction of the values
  // kTopkChunked (block_size is its chunk): values kept per chunk, in [1, block_size], and the bits of
  // each kept value's code (2, 4 or 8). Read by its encoder; its decoder reads them from the payload.
  int keep = 64;
  int value_bits = 2;
};

// How ErrorFeedback carries what the codec lost (FeedbackRule, codec_kind.h).
struct FeedbackOptions {
  FeedbackRule rule = FeedbackRule::kResidual;
  double decay = 1.0;  // kAccumulate: e <- decay * e + delta, decay in (0, 1] (as fp32)
};

inline constexpr int kMinCodecBlockSize = 2;
inline constexpr int kMaxCodecBlockSize = 65536;
inline constexpr size_t kTopkHeaderBytes = 16;
inline constexpr size_t kTopkChunkedHeaderBytes = 8;  // TopkChunkedBytes (codec_kind.h) counts it

// Sparse codecs (top-k or chunked top-k): the learner encodes and decodes them on the host from
// fp32 values, the syncer holds such deltas decoded; dense ones travel as they are.
inline bool IsSparseCodec(const CodecOptions& opt) {
  return opt.topk_fraction != 0 || opt.kind == CodecKind::kTopkChunked;
}


// int4 code c decodes to kInt4Levels[c] * scale (ascending; kInt4Levels[15 - c] == -kInt4Levels[c]):
// kernels/sync_ops.h's table, the one definition.
inline constexpr const float (&kInt4Levels)[16] = kSyncInt4Levels;

// Ok when kind is one of the five codecs, block_size is even in [2, 65536] (used by int8/int4
// and topk_chunked only, but checked for every kind) and topk_fraction is 0 or in (0, 1) (0 for
// topk_chunked, whose keep is in [1, block_size] and value_bits 2, 4 or 8).
Status ValidateCodecOptions(const CodecOptions& opt);

// ValidateCodecOptions for a decoder, whose options come from the wire (codec, block, top-k
// fraction): topk_chunked's keep and bits are in its payload, so they are not checked.
Status ValidateDecodeOptions(CodecOptions opt);

// How many values top-k keeps of numel: clamp(round(fraction * numel), 1, numel); 0 for numel 0.
size_t TopkCount(double fraction, size_t numel);

// The encoded size of numel values (one tensor): exact for dense codecs (== EncodedBytes) and
// topk_chunked (== TopkChunkedBytes), an upper bound for top-k (the bitmap index). Requires
// ValidateCodecOptions(opt).ok().
size_t MaxEncodedBytes(const CodecOptions& opt, size_t numel);

// Dense codecs on caller-owned buffers (no allocation). out.size() must equal
// EncodedBytes(kind, in.size(), block_size) / decode: in.size() must, for out.size() values.
Status EncodeDense(CodecKind kind, int block_size, std::span<const float> in, std::span<uint8_t> out);
Status DecodeDense(CodecKind kind, int block_size, std::span<const uint8_t> in, std::span<float> out);
// int8 / int4: values [lo, lo + out.size()) of a tensor of numel values whose encoding is
// `tensor` (EncodeDense's layout), decoded from their blocks where they lie; lo is a multiple of
// block_size and the range ends at a block boundary or at numel (a reader of some blocks). The
// checks of DecodeDense on those blocks; an index in an error counts from the tensor's start.
Status DecodeTensorBlocks(CodecKind kind, int block_size, std::span<const uint8_t> tensor, size_t numel, size_t lo,
                          std::span<float> out);

// Any codec, with or without top-k. Encode resizes *out to the payload size.
// Decode writes out.size() values; the payload must be exactly what Encode wrote for that many.
Status Encode(const CodecOptions& opt, std::span<const float> in, std::vector<uint8_t>* out);
Status Decode(const CodecOptions& opt, std::span<const uint8_t> in, std::span<float> out);

// A payload of several tensors (the wire's TensorDescriptors): in holds them back to back,
// numels[i] values each (summing to in.size()); each is encoded on its own (blocks and top-k
// never span tensors) and the encodings are concatenated in *out, tensor i taking
// (*tensor_bytes)[i] bytes (TensorDescriptor::encoded_bytes). DecodeTensors is the inverse.
Status EncodeTensors(const CodecOptions& opt, std::span<const float> in, std::span<const uint64_t> numels,
                     std::vector<uint8_t>* out, std::vector<uint64_t>* tensor_bytes);
Status DecodeTensors(const CodecOptions& opt, std::span<const uint8_t> in, std::span<const uint64_t> numels,
                     std::span<const uint64_t> tensor_bytes, std::span<float> out);
// The same over a payload in pieces (ParsedMessage::payload_spans(): the received chunks, in
// order): a tensor inside one piece is decoded where it lies, one across pieces from a copy.
Status DecodeTensors(const CodecOptions& opt, std::span<const std::span<const uint8_t>> chunks,
                     std::span<const uint64_t> numels, std::span<const uint64_t> tensor_bytes, std::span<float> out);

// Sender-side error feedback, one residual per fragment (not thread-safe; one per sender):
//   sum = residual_p + delta; payload = Encode(sum); residual_p = sum - Decode(payload).
// With FeedbackRule::kAccumulate, sum = fl(fl(decay * residual_p) + delta) (sync_accumulate in
// kernels/sync_sparse.h): the accumulator of SparseLoCo / MuLoCo, e <- decay e + delta, send C(e),
// e <- e - decode(C(e)).
// What the codec lost in one message is sent with the next delta of the same fragment, so the
// sum of decoded deltas stays within one message's quantization error of the true sum.
// On error (NaN/Inf in delta or in the sum, size change) the residual is left as it was.
class ErrorFeedback {
 public:
  explicit ErrorFeedback(const CodecOptions& opt, FeedbackOptions feedback = {}) : opt_(opt), feedback_(feedback) {}

  // The fragment as one tensor.
  Status Encode(uint32_t fragment, std::span<const float> delta, std::vector<uint8_t>* payload);
  // The fragment as several tensors (EncodeTensors). With a pool, dense codecs work on pieces
  // of the tensors in parallel (EncodeInPieces; the same bytes as without).
  Status Encode(uint32_t fragment, std::span<const float> delta, std::span<const uint64_t> numels,
                std::vector<uint8_t>* payload, std::vector<uint64_t>* tensor_bytes, TaskPool* pool = nullptr);
  // What the last successful Encode's payload decodes to (the receiver's values): decoded once,
  // here, for the residual; a sender that applies its own update reads it instead of decoding
  // again. Valid until the next Encode.
  std::span<const float> decoded() const { return decoded_; }

  // A fragment's values in the pieces EncodeInPieces works on: [lo, lo + n) of tensor `tensor`
  // (whole codec blocks, about 16K values), at `offset` in the fragment; in order.
  struct Piece {
    size_t tensor, lo, offset, n;
  };
  static std::vector<Piece> Pieces(const CodecOptions& opt, std::span<const uint64_t> numels);
  // Dense codecs: Encode with the caller's work fused around each piece (Pieces(options(),
  // numels)), so that a caller that computes the delta and applies the decoded update does both
  // while the piece is in cache: produce(i, piece, values) writes piece i's delta (piece.n floats),
  // consume(i, piece, decoded) reads its decoded values (valid during the call). Pieces run on the
  // pool, in no fixed order; the bytes and residual are those of Encode. On error (the first
  // offending value in tensor and index order) the residual is left as it was, but consume may
  // have run for some pieces; decoded() is not written.
  using PieceProducer = std::function<void(size_t i, const Piece& piece, float* values)>;
  using PieceConsumer = std::function<void(size_t i, const Piece& piece, const float* decoded)>;
  Status EncodeInPieces(uint32_t fragment, std::span<const uint64_t> numels, const PieceProducer& produce,
                        const PieceConsumer& consume, std::vector<uint8_t>* payload,
                        std::vector<uint64_t>* tensor_bytes, TaskPool* pool);

  // The fragment's residual; empty before its first Encode and after Reset.
  std::span<const float> residual(uint32_t fragment) const;
  // Drops the fragment's residual (e.g. the learner resynced fragment p from a snapshot).
  void Reset(uint32_t fragment) { residual_.erase(fragment); }
  const CodecOptions& options() const { return opt_; }
  const FeedbackOptions& feedback() const { return feedback_; }

 private:
  // sum (n) = the rule's residual + delta; residual may be null (none yet).
  void Sum(float* sum, const float* residual, const float* delta, size_t n) const;

  CodecOptions opt_;
  FeedbackOptions feedback_;
  std::unordered_map<uint32_t, std::vector<float>> residual_;
  std::vector<float> sum_;      // scratch: residual + delta
  std::vector<float> decoded_;  // scratch: Decode(payload)
  std::vector<uint64_t> one_tensor_bytes_;
};

}  // namespace diloco
