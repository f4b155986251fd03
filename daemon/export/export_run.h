// Exports a trained model (model_source.h: a checkpoint file or a run directory) as a
// safetensors file (safetensors.h) that PyTorch and Hugging Face load as they are, for
// `dilococtl export JOB|RUN_DIR|CHECKPOINT --format safetensors [--layout L] -o OUT`.
//
// Layouts (every tensor F32; C = n_embd, V = vocab_size, T = block_size; i = 0 .. n_layer-1):
//
//   nanogpt (default)  nanoGPT's GPT state_dict, so `model.load_state_dict(tensors)` works as is.
//                      Linear weights are [out_features, in_features] (the engine's own layout):
//     transformer.wte.weight               [V, C]
//     transformer.wpe.weight               [T, C]
//     transformer.h.<i>.ln_1.weight        [C]      ln_1.bias [C]
//     transformer.h.<i>.attn.c_attn.weight [3C, C]  q, k, v stacked along the first axis; bias [3C]
//     transformer.h.<i>.attn.c_proj.weight [C, C]   bias [C]
//     transformer.h.<i>.ln_2.weight        [C]      ln_2.bias [C]
//     transformer.h.<i>.mlp.c_fc.weight    [4C, C]  bias [4C]
//     transformer.h.<i>.mlp.c_proj.weight  [C, 4C]  bias [C]
//     transformer.ln_f.weight              [C]      ln_f.bias [C]
//     lm_head.weight                       [V, C]   the head is tied to wte: this is a copy of
//                                                   transformer.wte.weight (safetensors forbids
//                                                   shared storage); metadata tied_head = "true"
//     (nanoGPT's attn.bias causal-mask buffer, present only without flash attention, is not
//     a parameter and is not written: load with strict=False in that case.)
//
//   hf-gpt2            Hugging Face GPT2LMHeadModel: the same names, but the four 2-D block
//                      weights in Conv1D orientation [in_features, out_features] (y = x @ W + b):
//     transformer.h.<i>.attn.c_attn.weight [C, 3C]   attn.c_proj.weight [C, C]
//     transformer.h.<i>.mlp.c_fc.weight    [C, 4C]   mlp.c_proj.weight  [4C, C]
//                      plus config.json (HfGpt2ConfigJson): model_type gpt2, n_layer, n_head,
//                      n_embd, n_positions = n_ctx = T, vocab_size, layer_norm_epsilon 1e-5,
//                      activation_function gelu_new (the engine's GELU is the tanh form),
//                      tie_word_embeddings, architectures [GPT2LMHeadModel].
//                      Where the files go (-o OUT): OUT ending in ".safetensors" is the model file
//                      and config.json goes beside it (from_pretrained(dir) wants the name
//                      model.safetensors); any other OUT is a directory (created) that gets
//                      model.safetensors and config.json.
//
// __metadata__ (all strings, as safetensors requires; nothing needs a YAML or JSON parser):
//   format "pt", n_layer, n_head, n_embd, block_size, vocab_size, layer_norm_eps "1e-05",
//   activation "gelu_tanh", bias "true", tied_head "true", layout "nanogpt" | "hf-gpt2",
//   training_steps, merges (each a number or "unknown"; model_source.h says how they are
//   counted), job, source ("global_state", "checkpoint" or "merged_checkpoint"), versions
//   (global state: each fragment's version, comma-separated), data_format ("bytes": token i is
//   byte i; "tokens"), producer "dilocod", version (dilocod's version).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/export/model_source.h"
#include "daemon/util/status.h"
#include "kernels/gpt.h"
#include "kernels/tensor_table.h"

namespace diloco {

enum class ExportLayout { kNanoGpt, kHfGpt2 };
const char* ToString(ExportLayout layout);
bool ParseExportLayout(const std::string& text, ExportLayout* out);

// dilocod's version (CMake's project version).
const char* DilocodVersion();

struct ExportOptions {
  ExportLayout layout = ExportLayout::kNanoGpt;
  // ExportRunDir only (model_source.h): the job id to record; empty: from the path.
  std::string job_id;
};

struct ExportSummary {
  std::string source;       // the file the parameters came from
  std::string source_kind;  // "global_state", "checkpoint" or "merged_checkpoint"
  std::string layout;
  std::string out_path;     // the safetensors file
  std::string config_path;  // hf-gpt2: config.json
  std::string job_id;
  int tensors = 0;
  uint64_t num_params = 0;  // the model's parameters (the tied head counted once)
  uint64_t file_bytes = 0;
  std::optional<uint64_t> training_steps;
  std::optional<uint64_t> merges;
  std::vector<uint64_t> versions;  // global state only
};

// The summary for `dilococtl export --json`: {"out", "layout", "job", "source", "source_kind",
// "tensors", "num_params", "file_bytes", "training_steps", "merges"[, "config"][, "versions"]};
// unknown counts are null.
nlohmann::json ExportSummaryObject(const ExportSummary& s);
// One line for a terminal, e.g. "exported job j-1 (global_state, 40 training steps, 12 merges,
// versions 6/6) as nanogpt: 29 tensors, 0.10 M parameters, 0.4 MB -> model.safetensors".
std::string ExportSummaryLine(const ExportSummary& s);

// The layout's tensor names and shapes, in file order.
TensorTable ExportTensorTable(const GptConfig& model, ExportLayout layout);
// The engine's flat parameters (gpt_tensor_table order) as ExportTensorTable's flat buffer.
std::vector<float> ToExportLayout(const GptConfig& model, const float* params, ExportLayout layout);
// __metadata__ for source in layout (above).
std::map<std::string, std::string> ExportMetadata(const ModelSource& source, ExportLayout layout);
// Hugging Face's config.json for the model.
nlohmann::json HfGpt2ConfigJson(const ModelSource& source);
// Where -o OUT puts the files (above); config_path is empty for nanogpt.
void ExportPaths(const std::string& out, ExportLayout layout, std::string* model_path, std::string* config_path);

// Writes the files atomically, then reads the safetensors header back and checks it against
// ExportTensorTable before returning.
Status ExportModel(const ModelSource& source, const std::string& out, ExportLayout layout, ExportSummary* summary);
// OpenModelSource(path) then ExportModel.
Status ExportRunDir(const std::string& path, const std::string& out, const ExportOptions& options,
                    ExportSummary* summary);
inline Status ExportRunDir(const std::string& path, const std::string& out, ExportSummary* summary) {
  return ExportRunDir(path, out, ExportOptions{}, summary);
}

}  // namespace diloco
