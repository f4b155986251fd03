// Writing a run config: every row of the key table (run_config_keys.cpp) in table order, so that
// ParseRunConfig of the text gives back an equal RunConfig.
#include <yaml-cpp/yaml.h>

#include <algorithm>

#include "daemon/config/run_config.h"
#include "daemon/config/run_config_keys.h"

namespace diloco {
namespace config_internal {
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

// The YAML value of a row that holds one (not a section).
YAML::Node ValueOf(const Key& key) {
  if (auto* field = std::get_if<int*>(&key.field)) return YAML::Node(std::to_string(**field));
  if (auto* field = std::get_if<uint64_t*>(&key.field)) return YAML::Node(std::to_string(**field));
  if (auto* field = std::get_if<double*>(&key.field)) return YAML::Node(FormatDouble(**field));
  if (auto* field = std::get_if<std::string*>(&key.field)) return YAML::Node(**field);
  if (auto* field = std::get_if<PathField>(&key.field)) return YAML::Node(*field->value);
  if (auto* field = std::get_if<EnumField>(&key.field)) return YAML::Node(field->names.at(field->get()));
  if (auto* field = std::get_if<ChaosEventsField>(&key.field)) return ChaosEventsToYaml(*field->value);
  if (auto* field = std::get_if<StringListField>(&key.field); field && field->one_may_be_scalar && field->value->size() == 1)
    return YAML::Node(field->value->front());
  YAML::Node list(YAML::NodeType::Sequence);  // a list of names, or "[]" until an item makes it a block
  list.SetStyle(YAML::EmitterStyle::Flow);
  if (auto* field = std::get_if<StringListField>(&key.field)) {
    for (const std::string& item : *field->value) list.push_back(item);
  }
  return list;
}

bool StartsWithPath(const std::string& path, const std::string& prefix) {
  return path.compare(0, prefix.size(), prefix) == 0 && (path.size() == prefix.size() || path[prefix.size()] == '.');
}

}  // namespace
}  // namespace config_internal

std::string RunConfigToYaml(const RunConfig& config) {
  using namespace config_internal;
  RunConfig copy = config;  // KeysOf binds mutable pointers
  YAML::Node root(YAML::NodeType::Map);
  std::vector<std::string> absent;  // optional sections not given, left out with their keys
  for (const Key& key : KeysOf(&copy)) {
    // A run without chaos has no chaos section, as most configs are written.
    if (copy.chaos.empty() && StartsWithPath(key.path, "chaos")) continue;
    if (std::any_of(absent.begin(), absent.end(), [&](const std::string& a) { return StartsWithPath(key.path, a); })) {
      continue;
    }
    if (const auto* optional = std::get_if<OptionalSection>(&key.field)) {
      if (!*optional->present) absent.push_back(key.path);
      continue;  // its keys make the section
    }
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
    node[parts.back()] = ValueOf(key);
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

}  // namespace diloco
