// Export of real run directories (a single-learner checkpoint and a 2-learner
// local run's global state) to safetensors in both layouts, read back by our
// reader and, independently, by python3's json module.
#include "daemon/export/export_run.h"

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/export/safetensors.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/global_state.h"
#include "daemon/train/checkpoint.h"
#include "daemon/train/run_dir.h"
#include "daemon/train/trainer.h"
#include "daemon/util/atomic_file.h"
#include "kernels/gpt.h"
#include "tests/export/tiny_run.h"
#include "tests/temp_dir.h"
#include "tests/text_corpus.h"

namespace diloco {
namespace {
namespace fs = std::filesystem;
using diloco::testing::TempDir;

std::string WriteCorpus(const fs::path& dir) {
  return testing::WriteShuffledCorpus(dir, {"to be or not to be, that is the question.\n"}, 20000, 1);
}

TrainOptions TinyRun(const TempDir& tmp, int learners, const std::string& run) {
  TrainOptions o = testing::TinyRunOptions(tmp, learners, run);
  RunConfig& c = o.config;
  c.model = {.n_layer = 2, .n_embd = 16, .n_head = 2, .block_size = 8};
  c.data.corpus = WriteCorpus(tmp.path());
  c.train.batch_size = 2;
  c.train.steps = learners > 1 ? 12 : 3;
  c.eval.batches = 1;
  return o;
}

GptConfig ModelOf(const RunConfig& c) {
  GptConfig g;
  g.block_size = c.model.block_size;
  g.n_layer = c.model.n_layer;
  g.n_embd = c.model.n_embd;
  g.n_head = c.model.n_head;
  return g;
}

std::string ReadText(const std::string& path) {
  std::string bytes;
  REQUIRE(ReadWholeFile(path, "test file", &bytes).ok());
  return bytes;
}

// The tensor's floats as stored in the file.
std::vector<float> TensorData(const std::string& file, const SafetensorsIndex& idx, const std::string& name) {
  const SafetensorsEntry* e = idx.find(name);
  REQUIRE(e != nullptr);
  std::vector<float> v((e->end - e->begin) / sizeof(float));
  std::memcpy(v.data(), file.data() + idx.data_offset + e->begin, e->end - e->begin);
  return v;
}

// Runs python3 on a script; returns its stdout, or "" with skipped = true
// when there is no python3.
std::string RunPython(const std::string& script_path, const std::string& arg, bool* skipped) {
  *skipped = access("/usr/bin/python3", X_OK) != 0;
  if (*skipped) return "";
  const std::string cmd = "/usr/bin/python3 '" + script_path + "' '" + arg + "'";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  const int rc = pclose(p);
  INFO(out);
  REQUIRE(WIFEXITED(rc));
  REQUIRE(WEXITSTATUS(rc) == 0);
  return out;
}

// An independent reader: only json and struct from Python's standard
// library. Prints {"names", "shapes", "dtypes", "data_bytes", "sum_bytes",
// "metadata", "first": first float of each tensor}.
constexpr char kPythonReader[] = R"PY(
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    blob = f.read()
(n,) = struct.unpack("<Q", blob[:8])
assert (8 + n) % 8 == 0, "header not padded to 8"
header = json.loads(blob[8:8 + n].decode("utf-8"))
meta = header.pop("__metadata__")
items = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
data = blob[8 + n:]
pos, first = 0, []
for name, t in items:
    b, e = t["data_offsets"]
    assert b == pos, (name, b, pos)
    numel = 1
    for d in t["shape"]:
        numel *= d
    assert e - b == 4 * numel and t["dtype"] == "F32", name
    first.append(struct.unpack_from("<f", data, b)[0])
    pos = e
assert pos == len(data), (pos, len(data))
print(json.dumps({"names": [k for k, _ in items], "shapes": [t["shape"] for _, t in items],
                  "data_bytes": len(data), "metadata": meta, "first": first}))
)PY";

// Checks the file against the model and params, with our reader and python: the nanogpt layout
// (export_run.h) holds the engine's tensors under nanoGPT's names, then lm_head.weight = wte.
void CheckExport(const TempDir& tmp, const std::string& path, const GptConfig& model, const std::vector<float>& params) {
  const TensorTable engine = gpt_tensor_table(model);
  const TensorTable table = ExportTensorTable(model, ExportLayout::kNanoGpt);
  SafetensorsIndex idx;
  const Status st = ReadSafetensorsIndex(path, &idx);
  INFO(st.message());
  REQUIRE(st.ok());
  REQUIRE(CheckSafetensorsMatchesTable(idx, table).ok());
  CHECK(idx.data_offset % 8 == 0);
  CHECK(idx.file_bytes == idx.data_offset + 4 * (engine.total_numel() + 256 * model.n_embd));
  const std::map<std::string, std::string> want_meta = {
      {"format", "pt"},        {"n_layer", std::to_string(model.n_layer)}, {"n_head", std::to_string(model.n_head)},
      {"n_embd", std::to_string(model.n_embd)}, {"block_size", std::to_string(model.block_size)},
      {"vocab_size", "256"},   {"layer_norm_eps", "1e-05"}, {"activation", "gelu_tanh"}, {"bias", "true"},
      {"tied_head", "true"},   {"layout", "nanogpt"},       {"producer", "dilocod"},     {"data_format", "bytes"}};
  for (const auto& [key, value] : want_meta) {
    INFO(key);
    REQUIRE(idx.metadata.count(key) == 1);
    CHECK(idx.metadata.at(key) == value);
  }
  CHECK(idx.metadata.at("version") == DilocodVersion());
  CHECK(idx.metadata.count("model_config") == 0);  // flat keys only, no JSON or YAML inside
  CHECK(idx.metadata.count("run_config") == 0);
  // nanoGPT's names.
  CHECK(idx.entries.front().name == "transformer.wte.weight");
  CHECK(idx.entries[1].name == "transformer.wpe.weight");
  CHECK(idx.entries[2].name == "transformer.h.0.ln_1.weight");
  CHECK(idx.find("transformer.h.1.attn.c_attn.weight")->shape == std::vector<int64_t>{3 * model.n_embd, model.n_embd});
  CHECK(idx.find("transformer.h.1.mlp.c_proj.weight")->shape == std::vector<int64_t>{model.n_embd, 4 * model.n_embd});
  CHECK(idx.entries[idx.entries.size() - 2].name == "transformer.ln_f.bias");
  CHECK(idx.entries.back().name == "lm_head.weight");

  // Values equal the parameters, tensor by tensor; the head is a copy of wte.
  const std::string file = ReadText(path);
  size_t sum_bytes = 0;
  for (const TensorInfo& t : engine.tensors()) {
    const std::string name = "transformer." + t.name + (t.name == "wte" || t.name == "wpe" ? ".weight" : "");
    const std::vector<float> got = TensorData(file, idx, name);
    const std::vector<float> want(params.begin() + t.offset, params.begin() + t.offset + t.numel);
    INFO(name);
    CHECK(got == want);
    sum_bytes += got.size() * sizeof(float);
  }
  CHECK(TensorData(file, idx, "lm_head.weight") == TensorData(file, idx, "transformer.wte.weight"));
  sum_bytes += 4 * 256 * model.n_embd;
  CHECK(sum_bytes == idx.file_bytes - idx.data_offset);

  bool skipped = false;
  const std::string script = tmp.Write("read_safetensors.py", kPythonReader);
  const std::string out = RunPython(script, path, &skipped);
  if (skipped) {
    WARN("no /usr/bin/python3: the independent header check is skipped");
    return;
  }
  const auto py = nlohmann::json::parse(out);
  REQUIRE(py["names"].size() == table.tensors().size());
  for (size_t i = 0; i < table.tensors().size(); i++) {
    const TensorInfo& t = table.tensors()[i];
    CHECK(py["names"][i] == t.name);
    CHECK(py["shapes"][i] == nlohmann::json(t.shape));
  }
  CHECK(py["first"][0].get<float>() == params[engine.find("wte")->offset]);
  CHECK(py["data_bytes"] == 4 * table.total_numel());
  CHECK(py["metadata"]["format"] == "pt");
}

TEST_CASE("export: a single-learner run's checkpoint becomes a safetensors file", "[e2e]") {
  TempDir tmp;
  const TrainOptions o = TinyRun(tmp, 1, "jobs/j-ckpt/run");
  TrainSummary ts;
  REQUIRE(RunTraining(o, &ts).ok());
  Checkpoint ckpt;
  REQUIRE(LoadCheckpoint(o.run_dir + "/checkpoint.bin", &ckpt).ok());

  const std::string out = tmp.file("model.safetensors");
  ExportSummary s;
  const Status st = ExportRunDir(o.run_dir, out, &s);
  INFO(st.message());
  REQUIRE(st.ok());
  CHECK(s.source_kind == "checkpoint");
  CHECK(s.source == o.run_dir + "/checkpoint.bin");
  CHECK(s.job_id == "j-ckpt");  // jobs/<id>/run
  CHECK(s.layout == "nanogpt");
  CHECK_THAT(ExportSummaryLine(s),
             Catch::Contains("(checkpoint, 3 training steps, 0 merges) as nanogpt: 29 tensors"));
  CHECK_FALSE(ExportSummaryObject(s).contains("versions"));
  CHECK(s.training_steps == 3u);
  CHECK(s.merges == 0u);  // a single learner never merges
  CHECK(s.num_params == ckpt.params.size());
  CHECK(s.tensors == 4 + 12 * 2 + 1);
  CHECK(s.file_bytes == fs::file_size(out));
  CHECK_FALSE(fs::exists(out + ".tmp"));
  CheckExport(tmp, out, ModelOf(o.config), ckpt.params);

  SafetensorsIndex idx;
  REQUIRE(ReadSafetensorsIndex(out, &idx).ok());
  CHECK(idx.metadata.at("job") == "j-ckpt");
  CHECK(idx.metadata.at("source") == "checkpoint");
  CHECK(idx.metadata.at("training_steps") == "3");
  CHECK(idx.metadata.at("merges") == "0");
  CHECK(idx.metadata.count("versions") == 0);

  // The checkpoint file itself exports the same tensors.
  const std::string out2 = tmp.file("from_ckpt.safetensors");
  REQUIRE(ExportRunDir(o.run_dir + "/checkpoint.bin", out2, &s).ok());
  CHECK(ReadText(out2) == ReadText(out));

  ExportOptions eo;
  eo.job_id = "named";
  REQUIRE(ExportRunDir(o.run_dir, out, eo, &s).ok());
  REQUIRE(ReadSafetensorsIndex(out, &idx).ok());
  CHECK(idx.metadata.at("job") == "named");
}

TEST_CASE("export: the hf-gpt2 layout transposes the Conv1D weights and writes config.json", "[e2e]") {
  TempDir tmp;
  const TrainOptions o = TinyRun(tmp, 1, "run");
  TrainSummary ts;
  REQUIRE(RunTraining(o, &ts).ok());
  Checkpoint ckpt;
  REQUIRE(LoadCheckpoint(o.run_dir + "/checkpoint.bin", &ckpt).ok());
  const GptConfig model = ModelOf(o.config);
  const TensorTable engine = gpt_tensor_table(model);
  const int C = model.n_embd;

  ExportOptions eo;
  eo.layout = ExportLayout::kHfGpt2;
  ExportSummary s;
  // A path not ending in .safetensors is a directory for from_pretrained.
  const Status st = ExportRunDir(o.run_dir, tmp.file("hf"), eo, &s);
  INFO(st.message());
  REQUIRE(st.ok());
  CHECK(s.out_path == tmp.file("hf") + "/model.safetensors");
  CHECK(s.config_path == tmp.file("hf") + "/config.json");
  SafetensorsIndex idx;
  REQUIRE(ReadSafetensorsIndex(s.out_path, &idx).ok());
  CHECK(idx.metadata.at("layout") == "hf-gpt2");
  CHECK(idx.find("transformer.h.0.attn.c_attn.weight")->shape == std::vector<int64_t>{C, 3 * C});
  CHECK(idx.find("transformer.h.0.attn.c_proj.weight")->shape == std::vector<int64_t>{C, C});
  CHECK(idx.find("transformer.h.0.mlp.c_fc.weight")->shape == std::vector<int64_t>{C, 4 * C});
  CHECK(idx.find("transformer.h.0.mlp.c_proj.weight")->shape == std::vector<int64_t>{4 * C, C});
  CHECK(idx.find("transformer.wte.weight")->shape == std::vector<int64_t>{256, C});
  // W_hf[i][o] == W_engine[o][i].
  const std::string file = ReadText(s.out_path);
  const std::vector<float> fc = TensorData(file, idx, "transformer.h.1.mlp.c_fc.weight");
  const TensorInfo* e = engine.find("h.1.mlp.c_fc.weight");
  for (int out_f = 0; out_f < 4 * C; out_f += 7)
    for (int in_f = 0; in_f < C; in_f += 3)
      CHECK(fc[(size_t)in_f * 4 * C + out_f] == ckpt.params[e->offset + (size_t)out_f * C + in_f]);

  const auto config = nlohmann::json::parse(ReadText(s.config_path));
  CHECK(config["model_type"] == "gpt2");
  CHECK(config["architectures"] == nlohmann::json{"GPT2LMHeadModel"});
  CHECK(config["n_layer"] == model.n_layer);
  CHECK(config["n_head"] == model.n_head);
  CHECK(config["n_embd"] == C);
  CHECK(config["n_positions"] == model.block_size);
  CHECK(config["vocab_size"] == 256);
  CHECK(config["activation_function"] == "gelu_new");
  CHECK(config["layer_norm_epsilon"] == 1e-5);
  CHECK(config["tie_word_embeddings"] == true);
  CHECK(config["bos_token_id"].get<int>() < 256);

  // A path ending in .safetensors is the file; config.json goes beside it.
  REQUIRE(ExportRunDir(o.run_dir, tmp.file("flat/model.safetensors"), eo, &s).ok());
  CHECK(s.out_path == tmp.file("flat/model.safetensors"));
  CHECK(s.config_path == tmp.file("flat/config.json"));
  CHECK(fs::exists(s.config_path));
  CHECK(ReadText(s.out_path) == file);
}

TEST_CASE("export: a 2-learner run exports the syncer's merged model from global_state.bin", "[e2e]") {
  TempDir tmp;
  const TrainOptions o = TinyRun(tmp, 2, "run2");
  TrainSummary ts;
  const Status trained = RunTraining(o, &ts);
  INFO(trained.message());
  REQUIRE(trained.ok());
  REQUIRE(fs::exists(o.run_dir + "/global_state.bin"));

  // The merged model, put together here from the fragments' tensor names.
  const GptConfig model = ModelOf(o.config);
  const TensorTable table = gpt_tensor_table(model);
  GlobalState gs;
  REQUIRE(LoadGlobalState(o.run_dir + "/global_state.bin", &gs).ok());
  std::vector<Fragment> fragments;
  REQUIRE(PartitionFragments(table, (int)gs.fragments.size(), &fragments).ok());
  std::vector<float> theta(table.total_numel(), std::nanf(""));
  for (size_t p = 0; p < fragments.size(); p++)
    for (const FragmentRange& r : fragments[p].ranges) {
      const TensorInfo* t = table.find(r.tensor);
      REQUIRE(t != nullptr);
      std::copy_n(gs.fragments[p].theta.begin() + r.packed_offset, t->numel, theta.begin() + t->offset);
    }

  const std::string out = tmp.file("merged.safetensors");
  ExportSummary s;
  const Status st = ExportRunDir(o.run_dir, out, &s);
  INFO(st.message());
  REQUIRE(st.ok());
  CHECK(s.source_kind == "global_state");
  CHECK(s.job_id == "run2");
  CHECK(s.merges == gs.merges);
  CHECK(gs.merges >= 1);
  CHECK(s.training_steps == (uint64_t)ts.steps);  // the summary's steps, summed over learners
  REQUIRE(s.versions.size() == 2);
  CHECK(s.versions == ts.versions);
  CheckExport(tmp, out, model, theta);
  SafetensorsIndex idx;
  REQUIRE(ReadSafetensorsIndex(out, &idx).ok());
  CHECK(idx.metadata.at("merges") == std::to_string(gs.merges));
  CHECK(idx.metadata.at("training_steps") == std::to_string(ts.steps));
  CHECK(idx.metadata.at("versions") == std::to_string(s.versions[0]) + "," + std::to_string(s.versions[1]));
  const nlohmann::json j = ExportSummaryObject(s);
  CHECK(j["out"] == out);
  CHECK(j["source_kind"] == "global_state");
  CHECK(j["versions"] == nlohmann::json(s.versions));
  CHECK(j["num_params"] == table.total_numel());
  CHECK(j["merges"] == gs.merges);
  CHECK_THAT(ExportSummaryLine(s), Catch::StartsWith("exported job run2 (global_state, " + std::to_string(ts.steps) +
                                                     " training steps, " + std::to_string(gs.merges) +
                                                     " merges, versions ") &&
                                       Catch::EndsWith(" -> " + out));

  // Without the summary the learners' step files still tell the training steps.
  fs::rename(o.run_dir + "/metrics.jsonl", o.run_dir + "/metrics.off");
  REQUIRE(ExportRunDir(o.run_dir, out, &s).ok());
  CHECK(s.training_steps == (uint64_t)ts.steps);
  // Without either, they are unknown (a daemon job's syncer site).
  for (int i = 0; i < 2; i++) fs::remove(LearnerStepPath(o.run_dir, i));
  REQUIRE(ExportRunDir(o.run_dir, out, &s).ok());
  CHECK_FALSE(s.training_steps.has_value());
  REQUIRE(ReadSafetensorsIndex(out, &idx).ok());
  CHECK(idx.metadata.at("training_steps") == "unknown");
  CHECK(ExportSummaryObject(s)["training_steps"].is_null());

  // global_state.bin is preferred over the checkpoint.bin the run wrote beside it (the merged
  // model without the fragments' versions).
  REQUIRE(fs::exists(o.run_dir + "/checkpoint.bin"));
  REQUIRE(ExportRunDir(o.run_dir, out, &s).ok());
  CHECK(s.source_kind == "global_state");
}

TEST_CASE("export: a run directory without parameters or config is a clear error", "[unit]") {
  TempDir tmp;
  ExportSummary s;
  Status st = ExportRunDir(tmp.file("missing"), tmp.file("x.safetensors"), &s);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("does not exist"));

  fs::create_directories(tmp.path() / "run");
  st = ExportRunDir(tmp.file("run"), tmp.file("x.safetensors"), &s);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("config.yaml"));

  tmp.Write("run/config.yaml", "model: {n_layer: 1, n_embd: 16, n_head: 2, block_size: 8}\ndata: {corpus: /nonexistent}\n");
  st = ExportRunDir(tmp.file("run"), tmp.file("x.safetensors"), &s);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("neither global_state.bin") && Catch::Contains("nor checkpoint.bin") &&
                               Catch::Contains(tmp.file("run")));
  CHECK_FALSE(fs::exists(tmp.file("x.safetensors")));
}

TEST_CASE("export: a checkpoint whose model differs from config.yaml is refused", "[e2e]") {
  TempDir tmp;
  const TrainOptions o = TinyRun(tmp, 1, "run");
  TrainSummary ts;
  REQUIRE(RunTraining(o, &ts).ok());
  tmp.Write("run/config.yaml", "model: {n_layer: 1, n_embd: 16, n_head: 2, block_size: 8}\ndata: {corpus: /nonexistent}\n");
  ExportSummary s;
  const Status st = ExportRunDir(o.run_dir, tmp.file("x.safetensors"), &s);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("checkpoint.bin") && Catch::Contains("inconsistent"));
}

}  // namespace
}  // namespace diloco
