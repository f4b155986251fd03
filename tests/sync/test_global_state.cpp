#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "daemon/sync/global_state.h"
#include "daemon/util/crc32c.h"
#include "kernels/gpt.h"
#include "kernels/rng.h"
#include "tests/temp_dir.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using diloco::testing::TempDir;

GptConfig TinyGpt() {
  GptConfig c;
  c.vocab_size = 256;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_embd = 16;
  c.n_head = 2;
  return c;
}

std::vector<Fragment> FragmentsOf(const TensorTable& table, int p) {
  std::vector<Fragment> fragments;
  REQUIRE(PartitionFragments(table, p, &fragments).ok());
  return fragments;
}

// A state as after some merges: versions, momenta and a ledger.
GlobalState SomeState(const TensorTable& table, const std::vector<Fragment>& fragments) {
  std::vector<float> params(table.total_numel());
  Rng rng(11);
  for (float& x : params) x = (float)rng.normal();
  GlobalState state = InitialGlobalState(table, fragments, params.data());
  for (size_t p = 0; p < state.fragments.size(); ++p) {
    state.fragments[p].version = 10 + p;
    for (float& x : state.fragments[p].momentum) x = (float)rng.normal();
  }
  LedgerFor(&state, 2) = {2, 9000, 120, 9, 1, 0};
  LedgerFor(&state, 0) = {0, 12000, 100, 11, 0, 2};
  state.merges = 20;
  state.dropped_deltas = 1;
  state.rejected_deltas = 2;
  return state;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Recomputes both CRCs, so that a structural forgery reaches the body parser.
void ResealCrcs(std::string* bytes) {
  const uint32_t body = Crc32c(bytes->data() + 80, bytes->size() - 80);
  std::memcpy(bytes->data() + 72, &body, 4);
  const uint32_t header = Crc32c(bytes->data(), 76);
  std::memcpy(bytes->data() + 76, &header, 4);
}

std::string LoadError(const std::string& path) {
  GlobalState state;
  const Status status = LoadGlobalState(path, &state);
  REQUIRE_FALSE(status.ok());
  return status.message();
}

TEST_CASE("sync: the initial global state is the model, version 0, zero momentum", "[unit][sync]") {
  const TensorTable table = gpt_tensor_table(TinyGpt());
  const std::vector<Fragment> fragments = FragmentsOf(table, 3);
  std::vector<float> params(table.total_numel());
  for (size_t i = 0; i < params.size(); ++i) params[i] = (float)i;
  const GlobalState state = InitialGlobalState(table, fragments, params.data());
  REQUIRE(state.fragments.size() == 3);
  CHECK(state.table_digest == table.digest());
  CHECK(state.fragments_digest == FragmentsDigest(fragments));
  for (size_t p = 0; p < 3; ++p) {
    CHECK(state.fragments[p].version == 0);
    CHECK(state.fragments[p].theta == GatherFragment(fragments[p], params.data()));
    CHECK(state.fragments[p].momentum == std::vector<float>(fragments[p].numel, 0.0f));
  }
  CHECK(state.ledger.empty());
  CHECK(CheckGlobalStateFits(state, table, fragments).ok());
}

TEST_CASE("sync: the ledger keeps one entry per learner, in order", "[unit][sync]") {
  GlobalState state;
  LedgerFor(&state, 3).merged = 1;
  LedgerFor(&state, 1).merged = 2;
  LedgerFor(&state, 3).merged += 5;
  REQUIRE(state.ledger.size() == 2);
  CHECK(state.ledger[0].learner == 1);
  CHECK(state.ledger[1].learner == 3);
  CHECK(state.ledger[1].merged == 6);
}

TEST_CASE("sync: the global state saves atomically and loads back equal", "[unit][sync]") {
  TempDir dir;
  const TensorTable table = gpt_tensor_table(TinyGpt());
  const std::vector<Fragment> fragments = FragmentsOf(table, 3);
  const GlobalState state = SomeState(table, fragments);
  const std::string path = dir.file("global.bin");
  REQUIRE(SaveGlobalState(path, state).message() == "");
  CHECK_FALSE(fs::exists(path + ".tmp"));
  // 80 header bytes, 16 + 8n per fragment, 48 per ledger entry.
  CHECK(fs::file_size(path) == 80 + 3 * 16 + 8 * table.total_numel() + 2 * 48);

  GlobalState loaded;
  REQUIRE(LoadGlobalState(path, &loaded).message() == "");
  CHECK(loaded == state);
  CHECK(loaded.ledger[0] == LedgerEntry{0, 12000, 100, 11, 0, 2});
  CHECK(CheckGlobalStateFits(loaded, table, fragments).ok());

  // Saving again replaces the file.
  GlobalState next = state;
  next.merges = 21;
  next.fragments[1].version = 99;
  REQUIRE(SaveGlobalState(path, next).ok());
  REQUIRE(LoadGlobalState(path, &loaded).ok());
  CHECK(loaded == next);
}

TEST_CASE("sync: a global state for another layout does not fit", "[unit][sync]") {
  const TensorTable table = gpt_tensor_table(TinyGpt());
  const GlobalState state = SomeState(table, FragmentsOf(table, 3));
  Status status = CheckGlobalStateFits(state, table, FragmentsOf(table, 4));
  REQUIRE_FALSE(status.ok());
  CHECK(status.message() ==
        "the global state has 3 fragments laid out differently from this run's 4: keep "
        "sync.fragments as it was when the state was saved");
  GptConfig wider = TinyGpt();
  wider.n_embd = 32;
  const TensorTable other = gpt_tensor_table(wider);
  status = CheckGlobalStateFits(state, other, FragmentsOf(other, 3));
  REQUIRE_FALSE(status.ok());
  CHECK_THAT(status.message(), StartsWith("the global state was saved for a different model"));
}

TEST_CASE("sync: a global state of a partition with row pieces saves, loads and fits",
          "[unit][sync]") {
  TempDir dir;
  GptConfig config = TinyGpt();
  config.vocab_size = 4096;  // wte is 90% of the model: P = 4 cuts it
  const TensorTable table = gpt_tensor_table(config);
  const std::vector<Fragment> fragments = FragmentsOf(table, 4);
  size_t pieces = 0;
  for (const Fragment& f : fragments) {
    for (const FragmentRange& r : f.ranges) pieces += r.piece;
  }
  REQUIRE(pieces > 0);
  const GlobalState state = SomeState(table, fragments);
  const std::string path = dir.file("global.bin");
  REQUIRE(SaveGlobalState(path, state).message() == "");
  GlobalState loaded;
  REQUIRE(LoadGlobalState(path, &loaded).message() == "");
  CHECK(loaded == state);
  CHECK(CheckGlobalStateFits(loaded, table, fragments).ok());
  // The same fragment sizes cut at other rows (another partition rule) do not fit.
  std::vector<Fragment> other = fragments;
  for (Fragment& f : other) {
    for (FragmentRange& r : f.ranges) {
      if (r.piece) r.row_begin += 1, r.row_end += 1;
    }
  }
  const Status status = CheckGlobalStateFits(loaded, table, other);
  REQUIRE_FALSE(status.ok());
  CHECK_THAT(status.message(), Contains("laid out differently"));
}

TEST_CASE("sync: corrupt, truncated and foreign global state files are rejected clearly",
          "[unit][sync]") {
  TempDir dir;
  const TensorTable table = gpt_tensor_table(TinyGpt());
  const GlobalState state = SomeState(table, FragmentsOf(table, 2));
  const std::string path = dir.file("global.bin");
  REQUIRE(SaveGlobalState(path, state).ok());
  const std::string good = ReadBytes(path);
  const std::string name = "global state '" + path + "'";

  struct Case {
    std::string what;
    std::string bytes;
    std::string message;
  };
  std::vector<Case> cases;
  std::string b = good;
  b[200] ^= 1;
  cases.push_back({"a flipped body bit", b, name + " is corrupt: body CRC mismatch"});
  b = good;
  b[40] ^= 1;  // the merges counter
  cases.push_back({"a flipped header bit", b, name + " is corrupt: header CRC mismatch"});
  cases.push_back({"a cut header", good.substr(0, 50),
                   name + " is truncated: 30 bytes missing (the file has 50 bytes, the header "
                          "alone needs 80)"});
  cases.push_back({"a cut body", good.substr(0, good.size() - 10),
                   name + " is truncated: 10 bytes missing (the file has " +
                       std::to_string(good.size() - 10) + " bytes; its header describes more)"});
  cases.push_back(
      {"trailing bytes", good + "xyz", name + " has 3 unexpected bytes after its body: corrupt"});
  cases.push_back({"an empty file", "", name + " is empty: not a global state file"});
  cases.push_back({"a checkpoint", "DLCKPT01" + good.substr(8),
                   name + " is not a global state file (bad magic; expected \"DLSYNC01\")"});
  b = good;
  b[8] = 2;
  cases.push_back({"a newer format", b,
                   name + " has format version 2; this build reads version 1: use a matching "
                          "dilocod"});
  b = good;
  b[80 + 12] = (char)0xff;  // fragment 0's numel becomes huge; resealed
  ResealCrcs(&b);
  cases.push_back({"a forged fragment size", b, name + " is corrupt: fragment 0 says "});
  b = good.substr(0, good.size() - 48);  // drop a ledger entry but keep the header's count
  const uint64_t body_bytes = b.size() - 80;
  std::memcpy(b.data() + 64, &body_bytes, 8);
  ResealCrcs(&b);
  cases.push_back({"a missing ledger entry", b,
                   name + " is corrupt: 48 body bytes are left for 2 ledger entries of 48 bytes"});

  for (const Case& c : cases) {
    INFO(c.what);
    WriteBytes(path, c.bytes);
    CHECK_THAT(LoadError(path), StartsWith(c.message));
  }

  const std::string missing = dir.file("none.bin");
  CHECK(LoadError(missing) ==
        "cannot open global state '" + missing + "': No such file or directory: check the path");
}

TEST_CASE("sync: a failed save leaves no file behind and says why", "[unit][sync]") {
  TempDir dir;
  GlobalState state;
  state.fragments.resize(1);
  state.fragments[0].theta = {1, 2};
  const std::string path = dir.file("no/such/dir/global.bin");
  Status status = SaveGlobalState(path, state);
  REQUIRE_FALSE(status.ok());
  CHECK_THAT(status.message(), Contains("momentum of 0"));
  state.fragments[0].momentum = {0, 0};
  status = SaveGlobalState(path, state);
  REQUIRE_FALSE(status.ok());
  CHECK_THAT(status.message(),
             StartsWith("cannot save global state: cannot create '" + path + ".tmp'"));
  CHECK_THAT(status.message(), Contains("check that the directory exists"));
  CHECK_FALSE(fs::exists(path));
}

}  // namespace
}  // namespace diloco
