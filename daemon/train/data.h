// Training data: a corpus of tokens split into a validation tail and per-learner training shards,
// and a sampler of random (B, T) batches that depends only on (seed, step), so a resumed run sees
// the same batches.
//
// Two formats (data.format in the run config):
//
//   bytes   Text. Every byte is a token (vocab 256). A path is one text file or a directory: a
//           directory contributes every regular file under it (symlinked files too, each file
//           once), in path order, skipping hidden names (leading '.', files and directories) and
//           files that look binary (a NUL byte in their first 8 KiB; counted in files_skipped()).
//
//   tokens  Pre-tokenized uint16 token files, as nanoGPT's and llm.c's data scripts write them.
//           Each file is one of two layouts, told apart by its first 4 bytes:
//           (a) llm.c: a header of 256 little-endian int32 (1024 bytes) with header[0] = 20240520
//               (the magic), header[1] = 1 (the version), header[2] = n (the number of tokens);
//               the other header words are ignored. Then n little-endian uint16 tokens; the file
//               is exactly 1024 + 2n bytes.
//           (b) nanoGPT (`np.array(ids, dtype=np.uint16).tofile(...)`): no header, a stream of
//               little-endian uint16 tokens; the file has an even number of bytes.
//           A file whose first 4 bytes are the magic (bytes F8 D6 34 01) is read as (a); any other
//           as (b). A raw GPT-2 file cannot start with the magic: its first token would be 55032,
//           past GPT-2's 50257 ids. Every token must be < vocab_size. A path is one file (any
//           name) or a directory: every non-hidden regular file under it whose name ends in
//           ".bin", in path order, each file once (others are counted in files_skipped()).
//           Malformed files are refused with the file, the byte offset and the reason.
//
// Either way the tokens of all files are concatenated in order and laid out as
//   [ shard 0 | shard 1 | ... | shard M-1 | validation ]
// with shard i = training tokens [i*N/M, (i+1)*N/M) for N training tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/util/status.h"

namespace diloco {

struct CorpusOptions {
  double val_fraction = 0.1;  // last fraction of the tokens held out; 0 = no validation part
  int block_size = 64;        // T; the validation part and every shard need T + 1 tokens
  int learner = 0;            // this learner's shard, in [0, num_learners)
  int num_learners = 1;       // the training part is cut into this many contiguous shards
  DataFormat format = DataFormat::kBytes;
  int vocab_size = 256;  // tokens only: every token must be below it; in [2, 65536]
};

// A read-only view of tokens stored one per byte (data.format bytes, width 1) or as uint16
// (data.format tokens, width 2). It does not own the tokens.
class TokenSpan {
 public:
  TokenSpan() = default;
  explicit TokenSpan(std::span<const uint8_t> bytes) : data_(bytes.data()), size_(bytes.size()), width_(1) {}
  explicit TokenSpan(std::span<const uint16_t> tokens) : data_(tokens.data()), size_(tokens.size()), width_(2) {}

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int width() const { return width_; }  // bytes per token: 1 or 2
  int operator[](size_t i) const {
    return width_ == 1 ? static_cast<const uint8_t*>(data_)[i] : static_cast<const uint16_t*>(data_)[i];
  }
  TokenSpan subspan(size_t offset, size_t count) const;
  // The tokens as stored; each checks the width.
  std::span<const uint8_t> bytes() const;
  std::span<const uint16_t> tokens() const;

 private:
  const void* data_ = nullptr;
  size_t size_ = 0;
  int width_ = 1;
};

// The whole corpus in memory (see the top of this file for formats and layout).
class Corpus {
 public:
  static Status Load(const std::string& path, const CorpusOptions& options, std::unique_ptr<Corpus>* out);

  // This learner's shard and the validation part (the same for every learner), as a view that
  // BatchSampler takes for either format.
  TokenSpan train_tokens() const { return train_; }
  TokenSpan val_tokens() const { return val_; }
  // The same as bytes; only for data.format bytes (a tokens corpus fails a check).
  std::span<const uint8_t> train() const { return train_.bytes(); }
  std::span<const uint8_t> val() const { return val_.bytes(); }

  DataFormat format() const { return format_; }
  size_t total_tokens() const { return format_ == DataFormat::kBytes ? bytes_.size() : tokens_.size(); }
  size_t total_bytes() const { return total_tokens() * (format_ == DataFormat::kBytes ? 1 : 2); }  // of tokens
  int files_read() const { return files_read_; }
  int files_skipped() const { return files_skipped_; }

 private:
  Corpus() = default;

  DataFormat format_ = DataFormat::kBytes;
  std::vector<uint8_t> bytes_;    // bytes format
  std::vector<uint16_t> tokens_;  // tokens format
  TokenSpan train_, val_;
  int files_read_ = 0;
  int files_skipped_ = 0;
};

// Random windows of T+1 tokens from data: inputs = window[0, T), targets = window[1, T+1).
// Window starts are uniform over [0, size - T - 1]. Give each learner its own seed (e.g.
// mix_seed(run_seed, learner)). A bytes corpus gives the same batches through either constructor.
class BatchSampler {
 public:
  // data must hold at least block_size + 1 tokens and outlive the sampler.
  BatchSampler(TokenSpan data, int batch_size, int block_size, uint64_t seed);
  BatchSampler(std::span<const uint8_t> data, int batch_size, int block_size, uint64_t seed)
      : BatchSampler(TokenSpan(data), batch_size, block_size, seed) {}

  // Fills inputs and targets, each (B, T) row-major. The same (seed, step)
  // always gives the same batch, whatever was sampled before.
  void Sample(long step, int* inputs, int* targets) const;

  // Fills rows [row_begin, row_begin + rows) of the batch Sample(step, ...) gives; inputs and
  // targets hold rows * T ints. A learner with R local ranks makes one sampler with batch_size
  // R * B and rank r takes SampleRows(step, r * B, B, ...), so its R ranks together see exactly
  // the batch one rank would at batch R * B.
  void SampleRows(long step, int row_begin, int rows, int* inputs, int* targets) const;

  int batch_size() const { return batch_size_; }
  int block_size() const { return block_size_; }

 private:
  TokenSpan data_;
  int batch_size_;
  int block_size_;
  uint64_t seed_;
};

}  // namespace diloco
