// Local mode, sync.mode ddp (sync.learners M > 1): the lock-step baseline the DiLoCo modes are
// compared with. M learner threads, each with its own model copy and data shard (train.batch_size
// and train.steps are per learner, as in the other modes), compute gradients, average them every
// step through a ThreadRing (blocking: a slow learner holds everyone up) and each apply the same
// clipped AdamW step, so every copy holds bitwise the same parameters (checked at the end). One
// learner with M × the batch trains the same trajectory up to float rounding.
// Wire bytes: no bytes move here; bytes_up counts what a ring all-reduce of fp32 gradients would
// send, 2 (M−1)/M × 4 bytes × parameters per learner per step (ThreadRing::RingBytesPerMember),
// and bytes_down stays 0, since every ring transfer is one learner's send (counting the receive
// too would count it twice; the syncer modes count each learner↔syncer message once).
// The run directory gets config.yaml, metrics.jsonl and checkpoint.bin (learner 0's model and
// AdamW state, which every learner shares), so --resume continues from it like a single learner.
#pragma once

#include "daemon/train/local_run.h"
#include "daemon/train/trainer.h"
#include "daemon/util/status.h"

namespace diloco {

Status RunLocalDdp(const TrainOptions& options, TrainSummary* summary, LocalRunDetails* details = nullptr);

}  // namespace diloco
