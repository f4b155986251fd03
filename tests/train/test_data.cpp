#include "daemon/train/data.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>

#include "kernels/rng.h"

#include "tests/temp_dir.h"
namespace diloco {
namespace {
namespace fs = std::filesystem;

using diloco::testing::TempDir;

void write_file(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), (std::streamsize)bytes.size());
  REQUIRE(f.good());
}

// Printable random text (no NUL, so never taken for binary).
std::string random_text(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::string s(n, ' ');
  for (char& c : s) c = (char)(32 + rng.below(95));
  return s;
}

std::string to_string(std::span<const uint8_t> bytes) {
  return std::string(bytes.begin(), bytes.end());
}

Status load(const std::string& path, const CorpusOptions& options, std::unique_ptr<Corpus>* out) {
  return Corpus::Load(path, options, out);
}

TEST_CASE("corpus splits the tail off for validation", "[unit][train]") {
  TempDir dir;
  const std::string text = random_text(1000, 1);
  write_file(dir.file("c.txt"), text);
  std::unique_ptr<Corpus> corpus;
  CorpusOptions options;
  options.block_size = 16;
  REQUIRE(load(dir.file("c.txt"), options, &corpus).ok());
  CHECK(corpus->total_bytes() == 1000);
  CHECK(corpus->files_read() == 1);
  CHECK(corpus->files_skipped() == 0);
  CHECK(to_string(corpus->train()) == text.substr(0, 900));
  CHECK(to_string(corpus->val()) == text.substr(900));

  options.val_fraction = 0.0;
  REQUIRE(load(dir.file("c.txt"), options, &corpus).ok());
  CHECK(corpus->train().size() == 1000);
  CHECK(corpus->val().empty());
}

TEST_CASE("learner shards are disjoint, near-equal and cover the training part", "[unit][train]") {
  TempDir dir;
  const std::string text = random_text(10007, 2);
  write_file(dir.file("c.txt"), text);
  for (int m : {1, 2, 3, 7}) {
    CorpusOptions options;
    options.block_size = 32;
    options.num_learners = m;
    std::string joined, val;
    std::set<size_t> sizes;
    for (int i = 0; i < m; i++) {
      options.learner = i;
      std::unique_ptr<Corpus> corpus;
      REQUIRE(load(dir.file("c.txt"), options, &corpus).ok());
      joined += to_string(corpus->train());
      sizes.insert(corpus->train().size());
      if (i == 0) val = to_string(corpus->val());
      CHECK(to_string(corpus->val()) == val);  // every learner validates on the same bytes
    }
    INFO(m << " learners");
    CHECK(joined == text.substr(0, 10007 - 1000));  // in order, no gap, no overlap
    CHECK(val == text.substr(10007 - 1000));
    CHECK(*sizes.rbegin() - *sizes.begin() <= 1);
  }
}

TEST_CASE("batch sampler depends only on seed and step", "[unit][train]") {
  const std::string text = random_text(5000, 3);
  const std::span<const uint8_t> data((const uint8_t*)text.data(), text.size());
  const int B = 4, T = 16;
  BatchSampler sampler(data, B, T, 42);
  auto batch = [](const BatchSampler& s, long step) {
    std::vector<int> in(B * T), tg(B * T);
    s.Sample(step, in.data(), tg.data());
    in.insert(in.end(), tg.begin(), tg.end());
    return in;
  };
  const std::vector<int> step7 = batch(sampler, 7);
  CHECK(batch(sampler, 3) != step7);
  CHECK(batch(sampler, 7) == step7);                       // after other calls too
  CHECK(batch(BatchSampler(data, B, T, 42), 7) == step7);  // a fresh (resumed) sampler
  CHECK(batch(BatchSampler(data, B, T, 43), 7) != step7);
}

TEST_CASE("batch windows stay in range and targets are inputs shifted by one", "[unit][train]") {
  const int B = 8, T = 16;
  SECTION("windows are real windows of the data") {
    const std::string text = random_text(3000, 4);
    const std::span<const uint8_t> data((const uint8_t*)text.data(), text.size());
    BatchSampler sampler(data, B, T, 5);
    std::vector<int> in(B * T), tg(B * T);
    for (long step = 0; step < 50; step++) {
      sampler.Sample(step, in.data(), tg.data());
      for (int b = 0; b < B; b++) {
        std::string window(T + 1, ' ');
        for (int t = 0; t < T; t++) window[t] = (char)in[b * T + t];
        window[T] = (char)tg[b * T + T - 1];
        for (int t = 0; t + 1 < T; t++) REQUIRE(tg[b * T + t] == in[b * T + t + 1]);
        REQUIRE(text.find(window) != std::string::npos);
      }
    }
  }
  SECTION("every start is reachable, none past the end") {
    // T + 3 bytes: exactly three windows, starting at 0, 1 and 2.
    std::string text(T + 3, 'a');
    for (int i = 0; i < T + 3; i++) text[i] = (char)i;
    const std::span<const uint8_t> data((const uint8_t*)text.data(), text.size());
    BatchSampler sampler(data, B, T, 6);
    std::vector<int> in(B * T), tg(B * T);
    std::set<int> starts;
    for (long step = 0; step < 20; step++) {
      sampler.Sample(step, in.data(), tg.data());
      for (int b = 0; b < B; b++) {
        const int start = in[b * T];
        REQUIRE(start <= 2);
        REQUIRE(tg[b * T + T - 1] == start + T);
        starts.insert(start);
      }
    }
    CHECK(starts == std::set<int>{0, 1, 2});
  }
}

TEST_CASE("corpus directory: sorted, hidden and binary files skipped", "[unit][train]") {
  TempDir dir;
  write_file(dir.file("b.txt"), "BBBB");
  write_file(dir.file("a/z.txt"), "ZZZZ");
  write_file(dir.file("a.txt"), "AAAA");
  write_file(dir.file("empty.txt"), "");
  write_file(dir.file(".hidden.txt"), "hidden");
  write_file(dir.file(".git/objects.txt"), "hidden dir");
  write_file(dir.file("index.dat"), std::string("\x01\x02\0\0binary", 10));
  fs::create_symlink(dir.file("b.txt"), dir.file("link.txt"));  // read once, as b.txt
  write_file(dir.file("padding.txt"), std::string(100, 'p'));
  std::unique_ptr<Corpus> corpus;
  CorpusOptions options;
  options.block_size = 8;
  options.val_fraction = 0.0;
  REQUIRE(load(dir.path().string(), options, &corpus).ok());
  CHECK(corpus->files_read() == 5);  // a/z, a.txt, b, empty, padding
  CHECK(corpus->files_skipped() == 1);
  // Path order compares element by element: "a/z.txt" before "a.txt".
  CHECK(to_string(corpus->train()) == "ZZZZAAAABBBB" + std::string(100, 'p'));
}

TEST_CASE("corpus directory with binary index files: /usr/share/games/fortunes", "[unit][train]") {
  const std::string path = "/usr/share/games/fortunes";
  if (!fs::is_directory(path)) {
    WARN(path << " is missing (apt-get install fortunes): test skipped");
    return;
  }
  size_t dat_files = 0;
  for (const auto& e : fs::directory_iterator(path))
    if (e.path().extension() == ".dat") dat_files++;
  std::unique_ptr<Corpus> corpus;
  const Status st = load(path, CorpusOptions(), &corpus);
  REQUIRE(st.message() == "");
  REQUIRE(st.ok());
  CHECK(corpus->files_skipped() == (int)dat_files);
  CHECK(corpus->files_read() > 0);
  CHECK(corpus->total_bytes() > 100000);
  const std::span<const uint8_t> train = corpus->train();
  CHECK(std::find(train.begin(), train.end(), 0) == train.end());
}

void require_error(const Status& st, const std::vector<std::string>& parts) {
  REQUIRE_FALSE(st.ok());
  for (const std::string& part : parts) {
    INFO("message: " << st.message());
    CHECK(st.message().find(part) != std::string::npos);
  }
}

TEST_CASE("corpus errors name the path and the fix", "[unit][train]") {
  TempDir dir;
  std::unique_ptr<Corpus> corpus;
  CorpusOptions options;
  options.block_size = 64;

  require_error(load(dir.file("nope.txt"), options, &corpus), {"nope.txt", "does not exist"});

  write_file(dir.file("empty.txt"), "");
  require_error(load(dir.file("empty.txt"), options, &corpus), {"empty.txt", "is empty"});

  write_file(dir.file("blob.bin"), std::string("ab\0cd", 5));
  require_error(load(dir.file("blob.bin"), options, &corpus), {"blob.bin", "not a text file"});

  fs::create_directories(dir.file("none"));
  require_error(load(dir.file("none"), options, &corpus), {"none", "no text files"});
  write_file(dir.file("none/x.dat"), std::string("\0\0\0", 3));
  write_file(dir.file("none/.hidden"), "text");
  require_error(load(dir.file("none"), options, &corpus), {"no text files", "1 binary"});

  write_file(dir.file("tiny.txt"), std::string(50, 'x'));
  require_error(load(dir.file("tiny.txt"), options, &corpus),
                {"tiny.txt", "has 50 bytes", "block_size + 1 = 65", "smaller model.block_size"});

  write_file(dir.file("small_val.txt"), std::string(300, 'x'));  // 30 bytes of validation
  require_error(load(dir.file("small_val.txt"), options, &corpus),
                {"small_val.txt", "30 bytes of validation", "65"});

  options.val_fraction = 0.0;
  options.num_learners = 6;  // 300 / 6 = 50 bytes a learner
  options.learner = 1;
  const Status st = load(dir.file("small_val.txt"), options, &corpus);
  REQUIRE_FALSE(st.ok());
  CHECK(st.message() == "corpus '" + dir.file("small_val.txt") +
                            "' has 50 bytes of training data for learner 1 of 6; it needs at "
                            "least block_size + 1 = 65: use a larger corpus or a smaller "
                            "model.block_size");

  options.learner = 6;
  require_error(load(dir.file("small_val.txt"), options, &corpus), {"learner 6 of 6"});
  options = CorpusOptions();
  options.val_fraction = 1.0;
  require_error(load(dir.file("small_val.txt"), options, &corpus), {"val_fraction"});

  if (geteuid() != 0) {
    write_file(dir.file("locked.txt"), std::string(1000, 'x'));
    fs::permissions(dir.file("locked.txt"), fs::perms::none);
    require_error(load(dir.file("locked.txt"), CorpusOptions(), &corpus),
                  {"locked.txt", "cannot read"});
  }
}

}  // namespace
}  // namespace diloco
