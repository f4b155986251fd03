// What the local-run tests share: a small learnable corpus, a tiny multi-learner run, and a
// reader of the run's JSON-lines files.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/train/local_run.h"
#include "tests/temp_dir.h"
#include "tests/text_corpus.h"

namespace diloco::testing {

// A small learnable corpus: a few sentences in a shuffled order.
inline std::string WriteCorpus(const std::filesystem::path& dir) {
  return WriteShuffledCorpus(dir,
                             {"the quick brown fox jumps over the lazy dog.\n",
                              "to be or not to be, that is the question.\n",
                              "all the world's a stage, and all the men and women merely players.\n",
                              "now is the winter of our discontent.\n"},
                             60000, 12345);
}

inline TrainOptions TinyRun(const TempDir& tmp, int learners) {
  TrainOptions o;
  RunConfig& c = o.config;
  c.model = {.n_layer = 1, .n_embd = 32, .n_head = 2, .block_size = 16};
  c.data.corpus = WriteCorpus(tmp.path());
  c.train.batch_size = 4;
  c.train.steps = 60;
  c.train.lr = 3e-3;
  c.train.warmup_steps = 5;
  c.train.threads = 1;
  c.eval.batches = 5;
  c.sync.learners = learners;
  c.sync.mode = SyncMode::kDecoupled;
  c.sync.fragments = 2;
  c.sync.inner_steps = 10;
  c.sync.quorum = 2;
  c.sync.grace.cap_ms = 200;
  o.run_dir = (tmp.path() / "run").string();
  o.quiet = true;
  return o;
}

inline std::vector<nlohmann::json> ReadJsonl(const std::filesystem::path& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace diloco::testing
