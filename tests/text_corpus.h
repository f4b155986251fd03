// Small text corpora for tests that train: pieces of text drawn in a seeded pseudo-random order
// (a 64-bit LCG) until the file holds at least min_bytes, or numbered lines.
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

// Numbered lines of one sentence, for runs whose loss only has to fall: "Line 0: the quick ...".
inline std::string NumberedLines(int lines) {
  std::string text;
  for (int i = 0; i < lines; i++)
    text += "Line " + std::to_string(i) + ": the quick brown fox jumps over the lazy dog, again and again.\n";
  return text;
}

}  // namespace diloco::testing
