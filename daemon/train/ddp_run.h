// Local mode, sync.mode ddp (sync.learners M > 1): the lock-step baseline the DiLoCo modes are
// compared with. The M learners form one local ring of M × train.ranks ranks (local_ring.h), the
// same inner loop as every mode (inner_loop.h): each rank samples train.batch_size sequences of its
// learner's data shard, the gradients are mean all-reduced every step (blocking: a slow learner
// holds everyone up), and every rank applies the same clipped AdamW step, so every copy holds
// bitwise the same parameters (checked at the end). One learner with M × the batch trains the same
// trajectory up to float rounding. train.batch_size and train.steps are per learner, as in the
// other modes.
// Wire bytes: no bytes move here; bytes_up counts what a ring all-reduce of fp32 gradients among
// the M learners would send, 2 (M−1)/M × 4 bytes × parameters per learner per step
// (RingBytesPerMember), and bytes_down stays 0, since every ring transfer is one learner's send.
// The run directory gets config.yaml, metrics.jsonl (the run's lines), learner-<i>.jsonl (each
// learner's: run_dir.h) and checkpoint.bin (the model and AdamW state every rank shares), so
// --resume continues from it like a single learner.
#pragma once

#include <cstddef>
#include <cstdint>

#include "daemon/train/local_run.h"
#include "daemon/train/trainer.h"
#include "daemon/util/status.h"

namespace diloco {

// Bytes one member sends per all-reduce of n fp32 values in a ring of `members`: reduce-scatter
// and all-gather each move (members - 1) chunks of n / members values.
inline uint64_t RingBytesPerMember(int members, size_t n) {
  return members <= 1 ? 0 : (uint64_t)(2.0 * (members - 1) / members * 4.0 * (double)n);
}

// hooks: only before_step applies (called for learner 0, whose steps pace the ring).
Status RunLocalDdp(const TrainOptions& options, TrainSummary* summary, LocalRunDetails* details = nullptr,
                   const LocalRunHooks& hooks = {});

}  // namespace diloco
