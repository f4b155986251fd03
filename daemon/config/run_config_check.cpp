// Validating a run config once it is read: every number against its row's range (the key table,
// run_config_keys.cpp), then the relations between keys that no single row can state. Each
// relation is named in the `checked` column of its keys' rows.
#include <algorithm>
#include <string>

#include "daemon/config/run_config.h"
#include "daemon/config/run_config_keys.h"
#include "daemon/config/site_name.h"

namespace diloco {
namespace config_internal {
namespace {

// "ORIGIN: key: DETAIL", the origin being that of the first of blame that was given a value.
class Failure {
 public:
  explicit Failure(const Origins& origins) : origins_(origins) {}
  Status operator()(const std::string& key, const std::string& detail, std::initializer_list<std::string> blame) const {
    return Status::Error(origins_.OfValue(blame) + ": " + key + ": " + detail);
  }

 private:
  const Origins& origins_;
};

Status CheckModelAndData(const RunConfig& c, const Origins& origins) {
  const Failure fail(origins);
  const ModelConfig& m = c.model;
  if (m.n_embd % m.n_head != 0) {
    return fail("model.n_head",
                std::to_string(m.n_head) + " does not divide model.n_embd " + std::to_string(m.n_embd) +
                    "; pick n_head and n_embd so that n_embd / n_head is a whole number",
                {"model.n_head", "model.n_embd"});
  }
  if (c.data.corpus.empty()) {
    return Status::Error(origins.OfValue({"data.corpus"}) +
                         ": data.corpus is required: the path of a text file or a directory of text files; set it "
                         "under 'data:' or pass --set data.corpus=PATH");
  }
  if (c.data.format == DataFormat::kBytes && m.vocab_size != 256) {
    return fail("model.vocab_size",
                std::to_string(m.vocab_size) +
                    " does not fit data.format bytes, whose tokens are bytes (vocab_size 256); set vocab_size: 256, "
                    "or data.format: tokens for a pre-tokenized corpus",
                {"model.vocab_size", "data.format"});
  }
  return Status::Ok();
}

Status CheckTrain(const RunConfig& c, const Origins& origins) {
  const Failure fail(origins);
  const TrainConfig& t = c.train;
  if (t.min_lr > t.lr) {
    return fail("train.min_lr",
                FormatDouble(t.min_lr) + " is greater than train.lr " + FormatDouble(t.lr) +
                    "; lower min_lr or raise lr",
                {"train.min_lr", "train.lr"});
  }
  DeviceSpec device;
  if (Status status = ParseDevice(t.device, &device); !status.ok()) {
    return fail("train.device", status.message(), {"train.device"});
  }
  // ddp runs every learner in one ring.
  const int ring_ranks = t.hosts * t.ranks * (c.sync.mode == SyncMode::kDdp ? std::max(1, c.sync.learners) : 1);
  if (t.shard != ShardMode::kNone && ring_ranks < 2) {
    return fail("train.shard",
                std::string(ToString(t.shard)) +
                    " shards the learner's state over its ring, and a ring of 1 rank has nothing to shard: set "
                    "train.ranks (or train.hosts) to 2 or more, or train.shard: none",
                {"train.shard", "train.ranks", "train.hosts"});
  }
  if (t.outer_state == OuterStatePlace::kHost && !device.cuda) {
    return fail("train.outer_state",
                "host moves a GPU learner's outer-sync state to pinned host memory; train.device " + t.device +
                    " keeps it in host memory already: remove train.outer_state or set a cuda device",
                {"train.outer_state", "train.device"});
  }
  return Status::Ok();
}

Status CheckSync(const RunConfig& c, const Origins& origins) {
  const Failure fail(origins);
  const SyncConfig& s = c.sync;
  if (s.mode != SyncMode::kDdp && s.overlap >= s.inner_steps) {
    return fail("sync.overlap",
                std::to_string(s.overlap) + " is not less than sync.inner_steps " + std::to_string(s.inner_steps) +
                    ": a fragment's delta must be back before the fragment fires again; lower overlap or raise "
                    "inner_steps",
                {"sync.overlap", "sync.inner_steps"});
  }
  if (s.quorum > s.learners) {
    return fail("sync.quorum",
                std::to_string(s.quorum) + " is greater than sync.learners " + std::to_string(s.learners) +
                    "; lower quorum or add learners",
                {"sync.quorum", "sync.learners"});
  }
  if (s.syncers > EffectiveFragments(s)) {
    return fail("sync.syncers",
                std::to_string(s.syncers) + " shards for " + std::to_string(EffectiveFragments(s)) +
                    (EffectiveFragments(s) == 1 ? " fragment (sync.mode " + std::string(ToString(s.mode)) + " runs one)"
                                                : " fragments") +
                    ": a shard owns at least one fragment; lower sync.syncers or raise sync.fragments",
                {"sync.syncers", "sync.fragments", "sync.mode"});
  }
  if (s.codec.keep > s.codec.chunk) {
    return fail("sync.codec.keep",
                std::to_string(s.codec.keep) + " is greater than sync.codec.chunk " + std::to_string(s.codec.chunk) +
                    "; keep fewer values or use larger chunks",
                {"sync.codec.keep", "sync.codec.chunk"});
  }
  if (s.codec.up == CodecKind::kTopkChunked && s.codec.up_topk != 0) {
    return fail("sync.codec.up_topk", "must be 0 with sync.codec.up: topk_chunked (it picks its own values)",
                {"sync.codec.up_topk", "sync.codec.up"});
  }
  if (s.codec.down == CodecKind::kTopkChunked && s.codec.down_topk != 0) {
    return fail("sync.codec.down_topk", "must be 0 with sync.codec.down: topk_chunked (it picks its own values)",
                {"sync.codec.down_topk", "sync.codec.down"});
  }
  if (c.learners.size() > static_cast<size_t>(s.learners)) {
    return fail("learners",
                "has " + std::to_string(c.learners.size()) + " entries but sync.learners is " +
                    std::to_string(s.learners) + "; remove entries or raise sync.learners",
                {"learners", "sync.learners"});
  }
  return Status::Ok();
}

// The placement section: empty, or a syncer site and one site per learner.
Status CheckPlacement(const RunConfig& c, const Origins& origins) {
  const PlacementConfig& p = c.placement;
  if (p.empty()) return Status::Ok();
  auto fail = [&](const std::string& key, const std::string& detail) {
    return Status::Error(origins.OfValue({key, "placement.learners", "placement.syncer"}) + ": " + key + ": " +
                         detail);
  };
  auto not_a_site = [](const std::string& name) {
    return "'" + name + "' is not a site name (" + std::string(kSiteNameRule) + ")";
  };
  if (p.syncer.empty()) {
    return fail("placement.syncer",
                "is required when placement.learners is set: the site that hosts the syncer, e.g. "
                "placement: {syncer: site-s, learners: [site-a, site-b]}");
  }
  for (const std::string& site : p.syncer)
    if (!IsSiteName(site)) return fail("placement.syncer", not_a_site(site));
  if (p.syncer.size() != 1 && p.syncer.size() != static_cast<size_t>(c.sync.syncers)) {
    return fail("placement.syncer", "names " + std::to_string(p.syncer.size()) + " sites but sync.syncers is " +
                                        std::to_string(c.sync.syncers) +
                                        "; give one site (every shard there) or one per shard (a site may repeat)");
  }
  if (p.learners.size() != static_cast<size_t>(c.sync.learners)) {
    return fail("placement.learners", "names " + std::to_string(p.learners.size()) + " sites but sync.learners is " +
                                          std::to_string(c.sync.learners) +
                                          "; list one site per learner (a site may repeat)");
  }
  for (const std::string& site : p.learners) {
    if (!IsSiteName(site)) return fail("placement.learners", not_a_site(site));
  }
  return Status::Ok();
}

// The chaos section: each event's trigger and action keys against their rows' ranges, learner
// indices against sync.learners, and the random failures' window.
Status CheckChaos(const RunConfig& c, const Origins& origins) {
  const Failure fail(origins);
  const int learners = c.sync.learners;
  for (size_t i = 0; i < c.chaos.events.size(); ++i) {
    ChaosEvent e = c.chaos.events[i];
    const std::string item = "chaos.events." + std::to_string(i);
    const std::string action(ToString(e.kind));
    const std::string trigger = e.at_step >= 0 ? "at_step" : "at_s";
    for (Key& key : ChaosEventKeysOf(&e)) {
      if (key.path != trigger && key.path.compare(0, action.size() + 1, action + ".") != 0) continue;
      key.path = item + "." + key.path;
      DL_RETURN_IF_ERROR(CheckRange(key, origins));
    }
    if (e.kind == ChaosEventKind::kSyncerKill && (e.shard < -1 || e.shard >= c.sync.syncers)) {
      const std::string key = item + ".syncer_kill.shard";
      return fail(key,
                  std::to_string(e.shard) + " is not a syncer shard: sync.syncers is " + std::to_string(c.sync.syncers) +
                      ", so shards are 0 .. " + std::to_string(c.sync.syncers - 1) + "; leave it out for every shard",
                  {key, "sync.syncers"});
    }
    // drop and corrupt leave learner out (-1) for every learner's link.
    const bool all_ok = !IsLearnerEvent(e.kind) && e.learner == -1;
    if (e.kind != ChaosEventKind::kSyncerKill && !all_ok && (e.learner < 0 || e.learner >= learners)) {
      const std::string key = item + "." + action + ".learner";
      return fail(key,
                  std::to_string(e.learner) + " is not a learner: sync.learners is " + std::to_string(learners) +
                      ", so learners are 0 .. " + std::to_string(learners - 1) +
                      (IsLearnerEvent(e.kind) ? "" : "; leave it out for every learner's link"),
                  {key, "sync.learners"});
    }
  }
  const RandomFailureConfig& r = c.chaos.random;
  if (r.until_s > 0 && r.until_s <= r.from_s) {
    return fail("chaos.random.until_s",
                FormatDouble(r.until_s) + " is not after chaos.random.from_s " + FormatDouble(r.from_s) +
                    "; raise until_s, or 0 for the end of the run",
                {"chaos.random.until_s", "chaos.random.from_s"});
  }
  return Status::Ok();
}

}  // namespace

Status Validate(const RunConfig& c, const Origins& origins) {
  RunConfig copy = c;  // KeysOf binds mutable pointers
  for (const Key& key : KeysOf(&copy)) DL_RETURN_IF_ERROR(CheckRange(key, origins));
  DL_RETURN_IF_ERROR(CheckModelAndData(c, origins));
  DL_RETURN_IF_ERROR(CheckTrain(c, origins));
  DL_RETURN_IF_ERROR(CheckSync(c, origins));
  DL_RETURN_IF_ERROR(CheckPlacement(c, origins));
  return CheckChaos(c, origins);
}

}  // namespace config_internal

Status ParseDevice(const std::string& text, DeviceSpec* out) {
  DeviceSpec spec;
  bool ok = true;
  if (text == "cpu") {
  } else if (text == "cuda") {
    spec.cuda = true;
  } else if (text.rfind("cuda:", 0) == 0) {
    const std::string index = text.substr(5);
    // Plain decimal digits only: "cuda:+1", "cuda: 1" and "cuda:-1" are typos, not indices.
    ok = !index.empty() && index.size() <= 4 &&
         std::all_of(index.begin(), index.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (ok) {
      spec.cuda = true;
      spec.first_gpu = std::stoi(index);
    }
  } else {
    ok = false;
  }
  if (!ok) {
    return Status::Error("'" + text +
                         "' is not a device; write cpu, cuda (= cuda:0) or cuda:N (the first of the GPUs "
                         "N .. N+ranks-1)");
  }
  *out = spec;
  return Status::Ok();
}

}  // namespace diloco
