#include "daemon/export/model_source.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "daemon/sync/fragments.h"
#include "daemon/sync/global_state.h"
#include "daemon/train/checkpoint.h"
#include "daemon/train/run_dir.h"
#include "daemon/train/trainer.h"
#include "daemon/util/atomic_file.h"

namespace diloco {
namespace {
namespace fs = std::filesystem;

std::string ShapeText(const GptConfig& g) {
  return "{vocab_size " + std::to_string(g.vocab_size) + ", block_size " + std::to_string(g.block_size) +
         ", n_layer " + std::to_string(g.n_layer) + ", n_embd " + std::to_string(g.n_embd) + ", n_head " +
         std::to_string(g.n_head) + "}";
}

bool SameShape(const GptConfig& a, const GptConfig& b) {
  return a.vocab_size == b.vocab_size && a.block_size == b.block_size && a.n_layer == b.n_layer &&
         a.n_embd == b.n_embd && a.n_head == b.n_head;
}

std::string DefaultJobId(const fs::path& dir) {
  fs::path p = dir.lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // trailing slash
  if (p.filename() == "run" && p.has_parent_path()) return p.parent_path().filename().string();
  return p.filename().string();
}

// Learners that never merge: a single learner and ddp.
bool NeverMerges(const RunConfig& c) { return c.sync.learners <= 1 || c.sync.mode == SyncMode::kDdp; }

// The "steps" of the last summary event in dir/metrics.jsonl, if any.
std::optional<uint64_t> SummarySteps(const fs::path& dir) {
  std::ifstream in(dir / "metrics.jsonl");
  std::optional<uint64_t> steps;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"summary\"") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("event", "") == "summary" && j.contains("steps") && j["steps"].is_number_unsigned())
      steps = j["steps"].get<uint64_t>();
  }
  return steps;
}

// The sum of every learner's learner-<i>.step when all of them are here (a local run; on a daemon
// site only its own learners' are).
std::optional<uint64_t> LearnerStepsSum(const fs::path& dir, int learners) {
  uint64_t sum = 0;
  for (int i = 0; i < learners; i++) {
    if (!fs::exists(LearnerStepPath(dir.string(), i))) return std::nullopt;
    long step = 0;
    if (!ReadLearnerStep(dir.string(), i, &step).ok()) return std::nullopt;
    sum += (uint64_t)step;
  }
  return sum;
}

Status ParseConfig(const std::string& yaml, const std::string& name, const fs::path& base_dir, RunConfig* cfg) {
  return ParseRunConfig(yaml, name, base_dir.string(), {}, cfg);
}

Status OpenCheckpointFile(const fs::path& path, ModelSource* s) {
  Checkpoint ckpt;
  DL_RETURN_IF_ERROR(LoadCheckpoint(path.string(), &ckpt));
  const fs::path dir = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  DL_RETURN_IF_ERROR(ParseConfig(ckpt.config_yaml, path.string() + " (its run config)", dir, &s->config)
                         .WithContext("checkpoint '" + path.string() + "'"));
  if (!SameShape(GptConfigOf(s->config.model), ckpt.model))
    return Status::Error("checkpoint '" + path.string() + "' holds model " + ShapeText(ckpt.model) +
                         " but its run config says " + ShapeText(GptConfigOf(s->config.model)) + ": the file is inconsistent");
  s->model = ckpt.model;
  s->params = std::move(ckpt.params);
  s->params_path = path.string();
  // The syncer saves the merged model as a checkpoint (no AdamW state, step = merges) beside its
  // global_state.bin; a trainer's checkpoint counts training steps.
  const bool merged = fs::exists(dir / "global_state.bin") || (ckpt.step > 0 && ckpt.optimizer.step == 0);
  if (merged) {
    s->params_kind = "merged_checkpoint";
    s->merges = (uint64_t)ckpt.step;
    s->training_steps = SummarySteps(dir);
    if (!s->training_steps) s->training_steps = LearnerStepsSum(dir, s->config.sync.learners);
  } else {
    s->params_kind = "checkpoint";
    const bool ddp = s->config.sync.mode == SyncMode::kDdp && s->config.sync.learners > 1;
    s->training_steps = (uint64_t)ckpt.step * (ddp ? (uint64_t)s->config.sync.learners : 1);
    if (NeverMerges(s->config)) s->merges = 0;
  }
  return Status::Ok();
}

Status OpenGlobalState(const fs::path& path, ModelSource* s) {
  const TensorTable table = gpt_tensor_table(s->model);
  GlobalState state;
  DL_RETURN_IF_ERROR(LoadGlobalState(path.string(), &state));
  std::vector<Fragment> fragments;
  DL_RETURN_IF_ERROR(PartitionFragments(table, (int)state.fragments.size(), &fragments)
                         .WithContext("global state '" + path.string() + "' has " +
                                      std::to_string(state.fragments.size()) + " fragments, which this model cannot have"));
  DL_RETURN_IF_ERROR(CheckGlobalStateFits(state, table, fragments)
                         .WithContext("global state '" + path.string() + "' does not fit the model in config.yaml"));
  s->params.assign(table.total_numel(), 0.0f);
  for (size_t p = 0; p < fragments.size(); p++) {
    ScatterFragment(fragments[p], state.fragments[p].theta.data(), s->params.data());
    s->versions.push_back(state.fragments[p].version);
  }
  s->params_path = path.string();
  s->params_kind = "global_state";
  s->merges = state.merges;
  return Status::Ok();
}

Status OpenRunDir(const fs::path& dir, ModelSource* s) {
  const fs::path config_path = dir / "config.yaml";
  std::error_code ec;
  if (!fs::exists(config_path, ec))
    return Status::Error("run directory '" + dir.string() +
                         "' has no config.yaml, so the model's shape and corpus are unknown: pass the run directory "
                         "that `dilococtl train --out` or a job's run/ is, or a checkpoint file");
  std::string yaml;
  DL_RETURN_IF_ERROR(ReadWholeFile(config_path.string(), "run config", &yaml));
  DL_RETURN_IF_ERROR(ParseConfig(yaml, config_path.string(), dir, &s->config));
  s->model = GptConfigOf(s->config.model);

  const fs::path global = dir / "global_state.bin";
  const fs::path checkpoint = dir / "checkpoint.bin";
  if (fs::exists(global, ec)) {
    DL_RETURN_IF_ERROR(OpenGlobalState(global, s));
  } else if (fs::exists(checkpoint, ec)) {
    ModelSource from_ckpt;
    DL_RETURN_IF_ERROR(OpenCheckpointFile(checkpoint, &from_ckpt));
    if (!SameShape(from_ckpt.model, s->model))
      return Status::Error("checkpoint '" + checkpoint.string() + "' holds model " + ShapeText(from_ckpt.model) +
                           " but config.yaml says " + ShapeText(s->model) + ": the run directory is inconsistent");
    s->params = std::move(from_ckpt.params);
    s->params_path = from_ckpt.params_path;
    s->params_kind = from_ckpt.params_kind;
    s->training_steps = from_ckpt.training_steps;
    s->merges = from_ckpt.merges;
  } else {
    std::string hint = "export on the site that hosts the job's syncer, or wait for the first checkpoint";
    if (fs::exists(LearnerCheckpointPath(dir.string(), 0), ec))
      hint = "this is a learner's directory; its own copy is " + LearnerCheckpointPath(dir.string(), 0) +
             " (pass that file), the merged model is on the syncer's site";
    return Status::Error("run directory '" + dir.string() +
                         "' has neither global_state.bin (a syncer's merged model) nor checkpoint.bin (a `dilococtl "
                         "train` run): " + hint);
  }
  if (std::optional<uint64_t> steps = SummarySteps(dir)) s->training_steps = steps;
  if (!s->training_steps && s->params_kind == "global_state")
    s->training_steps = LearnerStepsSum(dir, s->config.sync.learners);
  return Status::Ok();
}

}  // namespace

std::string CountText(const std::optional<uint64_t>& n) { return n ? std::to_string(*n) : "unknown"; }

Status OpenModelSource(const std::string& path, const ModelSourceOptions& options, ModelSource* out) {
  std::error_code ec;
  const fs::path p(path);
  const fs::file_status st = fs::status(p, ec);
  ModelSource s;
  s.path = path;
  if (!fs::exists(st))
    return Status::Error("'" + path + "' does not exist: pass a checkpoint file, a run directory or a job id");
  if (fs::is_directory(st)) {
    DL_RETURN_IF_ERROR(OpenRunDir(p, &s));
    s.job_id = DefaultJobId(p);
  } else if (fs::is_regular_file(st)) {
    DL_RETURN_IF_ERROR(OpenCheckpointFile(p, &s));
    s.job_id = DefaultJobId(p.parent_path().empty() ? fs::current_path(ec) : p.parent_path());
  } else {
    return Status::Error("'" + path + "' is neither a regular file nor a directory: pass a checkpoint file or a run directory");
  }
  if (!options.job_id.empty()) s.job_id = options.job_id;
  if (!s.training_steps && options.training_steps_hint) s.training_steps = options.training_steps_hint;
  *out = std::move(s);
  return Status::Ok();
}

}  // namespace diloco
