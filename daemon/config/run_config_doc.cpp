// The key table as a reader sees it: README's list of run-config keys and `dilococtl config keys`
// print this, so the list cannot drift from the keys the reader accepts.
#include <algorithm>
#include <cctype>
#include <string>

#include "daemon/config/run_config.h"
#include "daemon/config/run_config_keys.h"
#include "daemon/config/yaml_helpers.h"

namespace diloco {
namespace config_internal {
namespace {

// "learners.0.link.loss" -> "learners[i].link.loss".
std::string DisplayPath(const std::string& path) {
  std::string out;
  for (const std::string& part : Split(path)) {
    const bool index = !part.empty() && std::all_of(part.begin(), part.end(), [](char ch) { return std::isdigit(ch); });
    out += index ? "[i]" : (out.empty() ? "" : ".") + part;
  }
  return out;
}

std::string TypeOf(const FieldRef& field) {
  if (std::holds_alternative<int*>(field)) return "int";
  if (std::holds_alternative<uint64_t*>(field)) return "uint64";
  if (std::holds_alternative<double*>(field)) return "number";
  if (std::holds_alternative<std::string*>(field)) return "text";
  if (std::holds_alternative<PathField>(field)) return "path";
  if (const auto* e = std::get_if<EnumField>(&field)) {
    return e->names == std::vector<std::string>(kBoolNames.begin(), kBoolNames.end()) ? "bool" : "enum";
  }
  if (std::holds_alternative<ListField>(field)) return "list of sections";
  if (const auto* l = std::get_if<StringListField>(&field)) return l->one_may_be_scalar ? "name or list" : "list of names";
  if (std::holds_alternative<ChaosEventsField>(field)) return "list of events";
  return "optional section";
}

std::string Code(const std::string& text) { return text.empty() ? "" : "`" + text + "`"; }

// As a table cell: values as code, "absent" for an optional section.
std::string DefaultOf(const FieldRef& field) {
  if (auto* v = std::get_if<int*>(&field)) return Code(std::to_string(**v));
  if (auto* v = std::get_if<uint64_t*>(&field)) return Code(std::to_string(**v));
  if (auto* v = std::get_if<double*>(&field)) return Code(FormatDouble(**v));
  if (auto* v = std::get_if<std::string*>(&field)) return Code(**v);
  if (auto* v = std::get_if<PathField>(&field)) return Code(*v->value);
  if (auto* v = std::get_if<EnumField>(&field)) return Code(v->names.at(v->get()));
  if (std::holds_alternative<OptionalSection>(field)) return "absent";
  return Code("[]");
}

std::string RangeOf(const Key& key) {
  if (const auto* e = std::get_if<EnumField>(&key.field)) return Join(e->names);
  return key.range.text;
}

std::string Cell(const std::string& text) {
  std::string out;
  for (char ch : text) out += ch == '|' ? "\\|" : std::string(1, ch);
  return out;
}

struct Row {
  std::string name;
  const Key* key;
  std::string default_text;  // a cell
};

// Every key with one item in each list, an item's keys right after their list (as a chaos
// event's follow chaos.events).
template <typename Visit>
void ForEachRow(Visit visit) {
  RunConfig config;
  config.learners.resize(1);
  const std::vector<Key> keys = KeysOf(&config);
  ChaosEvent event;
  const std::vector<Key> event_keys = ChaosEventKeysOf(&event);
  auto is_item = [](const Key& key) { return DisplayPath(key.path).find("[i]") != std::string::npos; };
  for (const Key& key : keys) {
    if (is_item(key)) continue;  // shown after its list
    visit(Row{DisplayPath(key.path), &key, DefaultOf(key.field)});
    if (std::holds_alternative<ListField>(key.field)) {
      for (const Key& item : keys) {
        if (is_item(item) && item.path.compare(0, key.path.size() + 1, key.path + ".") == 0) {
          visit(Row{DisplayPath(item.path), &item, DefaultOf(item.field)});
        }
      }
    }
    if (!std::holds_alternative<ChaosEventsField>(key.field)) continue;
    for (const Key& item : event_keys) {
      // The action is the first part of an action key; a trigger has none.
      const size_t dot = item.path.find('.');
      std::string default_text = "";
      if (dot != std::string::npos) {
        const std::string action = item.path.substr(0, dot);
        const auto kind = std::find(kChaosEventNames.begin(), kChaosEventNames.end(), action);
        const bool required =
            IsRequiredChaosKey(static_cast<ChaosEventKind>(kind - kChaosEventNames.begin()), item.path.substr(dot + 1));
        default_text = required ? "required" : DefaultOf(item.field);
      }
      visit(Row{DisplayPath(key.path) + "[i]." + item.path, &item, default_text});
    }
  }
}

}  // namespace
}  // namespace config_internal

std::vector<std::string> RunConfigKeyNames() {
  std::vector<std::string> names;
  config_internal::ForEachRow([&](const config_internal::Row& row) { names.push_back(row.name); });
  return names;
}

std::string RunConfigKeysMarkdown() {
  using namespace config_internal;
  std::string out =
      "| Key | Type | Default | Range | Also checked | Meaning |\n"
      "|---|---|---|---|---|---|\n";
  ForEachRow([&](const Row& row) {
    out += "| " + Code(row.name) + " | " + TypeOf(row.key->field) + " | " + Cell(row.default_text) + " | " +
           Cell(RangeOf(*row.key)) + " | " + Cell(row.key->checked) + " | " + Cell(row.key->doc) + " |\n";
  });
  return out;
}

}  // namespace diloco
