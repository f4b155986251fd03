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

TensorTable SmallGptTable() {
  GptConfig config;
  config.vocab_size = 256;
  config.block_size = 64;
  config.n_layer = 4;
  config.n_embd = 128;
  config.n_head = 4;
  return gpt_tensor_table(config);
}

TensorTable TableOf(const std::vector<std::pair<std::string, int>>& tensors) {
  TensorTable table;
  for (const auto& [name, numel] : tensors) table.add(name, {numel});
  return table;
}

std::vector<std::string> NamesOf(const Fragment& f) {
  std::vector<std::string> names;
  for (const FragmentRange& r : f.ranges) names.push_back(r.tensor);
  return names;
}

// Every element of the buffer is in exactly one fragment; ranges are sorted
// and packed back to back.
void CheckCoversOnce(const TensorTable& table, const std::vector<Fragment>& fragments) {
  std::vector<int> owners(table.total_numel(), 0);
  for (size_t p = 0; p < fragments.size(); ++p) {
    const Fragment& f = fragments[p];
    CHECK(f.index == (int)p);
    REQUIRE_FALSE(f.ranges.empty());
    size_t packed = 0;
    for (size_t i = 0; i < f.ranges.size(); ++i) {
      const FragmentRange& r = f.ranges[i];
      if (i > 0) CHECK(f.ranges[i - 1].offset < r.offset);
      CHECK(r.packed_offset == packed);
      packed += r.numel;
      const TensorInfo* t = table.find(r.tensor);
      REQUIRE(t != nullptr);
      CHECK(t->offset == r.offset);
      CHECK(t->numel == r.numel);
      for (size_t k = r.offset; k < r.offset + r.numel; ++k) owners[k]++;
    }
    CHECK(f.numel == packed);
  }
  CHECK(std::all_of(owners.begin(), owners.end(), [](int n) { return n == 1; }));
}

TEST_CASE("sync: fragments: embeddings apart, the rest balanced largest-first", "[unit][sync]") {
  // wte 10, wpe 5 | a 8, b 7, c 6, d 5, e 4 into two bins:
  // a→1 (8), b→2 (7), c→2 (13), d→1 (13), e→1 on the tie (17).
  const TensorTable table =
      TableOf({{"wte", 10}, {"wpe", 5}, {"a", 8}, {"b", 7}, {"c", 6}, {"d", 5}, {"e", 4}});
  std::vector<Fragment> fragments;
  REQUIRE(PartitionFragments(table, 3, &fragments).ok());
  REQUIRE(fragments.size() == 3);
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

TEST_CASE("sync: fragments of the GPT are balanced and deterministic", "[unit][sync]") {
  const TensorTable table = SmallGptTable();
  for (int p : {1, 2, 3, 4, 7, 24}) {
    INFO("P = " << p);
    std::vector<Fragment> fragments, again;
    REQUIRE(PartitionFragments(table, p, &fragments).ok());
    REQUIRE(PartitionFragments(table, p, &again).ok());
    REQUIRE((int)fragments.size() == p);
    CheckCoversOnce(table, fragments);
    CHECK(FragmentsDigest(fragments) == FragmentsDigest(again));
    if (p == 1) {
      CHECK(fragments[0].numel == table.total_numel());
      CHECK(fragments[0].ranges.size() == table.tensors().size());
      continue;
    }
    CHECK(NamesOf(fragments[0]) == std::vector<std::string>{"wte", "wpe"});
    // LPT is within 4/3 of the best split, which is at least the mean and at
    // least the largest tensor.
    size_t rest = 0, largest_load = 0, largest_tensor = 0;
    for (int f = 1; f < p; ++f) {
      rest += fragments[f].numel;
      largest_load = std::max(largest_load, fragments[f].numel);
      for (const FragmentRange& r : fragments[f].ranges) {
        largest_tensor = std::max(largest_tensor, r.numel);
      }
    }
    const double bound = std::max((double)rest / (p - 1), (double)largest_tensor) * 4.0 / 3.0;
    CHECK(largest_load <= bound);
    // Numbered by where they start.
    for (int f = 2; f < p; ++f) {
      CHECK(fragments[f - 1].ranges.front().offset < fragments[f].ranges.front().offset);
    }
  }
  // P = 4 on this model: three nearly equal thirds of the blocks.
  std::vector<Fragment> four;
  REQUIRE(PartitionFragments(table, 4, &four).ok());
  const size_t lo = std::min({four[1].numel, four[2].numel, four[3].numel});
  const size_t hi = std::max({four[1].numel, four[2].numel, four[3].numel});
  CHECK((double)hi / lo < 1.05);

  std::vector<Fragment> three;
  REQUIRE(PartitionFragments(table, 3, &three).ok());
  CHECK(FragmentsDigest(three) != FragmentsDigest(four));
}

TEST_CASE("sync: fragment counts out of range are clear errors", "[unit][sync]") {
  const TensorTable table = SmallGptTable();
  // wte+wpe share a fragment; 4 layers x 12 tensors + ln_f weight and bias.
  CHECK(MaxFragments(table) == 1 + 4 * 12 + 2);
  std::vector<Fragment> fragments;
  CHECK(PartitionFragments(table, MaxFragments(table), &fragments).ok());
  for (size_t p = 1; p < fragments.size(); ++p) CHECK(fragments[p].ranges.size() == 1);

  Status status = PartitionFragments(table, 52, &fragments);
  REQUIRE_FALSE(status.ok());
  CHECK(status.message() ==
        "cannot split the model into 52 fragments: it has 52 tensors, which make at most 51 "
        "fragments (the embeddings share one); lower sync.fragments");
  status = PartitionFragments(table, 0, &fragments);
  REQUIRE_FALSE(status.ok());
  CHECK_THAT(status.message(), StartsWith("cannot split the model into 0 fragments"));
  CHECK(fragments.size() == 51);  // untouched on error

  // Without embeddings every tensor can be its own fragment.
  const TensorTable plain = TableOf({{"a", 3}, {"b", 2}, {"c", 1}});
  CHECK(MaxFragments(plain) == 3);
  REQUIRE(PartitionFragments(plain, 3, &fragments).ok());
  CHECK(NamesOf(fragments[0]) == std::vector<std::string>{"a"});
  CHECK(NamesOf(fragments[2]) == std::vector<std::string>{"c"});
  REQUIRE(PartitionFragments(plain, 2, &fragments).ok());
  CHECK(NamesOf(fragments[0]) == std::vector<std::string>{"a"});
  CHECK(NamesOf(fragments[1]) == std::vector<std::string>{"b", "c"});
  CHECK_FALSE(PartitionFragments(TableOf({{"wte", 4}, {"wpe", 4}}), 2, &fragments).ok());
}

TEST_CASE("sync: gather and scatter move a fragment between the flat buffer and its packed form",
          "[unit][sync]") {
  const TensorTable table = SmallGptTable();
  std::vector<Fragment> fragments;
  REQUIRE(PartitionFragments(table, 4, &fragments).ok());
  std::vector<float> flat(table.total_numel());
  std::iota(flat.begin(), flat.end(), 0.0f);

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
}  // namespace diloco
