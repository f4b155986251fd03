// dilocod: one per site, in the foreground (systemd supervises it). Wiring only:
// flags -> daemon config -> Daemon::Create -> Run. Exit codes: 0 ok, 1 failed, 2 usage/config.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "daemon/config/daemon_config.h"
#include "daemon/control/daemon.h"
#include "daemon/util/ring_interface.h"

int main(int argc, char** argv) {
  using namespace diloco;
  CLI::App app{"dilocod: the DiLoCo site daemon (runs the learner and syncer roles jobs place on this site)"};
  std::string config_path;
  bool check_only = false;
  app.add_option("--config", config_path, "Daemon config (YAML), e.g. /etc/dilocod/dilocod.yaml")->required();
  app.add_flag("--check-config", check_only, "Validate the config and exit (0: valid)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  DaemonConfig config;
  if (Status st = LoadDaemonConfig(config_path, &config); !st.ok()) {
    std::fprintf(stderr, "dilocod: %s\n", st.message().c_str());
    return 2;
  }
  if (check_only) {
    std::printf("%s: valid (site %s, state_dir %s, %zu peers)\n", config_path.c_str(), config.site.c_str(),
                config.state_dir.c_str(), config.peers.size());
    return 0;
  }
  if (!config.site_hosts.empty()) {
    // Before any thread: setenv. GPU rings across this site's hosts stay on its ring network.
    std::string said;
    if (Status st = PinNcclToRingInterface(config.site_hosts[config.host].ring_address, &said); !st.ok()) {
      std::fprintf(stderr, "dilocod: %s: site_hosts.%d: %s\n", config_path.c_str(), config.host, st.message().c_str());
      return 2;
    }
    std::fprintf(stderr, "dilocod[%s]: %s\n", config.site.c_str(), said.c_str());
  }
  Daemon::InstallSignalHandlers();
  std::unique_ptr<Daemon> daemon;
  if (Status st = Daemon::Create(config, &daemon); !st.ok()) {
    std::fprintf(stderr, "dilocod[%s]: %s\n", config.site.c_str(), st.message().c_str());
    return 1;
  }
  if (Status st = daemon->Run(); !st.ok()) {
    std::fprintf(stderr, "dilocod[%s]: %s\n", config.site.c_str(), st.message().c_str());
    return 1;
  }
  return 0;
}
