// Export of real run directories (a single-learner checkpoint and a 2-learner
// local run's global state) to safetensors, read back by our reader and,
// independently, by python3's json module.
#include "daemon/export/export_run.h"

#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/export/safetensors.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/global_state.h"
#include "daemon/train/checkpoint.h"
#include "daemon/train/trainer.h"
#include "daemon/util/atomic_file.h"
#include "kernels/gpt.h"
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
  TrainOptions o;
  RunConfig& c = o.config;
  c.model = {.n_layer = 2, .n_embd = 16, .n_head = 2, .block_size = 8};
  c.data.corpus = WriteCorpus(tmp.path());
  c.train.batch_size = 2;
  c.train.steps = learners > 1 ? 12 : 3;
  c.train.warmup_steps = 1;
  c.train.threads = 1;
  c.eval.batches = 1;
  c.sync.learners = learners;
  if (learners > 1) {
    c.sync.mode = SyncMode::kDecoupled;
    c.sync.fragments = 2;
    c.sync.inner_steps = 4;
    c.sync.quorum = 2;
    c.sync.grace.cap_ms = 100;
  }
  o.run_dir = (tmp.path() / run).string();
  o.quiet = true;
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

// Checks the file against the model and params, with our reader and python.
void CheckExport(const TempDir& tmp, const std::string& path, const GptConfig& model, const std::vector<float>& params) {
  const TensorTable table = gpt_tensor_table(model);
  SafetensorsIndex idx;
  const Status st = ReadSafetensorsIndex(path, &idx);
  INFO(st.message());
  REQUIRE(st.ok());
  REQUIRE(CheckSafetensorsMatchesTable(idx, table).ok());
  CHECK(idx.data_offset % 8 == 0);
  CHECK(idx.file_bytes == idx.data_offset + 4 * table.total_numel());
  CHECK(idx.metadata.at("format") == "pt");
  const auto mc = nlohmann::json::parse(idx.metadata.at("model_config"));
  CHECK(mc == nlohmann::json{{"vocab_size", 256}, {"block_size", model.block_size}, {"n_layer", model.n_layer},
                             {"n_embd", model.n_embd}, {"n_head", model.n_head}});
  // The names the header documents (export_run.h).
  CHECK(idx.entries.front().name == "wte");
  CHECK(idx.entries[1].name == "wpe");
  CHECK(idx.entries[2].name == "h.0.ln_1.weight");
  CHECK(idx.find("h.1.attn.c_attn.weight")->shape == std::vector<int64_t>{3 * model.n_embd, model.n_embd});
  CHECK(idx.find("h.1.mlp.c_proj.weight")->shape == std::vector<int64_t>{model.n_embd, 4 * model.n_embd});
  CHECK(idx.entries.back().name == "ln_f.bias");

  // Values equal the parameters, tensor by tensor.
  const std::string file = ReadText(path);
  size_t sum_bytes = 0;
  for (const TensorInfo& t : table.tensors()) {
    const std::vector<float> got = TensorData(file, idx, t.name);
    const std::vector<float> want(params.begin() + t.offset, params.begin() + t.offset + t.numel);
    INFO(t.name);
    CHECK(got == want);
    sum_bytes += got.size() * sizeof(float);
  }
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
    CHECK(py["first"][i].get<float>() == params[t.offset]);
  }
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
  CHECK_THAT(ExportSummaryLine(s), Catch::Contains("(checkpoint, step 3): 28 tensors"));
  CHECK_FALSE(ExportSummaryObject(s).contains("versions"));
  CHECK(s.step == 3);
  CHECK(s.num_params == ckpt.params.size());
  CHECK(s.tensors == 4 + 12 * 2);
  CHECK(s.file_bytes == fs::file_size(out));
  CHECK_FALSE(fs::exists(out + ".tmp"));
  CheckExport(tmp, out, ModelOf(o.config), ckpt.params);

  SafetensorsIndex idx;
  REQUIRE(ReadSafetensorsIndex(out, &idx).ok());
  CHECK(idx.metadata.at("job") == "j-ckpt");
  CHECK(idx.metadata.at("source") == "checkpoint");
  CHECK(idx.metadata.at("step") == "3");
  CHECK(idx.metadata.count("versions") == 0);
  CHECK(idx.metadata.at("run_config") == ReadText(o.run_dir + "/config.yaml"));

  ExportOptions eo;
  eo.job_id = "named";
  REQUIRE(ExportRunDir(o.run_dir, out, eo, &s).ok());
  REQUIRE(ReadSafetensorsIndex(out, &idx).ok());
  CHECK(idx.metadata.at("job") == "named");
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
  CHECK(s.step == gs.merges);
  CHECK(s.step >= 1);
  REQUIRE(s.versions.size() == 2);
  CHECK(s.versions == ts.versions);
  CheckExport(tmp, out, model, theta);
  SafetensorsIndex idx;
  REQUIRE(ReadSafetensorsIndex(out, &idx).ok());
  CHECK(nlohmann::json::parse(idx.metadata.at("versions")) == nlohmann::json(s.versions));
  const nlohmann::json j = ExportSummaryObject(s);
  CHECK(j["out"] == out);
  CHECK(j["source_kind"] == "global_state");
  CHECK(j["versions"] == nlohmann::json(s.versions));
  CHECK(j["num_params"] == table.total_numel());
  CHECK_THAT(ExportSummaryLine(s), Catch::StartsWith("exported job run2 (global_state, " + std::to_string(s.step) +
                                                     " merges, versions ") &&
                                       Catch::EndsWith(" -> " + out));

  // global_state.bin is preferred over a checkpoint.bin in the same directory.
  fs::copy_file(o.run_dir + "/global_state.bin", o.run_dir + "/checkpoint.bin");
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
  CHECK_THAT(st.message(), Catch::Contains("neither global_state.bin nor checkpoint.bin"));
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
