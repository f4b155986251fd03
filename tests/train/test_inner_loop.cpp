// The one inner loop on a local ring of ranks (inner_loop.h, local_ring.h), and ddp's ring bytes.
#include "daemon/train/inner_loop.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <iterator>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "daemon/train/ddp_run.h"
#include "daemon/train/local_ring.h"
#include "daemon/train/step_stretch.h"
#include "daemon/train/trainer.h"
#include "kernels/rng.h"
#include "tests/temp_dir.h"
#include "tests/text_corpus.h"

namespace diloco {
namespace {
namespace fs = std::filesystem;
using diloco::testing::TempDir;

std::string WriteCorpus(const fs::path& dir) {
  return testing::WriteShuffledCorpus(dir, {"alpha ", "beta ", "gamma ", "delta\n", "epsilon, "}, 20000, 99);
}

RunConfig SmallConfig(const std::string& corpus) {
  RunConfig c;
  c.model = {.n_layer = 2, .n_embd = 32, .n_head = 2, .block_size = 16};
  c.data.corpus = corpus;
  c.train.batch_size = 4;
  c.train.steps = 20;
  c.train.lr = 3e-3;
  c.train.warmup_steps = 3;
  c.train.threads = 2;
  return c;
}

// A ring of `ranks` ranks, each taking `batch` rows of the step's batch, from the config's seed.
struct TestRing {
  TestRing(const RunConfig& config, int ranks, int batch) : cfg(config) {
    cfg.train.batch_size = batch;  // rows per rank
    REQUIRE(Corpus::Load(cfg.data.corpus, CorpusOptionsOf(cfg, 0, 1), &corpus).ok());
    LocalRingOptions ro = LocalRingOptionsOf(cfg, 2);
    ro.ranks = ranks;
    // Stands in for a GPU ring: the step headers and rewrites must not hand host buffers to it.
    ro.check_device_memory = true;
    REQUIRE(LocalRing::Create(ro, &ring).ok());
    std::vector<float> init(ring->backend(0).num_params());
    gpt_init_params(ro.model, cfg.train.seed, init.data());
    ring->Upload(init.data());
    sampler = std::make_unique<BatchSampler>(
        TrainSampler(*corpus, ranks * batch, cfg.model.block_size, mix_seed(cfg.train.seed, 0)));
  }
  InnerLoopOptions Options(int rank) const { return RankLoopOptions(cfg, *sampler, rank, 0); }
  std::vector<float> Params(int rank) {
    std::vector<float> p(ring->backend(rank).num_params());
    ring->backend(rank).download_params(p.data());
    return p;
  }

  RunConfig cfg;
  std::unique_ptr<Corpus> corpus;
  std::unique_ptr<LocalRing> ring;
  std::unique_ptr<BatchSampler> sampler;
};

// Trains cfg.train.steps steps on a ring; returns every rank's final parameters. hook (may be
// null) runs on rank 0.
std::vector<std::vector<float>> TrainRing(const RunConfig& cfg, int ranks, int batch, InnerLoopHook* hook) {
  TestRing t(cfg, ranks, batch);
  const Status st = t.ring->Run([&](int rank) {
    long done = 0;
    Status s = RunInnerLoop(t.Options(rank), t.ring->backend(rank), t.ring->comm(rank), rank == 0 ? hook : nullptr,
                            &done);
    if (s.ok() && done != cfg.train.steps) s = Status::Error("rank ended at step " + std::to_string(done));
    return s;
  });
  REQUIRE(st.ok());
  std::vector<std::vector<float>> out;
  for (int r = 0; r < ranks; r++) out.push_back(t.Params(r));
  return out;
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, (double)std::fabs(x));
  return m;
}

TEST_CASE("local ring: 2 ranks for 20 steps match 1 rank at twice the batch, the ranks stay bitwise equal",
          "[unit]") {
  TempDir tmp;
  const RunConfig cfg = SmallConfig(WriteCorpus(tmp.path()));
  const auto two = TrainRing(cfg, 2, 4, nullptr);
  const auto one = TrainRing(cfg, 1, 8, nullptr);
  CHECK(std::memcmp(two[0].data(), two[1].data(), two[0].size() * sizeof(float)) == 0);
  double max_diff = 0;
  for (size_t i = 0; i < one[0].size(); i++) max_diff = std::max(max_diff, (double)std::fabs(one[0][i] - two[0][i]));
  const double scale = MaxAbs(one[0]);
  INFO("max |ranks=2 - ranks=1 x 2B| = " << max_diff << ", largest parameter " << scale);
  CHECK(max_diff <= 1e-5 * scale);
  // The model moved: equal because both trained, not because neither did.
  std::vector<float> init(one[0].size());
  gpt_init_params(GptConfigOf(cfg.model), cfg.train.seed, init.data());
  CHECK(std::memcmp(init.data(), one[0].data(), init.size() * sizeof(float)) != 0);
}

// Rewrites a range of rank 0's parameters before step 5 (as a fold of a Global does) and lists it.
class RewriteHook final : public InnerLoopHook {
 public:
  Status BeforeStep(long step, TrainingBackend& backend, StepControl* control) override {
    if (step != 5) return Status::Ok();
    std::vector<float> ones(100, 0.25f);
    backend.upload_params(ones.data(), 1000, ones.size());
    control->changed.push_back({1000, ones.size()});
    return Status::Ok();
  }
  Status AfterStep(const StepResult&, TrainingBackend&) override { return Status::Ok(); }
};

TEST_CASE("local ring: parameters rank 0 rewrites between steps reach every rank", "[unit]") {
  TempDir tmp;
  const RunConfig cfg = SmallConfig(WriteCorpus(tmp.path()));
  RewriteHook hook;
  const auto ranks = TrainRing(cfg, 3, 2, &hook);
  CHECK(std::memcmp(ranks[0].data(), ranks[1].data(), ranks[0].size() * sizeof(float)) == 0);
  CHECK(std::memcmp(ranks[0].data(), ranks[2].data(), ranks[0].size() * sizeof(float)) == 0);
  // Without the copy the ranks would differ: the rewrite did change rank 0.
  const auto plain = TrainRing(cfg, 3, 2, nullptr);
  CHECK(std::memcmp(ranks[0].data(), plain[0].data(), ranks[0].size() * sizeof(float)) != 0);
}

// Sets the LR schedule's position (sync.lr_clock: global) to a fixed step and records the LRs used.
class LrClockHook final : public InnerLoopHook {
 public:
  explicit LrClockHook(long lr_step) : lr_step_(lr_step) {}
  Status BeforeStep(long, TrainingBackend&, StepControl* control) override {
    control->lr_step = lr_step_;
    return Status::Ok();
  }
  Status AfterStep(const StepResult& r, TrainingBackend&) override {
    lrs.push_back(r.lr);
    return Status::Ok();
  }
  std::vector<float> lrs;

 private:
  long lr_step_;
};

TEST_CASE("local ring: the LR position rank 0 sets reaches every rank", "[unit]") {
  TempDir tmp;
  RunConfig cfg = SmallConfig(WriteCorpus(tmp.path()));
  cfg.train.min_lr = 1e-4;
  cfg.train.lr_decay_steps = 20;
  LrClockHook late(1000);  // past the decay: min_lr at every step
  const auto ranks = TrainRing(cfg, 2, 2, &late);
  REQUIRE(late.lrs.size() == 20);
  for (float lr : late.lrs) CHECK(lr == Approx(1e-4));
  CHECK(std::memcmp(ranks[0].data(), ranks[1].data(), ranks[0].size() * sizeof(float)) == 0);
  // Rank 0's own step clock gives other LRs, and other parameters.
  LrClockHook own(-1);
  const auto plain = TrainRing(cfg, 2, 2, &own);
  CHECK(own.lrs[10] > 1e-3);
  CHECK(std::memcmp(ranks[0].data(), plain[0].data(), ranks[0].size() * sizeof(float)) != 0);
}

TEST_CASE("step stretch: slowdown and exponential noise of the configured mean, repeatable from the seed",
          "[unit]") {
  RunConfig cfg;
  cfg.sync.learners = 3;
  cfg.learners = {{1.0, 0.0}, {2.0, 0.0}, {1.3, 0.2}};
  const double step = 1e-7;  // the sleeps stay negligible
  StepStretch plain(cfg, 0), slow(cfg, 1), noisy(cfg, 2), again(cfg, 2);
  CHECK(plain.Apply(step).step_s == step);
  const StretchedStep chaos = plain.Apply(step, 3.0);  // a chaos factor above the config's
  CHECK(chaos.step_s == Approx(3 * step));
  CHECK(chaos.provisioned_s == step);  // a fault is not provisioned time
  CHECK(slow.Apply(step).step_s == Approx(2 * step));
  CHECK(slow.Apply(step).provisioned_s == Approx(2 * step));  // slower hardware is
  CHECK(slow.Apply(step, 1.5).step_s == Approx(2 * step));
  const StretchedStep slower = slow.Apply(step, 3.0);
  CHECK(slower.step_s == Approx(3 * step));
  CHECK(slower.provisioned_s == Approx(2 * step));
  double sum = 0, low = 1e9;
  const int n = 20000;
  for (int i = 0; i < n; i++) {
    const StretchedStep s = noisy.Apply(step);
    const double f = s.step_s / step;
    CHECK(s.provisioned_s == s.step_s);    // noise is the hardware's too
    CHECK(again.Apply(step).step_s / step == f);  // same seed, same learner: the same draws
    sum += f;
    low = std::min(low, f);
  }
  CHECK(low >= 1.3);
  CHECK(sum / n == Approx(1.3 * 1.2).epsilon(0.02));  // E[1 + e] = 1 + jitter
  StepStretch other_seed = [&] {
    RunConfig c = cfg;
    c.train.seed++;
    return StepStretch(c, 2);
  }();
  CHECK(other_seed.Apply(step).step_s != StepStretch(cfg, 2).Apply(step).step_s);
}

class FailingHook final : public InnerLoopHook {
 public:
  Status BeforeStep(long step, TrainingBackend&, StepControl*) override {
    return step == 3 ? Status::Error("the outer sync broke") : Status::Ok();
  }
  Status AfterStep(const StepResult&, TrainingBackend&) override { return Status::Ok(); }
};

TEST_CASE("local ring: a failure on rank 0 stops every rank with its error", "[unit]") {
  TempDir tmp;
  TestRing t(SmallConfig(WriteCorpus(tmp.path())), 2, 4);
  FailingHook hook;
  std::vector<long> reached(2, -1);
  const Status st = t.ring->Run([&](int rank) {
    return RunInnerLoop(t.Options(rank), t.ring->backend(rank), t.ring->comm(rank), rank == 0 ? &hook : nullptr,
                        &reached[rank]);
  });
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().find("the outer sync broke") != std::string::npos);
  CHECK(reached == std::vector<long>{3, 3});
}

TEST_CASE("local ring: StopFollowers releases ranks waiting for a loop that never starts", "[unit]") {
  TempDir tmp;
  TestRing t(SmallConfig(WriteCorpus(tmp.path())), 2, 4);
  long follower_reached = -1;
  const Status st = t.ring->Run([&](int rank) -> Status {
    if (rank == 0) return StopFollowers(t.ring->comm(0)).ok() ? Status::Ok() : Status::Error("stop failed");
    return RunInnerLoop(t.Options(rank), t.ring->backend(rank), t.ring->comm(rank), nullptr, &follower_reached);
  });
  CHECK(st.ok());
  CHECK(follower_reached == 0);
}

TEST_CASE("local ring: a device this build or machine lacks is refused before anything starts", "[unit]") {
  // GPU 4096 exists nowhere: refused without CUDA, without a GPU, and on a GPU machine alike.
  LocalRingOptions ro;
  ro.device = "cuda:4096";
  std::unique_ptr<LocalRing> ring;
  const Status st = LocalRing::Create(ro, &ring);
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().find("train.device cuda:4096") != std::string::npos);
  TrainConfig tc;
  tc.device = "cuda:4096";
  tc.ranks = 2;
  const Status check = CheckTrainDevice(tc);
  REQUIRE_FALSE(check.ok());
  CHECK(check.message().find("train.device cuda:4096") != std::string::npos);
  tc.device = "tpu";
  CHECK_FALSE(CheckTrainDevice(tc).ok());
  tc.device = "cpu";
  tc.ranks = 4;
  CHECK(CheckTrainDevice(tc).ok());
}

TEST_CASE("a tokens corpus with vocab 50257 trains a tiny model: the loss falls from ln 50257", "[e2e]") {
  TempDir tmp;
  // nanoGPT's raw layout: little-endian uint16 tokens, a repeating phrase of ids across the vocab.
  std::vector<uint16_t> tokens;
  const uint16_t phrase[] = {50256, 464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13, 198, 40000, 50000};
  uint64_t x = 5;
  while (tokens.size() < 40000) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const size_t start = (x >> 33) % 4;  // a few entry points, so it is not one fixed sequence
    for (size_t i = start; i < std::size(phrase); i++) tokens.push_back(phrase[i]);
  }
  const std::string corpus = (tmp.path() / "train.bin").string();
  std::ofstream(corpus, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), (std::streamsize)(tokens.size() * sizeof(uint16_t)));
  TrainOptions o;
  o.config = SmallConfig(corpus);
  o.config.data.format = DataFormat::kTokens;
  o.config.model.vocab_size = 50257;
  o.config.model.n_layer = 1;
  o.config.train.steps = 60;
  o.config.train.lr = 1e-2;
  o.config.eval.batches = 2;
  o.run_dir = (tmp.path() / "run").string();
  o.quiet = true;
  TrainSummary s;
  const Status st = RunTraining(o, &s);
  INFO(st.message());
  REQUIRE(st.ok());
  double first_loss = -1;
  std::ifstream metrics(fs::path(o.run_dir) / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    if (line.find("\"step\":1,") != std::string::npos && line.find("\"loss\"") != std::string::npos)
      first_loss = std::stod(line.substr(line.find("\"loss\":") + 7));
  INFO("first loss " << first_loss << ", final train loss " << s.final_train_loss << ", val " << s.final_val_loss);
  CHECK(first_loss == Approx(std::log(50257.0)).margin(0.3));
  CHECK(s.final_train_loss < first_loss - 3);
  CHECK(s.final_val_loss < first_loss - 3);
}

TEST_CASE("a checkpoint of a 1-rank run resumes on a ring of 2 ranks", "[e2e]") {
  TempDir tmp;
  TrainOptions o;
  o.config = SmallConfig(WriteCorpus(tmp.path()));
  o.config.train.steps = 10;
  o.config.eval.batches = 2;
  o.run_dir = (tmp.path() / "run").string();
  o.quiet = true;
  TrainSummary s;
  REQUIRE(RunTraining(o, &s).ok());
  o.resume = true;
  o.config.train.steps = 20;
  o.config.train.ranks = 2;  // the same parameters and moments, now on two ranks
  const Status st = RunTraining(o, &s);
  INFO(st.message());
  REQUIRE(st.ok());
  CHECK(s.steps == 20);
  CHECK(s.tokens == 10 * 2 * 4 * 16);  // the resumed steps, on 2 ranks of batch 4
}

TEST_CASE("ddp: wire bytes of a ring all-reduce of fp32 values", "[unit]") {
  CHECK(RingBytesPerMember(1, 1000) == 0);
  CHECK(RingBytesPerMember(2, 1000) == 4000);  // 2 * 1/2 * 4 bytes * n
  CHECK(RingBytesPerMember(4, 1000) == 6000);  // 2 * 3/4 * 4 bytes * n
}

}  // namespace
}  // namespace diloco
