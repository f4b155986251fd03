#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "daemon/sync/fragments.h"
#include "kernels/gpt.h"

namespace diloco {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

TensorTable GptTable(int vocab, int block, int layers, int embd) {
  GptConfig config;
  config.vocab_size = vocab;
  config.block_size = block;
  config.n_layer = layers;
  config.n_embd = embd;
  config.n_head = 4;
  return gpt_tensor_table(config);
}

// shakespeare-m4.yaml's model.
TensorTable SmallGptTable() { return GptTable(256, 64, 4, 128); }

// GPT-2 124M: vocab 50257, context 1024, 12 layers of 768.
TensorTable Gpt2Table() { return GptTable(50257, 1024, 12, 768); }

TensorTable TableOf(const std::vector<std::pair<std::string, int>>& tensors) {
  TensorTable table;
  for (const auto& [name, numel] : tensors) table.add(name, {numel});
  return table;
}

std::vector<std::string> NamesOf(const Fragment& f) {
  std::vector<std::string> names;
  for (const FragmentRange& r : f.ranges) names.push_back(RangeName(r));
  return names;
}

std::vector<Fragment> Partition(const TensorTable& table, int p) {
  std::vector<Fragment> fragments;
  const Status status = PartitionFragments(table, p, &fragments);
  INFO(status.message());
  REQUIRE(status.ok());
  REQUIRE((int)fragments.size() == p);
  return fragments;
}

size_t PieceCount(const std::vector<Fragment>& fragments) {
  size_t pieces = 0;
  for (const Fragment& f : fragments) {
    for (const FragmentRange& r : f.ranges) pieces += r.piece;
  }
  return pieces;
}

// Every element of the buffer is in exactly one fragment; ranges are sorted
// and packed back to back; a range is a whole tensor or whole rows of one;
// the embedding flag follows the tensor.
void CheckCoversOnce(const TensorTable& table, const std::vector<Fragment>& fragments) {
  std::vector<uint8_t> owners(table.total_numel(), 0);
  for (size_t p = 0; p < fragments.size(); ++p) {
    const Fragment& f = fragments[p];
    CHECK(f.index == (int)p);
    REQUIRE_FALSE(f.ranges.empty());
    size_t packed = 0;
    for (size_t i = 0; i < f.ranges.size(); ++i) {
      const FragmentRange& r = f.ranges[i];
      INFO("fragment " << p << " range " << RangeName(r));
      if (i > 0) {
        const FragmentRange& prev = f.ranges[i - 1];
        CHECK(prev.offset + prev.numel <= r.offset);
        // Neighbouring pieces of one tensor are joined.
        if (prev.piece && r.piece && prev.tensor == r.tensor) CHECK(prev.row_end < r.row_begin);
      }
      CHECK(r.packed_offset == packed);
      packed += r.numel;
      const TensorInfo* t = table.find(r.tensor);
      REQUIRE(t != nullptr);
      CHECK(r.embedding == IsEmbeddingTensor(t->name));
      if (r.piece) {
        REQUIRE(t->shape.size() >= 2);
        const size_t rows = (size_t)t->shape[0], row_numel = t->numel / rows;
        CHECK(r.row_begin < r.row_end);
        CHECK(r.row_end <= rows);
        CHECK(r.row_end - r.row_begin < rows);  // a piece is never the whole tensor
        CHECK(r.offset == t->offset + r.row_begin * row_numel);
        CHECK(r.numel == (r.row_end - r.row_begin) * row_numel);
      } else {
        CHECK(r.row_begin == 0);
        CHECK(r.row_end == 0);
        CHECK(t->offset == r.offset);
        CHECK(t->numel == r.numel);
      }
      for (size_t k = r.offset; k < r.offset + r.numel; ++k) owners[k]++;
    }
    CHECK(f.numel == packed);
  }
  CHECK(std::all_of(owners.begin(), owners.end(), [](uint8_t n) { return n == 1; }));
}

TEST_CASE("sync: fragments: embeddings apart, the rest balanced largest-first", "[unit][sync]") {
  // wte 10, wpe 5 | a 8, b 7, c 6, d 5, e 4 into two bins:
  // a→1 (8), b→2 (7), c→2 (13), d→1 (13), e→1 on the tie (17). 17 <= 4/3 x 45/3.
  const TensorTable table =
      TableOf({{"wte", 10}, {"wpe", 5}, {"a", 8}, {"b", 7}, {"c", 6}, {"d", 5}, {"e", 4}});
  const std::vector<Fragment> fragments = Partition(table, 3);
  CheckCoversOnce(table, fragments);
  CHECK(NamesOf(fragments[0]) == std::vector<std::string>{"wte", "wpe"});
  CHECK(NamesOf(fragments[1]) == std::vector<std::string>{"a", "d", "e"});
  CHECK(NamesOf(fragments[2]) == std::vector<std::string>{"b", "c"});
  CHECK(fragments[0].ranges[0].embedding);
  CHECK(fragments[0].ranges[1].embedding);
  CHECK_FALSE(fragments[1].ranges[0].embedding);
  CHECK(fragments[1].numel == 17);
  CHECK(fragments[2].ranges[1].packed_offset == 7);
}

TEST_CASE("sync: fragments: the small configs keep the whole-tensor partition of before",
          "[unit][sync]") {
  // Digests of what PartitionFragments gave before tensors could be split
  // (commit f8ca230), for the models and P of configs/*.yaml and of the tests
  // that run fragments: none needs a cut, so none may change.
  struct Case {
    const char* what;
    TensorTable table;
    int p;
    uint64_t digest;
  };
  const std::vector<Case> cases = {
      {"shakespeare-m4.yaml", GptTable(256, 64, 4, 128), 4, 0x1b62dc8b7c5550ebULL},
      {"demo.yaml", GptTable(256, 128, 3, 128), 4, 0x3673414b3950ab54ULL},
      {"tiny.yaml, daemon e2e", GptTable(256, 32, 2, 32), 4, 0x751a7ac85f817dafULL},
      {"wan-example/job.yaml", GptTable(256, 1024, 12, 768), 4, 0xdbb68de67c5242ddULL},
      {"test_local_run", GptTable(256, 16, 1, 32), 2, 0x98097a29f0cdb8adULL},
      {"test_export", GptTable(256, 8, 2, 16), 2, 0x3ffb3af0e8f97a67ULL},
      {"small, P = 7", GptTable(256, 64, 4, 128), 7, 0x78ec1bb2a8f0e1acULL},
  };
  for (const Case& c : cases) {
    INFO(c.what << ", P = " << c.p);
    const std::vector<Fragment> fragments = Partition(c.table, c.p);
    CheckCoversOnce(c.table, fragments);
    CHECK(PieceCount(fragments) == 0);
    CHECK(NamesOf(fragments[0]) == std::vector<std::string>{"wte", "wpe"});
    CHECK(FragmentImbalance(fragments) <= kFragmentBalance);
    CHECK(FragmentsDigest(fragments) == c.digest);
  }
  // One layout spelled out (tiny.yaml).
  const std::vector<Fragment> tiny = Partition(GptTable(256, 32, 2, 32), 4);
  CHECK(NamesOf(tiny[1]) ==
        std::vector<std::string>{"h.0.ln_1.weight", "h.0.attn.c_proj.bias", "h.0.ln_2.bias",
                                 "h.0.mlp.c_fc.weight", "h.0.mlp.c_fc.bias", "h.1.ln_1.bias",
                                 "h.1.ln_2.bias", "h.1.mlp.c_proj.weight", "ln_f.bias"});
  CHECK(NamesOf(tiny[3]) ==
        std::vector<std::string>{"h.0.attn.c_attn.bias", "h.1.ln_1.weight",
                                 "h.1.attn.c_attn.weight", "h.1.attn.c_attn.bias",
                                 "h.1.attn.c_proj.weight", "h.1.ln_2.weight",
                                 "h.1.mlp.c_fc.weight", "ln_f.weight"});
}

TEST_CASE("sync: fragments of GPT-2 124M are balanced by cutting wte into row pieces",
          "[unit][sync]") {
  const TensorTable table = Gpt2Table();
  REQUIRE(table.total_numel() == 124439808);  // the LM head is tied to wte
  for (int p : {2, 4, 8, 12, 24, 48, 96}) {
    INFO("P = " << p);
    const std::vector<Fragment> fragments = Partition(table, p);
    const std::vector<Fragment> again = Partition(table, p);
    CheckCoversOnce(table, fragments);
    CHECK(FragmentsDigest(fragments) == FragmentsDigest(again));
    REQUIRE(fragments.size() == again.size());
    for (size_t f = 0; f < fragments.size(); ++f) CHECK(NamesOf(fragments[f]) == NamesOf(again[f]));
    const double imbalance = FragmentImbalance(fragments);
    size_t largest = 0, smallest = SIZE_MAX;
    for (const Fragment& f : fragments) {
      largest = std::max(largest, f.numel);
      smallest = std::min(smallest, f.numel);
    }
    WARN("GPT-2 124M, P = " << p << ": largest fragment / mean = " << imbalance << " (largest "
                             << largest << ", smallest " << smallest << ", mean "
                             << table.total_numel() / p << ", " << PieceCount(fragments)
                             << " row pieces)");
    CHECK(imbalance <= kFragmentBalance);
    // wte (31% of the model) is cut once it alone is above 4/3 of the mean
    // (P = 4 keeps the embeddings apart, at 1.27); its pieces stay embedding
    // ranges.
    size_t wte_numel = 0;
    for (const Fragment& f : fragments) {
      for (const FragmentRange& r : f.ranges) {
        if (r.tensor == "wte") {
          CHECK(r.embedding);
          wte_numel += r.numel;
        }
      }
    }
    CHECK(wte_numel == 50257u * 768u);
    if (3.0 * wte_numel * p > 4.0 * table.total_numel()) CHECK(PieceCount(fragments) >= 2);
  }
  // Before pieces, P = 24 put wte and wpe alone in fragment 0: 7.6x the mean.
  const std::vector<Fragment> fragments = Partition(table, 24);
  CHECK(FragmentsDigest(fragments) != 0xde366a81d582d2f3ULL);
  // A piece's name says its rows.
  for (const Fragment& f : fragments) {
    for (const FragmentRange& r : f.ranges) {
      if (!r.piece) continue;
      CHECK(RangeName(r) == r.tensor + "[" + std::to_string(r.row_begin) + ":" +
                                std::to_string(r.row_end) + "]");
    }
  }
}

TEST_CASE("sync: fragments: the whole-tensor rule never cuts a tensor", "[unit][sync]") {
  const TensorTable table = Gpt2Table();
  std::vector<Fragment> whole;
  REQUIRE(PartitionFragments(table, 24, &whole, PartitionRule::kWholeTensors).ok());
  CheckCoversOnce(table, whole);
  CHECK(PieceCount(whole) == 0);
  // The partition of before pieces: wte and wpe alone in fragment 0, 7.6x the mean.
  CHECK(FragmentsDigest(whole) == 0xde366a81d582d2f3ULL);
  CHECK(FragmentImbalance(whole) == Approx(7.6).margin(0.05));
  CHECK(FragmentImbalance(Partition(table, 24)) <= kFragmentBalance);
  // Where the whole-tensor partition is balanced (P = 4: 1.27), both rules give it.
  std::vector<Fragment> balanced, unbalanced;
  REQUIRE(PartitionFragments(table, 4, &balanced).ok());
  REQUIRE(PartitionFragments(table, 4, &unbalanced, PartitionRule::kWholeTensors).ok());
  CHECK(FragmentsDigest(balanced) == FragmentsDigest(unbalanced));
}

TEST_CASE("sync: fragments of the GPT are balanced and deterministic", "[unit][sync]") {
  const TensorTable table = SmallGptTable();
  for (int p : {1, 2, 3, 4, 7, 24, MaxFragments(table)}) {
    INFO("P = " << p);
    const std::vector<Fragment> fragments = Partition(table, p);
    const std::vector<Fragment> again = Partition(table, p);
    CheckCoversOnce(table, fragments);
    CHECK(FragmentsDigest(fragments) == FragmentsDigest(again));
    if (p == 1) {
      CHECK(fragments[0].numel == table.total_numel());
      CHECK(fragments[0].ranges.size() == table.tensors().size());
      continue;
    }
    const double imbalance = FragmentImbalance(fragments);
    INFO("largest / mean = " << imbalance);
    if (p == MaxFragments(table)) {
      // 51 fragments of 16k elements: a 1-D tensor or a row cannot be cut, so
      // only "better than whole tensors" (65536 = 4x the mean) is asked.
      CHECK(imbalance < 65536.0 * p / table.total_numel());
    } else {
      CHECK(imbalance <= kFragmentBalance);
    }
    // Numbered by where they start (after the embeddings' fragment when whole).
    const int first = PieceCount(fragments) == 0 && NamesOf(fragments[0]) ==
                                                        std::vector<std::string>{"wte", "wpe"}
                          ? 2
                          : 1;
    for (int f = first; f < p; ++f) {
      CHECK(fragments[f - 1].ranges.front().offset < fragments[f].ranges.front().offset);
    }
  }
  // P = 4 on this model: three nearly equal thirds of the blocks.
  const std::vector<Fragment> four = Partition(table, 4);
  CHECK(NamesOf(four[0]) == std::vector<std::string>{"wte", "wpe"});
  const size_t lo = std::min({four[1].numel, four[2].numel, four[3].numel});
  const size_t hi = std::max({four[1].numel, four[2].numel, four[3].numel});
  CHECK((double)hi / lo < 1.05);
  // P = 2: embeddings alone would leave 95% of the model in fragment 1, so the
  // embeddings join other tensors (no cut needed).
  const std::vector<Fragment> two = Partition(table, 2);
  CHECK(PieceCount(two) == 0);
  CHECK(NamesOf(two[0]).size() > 2);
  CHECK(FragmentImbalance(two) < 1.05);

  const std::vector<Fragment> three = Partition(table, 3);
  CHECK(FragmentsDigest(three) != FragmentsDigest(four));
}

TEST_CASE("sync: fragments: a cut tensor's pieces are even, and joined when they meet",
          "[unit][sync]") {
  // One 12 x 10 matrix and small vectors, P = 3: mean 60. Whole tensors give
  // 120 in one fragment; cap 60 cuts the matrix into rows [0:6) and [6:12).
  const TensorTable table = [] {
    TensorTable t;
    t.add("m", {12, 10});
    t.add("a", {30});
    t.add("b", {30});
    return t;
  }();
  const std::vector<Fragment> fragments = Partition(table, 3);
  CheckCoversOnce(table, fragments);
  CHECK(NamesOf(fragments[0]) == std::vector<std::string>{"m[0:6]"});
  CHECK(NamesOf(fragments[1]) == std::vector<std::string>{"m[6:12]"});
  CHECK(NamesOf(fragments[2]) == std::vector<std::string>{"a", "b"});
  CHECK(FragmentImbalance(fragments) == 1.0);
  // A fragment that gets every piece of a tensor holds it whole: a 1-D
  // tensor of 100 (never cut) in fragment 0 leaves fragment 1 every piece of m.
  TensorTable joined;
  joined.add("a", {100});
  joined.add("m", {4, 10});
  const std::vector<Fragment> two = Partition(joined, 2);
  CheckCoversOnce(joined, two);
  CHECK(PieceCount(two) == 0);
  CHECK(NamesOf(two[0]) == std::vector<std::string>{"a"});
  CHECK(NamesOf(two[1]) == std::vector<std::string>{"m"});
}

TEST_CASE("sync: the fragments digest covers pieces' rows", "[unit][sync]") {
  const TensorTable table = GptTable(50257, 256, 2, 64);
  std::vector<Fragment> fragments = Partition(table, 8);
  REQUIRE(PieceCount(fragments) > 0);
  const uint64_t digest = FragmentsDigest(fragments);
  for (Fragment& f : fragments) {
    for (FragmentRange& r : f.ranges) {
      if (!r.piece) continue;
      std::vector<Fragment> changed = fragments;
      FragmentRange& c = changed[f.index].ranges[&r - f.ranges.data()];
      c.row_end += 1;
      CHECK(FragmentsDigest(changed) != digest);
      c.row_end -= 1;
      c.piece = false;
      CHECK(FragmentsDigest(changed) != digest);
      c.piece = true;
      c.embedding = !c.embedding;
      CHECK(FragmentsDigest(changed) != digest);
      return;
    }
  }
}

TEST_CASE("sync: fragment counts out of range are clear errors", "[unit][sync]") {
  const TensorTable table = SmallGptTable();
  // wte+wpe share a fragment; 4 layers x 12 tensors + ln_f weight and bias.
  CHECK(MaxFragments(table) == 1 + 4 * 12 + 2);
  std::vector<Fragment> fragments;
  REQUIRE(PartitionFragments(table, MaxFragments(table), &fragments).ok());
  CheckCoversOnce(table, fragments);

  Status status = PartitionFragments(table, 52, &fragments);
  REQUIRE_FALSE(status.ok());
  CHECK(status.message() ==
        "cannot split the model into 52 fragments: it has 52 tensors, which make at most 51 "
        "fragments (the embeddings share one); lower sync.fragments");
  status = PartitionFragments(table, 0, &fragments);
  REQUIRE_FALSE(status.ok());
  CHECK_THAT(status.message(), StartsWith("cannot split the model into 0 fragments"));
  CHECK(fragments.size() == 51);  // untouched on error

  // Without embeddings every tensor can be its own fragment; 1-D tensors are
  // never cut, so these keep the whole-tensor partition.
  const TensorTable plain = TableOf({{"a", 3}, {"b", 2}, {"c", 1}});
  CHECK(MaxFragments(plain) == 3);
  fragments = Partition(plain, 3);
  CHECK(NamesOf(fragments[0]) == std::vector<std::string>{"a"});
  CHECK(NamesOf(fragments[2]) == std::vector<std::string>{"c"});
  fragments = Partition(plain, 2);
  CHECK(NamesOf(fragments[0]) == std::vector<std::string>{"a"});
  CHECK(NamesOf(fragments[1]) == std::vector<std::string>{"b", "c"});
  CHECK_FALSE(PartitionFragments(TableOf({{"wte", 4}, {"wpe", 4}}), 2, &fragments).ok());
}

TEST_CASE("sync: gather and scatter move a fragment between the flat buffer and its packed form",
          "[unit][sync]") {
  // A whole-tensor partition and one with row pieces (a GPT-2 vocabulary on a narrow model).
  for (const auto& [table, p] : {std::pair{SmallGptTable(), 4}, {GptTable(50257, 256, 2, 64), 8}}) {
    INFO("P = " << p);
    const std::vector<Fragment> fragments = Partition(table, p);
    std::vector<float> flat(table.total_numel());
    std::iota(flat.begin(), flat.end(), 0.0f);  // exact below 2^24
    REQUIRE(flat.size() < (1u << 24));

    const Fragment& f = fragments[2];
    const std::vector<float> packed = GatherFragment(f, flat.data());
    REQUIRE(packed.size() == f.numel);
    for (const FragmentRange& r : f.ranges) {
      CHECK(packed[r.packed_offset] == (float)r.offset);
      CHECK(packed[r.packed_offset + r.numel - 1] == (float)(r.offset + r.numel - 1));
    }
    // Scattering every fragment rebuilds the buffer; one fragment writes only its ranges.
    std::vector<float> rebuilt(flat.size(), -1.0f);
    ScatterFragment(f, packed.data(), rebuilt.data());
    CHECK(std::count(rebuilt.begin(), rebuilt.end(), -1.0f) == (long)(flat.size() - f.numel));
    for (const Fragment& g : fragments) {
      ScatterFragment(g, GatherFragment(g, flat.data()).data(), rebuilt.data());
    }
    CHECK(rebuilt == flat);
    if (p == 8) CHECK(PieceCount(fragments) > 0);
  }
}

TEST_CASE("sync: the cadence staggers fragments over the H inner steps", "[unit][sync]") {
  // Paper default: P = H, one fragment per step, round robin.
  for (long step = 1; step <= 48; ++step) {
    for (int p = 0; p < 24; ++p) CHECK(Fires(p, step, 24, 24) == (step % 24 == p));
  }
  // H = 25, P = 4: phases 0, 6, 12, 18.
  CHECK(FragmentPhase(0, 25, 4) == 0);
  CHECK(FragmentPhase(1, 25, 4) == 6);
  CHECK(FragmentPhase(2, 25, 4) == 12);
  CHECK(FragmentPhase(3, 25, 4) == 18);
  CHECK_FALSE(Fires(0, 0, 25, 4));  // nothing learned yet
  CHECK(Fires(0, 25, 25, 4));
  CHECK(Fires(0, 50, 25, 4));
  CHECK(Fires(1, 6, 25, 4));
  CHECK(Fires(1, 31, 25, 4));
  CHECK_FALSE(Fires(1, 25, 25, 4));
  // P = 1 (diloco): every H steps.
  CHECK(Fires(0, 10, 10, 1));
  CHECK_FALSE(Fires(0, 5, 10, 1));
  // The syncer's forecast: steps until the next firing, 1..H.
  CHECK(StepsUntilFires(0, 0, 25, 4) == 25);
  CHECK(StepsUntilFires(1, 0, 25, 4) == 6);
  CHECK(StepsUntilFires(1, 5, 25, 4) == 1);
  CHECK(StepsUntilFires(1, 6, 25, 4) == 25);
  CHECK(StepsUntilFires(3, 30, 25, 4) == 13);
  for (long done = 0; done < 60; ++done) {
    for (int p = 0; p < 4; ++p) {
      const long k = StepsUntilFires(p, done, 25, 4);
      CHECK(Fires(p, done + k, 25, 4));
      for (long j = 1; j < k; ++j) CHECK_FALSE(Fires(p, done + j, 25, 4));
    }
  }
  // Every fragment fires exactly once in any H consecutive steps, also for P > H.
  for (auto [h, p] : {std::pair{25, 4}, {2, 4}, {7, 3}, {1, 1}}) {
    for (int f = 0; f < p; ++f) {
      int fired = 0;
      for (long step = 100; step < 100 + h; ++step) fired += Fires(f, step, h, p);
      CHECK(fired == 1);
    }
  }
}

}  // namespace
TEST_CASE("LastFiring: the last step at or before a step at which a fragment fired", "[unit][sync][fragments]") {
  // H = 25, P = 4: phases 0, 6, 12, 18.
  CHECK(LastFiring(0, 0, 25, 4) == 0);
  CHECK(LastFiring(0, 24, 25, 4) == 0);  // step 0 never fires
  CHECK(LastFiring(0, 25, 25, 4) == 25);
  CHECK(LastFiring(0, 49, 25, 4) == 25);
  CHECK(LastFiring(1, 5, 25, 4) == 0);
  CHECK(LastFiring(1, 6, 25, 4) == 6);
  CHECK(LastFiring(1, 30, 25, 4) == 6);
  CHECK(LastFiring(1, 31, 25, 4) == 31);
  // Against Fires, for every step: it fires there, and not after it up to the step.
  for (auto [h, p] : {std::pair{25, 4}, {2, 4}, {7, 3}, {1, 1}}) {
    for (int f = 0; f < p; ++f) {
      for (long step = 0; step < 80; ++step) {
        const long last = LastFiring(f, step, h, p);
        if (last > 0) CHECK(Fires(f, last, h, p));
        for (long s = std::max(last + 1, 1L); s <= step; ++s) CHECK_FALSE(Fires(f, s, h, p));
      }
    }
  }
}

}  // namespace diloco
