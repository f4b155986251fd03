// The typed, validated config of a training run (`dilococtl train CONFIG
// [--set key=value]...`): a YAML file with the sections model, data, train,
// eval, sync, learners, placement, timing and chaos, plus command-line overrides. The fields are
// below (sync and learners: sync_config.h; chaos: chaos_config.h); the one table of keys that
// binds them to their paths, ranges and doc lines is run_config_keys.cpp, and README's key list
// is printed from it (`dilococtl config keys`).
//
//   model:  {n_layer: 4, n_embd: 128, n_head: 4, block_size: 64, vocab_size: 256}
//   data:   {corpus: PATH, format: bytes, val_fraction: 0.1}
//   train:  {batch_size: 12, steps: 2000, lr: 1e-3, ..., device: cpu, ranks: 1}   # per learner
//   eval:   {every: 0, batches: 20}
//   sync:   {mode: decoupled, learners: 1, grace: {gamma: 0.5, cap_ms: 2000}, ...}
//   learners: [{slowdown: 3}, ...]
//   placement: {syncer: site-s, learners: [site-a, site-b]}   # jobs submitted to dilocod
//   timing: {step_ms: 1000, step_jitter: 0.05, heartbeat_ms: 200, merge_gbps: 10, seed: 1,
//            link: {bandwidth_mbps: 1000, latency_ms: 30, jitter_ms: 0, loss: 0}}  # sync.clock: virtual
//   chaos:  {seed: 1, events: [{at_s: 30, kill: {learner: 1, restart_after_s: 10}}, ...],
//            random: {mtbf_s: 0, mttr_s: 10, from_s: 0, until_s: 0}}   # faults on purpose
//
// Overrides name a key by its dotted path; a list item by its index:
//   --set train.lr=3e-4  --set sync.grace.gamma=0.25  --set sync.codec.up=fp32
//   --set learners.1.slowdown=3        (creates learners 0 and 1 as needed)
//   --set 'learners=[{slowdown: 1}, {slowdown: 3}]'   (replaces the whole list)
//   --set 'chaos.events=[{at_s: 5, kill: {learner: 0}}]'   (events: only the whole list)
// The value is parsed as YAML, so quote strings with special characters.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/config/chaos_config.h"
#include "daemon/config/sync_config.h"
#include "daemon/util/status.h"
#include "kernels/outer_place.h"  // OuterStatePlace: names only, as shard.h
#include "kernels/shard.h"  // ShardMode: a header of names only, no link dependency

namespace diloco {

// The GPT's shape.
struct ModelConfig {
  int n_layer = 4;
  int n_embd = 128;  // must be a multiple of n_head
  int n_head = 4;
  int block_size = 64;  // context length in tokens
  // Token ids are in [0, vocab_size). With data.format bytes a token is a byte, so it must be 256;
  // with tokens it is the tokenizer's size (50257 for GPT-2's BPE), at most 65536 because token
  // files store uint16 ids.
  int vocab_size = 256;
  bool operator==(const ModelConfig&) const = default;
};

// How data.corpus is read (daemon/train/data.h has the exact layouts):
//   bytes:  text; every byte is a token (vocab 256).
//   tokens: uint16 token files as nanoGPT's prepare.py and llm.c's dev/data scripts write them.
enum class DataFormat { kBytes, kTokens };
inline constexpr std::array<std::string_view, 2> kDataFormatNames = {"bytes", "tokens"};
inline std::string_view ToString(DataFormat v) { return kDataFormatNames[static_cast<int>(v)]; }
inline std::string_view ToString(ShardMode v) { return kShardModeNames[static_cast<int>(v)]; }
inline std::string_view ToString(OuterStatePlace v) { return kOuterStatePlaceNames[static_cast<int>(v)]; }

struct DataConfig {
  // A file or a directory of files; always absolute and lexically normalized after loading (it need
  // not exist: the data loader checks).
  std::string corpus;
  DataFormat format = DataFormat::kBytes;
  double val_fraction = 0.1;  // in (0, 0.5]: share of the corpus held out
  bool operator==(const DataConfig&) const = default;
};

struct TrainConfig {
  int batch_size = 12;  // sequences per step
  int steps = 2000;
  double lr = 1e-3;
  double min_lr = 1e-4;
  int warmup_steps = 100;
  int lr_decay_steps = 0;  // 0 = steps (the cosine reaches min_lr at the last step)
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double eps = 1e-8;
  double grad_clip = 1.0;  // max global gradient norm; 0 = off
  uint64_t seed = 1337;
  int threads = 0;           // 0 = all cores
  int checkpoint_every = 0;  // steps; 0 = only at the end
  int log_every = 10;        // steps between metrics.jsonl/progress lines when not on a terminal
  // Wall-clock budget in seconds from the start of training; every learner ends at its first step
  // boundary past it, as if train.steps were reached (0 = none). For equal-wall-time comparisons.
  // A restarted learner keeps the run's budget (a daemon job's counts from its arrival on the site).
  double time_limit_s = 0;
  // Where the learner computes: "cpu", or "cuda" / "cuda:N" for GPUs N .. N+ranks-1 ("cuda" is
  // cuda:0). Only the spelling is checked here; whether the GPUs exist is checked where the job
  // starts (locally) or is submitted (CheckJobFitsSite in daemon_config.h).
  std::string device = "cpu";
  // The learner's local ring: ranks CPU threads (sharing train.threads) or GPUs, each taking
  // batch_size sequences per step, so one learner step sees ranks * batch_size sequences.
  int ranks = 1;
  // Hosts of the learner's site that its ring spans (a ring of hosts × ranks ranks); more than
  // one needs a site of that many hosts, each running dilocod.
  int hosts = 1;
  // How the ring shards its state (kernels/shard.h): none, optimizer (ZeRO-1), gradients (ZeRO-2).
  ShardMode shard = ShardMode::kNone;
  // Block-level activation recompute: the backward runs each block's forward again instead of
  // keeping its activations (about a third more compute, activations of one block).
  bool recompute = false;
  // Where a GPU learner keeps its outer-sync state (kernels/outer_place.h): device or pinned host
  // memory. cuda only.
  OuterStatePlace outer_state = OuterStatePlace::kDevice;
  bool operator==(const TrainConfig&) const = default;
};

// train.device, parsed.
struct DeviceSpec {
  bool cuda = false;
  int first_gpu = 0;  // cuda only: rank r runs on GPU first_gpu + r
  bool operator==(const DeviceSpec&) const = default;
};

// Reads "cpu", "cuda" (= cuda:0) or "cuda:N" (N a decimal index); anything else is an error that
// lists the accepted spellings.
Status ParseDevice(const std::string& text, DeviceSpec* out);

struct EvalConfig {
  int every = 0;     // steps; 0 = only at the end
  int batches = 20;  // validation batches per evaluation
  bool operator==(const EvalConfig&) const = default;
};

// The virtual clock's deployment (sync.clock: virtual; validated always, used only then): what
// the seeded discrete-event scheduler takes as the time of each step, message and merge. The
// model maths runs for real; only time is virtual.
struct TimingConfig {
  double step_ms = 1000;      // a learner's inner step (> 0); learners[i].slowdown multiplies it
  double step_jitter = 0.05;  // each step x (1 + u), u uniform in [-step_jitter, step_jitter]; in [0, 1)
  double heartbeat_ms = 200;  // learners' heartbeat period (> 0)
  double merge_gbps = 10;     // each syncer shard's merge throughput, GB/s of fp32 deltas merged (> 0)
  uint64_t seed = 1;          // the scheduler's draws (jitter, loss); the model's seed is train.seed
  // Every learner <-> syncer link, both directions (learners[i].link overrides one learner's).
  LinkConfig link{1000, 30, 0, 0};
  double syncer_gbps = 0;  // each syncer shard host's NIC, Gbit/s each way (0: unlimited)
  bool operator==(const TimingConfig&) const = default;
};

// Where a job's roles run when it is submitted to dilocod (`dilococtl submit`): the syncer on
// site `syncer`, learner i on site learners[i] (a site may host several roles). Empty: the config
// is for local mode only (`dilococtl train`); submit refuses it. When set, learners has exactly
// sync.learners entries.
struct PlacementConfig {
  // The syncer's site: one (every shard of sync.syncers there) or one per shard (SyncerSite).
  std::vector<std::string> syncer;
  std::vector<std::string> learners;
  bool empty() const { return syncer.empty() && learners.empty(); }
  bool operator==(const PlacementConfig&) const = default;
  // Syncer shard `shard`'s site ("" when unplaced).
  std::string SyncerSite(int shard) const {
    if (syncer.empty()) return "";
    return syncer.size() == 1 ? syncer.front() : syncer.at(shard);
  }
  // The shards of `shards` placed on site, in shard order (a site's n-th shard binds its listen
  // ports + n: ShardListen, daemon_config.h).
  std::vector<int> ShardsOn(const std::string& site, int shards) const {
    std::vector<int> out;
    for (int s = 0; s < shards; s++)
      if (SyncerSite(s) == site) out.push_back(s);
    return out;
  }
};

struct RunConfig {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  EvalConfig eval;
  SyncConfig sync;
  std::vector<LearnerConfig> learners;  // by learner index; at most sync.learners
  PlacementConfig placement;
  ChaosConfig chaos;  // empty: no faults injected
  TimingConfig timing;  // sync.clock: virtual
  bool operator==(const RunConfig&) const = default;
};

// Reads the YAML file at path, applies overrides ("path.to.key=value", the
// value parsed as YAML, later ones win), validates, and fills *out
// (left untouched on error). A relative data.corpus in the file resolves
// against the file's directory; one given with --set against the current
// working directory. Error messages start with "path:line:col" (1-based) or
// "--set key=value" and name the full dotted key.
Status LoadRunConfig(const std::string& path, const std::vector<std::string>& overrides,
                     RunConfig* out);

// The same from text: source_name stands for the file in messages and
// relative paths in the text resolve against base_dir (the current working
// directory when empty).
Status ParseRunConfig(const std::string& yaml_text, const std::string& source_name,
                      const std::string& base_dir, const std::vector<std::string>& overrides,
                      RunConfig* out);

// The resolved config as YAML: every key, doubles printed so that they read
// back exactly, the corpus as an absolute path. ParseRunConfig of the result
// gives back an equal RunConfig.
std::string RunConfigToYaml(const RunConfig& config);

// Every key as the key list shows it, list items as [i]: "train.lr", "learners[i].link.loss",
// "chaos.events[i].kill.learner".
std::vector<std::string> RunConfigKeyNames();

// The key table as Markdown: key, type, default, range, what else checks it, meaning. README's
// key list is this text (`dilococtl config keys` prints it; scripts/readme-keys.sh rewrites it).
std::string RunConfigKeysMarkdown();

}  // namespace diloco
