#include "daemon/config/run_config.h"

#include "daemon/config/yaml_helpers.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <system_error>
#include <utility>
#include <variant>

namespace diloco {
namespace {

namespace fs = std::filesystem;
using config_internal::DidYouMean;
using config_internal::Describe;
using config_internal::Join;

// ---------------------------------------------------------------------------
// The key table: the one place that lists every key, by its dotted path.
// Reading, writing and the "known keys" of error messages all come from it; to
// add a key, add a row where it should appear in the written YAML and its
// checks in Validate(). A path's parents are sections (mappings); a row may itself be a
// list of sections, whose items' keys are rows "list.<i>.<key>".

// A string that names a file; resolved to an absolute path when read.
struct PathField {
  std::string* value;
};

// An enum spelled as one of a few names.
struct EnumField {
  std::vector<std::string> names;  // the allowed spellings
  std::function<int()> get;        // index into names
  std::function<void(int)> set;
};

// A list of sections, e.g. learners: [{slowdown: 3}].
struct ListField {
  std::function<void(size_t)> resize;
  std::vector<std::string> item_names;  // the keys of one item, for messages
};

// A list of plain strings, e.g. placement.learners: [site-a, site-b].
struct StringListField {
  std::vector<std::string>* value;
};

// chaos.events: a list whose items each hold one of several action sections, read and written by
// ReadChaosEvents / ChaosEventsToYaml with the item table ChaosEventKeysOf.
struct ChaosEventsField {
  std::vector<ChaosEvent>* value;
};

using FieldRef = std::variant<int*, uint64_t*, double*, std::string*, PathField, EnumField, ListField,
                              StringListField, ChaosEventsField>;

struct Key {
  std::string path;  // "train.lr", "sync.grace.gamma", "learners.0.slowdown"
  FieldRef field;
};

template <typename E, size_t N>
EnumField EnumOf(E* field, const std::array<std::string_view, N>& names) {
  return {std::vector<std::string>(names.begin(), names.end()),
          [field] { return static_cast<int>(*field); },
          [field](int i) { *field = static_cast<E>(i); }};
}

// Codec values start at 1 (0 is invalid on the wire).
EnumField CodecOf(CodecKind* field) {
  std::vector<std::string> names;
  for (uint8_t v = 1; IsValidCodecKind(v); ++v) {
    names.emplace_back(CodecName(static_cast<CodecKind>(v)));
  }
  return {names, [field] { return static_cast<int>(*field) - 1; },
          [field](int i) { *field = static_cast<CodecKind>(i + 1); }};
}

// The keys of one learners[i] item, relative to it.
std::vector<Key> LearnerKeysOf(LearnerConfig* l) { return {{"slowdown", &l->slowdown}, {"jitter", &l->jitter}}; }

// The keys of one chaos.events item, relative to it: the two triggers, then a section per action
// (an event has one trigger and one action: ReadChaosEvents checks). The actions' keys share
// ChaosEvent's fields.
std::vector<Key> ChaosEventKeysOf(ChaosEvent* e) {
  return {
      {"at_s", &e->at_s},
      {"at_step", &e->at_step},
      {"kill.learner", &e->learner},
      {"kill.restart_after_s", &e->restart_after_s},
      {"slow.learner", &e->learner},
      {"slow.factor", &e->factor},
      {"slow.duration_s", &e->duration_s},
      {"partition.learner", &e->learner},
      {"partition.duration_s", &e->duration_s},
      {"drop.learner", &e->learner},
      {"drop.prob", &e->prob},
      {"drop.duration_s", &e->duration_s},
      {"corrupt.learner", &e->learner},
      {"corrupt.prob", &e->prob},
      {"corrupt.duration_s", &e->duration_s},
      {"syncer_kill.restart_after_s", &e->restart_after_s},
  };
}

// Every action key must be given except restart_after_s and the learner of drop and corrupt.
bool IsRequiredChaosKey(ChaosEventKind kind, const std::string& name) {
  if (name == "learner") return IsLearnerEvent(kind);
  return name != "restart_after_s";
}

// Every key, bound to the fields of *c; list items as many as *c holds.
std::vector<Key> KeysOf(RunConfig* c) {
  ModelConfig& m = c->model;
  DataConfig& d = c->data;
  TrainConfig& t = c->train;
  EvalConfig& e = c->eval;
  SyncConfig& s = c->sync;
  LearnerConfig sample;
  std::vector<std::string> learner_names;
  for (const Key& key : LearnerKeysOf(&sample)) learner_names.push_back(key.path);
  std::vector<Key> keys = {
      {"model.n_layer", &m.n_layer},
      {"model.n_embd", &m.n_embd},
      {"model.n_head", &m.n_head},
      {"model.block_size", &m.block_size},
      {"model.vocab_size", &m.vocab_size},
      {"data.corpus", PathField{&d.corpus}},
      {"data.format", EnumOf(&d.format, kDataFormatNames)},
      {"data.val_fraction", &d.val_fraction},
      {"train.batch_size", &t.batch_size},
      {"train.steps", &t.steps},
      {"train.lr", &t.lr},
      {"train.min_lr", &t.min_lr},
      {"train.warmup_steps", &t.warmup_steps},
      {"train.lr_decay_steps", &t.lr_decay_steps},
      {"train.weight_decay", &t.weight_decay},
      {"train.beta1", &t.beta1},
      {"train.beta2", &t.beta2},
      {"train.eps", &t.eps},
      {"train.grad_clip", &t.grad_clip},
      {"train.seed", &t.seed},
      {"train.threads", &t.threads},
      {"train.checkpoint_every", &t.checkpoint_every},
      {"train.log_every", &t.log_every},
      {"train.time_limit_s", &t.time_limit_s},
      {"train.device", &t.device},
      {"train.ranks", &t.ranks},
      {"train.hosts", &t.hosts},
      {"train.shard", EnumOf(&t.shard, kShardModeNames)},
      {"train.recompute", EnumOf(&t.recompute, kBoolNames)},
      {"eval.every", &e.every},
      {"eval.batches", &e.batches},
      {"sync.mode", EnumOf(&s.mode, kSyncModeNames)},
      {"sync.learners", &s.learners},
      {"sync.fragments", &s.fragments},
      {"sync.inner_steps", &s.inner_steps},
      {"sync.overlap", &s.overlap},
      {"sync.quorum", &s.quorum},
      {"sync.grace.gamma", &s.grace.gamma},
      {"sync.grace.cap_ms", &s.grace.cap_ms},
      {"sync.grace.cap_steps", &s.grace.cap_steps},
      {"sync.grace.step_time", EnumOf(&s.grace.step_time, kGraceStepTimeNames)},
      {"sync.grace.forecast", EnumOf(&s.grace.forecast, kBoolNames)},
      {"sync.max_staleness", &s.max_staleness},
      {"sync.weighting", EnumOf(&s.weighting, kWeightingNames)},
      {"sync.merge", EnumOf(&s.merge, kMergeRuleNames)},
      {"sync.fold", EnumOf(&s.fold, kFoldRuleNames)},
      {"sync.alpha", &s.alpha},
      {"sync.age_power", &s.age_power},
      {"sync.anchor", EnumOf(&s.anchor, kAnchorNames)},
      {"sync.partial", EnumOf(&s.partial, kPartialRoundNames)},
      {"sync.lr_clock", EnumOf(&s.lr_clock, kLrClockNames)},
      {"sync.codec.up", CodecOf(&s.codec.up)},
      {"sync.codec.down", CodecOf(&s.codec.down)},
      {"sync.codec.block", &s.codec.block},
      {"sync.codec.up_topk", &s.codec.up_topk},
      {"sync.codec.down_topk", &s.codec.down_topk},
      {"sync.codec.chunk", &s.codec.chunk},
      {"sync.codec.keep", &s.codec.keep},
      {"sync.codec.bits", &s.codec.bits},
      {"sync.codec.feedback", EnumOf(&s.codec.feedback, kFeedbackNames)},
      {"sync.codec.decay", &s.codec.decay},
      {"sync.outer.lr", &s.outer.lr},
      {"sync.outer.momentum", &s.outer.momentum},
      {"sync.outer.restart_every", &s.outer.restart_every},
      {"sync.link.bandwidth_mbps", &s.link.bandwidth_mbps},
      {"sync.link.latency_ms", &s.link.latency_ms},
      {"sync.link.jitter_ms", &s.link.jitter_ms},
      {"sync.link.loss", &s.link.loss},
      {"sync.heartbeat_timeout_ms", &s.heartbeat_timeout_ms},
      {"sync.norm_limit", &s.norm_limit},
      {"sync.checkpoint_every", &s.checkpoint_every},
      {"sync.merge_threads", &s.merge_threads},
      {"learners", ListField{[c](size_t n) { c->learners.resize(n); }, learner_names}},
      {"placement.syncer", &c->placement.syncer},
      {"placement.learners", StringListField{&c->placement.learners}},
      {"chaos.seed", &c->chaos.seed},
      {"chaos.events", ChaosEventsField{&c->chaos.events}},
      {"chaos.random.mtbf_s", &c->chaos.random.mtbf_s},
      {"chaos.random.mttr_s", &c->chaos.random.mttr_s},
      {"chaos.random.from_s", &c->chaos.random.from_s},
      {"chaos.random.until_s", &c->chaos.random.until_s},
  };
  for (size_t i = 0; i < c->learners.size(); ++i) {
    for (Key& key : LearnerKeysOf(&c->learners[i])) {
      keys.push_back({"learners." + std::to_string(i) + "." + key.path, std::move(key.field)});
    }
  }
  return keys;
}

std::string ChildPath(const std::string& parent, const std::string& name) {
  return parent.empty() ? name : parent + "." + name;
}

// The names directly under parent ("" = the sections), in table order.
std::vector<std::string> ChildrenOf(const std::vector<Key>& keys, const std::string& parent) {
  const std::string prefix = parent.empty() ? "" : parent + ".";
  std::vector<std::string> names;
  for (const Key& key : keys) {
    if (key.path.compare(0, prefix.size(), prefix) != 0 || key.path.size() == prefix.size()) {
      continue;
    }
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

std::set<std::string> ListPaths(const std::vector<Key>& keys) {
  std::set<std::string> paths;
  for (const Key& key : keys) {
    if (std::holds_alternative<ListField>(key.field)) paths.insert(key.path);
  }
  return paths;
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

// ---------------------------------------------------------------------------
// Small helpers.

// Shortest text that reads back to the same double.
std::string FormatDouble(double value) {
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

// ---------------------------------------------------------------------------
// Where each value came from, for messages: "file:line:col" or "--set k=v".

class Origins {
 public:
  explicit Origins(std::string source_name) : source_name_(std::move(source_name)) {}

  // The key (or section) was written by this --set argument.
  void SetByOverride(const std::string& key, const std::string& argument) {
    overrides_[key] = "--set " + argument;
  }
  bool IsOverride(const std::string& key) const { return overrides_.count(key) > 0; }

  // The origin of key, whose node in the tree is at mark. A key inside a value that --set gave
  // whole (--set 'chaos.events=[...]') comes from that --set, not from the file's line.
  std::string At(const std::string& key, const YAML::Mark& mark) const {
    for (std::string k = key;;) {
      auto it = overrides_.find(k);
      if (it != overrides_.end()) return it->second;
      const size_t dot = k.rfind('.');
      if (dot == std::string::npos) break;
      k.resize(dot);  // the parent
    }
    if (mark.is_null()) return source_name_;
    return source_name_ + ":" + std::to_string(mark.line + 1) + ":" +
           std::to_string(mark.column + 1);
  }

  // Remembers where the value of key came from, for Validate().
  void Record(const std::string& key, std::string origin) { values_[key] = std::move(origin); }

  // The origin of the first of keys that was given a value, else the source.
  std::string OfValue(std::initializer_list<std::string> keys) const {
    for (const std::string& key : keys) {
      auto it = values_.find(key);
      if (it != values_.end()) return it->second;
    }
    return source_name_;
  }

  const std::string& source_name() const { return source_name_; }

 private:
  std::string source_name_;
  std::map<std::string, std::string> overrides_;  // key -> "--set k=v"
  std::map<std::string, std::string> values_;     // key -> origin of its value
};

// ---------------------------------------------------------------------------
// Reading values.

bool ParseInt(std::string text, int* out) {
  if (!text.empty() && text[0] == '+') text.erase(0, 1);
  const char* end = text.data() + text.size();
  auto result = std::from_chars(text.data(), end, *out);
  return !text.empty() && result.ec == std::errc() && result.ptr == end;
}

bool ParseUint64(const std::string& text, uint64_t* out) {
  const char* end = text.data() + text.size();
  auto result = std::from_chars(text.data(), end, *out);
  return !text.empty() && result.ec == std::errc() && result.ptr == end;
}

bool ParseDouble(std::string text, double* out) {
  if (!text.empty() && text[0] == '+') text.erase(0, 1);
  const char* end = text.data() + text.size();
  auto result = std::from_chars(text.data(), end, *out);
  return !text.empty() && result.ec == std::errc() && result.ptr == end && std::isfinite(*out);
}

// Stores node into key's field. where is the node's origin.
Status ReadValue(const Key& key, const YAML::Node& node, const std::string& where,
                 const std::string& path_base) {
  const std::string text = node.IsScalar() ? node.Scalar() : "";
  auto expected = [&](const std::string& what) {
    return Status::Error(where + ": " + key.path + ": expected " + what + ", got " +
                         Describe(node));
  };
  if (auto* field = std::get_if<int*>(&key.field)) {
    if (!node.IsScalar() || !ParseInt(text, *field)) {
      return expected("an integer (32-bit, no decimal point or exponent)");
    }
  } else if (auto* field = std::get_if<uint64_t*>(&key.field)) {
    if (!node.IsScalar() || !ParseUint64(text, *field)) {
      return expected("a non-negative integer");
    }
  } else if (auto* field = std::get_if<double*>(&key.field)) {
    if (!node.IsScalar() || !ParseDouble(text, *field)) return expected("a number");
  } else if (auto* field = std::get_if<std::string*>(&key.field)) {
    if (!node.IsScalar() && !node.IsNull()) return expected("a name");
    **field = text;
  } else if (auto* field = std::get_if<StringListField>(&key.field)) {
    field->value->clear();
    if (node.IsNull()) return Status::Ok();
    if (!node.IsSequence()) return expected("a list of names, e.g. [site-a, site-b]");
    for (size_t i = 0; i < node.size(); ++i) {
      if (!node[i].IsScalar()) return expected("a list of names, e.g. [site-a, site-b]");
      field->value->push_back(node[i].Scalar());
    }
  } else if (auto* field = std::get_if<PathField>(&key.field)) {
    // An empty value leaves the path empty; Validate() says it is required.
    if (!node.IsScalar() && !node.IsNull()) return expected("a path");
    *field->value = config_internal::ResolvePath(text, path_base);
  } else if (auto* field = std::get_if<EnumField>(&key.field)) {
    const auto it = std::find(field->names.begin(), field->names.end(), text);
    if (!node.IsScalar() || it == field->names.end()) {
      return Status::Error(where + ": " + key.path + ": expected one of " + Join(field->names) +
                           ", got " + Describe(node) + DidYouMean(text, field->names));
    }
    field->set(static_cast<int>(it - field->names.begin()));
  }
  return Status::Ok();
}

// Sizes the config's lists to the tree's, so that KeysOf() has a row for
// every item the reader will meet.
void SizeLists(const YAML::Node& root, RunConfig* config) {
  for (const Key& key : KeysOf(config)) {
    const auto* list = std::get_if<ListField>(&key.field);
    if (list == nullptr) continue;
    // (reset() throws on a missing node, so look before each step)
    YAML::Node node = root;
    bool found = true;
    for (const std::string& part : Split(key.path)) {
      const YAML::Node child = node.IsMap() ? std::as_const(node)[part] : YAML::Node();
      found = node.IsMap() && child.IsDefined();
      if (!found) break;
      node.reset(child);
    }
    if (found && node.IsSequence()) list->resize(node.size());
  }
}

// Reads a tree of sections into the fields the table binds.
class TreeReader {
 public:
  TreeReader(const std::vector<Key>& keys, const std::string& base_dir, Origins* origins)
      : keys_(keys), base_dir_(base_dir), origins_(origins) {}

  // Reads map, the section at path parent ("" = the whole file).
  Status ReadSection(const YAML::Node& map, const std::string& parent) {
    const std::vector<std::string> names = ChildrenOf(keys_, parent);
    std::set<std::string> seen;
    for (const auto& entry : map) {
      const std::string name = entry.first.Scalar();
      const std::string path = ChildPath(parent, name);
      const std::string name_at = origins_->At(path, entry.first.Mark());
      const Key* key = FindKey(keys_, path);
      const bool is_section = key == nullptr && !ChildrenOf(keys_, path).empty();
      if (key == nullptr && !is_section) {
        if (parent.empty()) {
          return Status::Error(name_at + ": unknown section '" + name + "'; known sections: " +
                               Join(names) + DidYouMean(name, names));
        }
        return Status::Error(name_at + ": unknown key '" + path + "'; known keys in '" + parent +
                             "': " + Join(names) + DidYouMean(name, names));
      }
      const bool is_value = key != nullptr && !std::holds_alternative<ListField>(key->field);
      if (!seen.insert(name).second) {
        if (is_value) {
          return Status::Error(name_at + ": key '" + path + "' appears twice; keep one");
        }
        return Status::Error(name_at + ": " + (parent.empty() ? "section '" : "key '") + path +
                             "' appears twice; merge its keys into one");
      }
      const YAML::Node& value = entry.second;
      const std::string where = origins_->At(path, value.Mark());
      if (const auto* events = key ? std::get_if<ChaosEventsField>(&key->field) : nullptr) {
        DL_RETURN_IF_ERROR(ReadChaosEvents(value, path, events->value));
        origins_->Record(path, where);
      } else if (is_value) {
        // A path given on the command line is relative to where the command ran.
        const std::string path_base = origins_->IsOverride(path) ? "" : base_dir_;
        DL_RETURN_IF_ERROR(ReadValue(*key, value, where, path_base));
        origins_->Record(path, where);
      } else if (key != nullptr) {
        DL_RETURN_IF_ERROR(ReadList(value, path, std::get<ListField>(key->field)));
        origins_->Record(path, where);
      } else {
        DL_RETURN_IF_ERROR(ReadSubsection(value, path));
      }
    }
    return Status::Ok();
  }

 private:
  Status ReadSubsection(const YAML::Node& node, const std::string& path) {
    if (node.IsNull()) return Status::Ok();  // "train:" with every key commented out
    if (!node.IsMap()) {
      return Status::Error(origins_->At(path, node.Mark()) + ": " + path +
                           ": expected a section (a mapping of keys), got " + Describe(node));
    }
    return ReadSection(node, path);
  }

  Status ReadList(const YAML::Node& node, const std::string& path, const ListField& list) {
    if (node.IsNull()) return Status::Ok();
    if (!node.IsSequence()) {
      return Status::Error(origins_->At(path, node.Mark()) + ": " + path +
                           ": expected a list of sections (keys: " + Join(list.item_names) +
                           "), e.g. " + path + ": [{" + list.item_names.front() +
                           ": ...}], got " + Describe(node));
    }
    for (size_t i = 0; i < node.size(); ++i) {
      DL_RETURN_IF_ERROR(ReadSubsection(node[i], path + "." + std::to_string(i)));
    }
    return Status::Ok();
  }

  // chaos.events: each item is read with its own small table, then checked for one trigger and
  // one action with all its required keys (ranges: ValidateChaos, once sync.learners is known).
  Status ReadChaosEvents(const YAML::Node& node, const std::string& path,
                         std::vector<ChaosEvent>* events) {
    events->clear();
    if (node.IsNull()) return Status::Ok();
    const std::string actions =
        Join(std::vector<std::string>(kChaosEventNames.begin(), kChaosEventNames.end()));
    if (!node.IsSequence()) {
      return Status::Error(origins_->At(path, node.Mark()) + ": " + path +
                           ": expected a list of events, e.g. " + path +
                           ": [{at_s: 30, kill: {learner: 1}}], got " + Describe(node));
    }
    for (size_t i = 0; i < node.size(); ++i) {
      const std::string item = path + "." + std::to_string(i);
      const YAML::Node entry = node[i];
      const std::string item_at = origins_->At(item, entry.Mark());
      if (!entry.IsMap()) {
        return Status::Error(item_at + ": " + item +
                             ": expected an event: one trigger (at_s or at_step) and one action (" +
                             actions + "), e.g. {at_s: 30, kill: {learner: 1}}; got " +
                             Describe(entry));
      }
      ChaosEvent event;
      std::vector<Key> keys;
      for (Key& key : ChaosEventKeysOf(&event)) {
        keys.push_back({item + "." + key.path, std::move(key.field)});
      }
      DL_RETURN_IF_ERROR(TreeReader(keys, base_dir_, origins_).ReadSection(entry, item));

      // The reader has rejected unknown keys, so each name is a trigger or an action.
      std::string trigger, action, action_at;
      for (const auto& kv : entry) {
        const std::string name = kv.first.Scalar();
        const std::string at = origins_->At(item + "." + name, kv.first.Mark());
        if (name == "at_s" || name == "at_step") {
          if (!trigger.empty()) {
            return Status::Error(at + ": " + item + ": has both at_s and at_step; keep one");
          }
          trigger = name;
          if (name == "at_step" && event.at_step < 0) {
            return Status::Error(origins_->At(item + ".at_step", kv.second.Mark()) + ": " + item +
                                 ".at_step: must be >= 0, got " +
                                 std::to_string(event.at_step));
          }
          continue;
        }
        if (!action.empty()) {
          return Status::Error(at + ": " + item + ": has two actions, " + action + " and " + name +
                               "; an event does one thing, so give each its own event");
        }
        action = name;
        action_at = at;
      }
      if (trigger.empty() || action.empty()) {
        return Status::Error(item_at + ": " + item + ": needs " +
                             (trigger.empty() ? "a trigger: at_s (seconds since training start) or "
                                                "at_step (a step of the event's learner)"
                                              : "an action: one of " + actions) +
                             ", e.g. {at_s: 30, kill: {learner: 1}}");
      }
      const auto kind_it = std::find(kChaosEventNames.begin(), kChaosEventNames.end(), action);
      event.kind = static_cast<ChaosEventKind>(kind_it - kChaosEventNames.begin());
      if (trigger == "at_step" && !IsLearnerEvent(event.kind)) {
        return Status::Error(origins_->At(item + ".at_step", entry["at_step"].Mark()) + ": " +
                             item + ".at_step: only kill, slow and partition fire at a step (a "
                             "step of their learner); give " + action + " an at_s");
      }
      const YAML::Node body = entry[action];
      for (const Key& key : keys) {
        const std::string prefix = item + "." + action + ".";
        if (key.path.compare(0, prefix.size(), prefix) != 0) continue;
        const std::string name = key.path.substr(prefix.size());
        const bool given = body.IsMap() && body[name].IsDefined();
        if (!given && IsRequiredChaosKey(event.kind, name)) {
          return Status::Error(action_at + ": " + key.path + " is required; e.g. " +
                               "{at_s: 30, slow: {learner: 1, factor: 3, duration_s: 20}}");
        }
      }
      origins_->Record(item, item_at);
      events->push_back(event);
    }
    return Status::Ok();
  }

  const std::vector<Key>& keys_;
  const std::string& base_dir_;
  Origins* origins_;
};

// Largest list index --set accepts (it creates the items before it).
constexpr size_t kMaxOverrideIndex = 9999;

bool ParseIndex(const std::string& text, size_t* index) {
  if (text.empty() || text.size() > 4) return false;
  for (char ch : text) {
    if (ch < '0' || ch > '9') return false;
  }
  *index = std::stoul(text);
  return *index <= kMaxOverrideIndex;
}

// The key table with one item in each list: the shape of any config.
std::vector<Key> SchemaKeys(RunConfig* storage) {
  for (const Key& key : KeysOf(storage)) {
    if (const auto* list = std::get_if<ListField>(&key.field)) list->resize(1);
  }
  return KeysOf(storage);
}

// Applies "--set path.to.key=value" arguments to the tree, creating sections
// and list items as needed; the reader then checks them like the file's own
// keys.
Status ApplyOverrides(const std::vector<std::string>& overrides, YAML::Node* root,
                      Origins* origins) {
  RunConfig storage;
  const std::vector<Key> schema = SchemaKeys(&storage);
  const std::set<std::string> lists = ListPaths(schema);
  auto new_container = [&](const std::string& schema_path) {
    return YAML::Node(lists.count(schema_path) ? YAML::NodeType::Sequence : YAML::NodeType::Map);
  };
  for (const std::string& argument : overrides) {
    const size_t equals = argument.find('=');
    auto trim = [](std::string s) {
      const char* space = " \t";
      s.erase(0, s.find_first_not_of(space));
      s.erase(s.find_last_not_of(space) + 1);
      return s;
    };
    const std::string key = equals == std::string::npos ? "" : trim(argument.substr(0, equals));
    if (key.empty()) {
      return Status::Error("--set '" + argument +
                           "': expected key=value, e.g. --set train.lr=3e-4");
    }
    YAML::Node value;
    try {
      value = YAML::Load(argument.substr(equals + 1));
    } catch (const YAML::Exception& e) {
      return Status::Error("--set " + argument + ": " + key + ": not a YAML value (" + e.msg +
                           "); quote it, e.g. --set '" + key + "=\"...\"'");
    }
    const std::vector<std::string> parts = Split(key);
    if (std::find(parts.begin(), parts.end(), "") != parts.end()) {
      return Status::Error("--set " + argument + ": '" + key +
                           "' is not a key path; join its parts with single dots, e.g. " +
                           "--set sync.grace.gamma=0.5");
    }
    // Walk down from the root, creating what is missing. schema_path is the
    // path with list indices as 0, to look nodes up in the table.
    YAML::Node node = *root;
    std::string path, schema_path;
    for (size_t i = 0; i < parts.size(); ++i) {
      const bool last = i + 1 == parts.size();
      const bool node_is_list = lists.count(schema_path) > 0;
      const std::string parent = path;
      path = ChildPath(path, parts[i]);
      schema_path = ChildPath(schema_path, node_is_list ? "0" : parts[i]);
      if (!last) {
        const Key* row = FindKey(schema, schema_path);
        if (row != nullptr && !std::holds_alternative<ListField>(row->field)) {
          return Status::Error("--set " + argument + ": unknown key '" + key + "': '" + path +
                               "' is a value, not a section");
        }
      }
      if (node_is_list && node.IsNull()) node = YAML::Node(YAML::NodeType::Sequence);
      // A node of the wrong kind in the file: the reader reports it.
      if (node_is_list ? !node.IsSequence() : !(node.IsMap() || node.IsNull())) break;
      if (node_is_list) {
        size_t index = 0;
        if (!ParseIndex(parts[i], &index)) {
          return Status::Error("--set " + argument + ": '" + parts[i] +
                               "' is not an index into the list '" + parent +
                               "' (0, 1, ... up to " + std::to_string(kMaxOverrideIndex) + ")");
        }
        while (node.size() < index) {
          origins->SetByOverride(ChildPath(parent, std::to_string(node.size())), argument);
          node.push_back(YAML::Node(YAML::NodeType::Map));
        }
        if (node.size() == index) {
          origins->SetByOverride(path, argument);
          node.push_back(last ? value : new_container(schema_path));
        } else if (last) {
          node[index] = value;
        }
        node.reset(node[index]);
      } else {
        YAML::Node child = node[parts[i]];
        if (last) {
          child = value;
        } else if (!child.IsDefined()) {
          origins->SetByOverride(path, argument);
          child = new_container(schema_path);
        }
        node.reset(child);
      }
      if (last) origins->SetByOverride(key, argument);
    }
  }
  return Status::Ok();
}

// Site names end up in file names, endpoints' peers and logs.
bool IsSiteName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.') return false;
  }
  return true;
}

// Checks the placement section: empty, or a syncer site and one site per learner.
Status ValidatePlacement(const RunConfig& c, const Origins& origins) {
  const PlacementConfig& p = c.placement;
  if (p.empty()) return Status::Ok();
  auto fail = [&](const std::string& key, const std::string& detail) {
    return Status::Error(origins.OfValue({key, "placement.learners", "placement.syncer"}) + ": " + key + ": " +
                         detail);
  };
  if (p.syncer.empty()) {
    return fail("placement.syncer",
                "is required when placement.learners is set: the site that hosts the syncer, e.g. "
                "placement: {syncer: site-s, learners: [site-a, site-b]}");
  }
  if (!IsSiteName(p.syncer)) {
    return fail("placement.syncer", "'" + p.syncer + "' is not a site name (letters, digits, '-', '_', '.')");
  }
  if (p.learners.size() != static_cast<size_t>(c.sync.learners)) {
    return fail("placement.learners",
                "names " + std::to_string(p.learners.size()) + " sites but sync.learners is " +
                    std::to_string(c.sync.learners) + "; list one site per learner (a site may repeat)");
  }
  for (const std::string& site : p.learners) {
    if (!IsSiteName(site)) {
      return fail("placement.learners", "'" + site + "' is not a site name (letters, digits, '-', '_', '.')");
    }
  }
  return Status::Ok();
}

// The validators' range errors: "file:line:col: key: DETAIL" / "...: must be RULE, got VALUE".
struct RangeErrors {
  const Origins& origins;
  Status Fail(const std::string& key, const std::string& detail, std::initializer_list<std::string> blame) const {
    return Status::Error(origins.OfValue(blame) + ": " + key + ": " + detail);
  }
  Status Check(const std::string& key, double value, bool ok, const std::string& rule) const {
    if (ok) return Status::Ok();
    return Fail(key, "must be " + rule + ", got " + FormatDouble(value), {key});
  }
};

// Checks the sync section and the learners list.
Status ValidateSync(const RunConfig& c, const Origins& origins) {
  const RangeErrors errors{origins};
  auto fail = [&](const std::string& key, const std::string& detail, std::initializer_list<std::string> blame) {
    return errors.Fail(key, detail, blame);
  };
  auto check = [&](const std::string& key, double value, bool ok, const std::string& rule) {
    return errors.Check(key, value, ok, rule);
  };
  const SyncConfig& s = c.sync;
  DL_RETURN_IF_ERROR(check("sync.learners", s.learners, s.learners >= 1, ">= 1"));
  DL_RETURN_IF_ERROR(check("sync.fragments", s.fragments, s.fragments >= 1, ">= 1"));
  DL_RETURN_IF_ERROR(check("sync.inner_steps", s.inner_steps, s.inner_steps >= 1, ">= 1"));
  DL_RETURN_IF_ERROR(check("sync.overlap", s.overlap, s.overlap >= 0, ">= 0"));
  if (s.mode != SyncMode::kDdp && s.overlap >= s.inner_steps) {
    return fail("sync.overlap",
                std::to_string(s.overlap) + " is not less than sync.inner_steps " +
                    std::to_string(s.inner_steps) +
                    ": a fragment's delta must be back before the fragment fires again; " +
                    "lower overlap or raise inner_steps",
                {"sync.overlap", "sync.inner_steps"});
  }
  DL_RETURN_IF_ERROR(check("sync.quorum", s.quorum, s.quorum >= 1, ">= 1"));
  if (s.quorum > s.learners) {
    return fail("sync.quorum",
                std::to_string(s.quorum) + " is greater than sync.learners " +
                    std::to_string(s.learners) + "; lower quorum or add learners",
                {"sync.quorum", "sync.learners"});
  }
  DL_RETURN_IF_ERROR(check("sync.grace.gamma", s.grace.gamma,
                           s.grace.gamma >= 0 && s.grace.gamma <= 1, "in [0, 1]"));
  DL_RETURN_IF_ERROR(check("sync.grace.cap_ms", s.grace.cap_ms, s.grace.cap_ms >= 0,
                           ">= 0 (0 turns the grace window off)"));
  DL_RETURN_IF_ERROR(check("sync.grace.cap_steps", s.grace.cap_steps, s.grace.cap_steps >= 0,
                           ">= 0 (inner steps; 0 = sync.grace.cap_ms alone)"));
  DL_RETURN_IF_ERROR(check("sync.max_staleness", s.max_staleness, s.max_staleness >= 0,
                           ">= 0 (0 = only deltas based on the current version)"));
  DL_RETURN_IF_ERROR(check("sync.alpha", s.alpha, s.alpha >= 0 && s.alpha <= 1, "in [0, 1]"));
  DL_RETURN_IF_ERROR(check("sync.age_power", s.age_power, s.age_power >= 0 && s.age_power <= 8,
                           "in [0, 8] (0 = no age-aware scaling)"));
  DL_RETURN_IF_ERROR(check("sync.outer.restart_every", s.outer.restart_every, s.outer.restart_every >= 0,
                           ">= 0 (merges of a fragment between momentum restarts; 0 = never)"));
  DL_RETURN_IF_ERROR(check("sync.codec.block", s.codec.block,
                           s.codec.block >= 2 && s.codec.block <= 65536 && s.codec.block % 2 == 0,
                           "even, in [2, 65536] (values per scale; int4 packs two per byte)"));
  for (auto [key, f] : {std::pair{"sync.codec.up_topk", s.codec.up_topk}, {"sync.codec.down_topk", s.codec.down_topk}}) {
    DL_RETURN_IF_ERROR(check(key, f, f == 0 || (f > 0 && f < 1),
                             "0 (dense) or in (0, 1) (the share of each tensor's values sent)"));
  }
  DL_RETURN_IF_ERROR(check("sync.codec.chunk", s.codec.chunk,
                           s.codec.chunk >= 2 && s.codec.chunk <= 65536 && s.codec.chunk % 2 == 0,
                           "even, in [2, 65536] (values per topk_chunked chunk)"));
  DL_RETURN_IF_ERROR(check("sync.codec.keep", s.codec.keep, s.codec.keep >= 1, ">= 1 (values kept of each chunk)"));
  if (s.codec.keep > s.codec.chunk) {
    return fail("sync.codec.keep",
                std::to_string(s.codec.keep) + " is greater than sync.codec.chunk " + std::to_string(s.codec.chunk) +
                    "; keep fewer values or use larger chunks",
                {"sync.codec.keep", "sync.codec.chunk"});
  }
  DL_RETURN_IF_ERROR(check("sync.codec.bits", s.codec.bits, s.codec.bits == 2 || s.codec.bits == 4 || s.codec.bits == 8,
                           "2, 4 or 8 (bits of each kept value)"));
  DL_RETURN_IF_ERROR(check("sync.codec.decay", s.codec.decay, s.codec.decay > 0 && s.codec.decay <= 1,
                           "in (0, 1] (the accumulator's decay)"));
  if (s.codec.up == CodecKind::kTopkChunked && s.codec.up_topk != 0)
    return fail("sync.codec.up_topk", "must be 0 with sync.codec.up: topk_chunked (it picks its own values)",
                {"sync.codec.up_topk", "sync.codec.up"});
  if (s.codec.down == CodecKind::kTopkChunked && s.codec.down_topk != 0)
    return fail("sync.codec.down_topk", "must be 0 with sync.codec.down: topk_chunked (it picks its own values)",
                {"sync.codec.down_topk", "sync.codec.down"});
  DL_RETURN_IF_ERROR(check("sync.outer.lr", s.outer.lr, s.outer.lr > 0, "> 0"));
  DL_RETURN_IF_ERROR(check("sync.outer.momentum", s.outer.momentum,
                           s.outer.momentum >= 0 && s.outer.momentum < 1, "in [0, 1)"));
  DL_RETURN_IF_ERROR(check("sync.link.bandwidth_mbps", s.link.bandwidth_mbps,
                           s.link.bandwidth_mbps >= 0, ">= 0 (0 = unlimited)"));
  DL_RETURN_IF_ERROR(
      check("sync.link.latency_ms", s.link.latency_ms, s.link.latency_ms >= 0, ">= 0"));
  DL_RETURN_IF_ERROR(
      check("sync.link.jitter_ms", s.link.jitter_ms, s.link.jitter_ms >= 0, ">= 0"));
  DL_RETURN_IF_ERROR(
      check("sync.link.loss", s.link.loss, s.link.loss >= 0 && s.link.loss < 1, "in [0, 1)"));
  DL_RETURN_IF_ERROR(check("sync.heartbeat_timeout_ms", s.heartbeat_timeout_ms,
                           s.heartbeat_timeout_ms >= 1, ">= 1"));
  DL_RETURN_IF_ERROR(check("sync.norm_limit", s.norm_limit,
                           s.norm_limit == 0 || s.norm_limit > 1, "0 (off) or > 1"));
  DL_RETURN_IF_ERROR(check("sync.checkpoint_every", s.checkpoint_every, s.checkpoint_every >= 0,
                           ">= 0 (0 = only at the end)"));
  DL_RETURN_IF_ERROR(check("sync.merge_threads", s.merge_threads, s.merge_threads >= 1 && s.merge_threads <= 64,
                           "in [1, 64] (threads of one merge)"));

  if (c.learners.size() > static_cast<size_t>(s.learners)) {
    return fail("learners",
                "has " + std::to_string(c.learners.size()) + " entries but sync.learners is " +
                    std::to_string(s.learners) + "; remove entries or raise sync.learners",
                {"learners", "sync.learners"});
  }
  for (size_t i = 0; i < c.learners.size(); ++i) {
    const std::string item = "learners." + std::to_string(i);
    const LearnerConfig& l = c.learners[i];
    DL_RETURN_IF_ERROR(check(item + ".slowdown", l.slowdown, l.slowdown >= 1, ">= 1 (1 = full speed)"));
    DL_RETURN_IF_ERROR(check(item + ".jitter", l.jitter, l.jitter >= 0 && l.jitter <= 10,
                             "in [0, 10] (mean extra fraction of a step; 0 = no noise)"));
  }
  return ValidatePlacement(c, origins);
}

// Checks the chaos section's ranges; learner indices against sync.learners.
Status ValidateChaos(const RunConfig& c, const Origins& origins) {
  const RangeErrors errors{origins};
  auto fail = [&](const std::string& key, const std::string& detail, std::initializer_list<std::string> blame) {
    return errors.Fail(key, detail, blame);
  };
  auto check = [&](const std::string& key, double value, bool ok, const std::string& rule) {
    return errors.Check(key, value, ok, rule);
  };
  const int learners = c.sync.learners;
  for (size_t i = 0; i < c.chaos.events.size(); ++i) {
    const ChaosEvent& e = c.chaos.events[i];
    const std::string item = "chaos.events." + std::to_string(i);
    const std::string action = item + "." + std::string(ToString(e.kind));
    if (e.at_step < 0) {
      DL_RETURN_IF_ERROR(check(item + ".at_s", e.at_s, e.at_s >= 0,
                               ">= 0 (seconds since training start)"));
    }
    // drop and corrupt leave learner out (-1) for every learner's link.
    const bool all_ok = !IsLearnerEvent(e.kind) && e.learner == -1;
    if (e.kind != ChaosEventKind::kSyncerKill && !all_ok &&
        (e.learner < 0 || e.learner >= learners)) {
      return fail(action + ".learner",
                  std::to_string(e.learner) + " is not a learner: sync.learners is " +
                      std::to_string(learners) + ", so learners are 0 .. " +
                      std::to_string(learners - 1) +
                      (IsLearnerEvent(e.kind) ? "" : "; leave it out for every learner's link"),
                  {action + ".learner", "sync.learners"});
    }
    if (e.kind == ChaosEventKind::kSlow) {
      DL_RETURN_IF_ERROR(check(action + ".factor", e.factor, e.factor > 0,
                               "> 0 (the learner's step time is multiplied by it)"));
    }
    if (e.kind == ChaosEventKind::kDrop || e.kind == ChaosEventKind::kCorrupt) {
      DL_RETURN_IF_ERROR(check(action + ".prob", e.prob, e.prob >= 0 && e.prob <= 1, "in [0, 1]"));
    }
    if (e.kind != ChaosEventKind::kKill && e.kind != ChaosEventKind::kSyncerKill) {
      DL_RETURN_IF_ERROR(check(action + ".duration_s", e.duration_s, e.duration_s > 0, "> 0"));
    }
  }
  const RandomFailureConfig& r = c.chaos.random;
  DL_RETURN_IF_ERROR(
      check("chaos.random.mtbf_s", r.mtbf_s, r.mtbf_s >= 0, ">= 0 (0 = no random failures)"));
  DL_RETURN_IF_ERROR(check("chaos.random.mttr_s", r.mttr_s, r.mttr_s > 0, "> 0"));
  DL_RETURN_IF_ERROR(check("chaos.random.from_s", r.from_s, r.from_s >= 0, ">= 0"));
  DL_RETURN_IF_ERROR(
      check("chaos.random.until_s", r.until_s, r.until_s >= 0, ">= 0 (0 = the end of the run)"));
  if (r.until_s > 0 && r.until_s <= r.from_s) {
    return fail("chaos.random.until_s",
                FormatDouble(r.until_s) + " is not after chaos.random.from_s " +
                    FormatDouble(r.from_s) + "; raise until_s, or 0 for the end of the run",
                {"chaos.random.until_s", "chaos.random.from_s"});
  }
  return Status::Ok();
}

// Checks ranges and relations between keys.
Status Validate(const RunConfig& c, const Origins& origins) {
  auto fail = [&](const std::string& key, const std::string& detail,
                  std::initializer_list<std::string> blame) {
    return Status::Error(origins.OfValue(blame) + ": " + key + ": " + detail);
  };
  auto at_least = [&](const std::string& key, auto value, auto minimum,
                      const std::string& note) -> Status {
    if (value >= minimum) return Status::Ok();
    return fail(key,
                "must be >= " + std::to_string(minimum) + note + ", got " + std::to_string(value),
                {key});
  };
  auto in_range = [&](const std::string& key, double value, bool ok,
                      const std::string& range) -> Status {
    if (ok) return Status::Ok();
    return fail(key, "must be in " + range + ", got " + FormatDouble(value), {key});
  };
  auto non_negative = [&](const std::string& key, double value, const std::string& note) -> Status {
    if (value >= 0) return Status::Ok();
    return fail(key, "must be >= 0" + note + ", got " + FormatDouble(value), {key});
  };

  const ModelConfig& m = c.model;
  DL_RETURN_IF_ERROR(at_least("model.n_layer", m.n_layer, 1, ""));
  DL_RETURN_IF_ERROR(at_least("model.n_embd", m.n_embd, 1, ""));
  DL_RETURN_IF_ERROR(at_least("model.n_head", m.n_head, 1, ""));
  DL_RETURN_IF_ERROR(at_least("model.block_size", m.block_size, 1, ""));
  if (m.n_embd % m.n_head != 0) {
    return fail("model.n_head",
                std::to_string(m.n_head) + " does not divide model.n_embd " +
                    std::to_string(m.n_embd) + "; pick n_head and n_embd so that n_embd / n_head " +
                    "is a whole number",
                {"model.n_head", "model.n_embd"});
  }

  if (m.vocab_size < 2 || m.vocab_size > 65536) {
    return fail("model.vocab_size",
                "must be in [2, 65536] (token files store uint16 ids), got " + std::to_string(m.vocab_size),
                {"model.vocab_size"});
  }

  const DataConfig& d = c.data;
  if (d.corpus.empty()) {
    return Status::Error(origins.OfValue({"data.corpus"}) +
                         ": data.corpus is required: the path of a text file or a directory of " +
                         "text files; set it under 'data:' or pass --set data.corpus=PATH");
  }
  if (d.format == DataFormat::kBytes && m.vocab_size != 256) {
    return fail("model.vocab_size",
                std::to_string(m.vocab_size) +
                    " does not fit data.format bytes, whose tokens are bytes (vocab_size 256); set "
                    "vocab_size: 256, or data.format: tokens for a pre-tokenized corpus",
                {"model.vocab_size", "data.format"});
  }
  DL_RETURN_IF_ERROR(in_range("data.val_fraction", d.val_fraction,
                              d.val_fraction > 0 && d.val_fraction <= 0.5, "(0, 0.5]"));

  const TrainConfig& t = c.train;
  DL_RETURN_IF_ERROR(at_least("train.batch_size", t.batch_size, 1, ""));
  DL_RETURN_IF_ERROR(at_least("train.steps", t.steps, 0, ""));
  DL_RETURN_IF_ERROR(non_negative("train.lr", t.lr, ""));
  DL_RETURN_IF_ERROR(non_negative("train.min_lr", t.min_lr, ""));
  if (t.min_lr > t.lr) {
    return fail("train.min_lr",
                FormatDouble(t.min_lr) + " is greater than train.lr " + FormatDouble(t.lr) +
                    "; lower min_lr or raise lr",
                {"train.min_lr", "train.lr"});
  }
  DL_RETURN_IF_ERROR(at_least("train.warmup_steps", t.warmup_steps, 0, ""));
  DL_RETURN_IF_ERROR(at_least("train.lr_decay_steps", t.lr_decay_steps, 0, " (0 = train.steps)"));
  DL_RETURN_IF_ERROR(non_negative("train.weight_decay", t.weight_decay, ""));
  DL_RETURN_IF_ERROR(in_range("train.beta1", t.beta1, t.beta1 >= 0 && t.beta1 < 1, "[0, 1)"));
  DL_RETURN_IF_ERROR(in_range("train.beta2", t.beta2, t.beta2 >= 0 && t.beta2 < 1, "[0, 1)"));
  if (!(t.eps > 0)) {
    return fail("train.eps", "must be > 0, got " + FormatDouble(t.eps), {"train.eps"});
  }
  DL_RETURN_IF_ERROR(non_negative("train.grad_clip", t.grad_clip, " (0 turns clipping off)"));
  DL_RETURN_IF_ERROR(at_least("train.threads", t.threads, 0, " (0 uses all cores)"));
  DL_RETURN_IF_ERROR(
      at_least("train.checkpoint_every", t.checkpoint_every, 0, " (0 = only at the end)"));
  DL_RETURN_IF_ERROR(at_least("train.log_every", t.log_every, 1, ""));
  DL_RETURN_IF_ERROR(non_negative("train.time_limit_s", t.time_limit_s, " (0 = no limit)"));
  DeviceSpec device;
  if (Status status = ParseDevice(t.device, &device); !status.ok()) {
    return fail("train.device", status.message(), {"train.device"});
  }
  DL_RETURN_IF_ERROR(at_least("train.ranks", t.ranks, 1, " (the learner's local ring size)"));
  DL_RETURN_IF_ERROR(at_least("train.hosts", t.hosts, 1, " (the hosts of the site the learner's ring spans)"));
  // ddp runs every learner in one ring.
  const int ring_ranks = t.hosts * t.ranks * (c.sync.mode == SyncMode::kDdp ? std::max(1, c.sync.learners) : 1);
  if (t.shard != ShardMode::kNone && ring_ranks < 2) {
    return fail("train.shard",
                std::string(ToString(t.shard)) +
                    " shards the learner's state over its ring, and a ring of 1 rank has nothing to shard: "
                    "set train.ranks (or train.hosts) to 2 or more, or train.shard: none",
                {"train.shard", "train.ranks", "train.hosts"});
  }

  const EvalConfig& e = c.eval;
  DL_RETURN_IF_ERROR(at_least("eval.every", e.every, 0, " (0 = only at the end)"));
  DL_RETURN_IF_ERROR(at_least("eval.batches", e.batches, 1, ""));
  DL_RETURN_IF_ERROR(ValidateSync(c, origins));
  return ValidateChaos(c, origins);
}

Status ReadFile(const std::string& path, std::string* text) {
  auto failure = [&](int error) {
    return Status::Error("cannot read run config '" + path + "': " + std::strerror(error));
  };
  FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return failure(errno);
  char buffer[65536];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0) text->append(buffer, n);
  const int error = std::ferror(file) ? errno : 0;  // e.g. EISDIR for a directory
  std::fclose(file);
  if (error != 0) return failure(error);
  return Status::Ok();
}

}  // namespace

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

Status ParseRunConfig(const std::string& yaml_text, const std::string& source_name,
                      const std::string& base_dir, const std::vector<std::string>& overrides,
                      RunConfig* out) {
  Origins origins(source_name);
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return Status::Error(origins.At("", e.mark) + ": invalid YAML: " + e.msg);
  }
  if (root.IsNull()) root = YAML::Node(YAML::NodeType::Map);  // an empty file
  if (!root.IsMap()) {
    RunConfig defaults;
    return Status::Error(origins.At("", root.Mark()) + ": expected a mapping of sections (" +
                         Join(ChildrenOf(KeysOf(&defaults), "")) + "), got " + Describe(root));
  }
  DL_RETURN_IF_ERROR(ApplyOverrides(overrides, &root, &origins));
  RunConfig config;
  SizeLists(root, &config);
  const std::vector<Key> keys = KeysOf(&config);
  DL_RETURN_IF_ERROR(TreeReader(keys, base_dir, &origins).ReadSection(root, ""));
  DL_RETURN_IF_ERROR(Validate(config, origins));
  *out = std::move(config);
  return Status::Ok();
}

Status LoadRunConfig(const std::string& path, const std::vector<std::string>& overrides,
                     RunConfig* out) {
  std::string text;
  DL_RETURN_IF_ERROR(ReadFile(path, &text));
  std::error_code ec;
  fs::path absolute = fs::absolute(path, ec);
  const std::string base_dir =
      ec ? fs::path(path).parent_path().string() : absolute.parent_path().string();
  return ParseRunConfig(text, path, base_dir, overrides, out);
}

namespace {

// An int or double field as text that reads back equal.
std::string NumberText(const FieldRef& field) {
  if (auto* value = std::get_if<int*>(&field)) return std::to_string(**value);
  return FormatDouble(*std::get<double*>(field));
}

// chaos.events as written: each event one line, its trigger and its action's keys, optional keys
// left out while they hold their defaults.
YAML::Node ChaosEventsToYaml(std::vector<ChaosEvent> events) {
  YAML::Node list(YAML::NodeType::Sequence);
  list.SetStyle(events.empty() ? YAML::EmitterStyle::Flow : YAML::EmitterStyle::Block);
  ChaosEvent defaults;
  const std::vector<Key> default_keys = ChaosEventKeysOf(&defaults);
  for (ChaosEvent& e : events) {
    YAML::Node item(YAML::NodeType::Map);
    item.SetStyle(YAML::EmitterStyle::Flow);
    if (e.at_step >= 0) {
      item["at_step"] = std::to_string(e.at_step);
    } else {
      item["at_s"] = FormatDouble(e.at_s);
    }
    const std::string action(ToString(e.kind));
    YAML::Node body(YAML::NodeType::Map);
    const std::vector<Key> keys = ChaosEventKeysOf(&e);
    for (size_t k = 0; k < keys.size(); ++k) {
      if (keys[k].path.compare(0, action.size() + 1, action + ".") != 0) continue;
      const std::string name = keys[k].path.substr(action.size() + 1);
      const std::string text = NumberText(keys[k].field);
      if (!IsRequiredChaosKey(e.kind, name) && text == NumberText(default_keys[k].field)) continue;
      body[name] = text;
    }
    item[action] = body;
    list.push_back(item);
  }
  return list;
}

}  // namespace

std::string RunConfigToYaml(const RunConfig& config) {
  RunConfig copy = config;  // KeysOf binds mutable pointers
  YAML::Node root(YAML::NodeType::Map);
  for (const Key& key : KeysOf(&copy)) {
    // A run without chaos has no chaos section, as most configs are written.
    if (copy.chaos.empty() && key.path.compare(0, 6, "chaos.") == 0) continue;
    // Parents come first in the table, so every step but a list item exists.
    const std::vector<std::string> parts = Split(key.path);
    YAML::Node node = root;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (node.IsSequence()) {
        const size_t index = std::stoul(parts[i]);
        node.SetStyle(YAML::EmitterStyle::Block);
        while (node.size() <= index) node.push_back(YAML::Node(YAML::NodeType::Map));
        node.reset(node[index]);
      } else {
        YAML::Node child = node[parts[i]];
        if (!child.IsDefined()) child = YAML::Node(YAML::NodeType::Map);
        node.reset(child);
      }
    }
    YAML::Node value;
    if (auto* field = std::get_if<int*>(&key.field)) {
      value = std::to_string(**field);
    } else if (auto* field = std::get_if<uint64_t*>(&key.field)) {
      value = std::to_string(**field);
    } else if (auto* field = std::get_if<double*>(&key.field)) {
      value = FormatDouble(**field);
    } else if (auto* field = std::get_if<std::string*>(&key.field)) {
      value = **field;
    } else if (auto* field = std::get_if<StringListField>(&key.field)) {
      value = YAML::Node(YAML::NodeType::Sequence);
      value.SetStyle(YAML::EmitterStyle::Flow);
      for (const std::string& item : *field->value) value.push_back(item);
    } else if (auto* field = std::get_if<PathField>(&key.field)) {
      value = *field->value;
    } else if (auto* field = std::get_if<EnumField>(&key.field)) {
      value = field->names.at(field->get());
    } else if (auto* field = std::get_if<ChaosEventsField>(&key.field)) {
      value = ChaosEventsToYaml(*field->value);
    } else {
      value = YAML::Node(YAML::NodeType::Sequence);
      value.SetStyle(YAML::EmitterStyle::Flow);  // "[]" until an item makes it a block
    }
    node[parts.back()] = value;
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

}  // namespace diloco
