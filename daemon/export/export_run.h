// Exports a run's model as a safetensors file (safetensors.h), for
// `dilococtl export JOB --format safetensors -o FILE` and the daemon.
//
// The parameters come from the run directory: the syncer's global_state.bin
// (the merged model Θ, on the site that hosts the syncer) when present,
// otherwise a learner's checkpoint.bin (single-learner runs). The model's
// shape comes from the run's config.yaml (and, for a checkpoint, its own
// header, which must agree).
//
// Tensor names are the engine's (kernels/gpt.cpp, nanoGPT's names without
// the "transformer." prefix), in this order, all F32:
//   wte                      [vocab_size, C]   token embedding; also the LM head (tied)
//   wpe                      [block_size, C]   position embedding
//   h.<i>.ln_1.weight        [C]               for each block i = 0 .. n_layer-1:
//   h.<i>.ln_1.bias          [C]
//   h.<i>.attn.c_attn.weight [3C, C]           q, k, v stacked along the first axis
//   h.<i>.attn.c_attn.bias   [3C]
//   h.<i>.attn.c_proj.weight [C, C]
//   h.<i>.attn.c_proj.bias   [C]
//   h.<i>.ln_2.weight        [C]
//   h.<i>.ln_2.bias          [C]
//   h.<i>.mlp.c_fc.weight    [4C, C]
//   h.<i>.mlp.c_fc.bias      [4C]
//   h.<i>.mlp.c_proj.weight  [C, 4C]
//   h.<i>.mlp.c_proj.bias    [C]
//   ln_f.weight              [C]
//   ln_f.bias                [C]
// Weights are [out_features, in_features] like torch.nn.Linear (nanoGPT):
// load into nanoGPT with key "transformer." + name (wte/wpe: + ".weight")
// and lm_head.weight = wte; Hugging Face GPT-2 uses Conv1D, which wants the
// four 2-D block weights transposed. The vocabulary is bytes (256 tokens).
//
// __metadata__ (all strings, as safetensors requires):
//   format        "pt"
//   model_config  JSON: {"vocab_size", "block_size", "n_layer", "n_embd", "n_head"}
//   job           the job id
//   source        "global_state" or "checkpoint"
//   step          checkpoint: training steps; global state: merges (outer steps)
//   versions      global state: JSON array, the version of each fragment
//   run_config    the run's resolved config.yaml
//   producer      "dilocod"
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/util/status.h"

namespace diloco {

struct ExportOptions {
  // Written into __metadata__; empty: the run directory's name, or its
  // parent's when it is called "run" (dilocod's jobs/<id>/run layout).
  std::string job_id;
};

struct ExportSummary {
  std::string source;       // the file the parameters came from
  std::string source_kind;  // "global_state" or "checkpoint"
  std::string out_path;
  std::string job_id;
  int tensors = 0;
  uint64_t num_params = 0;
  uint64_t file_bytes = 0;
  uint64_t step = 0;               // see "step" above
  std::vector<uint64_t> versions;  // global state only
};

// The summary for `dilococtl export --json`: {"out", "job", "source",
// "source_kind", "tensors", "num_params", "file_bytes", "step"[, "versions"]}.
nlohmann::json ExportSummaryObject(const ExportSummary& s);
// One line for a terminal, e.g. "exported job j-1 (global_state, 12 merges,
// versions 6/6): 28 tensors, 0.1 M parameters, 0.4 MB -> model.safetensors".
std::string ExportSummaryLine(const ExportSummary& s);

// Writes out_path atomically, then reads its header back and checks it
// against the model's tensor table before returning.
Status ExportRunDir(const std::string& run_dir, const std::string& out_path, const ExportOptions& options,
                    ExportSummary* out);
inline Status ExportRunDir(const std::string& run_dir, const std::string& out_path, ExportSummary* out) {
  return ExportRunDir(run_dir, out_path, ExportOptions{}, out);
}

}  // namespace diloco
