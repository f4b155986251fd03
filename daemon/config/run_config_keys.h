// The run config's key table (internal to daemon/config): every key by its dotted path, bound to
// its field, with its range, its doc line and what else checks it. Reading and --set
// (run_config_read.cpp), validation (run_config_check.cpp), the written YAML
// (run_config_write.cpp) and the key list of README and `dilococtl config keys`
// (run_config_doc.cpp) all come from KeysOf(); a key exists nowhere else.
//
// To add a key: add its field (run_config.h / sync_config.h), one row where it should appear in
// the written YAML, and, when it relates to other keys, its check in run_config_check.cpp (named
// in the row's `checked`). Then run scripts/readme-keys.sh to refresh README's list.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "daemon/config/run_config.h"
#include "daemon/util/status.h"

namespace diloco::config_internal {

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

// A list of sections, e.g. learners: [{slowdown: 3}]; its items' keys are rows "list.<i>.<key>".
struct ListField {
  std::function<void(size_t)> resize;
  std::vector<std::string> item_names;  // the keys of one item, for messages
};

// A list of plain strings, e.g. placement.learners: [site-a, site-b].
struct StringListField {
  std::vector<std::string>* value;
  // One name may be written alone (a scalar, as one item); one item is written so.
  bool one_may_be_scalar = false;
};

// chaos.events: a list whose items each hold one of several action sections, read and written
// with the item table ChaosEventKeysOf.
struct ChaosEventsField {
  std::vector<ChaosEvent>* value;
};

// A section that is there or not (learners[i].link): given in the YAML or by --set, *present is
// true; written back only when *present.
struct OptionalSection {
  bool* present;
};

using FieldRef = std::variant<int*, uint64_t*, double*, std::string*, PathField, EnumField, ListField,
                              StringListField, ChaosEventsField, OptionalSection>;

// The values a number may take. text completes "must be ...", e.g. "in [0, 1)" or
// ">= 0 (0 = only at the end)"; an empty text means any value of the type.
struct Range {
  std::string text;
  std::function<bool(double)> ok;
  bool empty() const { return text.empty(); }
};
Range AtLeast(double min, const std::string& note = "");  // ">= min"
Range Above(double min, const std::string& note = "");    // "> min"
// brackets: "[]", "[)", "(]" or "()": "in [lo, hi)".
Range Within(double lo, double hi, const char* brackets, const std::string& note = "");
Range Rule(const std::string& text, std::function<bool(double)> ok);  // anything else

struct Key {
  std::string path;  // "train.lr", "sync.grace.gamma", "learners.0.slowdown"
  FieldRef field;
  Range range;          // checked for every number that has one (CheckRanges)
  std::string doc;      // one line: what the key means
  std::string checked;  // relations to other keys and checks made elsewhere; "" = the range alone
};

// Every key, bound to the fields of *c; list items as many as *c holds.
std::vector<Key> KeysOf(RunConfig* c);
// The keys of one chaos.events item, relative to it: the two triggers, then a section per action.
std::vector<Key> ChaosEventKeysOf(ChaosEvent* e);
// Every action key must be given except restart_after_s and the learner of drop and corrupt.
bool IsRequiredChaosKey(ChaosEventKind kind, const std::string& name);

// Table helpers.
std::string ChildPath(const std::string& parent, const std::string& name);
std::vector<std::string> Split(const std::string& path);
// The names directly under parent ("" = the sections), in table order.
std::vector<std::string> ChildrenOf(const std::vector<Key>& keys, const std::string& parent);
const Key* FindKey(const std::vector<Key>& keys, const std::string& path);
// A row whose path is also a parent: a list of sections or an optional section.
bool IsContainer(const Key& key);
// The row's number as a double; false for rows that hold no number.
bool NumberOf(const Key& key, double* value);

// Shortest text that reads back to the same double.
std::string FormatDouble(double value);

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
  std::string At(const std::string& key, const YAML::Mark& mark) const;

  // Remembers where the value of key came from, for validation.
  void Record(const std::string& key, std::string origin) { values_[key] = std::move(origin); }

  // The origin of the first of keys that was given a value, else the source.
  std::string OfValue(std::initializer_list<std::string> keys) const;

  const std::string& source_name() const { return source_name_; }

 private:
  std::string source_name_;
  std::map<std::string, std::string> overrides_;  // key -> "--set k=v"
  std::map<std::string, std::string> values_;     // key -> origin of its value
};

// "ORIGIN: key: must be RANGE, got VALUE" when key's number is out of its range, else Ok.
Status CheckRange(const Key& key, const Origins& origins);

// Checks ranges and relations between keys (run_config_check.cpp).
Status Validate(const RunConfig& c, const Origins& origins);

}  // namespace diloco::config_internal
