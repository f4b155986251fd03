// Running the real dilococtl binary from a test: its exit code, stdout and stderr, and the JSON
// summary that --json prints last.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace diloco::testing {

struct Result {
  int exit_code;
  std::string out, err;
};

inline std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs dilococtl with args (already shell-quoted) in dir.
inline Result Dilococtl(const std::filesystem::path& dir, const std::string& args) {
  const std::string cmd = "cd '" + dir.string() + "' && " DILOCO_BINARY_DIR "/bin/dilococtl " + args +
                          " > out.txt 2> err.txt";
  const int rc = std::system(cmd.c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, ReadFile(dir / "out.txt"), ReadFile(dir / "err.txt")};
}

inline nlohmann::json LastLineJson(const std::string& out) {
  const std::string trimmed = out.substr(0, out.find_last_not_of('\n') + 1);
  return nlohmann::json::parse(trimmed.substr(trimmed.find_last_of('\n') + 1));
}

}  // namespace diloco::testing
