#include "daemon/config/run_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>
#include <utility>
#include <variant>

namespace diloco {
namespace {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------
// The key table: the one place that lists every key. Reading, writing and the
// "known keys" of error messages all come from it; to add a section, add rows
// (a section's rows must be contiguous) and its checks in Validate().

// A string that names a file; resolved to an absolute path when read.
struct PathField {
  std::string* value;
};
using FieldRef = std::variant<int*, uint64_t*, double*, PathField>;

struct Key {
  std::string section;
  std::string name;
  FieldRef field;
  std::string dotted() const { return section + "." + name; }
};

// Every key, bound to the fields of *c.
std::vector<Key> KeysOf(RunConfig* c) {
  ModelConfig& m = c->model;
  DataConfig& d = c->data;
  TrainConfig& t = c->train;
  EvalConfig& e = c->eval;
  return {
      {"model", "n_layer", &m.n_layer},
      {"model", "n_embd", &m.n_embd},
      {"model", "n_head", &m.n_head},
      {"model", "block_size", &m.block_size},
      {"data", "corpus", PathField{&d.corpus}},
      {"data", "val_fraction", &d.val_fraction},
      {"train", "batch_size", &t.batch_size},
      {"train", "steps", &t.steps},
      {"train", "lr", &t.lr},
      {"train", "min_lr", &t.min_lr},
      {"train", "warmup_steps", &t.warmup_steps},
      {"train", "lr_decay_steps", &t.lr_decay_steps},
      {"train", "weight_decay", &t.weight_decay},
      {"train", "beta1", &t.beta1},
      {"train", "beta2", &t.beta2},
      {"train", "eps", &t.eps},
      {"train", "grad_clip", &t.grad_clip},
      {"train", "seed", &t.seed},
      {"train", "threads", &t.threads},
      {"train", "checkpoint_every", &t.checkpoint_every},
      {"train", "log_every", &t.log_every},
      {"eval", "every", &e.every},
      {"eval", "batches", &e.batches},
  };
}

// Section names in table order.
std::vector<std::string> SectionsOf(const std::vector<Key>& keys) {
  std::vector<std::string> sections;
  for (const Key& key : keys) {
    if (sections.empty() || sections.back() != key.section) sections.push_back(key.section);
  }
  return sections;
}

std::vector<std::string> NamesIn(const std::vector<Key>& keys, const std::string& section) {
  std::vector<std::string> names;
  for (const Key& key : keys) {
    if (key.section == section) names.push_back(key.name);
  }
  return names;
}

// ---------------------------------------------------------------------------
// Small helpers.

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// "; did you mean 'x'?" when some candidate is a near miss, else "".
std::string DidYouMean(const std::string& name, const std::vector<std::string>& candidates) {
  const std::string* best = nullptr;
  size_t best_distance = 3;  // suggest only within 2 edits, and fewer for short names
  for (const std::string& candidate : candidates) {
    size_t distance = EditDistance(name, candidate);
    if (distance < best_distance && 2 * distance <= name.size()) {
      best = &candidate;
      best_distance = distance;
    }
  }
  return best ? "; did you mean '" + *best + "'?" : "";
}

// Shortest text that reads back to the same double.
std::string FormatDouble(double value) {
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Sequence:
      return "a sequence";
    case YAML::NodeType::Scalar:
      return "'" + node.Scalar() + "'";
    default:
      return "an empty value";
  }
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

  // The origin of key, whose node in the tree is at mark.
  std::string At(const std::string& key, const YAML::Mark& mark) const {
    auto it = overrides_.find(key);
    if (it != overrides_.end()) return it->second;
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

// Absolute, lexically normal form of path; relative paths resolve against
// base (the current working directory when empty).
std::string ResolvePath(const std::string& path, const std::string& base) {
  if (path.empty()) return path;
  fs::path resolved(path);
  if (resolved.is_relative() && !base.empty()) resolved = fs::path(base) / resolved;
  std::error_code ec;
  fs::path absolute = fs::absolute(resolved, ec);
  if (!ec) resolved = absolute;
  return resolved.lexically_normal().string();
}

// Stores node into key's field. where is the node's origin.
Status ReadValue(const Key& key, const YAML::Node& node, const std::string& where,
                 const std::string& path_base) {
  const std::string text = node.IsScalar() ? node.Scalar() : "";
  auto expected = [&](const std::string& what) {
    return Status::Error(where + ": " + key.dotted() + ": expected " + what + ", got " +
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
  } else if (auto* field = std::get_if<PathField>(&key.field)) {
    // An empty value leaves the path empty; Validate() says it is required.
    if (!node.IsScalar() && !node.IsNull()) return expected("a path");
    *field->value = ResolvePath(text, path_base);
  }
  return Status::Ok();
}

// Reads the tree (sections → keys) into *config.
Status ReadTree(const YAML::Node& root, const std::string& base_dir, Origins* origins,
                RunConfig* config) {
  const std::vector<Key> keys = KeysOf(config);
  const std::vector<std::string> sections = SectionsOf(keys);
  std::set<std::string> seen_sections;
  for (const auto& section_entry : root) {
    const YAML::Node& section_node = section_entry.first;
    const YAML::Node& body = section_entry.second;
    const std::string section = section_node.Scalar();
    const std::string section_at = origins->At(section, section_node.Mark());
    if (std::find(sections.begin(), sections.end(), section) == sections.end()) {
      return Status::Error(section_at + ": unknown section '" + section +
                           "'; known sections: " + Join(sections) + DidYouMean(section, sections));
    }
    if (!seen_sections.insert(section).second) {
      return Status::Error(section_at + ": section '" + section +
                           "' appears twice; merge its keys into one");
    }
    if (body.IsNull()) continue;  // "train:" with every key commented out
    if (!body.IsMap()) {
      return Status::Error(origins->At(section, body.Mark()) + ": " + section +
                           ": expected a section (a mapping of keys), got " + Describe(body));
    }
    const std::vector<std::string> names = NamesIn(keys, section);
    std::set<std::string> seen_names;
    for (const auto& entry : body) {
      const std::string name = entry.first.Scalar();
      const std::string dotted = section + "." + name;
      auto key = std::find_if(keys.begin(), keys.end(),
                              [&](const Key& k) { return k.section == section && k.name == name; });
      if (key == keys.end()) {
        return Status::Error(origins->At(dotted, entry.first.Mark()) + ": unknown key '" + dotted +
                             "'; known keys in '" + section + "': " + Join(names) +
                             DidYouMean(name, names));
      }
      if (!seen_names.insert(name).second) {
        return Status::Error(origins->At(dotted, entry.first.Mark()) + ": key '" + dotted +
                             "' appears twice; keep one");
      }
      // A path given on the command line is relative to where the command ran.
      const std::string path_base = origins->IsOverride(dotted) ? "" : base_dir;
      const std::string where = origins->At(dotted, entry.second.Mark());
      DL_RETURN_IF_ERROR(ReadValue(*key, entry.second, where, path_base));
      origins->Record(dotted, where);
    }
  }
  return Status::Ok();
}

// Applies "--set section.key=value" arguments to the tree, creating sections
// as needed; the reader then checks them like the file's own keys.
Status ApplyOverrides(const std::vector<std::string>& overrides, YAML::Node* root,
                      Origins* origins) {
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
    const size_t dot = key.find('.');
    if (dot == std::string::npos) {  // a whole section, e.g. "train=5": the reader rejects it
      (*root)[key] = value;
      origins->SetByOverride(key, argument);
      continue;
    }
    const std::string section = key.substr(0, dot);
    const std::string name = key.substr(dot + 1);
    const YAML::Node existing = std::as_const(*root)[section];
    if (!existing.IsDefined()) {
      origins->SetByOverride(section, argument);
    } else if (!existing.IsMap() && !existing.IsNull()) {
      continue;  // the file's section is not a mapping: the reader reports that
    }
    (*root)[section][name] = value;
    origins->SetByOverride(key, argument);
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

  const DataConfig& d = c.data;
  if (d.corpus.empty()) {
    return Status::Error(origins.OfValue({"data.corpus"}) +
                         ": data.corpus is required: the path of a text file or a directory of " +
                         "text files; set it under 'data:' or pass --set data.corpus=PATH");
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

  const EvalConfig& e = c.eval;
  DL_RETURN_IF_ERROR(at_least("eval.every", e.every, 0, " (0 = only at the end)"));
  DL_RETURN_IF_ERROR(at_least("eval.batches", e.batches, 1, ""));
  return Status::Ok();
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
                         Join(SectionsOf(KeysOf(&defaults))) + "), got " + Describe(root));
  }
  DL_RETURN_IF_ERROR(ApplyOverrides(overrides, &root, &origins));
  RunConfig config;
  DL_RETURN_IF_ERROR(ReadTree(root, base_dir, &origins, &config));
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

std::string RunConfigToYaml(const RunConfig& config) {
  RunConfig copy = config;  // KeysOf binds mutable pointers
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string section;
  for (const Key& key : KeysOf(&copy)) {
    if (key.section != section) {
      if (!section.empty()) out << YAML::EndMap;
      section = key.section;
      out << YAML::Key << section << YAML::Value << YAML::BeginMap;
    }
    out << YAML::Key << key.name << YAML::Value;
    if (auto* field = std::get_if<int*>(&key.field)) {
      out << std::to_string(**field);
    } else if (auto* field = std::get_if<uint64_t*>(&key.field)) {
      out << std::to_string(**field);
    } else if (auto* field = std::get_if<double*>(&key.field)) {
      out << FormatDouble(**field);
    } else if (auto* field = std::get_if<PathField>(&key.field)) {
      out << *field->value;
    }
  }
  if (!section.empty()) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace diloco
