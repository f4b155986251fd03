// The local CLI's and the peers' requests (daemon_impl.h).
#include "daemon/control/daemon_impl.h"

#include <algorithm>
#include <deque>
#include <fstream>
#include <sstream>

#include "daemon/control/job_limits.h"

namespace diloco {
namespace {

// The last `lines` lines of a file (lines clamped to [1, kMaxTailLines]: a request cannot make
// the daemon hold more).
constexpr int kMaxTailLines = 10000;
int TailLines(const std::string& requested) {
  const long n = std::strtol(requested.c_str(), nullptr, 10);
  return (int)std::clamp<long>(n, 1, kMaxTailLines);
}
// Lines longer than this are cut in `logs` (the reply must stay under kMaxTextBytes).
constexpr size_t kMaxLogLineBytes = 2048;
std::string Tail(const std::string& path, int lines, size_t max_bytes = 16 << 10) {
  lines = std::clamp(lines, 1, kMaxTailLines);
  std::ifstream f(path);
  std::deque<std::string> last;
  for (std::string line; std::getline(f, line);) {
    if (line.size() > kMaxLogLineBytes)
      line = line.substr(0, kMaxLogLineBytes) + "...[" + std::to_string(line.size() - kMaxLogLineBytes) + " bytes cut]";
    last.push_back(std::move(line));
    if ((int)last.size() > lines) last.pop_front();
  }
  // The newest lines that fit in max_bytes.
  size_t bytes = 0;
  auto first = last.end();
  while (first != last.begin() && bytes + std::prev(first)->size() + 1 <= max_bytes) bytes += (--first)->size() + 1;
  std::string out;
  for (auto it = first; it != last.end(); ++it) out += *it + "\n";
  return out;
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string line; std::getline(ss, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

}  // namespace

DaemonImpl::MaybeReply DaemonImpl::HandleLocal(const std::string& name, const std::string& job, const ControlArgs& a, const ReplyTo& to) {
  auto arg = [&](const char* k, const std::string& d = "") { auto it = a.find(k); return it == a.end() ? d : it->second; };
  if (name == "ping") return ControlArgs{{"ok", "1"}, {"site", config.site}};
  if (name == "submit") return Submit(a, to);
  if (name == "list") return List(a);
  if (name == "status") return job == kNoJob ? List(a) : JobStatus(job);
  if (name == "stop") return Stop(job, to);
  if (name == "logs") return Logs(job, TailLines(arg("tail", "50")), to);
  if (name == "chaos") return Chaos(job, a, to);
  if (name == "run_dir") {
    if (!store->Exists(job)) return UnknownJob(job);
    return ControlArgs{{"ok", "1"}, {"run_dir", store->RunDir(job)}, {"site", config.site}};
  }
  return ControlArgs{{"error", "unknown command '" + name + "'"}};
}

ControlArgs DaemonImpl::HandlePeer(const std::string& sender, const ParsedMessage& m) {
  const std::string& job = m.header.job_id;
  if (const JobSpecMsg* spec = m.get<JobSpecMsg>()) {
    if (!IsJobId(job)) return {{"error", "'" + job + "' is not a job id"}};
    const bool from_host0 = sender == config.site && config.host > 0;  // key checked in Run
    if (!from_host0 && std::find(config.submitters.begin(), config.submitters.end(), sender) == config.submitters.end()) {
      Log("refused job " + job + " from " + sender + ": not among submitters");
      return {{"error", "site " + config.site + " takes jobs only from its local CLI and the sites in its submitters; " +
                            sender + " is not one (add it to submitters in " + config.site + "'s config)"}};
    }
    if ((int64_t)spec->config_yaml.size() > config.max_job_spec_bytes)
      return {{"error", "job " + job + ": its run config is larger than site " + config.site + " takes (max_job_spec_bytes " +
                            std::to_string(config.max_job_spec_bytes) + ")"}};
    if (store->Exists(job)) return {{"ok", "1"}};  // a repeated forward
    RunConfig cfg;
    if (Status st = ParseRunConfig(spec->config_yaml, "job " + job + " from " + sender, "", {}, &cfg); !st.ok())
      return {{"error", st.message()}};
    if (Status st = AcceptJob(job, cfg, sender); !st.ok()) return {{"error", st.message()}};
    JobLog(job, "accepted from " + sender);
    UpdateSdStatus();
    return {{"ok", "1"}};
  }
  const ControlMsg* c = m.get<ControlMsg>();
  const ControlArgs a = ArgsOf(*c);
  if (c->name == "ring_set" || c->name == "ring_get") {
    if (sender != config.site) return {{"error", "'" + c->name + "' is for the hosts of site " + config.site + " only"}};
    return RingRequest(job, c->name, a);
  }
  if (!store->Exists(job)) return UnknownJob(job);
  if (c->name == "peer_status") return {{"ok", "1"}, {"json", JsonText(LocalView(job))}};
  if (c->name == "peer_stop") {
    if (Status st = StopLocal(job); !st.ok()) return {{"error", st.message()}};
    return {{"ok", "1"}};
  }
  if (c->name == "peer_rejoin") {
    if (Status st = RejoinLearners(job); !st.ok()) return {{"error", st.message()}};
    return {{"ok", "1"}};
  }
  if (c->name == "peer_chaos") {
    SiteChaosCommand command;
    Status st = ParseSiteChaos(a, &command);
    if (st.ok() && command.site != config.site) st = Status::Error("chaos for site " + command.site + " sent to " + config.site);
    if (st.ok()) st = ApplyChaos(job, command);
    if (!st.ok()) return {{"error", st.message()}};
    JobLog(job, "chaos from " + sender);
    return {{"ok", "1"}};
  }
  if (c->name == "peer_logs") {
    auto it = a.find("tail");
    auto bytes = a.find("bytes");
    const size_t max_bytes = bytes == a.end() ? 16 << 10 : (size_t)std::clamp(std::atol(bytes->second.c_str()), 0L, 16L << 10);
    return {{"ok", "1"}, {"text", Tail(store->LogPath(job), it == a.end() ? 50 : TailLines(it->second), max_bytes)}};
  }
  return {{"error", "unknown peer command '" + c->name + "'"}};
}

DaemonImpl::MaybeReply DaemonImpl::Submit(const ControlArgs& a, const ReplyTo& to) {
  const auto get = [&](const char* k) { auto it = a.find(k); return it == a.end() ? std::string() : it->second; };
  if (config.host > 0)
    return ControlArgs{{"error", "this dilocod is host " + std::to_string(config.host) + " of site " + config.site +
                                     ": submit jobs on host 0 (" + config.site_hosts[0].control + "), which the other sites reach"}};
  if ((int64_t)(get("config_yaml").size() + get("overrides").size()) > config.max_job_spec_bytes)
    return ControlArgs{{"error", get("source") + ": the run config and its overrides are larger than site " + config.site +
                          " takes (max_job_spec_bytes " + std::to_string(config.max_job_spec_bytes) + " in " + config.source + ")"},
            {"usage", "1"}};
  RunConfig cfg;
  if (Status st = ParseRunConfig(get("config_yaml"), get("source"), get("base_dir"), SplitLines(get("overrides")), &cfg);
      !st.ok()) {
    return ControlArgs{{"error", st.message()}, {"usage", "1"}};
  }
  if (cfg.placement.empty()) {
    return ControlArgs{{"error", get("source") + ": placement: is required to submit a job: which site hosts the syncer and "
                                      "which hosts each learner, e.g. placement: {syncer: " + config.site +
                          ", learners: [" + config.site + ", " + config.site + "]}"},
            {"usage", "1"}};
  }
  if (Status st = CheckDaemonCanRun(cfg, get("source")); !st.ok()) return ControlArgs{{"error", st.message()}, {"usage", "1"}};
  for (const std::string& site : SitesOf(cfg)) {
    if (site != config.site && !config.FindPeer(site)) {
      std::string known = config.site;
      for (const PeerConfig& p : config.peers) known += ", " + p.site;
      return ControlArgs{{"error", get("source") + ": placement names site '" + site + "', which " + config.site +
                            " does not know (known sites: " + known + "); add it to peers in " + config.source},
              {"usage", "1"}};
    }
  }
  std::string id = store->NewId();
  while (reserved_ids.count(id)) id = store->NewId();
  const std::vector<std::string> remote = OtherSitesOf(cfg);
  const std::string source = get("source");
  if (remote.empty()) return FinishSubmit(id, cfg, source, {});
  // Peers first, off the loop: a peer that cannot take the job fails the submit before
  // anything runs here.
  reserved_ids.insert(id);
  const std::string yaml = RunConfigToYaml(cfg);
  return Defer(
      to,
      [this, id, yaml, remote] {
        return AtOnce(remote, [&](const std::string& site, ControlArgs* reply) {
          return CallControl(*context, PeerTarget(*config.FindPeer(site), 10000), id, MessageBody(JobSpecMsg{yaml}), reply)
              .WithContext("site " + site);
        });
      },
      [this, id, cfg, source](const PeerAnswers& answers) {
        reserved_ids.erase(id);
        return FinishSubmit(id, cfg, source, answers);
      });
}

// The submit once the job's other sites answered (none when it runs here only): accepted
// everywhere, or stopped wherever it started.
ControlArgs DaemonImpl::FinishSubmit(const std::string& id, const RunConfig& cfg, const std::string& source, const PeerAnswers& answers) {
  std::vector<std::string> started;
  std::string refused;
  for (const PeerAnswer& a : answers) {
    if (a.status.ok()) started.push_back(a.site);
    else refused += (refused.empty() ? "" : "; ") + a.status.message();
  }
  Status st = refused.empty() ? AcceptJob(id, cfg, config.site) : Status::Error(refused);
  if (!st.ok()) {
    Log("submit of job " + id + " refused: " + st.message());
    if (!started.empty())
      InBackground("stopping job " + id + " where it started", [this, started, id] {
        return CallPeersAtOnce(started, "peer_stop", id, {}, 3000);
      }, [](const PeerAnswers&) {});
    return {{"error", "job " + id + " not started: " + st.message()}};
  }
  auto names = [](const std::vector<std::string>& sites) {
    std::string s;
    for (const auto& l : sites) s += (s.empty() ? "" : ",") + l;
    return s;
  };
  JobLog(id, "submitted (" + source + "), placement: syncer " + names(cfg.placement.syncer) + ", learners " +
                 names(cfg.placement.learners));
  UpdateSdStatus();
  return {{"ok", "1"}, {"job", id}, {"run_dir", store->RunDir(id)}};
}

DaemonImpl::MaybeReply DaemonImpl::Stop(const std::string& id, const ReplyTo& to) {
  if (!store->Exists(id)) return UnknownJob(id);
  if (Status st = StopLocal(id); !st.ok()) return ControlArgs{{"error", st.message()}};
  const std::vector<std::string> remote = OtherSites(id);
  if (remote.empty()) return ControlArgs{{"ok", "1"}};
  return Defer(
      to, [this, id, remote] { return CallPeersAtOnce(remote, "peer_stop", id, {}, 3000); },
      [](const PeerAnswers& answers) -> ControlArgs {
        std::string errors;
        for (const PeerAnswer& a : answers)
          if (!a.status.ok()) errors += a.status.message() + "; ";
        if (!errors.empty()) return {{"ok", "1"}, {"warning", "some sites did not answer: " + errors}};
        return {{"ok", "1"}};
      });
}

DaemonImpl::MaybeReply DaemonImpl::Logs(const std::string& id, int tail, const ReplyTo& to) {
  if (!store->Exists(id)) return UnknownJob(id);
  const std::vector<std::string> remote = OtherSites(id);
  // Every site's share of one reply (kMaxTextBytes).
  const size_t share = std::min<size_t>(16 << 10, (kMaxTextBytes - 4096) / (remote.size() + 1));
  const std::string text = Tail(store->LogPath(id), tail, share);
  if (remote.empty()) return ControlArgs{{"ok", "1"}, {"text", text}};
  const ControlArgs args = {{"tail", std::to_string(tail)}, {"bytes", std::to_string(share)}};
  return Defer(
      to, [this, id, remote, args] { return CallPeersAtOnce(remote, "peer_logs", id, args, 2000); },
      [text, share](const PeerAnswers& answers) -> ControlArgs {
        std::string all = text;
        for (const PeerAnswer& a : answers) {
          auto it = a.reply.find("text");
          std::string part = !a.status.ok() ? "(" + a.status.message() + ")\n" : it == a.reply.end() ? "" : it->second;
          if (part.size() > share) part = part.substr(part.size() - share);  // an older peer's longer answer
          all += part;
        }
        return {{"ok", "1"}, {"text", all}};
      });
}

// ring_set / ring_get (ring_store.h) from a host of this site, on host 0.
ControlArgs DaemonImpl::RingRequest(const std::string& job, const std::string& name, const ControlArgs& a) {
  const auto get = [&](const char* k) { auto it = a.find(k); return it == a.end() ? std::string() : it->second; };
  if (config.host != 0 || config.site_hosts.size() < 2)
    return {{"error", "site " + SiteAndHost() + " is not host 0 of a site of several hosts: it serves no ring store"}};
  auto jit = jobs.find(job);
  const int learner = std::atoi(get("learner").c_str());
  bool running = jit != jobs.end();
  if (running && !get("learner").empty()) {
    const Job& j = jit->second;
    const std::string lname = LearnerName(learner);
    running = j.roles.count(lname) || j.rejoining.count(lname) || j.killed.count(lname) ||
              std::any_of(j.dying.begin(), j.dying.end(), [&](const auto& r) { return r->name() == lname; });
  }
  if (!running) return {{"ok", "1"}, {"ended", "1"}};
  if (name == "ring_set") {
    std::vector<char> value;
    if (!HexDecode(get("value"), &value)) return {{"error", "ring_set: value is not hex"}};
    if (Status st = ring_store.Set(job, get("ring"), get("key"), std::string(value.begin(), value.end())); !st.ok())
      return {{"error", st.message()}};
    return {{"ok", "1"}};
  }
  std::string value;
  if (!ring_store.Get(job, get("ring"), get("key"), &value)) return {{"ok", "1"}, {"missing", "1"}};
  return {{"ok", "1"}, {"value", HexEncode(std::vector<char>(value.begin(), value.end()))}};
}

}  // namespace diloco
