// The safetensors reader on hand-made and damaged files.
#include "daemon/export/safetensors.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "daemon/util/atomic_file.h"
#include "tests/temp_dir.h"

namespace diloco {
namespace {
using diloco::testing::TempDir;

std::string Le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; i++) s[i] = (char)(n >> (8 * i));
  return s;
}

// A file with this JSON header and data_bytes zero bytes of data.
std::string File(const std::string& header, size_t data_bytes) {
  return Le64(header.size()) + header + std::string(data_bytes, '\0');
}

TensorTable SmallTable() {
  TensorTable t;
  t.add("a", {2, 3});
  t.add("b", {4});
  return t;
}

Status Read(const TempDir& tmp, const std::string& bytes, SafetensorsIndex* idx = nullptr) {
  SafetensorsIndex local;
  return ReadSafetensorsIndex(tmp.Write("t.safetensors", bytes), idx ? idx : &local);
}

TEST_CASE("safetensors: write then read back a small table", "[unit]") {
  TempDir tmp;
  const TensorTable table = SmallTable();
  std::vector<float> params(table.total_numel());
  for (size_t i = 0; i < params.size(); i++) params[i] = 0.5f * (float)i;
  const std::string path = tmp.file("m.safetensors");
  REQUIRE(WriteSafetensors(path, table, params.data(), {{"format", "pt"}, {"job", "j1"}}).ok());

  std::string bytes;
  REQUIRE(ReadWholeFile(path, "t", &bytes).ok());
  uint64_t n = 0;
  for (int i = 0; i < 8; i++) n |= (uint64_t)(uint8_t)bytes[i] << (8 * i);
  CHECK((8 + n) % 8 == 0);
  // Exact header: __metadata__ first, tensors in table order, space padding.
  const std::string json =
      R"({"__metadata__":{"format":"pt","job":"j1"},"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"F32","shape":[4],"data_offsets":[24,40]}})";
  CHECK(bytes.substr(8, n) == json + std::string(n - json.size(), ' '));
  CHECK(bytes.size() == 8 + n + 40);

  SafetensorsIndex idx;
  REQUIRE(ReadSafetensorsIndex(path, &idx).ok());
  CHECK(idx.header_bytes == n);
  CHECK(idx.data_offset == 8 + n);
  REQUIRE(idx.entries.size() == 2);
  CHECK(idx.entries[0].name == "a");
  CHECK(idx.entries[0].shape == std::vector<int64_t>{2, 3});
  CHECK(idx.entries[1].begin == 24);
  CHECK(idx.entries[1].end == 40);
  CHECK(idx.metadata.at("job") == "j1");
  CHECK(CheckSafetensorsMatchesTable(idx, table).ok());
  CHECK(std::memcmp(bytes.data() + idx.data_offset, params.data(), 40) == 0);

  TensorTable other;
  other.add("a", {3, 2});
  other.add("b", {4});
  const Status st = CheckSafetensorsMatchesTable(idx, other);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("'a'") && Catch::Contains("[2, 3]") && Catch::Contains("[3, 2]"));
}

TEST_CASE("safetensors: accepts other dtypes and header order that is not offset order", "[unit]") {
  TempDir tmp;
  SafetensorsIndex idx;
  const Status st = Read(tmp,
                         File(R"({"y":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]},)"
                              R"("x":{"dtype":"I64","shape":[],"data_offsets":[0,8]}})",
                              14),
                         &idx);
  INFO(st.message());
  REQUIRE(st.ok());
  REQUIRE(idx.entries.size() == 2);
  CHECK(idx.entries[0].name == "x");
  CHECK(idx.entries[1].name == "y");
  CHECK(idx.metadata.empty());
}

TEST_CASE("safetensors: damaged files are refused with a clear error", "[unit]") {
  TempDir tmp;
  const std::string good_a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string good = "{" + good_a + "}";

  auto refused = [&](const std::string& bytes, const std::string& fragment) {
    const Status st = Read(tmp, bytes);
    INFO(fragment);
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(st.message(), Catch::Contains(fragment) && Catch::Contains("t.safetensors"));
  };
  REQUIRE(Read(tmp, File(good, 8)).ok());

  SECTION("truncated") {
    refused("", "not even the 8-byte header length");
    refused(Le64(5).substr(0, 5), "not even the 8-byte header length");
    refused(File(good, 8).substr(0, 20), "header length " + std::to_string(good.size()));
    refused(File(good, 5), "truncated: its tensors need 8 data bytes, the file has 5");
  }
  SECTION("bad header length") {
    refused(Le64(0) + good, "header length 0");
    refused(Le64(uint64_t{1} << 40) + good, "over the 100000000-byte limit");
    refused(Le64(good.size() + 100) + good + std::string(8, '\0'), "only " + std::to_string(good.size() + 8) + " bytes follow");
  }
  SECTION("bad JSON") {
    refused(File("[1, 2]  ", 0), "does not start with '{'");
    refused(File("{\"a\": ", 8), "not valid JSON");
    refused(File(R"({"__metadata__":{"step":3}})", 0), "\"step\" is not a string");
    refused(File(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8), "unknown dtype \"F33\"");
    refused(File(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "non-integer or negative");
    refused(File(R"({"a":{"dtype":"F32","shape":[2]}})", 8), "no \"data_offsets\"");
    refused(File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8), "unknown key \"x\"");
  }
  SECTION("offsets") {
    // Size does not match shape x dtype.
    refused(File(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "needs 12");
    refused(File(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8), "end before they begin");
    // Overlapping tensors.
    refused(File("{" + good_a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
            "tensor 'b' [4, 12) overlaps tensor 'a' [0, 8)");
    // A hole between tensors, before the first, and after the last.
    refused(File("{" + good_a + R"(,"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})", 16),
            "4 bytes before tensor 'b' (at 8) belong to no tensor");
    refused(File(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12), "before tensor 'a' (at 0)");
    refused(File(good, 12), "4 bytes after its last tensor");
  }
  SECTION("missing file") {
    SafetensorsIndex idx;
    const Status st = ReadSafetensorsIndex(tmp.file("nope.safetensors"), &idx);
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(st.message(), Catch::Contains("nope.safetensors") && Catch::Contains("check the path"));
  }
}

}  // namespace
}  // namespace diloco
