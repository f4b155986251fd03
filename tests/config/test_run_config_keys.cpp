// The key table's promises: the keys for the virtual clock (sync.clock, timing, learners[i].link)
// are read, checked and written like every other key; README lists every key as the table prints
// it, and the table, the reader and the writer agree on the keys; the run and daemon configs
// share one number rule and one site-name rule.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "daemon/config/daemon_config.h"
#include "daemon/config/run_config.h"
#include "daemon/config/site_name.h"
#include "tests/config/config_testing.h"

namespace diloco {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;
using diloco::testing::ErrorOf;
using diloco::testing::kMinimal;
using diloco::testing::Parse;

TEST_CASE("sync.clock, timing and learners[i].link are read and written back", "[unit][config]") {
  RunConfig config;
  REQUIRE(Parse(kMinimal, {}, &config).ok());
  CHECK(config.sync.clock == ClockSource::kWall);
  CHECK(config.timing == TimingConfig{});
  CHECK(config.timing.link == LinkConfig{1000, 30, 0, 0});

  const std::string text = std::string(kMinimal) +
                           "sync:\n  learners: 3\n  clock: virtual\n"
                           "learners:\n  - {slowdown: 2}\n"
                           "  - {link: {bandwidth_mbps: 100, latency_ms: 80, jitter_ms: 5, loss: 0.01}}\n"
                           "  - {link: {}}\n"
                           "timing:\n  step_ms: 250.5\n  step_jitter: 0.2\n  heartbeat_ms: 50\n  merge_gbps: 2.5\n"
                           "  seed: 18446744073709551615\n"
                           "  link: {bandwidth_mbps: 0, latency_ms: 12.5, jitter_ms: 3, loss: 0.001}\n";
  REQUIRE(Parse(text, {}, &config).message() == "");
  CHECK(config.sync.clock == ClockSource::kVirtual);
  CHECK(config.timing == TimingConfig{250.5, 0.2, 50, 2.5, 18446744073709551615ull, LinkConfig{0, 12.5, 3, 0.001}});
  REQUIRE(config.learners.size() == 3);
  CHECK_FALSE(config.learners[0].has_link);
  CHECK(config.learners[1].has_link);
  CHECK(config.learners[1].link == LinkConfig{100, 80, 5, 0.01});
  CHECK(config.learners[2].has_link);  // given, though empty: a perfect link of its own
  CHECK(config.learners[2].link == LinkConfig{});

  const std::string yaml = RunConfigToYaml(config);
  INFO(yaml);
  CHECK_THAT(yaml, Contains("  clock: virtual\n"));
  CHECK_THAT(yaml, Contains("timing:\n  step_ms: 250.5\n  step_jitter: 0.2\n"));
  // Only the learners that have a link of their own get one back.
  CHECK_THAT(yaml, Contains("learners:\n  - slowdown: 2\n    jitter: 0\n  - slowdown: 1\n    jitter: 0\n    link:\n"
                            "      bandwidth_mbps: 100\n      latency_ms: 80\n"));
  RunConfig again;
  REQUIRE(ParseRunConfig(yaml, "again.yaml", "", {}, &again).message() == "");
  CHECK(again == config);
}

TEST_CASE("a config with the virtual-clock keys off their defaults round-trips", "[unit][config]") {
  RunConfig config;
  config.data.corpus = "/c.txt";
  config.sync.learners = 3;
  config.sync.clock = ClockSource::kVirtual;
  // Doubles without a short decimal form, to see that they read back exactly.
  config.timing = TimingConfig{0.1 + 0.2, 1.0 / 3.0, 7, 123.456, 42, LinkConfig{1.5, 1.0 / 7.0, 1e-3, 0.25}, 0.1 + 0.7};
  config.sync.fragments = 3;
  config.sync.syncers = 3;
  config.learners.resize(3);
  config.learners[0].has_link = true;  // the default link, given
  config.learners[1].slowdown = 1.5;   // no link of its own
  config.learners[2].has_link = true;
  config.learners[2].link = LinkConfig{10, 200.5, 20, 0.05};
  RunConfig again;
  REQUIRE(ParseRunConfig(RunConfigToYaml(config), "c.yaml", "", {}, &again).message() == "");
  CHECK(again == config);
}

TEST_CASE("the virtual-clock keys take --set, which creates a learner's link", "[unit][config]") {
  RunConfig config;
  REQUIRE(Parse(kMinimal,
                {"sync.learners=2", "sync.clock=virtual", "learners.1.link.latency_ms=80", "timing.step_ms=10",
                 "timing.link.loss=0.5", "timing.seed=+9"},
                &config)
              .message() == "");
  CHECK(config.sync.clock == ClockSource::kVirtual);
  REQUIRE(config.learners.size() == 2);
  CHECK_FALSE(config.learners[0].has_link);
  CHECK(config.learners[1].has_link);
  CHECK(config.learners[1].link == LinkConfig{0, 80, 0, 0});
  CHECK(config.timing.step_ms == 10);
  CHECK(config.timing.link.loss == 0.5);
  CHECK(config.timing.seed == 9);
}

TEST_CASE("the virtual-clock keys' errors name the place and the full key", "[unit][config]") {
  struct Case {
    std::string set;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"sync.clock=virtul", "sync.clock: expected one of wall, virtual, got 'virtul'; did you mean 'virtual'?"},
      {"timing.step_ms=0", "timing.step_ms: must be > 0, got 0"},
      {"timing.step_ms=fast", "timing.step_ms: expected a number, got 'fast'"},
      {"timing.step_jitter=1", "timing.step_jitter: must be in [0, 1), got 1"},
      {"timing.step_jitter=-0.1", "timing.step_jitter: must be in [0, 1), got -0.1"},
      {"timing.heartbeat_ms=-5", "timing.heartbeat_ms: must be > 0, got -5"},
      {"timing.merge_gbps=0", "timing.merge_gbps: must be > 0, got 0"},
      {"timing.seed=-1", "timing.seed: expected a non-negative integer"},
      {"timing.link.bandwidth_mbps=-1", "timing.link.bandwidth_mbps: must be >= 0 (0 = unlimited), got -1"},
      {"timing.link.latency_ms=-1", "timing.link.latency_ms: must be >= 0, got -1"},
      {"timing.link.jitter_ms=-1", "timing.link.jitter_ms: must be >= 0, got -1"},
      {"timing.link.loss=1", "timing.link.loss: must be in [0, 1), got 1"},
      {"learners.0.link.bandwidth_mbps=-3", "learners.0.link.bandwidth_mbps: must be >= 0 (0 = unlimited), got -3"},
      {"learners.0.link.latency_ms=-2", "learners.0.link.latency_ms: must be >= 0, got -2"},
      {"learners.0.link.jitter_ms=-2", "learners.0.link.jitter_ms: must be >= 0, got -2"},
      {"learners.0.link.loss=1.5", "learners.0.link.loss: must be in [0, 1), got 1.5"},
      {"learners.0.link=5", "learners.0.link: expected a section (a mapping of keys), got '5'"},
      {"learners.0.link.delay_ms=5",
       "unknown key 'learners.0.link.delay_ms'; known keys in 'learners.0.link': bandwidth_mbps, latency_ms, "
       "jitter_ms, loss"},
      {"timing.stepms=5",
       "unknown key 'timing.stepms'; known keys in 'timing': step_ms, step_jitter, heartbeat_ms, merge_gbps, syncer_gbps, seed, "
       "link; did you mean 'step_ms'?"},
  };
  for (const Case& c : cases) {
    INFO(c.set);
    CHECK_THAT(ErrorOf(kMinimal, {c.set}), StartsWith("--set " + c.set + ": " + c.message));
  }
  // In a file the message points at the value.
  CHECK(ErrorOf(std::string(kMinimal) + "timing:\n  step_ms: 0\n") == "run.yaml:4:12: timing.step_ms: must be > 0, got 0");
  CHECK(ErrorOf(std::string(kMinimal) + "learners:\n  - link: {loss: 2}\n") ==
        "run.yaml:4:18: learners.0.link.loss: must be in [0, 1), got 2");
  CHECK(ErrorOf(std::string(kMinimal) + "timing:\n  link: {jitter_ms: -1}\n") ==
        "run.yaml:4:21: timing.link.jitter_ms: must be >= 0, got -1");
  CHECK_THAT(ErrorOf(std::string(kMinimal) + "sync:\n  clock: sundial\n"),
             StartsWith("run.yaml:4:10: sync.clock: expected one of wall, virtual, got 'sundial'"));
  CHECK_THAT(ErrorOf(std::string(kMinimal) + "learners:\n  - link: {loss: 0}\n    link: {loss: 0}\n"),
             StartsWith("run.yaml:5:5: key 'learners.0.link' appears twice; merge its keys into one"));
}

std::string ReadSourceFile(const std::string& relative) {
  std::ifstream f(std::string(DILOCO_SOURCE_DIR) + "/" + relative, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST_CASE("README lists every run-config key, as the key table prints it", "[unit][config]") {
  const std::string readme = ReadSourceFile("README.md");
  const std::string begin =
      "<!-- run-config-keys begin: generated by scripts/readme-keys.sh from daemon/config/run_config_keys.cpp -->\n";
  const std::string end = "<!-- run-config-keys end -->\n";
  const size_t b = readme.find(begin);
  REQUIRE(b != std::string::npos);
  const size_t e = readme.find(end, b);
  REQUIRE(e != std::string::npos);
  const std::string section = readme.substr(b + begin.size(), e - b - begin.size());
  INFO("README.md's key list is stale: run scripts/readme-keys.sh");
  CHECK(section == RunConfigKeysMarkdown());
  const std::vector<std::string> names = RunConfigKeyNames();
  CHECK(names.size() > 100);
  for (const std::string& name : names) {
    INFO(name);
    CHECK_THAT(section, Contains("\n| `" + name + "` |"));
  }
  for (const char* name : {"sync.clock", "timing.step_ms", "timing.link.loss", "learners[i].link.latency_ms",
                           "chaos.events[i].kill.learner", "train.lr"}) {
    CHECK(std::count(names.begin(), names.end(), name) == 1);
  }
}

// The dotted paths of the leaves of a written config, list items as [i] (a list of names is one
// leaf).
void LeavesOf(const YAML::Node& node, const std::string& path, std::set<std::string>* leaves) {
  if (node.IsMap()) {
    for (const auto& entry : node) LeavesOf(entry.second, (path.empty() ? "" : path + ".") + entry.first.Scalar(), leaves);
  } else if (node.IsSequence() && node.size() > 0 && !node[0].IsScalar()) {
    for (const YAML::Node& item : node) LeavesOf(item, path + "[i]", leaves);
  } else {
    leaves->insert(path);
  }
}

TEST_CASE("the key list, the reader and the writer agree on every key", "[unit][config]") {
  // Every list has items, every optional section is given, and each chaos action appears once.
  const std::string text = std::string(kMinimal) +
                           "sync: {learners: 2, fragments: 2, syncers: 2}\n"
                           "learners: [{slowdown: 2, link: {loss: 0.1}}, {jitter: 0.5}]\n"
                           "placement: {syncer: s, learners: [a, b]}\n"
                           "chaos:\n  events:\n"
                           "    - {at_s: 1, kill: {learner: 0, restart_after_s: 5}}\n"
                           "    - {at_step: 3, slow: {learner: 1, factor: 2, duration_s: 4}}\n"
                           "    - {at_s: 2, partition: {learner: 0, duration_s: 4}}\n"
                           "    - {at_s: 2, drop: {learner: 1, prob: 0.1, duration_s: 4}}\n"
                           "    - {at_s: 2, corrupt: {learner: 0, prob: 0.1, duration_s: 4}}\n"
                           "    - {at_s: 9, syncer_kill: {shard: 1, restart_after_s: 3}}\n"
                           "  random: {mtbf_s: 100}\n";
  RunConfig config;
  REQUIRE(Parse(text, {}, &config).message() == "");
  std::set<std::string> written;
  LeavesOf(YAML::Load(RunConfigToYaml(config)), "", &written);
  const std::vector<std::string> names = RunConfigKeyNames();
  for (const std::string& leaf : written) {
    INFO("written but not in the key list: " << leaf);
    CHECK(std::count(names.begin(), names.end(), leaf) == 1);
  }
  for (const std::string& name : names) {
    INFO("in the key list but never written: " << name);
    const bool found = std::any_of(written.begin(), written.end(), [&](const std::string& leaf) {
      return leaf == name || leaf.rfind(name + ".", 0) == 0 || leaf.rfind(name + "[i]", 0) == 0;
    });
    CHECK(found);
  }
}

TEST_CASE("the run and daemon configs read numbers and site names by one rule", "[unit][config]") {
  const std::string daemon_head = "site: a\nstate_dir: /s\nallow_plaintext: true\n";
  auto daemon = [&](const std::string& text, DaemonConfig* out) {
    return ParseDaemonConfig(daemon_head + text, "d.yaml", "/base", out);
  };
  // "+2" is a number in both (YAML's core schema says so).
  DaemonConfig d;
  REQUIRE(daemon("threads: +2\ndevices: {cuda: [+1]}\n", &d).message() == "");
  CHECK(d.threads == 2);
  CHECK(d.devices.gpus == std::vector<int>{1});
  RunConfig r;
  REQUIRE(Parse(kMinimal, {"train.threads=+2", "train.seed=+7", "train.lr=+0.5"}, &r).message() == "");
  CHECK(r.train.threads == 2);
  CHECK(r.train.seed == 7);
  CHECK(r.train.lr == 0.5);
  // Neither takes a doubled sign, a lone sign, hex, or a fraction for an integer.
  for (const std::string bad : {"+-2", "-+2", "'+'", "'-'", "0x10", "2.0", "1e3", "--2"}) {
    INFO(bad);
    Status status = daemon("threads: " + bad + "\n", &d);
    CHECK_THAT(status.message(), Contains("threads: expected an integer"));
    CHECK_THAT(ErrorOf(kMinimal, {"train.threads=" + bad}), Contains("train.threads: expected an integer"));
  }
  CHECK_THAT(ErrorOf(kMinimal, {"train.lr=+-1"}), Contains("train.lr: expected a number"));
  CHECK_THAT(ErrorOf(kMinimal, {"train.seed=+-1"}), Contains("train.seed: expected a non-negative integer"));

  // Site names: the same names pass and fail in both configs.
  for (const std::string& good : std::vector<std::string>{"site-a", "a.b_c-1", std::string(kMaxSiteNameBytes, 'x')}) {
    INFO(good);
    CHECK(IsSiteName(good));
    CHECK(ParseDaemonConfig("site: '" + good + "'\nstate_dir: /s\nallow_plaintext: true\n", "d.yaml", "/b", &d)
              .message() == "");
    CHECK(Parse(kMinimal, {"placement.syncer=" + good, "placement.learners=['" + good + "']"}, &r).message() == "");
  }
  for (const std::string& bad : std::vector<std::string>{"a b", "a/b", "site:1", std::string(kMaxSiteNameBytes + 1, 'x')}) {
    INFO(bad);
    CHECK_FALSE(IsSiteName(bad));
    const Status status = ParseDaemonConfig("site: '" + bad + "'\nstate_dir: /s\nallow_plaintext: true\n", "d.yaml",
                                            "/b", &d);
    CHECK_THAT(status.message(), Contains("is not a site name (" + std::string(kSiteNameRule) + ")"));
    CHECK_THAT(ErrorOf(kMinimal, {"placement.syncer=s", "placement.learners=['" + bad + "']"}),
               Contains("'" + bad + "' is not a site name (" + std::string(kSiteNameRule) + ")"));
  }
}

}  // namespace
}  // namespace diloco
