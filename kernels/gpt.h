// GPT-2 style language model on the CPU engine: token + position embedding,
// n_layer pre-LayerNorm blocks (causal self-attention, 4x GELU MLP), final
// LayerNorm, LM head tied to the token embedding, mean cross-entropy loss.
// Shapes: shapes.h.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/tensor_table.h"

namespace diloco {

struct GptConfig {
  int vocab_size = 256;  // byte-level tokens
  int block_size = 64;   // max sequence length T
  int n_layer = 4;
  int n_embd = 128;      // C
  int n_head = 4;        // NH; must divide n_embd
};

// The parameter layout: wte, wpe, then each block's tensors together (so a
// block is one contiguous range), then ln_f. Names follow nanoGPT.
TensorTable gpt_tensor_table(const GptConfig& config);

// Whether AdamW decays this tensor: 2-D weights only (matrices and
// embeddings), never biases or LayerNorm parameters.
bool gpt_tensor_decays(const TensorInfo& tensor);

// GPT-2 init of a flat parameter buffer in gpt_tensor_table(config) layout
// (what Gpt::init_weights does; backends without a host Gpt use it).
void gpt_init_params(const GptConfig& config, uint64_t seed, float* params);

struct GptOptions {
  // Block-level activation recompute: forward keeps each block's input only, and backward runs
  // the block's forward again into one block's scratch before its backward. Gradients are
  // bitwise those of the stored-activation path.
  bool recompute = false;
  // Whether the Gpt allocates its own gradient buffer, grads(). A backend that only ever calls
  // backward(sink) (sharded gradients) sets false to save num_params() floats; grads() is then
  // null and backward() without a sink fails.
  bool keep_grads = true;
  // The floats params() and grads() hold, if more than num_params(): the tail past the table
  // stays zero (a sharded ring's padded buffers, kernels/shard.h).
  size_t buffer_floats = 0;
};

// Where backward() puts gradients when the caller takes them bucket by bucket (ZeRO-2, a ring
// that reduce-scatters a bucket as soon as the backward has finished it). Buckets are ranges of
// the parameter table, in the order backward finishes them: ln_f, block L-1, ..., block 0, then
// wte + wpe (the token embedding gets gradient at the start and at the end of backward, so its
// bucket is open throughout).
class GradSink {
 public:
  virtual ~GradSink() = default;
  // A zeroed buffer of range.count floats for the gradients of `range` (table offsets), which
  // backward adds to until Close(range).
  virtual float* Open(size_t offset, size_t count) = 0;
  // backward is done with the range: its gradients are final.
  virtual void Close(size_t offset, size_t count) = 0;
};

class Gpt {
 public:
  // Allocates parameters, gradients and activations for batches of up to
  // max_batch sequences of up to block_size tokens.
  Gpt(const GptConfig& config, int max_batch, const GptOptions& options = {});

  const GptConfig& config() const { return config_; }
  const TensorTable& table() const { return table_; }
  size_t num_params() const { return table_.total_numel(); }
  float* params() { return params_.data(); }
  const float* params() const { return params_.data(); }
  // Null when GptOptions::keep_grads is false.
  float* grads() { return grads_.empty() ? nullptr : grads_.data(); }
  const float* grads() const { return grads_.empty() ? nullptr : grads_.data(); }

  // GPT-2 init: weights N(0, 0.02), residual projections (attn.c_proj,
  // mlp.c_proj) N(0, 0.02/sqrt(2 n_layer)), biases 0, LayerNorm weight 1.
  void init_weights(uint64_t seed);

  // Runs the model on inputs (B,T). With targets (B,T) returns the mean
  // cross-entropy loss and keeps what backward() needs; without, returns 0
  // and logits() holds the logits of every position.
  double forward(const int* inputs, const int* targets, int B, int T);
  // (B,T,V) logits of the last forward() without targets.
  const float* logits() const { return acts_.logits; }

  // Zeroes grads() (nothing to do without keep_grads).
  void zero_grad();
  // ADDS the gradient of the last forward()'s mean loss to grads(); with a sink, writes it
  // bucket by bucket into the sink's buffers instead and leaves grads() as it was. Either way
  // the gradients are bitwise the same (same kernels adding into zeroed memory).
  void backward(GradSink* sink = nullptr);

  // Bytes held for activations and their gradients (the memory that scales
  // with batch size), for memory reports.
  size_t activation_bytes() const { return act_buffer_.size() * sizeof(float); }

 private:
  struct Activations {
    float* encoded;                   // (B,T,C)
    // Per-layer slots: L of each, or with recompute one (slot 0, scratch shared by all blocks).
    float *ln1, *ln1_mean, *ln1_rstd;
    float *qkv, *atty, *att, *attproj, *residual2;
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fch, *fch_gelu, *fcproj;
    float* residual3;  // L slots always: block l's output is block l+1's saved input
    float *lnf, *lnf_mean, *lnf_rstd;  // (B,T,C), (B,T), (B,T)
    float* logits;                    // (B,T,V); probabilities after a loss
    float* losses;                    // (B,T)
    // Gradient scratch, reused by every layer in backward.
    float *dresidual, *dln, *dqkv, *datty, *dfch, *dfch_gelu;
  };
  // Per-layer views of the parameter or gradient buffer.
  struct LayerParams {
    float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
  };
  // Block l's tensors in a buffer that holds the whole table.
  LayerParams layer(float* base, int l) const;
  // Block l's tensors in a buffer that holds only block l (a sink's bucket).
  LayerParams layer_in_block(float* block, int l) const;
  float* tensor(float* base, const char* name) const;
  // A contiguous range of the parameter table: a gradient bucket.
  struct Range {
    size_t offset, count;
  };
  Range embedding_range() const;  // wte then wpe
  Range block_range(int l) const;
  Range lnf_range() const;
  // Runs block l on `residual` (B,T,C) into activation slot `slot` and a.residual3 + l*(B,T,C).
  void block_forward(int l, int slot, const float* residual, int B, int T);

  GptConfig config_;
  int max_batch_;
  GptOptions options_;
  TensorTable table_;
  std::vector<float> params_, grads_, act_buffer_;
  Activations acts_{};
  // State of the last forward with targets.
  std::vector<int> inputs_, targets_;
  int B_ = 0, T_ = 0;
  bool have_loss_ = false;
};

}  // namespace diloco
