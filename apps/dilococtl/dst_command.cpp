#include "apps/dilococtl/dst_command.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "daemon/virt/dst.h"

namespace diloco {

namespace {

namespace fs = std::filesystem;

std::string ReplayCommand(uint64_t seed, const DstCommand& cmd) {
  std::string line = "dilococtl dst --seed " + std::to_string(seed);
  if (!cmd.config.empty()) line += " --config " + cmd.config;
  return line;
}

}  // namespace

int RunDstCommand(const DstCommand& cmd) {
  const bool own_scratch = cmd.scratch.empty();
  const std::string scratch =
      own_scratch ? (fs::temp_directory_path() / ("dilocod-dst-" + std::to_string(::getpid()))).string() : cmd.scratch;
  RunConfig base;
  Status st = DstBaseConfig(scratch, &base);
  if (st.ok() && !cmd.config.empty()) {
    RunConfig loaded;
    st = LoadRunConfig(cmd.config, {}, &loaded);
    if (st.ok()) {
      base.model = loaded.model;
      base.data = loaded.data;
      base.train = loaded.train;
    }
  }
  if (!st.ok()) {
    std::fprintf(stderr, "dst: %s\n", st.message().c_str());
    return 2;
  }
  const uint64_t first = cmd.seed > 0 ? cmd.seed : cmd.first;
  const int seeds = cmd.seed > 0 ? 1 : cmd.seeds;
  const auto t0 = std::chrono::steady_clock::now();
  int failed = 0, violations = 0;
  uint64_t events = 0, merges = 0;
  for (int k = 0; k < seeds; k++) {
    const DstCase c = DrawDstCase(first + (uint64_t)k, base);
    if (cmd.seed > 0) std::fprintf(stderr, "%s\n", DescribeDstCase(c).c_str());
    DstCaseResult r;
    st = RunDstCase(c, (fs::path(scratch) / "case").string(), &r);
    if (!st.ok()) {
      std::fprintf(stderr, "dst: seed %llu: %s\n", (unsigned long long)c.seed, st.message().c_str());
      return 1;
    }
    events += r.events;
    merges += r.merges;
    if (!r.violations.empty()) {
      failed++;
      violations += (int)r.violations.size();
      std::fprintf(stderr, "dst: seed %llu FAILED (%s)\n", (unsigned long long)c.seed, DescribeDstCase(c).c_str());
      for (const DstViolation& v : r.violations)
        std::fprintf(stderr, "  %s at %.3f virtual s: %s\n", v.invariant.c_str(), v.at_s, v.detail.c_str());
      std::fprintf(stderr, "  replay: %s\n", ReplayCommand(c.seed, cmd).c_str());
    } else if (cmd.seed > 0) {
      std::fprintf(stderr, "dst: seed %llu passed: %llu events, %llu merges, %.1f virtual s\n",
                   (unsigned long long)c.seed, (unsigned long long)r.events, (unsigned long long)r.merges, r.virtual_s);
    }
    if (seeds > 1 && (k + 1) % 50 == 0)
      std::fprintf(stderr, "dst: %d/%d seeds, %d failed\n", k + 1, seeds, failed);
  }
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (own_scratch) {
    std::error_code ec;
    fs::remove_all(scratch, ec);
  }
  std::printf("dst: %d seeds from %llu, %d failed, %d violations; %.1f seeds/s, %llu events, %llu merges\n", seeds,
              (unsigned long long)first, failed, violations, seeds / wall_s, (unsigned long long)events,
              (unsigned long long)merges);
  if (cmd.json)
    std::printf("%s\n", nlohmann::json({{"seeds", seeds},
                                        {"first", first},
                                        {"failed", failed},
                                        {"violations", violations},
                                        {"seeds_per_s", seeds / wall_s},
                                        {"events", events},
                                        {"merges", merges}})
                            .dump()
                            .c_str());
  return failed == 0 ? 0 : 1;
}

}  // namespace diloco
