// A learner's outer-sync state (DESIGN.md §3): per fragment its base (the global last folded), the
// base before it, θ at send and the error-feedback residual — 16 bytes a parameter — and the
// operations on them, which are TrainingBackend's sync_* ops. Two ways to keep it:
//
//   BackendOuterState   all of it on rank 0's backend (train.shard: none). A fold or an install
//                       rewrites rank 0's θ_p; the ring copies it before the next step
//                       (StepControl::changed).
//   ShardedOuterState   sharded over the ring like the AdamW state (train.shard: optimizer or
//                       gradients): rank r keeps piece r of every range of every fragment — whole
//                       codec blocks, in rank order, as even as the blocks allow — and encodes,
//                       decodes and folds that piece on its own backend. Rank 0 drives the other
//                       ranks with ring commands (ring_control.h) and assembles the payloads: a
//                       block codec encodes each block alone, so the pieces' encodings, laid back
//                       where the whole range's encoding puts their scales and codes, are that
//                       encoding byte for byte. A fold ends with the pieces all-gathered, so every
//                       rank holds the folded θ_p and nothing is left to copy.
//
// Every method runs on rank 0 (the learner's thread); ShardedOuterState's followers serve it from
// MakeOuterStateFollower's handler, inside their inner loop (RunInnerLoop's commands) and after it
// (ServeRing) until Release().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "daemon/train/inner_loop.h"
#include "daemon/train/local_ring.h"
#include "daemon/train/ring_control.h"
#include "daemon/util/status.h"
#include "kernels/backend.h"

namespace diloco {

class OuterState {
 public:
  virtual ~OuterState() = default;

  // Sets up the fragments (base_p = θ_p, residuals zero). block: the codec block of both links
  // (sync.codec.block); a sharded state cuts its pieces at whole blocks of it.
  virtual Status Setup(const std::vector<std::vector<ParamRange>>& fragments, int block) = 0;
  // base_p = θ_p = packed (every rank's θ_p); the residual is dropped.
  virtual Status Install(int p, const float* packed) = 0;
  // TrainingBackend::sync_encode_delta; *encoded false (nothing sent) when a value is not finite.
  virtual Status EncodeDelta(int p, SyncCodec kind, int block, std::vector<uint8_t>* payload,
                             std::vector<uint64_t>* range_bytes, bool* encoded) = 0;
  virtual Status ResetResidual(int p) = 0;
  // TrainingBackend::sync_apply_update; *applied false on a payload the encoder never writes.
  virtual Status ApplyUpdate(int p, const uint8_t* payload, size_t bytes, SyncCodec kind, int block,
                             bool* applied) = 0;
  virtual Status Fold(int p, FoldMode mode, double alpha, FoldIncluded included) = 0;
  virtual Status ShiftAtSend(int p) = 0;
  // base_p, packed (host).
  virtual Status ReadBase(int p, float* packed) = 0;

  // Whether Fold and Install leave the new θ_p on every rank of the ring; when not, rank 0 alone
  // changed it and the ring must copy it before the next step.
  virtual bool SpreadsParameters() const = 0;
  // After rank 0's last command: the followers stop serving (ServeRing returns).
  virtual Status Release() = 0;
};

// The outer state of `ring` for train.shard `shard`: sharded when shard is not none and the ring
// has more than one rank.
std::unique_ptr<OuterState> MakeOuterState(LocalRing& ring, ShardMode shard);
// The whole state on one backend, without a ring (a learner of one rank that runs no inner loop:
// the timed learner of `dilococtl simulate`).
std::unique_ptr<OuterState> MakeBackendOuterState(TrainingBackend& backend);
// Whether MakeOuterState(ring, shard) shards, i.e. the followers must serve its commands.
bool OuterStateSharded(const LocalRing& ring, ShardMode shard);

// The handler follower `rank` of the ring runs for a ShardedOuterState's commands.
std::unique_ptr<RingCommandHandler> MakeOuterStateFollower(TrainingBackend& backend, LocalComm& comm);

// A follower of a learner's ring (any rank but the ring's rank 0; local_rank indexes this
// process's ranks): its inner loop (lo), then, when the ring shards its outer-sync state, rank 0's
// commands until rank 0 releases it. *done: the step its loop ended at; at_loop_end (may be empty)
// runs when the loop ended, before the commands that follow it (the last folds).
Status RunRingFollower(InnerLoopOptions lo, LocalRing& ring, int local_rank, ShardMode shard, long* done,
                       const std::function<void()>& at_loop_end = {});

}  // namespace diloco
