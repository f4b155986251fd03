// The commands of dilococtl. Each returns the process exit code:
// 0 ok, 1 failed, 2 usage (bad flags or config).
#pragma once

#include <string>
#include <vector>

namespace diloco {

struct TrainCommand {
  std::string config_path;
  std::vector<std::string> overrides;  // --set key=value
  std::string out_dir;                 // empty: runs/<config name>-<time>
  bool json = false;                   // last stdout line: the summary object
  bool resume = false;                 // continue from out_dir's checkpoint
};
int RunTrainCommand(const TrainCommand& cmd);

struct SampleCommand {
  std::string checkpoint;
  std::string prompt;
  int tokens = 200;
  double temperature = 1.0;
  uint64_t seed = 1337;
};
int RunSampleCommand(const SampleCommand& cmd);

struct BenchEngineCommand {
  std::string preset = "small";
  int threads = 1;
  int steps = 0;
  int warmup = 0;
  bool json = false;
};
int RunBenchEngineCommand(const BenchEngineCommand& cmd);

struct BenchGemmCommand {
  int m = 1024, n = 1536, k = 384;  // gpt2ish's MLP up-projection
  int threads = 1;
  bool json = false;
};
int RunBenchGemmCommand(const BenchGemmCommand& cmd);

struct BenchCodecCommand {
  int size_mib = 64;    // of fp32 Gaussian input
  int block_size = 64;  // int8/int4 values per scale
  int repeats = 7;      // timed runs of each direction; the median is reported
  bool json = false;    // last stdout line: {"int8": {"encode_GBps": ...}, ...}
};
int RunBenchCodecCommand(const BenchCodecCommand& cmd);

struct BenchTransportCommand {
  int size_mib = 64;     // payload of the fp32 delta
  int transfers = 5;     // timed runs per figure; the median is reported
  int stream_depth = 4;  // deltas back to back in the streaming figure (0: skip it); per sender in the aggregate
  int senders = 1;       // senders at once into one receiving socket in the aggregate figure
  int io_threads = 0;    // the receiving context's ZeroMQ I/O threads; 0: as the daemon (net.io_threads' default)
  bool no_curve = false;
  bool json = false;     // last stdout line: {"tcp": {"stack_GBps": ...}, "ipc": ..., "curve_tcp": ...}
};
int RunBenchTransportCommand(const BenchTransportCommand& cmd);

struct BenchSyncerCommand {
  long long params = 25'000'000;  // of the synthetic GPT-shaped model
  int learners = 8;                // M: one delta of each per fragment
  int fragments = 24;              // P (the paper's default)
  int open_rounds = 0;             // fragments whose rounds are open at once (0: all P, the worst case)
  std::string codec = "int4";      // the uplink codec of the deltas
  std::string down_codec = "int8";  // the downlink codec of the updates (sync.codec.down's default)
  int threads = 0;                 // merge threads (0: sync.merge_threads' default), per shard
  int syncers = 1;                 // S: shards merging their fragments at once
  int rounds = 3;                  // timed rounds; the median is reported
  bool json = false;               // one JSON object: merge_GBps, copy_GBps, peak_rss_mb, ...
};
int RunBenchSyncerCommand(const BenchSyncerCommand& cmd);

struct KeygenCommand {
  std::string out_dir;  // writes key.public and key.secret (0600) here
  bool force = false;   // replace an existing pair
};
int RunKeygenCommand(const KeygenCommand& cmd);

}  // namespace diloco
