// Daemon: Create (lock, keys, context, store, sockets), the loop (Run) and the way out; the
// handlers are in the files daemon_impl.h lists.
#include "daemon/control/daemon.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <vector>

#include "daemon/control/daemon_impl.h"
#include "daemon/control/site_metrics.h"
#include "daemon/net/wire_transport.h"
#include "daemon/util/log.h"
#include "daemon/util/sd_notify.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;
using Clock = DaemonClock;

std::atomic<bool> g_shutdown{false};

void OnSignal(int) { g_shutdown = true; }

// A site's view of a job (LocalView) as a peer sent it: only the shapes the readers below rely on
// (objects where they index, strings where they read text). Anything else is refused whole.
bool IsJobView(const nlohmann::json& v) {
  if (!v.is_object()) return false;
  for (const char* key : {"state", "error", "run_dir", "site", "store_error"})
    if (v.contains(key) && !v[key].is_string()) return false;
  if (!v.contains("roles")) return true;
  if (!v["roles"].is_object()) return false;
  for (const auto& [name, role] : v["roles"].items()) {
    if (!role.is_object()) return false;
    for (const char* key : {"progress", "result"})
      if (role.contains(key) && !role[key].is_object() && !role[key].is_null()) return false;
    for (const char* key : {"state", "error"})
      if (role.contains(key) && !role[key].is_string()) return false;
  }
  return true;
}

}  // namespace

void DaemonImpl::Log(const std::string& line) const { LogToStderr(LogWho("dilocod", SiteAndHost()), line); }

void DaemonImpl::JobLog(const std::string& id, const std::string& line) const {
  Log("job " + id + ": " + line);
  store->AppendLog(id, "[" + SiteAndHost() + "] " + line);
}

// "site1", or "site1 host 1" on a site of several hosts.
std::string DaemonImpl::SiteAndHost() const {
  return config.site_hosts.size() > 1 ? config.site + " host " + std::to_string(config.host) : config.site;
}

Status Daemon::Create(const DaemonConfig& config, std::unique_ptr<Daemon>* out) {
  std::unique_ptr<Daemon> d(new Daemon());
  d->impl_ = std::make_unique<DaemonImpl>();
  DaemonImpl& im = *d->impl_;
  im.config = config;
  std::error_code ec;
  fs::create_directories(config.state_dir, ec);
  if (ec) return Status::Error("cannot create state_dir '" + config.state_dir + "': " + ec.message());
  DL_RETURN_IF_ERROR(LockFile::Acquire((fs::path(config.state_dir) / "dilocod.lock").string(), &im.lock));
  if (!config.keys_dir.empty()) {
    net::CurveKeyPair keys;
    DL_RETURN_IF_ERROR(net::LoadCurveKeyPair(config.keys_dir, &keys).WithContext(config.source + ": keys"));
    im.keys = keys;
  }
  for (const PeerConfig& p : config.peers) {
    if (!p.public_key.empty())
      DL_RETURN_IF_ERROR(net::ValidateZ85Key(p.public_key, ("public key of peer " + p.site).c_str()).WithContext(config.source));
  }
  for (size_t h = 0; h < config.site_hosts.size(); h++) {
    const std::string& key = config.site_hosts[h].public_key;
    if (key.empty()) continue;
    DL_RETURN_IF_ERROR(net::ValidateZ85Key(key, ("public key of site host " + std::to_string(h)).c_str()).WithContext(config.source));
    if ((int)h == config.host && im.keys && key != im.keys->public_z85)
      return Status::Error(config.source + ": site_hosts." + std::to_string(h) + ".public_key is not this daemon's key (" +
                           config.keys_dir + "/key.public), yet host: " + std::to_string(config.host) +
                           " says this is that host; fix host or the key");
  }
  net::NetContextOptions context_options;
  context_options.io_threads = config.net_io_threads > 0 ? config.net_io_threads : net::DefaultIoThreads();
  DL_RETURN_IF_ERROR(net::NetContext::Create(context_options, &im.context).WithContext(config.source + ": net.io_threads"));
  if (im.keys) {
    std::vector<std::string> allow = {im.keys->public_z85};  // this site's own learners
    for (const PeerConfig& p : config.peers)
      if (!p.public_key.empty()) allow.push_back(p.public_key);
    for (const SiteHost& h : config.site_hosts)
      if (!h.public_key.empty() && h.public_key != im.keys->public_z85) allow.push_back(h.public_key);
    DL_RETURN_IF_ERROR(im.context->SetAllowlist("dilocod", allow));
  }
  im.store = std::make_unique<JobStore>(config.state_dir);
  im.off_loop = std::make_unique<OffLoop>(DaemonImpl::kOffLoopWorkers, DaemonImpl::kMaxOffLoop);
  DaemonImpl* impl = &im;
  im.peer_views = std::make_unique<PeerViews>(
      [impl](const std::string& site, const std::string& job, nlohmann::json* view) {
        ControlArgs reply;
        DL_RETURN_IF_ERROR(impl->CallPeer(site, "peer_status", job, {}, &reply, 1500));
        *view = nlohmann::json::parse(reply["json"], nullptr, false);
        if (!IsJobView(*view)) return Status::Error("site " + site + "'s status reply was not a job view");
        return Status::Ok();
      },
      PeerViews::Options{});

  // The local control socket (a stale file from a crash is ours to remove: we hold the lock). Not
  // ZeroMQ: its ipc:// bounds a frame, not a message, and holds an unfinished multipart message
  // where nothing can bound it; this one caps a whole request (2 MiB) from its length prefix and
  // what each connection holds (net/local_socket.h).
  fs::remove(config.control_socket, ec);
  fs::create_directories(fs::path(config.control_socket).parent_path(), ec);
  net::LocalServerOptions lo;
  lo.name = "control.local";
  lo.limits.max_message_bytes = uint64_t{2} << 20;
  lo.max_connections = 32;  // x 2 MiB: the most that requests can hold at once (the idlest goes)
  lo.validator = net::EnvelopeValidator(ControlParseOptions(), im.local_parsed);
  DL_RETURN_IF_ERROR(net::LocalServer::Create(config.control_socket, lo, &im.local).WithContext("control_socket"));
  // Owner and group only, whatever the umask (the group is how operators grant the CLI).
  fs::permissions(config.control_socket, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::group_write,
                  fs::perm_options::replace, ec);
  if (ec) return Status::Error("cannot set the mode of control_socket '" + config.control_socket + "': " + ec.message());
  if (!config.listen.control.empty()) {
    net::ReceiveOptions pr;
    pr.track_sequence = false;
    pr.validator = net::EnvelopeValidator(ControlParseOptions(), im.peer_parsed);
    net::SocketOptions po;
    po.name = "control.peers";
    po.allow_plaintext = config.allow_plaintext;
    po.max_frame_bytes = int64_t{2} << 20;
    if (im.keys) po.curve = net::CurveOptions{im.keys->public_z85, im.keys->secret_z85, true, "dilocod", ""};
    DL_RETURN_IF_ERROR(net::RouterChannel::Create(*im.context, po, pr, &im.peers));
    DL_RETURN_IF_ERROR(im.peers->Bind(config.listen.control).WithContext("listen.control"));
  }
  if (config.metrics_port > 0) {
    DL_RETURN_IF_ERROR(DeclareSiteMetrics(&im.metrics));
    MetricsServerOptions mo;
    mo.port = config.metrics_port;
    DL_RETURN_IF_ERROR(MetricsServer::Start(mo, &im.metrics, &im.metrics_server).WithContext(config.source + ": metrics_port"));
    im.Log("metrics on " + im.metrics_server->url());
  }
  im.Log("listening on " + config.control_socket +
         (config.listen.control.empty() ? "" : " and " + config.listen.control) + (im.keys ? " (CURVE)" : " (plaintext)") +
         ", " + std::to_string(context_options.io_threads) + " ZeroMQ I/O threads");
  im.ResumeJobs();
  *out = std::move(d);
  return Status::Ok();
}

Daemon::~Daemon() = default;

void Daemon::Shutdown() { g_shutdown = true; }

void Daemon::InstallSignalHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

Status Daemon::Run() {
  DaemonImpl& im = *impl_;
  (void)SdNotify("READY=1");
  im.UpdateSdStatus();
  std::vector<net::Socket*> sockets;
  if (im.peers) sockets.push_back(&im.peers->socket());
  std::vector<net::PollFd> local_fds;
  std::vector<bool> ready;
  net::Received r;
  net::LocalReceived lr;
  while (!g_shutdown) {
    im.Guarded("reaping ended roles", [&] { im.Reap(); });
    im.Guarded("chaos", [&] { im.ChaosTick(); });
    im.Guarded("rejoining learners", [&] { im.RejoinTick(); });
    im.off_loop->Drain();  // answers and follow-ups of work done off the loop (each guarded)
    im.Guarded("goodput", [&] {
      for (auto& [id, job] : im.jobs)
        for (auto& [name, role] : job.roles) role->Observe();
    });
    im.Guarded("checking the learners", [&] { im.CheckLearnersEnded(); });
    im.Guarded("writing job summaries", [&] { im.WriteDueSummaries(); });
    im.Guarded("metrics", [&] { im.UpdateMetrics(); });
    // Short polls while work off the loop may finish: its answers go out promptly.
    local_fds.clear();
    im.local->AddPollFds(&local_fds);
    const bool any = net::PollReadable(sockets, local_fds, im.off_loop->in_flight() > 0 ? 5 : 100, &ready);
    im.local->Service(local_fds);  // also when nothing came: its timeouts
    while (im.local->Receive(&lr)) {  // at most one request per connection
      const ParsedMessage& m = *im.local_parsed;
      const DaemonImpl::ReplyTo to = DaemonImpl::ReplyToOf(*im.local, lr, m);
      if (const ControlMsg* c = m.get<ControlMsg>()) {
        const ControlArgs args = ArgsOf(*c);
        const std::string job = m.header.job_id;
        std::optional<ControlArgs> reply = im.GuardedReply(c->name, [&] { return im.HandleLocal(c->name, job, args, to); });
        if (reply) im.Reply(to, *reply);
      } else {
        im.Reply(to, {{"error", "the local socket takes control commands; submit a job with `dilococtl submit`"}});
      }
      im.KillProcessIfAsked();
    }
    im.KillProcessIfAsked();  // also when the job's chaos timeline asked
    if (!any) continue;
    if (!ready.empty() && ready[0] && im.peers->Receive(&r, 0) == net::RecvResult::kMessage) {
      const ParsedMessage& m = *im.peer_parsed;
      std::string sender = m.header.sender;
      // With CURVE the key says who it is; the envelope's sender must agree.
      if (im.keys) {
        const PeerConfig* p = im.config.FindPeer(sender);
        const bool site_host = sender == im.config.site && im.config.SiteHostOfKey(r.peer_key) >= 0;
        if (!site_host && (!p || p->public_key != r.peer_key)) {
          im.Log("refused a control request claiming to be '" + sender + "' from key " + r.peer_key);
          im.Reply(DaemonImpl::ReplyToOf(*im.peers, r, m), {{"error", "sender '" + sender + "' does not match its key"}});
          continue;
        }
      }
      const DaemonImpl::ReplyTo to = DaemonImpl::ReplyToOf(*im.peers, r, m);
      im.Reply(to, im.GuardedReply(to.name, [&] { return im.HandlePeer(sender, m); }));
      im.KillProcessIfAsked();
    }
  }
  // Shutting down: the jobs stay "running" on disk, so a restart resumes them.
  (void)SdNotify("STOPPING=1");
  im.Log("stopping: roles save their state");
  for (auto& [id, job] : im.jobs)
    for (auto& [name, role] : job.roles) role->RequestShutdown();
  // Give the roles a moment to end by themselves (learners stop after their current step; a
  // syncer whose uplink is quiet leaves); then blocking socket calls return at once.
  auto all_done = [&] {
    for (auto& [id, job] : im.jobs)
      for (auto& [name, role] : job.roles)
        if (!role->done()) return false;
    return true;
  };
  const auto grace = Clock::now() + std::chrono::milliseconds(1500);
  while (!all_done() && Clock::now() < grace) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  im.context->zmq().shutdown();
  const auto deadline = Clock::now() + std::chrono::seconds(7);
  for (auto& [id, job] : im.jobs) {
    for (auto& [name, role] : job.roles) {
      while (!role->done() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (!role->done()) {
        im.Log("job " + id + ": " + name + " did not stop within 8 s; exiting anyway");
        std::fflush(stderr);
        _exit(0);
      }
      role->Join();
    }
  }
  im.jobs.clear();
  im.metrics_server.reset();
  im.local.reset();
  im.peers.reset();
  im.Log("stopped");
  return Status::Ok();
}

}  // namespace diloco
