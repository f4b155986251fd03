#include "apps/dilococtl/job_commands.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "daemon/config/run_config.h"
#include "daemon/control/client.h"
#include "daemon/control/site_chaos.h"
#include "daemon/net/envelope.h"
#include "daemon/report/job_report.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;

// Prints "dilococtl <cmd>: <message>" and returns the exit code for the failure: 2 when the
// daemon said the request itself was wrong (bad config, unknown job), else 1.
int Fail(const char* cmd, const Status& st, const ControlArgs& reply = {}) {
  std::fprintf(stderr, "dilococtl %s: %s\n", cmd, st.message().c_str());
  return reply.count("usage") ? 2 : 1;
}

bool Socket(const char* cmd, const DaemonRef& d, std::string* path) {
  Status st = ResolveControlSocket(d.config, d.socket, path);
  if (!st.ok()) std::fprintf(stderr, "dilococtl %s: %s\n", cmd, st.message().c_str());
  return st.ok();
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string Bar(double fraction, int width) {
  fraction = std::clamp(fraction, 0.0, 1.0);
  const int full = (int)(fraction * width + 0.5);
  std::string bar = "[";  // appended piece by piece: GCC 12 warns (-Wrestrict) on the + chain
  bar.append(full, '#').append(width - full, '.').push_back(']');
  return bar;
}

std::string Pad(std::string s, size_t width) {
  if (s.size() < width) s += std::string(width - s.size(), ' ');
  return s;
}

std::string VersionsText(const nlohmann::json& v) {
  if (!v.is_array()) return "-";
  std::string s;
  for (const auto& x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x.get<uint64_t>());
  }
  return s.empty() ? "-" : s;
}

std::string AgeText(int64_t unix_ms) {
  if (unix_ms <= 0) return "never";
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch()).count();
  return Fixed(std::max<int64_t>(0, now - unix_ms) / 1000.0, 1) + " s ago";
}

}  // namespace

std::string RenderJobStatus(const nlohmann::json& s, bool color) {
  std::ostringstream out;
  const std::string state = s.value("state", "?");
  const char* on = !color ? "" : state == "failed" ? "\033[31m" : state == "completed" ? "\033[32m" : "\033[33m";
  const char* off = color ? "\033[0m" : "";
  out << "job " << s.value("id", "?") << "  " << on << state << off << "  syncer on " << s.value("syncer_site", "?")
      << "  run dir " << s.value("run_dir", "") << "\n";
  if (s.contains("error")) out << "  error: " << s["error"].get<std::string>() << "\n";
  const nlohmann::json syncer = s.value("syncer", nlohmann::json::object());
  const nlohmann::json sp = syncer.value("progress", nlohmann::json::object());
  const nlohmann::json versions = sp.contains("versions") ? sp["versions"]
                                  : syncer.contains("result") ? syncer["result"].value("versions", nlohmann::json())
                                                              : nlohmann::json();
  out << "syncer   " << Pad(syncer.value("state", "unknown"), 10) << " versions " << VersionsText(versions);
  if (!sp.empty()) {
    out << "  merges " << Num(sp, "merges", 0) << "  dropped " << Num(sp, "dropped_deltas", 0) << "  rejected "
        << Num(sp, "rejected_deltas", 0) << "  snapshots " << Num(sp, "snapshots_served", 0);
  } else if (syncer.contains("result")) {
    out << "  merges " << Num(syncer["result"], "merges", 0) << "  final val loss "
        << Fixed(Num(syncer["result"], "final_val_loss", 0.0), 4) << " (" << Num(syncer["result"], "final_val_batches", 0)
        << " batches)";
  }
  out << "\n";
  // Each syncer shard (sync.syncers > 1) on its site; the line above joins them.
  for (const auto& sh : s.value("shards", nlohmann::json::array())) {
    const nlohmann::json shp = sh.contains("progress") ? sh["progress"] : sh.value("result", nlohmann::json::object());
    out << "  shard " << Num(sh, "shard", 0) << " on " << Pad(sh.value("site", "?"), 10) << " " << Pad(sh.value("state", "?"), 10)
        << " merges " << Num(shp, "merges", 0) << "\n";
  }
  if (sp.contains("last_merge")) {
    const nlohmann::json& m = sp["last_merge"];
    out << "         last merge: fragment " << Num(m, "fragment", 0) << " -> v" << Num(m, "version", 0) << " ("
        << m.value("reason", "?") << ", " << Num(m, "contributors", 0) << " deltas) " << AgeText(Num(m, "time_ms", int64_t{0}));
    if (sp.contains("merge_reasons")) {
      out << "; rounds closed by:";
      for (const auto& [reason, n] : sp["merge_reasons"].items()) out << " " << reason << " " << n.get<int>();
    }
    out << "\n";
  }
  // Goodput as the syncer's site sees it (live while running, the final figure once done).
  const nlohmann::json g = sp.contains("goodput") ? sp["goodput"]
                           : syncer.contains("result") ? syncer["result"].value("goodput", nlohmann::json())
                                                       : nlohmann::json();
  if (g.is_object()) {
    out << "         goodput " << Fixed(Num(g, "goodput", 0.0), 3) << "  uptime " << Fixed(Num(g, "uptime", 0.0), 3)
        << "  waste:";
    for (const char* cause : {"down", "dropped", "idle"})
      out << " " << cause << " " << Fixed(Num(g.value("waste", nlohmann::json::object()), cause, 0.0), 3);
    out << "\n";
  }
  out << "learner  site         device     state       progress                       step   tok/s    loss  sent/folded  "
         "staleness\n";
  const long steps = Num(s, "steps", 0L);
  for (const auto& l : s.value("learners", nlohmann::json::array())) {
    const nlohmann::json p = l.value("progress", nlohmann::json::object());
    const nlohmann::json r = l.value("result", nlohmann::json::object());
    std::string st = l.value("state", "?");
    if (!p.empty() && st == "running") st = p.value("state", st);
    const long step = !p.empty() ? Num(p, "step", 0L) : Num(r, "steps", 0L);
    // The learner's local ring: its first device and how many ranks ("cuda:0 x4").
    std::string device = p.value("device", std::string("-"));
    device = device.substr(0, device.find(' '));
    if (Num(p, "ranks", 1) > 1) device += " x" + std::to_string(Num(p, "ranks", 1));
    out << Pad(std::to_string(Num(l, "learner", 0)), 9) << Pad(l.value("site", "?"), 13) << Pad(device, 11) << Pad(st, 12)
        << Bar(steps > 0 ? (double)step / steps : 0, 28) << " " << Pad(std::to_string(step), 7);
    if (!p.empty()) {
      // Staleness: how many versions the learner's base is behind the syncer's, worst fragment.
      long stale = 0;
      const nlohmann::json base = p.value("base_versions", nlohmann::json::array());
      if (versions.is_array()) {
        for (size_t f = 0; f < base.size() && f < versions.size(); f++)
          stale = std::max(stale, (long)versions[f].get<uint64_t>() - (long)base[f].get<uint64_t>());
      }
      const int sent = Num(p, "last_fragment_sent", -1), folded = Num(p, "last_fragment_folded", -1);
      out << Pad(Fixed(Num(p, "tokens_per_s", 0.0), 0), 8) << Pad(Fixed(Num(p, "loss", 0.0), 3), 7) << "  "
          << Pad((sent < 0 ? "-" : std::to_string(sent)) + "/" + (folded < 0 ? "-" : std::to_string(folded)), 13)
          << stale;
    } else if (!r.empty()) {
      out << Pad("-", 8) << Pad(Fixed(Num(r, "final_train_loss", 0.0), 3), 7);
    }
    if (l.contains("error")) out << "  " << l["error"].get<std::string>();
    out << "\n";
  }
  return out.str();
}

int RunSubmitCommand(const SubmitCommand& cmd) {
  std::string socket;
  if (!Socket("submit", cmd.daemon, &socket)) return 2;
  // Validate here first: the same checks the daemon makes, with file:line in the message.
  RunConfig cfg;
  if (Status st = LoadRunConfig(cmd.config_path, cmd.overrides, &cfg); !st.ok()) return Fail("submit", st, {{"usage", "1"}});
  std::ifstream f(cmd.config_path, std::ios::binary);
  std::stringstream text;
  text << f.rdbuf();
  std::string overrides;
  for (const std::string& o : cmd.overrides) overrides += o + "\n";
  if (text.str().size() > kMaxTextBytes || overrides.size() > kMaxTextBytes)
    return Fail("submit", Status::Error(cmd.config_path + ": " + std::to_string(text.str().size()) +
                                        " bytes; a run config travels to the daemons in one control message, at most " +
                                        std::to_string(kMaxTextBytes) + " bytes: trim it"),
                {{"usage", "1"}});
  const std::string base_dir = fs::absolute(cmd.config_path).parent_path().string();
  ControlArgs reply;
  Status st = CallDaemon(socket, "submit", kNoJob,
                         {{"config_yaml", text.str()}, {"source", cmd.config_path}, {"base_dir", base_dir},
                          {"overrides", overrides}},
                         &reply, 30000);
  if (!st.ok()) return Fail("submit", st, reply);
  if (cmd.json) {
    std::printf("%s\n", nlohmann::json({{"job", reply["job"]}, {"run_dir", reply["run_dir"]}}).dump().c_str());
  } else {
    std::printf("%s\n", reply["job"].c_str());
    std::fprintf(stderr, "submitted job %s; watch it with `dilococtl status %s --watch`\n", reply["job"].c_str(),
                 reply["job"].c_str());
  }
  return 0;
}

int RunListCommand(const ListCommand& cmd) {
  std::string socket;
  if (!Socket("list", cmd.daemon, &socket)) return 2;
  // Page by page: one reply holds as many jobs as fit in a control message.
  nlohmann::json jobs = nlohmann::json::array();
  for (std::string offset = "0"; !offset.empty();) {
    ControlArgs reply;
    if (Status st = CallDaemon(socket, "list", kNoJob, {{"offset", offset}}, &reply); !st.ok()) return Fail("list", st, reply);
    const nlohmann::json page = nlohmann::json::parse(reply["json"], nullptr, false);
    if (!page.is_array()) return Fail("list", Status::Error("the daemon's list reply is not a JSON list"));
    for (const auto& j : page) jobs.push_back(j);
    const std::string next = reply.count("next") ? reply["next"] : "";
    if (!next.empty() && std::atol(next.c_str()) <= std::atol(offset.c_str()))
      return Fail("list", Status::Error("the daemon's list pages do not advance"));
    offset = next;
  }
  if (cmd.json) {
    std::printf("%s\n", jobs.dump().c_str());
    return 0;
  }
  std::printf("%-22s %-10s %-9s %-22s %s\n", "JOB", "STATE", "SYNCER", "ROLES HERE", "SUBMITTED TO");
  for (const auto& j : jobs) {
    std::string roles;
    const nlohmann::json here = j.value("roles", nlohmann::json::object());
    for (const auto& [name, r] : here.items()) roles += (roles.empty() ? "" : ",") + name;
    const nlohmann::json placement = j.value("placement", nlohmann::json::object());
    // One site, or one per syncer shard.
    std::string syncer = "-";
    if (placement.contains("syncer") && placement["syncer"].is_string()) syncer = placement["syncer"];
    if (placement.contains("syncer") && placement["syncer"].is_array()) {
      syncer.clear();
      for (const auto& site : placement["syncer"]) syncer += (syncer.empty() ? "" : ",") + site.get<std::string>();
    }
    std::printf("%-22s %-10s %-9s %-22s %s\n", j.value("id", "?").c_str(), j.value("state", "?").c_str(),
                syncer.c_str(), roles.empty() ? "-" : roles.c_str(),
                j.value("submitted_to", "?").c_str());
  }
  return 0;
}

int RunStatusCommand(const StatusCommand& cmd) {
  if (cmd.job.empty()) return RunListCommand({cmd.daemon, cmd.json});
  std::string socket;
  if (!Socket("status", cmd.daemon, &socket)) return 2;
  const bool tty = isatty(STDOUT_FILENO);
  for (;;) {
    nlohmann::json status;
    ControlArgs reply;
    Status st = CallDaemon(socket, "status", cmd.job, {}, &reply);
    if (st.ok()) {
      status = nlohmann::json::parse(reply["json"], nullptr, false);
      if (status.is_discarded()) st = Status::Error("the daemon's status reply is not JSON");
    }
    if (!st.ok()) return Fail("status", st, reply);
    if (cmd.json) {
      std::printf("%s\n", status.dump().c_str());
    } else {
      if (cmd.watch && tty) std::printf("\033[H\033[2J");
      std::printf("%s", RenderJobStatus(status, tty).c_str());
    }
    std::fflush(stdout);
    const std::string state = status.value("state", "");
    const bool final = state == "completed" || state == "failed" || state == "stopped";
    if (cmd.watch && final && !cmd.no_report) {
      const std::string path = cmd.report.empty() ? DefaultJobReportPath(cmd.job) : cmd.report;
      if (Status rs = WriteJobReport(status, path); rs.ok()) {
        std::fprintf(stderr, "report of job %s: %s\n", cmd.job.c_str(), path.c_str());
      } else {
        std::fprintf(stderr, "dilococtl status: no report of job %s: %s\n", cmd.job.c_str(), rs.message().c_str());
      }
    }
    if (!cmd.watch || final) return state == "failed" && cmd.watch ? 1 : 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(cmd.interval_ms));
  }
}

int RunStopCommand(const StopCommand& cmd) {
  std::string socket;
  if (!Socket("stop", cmd.daemon, &socket)) return 2;
  ControlArgs reply;
  if (Status st = CallDaemon(socket, "stop", cmd.job, {}, &reply, 20000); !st.ok()) return Fail("stop", st, reply);
  if (reply.count("warning")) std::fprintf(stderr, "dilococtl stop: %s\n", reply["warning"].c_str());
  std::fprintf(stderr, "stopping job %s (its roles send their pending work and save their state)\n", cmd.job.c_str());
  return 0;
}

int RunLogsCommand(const LogsCommand& cmd) {
  std::string socket;
  if (!Socket("logs", cmd.daemon, &socket)) return 2;
  ControlArgs reply;
  if (Status st = CallDaemon(socket, "logs", cmd.job, {{"tail", std::to_string(cmd.tail)}}, &reply); !st.ok())
    return Fail("logs", st, reply);
  if (cmd.json) {
    std::printf("%s\n", nlohmann::json({{"job", cmd.job}, {"text", reply["text"]}}).dump().c_str());
  } else {
    std::printf("%s", reply["text"].c_str());
  }
  return 0;
}

}  // namespace diloco

namespace diloco {

int RunChaosCommand(const ChaosCommand& cmd) {
  std::string socket;
  if (!Socket("chaos", cmd.daemon, &socket)) return 2;
  SiteChaosCommand c;
  ControlArgs args = {{"action", cmd.action}, {"site", cmd.site}};
  c.site = cmd.site;
  c.learner = cmd.learner;
  c.syncer = cmd.syncer;
  c.process = cmd.process;
  c.value = cmd.action == "slow" ? cmd.factor : cmd.prob;
  c.duration_s = cmd.duration_s;
  c.restart_after_s = cmd.restart_after_s;
  for (const auto& [k, v] : SiteChaosArgs(c))
    if (k != "action") args[k] = v;
  // The same checks the daemon makes, before anything is sent.
  if (Status st = ParseSiteChaos(args, &c); !st.ok()) return Fail("chaos", st, {{"usage", "1"}});
  ControlArgs reply;
  if (Status st = CallDaemon(socket, "chaos", cmd.job, args, &reply, 10000); !st.ok()) return Fail("chaos", st, reply);
  std::fprintf(stderr, "job %s: %s\n", cmd.job.c_str(), reply["done"].c_str());
  return 0;
}

}  // namespace diloco
