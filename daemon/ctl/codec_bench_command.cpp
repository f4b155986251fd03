// dilococtl bench codec: encode/decode GB/s on one thread (GB of fp32 input, 1e9 bytes) and the
// relative L2 error of each codec on N(0, 1) data. The codecs use no threads of their own. Each
// time is taken twice: on the wall clock and on the thread's CPU clock (CLOCK_THREAD_CPUTIME_ID),
// which a loaded machine does not stretch: the "cpu" columns are one core's speed however many
// other processes share it.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/ctl/commands.h"
#include "daemon/ctl/gaussian_data.h"
#include "daemon/net/codec.h"

namespace diloco {
namespace {

double RelL2(const std::vector<float>& ref, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Seconds {
  double wall = 0, cpu = 0;  // medians over the repeats
};

template <typename F>
Seconds MedianSeconds(int repeats, F&& f) {
  std::vector<double> wall, cpu;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = ThreadCpuSeconds();
    f();
    cpu.push_back(ThreadCpuSeconds() - c0);
    wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], std::max(cpu[cpu.size() / 2], 1e-9)};
}

struct Row {
  std::string name;
  CodecOptions opt;
  double encode_gbps = 0, decode_gbps = 0, rel_l2 = 0, bytes_per_param = 0;
  double encode_cpu_gbps = 0, decode_cpu_gbps = 0;  // per second of this thread's CPU time
};

}  // namespace

int RunBenchCodecCommand(const BenchCodecCommand& cmd) {
  if (cmd.size_mib < 1 || cmd.repeats < 1) {
    std::fprintf(stderr, "dilococtl bench codec: --mib and --repeats must be at least 1\n");
    return 2;
  }
  const size_t n = static_cast<size_t>(cmd.size_mib) * (1 << 20) / sizeof(float);
  const double input_gb = static_cast<double>(n * sizeof(float)) / 1e9;
  const std::vector<float> x = GaussianData(n, 1234);
  std::vector<float> y(n);
  std::vector<uint8_t> payload;

  std::vector<Row> rows = {
      {"int8", {CodecKind::kInt8, cmd.block_size, 0}},           {"int4", {CodecKind::kInt4, cmd.block_size, 0}},
      {"bf16", {CodecKind::kBf16, cmd.block_size, 0}},           {"fp32", {CodecKind::kFp32, cmd.block_size, 0}},
      {"int4_topk0.1", {CodecKind::kInt4, cmd.block_size, 0.1}},
      // The SparseLoCo layout: of each 4096 values the top 64, 2 (or 4) bits each (block ignored).
      {"chunked_64/4096_2b", {CodecKind::kTopkChunked, 4096, 0, 64, 2}},
      {"chunked_64/4096_4b", {CodecKind::kTopkChunked, 4096, 0, 64, 4}},
  };
  for (Row& row : rows) {
    Status st = ValidateCodecOptions(row.opt);
    if (!st.ok()) {
      std::fprintf(stderr, "dilococtl bench codec: %s\n", st.message().c_str());
      return 2;
    }
    // One untimed round trip: sizes the payload, faults its pages in, checks for errors.
    st = Encode(row.opt, x, &payload);
    if (st.ok()) st = Decode(row.opt, payload, y);
    if (!st.ok()) {
      std::fprintf(stderr, "dilococtl bench codec: %s: %s\n", row.name.c_str(), st.message().c_str());
      return 1;
    }
    const Seconds enc_s = MedianSeconds(cmd.repeats, [&] { st = Encode(row.opt, x, &payload); });
    const Seconds dec_s = MedianSeconds(cmd.repeats, [&] { st = Decode(row.opt, payload, y); });
    if (!st.ok()) {
      std::fprintf(stderr, "dilococtl bench codec: %s: %s\n", row.name.c_str(), st.message().c_str());
      return 1;
    }
    row.encode_gbps = input_gb / enc_s.wall;
    row.decode_gbps = input_gb / dec_s.wall;
    row.encode_cpu_gbps = input_gb / enc_s.cpu;
    row.decode_cpu_gbps = input_gb / dec_s.cpu;
    row.rel_l2 = RelL2(x, y);
    row.bytes_per_param = static_cast<double>(payload.size()) / static_cast<double>(n);
  }

  if (cmd.json) {
    nlohmann::ordered_json j;
    for (const Row& row : rows) {
      j[row.name] = {{"encode_GBps", row.encode_gbps},
                     {"decode_GBps", row.decode_gbps},
                     {"encode_GBps_cpu", row.encode_cpu_gbps},
                     {"decode_GBps_cpu", row.decode_cpu_gbps},
                     {"rel_l2_error", row.rel_l2},
                     {"bytes_per_param", row.bytes_per_param}};
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "codecs on %d MiB of N(0,1) fp32, one thread, median of %d runs, block %d "
        "(GB/s of fp32 input; cpu: per second of the thread's CPU time)\n",
        cmd.size_mib, cmd.repeats, cmd.block_size);
    std::printf("%-19s %12s %12s %12s %12s %12s %12s\n", "codec", "encode GB/s", "decode GB/s", "encode (cpu)",
                "decode (cpu)", "rel L2 err", "bytes/param");
    for (const Row& row : rows) {
      std::printf("%-19s %12.2f %12.2f %12.2f %12.2f %12.5f %12.5f\n", row.name.c_str(), row.encode_gbps,
                  row.decode_gbps, row.encode_cpu_gbps, row.decode_cpu_gbps, row.rel_l2, row.bytes_per_param);
    }
  }
  return 0;
}

}  // namespace diloco
