// The run config's key table: the one place that lists every key (see run_config_keys.h).
#include "daemon/config/run_config_keys.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <utility>

#include "daemon/config/yaml_helpers.h"
#include "daemon/net/codec_kind.h"

namespace diloco::config_internal {
namespace {

std::string WithNote(std::string text, const std::string& note) {
  return note.empty() ? text : text + " (" + note + ")";
}

template <typename E, size_t N>
EnumField EnumOf(E* field, const std::array<std::string_view, N>& names) {
  return {std::vector<std::string>(names.begin(), names.end()), [field] { return static_cast<int>(*field); },
          [field](int i) { *field = static_cast<E>(i); }};
}

// Codec values start at 1 (0 is invalid on the wire).
EnumField CodecOf(CodecKind* field) {
  std::vector<std::string> names;
  for (uint8_t v = 1; IsValidCodecKind(v); ++v) names.emplace_back(CodecName(static_cast<CodecKind>(v)));
  return {names, [field] { return static_cast<int>(*field) - 1; },
          [field](int i) { *field = static_cast<CodecKind>(i + 1); }};
}

bool IsEven(double v) { return static_cast<long long>(v) % 2 == 0; }

// The keys of a link (sync.link, timing.link, learners[i].link), under prefix.
void AddLinkKeys(const std::string& prefix, LinkConfig* l, std::vector<Key>* keys) {
  keys->push_back({prefix + ".bandwidth_mbps", &l->bandwidth_mbps, AtLeast(0, "0 = unlimited"),
                   "the link's bandwidth, megabits per second, each way"});
  keys->push_back({prefix + ".latency_ms", &l->latency_ms, AtLeast(0), "one-way latency"});
  keys->push_back({prefix + ".jitter_ms", &l->jitter_ms, AtLeast(0), "latency jitter added to each message"});
  keys->push_back({prefix + ".loss", &l->loss, Within(0, 1, "[)"), "probability a message is lost"});
}

// The keys of one learners[i] item, relative to it.
std::vector<Key> LearnerKeysOf(LearnerConfig* l) {
  std::vector<Key> keys = {
      {"slowdown", &l->slowdown, AtLeast(1, "1 = full speed"), "factor on this learner's step time (a slower site)"},
      {"jitter", &l->jitter, Within(0, 10, "[]", "mean extra fraction of a step; 0 = no noise"),
       "each step is stretched by 1 + e, e exponential with this mean"},
      {"link", OptionalSection{&l->has_link}, {}, "sync.clock virtual: this learner's link to the syncer (both ways)",
       "used instead of timing.link; written back only when given"},
  };
  AddLinkKeys("link", &l->link, &keys);
  return keys;
}

}  // namespace

Range AtLeast(double min, const std::string& note) {
  return {WithNote(">= " + FormatDouble(min), note), [min](double v) { return v >= min; }};
}

Range Above(double min, const std::string& note) {
  return {WithNote("> " + FormatDouble(min), note), [min](double v) { return v > min; }};
}

Range Within(double lo, double hi, const char* brackets, const std::string& note) {
  const bool lo_closed = brackets[0] == '[', hi_closed = brackets[1] == ']';
  return {WithNote("in " + std::string(1, brackets[0]) + FormatDouble(lo) + ", " + FormatDouble(hi) +
                       std::string(1, brackets[1]),
                   note),
          [=](double v) { return (lo_closed ? v >= lo : v > lo) && (hi_closed ? v <= hi : v < hi); }};
}

Range Rule(const std::string& text, std::function<bool(double)> ok) { return {text, std::move(ok)}; }

std::vector<Key> ChaosEventKeysOf(ChaosEvent* e) {
  const std::string learner = "the learner it hits";
  const std::string duration = "seconds until it is undone";
  return {
      {"at_s", &e->at_s, AtLeast(0, "seconds since training start"), "trigger: seconds since training started",
       "one trigger per event"},
      {"at_step", &e->at_step, AtLeast(0), "trigger: a step of the event's learner (kill, slow, partition)",
       "one trigger per event"},
      {"kill.learner", &e->learner, {}, learner, "a learner index (< sync.learners)"},
      {"kill.restart_after_s", &e->restart_after_s, {}, "restart it after this many seconds; absent or < 0: never"},
      {"slow.learner", &e->learner, {}, learner, "a learner index (< sync.learners)"},
      {"slow.factor", &e->factor, Above(0, "the learner's step time is multiplied by it"), "step-time multiplier"},
      {"slow.duration_s", &e->duration_s, Above(0), duration},
      {"partition.learner", &e->learner, {}, "the learner cut off (both directions of its link)",
       "a learner index (< sync.learners)"},
      {"partition.duration_s", &e->duration_s, Above(0), duration},
      {"drop.learner", &e->learner, {}, "the learner whose messages are dropped; absent: every learner",
       "a learner index (< sync.learners)"},
      {"drop.prob", &e->prob, Within(0, 1, "[]"), "per-message probability"},
      {"drop.duration_s", &e->duration_s, Above(0), duration},
      {"corrupt.learner", &e->learner, {}, "the learner whose messages are corrupted; absent: every learner",
       "a learner index (< sync.learners)"},
      {"corrupt.prob", &e->prob, Within(0, 1, "[]"), "per-message probability"},
      {"corrupt.duration_s", &e->duration_s, Above(0), duration},
      {"syncer_kill.restart_after_s", &e->restart_after_s, {},
       "restart the syncer after this many seconds; absent or < 0: never"},
      {"syncer_kill.shard", &e->shard, {}, "the syncer shard it kills (sync.syncers > 1); absent: every shard",
       "a shard index (< sync.syncers)"},
  };
}

bool IsRequiredChaosKey(ChaosEventKind kind, const std::string& name) {
  if (name == "learner") return IsLearnerEvent(kind);
  return name != "restart_after_s" && name != "shard";
}

std::vector<Key> KeysOf(RunConfig* c) {
  ModelConfig& m = c->model;
  DataConfig& d = c->data;
  TrainConfig& t = c->train;
  EvalConfig& e = c->eval;
  SyncConfig& s = c->sync;
  TimingConfig& timing = c->timing;
  LearnerConfig sample;
  const std::vector<std::string> learner_names = ChildrenOf(LearnerKeysOf(&sample), "");
  const std::string at_end = "0 = only at the end";
  std::vector<Key> keys = {
      {"model.n_layer", &m.n_layer, AtLeast(1), "transformer blocks"},
      {"model.n_embd", &m.n_embd, AtLeast(1), "embedding width", "a multiple of model.n_head"},
      {"model.n_head", &m.n_head, AtLeast(1), "attention heads", "divides model.n_embd"},
      {"model.block_size", &m.block_size, AtLeast(1), "context length in tokens"},
      {"model.vocab_size", &m.vocab_size, Within(2, 65536, "[]", "token files store uint16 ids"),
       "token ids are in [0, vocab_size)", "256 with data.format bytes"},
      {"data.corpus", PathField{&d.corpus}, {}, "a file or a directory of files (relative: to the config's directory)",
       "required; the data loader reads it"},
      {"data.format", EnumOf(&d.format, kDataFormatNames), {},
       "bytes: every byte a token; tokens: uint16 token files (daemon/train/data.h)"},
      {"data.val_fraction", &d.val_fraction, Within(0, 0.5, "(]"), "share of the corpus held out for validation"},
      {"train.batch_size", &t.batch_size, AtLeast(1), "sequences per step and rank"},
      {"train.steps", &t.steps, AtLeast(0), "inner steps of each learner"},
      {"train.lr", &t.lr, AtLeast(0), "peak learning rate (AdamW)"},
      {"train.min_lr", &t.min_lr, AtLeast(0), "learning rate the cosine ends at", "<= train.lr"},
      {"train.warmup_steps", &t.warmup_steps, AtLeast(0), "steps of linear warmup"},
      {"train.lr_decay_steps", &t.lr_decay_steps, AtLeast(0, "0 = train.steps"), "steps of the cosine decay"},
      {"train.weight_decay", &t.weight_decay, AtLeast(0), "AdamW weight decay"},
      {"train.beta1", &t.beta1, Within(0, 1, "[)"), "AdamW beta1"},
      {"train.beta2", &t.beta2, Within(0, 1, "[)"), "AdamW beta2"},
      {"train.eps", &t.eps, Above(0), "AdamW epsilon"},
      {"train.grad_clip", &t.grad_clip, AtLeast(0, "0 turns clipping off"), "max global gradient norm"},
      {"train.seed", &t.seed, {}, "the model's initialization and the data order"},
      {"train.threads", &t.threads, AtLeast(0, "0 uses all cores"), "CPU compute threads"},
      {"train.checkpoint_every", &t.checkpoint_every, AtLeast(0, at_end), "steps between checkpoints"},
      {"train.log_every", &t.log_every, AtLeast(1), "steps between metrics lines when not on a terminal"},
      {"train.time_limit_s", &t.time_limit_s, AtLeast(0, "0 = no limit"),
       "wall-clock budget of the run; each learner ends at its first step past it"},
      {"train.device", &t.device, {}, "cpu, cuda (= cuda:0) or cuda:N: GPUs N .. N+ranks-1",
       "spelling: ParseDevice; the GPUs: where the job starts or is submitted (CheckJobFitsSite)"},
      {"train.ranks", &t.ranks, AtLeast(1, "the learner's local ring size"),
       "ranks of the learner's ring (CPU threads or GPUs), each taking batch_size sequences a step"},
      {"train.hosts", &t.hosts, AtLeast(1, "the hosts of the site the learner's ring spans"),
       "hosts of its site the learner's ring spans", "the site has them (CheckJobFitsSiteHosts)"},
      {"train.shard", EnumOf(&t.shard, kShardModeNames), {},
       "how the ring shards its state: optimizer (ZeRO-1), gradients (ZeRO-2)", "a ring of 2 or more ranks"},
      {"train.recompute", EnumOf(&t.recompute, kBoolNames), {},
       "the backward runs each block's forward again instead of keeping its activations"},
      {"train.outer_state", EnumOf(&t.outer_state, kOuterStatePlaceNames), {},
       "where a GPU learner keeps its outer-sync state: device, or pinned host memory", "a cuda device"},
      {"eval.every", &e.every, AtLeast(0, at_end), "steps between evaluations"},
      {"eval.batches", &e.batches, AtLeast(1), "validation batches per evaluation"},
      {"sync.mode", EnumOf(&s.mode, kSyncModeNames), {}, "how learners and the syncer train one model"},
      {"sync.learners", &s.learners, AtLeast(1), "learners M"},
      {"sync.fragments", &s.fragments, AtLeast(1), "fragments P (diloco and ddp use 1)"},
      {"sync.syncers", &s.syncers, AtLeast(1), "syncer shards S, each owning its share of the fragments",
       "<= the fragments the mode runs with"},
      {"sync.inner_steps", &s.inner_steps, AtLeast(1), "inner steps H between two syncs of a fragment"},
      {"sync.overlap", &s.overlap, AtLeast(0), "inner steps a delta may be in flight (tau)",
       "< sync.inner_steps (but ddp)"},
      {"sync.quorum", &s.quorum, AtLeast(1), "deltas K a decoupled round waits for", "<= sync.learners"},
      {"sync.grace.gamma", &s.grace.gamma, Within(0, 1, "[]"), "share of the slack the syncer may spend waiting"},
      {"sync.grace.cap_ms", &s.grace.cap_ms, AtLeast(0, "0 turns the grace window off"),
       "upper bound of the grace window"},
      {"sync.grace.cap_steps", &s.grace.cap_steps, AtLeast(0, "inner steps; 0 = sync.grace.cap_ms alone"),
       "the window is also at most this many of the fleet's step times"},
      {"sync.grace.step_time", EnumOf(&s.grace.step_time, kGraceStepTimeNames), {},
       "the step time that sizes the window: the slowest live learner's or the mean"},
      {"sync.grace.forecast", EnumOf(&s.grace.forecast, kBoolNames), {},
       "stretch the window (up to the cap) for live learners whose delta is due"},
      {"sync.grace.straggler_ratio", &s.grace.straggler_ratio, AtLeast(0, "0 = wait for every due learner"),
       "the forecast does not wait for learners this many times slower than the fleet's median step"},
      {"sync.max_staleness", &s.max_staleness, AtLeast(0, "0 = only deltas based on the current version"),
       "versions; older deltas are dropped"},
      {"sync.weighting", EnumOf(&s.weighting, kWeightingNames), {}, "merge weights: c_tok^2 / c_steps, or equal"},
      {"sync.merge", EnumOf(&s.merge, kMergeRuleNames), {}, "how a round's deltas are merged"},
      {"sync.fold", EnumOf(&s.fold, kFoldRuleNames), {}, "how a learner takes a new global fragment in"},
      {"sync.alpha", &s.alpha, Within(0, 1, "[]"), "fold mix: the share of the local fragment kept"},
      {"sync.age_power", &s.age_power, Within(0, 8, "[]", "0 = no age-aware scaling"),
       "a delta's weight x (1 + versions behind)^-age_power"},
      {"sync.anchor", EnumOf(&s.anchor, kAnchorNames), {},
       "a delta's anchor: its base version, or the current one (re-anchored)"},
      {"sync.partial", EnumOf(&s.partial, kPartialRoundNames), {},
       "a round of k of M deltas moves the model by all of its merge, or k/M of it"},
      {"sync.lr_clock", EnumOf(&s.lr_clock, kLrClockNames), {},
       "the inner LR schedule follows the learner's own steps, or the fleet's"},
      {"sync.codec.up", CodecOf(&s.codec.up), {}, "learner -> syncer codec"},
      {"sync.codec.down", CodecOf(&s.codec.down), {}, "syncer -> learner codec"},
      {"sync.codec.block", &s.codec.block,
       Rule("even, in [2, 65536] (values per scale; int4 packs two per byte)",
            [](double v) { return v >= 2 && v <= 65536 && IsEven(v); }),
       "values per fp32 scale (int8, int4)"},
      {"sync.codec.up_topk", &s.codec.up_topk,
       Rule("0 (dense) or in (0, 1) (the share of each tensor's values sent)",
            [](double f) { return f == 0 || (f > 0 && f < 1); }),
       "top-k: send only each tensor's largest share of values up", "0 with sync.codec.up: topk_chunked"},
      {"sync.codec.down_topk", &s.codec.down_topk,
       Rule("0 (dense) or in (0, 1) (the share of each tensor's values sent)",
            [](double f) { return f == 0 || (f > 0 && f < 1); }),
       "top-k on the downlink", "0 with sync.codec.down: topk_chunked"},
      {"sync.codec.chunk", &s.codec.chunk,
       Rule("even, in [2, 65536] (values per topk_chunked chunk)",
            [](double v) { return v >= 2 && v <= 65536 && IsEven(v); }),
       "topk_chunked: values per chunk"},
      {"sync.codec.keep", &s.codec.keep, AtLeast(1, "values kept of each chunk"), "topk_chunked: values kept a chunk",
       "<= sync.codec.chunk"},
      {"sync.codec.bits", &s.codec.bits,
       Rule("2, 4 or 8 (bits of each kept value)", [](double b) { return b == 2 || b == 4 || b == 8; }),
       "topk_chunked: bits of each kept value's code"},
      {"sync.codec.feedback", EnumOf(&s.codec.feedback, kFeedbackNames), {},
       "error feedback: e <- e + delta, or e <- decay e + delta"},
      {"sync.codec.decay", &s.codec.decay, Within(0, 1, "(]", "the accumulator's decay"),
       "feedback accumulate: the decay"},
      {"sync.outer.lr", &s.outer.lr, Above(0), "outer Nesterov learning rate"},
      {"sync.outer.momentum", &s.outer.momentum, Within(0, 1, "[)"), "outer Nesterov momentum"},
      {"sync.outer.restart_every", &s.outer.restart_every,
       AtLeast(0, "merges of a fragment between momentum restarts; 0 = never"),
       "zero a fragment's momentum before every N-th merge"},
  };
  AddLinkKeys("sync.link", &s.link, &keys);
  keys.insert(
      keys.end(),
      {
          {"sync.heartbeat_timeout_ms", &s.heartbeat_timeout_ms, AtLeast(1),
           "a learner silent this long is not waited for"},
          {"sync.norm_limit", &s.norm_limit, Rule("0 (off) or > 1", [](double k) { return k == 0 || k > 1; }),
           "reject deltas whose norm is over norm_limit x the median"},
          {"sync.checkpoint_every", &s.checkpoint_every, AtLeast(0, at_end), "merges between syncer checkpoints"},
          {"sync.merge_threads", &s.merge_threads, Within(1, 64, "[]", "threads of one merge"),
           "the syncer's merge threads (results do not depend on them)"},
          {"sync.clock", EnumOf(&s.clock, kClockSourceNames), {},
           "time from the machine, or from a seeded scheduler driven by timing"},
          {"learners", ListField{[c](size_t n) { c->learners.resize(n); }, learner_names}, {},
           "per learner, by index (at most sync.learners)", "<= sync.learners items"},
          {"placement.syncer", StringListField{&c->placement.syncer, true}, {},
           "the site of the syncer (dilocod jobs), or of each of its sync.syncers shards",
           "a site name (every shard there) or sync.syncers of them; required with placement.learners"},
          {"placement.learners", StringListField{&c->placement.learners}, {}, "the site of each learner",
           "site names, sync.learners of them"},
          {"timing.step_ms", &timing.step_ms, Above(0),
           "sync.clock virtual: a learner's inner step (times learners[i].slowdown)"},
          {"timing.step_jitter", &timing.step_jitter, Within(0, 1, "[)"),
           "each step x (1 + u), u uniform in [-step_jitter, step_jitter]"},
          {"timing.heartbeat_ms", &timing.heartbeat_ms, Above(0), "learners' heartbeat period"},
          {"timing.merge_gbps", &timing.merge_gbps, Above(0),
           "each syncer shard's merge throughput, GB/s of fp32 deltas"},
          {"timing.syncer_gbps", &timing.syncer_gbps, AtLeast(0, "0 = unlimited"),
           "each syncer shard host's NIC, Gbit/s each way"},
          {"timing.seed", &timing.seed, {}, "the scheduler's draws (jitter, loss)"},
      });
  AddLinkKeys("timing.link", &timing.link, &keys);
  keys.insert(keys.end(),
              {
                  {"chaos.seed", &c->chaos.seed, {}, "the random failures' draws"},
                  {"chaos.events", ChaosEventsField{&c->chaos.events}, {},
                   "scripted faults: each one trigger and one action", "learners < sync.learners"},
                  {"chaos.random.mtbf_s", &c->chaos.random.mtbf_s, AtLeast(0, "0 = no random failures"),
                   "mean seconds a learner runs between failures"},
                  {"chaos.random.mttr_s", &c->chaos.random.mttr_s, Above(0),
                   "mean seconds until a failed learner restarts"},
                  {"chaos.random.from_s", &c->chaos.random.from_s, AtLeast(0), "failures start then"},
                  {"chaos.random.until_s", &c->chaos.random.until_s, AtLeast(0, "0 = the end of the run"),
                   "failures end then", "> chaos.random.from_s"},
              });
  for (size_t i = 0; i < c->learners.size(); ++i) {
    for (Key& key : LearnerKeysOf(&c->learners[i])) {
      key.path = "learners." + std::to_string(i) + "." + key.path;
      keys.push_back(std::move(key));
    }
  }
  return keys;
}

std::string ChildPath(const std::string& parent, const std::string& name) {
  return parent.empty() ? name : parent + "." + name;
}

std::vector<std::string> Split(const std::string& path) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (true) {
    const size_t dot = path.find('.', begin);
    parts.push_back(path.substr(begin, dot - begin));
    if (dot == std::string::npos) return parts;
    begin = dot + 1;
  }
}

std::vector<std::string> ChildrenOf(const std::vector<Key>& keys, const std::string& parent) {
  const std::string prefix = parent.empty() ? "" : parent + ".";
  std::vector<std::string> names;
  for (const Key& key : keys) {
    if (key.path.compare(0, prefix.size(), prefix) != 0 || key.path.size() == prefix.size()) continue;
    std::string name = key.path.substr(prefix.size());
    name = name.substr(0, name.find('.'));
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

const Key* FindKey(const std::vector<Key>& keys, const std::string& path) {
  for (const Key& key : keys) {
    if (key.path == path) return &key;
  }
  return nullptr;
}

bool IsContainer(const Key& key) {
  return std::holds_alternative<ListField>(key.field) || std::holds_alternative<OptionalSection>(key.field);
}

bool NumberOf(const Key& key, double* value) {
  if (auto* field = std::get_if<int*>(&key.field)) {
    *value = **field;
  } else if (auto* field = std::get_if<double*>(&key.field)) {
    *value = **field;
  } else if (auto* field = std::get_if<uint64_t*>(&key.field)) {
    *value = static_cast<double>(**field);
  } else {
    return false;
  }
  return true;
}

std::string FormatDouble(double value) {
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

std::string Origins::At(const std::string& key, const YAML::Mark& mark) const {
  for (std::string k = key;;) {
    auto it = overrides_.find(k);
    if (it != overrides_.end()) return it->second;
    const size_t dot = k.rfind('.');
    if (dot == std::string::npos) break;
    k.resize(dot);  // the parent
  }
  return Where(source_name_, mark);
}

std::string Origins::OfValue(std::initializer_list<std::string> keys) const {
  for (const std::string& key : keys) {
    auto it = values_.find(key);
    if (it != values_.end()) return it->second;
  }
  return source_name_;
}

Status CheckRange(const Key& key, const Origins& origins) {
  double value = 0;
  if (key.range.empty() || !NumberOf(key, &value) || key.range.ok(value)) return Status::Ok();
  return Status::Error(origins.OfValue({key.path}) + ": " + key.path + ": must be " + key.range.text + ", got " +
                       FormatDouble(value));
}

}  // namespace diloco::config_internal
