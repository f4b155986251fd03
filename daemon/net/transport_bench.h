// `dilococtl bench transport`: one Delta with a 64 MiB fp32 payload through the full stack
// (BuildMessage: schema + CRC32C + 4 MiB chunking -> PubChannel, one ZeroMQ message per chunk
// (chunk_frame.h) -> ZeroMQ -> SubChannel, each chunk's CRC checked as it arrives ->
// ParseEnvelopeInPlace: verification + CRC check of the chunks where they were received, the
// receiver gets spans over them; with in_place = false ParseEnvelope, which also copies them into
// one buffer), next to raw ZeroMQ PUSH/PULL moving the
// same frames (header + 16 x 4 MiB, zero-copy, nothing checked), interleaved in the same run, over
// tcp loopback, ipc, and tcp with CURVE on both paths.
//
// Three figures per path, each the median of `transfers` timed runs:
//   *_GBps         one message at a time, from "build" to "parsed" (raw: send to received):
//                  the latency of moving one delta, as a learner does;
//   *_stream_GBps  `stream_depth` messages in flight back to back (sender and receiver threads),
//                  the throughput one learner gets; here building and parsing overlap with
//                  ZeroMQ's I/O threads;
//   *aggregate_GBps  `senders` senders at once, each `stream_depth` (at least 1) deltas built
//                  beforehand, into the one receiving socket: the throughput a syncer takes from
//                  several learners, until the last delta is parsed. Each sender has its own
//                  context (one I/O thread) and socket, as a learner has; the receiving context
//                  has `io_threads` I/O threads, as the daemon's, so that several connections'
//                  CURVE decryption runs at once.
// The learner side of every figure runs on the same machine: with CURVE, encryption takes about
// as much CPU as decryption, so on a few cores the senders share them with the receiver.
// GB = 1e9 bytes of payload.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/util/status.h"

namespace diloco::net {

struct TransportBenchOptions {
  uint64_t payload_bytes = uint64_t{64} << 20;
  int transfers = 5;      // timed runs per figure (median)
  int warmup = 4;         // untimed runs first (the allocator settles; streams use 1)
  int stream_depth = 4;   // messages per streaming run, and per sender in the aggregate run (<= 64)
  bool curve = true;      // also run curve_tcp
  int senders = 1;        // senders at once in the aggregate run (1 .. 64)
  int io_threads = 0;     // the receiving context's ZeroMQ I/O threads; 0: DefaultIoThreads(), as the
                          // daemon's. Each sender's context has one.
  bool in_place = true;   // receive with EnvelopeValidatorInPlace (false: EnvelopeValidator, a copy)
};

struct TransportBenchPath {
  std::string name;  // "tcp", "ipc", "curve_tcp"
  double stack_GBps = 0, raw_zmq_GBps = 0, ratio = 0;
  double stack_ms = 0, raw_ms = 0;  // medians of one transfer
  double stack_cpu_ms = 0, raw_cpu_ms = 0;  // CPU time of the whole process per transfer (medians)
  double build_ms = 0, parse_ms = 0;  // of stack_ms: BuildMessage, and ParseEnvelope (medians)
  double stack_stream_GBps = 0, raw_stream_GBps = 0, stream_ratio = 0;
  // The aggregate run: every sender's payload over the time until the last delta arrived, and
  // that divided by senders (the rate of the sender whose last delta arrived last).
  int senders = 1, io_threads = 1;  // the receiving context's I/O threads
  double aggregate_GBps = 0, raw_aggregate_GBps = 0, aggregate_ratio = 0;
  double per_sender_GBps = 0, raw_per_sender_GBps = 0;
};

Status RunTransportBench(const TransportBenchOptions& options, std::vector<TransportBenchPath>* out);

// {"tcp": {"stack_GBps":…, "raw_zmq_GBps":…, "ratio":…, …, "senders":…, "aggregate_GBps":…, …},
//  "ipc": {…}, "curve_tcp": {…}}
std::string TransportBenchJson(const std::vector<TransportBenchPath>& paths);

}  // namespace diloco::net
