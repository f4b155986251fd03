// A cluster of dilocod processes on this machine, on loopback with free ports: what
// `dilococtl demo` runs and what the e2e tests start. Each site gets <dir>/<site>/ with
//   dilocod.yaml   its daemon config (every other site is a peer, with its public key)
//   keys/          its CURVE key pair (generated on the fly; none with curve = false)
//   state/         its state_dir (jobs, lock file, control.sock)
//   dilocod.log    the daemon's stderr (appended across restarts)
// Daemons are children of this process (they get SIGTERM if it dies).
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/util/status.h"

namespace diloco {

struct LocalClusterOptions {
  std::string dir;                 // created if missing; sites live in <dir>/<site>
  std::vector<std::string> sites;  // e.g. {"site-s", "site-a", "site-b"}
  std::string dilocod_path;        // the dilocod binary
  bool curve = true;               // false: allow_plaintext and no keys
  int threads_per_site = 1;        // daemon config `threads`
  bool metrics = false;            // give each site a free metrics_port (MetricsPort)
  bool chaos = false;              // chaos: true in every site's config (control/site_chaos.h)
  // Every site's data_roots (existing directories); the sites submit to each other.
  std::vector<std::string> data_roots = {"/usr/share/games"};
  std::string extra_config;  // YAML lines appended to every site's config
};

class LocalCluster {
 public:
  // Writes keys and configs (no process starts yet).
  static Status Create(const LocalClusterOptions& options, std::unique_ptr<LocalCluster>* out);
  ~LocalCluster();  // stops every daemon still running (SIGTERM, then SIGKILL)

  // Starts the site's dilocod and waits until it answers on its control socket.
  Status Start(const std::string& site, int ready_timeout_ms = 20000);
  Status StartAll(int ready_timeout_ms = 20000);
  // Sends sig (e.g. SIGKILL) and reaps the process.
  void Kill(const std::string& site, int sig);
  // SIGTERM, then waits up to timeout_ms (SIGKILL after it); the exit status in *exit_code
  // (-signal when killed). Error when it did not exit in time or exited with a failure.
  Status Stop(const std::string& site, int timeout_ms = 15000, int* exit_code = nullptr);
  Status StopAll(int timeout_ms = 15000);
  bool Running(const std::string& site);

  std::string SiteDir(const std::string& site) const { return dir_ + "/" + site; }
  std::string ConfigPath(const std::string& site) const { return SiteDir(site) + "/dilocod.yaml"; }
  std::string SocketPath(const std::string& site) const { return SiteDir(site) + "/state/control.sock"; }
  std::string StateDir(const std::string& site) const { return SiteDir(site) + "/state"; }
  std::string LogPath(const std::string& site) const { return SiteDir(site) + "/dilocod.log"; }
  pid_t pid(const std::string& site) const;
  int MetricsPort(const std::string& site) const;  // 0 without options.metrics
  const std::vector<std::string>& sites() const { return options_.sites; }

 private:
  LocalCluster() = default;
  LocalClusterOptions options_;
  std::string dir_;
  std::map<std::string, pid_t> pids_;
  std::map<std::string, int> metrics_ports_;
};

// A TCP port on 127.0.0.1 that was free a moment ago (bound, then closed). Picked at random below
// Linux's ephemeral range (32768-60999): a port the kernel hands out for port 0 is also what it
// hands the next outgoing connection, and a test saw another process take one in between.
Status FreeTcpPort(int* port);

// The last `lines` lines of a text file ("" when unreadable).
std::string TailFile(const std::string& path, int lines);

}  // namespace diloco
