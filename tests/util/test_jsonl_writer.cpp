#include "daemon/util/jsonl_writer.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "tests/temp_dir.h"

namespace diloco {
namespace {

using diloco::testing::TempDir;

int CountLines(const std::string& path) {
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line);) n++;
  return n;
}

TEST_CASE("jsonl writer: two writers on one file rotate it once and lose no line", "[unit][jsonl]") {
  TempDir dir;
  const std::string path = (dir.path() / "events.log").string();
  const nlohmann::json line = {{"event", "merge"}, {"pad", std::string(40, 'x')}};  // about 60 bytes
  JsonlWriter a, b;
  REQUIRE(a.Open(path, 100).ok());
  REQUIRE(b.Open(path, 100).ok());
  for (int i = 0; i < 2; i++) REQUIRE(a.Write(line).ok());
  for (int i = 0; i < 2; i++) REQUIRE(b.Write(line).ok());
  REQUIRE(a.Write(line).ok());  // a rotates: the four lines move to events.log.1
  CHECK(CountLines(path + ".1") == 4);
  // b is past its size too, but the file at the path is a's new one: b must not move it over
  // events.log.1 (the four lines would be gone).
  REQUIRE(b.Write(line).ok());
  CHECK(CountLines(path + ".1") == 4);
  CHECK(CountLines(path) == 2);
}

}  // namespace
}  // namespace diloco
