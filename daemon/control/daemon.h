// dilocod: one per site (DESIGN.md §2). Members in dependency order: the lock on the state
// directory, the CURVE keys, the ZeroMQ context (with the ZAP allowlist of the peers' keys), the
// job store, the control sockets, the roles of running jobs.
//
//   Create   locks <state_dir>/dilocod.lock (a second daemon on the same state dir refuses),
//            loads keys, binds <control_socket> (local CLI, AF_UNIX) and listen.control (peers,
//            CURVE), resumes the roles of jobs that were running (learners join from the
//            syncer's snapshot at their recorded step; the syncer restores its checkpoint).
//   Run      serves control requests and watches the roles until SIGTERM/SIGINT (or Shutdown):
//            sd_notify READY=1 once the sockets are bound, STATUS=<jobs> on change, STOPPING=1;
//            on the way out every role saves what a restart needs (within ~10 s).
// The job protocol is in control_protocol.h; what is on disk in job_store.h.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "daemon/config/daemon_config.h"
#include "daemon/util/status.h"

namespace diloco {

struct DaemonImpl;  // daemon_impl.h

class Daemon {
 public:
  static Status Create(const DaemonConfig& config, std::unique_ptr<Daemon>* out);
  ~Daemon();

  Status Run();
  // Ends Run (thread-safe and async-signal-safe: only sets a flag).
  static void Shutdown();
  // SIGTERM and SIGINT call Shutdown.
  static void InstallSignalHandlers();

 private:
  Daemon() = default;
  std::unique_ptr<DaemonImpl> impl_;
};

}  // namespace diloco
