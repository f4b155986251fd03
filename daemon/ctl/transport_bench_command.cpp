#include <algorithm>
#include <cstdio>

#include "daemon/ctl/commands.h"
#include "daemon/net/transport_bench.h"

namespace diloco {

int RunBenchTransportCommand(const BenchTransportCommand& cmd) {
  net::TransportBenchOptions o;
  if (cmd.size_mib < 1 || cmd.transfers < 1 || cmd.stream_depth < 0 || cmd.stream_depth > 64) {
    std::fprintf(stderr,
                 "dilococtl bench transport: --mib and --transfers must be at least 1, --stream in [0, 64]\n");
    return 2;
  }
  if (cmd.senders < 1 || cmd.senders > 64 || cmd.io_threads < 0 || cmd.io_threads > 64) {
    std::fprintf(stderr, "dilococtl bench transport: --senders must be in [1, 64], --io-threads in [0, 64] "
                         "(0: as the daemon)\n");
    return 2;
  }
  o.payload_bytes = static_cast<uint64_t>(cmd.size_mib) << 20;
  o.transfers = cmd.transfers;
  o.stream_depth = cmd.stream_depth;
  o.curve = !cmd.no_curve;
  o.senders = cmd.senders;
  o.io_threads = cmd.io_threads;
  std::vector<net::TransportBenchPath> paths;
  const Status st = net::RunTransportBench(o, &paths);
  if (!st.ok()) {
    std::fprintf(stderr, "dilococtl bench transport: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("%d MiB fp32 delta, median of %d; one at a time (build..parsed) | %d back to back\n", cmd.size_mib,
              cmd.transfers, cmd.stream_depth);
  for (const auto& p : paths) {
    std::printf("%-10s stack %6.2f GB/s (%6.1f ms: build %.1f, parse %.1f; cpu %.1f)  raw zmq %6.2f GB/s (%6.1f ms;"
                " cpu %.1f)  ratio %.2f | stream: stack %6.2f raw %6.2f GB/s ratio %.2f\n",
                p.name.c_str(), p.stack_GBps, p.stack_ms, p.build_ms, p.parse_ms, p.stack_cpu_ms, p.raw_zmq_GBps,
                p.raw_ms, p.raw_cpu_ms, p.ratio, p.stack_stream_GBps, p.raw_stream_GBps, p.stream_ratio);
  }
  if (!paths.empty()) {
    const auto& f = paths.front();
    std::printf("%d sender%s at once into one socket, %d deltas each, receiver with %d I/O thread%s:\n", f.senders,
                f.senders == 1 ? "" : "s", std::max(1, cmd.stream_depth), f.io_threads, f.io_threads == 1 ? "" : "s");
  }
  for (const auto& p : paths) {
    std::printf("%-10s aggregate: stack %6.2f GB/s (%5.2f per sender)  raw zmq %6.2f GB/s (%5.2f per sender)"
                "  ratio %.2f\n",
                p.name.c_str(), p.aggregate_GBps, p.per_sender_GBps, p.raw_aggregate_GBps, p.raw_per_sender_GBps,
                p.aggregate_ratio);
  }
  if (cmd.json) std::printf("%s\n", net::TransportBenchJson(paths).c_str());
  return 0;
}

}  // namespace diloco
