#include "daemon/export/export_run.h"

#include <cstdio>
#include <filesystem>

#include "daemon/export/safetensors.h"
#include "daemon/util/atomic_file.h"

#ifndef DILOCO_VERSION
#define DILOCO_VERSION "unknown"
#endif

namespace diloco {
namespace {
namespace fs = std::filesystem;

// The block weights hf-gpt2 writes transposed (Conv1D).
bool IsConv1DWeight(const std::string& engine_name) {
  for (const char* suffix : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    const std::string s = suffix;
    if (engine_name.size() > s.size() && engine_name.compare(engine_name.size() - s.size(), s.size(), s) == 0)
      return engine_name.rfind("h.", 0) == 0;
  }
  return false;
}

std::string ExportName(const std::string& engine_name) {
  if (engine_name == "wte" || engine_name == "wpe") return "transformer." + engine_name + ".weight";
  return "transformer." + engine_name;
}

std::string JoinVersions(const std::vector<uint64_t>& versions, const char* sep) {
  std::string s;
  for (size_t i = 0; i < versions.size(); i++) s += (i ? sep : "") + std::to_string(versions[i]);
  return s;
}

nlohmann::json CountJson(const std::optional<uint64_t>& n) { return n ? nlohmann::json(*n) : nlohmann::json(); }

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

const char* ToString(ExportLayout layout) { return layout == ExportLayout::kHfGpt2 ? "hf-gpt2" : "nanogpt"; }

bool ParseExportLayout(const std::string& text, ExportLayout* out) {
  if (text == "nanogpt") *out = ExportLayout::kNanoGpt;
  else if (text == "hf-gpt2") *out = ExportLayout::kHfGpt2;
  else return false;
  return true;
}

const char* DilocodVersion() { return DILOCO_VERSION; }

TensorTable ExportTensorTable(const GptConfig& model, ExportLayout layout) {
  TensorTable out;
  const TensorTable engine = gpt_tensor_table(model);  // kept alive: the loop reads its tensors
  for (const TensorInfo& t : engine.tensors()) {
    std::vector<int> shape = t.shape;
    if (layout == ExportLayout::kHfGpt2 && IsConv1DWeight(t.name)) std::swap(shape[0], shape[1]);
    out.add(ExportName(t.name), shape);
  }
  out.add("lm_head.weight", {model.vocab_size, model.n_embd});
  return out;
}

std::vector<float> ToExportLayout(const GptConfig& model, const float* params, ExportLayout layout) {
  const TensorTable engine = gpt_tensor_table(model);
  const TensorTable table = ExportTensorTable(model, layout);
  std::vector<float> out(table.total_numel());
  for (const TensorInfo& t : engine.tensors()) {
    const TensorInfo* e = table.find(ExportName(t.name));
    const float* src = params + t.offset;
    float* dst = out.data() + e->offset;
    if (layout == ExportLayout::kHfGpt2 && IsConv1DWeight(t.name)) {
      const int rows = t.shape[0], cols = t.shape[1];  // [out, in] -> [in, out]
      for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) dst[(size_t)c * rows + r] = src[(size_t)r * cols + c];
    } else {
      std::copy_n(src, t.numel, dst);
    }
  }
  const TensorInfo* wte = engine.find("wte");
  std::copy_n(params + wte->offset, wte->numel, out.data() + table.find("lm_head.weight")->offset);
  return out;
}

std::map<std::string, std::string> ExportMetadata(const ModelSource& s, ExportLayout layout) {
  const GptConfig& g = s.model;
  std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"n_layer", std::to_string(g.n_layer)},
      {"n_head", std::to_string(g.n_head)},
      {"n_embd", std::to_string(g.n_embd)},
      {"block_size", std::to_string(g.block_size)},
      {"vocab_size", std::to_string(g.vocab_size)},
      {"layer_norm_eps", "1e-05"},  // kernels/layernorm.h
      {"activation", "gelu_tanh"},  // kernels/gelu.h: the tanh approximation
      {"bias", "true"},
      {"tied_head", "true"},
      {"layout", ToString(layout)},
      {"training_steps", CountText(s.training_steps)},
      {"merges", CountText(s.merges)},
      {"job", s.job_id},
      {"source", s.params_kind},
      {"data_format", s.config.data.format == DataFormat::kBytes ? "bytes" : "tokens"},
      {"producer", "dilocod"},
      {"version", DilocodVersion()}};
  if (!s.versions.empty()) meta["versions"] = JoinVersions(s.versions, ",");
  return meta;
}

nlohmann::json HfGpt2ConfigJson(const ModelSource& s) {
  const GptConfig& g = s.model;
  // A byte vocabulary has no special tokens: 0 (NUL) never occurs in a text corpus (files with
  // a NUL byte are skipped), so it stands for both. GPT-2's own vocabulary: <|endoftext|>.
  const int special = s.config.data.format == DataFormat::kTokens && g.vocab_size >= 50257 ? 50256 : 0;
  nlohmann::ordered_json j = {{"architectures", {"GPT2LMHeadModel"}},
                              {"model_type", "gpt2"},
                              {"vocab_size", g.vocab_size},
                              {"n_positions", g.block_size},
                              {"n_ctx", g.block_size},
                              {"n_embd", g.n_embd},
                              {"n_layer", g.n_layer},
                              {"n_head", g.n_head},
                              {"n_inner", nullptr},
                              {"activation_function", "gelu_new"},
                              {"layer_norm_epsilon", 1e-5},
                              {"resid_pdrop", 0.0},
                              {"embd_pdrop", 0.0},
                              {"attn_pdrop", 0.0},
                              {"initializer_range", 0.02},
                              {"scale_attn_weights", true},
                              {"tie_word_embeddings", true},
                              {"bos_token_id", special},
                              {"eos_token_id", special},
                              {"torch_dtype", "float32"}};
  return j;
}

void ExportPaths(const std::string& out, ExportLayout layout, std::string* model_path, std::string* config_path) {
  if (layout == ExportLayout::kNanoGpt) {
    *model_path = out;
    config_path->clear();
    return;
  }
  if (EndsWith(out, ".safetensors")) {
    *model_path = out;
    const fs::path parent = fs::path(out).parent_path();
    *config_path = (parent.empty() ? fs::path("config.json") : parent / "config.json").string();
  } else {
    *model_path = (fs::path(out) / "model.safetensors").string();
    *config_path = (fs::path(out) / "config.json").string();
  }
}

nlohmann::json ExportSummaryObject(const ExportSummary& s) {
  nlohmann::json j = {{"out", s.out_path},
                      {"layout", s.layout},
                      {"job", s.job_id},
                      {"source", s.source},
                      {"source_kind", s.source_kind},
                      {"tensors", s.tensors},
                      {"num_params", s.num_params},
                      {"file_bytes", s.file_bytes},
                      {"training_steps", CountJson(s.training_steps)},
                      {"merges", CountJson(s.merges)}};
  if (!s.config_path.empty()) j["config"] = s.config_path;
  if (!s.versions.empty()) j["versions"] = s.versions;
  return j;
}

std::string ExportSummaryLine(const ExportSummary& s) {
  std::string from = s.source_kind + ", " + CountText(s.training_steps) + " training steps, " + CountText(s.merges) +
                     " merges";
  if (!s.versions.empty()) from += ", versions " + JoinVersions(s.versions, "/");
  char sizes[96];
  std::snprintf(sizes, sizeof(sizes), "%d tensors, %.2f M parameters, %.1f MB", s.tensors, s.num_params / 1e6,
                s.file_bytes / 1e6);
  std::string line = "exported job " + s.job_id + " (" + from + ") as " + s.layout + ": " + sizes + " -> " + s.out_path;
  if (!s.config_path.empty()) line += " + " + s.config_path;
  return line;
}

Status ExportModel(const ModelSource& source, const std::string& out, ExportLayout layout, ExportSummary* summary) {
  if (out.empty()) return Status::Error("no output path: pass -o FILE");
  std::string model_path, config_path;
  ExportPaths(out, layout, &model_path, &config_path);
  std::error_code ec;
  const fs::path dir = fs::path(model_path).parent_path();
  if (!dir.empty()) {
    fs::create_directories(dir, ec);
    if (ec) return Status::Error("cannot create directory '" + dir.string() + "' for the export: " + ec.message());
  }
  const TensorTable table = ExportTensorTable(source.model, layout);
  const std::vector<float> data = ToExportLayout(source.model, source.params.data(), layout);
  DL_RETURN_IF_ERROR(WriteSafetensors(model_path, table, data.data(), ExportMetadata(source, layout)));
  if (!config_path.empty()) {
    const std::string text = HfGpt2ConfigJson(source).dump(2) + "\n";
    DL_RETURN_IF_ERROR(WriteFileAtomically(config_path, {{text.data(), text.size()}}, "Hugging Face config"));
  }

  // Read back what was written: the caller gets an error, not a bad file.
  SafetensorsIndex index;
  DL_RETURN_IF_ERROR(ReadSafetensorsIndex(model_path, &index));
  DL_RETURN_IF_ERROR(CheckSafetensorsMatchesTable(index, table).WithContext("exported '" + model_path + "'"));
  ExportSummary s;
  s.source = source.params_path;
  s.source_kind = source.params_kind;
  s.layout = ToString(layout);
  s.out_path = model_path;
  s.config_path = config_path;
  s.job_id = source.job_id;
  s.tensors = (int)index.entries.size();
  s.num_params = source.params.size();
  s.file_bytes = index.file_bytes;
  s.training_steps = source.training_steps;
  s.merges = source.merges;
  s.versions = source.versions;
  *summary = std::move(s);
  return Status::Ok();
}

Status ExportRunDir(const std::string& path, const std::string& out, const ExportOptions& options,
                    ExportSummary* summary) {
  ModelSourceOptions so;
  so.job_id = options.job_id;
  ModelSource source;
  DL_RETURN_IF_ERROR(OpenModelSource(path, so, &source));
  return ExportModel(source, out, options.layout, summary);
}

}  // namespace diloco
