#include "daemon/metrics/registry.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace diloco {
namespace {

bool IsNameChar(char c, bool first, bool colon_ok) {
  const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  if (alpha || (colon_ok && c == ':')) return true;
  return !first && c >= '0' && c <= '9';
}

bool IsValidName(const std::string& name, bool colon_ok) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); i++)
    if (!IsNameChar(name[i], i == 0, colon_ok)) return false;
  return true;
}

const char* KindName(MetricKind kind) { return kind == MetricKind::kCounter ? "counter" : "gauge"; }

// HELP text escapes backslash and newline; label values also the double quote.
void AppendEscaped(const std::string& text, bool quote, std::string* out) {
  for (char c : text) {
    if (c == '\\') *out += "\\\\";
    else if (c == '\n') *out += "\\n";
    else if (quote && c == '"') *out += "\\\"";
    else *out += c;
  }
}

[[noreturn]] void Misuse(const std::string& what) {
  std::fprintf(stderr, "metrics: %s\n", what.c_str());
  std::abort();
}

}  // namespace

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, res.ptr);
}

Status MetricsRegistry::Declare(const std::string& name, MetricKind kind, const std::string& help,
                                const std::vector<std::string>& label_names) {
  if (!IsValidName(name, /*colon_ok=*/true))
    return Status::Error("metric name '" + name + "' is not valid: use [a-zA-Z_:][a-zA-Z0-9_:]*");
  for (const std::string& label : label_names)
    if (!IsValidName(label, /*colon_ok=*/false) || label.rfind("__", 0) == 0)
      return Status::Error("metric " + name + ": label name '" + label +
                           "' is not valid: use [a-zA-Z_][a-zA-Z0-9_]*, not starting with __");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    if (it->second.kind != kind || it->second.label_names != label_names)
      return Status::Error("metric " + name + " is declared already as a " +
                           KindName(it->second.kind) + " with other labels or kind");
    return Status::Ok();
  }
  Family& f = families_[name];
  f.kind = kind;
  f.help = help;
  f.label_names = label_names;
  return Status::Ok();
}

MetricsRegistry::Family& MetricsRegistry::FamilyFor(const std::string& name,
                                                    const std::vector<std::string>& label_values) {
  auto it = families_.find(name);
  if (it == families_.end()) Misuse("metric " + name + " is used but was never declared");
  if (it->second.label_names.size() != label_values.size())
    Misuse("metric " + name + " takes " + std::to_string(it->second.label_names.size()) +
           " label values, got " + std::to_string(label_values.size()));
  return it->second;
}

void MetricsRegistry::Set(const std::string& name, const std::vector<std::string>& label_values,
                          double value) {
  std::lock_guard<std::mutex> lock(mu_);
  FamilyFor(name, label_values).series[label_values] = value;
}

void MetricsRegistry::Add(const std::string& name, const std::vector<std::string>& label_values,
                          double delta) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = FamilyFor(name, label_values);
  double& v = f.series[label_values];  // a new series starts at 0
  if (f.kind == MetricKind::kCounter && !(delta >= 0)) return;
  v += delta;
}

bool MetricsRegistry::Get(const std::string& name, const std::vector<std::string>& label_values,
                          double* value) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return false;
  auto s = it->second.series.find(label_values);
  if (s == it->second.series.end()) return false;
  *value = s->second;
  return true;
}

size_t MetricsRegistry::RemoveWithLabel(const std::string& label_name, const std::string& value) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t removed = 0;
  for (auto& [name, f] : families_) {
    size_t k = 0;
    while (k < f.label_names.size() && f.label_names[k] != label_name) k++;
    if (k == f.label_names.size()) continue;
    for (auto s = f.series.begin(); s != f.series.end();) {
      if (s->first[k] == value) {
        s = f.series.erase(s);
        removed++;
      } else {
        ++s;
      }
    }
  }
  return removed;
}

std::string MetricsRegistry::Render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    if (f.series.empty()) continue;
    out += "# HELP " + name + " ";
    AppendEscaped(f.help, /*quote=*/false, &out);
    out += "\n# TYPE " + name + " " + KindName(f.kind) + "\n";
    for (const auto& [values, v] : f.series) {
      out += name;
      if (!values.empty()) {
        out += '{';
        for (size_t i = 0; i < values.size(); i++) {
          if (i > 0) out += ',';
          out += f.label_names[i] + "=\"";
          AppendEscaped(values[i], /*quote=*/true, &out);
          out += '"';
        }
        out += '}';
      }
      out += ' ' + FormatMetricValue(v) + '\n';
    }
  }
  return out;
}

}  // namespace diloco
