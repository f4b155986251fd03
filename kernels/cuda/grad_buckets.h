// ZeRO-2's gradients on the GPU (train.shard: gradients; CpuBackend::ShardedGrads is the CPU
// twin): the backward writes each bucket (a range of the table: wte + wpe, ln_f, one block) into
// a zeroed device buffer; when the bucket is final the ring reduce-scatters it, this rank keeps
// the mean of its shard's part, and the buffer is reused for a later bucket. A rank holds its
// shard of the gradients plus three buckets (the embeddings', open throughout the backward, and
// two of the largest of ln_f and a block), not num_params floats.
//
// Overlap: the host never waits for a bucket. Close records an event on the compute stream
// (the bucket is final there), the comm stream waits for it, and the bucket's reduce-scatter and
// the copy of this rank's part into the shard's gradients run on the comm stream, then record
// the slot's `done` event. Only two things wait for that, both on the GPU: the next Open of the
// same slot (the compute stream waits for `done` before zeroing it), and Finish (the compute
// stream waits for the comm stream before the norm and AdamW read the shard). With two slots for
// the blocks, block l's reduce-scatter runs while block l - 1's backward computes. The host
// waits once per step, in Finish, through the ring (wait_stream: a dead peer is an error, not a
// hang).
//
// Each bucket starts at the same address modulo 256 bytes as its range does in a whole gradient
// buffer, so cuBLASLt (whose algorithm choice depends on pointer alignment, gemm.cu) picks the
// kernels of the unsharded backward and the bucket holds the same bits.
//
// Host code; the backend's thread calls it between its kernel launches on `stream`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/comm/local_comm.h"
#include "kernels/cuda/device.h"

namespace diloco::cuda {

class GradBuckets {
 public:
  // counts: ShardCounts of the ring (the real values); shard: this rank's range; embed_floats,
  // other_floats: the embeddings' bucket and the largest other one. stream: the backward's;
  // comm_stream: where the ring's collectives run.
  GradBuckets(const std::vector<size_t>& counts, ParamRange shard, size_t embed_floats, size_t other_floats,
              Stream stream, Stream comm_stream);

  // Before a backward: closes reduce-scatter over comm.
  void Start(LocalComm* comm);
  // A zeroed buffer for the gradients of [offset, offset + count), open until Close (the compute
  // stream first waits for the last collective that read the slot).
  float* Open(size_t offset, size_t count);
  // The bucket is final: its reduce-scatter (mean) and the copy of this rank's part into the
  // shard's gradients are enqueued on the comm stream after the backward's work so far; the host
  // does not wait. After a failed collective the later closes do nothing.
  void Close(size_t offset, size_t count);
  // After the backward: the compute stream waits for every bucket's collective, and the host
  // waits for the comm stream through the ring. The first error of the step, or ok.
  CommStatus Finish();
  // The address of table offset `offset` in the open bucket that holds it (aborts if none does).
  float* At(size_t offset);

  const float* grads() const { return grads_.get(); }  // the shard's mean gradients (shard.count)
  size_t bytes() const;

 private:
  struct Slot {
    DeviceArray<float> buffer;  // capacity + 63 floats of alignment pad
    size_t capacity = 0;
    bool open = false;
    size_t offset = 0, count = 0;
    float* data = nullptr;  // buffer + pad: the address of `offset`
    uint64_t closed_at = 0;  // which Close used it last (0: never): Open takes the least recent
    std::unique_ptr<StreamEvent> ready, done;  // backward done with it; its collective done
  };
  const std::vector<size_t> counts_;
  const ParamRange shard_;
  Stream stream_, comm_stream_;
  DeviceArray<float> grads_;
  std::vector<Slot> slots_;
  StreamEvent comm_done_;  // the comm stream's work so far (Finish)
  uint64_t closes_ = 0;
  LocalComm* comm_ = nullptr;
  CommStatus status_;
};

}  // namespace diloco::cuda
