#include "daemon/control/site_chaos.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>

namespace diloco {
namespace {

constexpr std::array<const char*, 7> kActionNames = {"kill", "restart", "slow", "partition", "heal", "drop", "corrupt"};

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// args[key] as a finite number; absent: *out unchanged.
Status ReadNumber(const ControlArgs& args, const char* key, double* out) {
  auto it = args.find(key);
  if (it == args.end() || it->second.empty()) return Status::Ok();
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (end == it->second.c_str() || *end != '\0' || !std::isfinite(v))
    return Status::Error("chaos: " + std::string(key) + " '" + it->second + "' is not a number");
  *out = v;
  return Status::Ok();
}

}  // namespace

const char* ToString(SiteChaosAction action) { return kActionNames[static_cast<int>(action)]; }

ControlArgs SiteChaosArgs(const SiteChaosCommand& c) {
  ControlArgs a = {{"action", ToString(c.action)}, {"site", c.site}, {"learner", std::to_string(c.learner)}};
  if (c.syncer) a["syncer"] = "1";
  if (c.process) a["process"] = "1";
  a["value"] = Number(c.value);
  a["duration_s"] = Number(c.duration_s);
  a["restart_after_s"] = Number(c.restart_after_s);
  return a;
}

Status ParseSiteChaos(const ControlArgs& args, SiteChaosCommand* out) {
  SiteChaosCommand c;
  auto get = [&](const char* k) { auto it = args.find(k); return it == args.end() ? std::string() : it->second; };
  const std::string action = get("action");
  auto it = std::find_if(kActionNames.begin(), kActionNames.end(), [&](const char* n) { return action == n; });
  if (it == kActionNames.end())
    return Status::Error("chaos: unknown action '" + action + "' (kill, restart, slow, partition, heal, drop, corrupt)");
  c.action = static_cast<SiteChaosAction>(it - kActionNames.begin());
  c.site = get("site");
  if (c.site.empty()) return Status::Error("chaos: which site? (the SITE argument)");
  double learner = -1;
  DL_RETURN_IF_ERROR(ReadNumber(args, "learner", &learner));
  if (learner != std::floor(learner) || learner < -1 || learner > 1e6)
    return Status::Error("chaos: learner must be a learner index (0, 1, ...), got " + get("learner"));
  c.learner = (int)learner;
  c.syncer = get("syncer") == "1";
  c.process = get("process") == "1";
  DL_RETURN_IF_ERROR(ReadNumber(args, "value", &c.value));
  DL_RETURN_IF_ERROR(ReadNumber(args, "duration_s", &c.duration_s));
  DL_RETURN_IF_ERROR(ReadNumber(args, "restart_after_s", &c.restart_after_s));
  const bool role_action = c.action == SiteChaosAction::kKill || c.action == SiteChaosAction::kRestart;
  if (c.syncer && c.learner >= 0) return Status::Error("chaos: name a learner or the syncer, not both");
  if (c.syncer && !role_action)
    return Status::Error(std::string("chaos: ") + ToString(c.action) +
                         " acts on learners (their links and steps); to cut the syncer off, partition the learners' sites");
  if (c.process && c.action != SiteChaosAction::kKill) return Status::Error("chaos: --process goes with kill only");
  if (c.process && (c.syncer || c.learner >= 0))
    return Status::Error("chaos: kill --process kills the whole dilocod of the site: it takes no learner or syncer");
  if (c.process && c.restart_after_s >= 0)
    return Status::Error("chaos: kill --process cannot restart the daemon it kills: its supervisor (systemd "
                         "Restart=) does; drop --restart-after");
  if (c.action == SiteChaosAction::kSlow && (c.value < 0 || c.value > 1000))
    return Status::Error("chaos: slow needs a factor in (0, 1000] (0: back to the config's), got " + Number(c.value));
  if ((c.action == SiteChaosAction::kDrop || c.action == SiteChaosAction::kCorrupt) && (c.value < 0 || c.value > 1))
    return Status::Error(std::string("chaos: ") + ToString(c.action) + " needs a probability in [0, 1], got " +
                         Number(c.value));
  if (c.duration_s > 1e7 || c.restart_after_s > 1e7)
    return Status::Error("chaos: durations are seconds, at most 1e7");
  *out = c;
  return Status::Ok();
}

std::optional<SiteChaosCommand> UndoOf(const SiteChaosCommand& c, double* after_s) {
  SiteChaosCommand u = c;
  u.duration_s = -1;
  u.restart_after_s = -1;
  switch (c.action) {
    case SiteChaosAction::kKill:
      if (c.process || c.restart_after_s < 0) return std::nullopt;
      u.action = SiteChaosAction::kRestart;
      *after_s = c.restart_after_s;
      return u;
    case SiteChaosAction::kSlow:
    case SiteChaosAction::kDrop:
    case SiteChaosAction::kCorrupt:
      if (c.duration_s <= 0) return std::nullopt;
      u.value = 0;
      *after_s = c.duration_s;
      return u;
    case SiteChaosAction::kPartition:
      if (c.duration_s <= 0) return std::nullopt;
      u.action = SiteChaosAction::kHeal;
      *after_s = c.duration_s;
      return u;
    case SiteChaosAction::kRestart:
    case SiteChaosAction::kHeal:
      return std::nullopt;
  }
  return std::nullopt;
}

std::string Describe(const SiteChaosCommand& c) {
  std::string who = c.process ? "the dilocod process" : c.syncer ? "the syncer" : c.learner >= 0 ? "learner-" + std::to_string(c.learner)
                    : (c.action == SiteChaosAction::kKill || c.action == SiteChaosAction::kRestart) ? "every role of the job"
                                                                                                     : "every learner of the job";
  std::string s = std::string(ToString(c.action)) + " " + who + " on " + c.site;
  if (c.action == SiteChaosAction::kSlow) s += c.value > 0 ? " (x" + Number(c.value) + ")" : " (back to the config's pace)";
  if (c.action == SiteChaosAction::kDrop || c.action == SiteChaosAction::kCorrupt)
    s += c.value > 0 ? " (p=" + Number(c.value) + ")" : " (back to normal)";
  if (c.duration_s > 0) s += " for " + Number(c.duration_s) + " s";
  if (c.action == SiteChaosAction::kKill && !c.process)
    s += c.restart_after_s >= 0 ? " (restart after " + Number(c.restart_after_s) + " s)" : " (no restart)";
  return s;
}

std::vector<SiteChaosCommand> SiteChaosOf(const ChaosAction& a, const std::vector<std::string>& learners,
                                          const std::vector<std::string>& syncer_sites) {
  SiteChaosCommand c;
  c.learner = a.learner;
  auto one_learner = [&](SiteChaosAction action, double value) -> std::vector<SiteChaosCommand> {
    c.action = action;
    c.value = value;
    if (c.learner < 0 || c.learner >= (int)learners.size()) return {};
    c.site = learners[c.learner];
    return {c};
  };
  auto links = [&](SiteChaosAction action, double value) -> std::vector<SiteChaosCommand> {
    if (a.learner >= 0) return one_learner(action, value);
    std::vector<SiteChaosCommand> out;
    for (const std::string& site : learners) {
      if (std::any_of(out.begin(), out.end(), [&](const SiteChaosCommand& o) { return o.site == site; })) continue;
      c.action = action;
      c.value = value;
      c.site = site;
      out.push_back(c);
    }
    return out;
  };
  switch (a.kind) {
    case ChaosActionKind::kKill: return one_learner(SiteChaosAction::kKill, 0);
    case ChaosActionKind::kRestart: return one_learner(SiteChaosAction::kRestart, 0);
    case ChaosActionKind::kSlowStart: return one_learner(SiteChaosAction::kSlow, a.value);
    case ChaosActionKind::kSlowEnd: return one_learner(SiteChaosAction::kSlow, 0);
    case ChaosActionKind::kPartitionStart: return one_learner(SiteChaosAction::kPartition, 0);
    case ChaosActionKind::kPartitionEnd: return one_learner(SiteChaosAction::kHeal, 0);
    case ChaosActionKind::kDropStart: return links(SiteChaosAction::kDrop, a.value);
    case ChaosActionKind::kDropEnd: return links(SiteChaosAction::kDrop, 0);
    case ChaosActionKind::kCorruptStart: return links(SiteChaosAction::kCorrupt, a.value);
    case ChaosActionKind::kCorruptEnd: return links(SiteChaosAction::kCorrupt, 0);
    case ChaosActionKind::kSyncerKill:
    case ChaosActionKind::kSyncerRestart:
      c.action = a.kind == ChaosActionKind::kSyncerKill ? SiteChaosAction::kKill : SiteChaosAction::kRestart;
      c.learner = -1;
      c.syncer = true;
      std::vector<SiteChaosCommand> out;
      for (const std::string& site : syncer_sites) {
        c.site = site;
        out.push_back(c);
      }
      return out;
  }
  return {};
}

}  // namespace diloco
