// ZeRO-2's gradients on the GPU (train.shard: gradients; CpuBackend::ShardedGrads is the CPU
// twin): the backward writes each bucket (a range of the table: wte + wpe, ln_f, one block) into
// a zeroed device buffer; when the bucket is final the ring reduce-scatters it at once, this rank
// keeps the mean of its shard's part, and the buffer is reused for the next bucket. A rank holds
// its shard of the gradients plus two buckets (the embeddings', open throughout the backward, and
// the largest of ln_f and a block), not num_params floats.
//
// Each bucket starts at the same address modulo 256 bytes as its range does in a whole gradient
// buffer, so cuBLASLt (whose algorithm choice depends on pointer alignment, gemm.cu) picks the
// kernels of the unsharded backward and the bucket holds the same bits.
//
// Host code; the backend's thread calls it between its kernel launches on `stream`.
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/backend.h"
#include "kernels/comm/local_comm.h"
#include "kernels/cuda/device.h"

namespace diloco::cuda {

class GradBuckets {
 public:
  // counts: ShardCounts of the ring; shard: this rank's range; bucket_floats: the two buckets'
  // largest sizes (the embeddings', and the largest other).
  GradBuckets(const std::vector<size_t>& counts, ParamRange shard, size_t embed_floats, size_t other_floats,
              Stream stream);

  // Before a backward: closes reduce-scatter over comm.
  void Start(LocalComm* comm);
  // A zeroed buffer for the gradients of [offset, offset + count), open until Close.
  float* Open(size_t offset, size_t count);
  // The bucket is final: waits for the stream, reduce-scatters it (mean), copies this rank's part
  // into the shard's gradients. After a failed collective the later closes do nothing.
  void Close(size_t offset, size_t count);
  // The address of table offset `offset` in the open bucket that holds it (aborts if none does).
  float* At(size_t offset);

  const CommStatus& status() const { return status_; }
  const float* grads() const { return grads_.get(); }  // the shard's mean gradients (shard.count)
  size_t bytes() const;

 private:
  struct Slot {
    DeviceArray<float> buffer;  // capacity + 63 floats of alignment pad
    size_t capacity = 0;
    bool open = false;
    size_t offset = 0, count = 0;
    float* data = nullptr;  // buffer + pad: the address of `offset`
  };
  const std::vector<size_t> counts_;
  const ParamRange shard_;
  Stream stream_;
  DeviceArray<float> grads_;
  std::vector<Slot> slots_;
  LocalComm* comm_ = nullptr;
  CommStatus status_;
};

}  // namespace diloco::cuda
