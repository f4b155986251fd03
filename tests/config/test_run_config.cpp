#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "daemon/config/run_config.h"

#include "tests/temp_dir.h"
#include "tests/config/config_testing.h"
namespace diloco {
namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

using diloco::testing::TempDir;

using diloco::testing::ErrorOf;
using diloco::testing::kMinimal;
using diloco::testing::Parse;

// A config with every key set to a value other than its default.
const char* kFull = R"(model:
  n_layer: 6
  n_embd: 96
  n_head: 3
  block_size: 128
  vocab_size: 50257
data:
  corpus: "/data/my corpus: x.txt"
  format: tokens
  val_fraction: 0.05
train:
  batch_size: 32
  steps: 5000
  lr: 3e-4
  min_lr: 3.0e-5
  warmup_steps: 0
  lr_decay_steps: 4000
  weight_decay: 0.0
  beta1: 0.8
  beta2: 0.95
  eps: 1e-6
  grad_clip: 0
  seed: 18446744073709551615
  threads: 2
  checkpoint_every: 500
  log_every: 1
  device: cuda:1
  ranks: 4
eval:
  every: 100
  batches: 7
)";

TEST_CASE("defaults fill the keys a file leaves out", "[unit][config]") {
  RunConfig config;
  REQUIRE(Parse(kMinimal, {}, &config).ok());
  RunConfig expected;
  expected.data.corpus = "/base/dir/corpus.txt";
  CHECK(config == expected);
  CHECK(config.model.n_layer == 4);
  CHECK(config.model.n_embd == 128);
  CHECK(config.train.lr == 1e-3);
  CHECK(config.train.seed == 1337);
  CHECK(config.eval.batches == 20);
  CHECK(config.model.vocab_size == 256);
  CHECK(config.data.format == DataFormat::kBytes);
  CHECK(config.train.device == "cpu");
  CHECK(config.train.ranks == 1);
}

TEST_CASE("every key is read and the YAML form round-trips", "[unit][config]") {
  RunConfig config;
  Status status = Parse(kFull, {}, &config);
  REQUIRE(status.message() == "");
  CHECK(config.model == ModelConfig{6, 96, 3, 128, 50257});
  CHECK(config.data.corpus == "/data/my corpus: x.txt");
  CHECK(config.data.format == DataFormat::kTokens);
  CHECK(config.data.val_fraction == 0.05);
  CHECK(config.train.batch_size == 32);
  CHECK(config.train.steps == 5000);
  CHECK(config.train.lr == 3e-4);
  CHECK(config.train.min_lr == 3e-5);
  CHECK(config.train.warmup_steps == 0);
  CHECK(config.train.lr_decay_steps == 4000);
  CHECK(config.train.weight_decay == 0.0);
  CHECK(config.train.beta1 == 0.8);
  CHECK(config.train.beta2 == 0.95);
  CHECK(config.train.eps == 1e-6);
  CHECK(config.train.grad_clip == 0.0);
  CHECK(config.train.seed == 18446744073709551615ull);
  CHECK(config.train.threads == 2);
  CHECK(config.train.checkpoint_every == 500);
  CHECK(config.train.log_every == 1);
  CHECK(config.train.device == "cuda:1");
  CHECK(config.train.ranks == 4);
  CHECK(config.eval.every == 100);
  CHECK(config.eval.batches == 7);

  // Doubles that have no short decimal form survive the trip too.
  config.train.lr = 0.1 + 0.2;
  config.train.min_lr = 1.0 / 3.0 * 1e-4;
  const std::string yaml = RunConfigToYaml(config);
  INFO(yaml);
  CHECK_THAT(yaml, Contains("corpus:"));
  CHECK_THAT(yaml, Contains("log_every: 1"));
  CHECK_THAT(yaml, Contains("vocab_size: 50257"));
  CHECK_THAT(yaml, Contains("format: tokens"));
  CHECK_THAT(yaml, Contains("device: cuda:1"));
  CHECK_THAT(yaml, Contains("ranks: 4"));
  RunConfig again;
  REQUIRE(ParseRunConfig(yaml, "resolved.yaml", "/elsewhere", {}, &again).ok());
  CHECK(again == config);

  RunConfig defaults;
  defaults.data.corpus = "/c.txt";
  REQUIRE(ParseRunConfig(RunConfigToYaml(defaults), "d.yaml", "", {}, &again).ok());
  CHECK(again == defaults);
}

TEST_CASE("an empty section or file keeps the defaults", "[unit][config]") {
  RunConfig config;
  REQUIRE(Parse("train:\n  # lr: 1\ndata: {corpus: a}\n", {}, &config).ok());
  CHECK(config.train == TrainConfig{});
  REQUIRE(Parse("", {"data.corpus=/a"}, &config).ok());
  CHECK(config.data.corpus == "/a");
}

TEST_CASE("set overrides replace file values, creates sections, and resolves paths against the cwd",
          "[unit][config]") {
  RunConfig config;
  REQUIRE(Parse("model:\n  n_layer: 2\n" + std::string(kMinimal),
                {"model.n_layer=6", "train.lr=3e-4", "eval.every=50", "train.lr=5e-4",
                 "train.seed=7", "data.val_fraction=0.2", " train.steps = 10"},
                &config)
              .ok());
  CHECK(config.model.n_layer == 6);
  CHECK(config.train.lr == 5e-4);  // the later --set wins
  CHECK(config.eval.every == 50);  // the file has no eval section
  CHECK(config.train.seed == 7);
  CHECK(config.train.steps == 10);
  CHECK(config.data.val_fraction == 0.2);
  CHECK(config.data.corpus == "/base/dir/corpus.txt");

  REQUIRE(Parse(kMinimal, {"data.corpus=texts/../a.txt"}, &config).ok());
  CHECK(config.data.corpus == (fs::current_path() / "a.txt").string());
  REQUIRE(Parse(kMinimal, {"data.corpus=\"/quoted path/b.txt\""}, &config).ok());
  CHECK(config.data.corpus == "/quoted path/b.txt");
  REQUIRE(Parse("model: {n_head: 2}", {"data.corpus=/x"}, &config).ok());
  CHECK(config.data.corpus == "/x");
}

TEST_CASE("a relative corpus in a file resolves against the file's directory", "[unit][config]") {
  TempDir dir;
  std::string path = dir.Write("sub/run.yaml", "data:\n  corpus: ../texts/./a.txt\n");
  RunConfig config;
  REQUIRE(LoadRunConfig(path, {}, &config).ok());
  CHECK(config.data.corpus == (dir.path() / "texts/a.txt").lexically_normal().string());

  REQUIRE(Parse("data:\n  corpus: ../x/y.txt\n", {}, &config).ok());
  CHECK(config.data.corpus == "/base/x/y.txt");
}

TEST_CASE("unknown keys and sections name the place, the key and the known keys",
          "[unit][config]") {
  const std::string text =
      "model:\n"        // 1
      "  n_layer: 2\n"  // 2
      "data:\n"         // 3
      "  corpus: a\n"   // 4
      "\n"              // 5
      "train:\n"        // 6
      "  lrr: 0.1\n";   // 7
  std::string message = ErrorOf(text);
  CHECK_THAT(message, StartsWith("run.yaml:7:3: unknown key 'train.lrr'; known keys in 'train': "
                                 "batch_size, steps, lr, min_lr,"));
  CHECK_THAT(message, Contains("did you mean 'lr'?"));

  message = ErrorOf(std::string(kMinimal) + "optim:\n  lr: 1\n");
  CHECK_THAT(message, StartsWith("run.yaml:3:1: unknown section 'optim'; known sections: "
                                 "model, data, train, eval"));

  message = ErrorOf(std::string(kMinimal) + "evl: {every: 1}\n");
  CHECK_THAT(message, Contains("'evl'"));
  CHECK_THAT(message, Contains("did you mean 'eval'?"));

  CHECK_THAT(ErrorOf(kMinimal, {"train.stpes=1"}), Contains("did you mean 'steps'?"));
  CHECK_THAT(ErrorOf(kMinimal, {"train.x=1"}), !Contains("did you mean"));

  message = ErrorOf(std::string(kMinimal) + "train:\n  lr: 0.1\n  lr: 0.2\n");
  CHECK_THAT(message, StartsWith("run.yaml:5:3: key 'train.lr' appears twice"));
}

TEST_CASE("values of the wrong type name the place, the key and what was expected",
          "[unit][config]") {
  const std::string head = std::string(kMinimal) + "train:\n";  // train.* keys are on line 4
  CHECK(ErrorOf(head + "  steps: abc\n") ==
        "run.yaml:4:10: train.steps: expected an integer (32-bit, no decimal point or exponent), "
        "got 'abc'");
  CHECK_THAT(ErrorOf(head + "  steps: 1.5\n"),
             StartsWith("run.yaml:4:10: train.steps: expected an integer"));
  CHECK_THAT(ErrorOf(head + "  steps: 1e3\n"), Contains("got '1e3'"));
  CHECK_THAT(ErrorOf(head + "  steps: 99999999999\n"),
             Contains("train.steps: expected an integer"));
  CHECK_THAT(ErrorOf(head + "  steps: {a: 1}\n"),
             StartsWith("run.yaml:4:10: train.steps: expected an integer"));
  CHECK_THAT(ErrorOf(head + "  steps: {a: 1}\n"), Contains("got a mapping"));
  CHECK_THAT(ErrorOf(head + "  steps: [1]\n"), Contains("got a sequence"));
  CHECK_THAT(ErrorOf(head + "  steps:\n"), Contains("train.steps: expected an integer"));
  CHECK(ErrorOf(head + "  lr: fast\n") == "run.yaml:4:7: train.lr: expected a number, got 'fast'");
  CHECK_THAT(ErrorOf(head + "  lr: .nan\n"), Contains("train.lr: expected a number"));
  CHECK_THAT(ErrorOf(head + "  seed: -1\n"),
             StartsWith("run.yaml:4:9: train.seed: expected a non-negative integer"));
  CHECK_THAT(ErrorOf("data:\n  corpus: [a, b]\n"),
             StartsWith("run.yaml:2:11: data.corpus: expected a path, got a sequence"));
  CHECK_THAT(ErrorOf(std::string(kMinimal) + "train: 5\n"),
             StartsWith("run.yaml:3:8: train: expected a section (a mapping of keys), got '5'"));
  CHECK_THAT(ErrorOf("- a\n- b\n"),
             StartsWith("run.yaml:1:1: expected a mapping of sections (model, data, train, eval, "
                        "sync, learners, placement, timing, chaos)"));

  // Accepted number forms.
  RunConfig config;
  REQUIRE(Parse(head + "  lr: 3\n  min_lr: 0.5\n  eps: 1e-3\n  steps: +7\n", {}, &config).ok());
  CHECK(config.train.lr == 3.0);
  CHECK(config.train.min_lr == 0.5);
  CHECK(config.train.eps == 1e-3);
  CHECK(config.train.steps == 7);
}

TEST_CASE("invalid values name the key and the limit", "[unit][config]") {
  struct Case {
    std::string set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"model.n_head=5", "model.n_head: 5 does not divide model.n_embd 128"},
      {"model.n_layer=0", "model.n_layer: must be >= 1, got 0"},
      {"model.n_embd=-4", "model.n_embd: must be >= 1, got -4"},
      {"model.n_head=0", "model.n_head: must be >= 1, got 0"},
      {"model.block_size=0", "model.block_size: must be >= 1, got 0"},
      {"train.batch_size=0", "train.batch_size: must be >= 1, got 0"},
      {"train.hosts=0", "train.hosts: must be >= 1 (the hosts of the site the learner's ring spans), got 0"},
      {"train.shard=optimizer", "train.shard: optimizer shards the learner's state over its ring, and a ring of 1 "
                                "rank has nothing to shard"},
      {"train.shard=zero3", "train.shard"},
      {"train.recompute=yes", "train.recompute"},
      {"train.outer_state=disk", "train.outer_state"},
      {"train.outer_state=host", "train.outer_state: host moves a GPU learner's outer-sync state to pinned host "
                                 "memory; train.device cpu keeps it in host memory already"},
      {"train.steps=-1", "train.steps: must be >= 0, got -1"},
      {"train.lr=-0.1", "train.lr: must be >= 0, got -0.1"},
      {"train.min_lr=0.01", "train.min_lr: 0.01 is greater than train.lr 0.001"},
      {"data.val_fraction=0", "data.val_fraction: must be in (0, 0.5], got 0"},
      {"data.val_fraction=0.6", "data.val_fraction: must be in (0, 0.5], got 0.6"},
      {"train.beta1=1", "train.beta1: must be in [0, 1), got 1"},
      {"train.beta2=-0.5", "train.beta2: must be in [0, 1), got -0.5"},
      {"train.grad_clip=-1", "train.grad_clip: must be >= 0 (0 turns clipping off), got -1"},
      {"train.eps=0", "train.eps: must be > 0, got 0"},
      {"train.threads=-2", "train.threads: must be >= 0 (0 uses all cores), got -2"},
      {"eval.batches=0", "eval.batches: must be >= 1, got 0"},
      {"eval.every=-1", "eval.every: must be >= 0 (0 = only at the end), got -1"},
      {"train.warmup_steps=-1", "train.warmup_steps: must be >= 0, got -1"},
      {"train.log_every=0", "train.log_every: must be >= 1, got 0"},
  };
  for (const Case& c : cases) {
    INFO(c.set);
    CHECK_THAT(ErrorOf(kMinimal, {c.set}), StartsWith("--set " + c.set + ": " + c.message));
  }
  // Relations between keys also say how to fix them.
  CHECK_THAT(ErrorOf(kMinimal, {"train.min_lr=0.01"}), Contains("; lower min_lr or raise lr"));
  CHECK_THAT(ErrorOf(kMinimal, {"model.n_head=5"}), Contains("n_embd / n_head is a whole number"));

  // In a file the message points at the value.
  CHECK_THAT(ErrorOf(std::string(kMinimal) + "model:\n  n_embd: 100\n  n_head: 3\n"),
             StartsWith("run.yaml:5:11: model.n_head: 3 does not divide model.n_embd 100"));
  CHECK_THAT(ErrorOf(std::string(kMinimal) + "model:\n  n_embd: 102\n"),
             StartsWith("run.yaml:4:11: model.n_head: 4 does not divide model.n_embd 102"));
  CHECK_THAT(ErrorOf(std::string(kMinimal) + "train:\n  lr: 1e-5\n"),
             StartsWith("run.yaml:4:7: train.min_lr: 1e-04 is greater than train.lr 1e-05"));
}

TEST_CASE("a missing corpus says what it must be", "[unit][config]") {
  CHECK_THAT(ErrorOf("model:\n  n_layer: 2\n"),
             StartsWith("run.yaml: data.corpus is required: the path of a text file or a "
                        "directory of text files"));
  CHECK_THAT(ErrorOf("data:\n  corpus: ''\n"),
             StartsWith("run.yaml:2:11: data.corpus is required"));
  CHECK_THAT(ErrorOf("data:\n  corpus:\n"), Contains("data.corpus is required"));
  CHECK_THAT(ErrorOf(kMinimal, {"data.corpus="}),
             StartsWith("--set data.corpus=: data.corpus is required"));
}

TEST_CASE("YAML syntax errors carry yaml-cpp's position", "[unit][config]") {
  std::string message = ErrorOf("data:\n  corpus: a\ntrain:\n  lr: [1, 2\n");
  CHECK_THAT(message, StartsWith("run.yaml:"));
  CHECK_THAT(message, Contains("invalid YAML"));
  message = ErrorOf("data:\n  corpus: a\n   bad: indent\n");
  CHECK_THAT(message, StartsWith("run.yaml:3:"));
  CHECK_THAT(message, Contains("invalid YAML"));
}

TEST_CASE("bad --set arguments name the argument", "[unit][config]") {
  CHECK(ErrorOf(kMinimal, {"train.lr"}) ==
        "--set 'train.lr': expected key=value, e.g. --set train.lr=3e-4");
  CHECK_THAT(ErrorOf(kMinimal, {"=3"}), StartsWith("--set '=3': expected key=value"));
  CHECK(ErrorOf(kMinimal, {"train.lr=abc"}) ==
        "--set train.lr=abc: train.lr: expected a number, got 'abc'");
  CHECK_THAT(ErrorOf(kMinimal, {"train.lrr=1"}),
             StartsWith("--set train.lrr=1: unknown key 'train.lrr'; known keys in 'train':"));
  CHECK_THAT(ErrorOf(kMinimal, {"optim.lr=1"}),
             StartsWith("--set optim.lr=1: unknown section 'optim'; known sections:"));
  CHECK_THAT(ErrorOf(kMinimal, {"train=5"}),
             StartsWith("--set train=5: train: expected a section"));
  CHECK_THAT(ErrorOf(kMinimal, {"train.steps=1.5"}),
             StartsWith("--set train.steps=1.5: train.steps: expected an integer"));
  CHECK_THAT(ErrorOf(kMinimal, {"train.lr=[1"}), StartsWith("--set train.lr=[1: train.lr:"));
}

TEST_CASE("LoadRunConfig reports the file path and missing files", "[unit][config]") {
  TempDir dir;
  const std::string path = dir.Write("run.yaml", "data:\n  corpus: a.txt\ntrain:\n  steps: abc\n");
  RunConfig config;
  Status status = LoadRunConfig(path, {}, &config);
  REQUIRE_FALSE(status.ok());
  CHECK_THAT(status.message(), StartsWith(path + ":4:10: train.steps: expected an integer"));

  const std::string missing = (dir.path() / "x.yaml").string();
  status = LoadRunConfig(missing, {}, &config);
  REQUIRE_FALSE(status.ok());
  CHECK(status.message() == "cannot read run config '" + missing + "': No such file or directory");

  status = LoadRunConfig(dir.path().string(), {}, &config);
  REQUIRE_FALSE(status.ok());
  CHECK_THAT(status.message(), StartsWith("cannot read run config"));

  // On error *out is left as it was.
  config.model.n_layer = 42;
  REQUIRE_FALSE(LoadRunConfig(path, {}, &config).ok());
  CHECK(config.model.n_layer == 42);
}

TEST_CASE("the shipped configs load", "[unit][config]") {
  const fs::path source = DILOCO_SOURCE_DIR;
  const std::string shakespeare =
      (source / "../shared/data/tinyshakespeare.txt").lexically_normal().string();
  RunConfig config;

  Status status = LoadRunConfig((source / "configs/shakespeare-char.yaml").string(), {}, &config);
  REQUIRE(status.message() == "");
  CHECK(config.model == ModelConfig{4, 128, 4, 64});
  CHECK(config.data.corpus == shakespeare);
  CHECK(config.train.batch_size == 12);
  CHECK(config.train.steps == 2000);
  CHECK(config.train.lr == 1e-3);
  CHECK(config.train.min_lr == 1e-4);
  CHECK(config.train.lr_decay_steps == 2000);
  CHECK(config.train.beta2 == 0.99);
  CHECK(config.eval.every == 250);
  CHECK(config.eval.batches == 20);

  status = LoadRunConfig((source / "configs/demo.yaml").string(), {}, &config);
  REQUIRE(status.message() == "");
  CHECK(config.model == ModelConfig{3, 128, 4, 128});
  CHECK(config.data.corpus == "/usr/share/games/fortunes");
  CHECK(config.train.steps == 800);
  CHECK(config.train.lr == 2e-3);
  CHECK(config.eval.every == 200);

  status = LoadRunConfig((source / "configs/tiny.yaml").string(), {"train.steps=10"}, &config);
  REQUIRE(status.message() == "");
  CHECK(config.model == ModelConfig{2, 32, 4, 32});
  CHECK(config.data.corpus == shakespeare);
  CHECK(config.train.batch_size == 4);
  CHECK(config.train.steps == 10);
  CHECK(config.eval.every == 25);
  CHECK(config.eval.batches == 2);
}

}  // namespace
}  // namespace diloco

namespace diloco {
namespace {

TEST_CASE("placement names a syncer site and one site per learner", "[unit][config]") {
  RunConfig config;
  REQUIRE(Parse(std::string(kMinimal) + "sync: {learners: 2}\nplacement: {syncer: s, learners: [a, b]}\n", {},
                &config)
              .message() == "");
  CHECK(config.placement.syncer == std::vector<std::string>{"s"});
  CHECK(config.placement.learners == std::vector<std::string>{"a", "b"});
  // It survives the round trip through the resolved YAML a daemon stores.
  RunConfig again;
  REQUIRE(Parse(RunConfigToYaml(config), {}, &again).message() == "");
  CHECK(again == config);
  // Absent: local mode only.
  REQUIRE(Parse(kMinimal, {}, &config).ok());
  CHECK(config.placement.empty());
  REQUIRE(Parse(RunConfigToYaml(config), {}, &again).ok());
  CHECK(again.placement.empty());

  CHECK_THAT(ErrorOf(std::string(kMinimal) + "sync: {learners: 3}\nplacement: {syncer: s, learners: [a, b]}\n"),
             StartsWith("run.yaml:4:"));
  CHECK_THAT(ErrorOf(std::string(kMinimal) + "sync: {learners: 3}\nplacement: {syncer: s, learners: [a, b]}\n"),
             Catch::Contains("placement.learners: names 2 sites but sync.learners is 3"));
  CHECK_THAT(ErrorOf(kMinimal, {"placement.learners=[a]"}), Catch::Contains("placement.syncer: is required"));
  CHECK_THAT(ErrorOf(kMinimal, {"placement.syncer=s", "placement.learners=[a b]"}),
             Catch::Contains("'a b' is not a site name"));
  CHECK_THAT(ErrorOf(std::string(kMinimal) + "placement: {sycner: s}\n"),
             StartsWith("run.yaml:3:13: unknown key 'placement.sycner'"));
}

TEST_CASE("placement.syncer names one site for every shard or one site per shard", "[unit][config]") {
  const std::string sharded = std::string(kMinimal) + "sync: {learners: 2, fragments: 4, syncers: 2}\n";
  RunConfig config;
  REQUIRE(Parse(sharded + "placement: {syncer: [s, t], learners: [a, b]}\n", {}, &config).message() == "");
  CHECK(config.placement.syncer == std::vector<std::string>{"s", "t"});
  CHECK(config.placement.SyncerSite(1) == "t");
  CHECK(config.placement.ShardsOn("t", 2) == std::vector<int>{1});
  RunConfig again;
  REQUIRE(Parse(RunConfigToYaml(config), {}, &again).message() == "");
  CHECK(again == config);
  // One site: both shards there (its daemon runs both, on its listen ports + 0 and + 1).
  REQUIRE(Parse(sharded + "placement: {syncer: s, learners: [a, b]}\n", {}, &config).message() == "");
  CHECK(config.placement.ShardsOn("s", 2) == std::vector<int>{0, 1});
  CHECK(RunConfigToYaml(config).find("syncer: s\n") != std::string::npos);  // written as it was given
  // A list whose length is not S; a name that is no site.
  CHECK_THAT(ErrorOf(sharded + "placement: {syncer: [s, t, u], learners: [a, b]}\n"),
             Catch::Contains("placement.syncer: names 3 sites but sync.syncers is 2; give one site (every shard "
                             "there) or one per shard"));
  CHECK_THAT(ErrorOf(sharded + "placement: {syncer: [s, 't u'], learners: [a, b]}\n"),
             Catch::Contains("placement.syncer: 't u' is not a site name"));
  CHECK_THAT(ErrorOf(sharded + "placement: {syncer: {a: 1}, learners: [a, b]}\n"),
             Catch::Contains("a name or a list of names"));
}

}  // namespace
}  // namespace diloco

namespace diloco {
namespace {

TEST_CASE("device, ranks, vocabulary and data format", "[unit][config]") {
  RunConfig config;
  REQUIRE(Parse(kMinimal,
                {"train.device=cuda:2", "train.ranks=3", "data.format=tokens", "model.vocab_size=50257"},
                &config)
              .message() == "");
  CHECK(config.train.device == "cuda:2");
  CHECK(config.train.ranks == 3);
  CHECK(config.data.format == DataFormat::kTokens);
  CHECK(config.model.vocab_size == 50257);
  RunConfig again;
  REQUIRE(Parse(RunConfigToYaml(config), {}, &again).message() == "");
  CHECK(again == config);

  // The edges of the vocabulary range.
  REQUIRE(Parse(kMinimal, {"data.format=tokens", "model.vocab_size=2"}, &config).ok());
  REQUIRE(Parse(kMinimal, {"data.format=tokens", "model.vocab_size=65536"}, &config).ok());
  REQUIRE(Parse(kMinimal, {"data.format=tokens"}, &config).ok());  // 256 is a valid token vocabulary
  REQUIRE(Parse(kMinimal, {"train.device=cuda"}, &config).ok());
  REQUIRE(Parse(kMinimal, {"train.device=cpu", "train.ranks=16"}, &config).ok());
  REQUIRE(Parse(kMinimal, {"train.ranks=2", "train.shard=gradients", "train.recompute=true"}, &config).ok());
  CHECK(config.train.shard == ShardMode::kGradients);
  CHECK(config.train.recompute);
  CHECK(RunConfigToYaml(config).find("shard: gradients") != std::string::npos);
  REQUIRE(Parse(kMinimal, {"train.device=cuda:1", "train.outer_state=host"}, &config).ok());
  CHECK(config.train.outer_state == OuterStatePlace::kHost);
  CHECK(RunConfigToYaml(config).find("outer_state: host") != std::string::npos);
  // ddp's ring is every learner's ranks.
  REQUIRE(Parse(kMinimal, {"sync.mode=ddp", "sync.learners=2", "train.shard=optimizer"}, &config).ok());

  // Each bad value names the place, the key and the rule.
  const std::string head = std::string(kMinimal) + "model:\n";  // line 3
  CHECK_THAT(ErrorOf(head + "  vocab_size: 1\n"),
             StartsWith("run.yaml:4:15: model.vocab_size: must be in [2, 65536]"));
  CHECK_THAT(ErrorOf(head + "  vocab_size: 65537\n", {"data.format=tokens"}),
             StartsWith("run.yaml:4:15: model.vocab_size: must be in [2, 65536] (token files store uint16 ids), "
                        "got 65537"));
  CHECK_THAT(ErrorOf(head + "  vocab_size: 50257\n"),
             StartsWith("run.yaml:4:15: model.vocab_size: 50257 does not fit data.format bytes"));
  CHECK_THAT(ErrorOf(head + "  vocab_size: 50257\n"), Contains("data.format: tokens"));
  CHECK_THAT(ErrorOf(kMinimal, {"model.vocab_size=1000"}),
             StartsWith("--set model.vocab_size=1000: model.vocab_size: 1000 does not fit data.format bytes"));
  CHECK_THAT(ErrorOf("data:\n  corpus: a\n  format: token\n"),
             StartsWith("run.yaml:3:11: data.format: expected one of bytes, tokens, got 'token'"));
  CHECK_THAT(ErrorOf("data:\n  corpus: a\n  format: token\n"), Contains("did you mean 'tokens'?"));

  const std::string train = std::string(kMinimal) + "train:\n";  // line 3
  for (const char* bad : {"gpu", "CUDA", "'cuda:'", "cuda:-1", "cuda:+1", "cuda:x", "cuda:1.5", "cuda:99999",
                          "cpu:0", "''"}) {
    INFO(bad);
    CHECK_THAT(ErrorOf(train + "  device: " + bad + "\n"), StartsWith("run.yaml:4:11: train.device: '"));
    CHECK_THAT(ErrorOf(train + "  device: " + bad + "\n"),
               Contains("is not a device; write cpu, cuda (= cuda:0) or cuda:N"));
  }
  CHECK_THAT(ErrorOf(kMinimal, {"train.device=tpu"}), StartsWith("--set train.device=tpu: train.device: 'tpu'"));
  CHECK_THAT(ErrorOf(train + "  device: [cuda]\n"),
             StartsWith("run.yaml:4:11: train.device: expected a name, got a sequence"));
  CHECK_THAT(ErrorOf(train + "  ranks: 0\n"),
             StartsWith("run.yaml:4:10: train.ranks: must be >= 1 (the learner's local ring size), got 0"));
  CHECK_THAT(ErrorOf(kMinimal, {"train.ranks=-2"}), StartsWith("--set train.ranks=-2: train.ranks: must be >= 1"));
  CHECK_THAT(ErrorOf(train + "  ranks: two\n"), StartsWith("run.yaml:4:10: train.ranks: expected an integer"));
}

TEST_CASE("ParseDevice reads cpu, cuda and cuda:N", "[unit][config]") {
  DeviceSpec spec;
  REQUIRE(ParseDevice("cpu", &spec).ok());
  CHECK(spec == DeviceSpec{false, 0});
  REQUIRE(ParseDevice("cuda", &spec).ok());
  CHECK(spec == DeviceSpec{true, 0});
  REQUIRE(ParseDevice("cuda:0", &spec).ok());
  CHECK(spec == DeviceSpec{true, 0});
  REQUIRE(ParseDevice("cuda:7", &spec).ok());
  CHECK(spec == DeviceSpec{true, 7});
  spec = DeviceSpec{true, 3};
  CHECK_FALSE(ParseDevice("cuda:", &spec).ok());
  CHECK(spec == DeviceSpec{true, 3});  // left untouched on error
}

TEST_CASE("the GPT-2 124M config loads", "[unit][config]") {
  const fs::path source = DILOCO_SOURCE_DIR;
  RunConfig config;
  // The corpus is a placeholder the user edits; parsing does not need it to exist.
  Status status = LoadRunConfig((source / "configs/gpt2-124m.yaml").string(), {}, &config);
  REQUIRE(status.message() == "");
  CHECK(config.model == ModelConfig{12, 768, 12, 1024, 50257});
  CHECK(config.data.format == DataFormat::kTokens);
  CHECK(config.data.corpus.size() > 4);
  CHECK(config.data.corpus.substr(config.data.corpus.size() - 4) == ".bin");
  CHECK(config.train.device == "cuda");
  CHECK(config.train.ranks == 1);
  CHECK(config.train.lr == 6e-4);
  CHECK(config.train.beta2 == 0.95);
  // A GPU's ring and a CPU smoke run are one --set away.
  REQUIRE(LoadRunConfig((source / "configs/gpt2-124m.yaml").string(), {"train.ranks=8", "train.device=cpu"},
                        &config)
              .ok());
  CHECK(config.train.ranks == 8);
  CHECK(config.train.device == "cpu");
}

}  // namespace
}  // namespace diloco
