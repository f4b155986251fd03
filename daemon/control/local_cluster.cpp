#include "daemon/control/local_cluster.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "daemon/control/client.h"
#include "daemon/net/curve.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct SitePorts {
  int control = 0, uplink = 0, downlink = 0, snapshot = 0;
};

std::string Tcp(int port) { return "tcp://127.0.0.1:" + std::to_string(port); }

}  // namespace

namespace {

// Binds 127.0.0.1:port (0: any) and returns the port bound, or 0 when it is taken.
int TryBindLoopback(int port, std::string* why) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    *why = std::string("socket: ") + std::strerror(errno);
    return 0;
  }
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons((uint16_t)port);
  socklen_t len = sizeof addr;
  int bound = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    bound = ntohs(addr.sin_port);
  } else {
    *why = std::strerror(errno);
  }
  ::close(fd);
  return bound;
}

}  // namespace

Status FreeTcpPort(int* port) {
  static std::mt19937 rng{std::random_device{}()};
  std::uniform_int_distribution<int> below_ephemeral(20000, 32000);
  std::string why;
  for (int attempt = 0; attempt < 200; attempt++) {
    if ((*port = TryBindLoopback(below_ephemeral(rng), &why)) != 0) return Status::Ok();
  }
  if ((*port = TryBindLoopback(0, &why)) != 0) return Status::Ok();
  return Status::Error("cannot find a free port on 127.0.0.1: " + why);
}

std::string TailFile(const std::string& path, int lines) {
  std::ifstream f(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(f, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > (size_t)lines ? all.size() - lines : 0; i < all.size(); i++) out += all[i] + "\n";
  return out;
}

Status LocalCluster::Create(const LocalClusterOptions& options, std::unique_ptr<LocalCluster>* out) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  c->options_ = options;
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec) return Status::Error("cannot create " + options.dir + ": " + ec.message());
  c->dir_ = fs::absolute(options.dir).lexically_normal().string();
  if (!fs::exists(options.dilocod_path)) {
    return Status::Error("no dilocod binary at " + options.dilocod_path + " (build the dilocod target)");
  }
  std::map<std::string, SitePorts> ports;
  std::map<std::string, net::CurveKeyPair> keys;
  std::vector<int> taken;
  for (const std::string& site : options.sites) {
    SitePorts& p = ports[site];
    for (int* port : {&p.control, &p.uplink, &p.downlink, &p.snapshot}) {
      // Free ports are only free until someone binds them: avoid handing out one twice.
      do {
        DL_RETURN_IF_ERROR(FreeTcpPort(port));
      } while (std::find(taken.begin(), taken.end(), *port) != taken.end());
      taken.push_back(*port);
    }
    if (options.metrics) {
      int port = 0;
      do {
        DL_RETURN_IF_ERROR(FreeTcpPort(&port));
      } while (std::find(taken.begin(), taken.end(), port) != taken.end());
      taken.push_back(port);
      c->metrics_ports_[site] = port;
    }
    fs::create_directories(c->StateDir(site), ec);
    if (ec) return Status::Error("cannot create " + c->StateDir(site) + ": " + ec.message());
    if (options.curve) {
      net::CurveKeyPair kp;
      DL_RETURN_IF_ERROR(net::GenerateCurveKeyPair(&kp));
      DL_RETURN_IF_ERROR(net::WriteCurveKeyPair(c->SiteDir(site) + "/keys", kp, /*overwrite=*/true));
      keys[site] = kp;
    }
  }
  for (const std::string& site : options.sites) {
    const SitePorts& p = ports[site];
    std::ofstream f(c->ConfigPath(site), std::ios::trunc);
    f << "# Written by LocalCluster (dilococtl demo / tests): site " << site << " on loopback.\n"
      << "site: " << site << "\n"
      << "state_dir: state\n"
      << "listen: {control: " << Tcp(p.control) << ", uplink: " << Tcp(p.uplink) << ", downlink: "
      << Tcp(p.downlink) << ", snapshot: " << Tcp(p.snapshot) << "}\n"
      << "threads: " << options.threads_per_site << "\n";
    if (options.metrics) f << "metrics_port: " << c->metrics_ports_[site] << "\n";
    if (options.chaos) f << "chaos: true\n";
    // One cluster, one operator: every site may submit to every other.
    f << "submitters: [";
    for (size_t k = 0, n = 0; k < options.sites.size(); k++)
      if (options.sites[k] != site) f << (n++ ? ", " : "") << options.sites[k];
    f << "]\n";
    f << options.extra_config;
    f << "data_roots: [";
    for (size_t k = 0; k < options.data_roots.size(); k++) f << (k ? ", " : "") << "\"" << options.data_roots[k] << "\"";
    f << "]\n";
    if (options.curve) {
      f << "keys: keys\n";
    } else {
      f << "allow_plaintext: true\n";
    }
    f << "peers:\n";
    for (const std::string& other : options.sites) {
      if (other == site) continue;
      const SitePorts& q = ports[other];
      f << "  - {site: " << other << ", control: " << Tcp(q.control) << ", uplink: " << Tcp(q.uplink)
        << ", downlink: " << Tcp(q.downlink) << ", snapshot: " << Tcp(q.snapshot);
      if (options.curve) f << ", public_key: \"" << keys[other].public_z85 << "\"";
      f << "}\n";
    }
    if (!f) return Status::Error("cannot write " + c->ConfigPath(site));
  }
  *out = std::move(c);
  return Status::Ok();
}

LocalCluster::~LocalCluster() { (void)StopAll(5000); }

pid_t LocalCluster::pid(const std::string& site) const {
  auto it = pids_.find(site);
  return it == pids_.end() ? -1 : it->second;
}

int LocalCluster::MetricsPort(const std::string& site) const {
  auto it = metrics_ports_.find(site);
  return it == metrics_ports_.end() ? 0 : it->second;
}

bool LocalCluster::Running(const std::string& site) {
  auto it = pids_.find(site);
  if (it == pids_.end()) return false;
  int status = 0;
  if (::waitpid(it->second, &status, WNOHANG) == it->second) {
    pids_.erase(it);
    return false;
  }
  return true;
}

Status LocalCluster::Start(const std::string& site, int ready_timeout_ms) {
  if (Running(site)) return Status::Error("dilocod of " + site + " is running already");
  const std::string config = ConfigPath(site), log = LogPath(site);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return Status::Error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // The child: its own process group (a terminal's Ctrl-C goes to the caller, which stops
    // the cluster in order), SIGTERM when the caller dies, stderr and stdout into the log.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      ::close(fd);
    }
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::unsetenv("NOTIFY_SOCKET");
    ::execl(options_.dilocod_path.c_str(), options_.dilocod_path.c_str(), "--config", config.c_str(),
            (char*)nullptr);
    std::fprintf(stderr, "exec %s: %s\n", options_.dilocod_path.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  pids_[site] = pid;
  const auto deadline = Clock::now() + std::chrono::milliseconds(ready_timeout_ms);
  for (;;) {
    if (!Running(site)) {
      return Status::Error("dilocod of " + site + " exited during startup; the end of " + log + ":\n" +
                           TailFile(log, 10));
    }
    ControlArgs reply;
    if (std::filesystem::exists(SocketPath(site)) && CallDaemon(SocketPath(site), "ping", kNoJob, {}, &reply, 500).ok())
      return Status::Ok();
    if (Clock::now() > deadline) {
      Kill(site, SIGKILL);
      return Status::Error("dilocod of " + site + " did not answer within " + std::to_string(ready_timeout_ms) +
                           " ms; the end of " + log + ":\n" + TailFile(log, 10));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Status LocalCluster::StartAll(int ready_timeout_ms) {
  for (const std::string& site : options_.sites) DL_RETURN_IF_ERROR(Start(site, ready_timeout_ms));
  return Status::Ok();
}

void LocalCluster::Kill(const std::string& site, int sig) {
  auto it = pids_.find(site);
  if (it == pids_.end()) return;
  ::kill(it->second, sig);
  int status = 0;
  ::waitpid(it->second, &status, 0);
  pids_.erase(it);
}

Status LocalCluster::Stop(const std::string& site, int timeout_ms, int* exit_code) {
  auto it = pids_.find(site);
  if (it == pids_.end()) return Status::Ok();
  const pid_t pid = it->second;
  ::kill(pid, SIGTERM);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      pids_.erase(site);
      return Status::Error("dilocod of " + site + " did not exit within " + std::to_string(timeout_ms) +
                           " ms of SIGTERM (killed)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  pids_.erase(site);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  if (exit_code) *exit_code = code;
  if (code != 0) return Status::Error("dilocod of " + site + " exited with " + std::to_string(code));
  return Status::Ok();
}

Status LocalCluster::StopAll(int timeout_ms) {
  // Signal every daemon first, so they all stop at once, then reap them.
  for (const auto& [site, pid] : pids_) ::kill(pid, SIGTERM);
  Status first;
  std::vector<std::string> sites;
  for (const auto& [site, pid] : pids_) sites.push_back(site);
  for (const std::string& site : sites) {
    Status st = Stop(site, timeout_ms);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

}  // namespace diloco
