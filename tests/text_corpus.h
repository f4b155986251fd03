// A small text corpus for tests that train: pieces of text drawn in a seeded pseudo-random order
// (a 64-bit LCG) until the file holds at least min_bytes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace diloco::testing {

inline std::string WriteShuffledCorpus(const std::filesystem::path& dir, const std::vector<std::string>& pieces,
                                       size_t min_bytes, uint64_t seed) {
  std::string text;
  uint64_t x = seed;
  while (text.size() < min_bytes) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    text += pieces[(x >> 33) % pieces.size()];
  }
  const std::string path = (dir / "corpus.txt").string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

}  // namespace diloco::testing
