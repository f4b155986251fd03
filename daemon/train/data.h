// Training data: a byte-level corpus (tokens are bytes, vocab 256) split into
// a validation tail and per-learner training shards, and a sampler of random
// (B, T) batches that depends only on (seed, step), so a resumed run sees the
// same batches.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "daemon/util/status.h"

namespace diloco {

struct CorpusOptions {
  double val_fraction = 0.1;  // last fraction of the bytes held out; 0 = no validation part
  int block_size = 64;        // T; the validation part and every shard need T + 1 bytes
  int learner = 0;            // this learner's shard, in [0, num_learners)
  int num_learners = 1;       // the training part is cut into this many contiguous shards
};

// The whole corpus in memory, laid out as
//   [ shard 0 | shard 1 | ... | shard M-1 | validation ]
// with shard i = training bytes [i*N/M, (i+1)*N/M) for N training bytes.
//
// A path is one text file or a directory. A directory contributes every
// regular file under it (symlinked files too, each file once), in path order,
// skipping hidden names (leading '.', files and directories) and files that
// look binary (a NUL byte in their first 8 KiB; counted in files_skipped()).
class Corpus {
 public:
  static Status Load(const std::string& path, const CorpusOptions& options,
                     std::unique_ptr<Corpus>* out);

  std::span<const uint8_t> train() const { return train_; }  // this learner's shard
  std::span<const uint8_t> val() const { return val_; }      // same for every learner
  size_t total_bytes() const { return bytes_.size(); }
  int files_read() const { return files_read_; }
  int files_skipped() const { return files_skipped_; }

 private:
  Corpus() = default;

  std::vector<uint8_t> bytes_;
  std::span<const uint8_t> train_, val_;
  int files_read_ = 0;
  int files_skipped_ = 0;
};

// Random windows of T+1 tokens from data: inputs = window[0, T), targets =
// window[1, T+1). Window starts are uniform over [0, size - T - 1]. Give each
// learner its own seed (e.g. mix_seed(run_seed, learner)).
class BatchSampler {
 public:
  // data must hold at least block_size + 1 bytes and outlive the sampler.
  BatchSampler(std::span<const uint8_t> data, int batch_size, int block_size, uint64_t seed);

  // Fills inputs and targets, each (B, T) row-major. The same (seed, step)
  // always gives the same batch, whatever was sampled before.
  void Sample(long step, int* inputs, int* targets) const;

  int batch_size() const { return batch_size_; }
  int block_size() const { return block_size_; }

 private:
  std::span<const uint8_t> data_;
  int batch_size_;
  int block_size_;
  uint64_t seed_;
};

}  // namespace diloco
