#include "daemon/export/export_run.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "daemon/config/run_config.h"
#include "daemon/export/safetensors.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/global_state.h"
#include "daemon/train/checkpoint.h"
#include "daemon/train/trainer.h"
#include "daemon/util/atomic_file.h"
#include "kernels/gpt.h"

namespace diloco {
namespace {
namespace fs = std::filesystem;

std::string ModelConfigJson(const GptConfig& g) {
  nlohmann::ordered_json j = {{"vocab_size", g.vocab_size}, {"block_size", g.block_size},
                              {"n_layer", g.n_layer},       {"n_embd", g.n_embd},
                              {"n_head", g.n_head}};
  return j.dump();
}

std::string DefaultJobId(const std::string& run_dir) {
  fs::path p = fs::path(run_dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // trailing slash
  if (p.filename() == "run" && p.has_parent_path()) return p.parent_path().filename().string();
  return p.filename().string();
}

// The flat parameters of the merged model: every fragment's Θ scattered
// back into table layout.
Status ParamsFromGlobalState(const std::string& path, const TensorTable& table, std::vector<float>* params,
                             ExportSummary* s) {
  GlobalState state;
  DL_RETURN_IF_ERROR(LoadGlobalState(path, &state));
  std::vector<Fragment> fragments;
  DL_RETURN_IF_ERROR(PartitionFragments(table, (int)state.fragments.size(), &fragments)
                         .WithContext("global state '" + path + "' has " + std::to_string(state.fragments.size()) +
                                      " fragments, which this model cannot have"));
  DL_RETURN_IF_ERROR(CheckGlobalStateFits(state, table, fragments)
                         .WithContext("global state '" + path + "' does not fit the model in config.yaml"));
  params->assign(table.total_numel(), 0.0f);
  for (size_t p = 0; p < fragments.size(); p++) {
    ScatterFragment(fragments[p], state.fragments[p].theta.data(), params->data());
    s->versions.push_back(state.fragments[p].version);
  }
  s->step = state.merges;
  return Status::Ok();
}

Status ParamsFromCheckpoint(const std::string& path, const GptConfig& model, std::vector<float>* params,
                            ExportSummary* s) {
  Checkpoint ckpt;
  DL_RETURN_IF_ERROR(LoadCheckpoint(path, &ckpt));
  const GptConfig& c = ckpt.model;
  if (c.vocab_size != model.vocab_size || c.block_size != model.block_size || c.n_layer != model.n_layer ||
      c.n_embd != model.n_embd || c.n_head != model.n_head)
    return Status::Error("checkpoint '" + path + "' holds model " + ModelConfigJson(c) + " but config.yaml says " +
                         ModelConfigJson(model) + ": the run directory is inconsistent");
  *params = std::move(ckpt.params);
  s->step = (uint64_t)ckpt.step;
  return Status::Ok();
}

}  // namespace

nlohmann::json ExportSummaryObject(const ExportSummary& s) {
  nlohmann::json j = {{"out", s.out_path},         {"job", s.job_id},         {"source", s.source},
                      {"source_kind", s.source_kind}, {"tensors", s.tensors}, {"num_params", s.num_params},
                      {"file_bytes", s.file_bytes}, {"step", s.step}};
  if (!s.versions.empty()) j["versions"] = s.versions;
  return j;
}

std::string ExportSummaryLine(const ExportSummary& s) {
  std::string from = s.source_kind;
  if (s.source_kind == "global_state") {
    from += ", " + std::to_string(s.step) + " merges, versions ";
    for (size_t i = 0; i < s.versions.size(); i++) from += (i ? "/" : "") + std::to_string(s.versions[i]);
  } else {
    from += ", step " + std::to_string(s.step);
  }
  char sizes[96];
  std::snprintf(sizes, sizeof(sizes), "%d tensors, %.2f M parameters, %.1f MB", s.tensors, s.num_params / 1e6,
                s.file_bytes / 1e6);
  return "exported job " + s.job_id + " (" + from + "): " + sizes + " -> " + s.out_path;
}

Status ExportRunDir(const std::string& run_dir, const std::string& out_path, const ExportOptions& options,
                    ExportSummary* out) {
  const fs::path dir(run_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return Status::Error("run directory '" + run_dir + "' does not exist: check the path (dilococtl status shows it)");
  const std::string config_path = (dir / "config.yaml").string();
  std::string config_yaml;
  DL_RETURN_IF_ERROR(ReadWholeFile(config_path, "run config", &config_yaml));
  RunConfig cfg;
  DL_RETURN_IF_ERROR(ParseRunConfig(config_yaml, config_path, run_dir, {}, &cfg));
  const GptConfig model = GptConfigOf(cfg.model);
  const TensorTable table = gpt_tensor_table(model);

  ExportSummary s;
  std::vector<float> params;
  const fs::path global = dir / "global_state.bin";
  const fs::path checkpoint = dir / "checkpoint.bin";
  if (fs::exists(global, ec)) {
    s.source = global.string();
    s.source_kind = "global_state";
    DL_RETURN_IF_ERROR(ParamsFromGlobalState(s.source, table, &params, &s));
  } else if (fs::exists(checkpoint, ec)) {
    s.source = checkpoint.string();
    s.source_kind = "checkpoint";
    DL_RETURN_IF_ERROR(ParamsFromCheckpoint(s.source, model, &params, &s));
  } else {
    return Status::Error("run directory '" + run_dir +
                         "' has neither global_state.bin nor checkpoint.bin: export on the site that hosts the "
                         "job's syncer, or wait for the first checkpoint");
  }

  s.job_id = options.job_id.empty() ? DefaultJobId(run_dir) : options.job_id;
  std::map<std::string, std::string> meta = {
      {"format", "pt"},           {"model_config", ModelConfigJson(model)}, {"job", s.job_id},
      {"source", s.source_kind},  {"step", std::to_string(s.step)},         {"run_config", config_yaml},
      {"producer", "dilocod"}};
  if (!s.versions.empty()) meta["versions"] = nlohmann::json(s.versions).dump();
  DL_RETURN_IF_ERROR(WriteSafetensors(out_path, table, params.data(), meta));

  // Read back what was written: the caller gets an error, not a bad file.
  SafetensorsIndex index;
  DL_RETURN_IF_ERROR(ReadSafetensorsIndex(out_path, &index));
  DL_RETURN_IF_ERROR(CheckSafetensorsMatchesTable(index, table).WithContext("exported '" + out_path + "'"));
  s.out_path = out_path;
  s.tensors = (int)index.entries.size();
  s.num_params = table.total_numel();
  s.file_bytes = index.file_bytes;
  *out = std::move(s);
  return Status::Ok();
}

}  // namespace diloco
