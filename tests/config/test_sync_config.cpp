// The sync section and the learners list of the run config: nested keys,
// enums, a list of sections, and --set on nested paths and list items.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/config/run_config.h"

#include "tests/config/config_testing.h"
namespace diloco {
namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;
using Catch::Matchers::StartsWith;

using diloco::testing::ErrorOf;
using diloco::testing::kMinimal;
using diloco::testing::Parse;

// Every sync key set to a value other than its default.
const char* kFullSync = R"(data:
  corpus: /c.txt
sync:
  mode: streaming
  learners: 4
  fragments: 6
  inner_steps: 50
  overlap: 3
  quorum: 2
  grace:
    gamma: 0.25
    cap_ms: 500
  max_staleness: 2
  weighting: uniform
  merge: mean
  fold: mix
  alpha: 0.75
  codec: {up: fp32, down: bf16, block: 128, up_topk: 0.25, down_topk: 0.5, chunk: 1024, keep: 32, bits: 4,
          feedback: accumulate, decay: 0.9}
  outer:
    lr: 1.0
    momentum: 0.8
  link:
    bandwidth_mbps: 100
    latency_ms: 20
    jitter_ms: 5
    loss: 0.01
  heartbeat_timeout_ms: 1500
  norm_limit: 0
  checkpoint_every: 0
  merge_threads: 3
learners:
  - slowdown: 1
  - {slowdown: 3}
  -
)";

TEST_CASE("sync defaults keep single-learner runs unchanged", "[unit][config]") {
  RunConfig config;
  REQUIRE(Parse(kMinimal, {}, &config).ok());
  const SyncConfig& s = config.sync;
  CHECK(s == SyncConfig{});
  CHECK(config.learners.empty());
  CHECK(s.mode == SyncMode::kDecoupled);
  CHECK(s.learners == 1);
  CHECK(s.fragments == 4);
  CHECK(s.inner_steps == 25);
  CHECK(s.overlap == 2);
  CHECK(s.quorum == 1);
  CHECK(s.grace == GraceConfig{0.5, 2000});
  CHECK(s.max_staleness == 4);
  CHECK(s.weighting == Weighting::kTokens);
  CHECK(s.merge == MergeRule::kRda);
  CHECK(s.fold == FoldRule::kOverwrite);
  CHECK(s.alpha == 0.5);
  CHECK(s.codec == CodecConfig{CodecKind::kInt4, CodecKind::kInt8, 64});
  CHECK(s.outer == OuterConfig{0.7, 0.9});
  CHECK(s.link == LinkConfig{});
  CHECK(SlowdownOf(config.learners, 0) == 1.0);
}

TEST_CASE("every sync key is read and the YAML form round-trips", "[unit][config]") {
  RunConfig config;
  Status status = Parse(kFullSync, {}, &config);
  REQUIRE(status.message() == "");
  const SyncConfig& s = config.sync;
  CHECK(s.mode == SyncMode::kStreaming);
  CHECK(s.learners == 4);
  CHECK(s.fragments == 6);
  CHECK(s.inner_steps == 50);
  CHECK(s.overlap == 3);
  CHECK(s.quorum == 2);
  CHECK(s.grace == GraceConfig{0.25, 500});
  CHECK(s.max_staleness == 2);
  CHECK(s.weighting == Weighting::kUniform);
  CHECK(s.merge == MergeRule::kMean);
  CHECK(s.fold == FoldRule::kMix);
  CHECK(s.alpha == 0.75);
  CHECK(s.codec ==
        CodecConfig{CodecKind::kFp32, CodecKind::kBf16, 128, 0.25, 0.5, 1024, 32, 4, FeedbackRule::kAccumulate, 0.9});
  CHECK(s.outer == OuterConfig{1.0, 0.8});
  CHECK(s.link == LinkConfig{100, 20, 5, 0.01});
  CHECK(s.heartbeat_timeout_ms == 1500);
  CHECK(s.norm_limit == 0);
  CHECK(s.checkpoint_every == 0);
  CHECK(s.merge_threads == 3);
  // The empty third item keeps its defaults.
  CHECK(config.learners == std::vector<LearnerConfig>{{1.0}, {3.0}, {1.0}});
  CHECK(SlowdownOf(config.learners, 1) == 3.0);
  CHECK(SlowdownOf(config.learners, 3) == 1.0);

  const std::string yaml = RunConfigToYaml(config);
  INFO(yaml);
  CHECK_THAT(yaml, Contains("mode: streaming"));
  CHECK_THAT(yaml, Contains("  grace:\n    gamma: 0.25\n    cap_ms: 500\n"));
  CHECK_THAT(yaml, Contains("up: fp32"));
  CHECK_THAT(yaml, Contains("learners:\n  - slowdown: 1\n    jitter: 0\n  - slowdown: 3\n    jitter: 0\n"));
  RunConfig again;
  REQUIRE(ParseRunConfig(yaml, "resolved.yaml", "/elsewhere", {}, &again).message() == "");
  CHECK(again == config);

  // An empty list is written as [] and reads back empty.
  RunConfig defaults;
  defaults.data.corpus = "/c.txt";
  const std::string plain = RunConfigToYaml(defaults);
  CHECK_THAT(plain, Contains("learners: []"));
  REQUIRE(ParseRunConfig(plain, "d.yaml", "", {}, &again).ok());
  CHECK(again == defaults);
}

TEST_CASE("set reaches nested keys and list items", "[unit][config]") {
  RunConfig config;
  REQUIRE(Parse(kMinimal,
                {"sync.learners=4", "sync.grace.gamma=0.25", "sync.codec.up=fp32",
                 "sync.mode=diloco", "learners.2.slowdown=3", "sync.outer={lr: 1.0}"},
                &config)
              .message() == "");
  CHECK(config.sync.grace.gamma == 0.25);
  CHECK(config.sync.grace.cap_ms == 2000);
  CHECK(config.sync.codec.up == CodecKind::kFp32);
  CHECK(config.sync.mode == SyncMode::kDiloco);
  CHECK(config.sync.outer == OuterConfig{1.0, 0.9});
  // Items before the one set are created with their defaults.
  CHECK(config.learners == std::vector<LearnerConfig>{{1.0}, {1.0}, {3.0}});

  // Into a list from the file: replace an item's key, append one.
  REQUIRE(Parse(kFullSync, {"learners.1.slowdown=2", "learners.3.slowdown=5"}, &config).ok());
  CHECK(config.learners == std::vector<LearnerConfig>{{1.0}, {2.0}, {1.0}, {5.0}});
  // The whole list, then one of its items.
  REQUIRE(Parse(kFullSync, {"learners=[{slowdown: 4}]", "learners.0.slowdown=6"}, &config).ok());
  CHECK(config.learners == std::vector<LearnerConfig>{{6.0}});
  REQUIRE(Parse(kFullSync, {"learners=[]"}, &config).ok());
  CHECK(config.learners.empty());
  // A file whose sync section is empty, or whose list is empty.
  REQUIRE(Parse("sync:\nlearners:\n" + std::string(kMinimal),
                {"sync.grace.cap_ms=0", "sync.learners=2", "learners.1.slowdown=2"}, &config)
              .ok());
  CHECK(config.sync.grace.cap_ms == 0);
  CHECK(config.learners == std::vector<LearnerConfig>{{1.0}, {2.0}});
  // The grace window's step time, its cap in steps and the forecast: defaults, then set.
  CHECK(config.sync.grace.step_time == GraceStepTime::kSlowest);
  CHECK(config.sync.grace.cap_steps == 0);
  CHECK(config.sync.grace.forecast);
  REQUIRE(Parse(kFullSync, {"sync.grace.step_time=mean", "sync.grace.cap_steps=1", "sync.grace.forecast=false"},
                &config)
              .ok());
  CHECK(config.sync.grace.step_time == GraceStepTime::kMean);
  CHECK(config.sync.grace.cap_steps == 1);
  CHECK_FALSE(config.sync.grace.forecast);
  const std::string yaml = RunConfigToYaml(config);
  CHECK_THAT(yaml, Contains("    cap_steps: 1\n    step_time: mean\n    forecast: false\n"));
  CHECK_THAT(ErrorOf(kMinimal, {"sync.grace.step_time=fastest"}), Contains("slowest, mean"));

  // The frontier's options (issue 17): age-aware scaling, anchor, LR clock, momentum restart,
  // step-time noise.
  CHECK(config.sync.age_power == 0);
  CHECK(config.sync.anchor == Anchor::kBase);
  CHECK(config.sync.lr_clock == LrClock::kLocal);
  CHECK(config.sync.outer.restart_every == 0);
  REQUIRE(Parse(kFullSync,
                {"sync.age_power=0.5", "sync.anchor=current", "sync.partial=share", "sync.lr_clock=global", "sync.outer.restart_every=4",
                 "learners.2.jitter=0.1"},
                &config)
              .message() == "");
  CHECK(config.sync.age_power == 0.5);
  CHECK(config.sync.anchor == Anchor::kCurrent);
  CHECK(config.sync.partial == PartialRound::kShare);
  CHECK(config.sync.lr_clock == LrClock::kGlobal);
  CHECK(config.sync.outer.restart_every == 4);
  CHECK(config.learners[2].jitter == 0.1);
  RunConfig again;
  REQUIRE(ParseRunConfig(RunConfigToYaml(config), "again.yaml", "", {}, &again).ok());
  CHECK(again == config);
  CHECK_THAT(ErrorOf(kMinimal, {"sync.anchor=latest"}), Contains("base, current"));
  CHECK_THAT(ErrorOf(kMinimal, {"sync.lr_clock=wall"}), Contains("local, global"));
}

TEST_CASE("the mode decides fragments and quorum", "[unit][config]") {
  SyncConfig s;
  s.learners = 4;
  s.fragments = 6;
  s.quorum = 2;
  s.mode = SyncMode::kDecoupled;
  CHECK(EffectiveFragments(s) == 6);
  CHECK(EffectiveQuorum(s) == 2);
  CHECK(UsesGraceWindow(s.mode));
  s.mode = SyncMode::kStreaming;
  CHECK(EffectiveFragments(s) == 6);
  CHECK(EffectiveQuorum(s) == 4);
  CHECK_FALSE(UsesGraceWindow(s.mode));
  s.mode = SyncMode::kDiloco;
  CHECK(EffectiveFragments(s) == 1);
  CHECK(EffectiveQuorum(s) == 4);
  CHECK(ToString(SyncMode::kDiloco) == "diloco");
  CHECK(ToString(FoldRule::kReplay) == "replay");
}

TEST_CASE("unknown nested keys name the place, the path and the known keys", "[unit][config]") {
  const std::string head = std::string(kMinimal) + "sync:\n";  // sync's keys from line 4
  CHECK(ErrorOf(head + "  grace:\n    gama: 1\n") ==
        "run.yaml:5:5: unknown key 'sync.grace.gama'; known keys in 'sync.grace': gamma, "
        "cap_ms, cap_steps, step_time, forecast, straggler_ratio; did you mean 'gamma'?");
  CHECK_THAT(ErrorOf(head + "  quorom: 2\n"),
             StartsWith("run.yaml:4:3: unknown key 'sync.quorom'; known keys in 'sync': mode, "
                        "learners, fragments, syncers, inner_steps, overlap, quorum, grace, "));
  CHECK_THAT(ErrorOf(head + "  quorom: 2\n"), Contains("did you mean 'quorum'?"));
  CHECK(ErrorOf(std::string(kMinimal) + "learners:\n  - {slowdwn: 2}\n") ==
        "run.yaml:4:6: unknown key 'learners.0.slowdwn'; known keys in 'learners.0': slowdown, jitter, link; "
        "did you mean 'slowdown'?");
  CHECK_THAT(ErrorOf(head + "  grace: {gamma: 1}\n  grace: {cap_ms: 1}\n"),
             StartsWith("run.yaml:5:3: key 'sync.grace' appears twice; merge its keys into one"));
  CHECK_THAT(ErrorOf(kMinimal, {"sync.link.bandwith_mbps=1"}),
             StartsWith("--set sync.link.bandwith_mbps=1: unknown key 'sync.link.bandwith_mbps'; "
                        "known keys in 'sync.link': bandwidth_mbps, latency_ms, jitter_ms, loss"));
  CHECK_THAT(ErrorOf(kMinimal, {"snyc.mode=ddp"}),
             StartsWith("--set snyc.mode=ddp: unknown section 'snyc'; known sections: model, data, "
                        "train, eval, sync, learners, placement, timing, chaos; did you mean 'sync'?"));
}

TEST_CASE("nested values of the wrong type or spelling say what is expected", "[unit][config]") {
  const std::string head = std::string(kMinimal) + "sync:\n";
  CHECK(ErrorOf(head + "  mode: fast\n") ==
        "run.yaml:4:9: sync.mode: expected one of ddp, diloco, streaming, decoupled, got 'fast'");
  CHECK_THAT(ErrorOf(head + "  mode: decoupld\n"), EndsWith("did you mean 'decoupled'?"));
  CHECK(ErrorOf(kMinimal, {"sync.codec.up=in4"}) ==
        "--set sync.codec.up=in4: sync.codec.up: expected one of fp32, bf16, int8, int4, topk_chunked, got "
        "'in4'; did you mean 'int4'?");
  CHECK_THAT(ErrorOf(kMinimal, {"sync.weighting=[tokens]"}),
             StartsWith("--set sync.weighting=[tokens]: sync.weighting: expected one of tokens, "
                        "uniform, got a sequence"));
  CHECK_THAT(ErrorOf(head + "  merge: RDA\n"), Contains("expected one of rda, mean"));
  CHECK_THAT(ErrorOf(head + "  fold: x\n"), Contains("expected one of overwrite, replay, mix"));
  CHECK(ErrorOf(head + "  grace: 5\n") ==
        "run.yaml:4:10: sync.grace: expected a section (a mapping of keys), got '5'");
  CHECK_THAT(ErrorOf(head + "  grace:\n    gamma: [1]\n"),
             StartsWith("run.yaml:5:12: sync.grace.gamma: expected a number, got a sequence"));
  CHECK(ErrorOf(std::string(kMinimal) + "learners: {slowdown: 3}\n") ==
        "run.yaml:3:11: learners: expected a list of sections (keys: slowdown, jitter, link), e.g. learners: "
        "[{slowdown: ...}], got a mapping");
  CHECK(ErrorOf(std::string(kMinimal) + "learners: [{slowdown: 2}, 3]\n") ==
        "run.yaml:3:27: learners.1: expected a section (a mapping of keys), got '3'");
  CHECK_THAT(ErrorOf(std::string(kMinimal) + "learners:\n  - slowdown: fast\n"),
             StartsWith("run.yaml:4:15: learners.0.slowdown: expected a number, got 'fast'"));
  // --set into a file section of the wrong kind leaves the report to the reader.
  CHECK(ErrorOf(head + "  grace: 5\n", {"sync.grace.gamma=0.1"}) ==
        "run.yaml:4:10: sync.grace: expected a section (a mapping of keys), got '5'");
  CHECK_THAT(ErrorOf(std::string(kMinimal) + "learners: 5\n", {"learners.0.slowdown=2"}),
             StartsWith("run.yaml:3:11: learners: expected a list of sections"));
}

TEST_CASE("bad --set paths name the argument and the fix", "[unit][config]") {
  CHECK(ErrorOf(kMinimal, {"sync.grace.gamma.x=1"}) ==
        "--set sync.grace.gamma.x=1: unknown key 'sync.grace.gamma.x': 'sync.grace.gamma' is a "
        "value, not a section");
  CHECK(ErrorOf(kMinimal, {"learners.0.slowdown.x=1"}) ==
        "--set learners.0.slowdown.x=1: unknown key 'learners.0.slowdown.x': "
        "'learners.0.slowdown' is a value, not a section");
  CHECK(ErrorOf(kMinimal, {"learners.x.slowdown=3"}) ==
        "--set learners.x.slowdown=3: 'x' is not an index into the list 'learners' (0, 1, ... up "
        "to 9999)");
  CHECK_THAT(ErrorOf(kMinimal, {"learners.10000.slowdown=3"}),
             StartsWith("--set learners.10000.slowdown=3: '10000' is not an index"));
  CHECK_THAT(ErrorOf(kMinimal, {"learners.-1=3"}), Contains("'-1' is not an index"));
  CHECK(ErrorOf(kMinimal, {"sync..mode=ddp"}) ==
        "--set sync..mode=ddp: 'sync..mode' is not a key path; join its parts with single dots, "
        "e.g. --set sync.grace.gamma=0.5");
  CHECK_THAT(ErrorOf(kMinimal, {"learners.0=3"}),
             StartsWith("--set learners.0=3: learners.0: expected a section (a mapping of keys), "
                        "got '3'"));
}

TEST_CASE("invalid sync values name the key and the limit", "[unit][config]") {
  struct Case {
    std::vector<std::string> set;
    std::string message;  // after "--set <last>: "
  };
  const std::vector<Case> cases = {
      {{"sync.learners=0"}, "sync.learners: must be >= 1, got 0"},
      {{"sync.fragments=0"}, "sync.fragments: must be >= 1, got 0"},
      {{"sync.inner_steps=0"}, "sync.inner_steps: must be >= 1, got 0"},
      {{"sync.overlap=-1"}, "sync.overlap: must be >= 0, got -1"},
      {{"sync.overlap=25"},
       "sync.overlap: 25 is not less than sync.inner_steps 25: a fragment's delta must be back "
       "before the fragment fires again; lower overlap or raise inner_steps"},
      {{"sync.quorum=0"}, "sync.quorum: must be >= 1, got 0"},
      {{"sync.quorum=2"},
       "sync.quorum: 2 is greater than sync.learners 1; lower quorum or add learners"},
      {{"sync.syncers=0"}, "sync.syncers: must be >= 1, got 0"},
      {{"sync.syncers=5"},
       "sync.syncers: 5 shards for 4 fragments: a shard owns at least one fragment; lower sync.syncers or raise "
       "sync.fragments"},
      {{"sync.mode=diloco", "sync.syncers=2"},
       "sync.syncers: 2 shards for 1 fragment (sync.mode diloco runs one): a shard owns at least one fragment; "
       "lower sync.syncers or raise sync.fragments"},
      {{"sync.grace.gamma=1.5"}, "sync.grace.gamma: must be in [0, 1], got 1.5"},
      {{"sync.grace.cap_ms=-1"},
       "sync.grace.cap_ms: must be >= 0 (0 turns the grace window off), got -1"},
      {{"sync.grace.cap_steps=-1"},
       "sync.grace.cap_steps: must be >= 0 (inner steps; 0 = sync.grace.cap_ms alone), got -1"},
      {{"sync.max_staleness=-1"},
       "sync.max_staleness: must be >= 0 (0 = only deltas based on the current version), got -1"},
      {{"sync.alpha=2"}, "sync.alpha: must be in [0, 1], got 2"},
      {{"sync.codec.block=0"}, "sync.codec.block: must be even, in [2, 65536] (values per scale; int4 packs two per byte), got 0"},
      {{"sync.codec.block=63"}, "sync.codec.block: must be even, in [2, 65536] (values per scale; int4 packs two per byte), got 63"},
      {{"sync.codec.up_topk=1"},
       "sync.codec.up_topk: must be 0 (dense) or in (0, 1) (the share of each tensor's values sent), got 1"},
      {{"sync.codec.down_topk=-0.1"},
       "sync.codec.down_topk: must be 0 (dense) or in (0, 1) (the share of each tensor's values sent), got -0.1"},
      {{"sync.codec.chunk=4095"}, "sync.codec.chunk: must be even, in [2, 65536] (values per topk_chunked chunk), got 4095"},
      {{"sync.codec.keep=0"}, "sync.codec.keep: must be >= 1 (values kept of each chunk), got 0"},
      {{"sync.codec.chunk=32"}, "sync.codec.keep: 64 is greater than sync.codec.chunk 32; keep fewer values or use larger chunks"},
      {{"sync.codec.bits=3"}, "sync.codec.bits: must be 2, 4 or 8 (bits of each kept value), got 3"},
      {{"sync.codec.decay=0"}, "sync.codec.decay: must be in (0, 1] (the accumulator's decay), got 0"},
      {{"sync.codec.decay=1.5"}, "sync.codec.decay: must be in (0, 1] (the accumulator's decay), got 1.5"},
      {{"sync.codec.up=topk_chunked", "sync.codec.up_topk=0.1"},
       "sync.codec.up_topk: must be 0 with sync.codec.up: topk_chunked (it picks its own values)"},
      {{"sync.outer.lr=0"}, "sync.outer.lr: must be > 0, got 0"},
      {{"sync.outer.momentum=1"}, "sync.outer.momentum: must be in [0, 1), got 1"},
      {{"sync.link.bandwidth_mbps=-1"},
       "sync.link.bandwidth_mbps: must be >= 0 (0 = unlimited), got -1"},
      {{"sync.link.latency_ms=-1"}, "sync.link.latency_ms: must be >= 0, got -1"},
      {{"sync.link.jitter_ms=-1"}, "sync.link.jitter_ms: must be >= 0, got -1"},
      {{"sync.link.loss=1"}, "sync.link.loss: must be in [0, 1), got 1"},
      {{"sync.heartbeat_timeout_ms=0"}, "sync.heartbeat_timeout_ms: must be >= 1, got 0"},
      {{"sync.norm_limit=0.5"}, "sync.norm_limit: must be 0 (off) or > 1, got 0.5"},
      {{"sync.checkpoint_every=-1"},
       "sync.checkpoint_every: must be >= 0 (0 = only at the end), got -1"},
      {{"sync.merge_threads=0"}, "sync.merge_threads: must be in [1, 64] (threads of one merge), got 0"},
      {{"sync.age_power=-1"}, "sync.age_power: must be in [0, 8] (0 = no age-aware scaling), got -1"},
      {{"sync.outer.restart_every=-2"},
       "sync.outer.restart_every: must be >= 0 (merges of a fragment between momentum restarts; 0 = never), got -2"},
      {{"sync.learners=2", "learners.1.jitter=-0.1"},
       "learners.1.jitter: must be in [0, 10] (mean extra fraction of a step; 0 = no noise), got -0.1"},
      {{"sync.merge_threads=65"}, "sync.merge_threads: must be in [1, 64] (threads of one merge), got 65"},
      {{"sync.learners=2", "learners.1.slowdown=0.5"},
       "learners.1.slowdown: must be >= 1 (1 = full speed), got 0.5"},
      {{"learners.1.slowdown=2"},
       "learners: has 2 entries but sync.learners is 1; remove entries or raise sync.learners"},
  };
  for (const Case& c : cases) {
    INFO(c.set.back());
    CHECK_THAT(ErrorOf(kMinimal, c.set), StartsWith("--set " + c.set.back() + ": " + c.message));
  }
  // ddp ignores the cadence, so overlap may exceed it there.
  RunConfig config;
  CHECK(Parse(kMinimal, {"sync.mode=ddp", "sync.inner_steps=1"}, &config).ok());

  // In a file the message points at the value.
  CHECK(ErrorOf(std::string(kMinimal) + "sync:\n  grace:\n    gamma: 2\n") ==
        "run.yaml:5:12: sync.grace.gamma: must be in [0, 1], got 2");
  CHECK(ErrorOf(std::string(kMinimal) + "learners:\n  - slowdown: 0\n") ==
        "run.yaml:4:15: learners.0.slowdown: must be >= 1 (1 = full speed), got 0");
  CHECK_THAT(ErrorOf(std::string(kMinimal) + "learners: [{}, {}]\n"),
             StartsWith("run.yaml:3:11: learners: has 2 entries but sync.learners is 1"));
}

TEST_CASE("the shipped configs get the sync defaults", "[unit][config]") {
  const fs::path source = DILOCO_SOURCE_DIR;
  for (const char* name : {"shakespeare-char.yaml", "demo.yaml", "tiny.yaml"}) {
    INFO(name);
    RunConfig config;
    REQUIRE(LoadRunConfig((source / "configs" / name).string(), {}, &config).message() == "");
    if (std::string(name) != "demo.yaml") CHECK(config.sync == SyncConfig{});
    CHECK(config.learners.empty());
  }
}

// The override lists scripts/bench/parity.sh applies to configs/shakespeare-m4.yaml: a baseline
// recipe (one KEY=VALUE a line) or a frontier point (NAME | KEY=VALUE ...). A misspelt key would
// only show twenty minutes into a sweep.
std::vector<std::vector<std::string>> OverrideListsOf(const fs::path& file) {
  std::vector<std::vector<std::string>> lists;
  std::ifstream in(file);
  const bool points = file.extension() == ".points";
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (!points) {
      if (lists.empty()) lists.emplace_back();
      lists.back().push_back(line);
      continue;
    }
    const size_t bar = line.find('|');
    REQUIRE(bar != std::string::npos);
    std::istringstream words(line.substr(bar + 1));
    std::vector<std::string>& sets = lists.emplace_back();
    for (std::string w; words >> w;) sets.push_back(w);
  }
  return lists;
}

TEST_CASE("every baseline recipe and frontier point applies to the shipped config", "[unit][config]") {
  const fs::path source = DILOCO_SOURCE_DIR;
  int lists = 0;
  for (const auto& entry : fs::directory_iterator(source / "configs" / "baselines")) {
    for (const std::vector<std::string>& sets : OverrideListsOf(entry.path())) {
      std::string joined;
      for (const std::string& set : sets) joined += " " + set;
      INFO(entry.path().filename().string() << ":" << joined);
      RunConfig config;
      CHECK(LoadRunConfig((source / "configs" / "shakespeare-m4.yaml").string(), sets, &config).message() == "");
      lists++;
    }
  }
  CHECK(lists >= 30);
}

}  // namespace
}  // namespace diloco
