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

namespace diloco {
namespace {

// The bytes of tokens as little-endian uint16, as nanoGPT's prepare.py writes them.
std::string raw_tokens(const std::vector<uint16_t>& tokens) {
  std::string out;
  for (uint16_t t : tokens) {
    out.push_back((char)(t & 0xff));
    out.push_back((char)(t >> 8));
  }
  return out;
}

std::string le_int32(int32_t v) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; i++) out[i] = (char)(((uint32_t)v >> (8 * i)) & 0xff);
  return out;
}

// llm.c's layout: 256 int32 (magic, version, n, zeros), then the tokens.
std::string llmc_tokens(const std::vector<uint16_t>& tokens, int32_t version = 1, int64_t n = -1) {
  std::string header = le_int32(20240520) + le_int32(version) + le_int32((int32_t)(n < 0 ? tokens.size() : n));
  header.resize(1024, '\0');
  return header + raw_tokens(tokens);
}

std::vector<uint16_t> random_tokens(size_t n, int vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint16_t> out(n);
  for (uint16_t& t : out) t = (uint16_t)rng.below(vocab);
  return out;
}

CorpusOptions token_options(int vocab = 50257, int block_size = 16) {
  CorpusOptions options;
  options.format = DataFormat::kTokens;
  options.vocab_size = vocab;
  options.block_size = block_size;
  return options;
}

std::vector<uint16_t> to_vector(TokenSpan span) {
  std::vector<uint16_t> out;
  for (size_t i = 0; i < span.size(); i++) out.push_back((uint16_t)span[i]);
  return out;
}

TEST_CASE("token files in both layouts load and split like bytes", "[unit][train]") {
  TempDir dir;
  const std::vector<uint16_t> tokens = random_tokens(1000, 50257, 11);
  // Both edges of the vocabulary and a value with its high byte set.
  std::vector<uint16_t> expected = tokens;
  expected[0] = 0;
  expected[1] = 50256;
  expected[2] = 0x1234;
  write_file(dir.file("raw.bin"), raw_tokens(expected));
  write_file(dir.file("llmc.bin"), llmc_tokens(expected));
  for (const char* name : {"raw.bin", "llmc.bin"}) {
    INFO(name);
    std::unique_ptr<Corpus> corpus;
    const Status st = load(dir.file(name), token_options(), &corpus);
    REQUIRE(st.message() == "");
    CHECK(corpus->format() == DataFormat::kTokens);
    CHECK(corpus->total_tokens() == 1000);
    CHECK(corpus->total_bytes() == 2000);
    CHECK(corpus->files_read() == 1);
    CHECK(corpus->train_tokens().width() == 2);
    CHECK(to_vector(corpus->train_tokens()) == std::vector<uint16_t>(expected.begin(), expected.begin() + 900));
    CHECK(to_vector(corpus->val_tokens()) == std::vector<uint16_t>(expected.begin() + 900, expected.end()));
  }

  // Shards as for bytes: disjoint, in order, covering the training part.
  CorpusOptions options = token_options();
  options.num_learners = 3;
  std::vector<uint16_t> joined;
  for (int i = 0; i < 3; i++) {
    options.learner = i;
    std::unique_ptr<Corpus> corpus;
    REQUIRE(load(dir.file("llmc.bin"), options, &corpus).ok());
    const std::vector<uint16_t> shard = to_vector(corpus->train_tokens());
    joined.insert(joined.end(), shard.begin(), shard.end());
  }
  CHECK(joined == std::vector<uint16_t>(expected.begin(), expected.begin() + 900));
}

TEST_CASE("a token directory reads its .bin files in path order, both layouts mixed", "[unit][train]") {
  TempDir dir;
  const std::vector<uint16_t> a = random_tokens(300, 50257, 1), b = random_tokens(200, 50257, 2),
                              c = random_tokens(100, 50257, 3);
  write_file(dir.file("b.bin"), raw_tokens(b));
  write_file(dir.file("a/shard.bin"), llmc_tokens(a));
  write_file(dir.file("c.bin"), llmc_tokens(c));
  write_file(dir.file("README.md"), "not tokens");
  write_file(dir.file("meta.pkl"), "x");
  write_file(dir.file(".hidden.bin"), "odd");  // would be refused if read
  write_file(dir.file(".cache/x.bin"), "odd");
  fs::create_symlink(dir.file("b.bin"), dir.file("link.bin"));  // read once, as b.bin
  std::unique_ptr<Corpus> corpus;
  CorpusOptions options = token_options();
  options.val_fraction = 0.0;
  const Status st = load(dir.path().string(), options, &corpus);
  REQUIRE(st.message() == "");
  CHECK(corpus->files_read() == 3);
  CHECK(corpus->files_skipped() == 2);  // README.md, meta.pkl
  std::vector<uint16_t> expected = a;
  expected.insert(expected.end(), b.begin(), b.end());
  expected.insert(expected.end(), c.begin(), c.end());
  CHECK(to_vector(corpus->train_tokens()) == expected);

  fs::create_directories(dir.file("none"));
  write_file(dir.file("none/train.txt"), "text");
  require_error(load(dir.file("none"), options, &corpus), {"none", "no .bin token files", "1 other"});
}

TEST_CASE("sampled tokens are windows of the token data, below the vocabulary", "[unit][train]") {
  TempDir dir;
  const int vocab = 50257, B = 4, T = 16;
  const std::vector<uint16_t> tokens = random_tokens(5000, vocab, 21);
  write_file(dir.file("t.bin"), raw_tokens(tokens));
  std::unique_ptr<Corpus> corpus;
  REQUIRE(load(dir.file("t.bin"), token_options(vocab, T), &corpus).ok());
  BatchSampler sampler(corpus->train_tokens(), B, T, 7);
  std::vector<int> in(B * T), tg(B * T);
  int max_token = 0;
  for (long step = 0; step < 20; step++) {
    sampler.Sample(step, in.data(), tg.data());
    for (int b = 0; b < B; b++) {
      // Find the window by its first token pair and compare all of it.
      bool found = false;
      for (size_t s = 0; s + T < 4500 && !found; s++) {
        found = true;
        for (int t = 0; t < T && found; t++)
          found = tokens[s + t] == in[b * T + t] && tokens[s + t + 1] == tg[b * T + t];
      }
      REQUIRE(found);
    }
    for (int v : in) {
      REQUIRE(v >= 0);
      REQUIRE(v < vocab);
      max_token = std::max(max_token, v);
    }
  }
  CHECK(max_token > 255);  // the high bytes are there: not read as bytes
}

TEST_CASE("the byte sampler gives the same batches through a TokenSpan and rows slice the batch",
          "[unit][train]") {
  const std::string text = random_text(5000, 3);
  const std::span<const uint8_t> data((const uint8_t*)text.data(), text.size());
  const int B = 6, T = 16;
  BatchSampler bytes(data, B, T, 42), spans(TokenSpan(data), B, T, 42);
  std::vector<int> in(B * T), tg(B * T), in2(B * T), tg2(B * T);
  for (long step : {0L, 7L, 1000L}) {
    bytes.Sample(step, in.data(), tg.data());
    spans.Sample(step, in2.data(), tg2.data());
    CHECK(in == in2);
    CHECK(tg == tg2);
    // Ranks of a local ring: R = 3 slices of 2 rows, concatenated, are the batch.
    std::vector<int> rin, rtg;
    for (int r = 0; r < 3; r++) {
      std::vector<int> sin(2 * T), stg(2 * T);
      bytes.SampleRows(step, r * 2, 2, sin.data(), stg.data());
      rin.insert(rin.end(), sin.begin(), sin.end());
      rtg.insert(rtg.end(), stg.begin(), stg.end());
    }
    CHECK(rin == in);
    CHECK(rtg == tg);
    // Uneven slices too, and an empty one.
    std::vector<int> one(T), one_t(T);
    bytes.SampleRows(step, 5, 1, one.data(), one_t.data());
    CHECK(std::equal(one.begin(), one.end(), in.begin() + 5 * T));
    bytes.SampleRows(step, 6, 0, nullptr, nullptr);
  }

  // Bit-exact with the sampler as it was before TokenSpan: a golden batch.
  const std::string golden_text = "the quick brown fox jumps over the lazy dog";
  BatchSampler golden({(const uint8_t*)golden_text.data(), golden_text.size()}, 2, 4, 1);
  std::vector<int> gin(8), gtg(8);
  golden.Sample(3, gin.data(), gtg.data());
  Rng rng(mix_seed(1, 3));
  for (int b = 0; b < 2; b++) {
    const size_t start = rng.below(golden_text.size() - 4);
    for (int t = 0; t < 4; t++) {
      CHECK(gin[b * 4 + t] == (uint8_t)golden_text[start + t]);
      CHECK(gtg[b * 4 + t] == (uint8_t)golden_text[start + t + 1]);
    }
  }
}

TEST_CASE("token sampler rows slice the batch", "[unit][train]") {
  const std::vector<uint16_t> tokens = random_tokens(3000, 50257, 5);
  const TokenSpan data{std::span<const uint16_t>(tokens)};
  const int R = 4, B = 3, T = 8;
  BatchSampler sampler(data, R * B, T, 9);
  std::vector<int> in(R * B * T), tg(R * B * T), rin(R * B * T), rtg(R * B * T);
  sampler.Sample(12, in.data(), tg.data());
  for (int r = 0; r < R; r++) sampler.SampleRows(12, r * B, B, rin.data() + r * B * T, rtg.data() + r * B * T);
  CHECK(rin == in);
  CHECK(rtg == tg);
}

TEST_CASE("malformed token files are refused with the file, the offset and the reason", "[unit][train]") {
  TempDir dir;
  std::unique_ptr<Corpus> corpus;
  const std::vector<uint16_t> good = random_tokens(200, 1000, 31);
  auto refuse = [&](const std::string& name, const std::string& bytes, const std::vector<std::string>& parts,
                    const CorpusOptions& options = token_options()) {
    write_file(dir.file(name), bytes);
    INFO(name);
    std::vector<std::string> all = {"token file '" + dir.file(name) + "'"};
    all.insert(all.end(), parts.begin(), parts.end());
    require_error(load(dir.file(name), options, &corpus), all);
  };

  refuse("version.bin", llmc_tokens(good, 2), {"at byte 4:", "version is 2, expected 1"});
  refuse("short_n.bin", llmc_tokens(good, 1, 150),
         {"at byte 8:", "header says 150 tokens", "1324 bytes", "but it has 1424"});
  refuse("long_n.bin", llmc_tokens(good, 1, 201), {"at byte 8:", "header says 201 tokens"});
  refuse("negative_n.bin", llmc_tokens(good, 1, -1 & 0xffffffff), {"at byte 8:", "header says -1 tokens"});
  std::string truncated = llmc_tokens(good);
  truncated.pop_back();
  refuse("truncated.bin", truncated, {"at byte 8:", "but it has 1423"});
  refuse("header_only.bin", llmc_tokens(good).substr(0, 512), {"at byte 0:", "less than its 1024-byte header"});
  refuse("odd.bin", raw_tokens(good) + "x", {"at byte 400:", "odd length of 401 bytes"});

  // A token past the vocabulary: the first one, its offset and value, in both layouts.
  std::vector<uint16_t> bad = good;
  bad[37] = 1000;
  bad[90] = 60000;
  refuse("vocab_raw.bin", raw_tokens(bad), {"at byte 74:", "token 1000 is not below model.vocab_size 1000"},
         token_options(1000));
  refuse("vocab_llmc.bin", llmc_tokens(bad), {"at byte 1098:", "token 1000 is not below model.vocab_size 1000"},
         token_options(1000));
  refuse("vocab_50257.bin", raw_tokens(bad), {"at byte 180:", "token 60000 is not below model.vocab_size 50257"});

  // In a directory the message names the file inside it.
  fs::create_directories(dir.file("d"));
  write_file(dir.file("d/a.bin"), raw_tokens(good));
  write_file(dir.file("d/b.bin"), raw_tokens(good) + "x");
  require_error(load(dir.file("d"), token_options(), &corpus), {"token file '" + dir.file("d/b.bin") + "'", "odd"});

  // Too few tokens: counted in tokens, for the whole corpus, the validation part and a shard.
  write_file(dir.file("few.bin"), raw_tokens(std::vector<uint16_t>(10, 1)));
  require_error(load(dir.file("few.bin"), token_options(), &corpus),
                {"few.bin", "has 10 tokens", "block_size + 1 = 17"});
  write_file(dir.file("small_val.bin"), llmc_tokens(good));  // 20 tokens of validation
  require_error(load(dir.file("small_val.bin"), token_options(50257, 32), &corpus),
                {"small_val.bin", "20 tokens of validation", "33"});
  CorpusOptions sharded = token_options();
  sharded.val_fraction = 0;
  sharded.num_learners = 20;  // 10 tokens a learner
  require_error(load(dir.file("small_val.bin"), sharded, &corpus),
                {"small_val.bin", "has 10 tokens of training data for learner 0 of 20"});
  write_file(dir.file("empty.bin"), "");
  require_error(load(dir.file("empty.bin"), token_options(), &corpus), {"empty.bin", "has 0 tokens"});

  require_error(load(dir.file("missing.bin"), token_options(), &corpus),
                {"missing.bin", "does not exist", "uint16 token file"});
  require_error(load(dir.file("few.bin"), token_options(1), &corpus), {"vocab_size is 1"});
  require_error(load(dir.file("few.bin"), token_options(65537), &corpus), {"vocab_size is 65537"});
}

}  // namespace
}  // namespace diloco
