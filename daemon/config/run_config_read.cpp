// Reading a run config: the YAML tree, with --set applied to it, into the fields the key table
// binds (run_config_keys.h); then Validate() (run_config_check.cpp).
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include "daemon/config/run_config.h"
#include "daemon/config/run_config_keys.h"
#include "daemon/config/yaml_helpers.h"

namespace diloco {
namespace config_internal {
namespace {

namespace fs = std::filesystem;

// Stores node into key's field. where is the node's origin.
Status ReadValue(const Key& key, const YAML::Node& node, const std::string& where, const std::string& path_base) {
  const std::string text = node.IsScalar() ? node.Scalar() : "";
  auto expected = [&](const std::string& what) {
    return Status::Error(where + ": " + key.path + ": expected " + what + ", got " + Describe(node));
  };
  if (auto* field = std::get_if<int*>(&key.field)) {
    if (!node.IsScalar() || !ParseInt(text, *field)) {
      return expected("an integer (32-bit, no decimal point or exponent)");
    }
  } else if (auto* field = std::get_if<uint64_t*>(&key.field)) {
    if (!node.IsScalar() || !ParseUint64(text, *field)) return expected("a non-negative integer");
  } else if (auto* field = std::get_if<double*>(&key.field)) {
    if (!node.IsScalar() || !ParseDouble(text, *field)) return expected("a number");
  } else if (auto* field = std::get_if<std::string*>(&key.field)) {
    if (!node.IsScalar() && !node.IsNull()) return expected("a name");
    **field = text;
  } else if (auto* field = std::get_if<StringListField>(&key.field)) {
    field->value->clear();
    if (node.IsNull()) return Status::Ok();
    if (field->one_may_be_scalar && node.IsScalar()) {
      field->value->push_back(node.Scalar());
      return Status::Ok();
    }
    if (!node.IsSequence())
      return expected(field->one_may_be_scalar ? "a name or a list of names, e.g. site-s or [site-s, site-t]"
                                               : "a list of names, e.g. [site-a, site-b]");
    for (size_t i = 0; i < node.size(); ++i) {
      if (!node[i].IsScalar()) return expected("a list of names, e.g. [site-a, site-b]");
      field->value->push_back(node[i].Scalar());
    }
  } else if (auto* field = std::get_if<PathField>(&key.field)) {
    // An empty value leaves the path empty; Validate() says it is required.
    if (!node.IsScalar() && !node.IsNull()) return expected("a path");
    *field->value = ResolvePath(text, path_base);
  } else if (auto* field = std::get_if<EnumField>(&key.field)) {
    const auto it = std::find(field->names.begin(), field->names.end(), text);
    if (!node.IsScalar() || it == field->names.end()) {
      return Status::Error(where + ": " + key.path + ": expected one of " + Join(field->names) + ", got " +
                           Describe(node) + DidYouMean(text, field->names));
    }
    field->set(static_cast<int>(it - field->names.begin()));
  }
  return Status::Ok();
}

// Sizes the config's lists to the tree's, so that KeysOf() has a row for every item the reader
// will meet.
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
      const bool is_section = (key == nullptr || IsContainer(*key)) && !ChildrenOf(keys_, path).empty();
      if (key == nullptr && !is_section) {
        if (parent.empty()) {
          return Status::Error(name_at + ": unknown section '" + name + "'; known sections: " + Join(names) +
                               DidYouMean(name, names));
        }
        return Status::Error(name_at + ": unknown key '" + path + "'; known keys in '" + parent +
                             "': " + Join(names) + DidYouMean(name, names));
      }
      const bool is_value = key != nullptr && !IsContainer(*key);
      if (!seen.insert(name).second) {
        if (is_value) return Status::Error(name_at + ": key '" + path + "' appears twice; keep one");
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
      } else if (const auto* list = key ? std::get_if<ListField>(&key->field) : nullptr) {
        DL_RETURN_IF_ERROR(ReadList(value, path, *list));
        origins_->Record(path, where);
      } else {
        DL_RETURN_IF_ERROR(ReadSubsection(value, path));
        // Given at all, even empty: the section is there (its keys keep their defaults).
        if (const auto* optional = key ? std::get_if<OptionalSection>(&key->field) : nullptr) {
          *optional->present = true;
          origins_->Record(path, where);
        }
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
      return Status::Error(origins_->At(path, node.Mark()) + ": " + path + ": expected a list of sections (keys: " +
                           Join(list.item_names) + "), e.g. " + path + ": [{" + list.item_names.front() +
                           ": ...}], got " + Describe(node));
    }
    for (size_t i = 0; i < node.size(); ++i) {
      DL_RETURN_IF_ERROR(ReadSubsection(node[i], path + "." + std::to_string(i)));
    }
    return Status::Ok();
  }

  // chaos.events: each item is read with its own small table, then checked for one trigger and
  // one action with all its required keys (ranges: Validate, once sync.learners is known).
  Status ReadChaosEvents(const YAML::Node& node, const std::string& path, std::vector<ChaosEvent>* events) {
    events->clear();
    if (node.IsNull()) return Status::Ok();
    const std::string actions = Join(std::vector<std::string>(kChaosEventNames.begin(), kChaosEventNames.end()));
    if (!node.IsSequence()) {
      return Status::Error(origins_->At(path, node.Mark()) + ": " + path + ": expected a list of events, e.g. " +
                           path + ": [{at_s: 30, kill: {learner: 1}}], got " + Describe(node));
    }
    for (size_t i = 0; i < node.size(); ++i) {
      const std::string item = path + "." + std::to_string(i);
      const YAML::Node entry = node[i];
      const std::string item_at = origins_->At(item, entry.Mark());
      if (!entry.IsMap()) {
        return Status::Error(item_at + ": " + item +
                             ": expected an event: one trigger (at_s or at_step) and one action (" + actions +
                             "), e.g. {at_s: 30, kill: {learner: 1}}; got " + Describe(entry));
      }
      ChaosEvent event;
      std::vector<Key> keys = ChaosEventKeysOf(&event);
      for (Key& key : keys) key.path = item + "." + key.path;
      DL_RETURN_IF_ERROR(TreeReader(keys, base_dir_, origins_).ReadSection(entry, item));

      // The reader has rejected unknown keys, so each name is a trigger or an action.
      std::string trigger, action, action_at;
      for (const auto& kv : entry) {
        const std::string name = kv.first.Scalar();
        const std::string at = origins_->At(item + "." + name, kv.first.Mark());
        if (name == "at_s" || name == "at_step") {
          if (!trigger.empty()) return Status::Error(at + ": " + item + ": has both at_s and at_step; keep one");
          trigger = name;
          // A negative at_step would read as "no step trigger": refuse it here, by its row's range.
          if (name == "at_step") DL_RETURN_IF_ERROR(CheckRange(*FindKey(keys, item + ".at_step"), *origins_));
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
        return Status::Error(origins_->At(item + ".at_step", entry["at_step"].Mark()) + ": " + item +
                             ".at_step: only kill, slow and partition fire at a step (a step of their learner); "
                             "give " + action + " an at_s");
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

std::string Trim(std::string s) {
  const char* space = " \t";
  s.erase(0, s.find_first_not_of(space));
  s.erase(s.find_last_not_of(space) + 1);
  return s;
}

// Applies "--set path.to.key=value" arguments to the tree, creating sections and list items as
// needed; the reader then checks them like the file's own keys.
Status ApplyOverrides(const std::vector<std::string>& overrides, YAML::Node* root, Origins* origins) {
  RunConfig storage;
  const std::vector<Key> schema = SchemaKeys(&storage);
  std::set<std::string> lists;
  for (const Key& key : schema) {
    if (std::holds_alternative<ListField>(key.field)) lists.insert(key.path);
  }
  auto new_container = [&](const std::string& schema_path) {
    return YAML::Node(lists.count(schema_path) ? YAML::NodeType::Sequence : YAML::NodeType::Map);
  };
  for (const std::string& argument : overrides) {
    const size_t equals = argument.find('=');
    const std::string key = equals == std::string::npos ? "" : Trim(argument.substr(0, equals));
    if (key.empty()) return Status::Error("--set '" + argument + "': expected key=value, e.g. --set train.lr=3e-4");
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
                           "' is not a key path; join its parts with single dots, e.g. --set sync.grace.gamma=0.5");
    }
    // Walk down from the root, creating what is missing. schema_path is the path with list
    // indices as 0, to look nodes up in the table.
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
        if (row != nullptr && !IsContainer(*row)) {
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
          return Status::Error("--set " + argument + ": '" + parts[i] + "' is not an index into the list '" + parent +
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
}  // namespace config_internal

Status ParseRunConfig(const std::string& yaml_text, const std::string& source_name, const std::string& base_dir,
                      const std::vector<std::string>& overrides, RunConfig* out) {
  using namespace config_internal;
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

Status LoadRunConfig(const std::string& path, const std::vector<std::string>& overrides, RunConfig* out) {
  std::string text;
  DL_RETURN_IF_ERROR(config_internal::ReadFile(path, &text));
  std::error_code ec;
  std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  const std::string base_dir =
      ec ? std::filesystem::path(path).parent_path().string() : absolute.parent_path().string();
  return ParseRunConfig(text, path, base_dir, overrides, out);
}

}  // namespace diloco
