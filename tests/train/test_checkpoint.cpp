#include "daemon/train/checkpoint.h"

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "daemon/util/crc32c.h"
#include "kernels/rng.h"

#include "tests/temp_dir.h"
namespace diloco {
namespace {

// The checkpoint API takes a model shape and a parameter buffer; these tests build Gpt models.
Status SaveModel(const std::string& path, const Gpt& model, const AdamWState& optimizer, long step,
                 const std::string& config_yaml) {
  return SaveCheckpoint(path, model.config(), model.params(), optimizer, step, config_yaml);
}

Status RestoreModel(const Checkpoint& ckpt, Gpt* model, AdamWState* optimizer) {
  DL_RETURN_IF_ERROR(CheckCheckpointFits(ckpt, model->config(), optimizer != nullptr));
  std::copy(ckpt.params.begin(), ckpt.params.end(), model->params());
  if (optimizer != nullptr) *optimizer = ckpt.optimizer;
  return Status::Ok();
}

namespace fs = std::filesystem;

using diloco::testing::TempDir;

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), (std::streamsize)bytes.size());
  REQUIRE(f.good());
}

GptConfig small_config() {
  GptConfig c;
  c.vocab_size = 32;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_embd = 16;
  c.n_head = 2;
  return c;
}

AdamWState random_state(size_t n, uint64_t seed) {
  Rng rng(seed);
  AdamWState s;
  s.m.resize(n);
  s.v.resize(n);
  for (size_t i = 0; i < n; i++) {
    s.m[i] = (float)rng.normal();
    s.v[i] = (float)rng.uniform();
  }
  s.step = 17;
  return s;
}

bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

const std::string kYaml = "run:\n  name: test\nmodel:\n  n_embd: 16\n";

// Sets a little-endian header field and re-signs the header, so that only
// the field's own check can catch it.
void patch_header(std::string* bytes, size_t offset, uint64_t value, int size) {
  for (int i = 0; i < size; i++) (*bytes)[offset + i] = (char)(value >> (8 * i));
  const uint32_t crc = Crc32c(bytes->data(), 80);
  for (int i = 0; i < 4; i++) (*bytes)[80 + i] = (char)(crc >> (8 * i));
}

void require_error(const Status& st, const std::vector<std::string>& parts) {
  REQUIRE_FALSE(st.ok());
  for (const std::string& part : parts) {
    INFO("message: " << st.message());
    CHECK(st.message().find(part) != std::string::npos);
  }
}

struct Saved {
  TempDir dir;
  std::string path = dir.file("model.ckpt");
  Gpt model{small_config(), 1};
  AdamWState state;
  std::string bytes;

  Saved() {
    model.init_weights(3);
    state = random_state(model.num_params(), 4);
    REQUIRE(SaveModel(path, model, state, 123, kYaml).ok());
    bytes = read_bytes(path);
  }
};

TEST_CASE("checkpoint round trip is bit-exact", "[unit][train]") {
  Saved s;
  const size_t n = s.model.num_params();
  CHECK(s.bytes.size() == kCheckpointHeaderBytes + kYaml.size() + 12 * n);
  CHECK(s.bytes.substr(0, 8) == "DLCKPT01");
  CHECK_FALSE(fs::exists(s.path + ".tmp"));

  Checkpoint ckpt;
  const Status st = LoadCheckpoint(s.path, &ckpt);
  REQUIRE(st.message() == "");
  CHECK(ckpt.step == 123);
  CHECK(ckpt.config_yaml == kYaml);
  CHECK(ckpt.model.vocab_size == 32);
  CHECK(ckpt.model.block_size == 8);
  CHECK(ckpt.model.n_layer == 2);
  CHECK(ckpt.model.n_embd == 16);
  CHECK(ckpt.model.n_head == 2);
  CHECK(ckpt.optimizer.step == 17);
  REQUIRE(ckpt.params.size() == n);
  CHECK(same_bits(ckpt.params.data(), s.model.params(), n));
  CHECK(same_bits(ckpt.optimizer.m.data(), s.state.m.data(), n));
  CHECK(same_bits(ckpt.optimizer.v.data(), s.state.v.data(), n));

  Gpt restored(small_config(), 2);
  AdamWState state;
  REQUIRE(RestoreModel(ckpt, &restored, &state).ok());
  CHECK(same_bits(restored.params(), s.model.params(), n));
  CHECK(state.step == 17);
  CHECK(state.m == s.state.m);
  CHECK(state.v == s.state.v);

  // Parameters only.
  Gpt params_only(small_config(), 1);
  REQUIRE(RestoreModel(ckpt, &params_only, nullptr).ok());
  CHECK(same_bits(params_only.params(), s.model.params(), n));
}

TEST_CASE("checkpoint saves empty AdamW moments as zeros", "[unit][train]") {
  TempDir dir;
  Gpt model(small_config(), 1);
  model.init_weights(5);
  REQUIRE(SaveModel(dir.file("c"), model, AdamWState(), 0, "").ok());
  Checkpoint ckpt;
  REQUIRE(LoadCheckpoint(dir.file("c"), &ckpt).ok());
  CHECK(ckpt.config_yaml.empty());
  CHECK(ckpt.optimizer.step == 0);
  CHECK(ckpt.optimizer.m == std::vector<float>(model.num_params(), 0.0f));
  CHECK(ckpt.optimizer.v == std::vector<float>(model.num_params(), 0.0f));
}

TEST_CASE("checkpoint rejects truncated files and says how much is missing", "[unit][train]") {
  Saved s;
  const size_t size = s.bytes.size();
  Checkpoint ckpt;
  for (size_t keep :
       {size_t(5), size_t(50), size_t(83), size_t(84), size_t(84 + 7), size_t(200), size - 1}) {
    INFO("kept " << keep << " of " << size << " bytes");
    write_bytes(s.path, s.bytes.substr(0, keep));
    const size_t missing =
        keep < kCheckpointHeaderBytes ? kCheckpointHeaderBytes - keep : size - keep;
    require_error(LoadCheckpoint(s.path, &ckpt),
                  {s.path, "truncated", std::to_string(missing) + " bytes missing"});
  }
  write_bytes(s.path, "");
  require_error(LoadCheckpoint(s.path, &ckpt), {s.path, "empty"});
  write_bytes(s.path, s.bytes + "extra");
  require_error(LoadCheckpoint(s.path, &ckpt), {"5 unexpected bytes"});
  require_error(LoadCheckpoint(s.path + ".missing", &ckpt), {"cannot open", "No such file"});
}

TEST_CASE("checkpoint detects a flipped byte in the header or the body", "[unit][train]") {
  Saved s;
  Checkpoint ckpt;
  for (size_t at : {size_t(20), size_t(40), size_t(60), size_t(78), size_t(82)}) {
    INFO("flipped header byte " << at);
    std::string bad = s.bytes;
    bad[at] ^= 0x10;
    write_bytes(s.path, bad);
    require_error(LoadCheckpoint(s.path, &ckpt), {s.path, "corrupt", "header CRC"});
  }
  for (size_t at :
       {size_t(84), size_t(84 + kYaml.size() + 5), s.bytes.size() / 2, s.bytes.size() - 1}) {
    INFO("flipped body byte " << at);
    std::string bad = s.bytes;
    bad[at] ^= 0x01;
    write_bytes(s.path, bad);
    require_error(LoadCheckpoint(s.path, &ckpt), {s.path, "corrupt", "body CRC"});
  }
}

TEST_CASE("checkpoint rejects other files, versions and dtypes", "[unit][train]") {
  Saved s;
  Checkpoint ckpt;
  std::string bad = s.bytes;
  bad[0] = 'X';
  write_bytes(s.path, bad);
  require_error(LoadCheckpoint(s.path, &ckpt), {s.path, "not a checkpoint", "magic"});
  write_bytes(s.path, "model:\n  n_embd: 16\n");
  require_error(LoadCheckpoint(s.path, &ckpt), {"not a checkpoint"});

  bad = s.bytes;
  bad[8] = 2;  // version 2, header CRC now wrong too: the version is reported
  write_bytes(s.path, bad);
  require_error(LoadCheckpoint(s.path, &ckpt), {s.path, "format version 2", "reads version 1"});

  bad = s.bytes;
  patch_header(&bad, 12, 2, 4);
  write_bytes(s.path, bad);
  require_error(LoadCheckpoint(s.path, &ckpt), {s.path, "dtype 2"});
}

TEST_CASE("checkpoint header must agree with its GptConfig", "[unit][train]") {
  Saved s;
  Checkpoint ckpt;
  std::string bad = s.bytes;
  patch_header(&bad, 52, s.model.num_params() - 1, 8);
  write_bytes(s.path, bad);
  require_error(LoadCheckpoint(s.path, &ckpt), {s.path, "parameters but its GptConfig has"});

  bad = s.bytes;
  patch_header(&bad, 60, 12345, 8);
  write_bytes(s.path, bad);
  require_error(LoadCheckpoint(s.path, &ckpt), {s.path, "tensor layout"});

  bad = s.bytes;
  patch_header(&bad, 28, 17, 4);  // n_embd 17 with n_head 2
  write_bytes(s.path, bad);
  require_error(LoadCheckpoint(s.path, &ckpt), {s.path, "invalid GptConfig", "n_embd 17"});

  // An absurd yaml length is caught against the file size, never allocated.
  bad = s.bytes;
  patch_header(&bad, 68, ~0ull, 8);
  write_bytes(s.path, bad);
  require_error(LoadCheckpoint(s.path, &ckpt), {s.path, "truncated"});
}

TEST_CASE("restoring into a different model names the difference", "[unit][train]") {
  Saved s;
  Checkpoint ckpt;
  REQUIRE(LoadCheckpoint(s.path, &ckpt).ok());
  GptConfig other = small_config();
  other.n_embd = 8;
  Gpt model(other, 1);
  AdamWState state;
  const Status st = RestoreModel(ckpt, &model, &state);
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().find("checkpoint has n_embd 16, model has 8") != std::string::npos);
  CHECK(state.m.empty());

  ckpt.optimizer.m.pop_back();
  Gpt same(small_config(), 1);
  require_error(RestoreModel(ckpt, &same, &state), {"AdamW moments"});
}

TEST_CASE("a failed save leaves the previous checkpoint and no temp file", "[unit][train]") {
  Saved s;
  Checkpoint ckpt;

  // No such directory.
  const std::string lost = s.dir.file("no/such/dir/model.ckpt");
  require_error(SaveModel(lost, s.model, s.state, 5, kYaml), {lost, "directory exists"});

  // The temp file cannot be created: the old checkpoint stays as it was.
  fs::create_directory(s.path + ".tmp");
  require_error(SaveModel(s.path, s.model, AdamWState(), 999, kYaml), {s.path});
  CHECK(read_bytes(s.path) == s.bytes);
  fs::remove(s.path + ".tmp");

  // Bad optimizer state: rejected before anything is written.
  AdamWState short_state = s.state;
  short_state.v.resize(3);
  require_error(SaveModel(s.path, s.model, short_state, 999, kYaml), {"AdamW state"});
  CHECK(read_bytes(s.path) == s.bytes);
  CHECK_FALSE(fs::exists(s.path + ".tmp"));

  // A leftover temp file from a crash mid-save is harmless and replaced.
  write_bytes(s.path + ".tmp", "half a checkpoint");
  REQUIRE(LoadCheckpoint(s.path, &ckpt).ok());
  CHECK(ckpt.step == 123);
  REQUIRE(SaveModel(s.path, s.model, s.state, 124, kYaml).ok());
  CHECK_FALSE(fs::exists(s.path + ".tmp"));
  REQUIRE(LoadCheckpoint(s.path, &ckpt).ok());
  CHECK(ckpt.step == 124);
}

}  // namespace
}  // namespace diloco
