#include "daemon/train/outer_state.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/check.h"

namespace diloco {

namespace {

Status FromComm(const CommStatus& st, const char* what) {
  if (st.ok()) return Status::Ok();
  return Status::Error(std::string("sharded outer-sync state, ") + what + ": " + st.error);
}

// ---- Where a rank's piece of a range lies, and where its bytes go in the range's encoding ----

// Values [lo, lo + count) of a range: rank q's piece, whole blocks (the last rank's may end in the
// range's partial last block), ranks in order.
struct Piece {
  size_t lo = 0;
  size_t count = 0;
};

Piece PieceOf(size_t n, size_t block, int q, int world) {
  const size_t blocks = (n + block - 1) / block;
  const size_t first = blocks * q / world, end = blocks * (q + 1) / world;
  const size_t lo = std::min(n, first * block), hi = std::min(n, end * block);
  return {lo, hi - lo};
}

bool BlockCodec(SyncCodec kind) { return kind == SyncCodec::kInt8 || kind == SyncCodec::kInt4; }

// The two parts of a dense encoding (kernels/sync_ops.h "Layouts"): the block scales, then the codes.
size_t ScaleBytes(SyncCodec kind, size_t blocks) { return BlockCodec(kind) ? blocks * sizeof(float) : 0; }
size_t CodeBytes(SyncCodec kind, size_t values) {
  switch (kind) {
    case SyncCodec::kFp32: return values * 4;
    case SyncCodec::kBf16: return values * 2;
    case SyncCodec::kInt8: return values;
    case SyncCodec::kInt4: return (values + 1) / 2;
  }
  return 0;
}

// Where a piece's scales and codes lie in the whole encoding of its range of n values (offsets),
// and how long they are. The piece starts at a whole block, and blocks are even, so its int4 codes
// start at a whole byte.
struct PieceBytes {
  size_t scales_at, scale_bytes, codes_at, code_bytes;
};
PieceBytes PieceBytesOf(SyncCodec kind, size_t block, size_t n, Piece piece) {
  return {ScaleBytes(kind, piece.lo / block), ScaleBytes(kind, (piece.count + block - 1) / block),
          ScaleBytes(kind, (n + block - 1) / block) + CodeBytes(kind, piece.lo), CodeBytes(kind, piece.count)};
}

// The piece's own encoding (its scales, then its codes) from its range's whole encoding.
void CopyPieceOut(SyncCodec kind, size_t block, size_t n, Piece piece, const uint8_t* whole, uint8_t* out) {
  const PieceBytes b = PieceBytesOf(kind, block, n, piece);
  std::memcpy(out, whole + b.scales_at, b.scale_bytes);
  std::memcpy(out + b.scale_bytes, whole + b.codes_at, b.code_bytes);
}

// The piece's own encoding laid back where its range's whole encoding has it.
void CopyPieceIn(SyncCodec kind, size_t block, size_t n, Piece piece, const uint8_t* in, uint8_t* whole) {
  const PieceBytes b = PieceBytesOf(kind, block, n, piece);
  std::memcpy(whole + b.scales_at, in, b.scale_bytes);
  std::memcpy(whole + b.codes_at, in + b.scale_bytes, b.code_bytes);
}

// The commands rank 0 sends (ring_control.h); arguments in kRingArg0...
enum OuterCommand {
  kSetup = kRingRelease + 1,  // P, block, number of ranges; then the ranges (all_reduce_host)
  kInstall,                   // p; then the packed fragment (broadcast)
  kEncode,                    // p, codec, block
  kResetResidual,             // p
  kApply,                     // p, codec, block, bytes; then the payload (broadcast)
  kFold,                      // p, mode, alpha, included
  kShiftAtSend,               // p
  kReadBase,                  // p
};

// One rank's side of the sharded state: every command's work and collectives, the same on rank 0
// and on the followers (rank 0 passes its inputs and takes the outputs; the others pass nulls).
// Packed fragments, payloads and bases are host vectors: they travel by the *_host collectives
// (staged through a GPU ring's device scratch); only θ itself (Fold) is gathered in place.
class OuterShard {
 public:
  OuterShard(TrainingBackend& backend, LocalComm& comm) : backend_(backend), comm_(comm) {}

  Status Setup(std::vector<std::vector<ParamRange>>* fragments, int P, int block, size_t ranges) {
    DL_CHECK(block >= 2 && block % 2 == 0, "codec block %d: must be even", block);
    // The ranges travel as doubles: per fragment its range count, then (offset, count) pairs.
    std::vector<double> wire((size_t)P + 2 * ranges, 0.0);
    if (leader()) {
      size_t at = (size_t)P;
      for (int p = 0; p < P; p++) {
        wire[p] = (double)(*fragments)[p].size();
        for (const ParamRange& r : (*fragments)[p]) {
          wire[at++] = (double)r.offset;
          wire[at++] = (double)r.count;
        }
      }
    }
    DL_RETURN_IF_ERROR(FromComm(comm_.all_reduce_host(wire.data(), (int)wire.size(), ReduceOp::kSum), "setup"));
    block_ = (size_t)block;
    fragments_.assign(P, {});
    size_t at = (size_t)P;
    for (int p = 0; p < P; p++)
      for (size_t i = 0; i < (size_t)wire[p]; i++, at += 2) fragments_[p].push_back({(size_t)wire[at], (size_t)wire[at + 1]});
    std::vector<std::vector<ParamRange>> mine(P);
    for (int p = 0; p < P; p++)
      for (size_t i = 0; i < fragments_[p].size(); i++)
        if (const Piece piece = PieceOf(i, p); piece.count) mine[p].push_back({fragments_[p][i].offset + piece.lo, piece.count});
    backend_.sync_setup(mine);
    return Status::Ok();
  }

  Status Install(int p, const float* packed) {
    std::vector<float> whole(Numel(p));
    if (leader()) std::copy_n(packed, whole.size(), whole.data());
    DL_RETURN_IF_ERROR(FromComm(comm_.broadcast_host(whole.data(), whole.size(), 0), "install"));
    // Every rank's θ_p is the packed fragment; each keeps its pieces' base.
    size_t at = 0;
    for (const ParamRange& r : fragments_[p]) {
      backend_.upload_params(whole.data() + at, r.offset, r.count);
      at += r.count;
    }
    backend_.sync_install(p, Mine(p, whole.data()).data());
    return Status::Ok();
  }

  Status Encode(int p, SyncCodec kind, int block, std::vector<uint8_t>* payload, std::vector<uint64_t>* range_bytes,
                bool* encoded) {
    CheckBlock(kind, block);
    std::vector<uint8_t> mine;
    std::vector<uint64_t> mine_bytes;
    double failed = backend_.sync_encode_delta(p, kind, block, &mine, &mine_bytes) ? 0 : 1;
    DL_RETURN_IF_ERROR(FromComm(comm_.all_reduce_host(&failed, 1, ReduceOp::kSum), "encode"));
    if (encoded) *encoded = failed == 0;
    if (failed != 0) return Status::Ok();  // a non-finite value somewhere: nothing is sent
    // Every rank's pieces, back to back in rank order, each padded to whole floats.
    const int R = comm_.world_size();
    std::vector<size_t> bytes(R, 0), floats(R);
    for (int q = 0; q < R; q++) {
      for (size_t i = 0; i < fragments_[p].size(); i++) bytes[q] += sync_payload_bytes(kind, PieceOf(i, p, q).count, block);
      floats[q] = (bytes[q] + 3) / 4;
    }
    DL_CHECK(mine.size() == bytes[comm_.rank()], "rank %d encoded %zu bytes, the layout says %zu", comm_.rank(),
             mine.size(), bytes[comm_.rank()]);
    std::vector<float> all(PartOffset(floats, R), 0.0f);
    std::memcpy(all.data() + PartOffset(floats, comm_.rank()), mine.data(), mine.size());
    DL_RETURN_IF_ERROR(FromComm(comm_.all_gather_host(all.data(), floats), "gathering the encoded pieces"));
    if (!leader()) return Status::Ok();
    // Rank 0 lays every piece back where the whole range's encoding has it.
    range_bytes->clear();
    std::vector<size_t> range_at;
    size_t total = 0;
    for (const ParamRange& r : fragments_[p]) {
      const size_t b = sync_payload_bytes(kind, r.count, block);
      DL_CHECK(b == ScaleBytes(kind, (r.count + block - 1) / block) + CodeBytes(kind, r.count),
               "the piece layout disagrees with sync_payload_bytes");
      range_at.push_back(total);
      range_bytes->push_back(b);
      total += b;
    }
    payload->assign(total, 0);
    for (int q = 0; q < R; q++) {
      const uint8_t* from = reinterpret_cast<const uint8_t*>(all.data() + PartOffset(floats, q));
      for (size_t i = 0; i < fragments_[p].size(); i++) {
        const Piece piece = PieceOf(i, p, q);
        if (!piece.count) continue;
        CopyPieceIn(kind, block, fragments_[p][i].count, piece, from, payload->data() + range_at[i]);
        from += sync_payload_bytes(kind, piece.count, block);
      }
    }
    return Status::Ok();
  }

  Status Apply(int p, const uint8_t* payload, size_t bytes, SyncCodec kind, int block, bool* applied) {
    CheckBlock(kind, block);
    std::vector<float> whole((bytes + 3) / 4, 0.0f);
    if (leader()) std::memcpy(whole.data(), payload, bytes);
    DL_RETURN_IF_ERROR(FromComm(comm_.broadcast_host(whole.data(), whole.size(), 0), "sending the update"));
    const uint8_t* at = reinterpret_cast<const uint8_t*>(whole.data());
    size_t expected = 0;
    for (const ParamRange& r : fragments_[p]) expected += sync_payload_bytes(kind, r.count, block);
    double failed = 1;
    if (bytes == expected) {
      std::vector<uint8_t> mine;
      for (size_t i = 0; i < fragments_[p].size(); i++) {
        const size_t n = fragments_[p][i].count, range_bytes = sync_payload_bytes(kind, n, block);
        if (const Piece piece = PieceOf(i, p); piece.count) {
          const size_t from = mine.size();
          mine.resize(from + sync_payload_bytes(kind, piece.count, block));
          CopyPieceOut(kind, block, n, piece, at, mine.data() + from);
        }
        at += range_bytes;
      }
      failed = backend_.sync_apply_update(p, mine.data(), mine.size(), kind, block) ? 0 : 1;
    }
    DL_RETURN_IF_ERROR(FromComm(comm_.all_reduce_host(&failed, 1, ReduceOp::kSum), "applying the update"));
    if (applied) *applied = failed == 0;
    return Status::Ok();
  }

  Status Fold(int p, FoldMode mode, double alpha, FoldIncluded included) {
    backend_.sync_fold(p, mode, alpha, included);
    // Each rank folded its pieces of θ_p: gather them so every rank holds all of it.
    for (size_t i = 0; i < fragments_[p].size(); i++) {
      const ParamRange& r = fragments_[p][i];
      DL_RETURN_IF_ERROR(FromComm(comm_.all_gather(backend_.param_buffer() + r.offset, Counts(i, p)), "fold"));
      backend_.params_written(r.offset, r.count);
    }
    return Status::Ok();
  }

  Status ReadBase(int p, float* packed) {
    std::vector<float> whole(Numel(p), 0.0f), mine(Numel(p));
    backend_.sync_read_base(p, mine.data());
    size_t at = 0, from = 0;
    for (size_t i = 0; i < fragments_[p].size(); i++) {
      const Piece piece = PieceOf(i, p);
      std::copy_n(mine.data() + from, piece.count, whole.data() + at + piece.lo);
      from += piece.count;
      DL_RETURN_IF_ERROR(FromComm(comm_.all_gather_host(whole.data() + at, Counts(i, p)), "reading the base"));
      at += fragments_[p][i].count;
    }
    if (leader()) std::copy(whole.begin(), whole.end(), packed);
    return Status::Ok();
  }

  void ResetResidual(int p) { backend_.sync_reset_residual(p); }
  void ShiftAtSend(int p) { backend_.sync_shift_at_send(p); }

 private:
  bool leader() const { return comm_.rank() == 0; }
  Piece PieceOf(size_t i, int p, int q = -1) const {
    return diloco::PieceOf(fragments_[p][i].count, block_, q < 0 ? comm_.rank() : q, comm_.world_size());
  }
  std::vector<size_t> Counts(size_t i, int p) const {
    std::vector<size_t> counts(comm_.world_size());
    for (int q = 0; q < comm_.world_size(); q++) counts[q] = PieceOf(i, p, q).count;
    return counts;
  }
  size_t Numel(int p) const {
    size_t n = 0;
    for (const ParamRange& r : fragments_[p]) n += r.count;
    return n;
  }
  // This rank's pieces of a packed fragment, back to back.
  std::vector<float> Mine(int p, const float* packed) const {
    std::vector<float> mine;
    size_t at = 0;
    for (size_t i = 0; i < fragments_[p].size(); i++) {
      const Piece piece = PieceOf(i, p);
      mine.insert(mine.end(), packed + at + piece.lo, packed + at + piece.lo + piece.count);
      at += fragments_[p][i].count;
    }
    return mine;
  }
  void CheckBlock(SyncCodec kind, int block) const {
    DL_CHECK(!BlockCodec(kind) || (size_t)block == block_, "codec block %d, but the pieces were cut at %zu", block,
             block_);
  }

  TrainingBackend& backend_;
  LocalComm& comm_;
  std::vector<std::vector<ParamRange>> fragments_;
  size_t block_ = 2;
};

RingHeader CommandHeader(int command, double a0 = 0, double a1 = 0, double a2 = 0, double a3 = 0) {
  RingHeader h;
  h.slot[kRingCommand] = command;
  h.slot[kRingArg0] = a0;
  h.slot[kRingArg1] = a1;
  h.slot[kRingArg2] = a2;
  h.slot[kRingArg3] = a3;
  return h;
}

class ShardedOuterState final : public OuterState {
 public:
  explicit ShardedOuterState(LocalRing& ring) : comm_(ring.comm(0)), shard_(ring.backend(0), ring.comm(0)) {}

  Status Setup(const std::vector<std::vector<ParamRange>>& fragments, int block) override {
    size_t ranges = 0;
    for (const auto& f : fragments) ranges += f.size();
    DL_RETURN_IF_ERROR(Send(CommandHeader(kSetup, (double)fragments.size(), block, (double)ranges)));
    std::vector<std::vector<ParamRange>> copy = fragments;
    return shard_.Setup(&copy, (int)fragments.size(), block, ranges);
  }
  Status Install(int p, const float* packed) override {
    DL_RETURN_IF_ERROR(Send(CommandHeader(kInstall, p)));
    return shard_.Install(p, packed);
  }
  Status EncodeDelta(int p, SyncCodec kind, int block, std::vector<uint8_t>* payload,
                     std::vector<uint64_t>* range_bytes, bool* encoded) override {
    DL_RETURN_IF_ERROR(Send(CommandHeader(kEncode, p, (double)kind, block)));
    return shard_.Encode(p, kind, block, payload, range_bytes, encoded);
  }
  Status ResetResidual(int p) override {
    DL_RETURN_IF_ERROR(Send(CommandHeader(kResetResidual, p)));
    shard_.ResetResidual(p);
    return Status::Ok();
  }
  Status ApplyUpdate(int p, const uint8_t* payload, size_t bytes, SyncCodec kind, int block, bool* applied) override {
    DL_RETURN_IF_ERROR(Send(CommandHeader(kApply, p, (double)kind, block, (double)bytes)));
    return shard_.Apply(p, payload, bytes, kind, block, applied);
  }
  Status Fold(int p, FoldMode mode, double alpha, FoldIncluded included) override {
    DL_RETURN_IF_ERROR(Send(CommandHeader(kFold, p, (double)mode, alpha, (double)included)));
    return shard_.Fold(p, mode, alpha, included);
  }
  Status ShiftAtSend(int p) override {
    DL_RETURN_IF_ERROR(Send(CommandHeader(kShiftAtSend, p)));
    shard_.ShiftAtSend(p);
    return Status::Ok();
  }
  Status ReadBase(int p, float* packed) override {
    DL_RETURN_IF_ERROR(Send(CommandHeader(kReadBase, p)));
    return shard_.ReadBase(p, packed);
  }
  bool SpreadsParameters() const override { return true; }
  Status Release() override { return FromComm(ReleaseFollowers(comm_), "releasing the ring"); }

 private:
  Status Send(RingHeader h) { return FromComm(ExchangeRingHeader(comm_, &h), "sending a command"); }

  LocalComm& comm_;
  OuterShard shard_;
};

class OuterFollower final : public RingCommandHandler {
 public:
  OuterFollower(TrainingBackend& backend, LocalComm& comm) : shard_(backend, comm) {}

  Status Serve(const RingHeader& h) override {
    const double* a = h.slot + kRingArg0;
    const int p = (int)a[0];
    switch ((int)h.slot[kRingCommand]) {
      case kSetup: return shard_.Setup(nullptr, p, (int)a[1], (size_t)a[2]);
      case kInstall: return shard_.Install(p, nullptr);
      case kEncode: return shard_.Encode(p, (SyncCodec)(int)a[1], (int)a[2], nullptr, nullptr, nullptr);
      case kResetResidual: shard_.ResetResidual(p); return Status::Ok();
      case kApply: return shard_.Apply(p, nullptr, (size_t)a[3], (SyncCodec)(int)a[1], (int)a[2], nullptr);
      case kFold: return shard_.Fold(p, (FoldMode)(int)a[1], a[2], (FoldIncluded)(int)a[3]);
      case kShiftAtSend: shard_.ShiftAtSend(p); return Status::Ok();
      case kReadBase: return shard_.ReadBase(p, nullptr);
    }
    return Status::Error("unknown outer-sync command " + std::to_string((int)h.slot[kRingCommand]) +
                         " from rank 0; are every rank's binaries the same?");
  }

 private:
  OuterShard shard_;
};

// The whole state on rank 0's backend.
class BackendOuterState final : public OuterState {
 public:
  explicit BackendOuterState(TrainingBackend& backend) : b_(backend) {}

  Status Setup(const std::vector<std::vector<ParamRange>>& fragments, int) override {
    b_.sync_setup(fragments);
    return Status::Ok();
  }
  Status Install(int p, const float* packed) override {
    b_.sync_install(p, packed);
    return Status::Ok();
  }
  Status EncodeDelta(int p, SyncCodec kind, int block, std::vector<uint8_t>* payload,
                     std::vector<uint64_t>* range_bytes, bool* encoded) override {
    *encoded = b_.sync_encode_delta(p, kind, block, payload, range_bytes);
    return Status::Ok();
  }
  Status ResetResidual(int p) override {
    b_.sync_reset_residual(p);
    return Status::Ok();
  }
  Status ApplyUpdate(int p, const uint8_t* payload, size_t bytes, SyncCodec kind, int block, bool* applied) override {
    *applied = b_.sync_apply_update(p, payload, bytes, kind, block);
    return Status::Ok();
  }
  Status Fold(int p, FoldMode mode, double alpha, FoldIncluded included) override {
    b_.sync_fold(p, mode, alpha, included);
    return Status::Ok();
  }
  Status ShiftAtSend(int p) override {
    b_.sync_shift_at_send(p);
    return Status::Ok();
  }
  Status ReadBase(int p, float* packed) override {
    b_.sync_read_base(p, packed);
    return Status::Ok();
  }
  bool SpreadsParameters() const override { return false; }
  Status Release() override { return Status::Ok(); }

 private:
  TrainingBackend& b_;
};

}  // namespace

bool OuterStateSharded(const LocalRing& ring, ShardMode shard) {
  return shard != ShardMode::kNone && ring.world_ranks() > 1;
}

Status RunRingFollower(InnerLoopOptions lo, LocalRing& ring, int local_rank, ShardMode shard, long* done,
                       const std::function<void()>& at_loop_end) {
  std::unique_ptr<RingCommandHandler> commands;
  if (OuterStateSharded(ring, shard)) commands = MakeOuterStateFollower(ring.backend(local_rank), ring.comm(local_rank));
  lo.commands = commands.get();
  DL_RETURN_IF_ERROR(RunInnerLoop(lo, ring.backend(local_rank), ring.comm(local_rank), nullptr, done));
  if (at_loop_end) at_loop_end();
  if (commands) DL_RETURN_IF_ERROR(ServeRing(ring.comm(local_rank), *commands));
  return Status::Ok();
}

std::unique_ptr<OuterState> MakeOuterState(LocalRing& ring, ShardMode shard) {
  if (OuterStateSharded(ring, shard)) return std::make_unique<ShardedOuterState>(ring);
  return std::make_unique<BackendOuterState>(ring.backend(0));
}

std::unique_ptr<OuterState> MakeBackendOuterState(TrainingBackend& backend) {
  return std::make_unique<BackendOuterState>(backend);
}

std::unique_ptr<RingCommandHandler> MakeOuterStateFollower(TrainingBackend& backend, LocalComm& comm) {
  return std::make_unique<OuterFollower>(backend, comm);
}

}  // namespace diloco
