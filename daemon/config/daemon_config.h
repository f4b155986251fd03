// The config of one dilocod (`dilocod --config /etc/dilocod/dilocod.yaml`): who this site is,
// where it keeps its state, where it listens and who its peers are.
//
//   site: site-a                       # this site's name, as run configs' placement uses it
//   state_dir: /var/lib/dilocod        # jobs/<id>/ (job.yaml, state.json, run/), the lock file
//   control_socket: /run/dilocod/control.sock   # the local CLI (AF_UNIX); default <state_dir>/control.sock
//   listen:                            # tcp endpoints this daemon binds
//     control: tcp://0.0.0.0:7100      # daemon <-> daemon (job forwarding, status), CURVE
//     uplink: tcp://0.0.0.0:7101       # the next three only matter when this site hosts a syncer:
//     downlink: tcp://0.0.0.0:7102     #   learners' deltas in, globals out, snapshots
//     snapshot: tcp://0.0.0.0:7103
//   peers:                             # the other sites, as this site reaches them
//     - {site: site-s, control: tcp://10.0.0.2:7100, uplink: tcp://10.0.0.2:7101,
//        downlink: tcp://10.0.0.2:7102, snapshot: tcp://10.0.0.2:7103,
//        public_key: "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"}   # or public_key_file: PATH
//   keys: /etc/dilocod/keys            # key.public + key.secret (`dilococtl keygen --out DIR`)
//   host: 0                            # this daemon's index in site_hosts (default 0)
//   site_hosts:                        # a site of several hosts, each with its own dilocod and the
//                                      #   same site: name, in order; omit for a one-host site.
//     - {control: tcp://10.1.0.1:7100, ring_address: 192.168.0.1, public_key: "..."}  # or public_key_file
//     - {control: tcp://10.1.0.2:7100, ring_address: 192.168.0.2, public_key_file: host1.public}
//                                      # Host 0 runs the syncer's and the other sites' side of the
//                                      #   site (peers reach it), rank 0 of each learner's ring and
//                                      #   the ring's rendezvous store (control requests ring_set /
//                                      #   ring_get, CURVE, only from these hosts' keys). A job with
//                                      #   train.hosts H > 1 spans hosts 0 .. H-1: their dilocods
//                                      #   get it from host 0. ring_address: the private interface
//                                      #   address this host's Gloo ring binds on, and whose
//                                      #   interface dilocod pins NCCL to (NCCL_SOCKET_IFNAME);
//                                      #   the rings' tensors travel unauthenticated and
//                                      #   unencrypted: keep it on a private network, firewalled.
//   ring_timeout_ms: 60000             # a ring across hosts: a collective (or the rendezvous)
//                                      #   waiting longer on a stalled host fails the learner's
//                                      #   incarnation (a dead host fails it at once)
//   allow_plaintext: false             # true: no CURVE on loopback/ipc (development only)
//   threads: 0                         # compute threads for this site's roles; 0 = all cores
//   net:
//     io_threads: 0                    # ZeroMQ I/O threads of the daemon's context, 1 .. 64; 0 =
//                                      #   min(4, cores). Each connection is served by one, so a
//                                      #   syncer decrypts N learners' CURVE deltas at once with N
//                                      #   (one moves 0.2-0.9 GB/s of CURVE)
//   metrics_port: 0                    # Prometheus text on 127.0.0.1:PORT/metrics; 0 = off
//   chaos: false                       # true: take chaos commands and jobs with a chaos: section
//                                      #   (control/site_chaos.h; test clusters only: they kill)
//   submitters: [site-a]               # peer sites that may create jobs on this site (forward a
//                                      #   submit); the local CLI always may. Default: none
//   data_roots: [/srv/corpora]         # every job's data.corpus must resolve (symlinks followed)
//                                      #   under one of these directories. Default: none, so every
//                                      #   job is refused until the operator lists them
//   max_jobs: 16                       # jobs with roles running here at once
//   max_job_spec_bytes: 65536          # the largest run config a submit may carry (<= 64 KiB)
//   metrics_keep_finished_s: 60        # a job's series leave /metrics this long after it ends here
//   devices: cpu                       # what this site's learners may compute on (default cpu):
//                                      #   devices: cpu                  CPU only
//                                      #   devices: {cuda: [0, 1, 2, 3]} these GPUs (CUDA indices)
//                                      #     and the CPU; a job's train.device cuda:N with R ranks
//                                      #     needs GPUs N .. N+R-1 all listed ("cuda" = cuda:0)
//
// Relative paths resolve against the config file's directory. Errors start with "file:line:col".
#pragma once

#include <string>
#include <vector>

#include "daemon/util/status.h"

namespace diloco {

struct DaemonEndpoints {
  std::string control;   // tcp://host:port
  std::string uplink;
  std::string downlink;
  std::string snapshot;
  bool operator==(const DaemonEndpoints&) const = default;
};

// The devices a site offers its jobs (the `devices` key).
struct SiteDevices {
  std::vector<int> gpus;  // CUDA device indices, distinct, in the order written; empty = CPU only
  bool operator==(const SiteDevices&) const = default;
  // "cpu" or "cuda [0, 1]", for messages and status.
  std::string ToString() const;
};

struct PeerConfig {
  std::string site;
  DaemonEndpoints endpoints;    // where this daemon connects to reach the peer
  std::string public_key;       // Z85 (40 characters); read from public_key_file when given
  bool operator==(const PeerConfig&) const = default;
};

// One host of a site of several (the `site_hosts` key).
struct SiteHost {
  std::string control;       // tcp://ADDR:PORT, this host's listen.control as its site's hosts reach it
  std::string ring_address;  // its Gloo ring binds here (NCCL on its interface); its site's hosts reach it here
  std::string public_key;    // Z85 (40 characters); from public_key_file when given
  bool operator==(const SiteHost&) const = default;
};

struct DaemonConfig {
  std::string site;
  int host = 0;                      // this daemon's index in site_hosts
  std::vector<SiteHost> site_hosts;  // empty: a site of one host
  int ring_timeout_ms = 60000;
  std::string state_dir;       // absolute
  std::string control_socket;  // absolute file path (an AF_UNIX stream socket, net/local_socket.h)
  DaemonEndpoints listen;
  std::vector<PeerConfig> peers;
  std::string keys_dir;        // absolute; empty only with allow_plaintext
  bool allow_plaintext = false;
  int threads = 0;
  int net_io_threads = 0;      // net.io_threads; 0 = net::DefaultIoThreads()
  int metrics_port = 0;
  SiteDevices devices;
  bool chaos = false;
  std::vector<std::string> submitters;  // peer sites that may create jobs here
  std::vector<std::string> data_roots;  // absolute directories; a corpus must resolve under one
  int max_jobs = 16;
  int max_job_spec_bytes = 64 * 1024;
  int metrics_keep_finished_s = 60;  // at most the wire's text limit (net/envelope.h kMaxTextBytes)
  std::string source;  // the file it came from, for messages
  bool operator==(const DaemonConfig&) const = default;

  // The peer named site, or nullptr.
  const PeerConfig* FindPeer(const std::string& site) const;
  // The hosts of this site: site_hosts.size(), or 1 without site_hosts.
  int SiteHostCount() const { return site_hosts.empty() ? 1 : (int)site_hosts.size(); }
  // The index in site_hosts of the host whose key is public_key, or -1.
  int SiteHostOfKey(const std::string& public_key) const;
};

Status LoadDaemonConfig(const std::string& path, DaemonConfig* out);
// From text; relative paths resolve against base_dir.
Status ParseDaemonConfig(const std::string& yaml_text, const std::string& source_name,
                         const std::string& base_dir, DaemonConfig* out);

// Whether site, which has devices, can run a learner with the run config's train.device and
// train.ranks: a CPU job fits every site, with any number of ranks; cuda:N with R ranks needs GPUs
// N .. N+R-1 listed in devices ("cuda" is cuda:0). The error names the site, what it has and what
// the job asks, e.g. "site 'a' has devices cpu; the job asks for train.device cuda with 2 ranks".
Status CheckJobFitsSite(const std::string& site, const SiteDevices& devices, const std::string& device, int ranks);

// Whether site (this daemon's, with site_hosts of site_hosts_count hosts) can run a learner
// whose ring spans train.hosts hosts. The error names the site, its host count and train.hosts.
Status CheckJobFitsSiteHosts(const std::string& site, int site_hosts_count, int train_hosts, const std::string& source);

// Where a client on this machine reaches an endpoint a daemon binds: a wildcard host
// (tcp://*:7101, tcp://0.0.0.0:7101) becomes 127.0.0.1.
std::string ConnectableEndpoint(const std::string& bound);

// A job's n-th syncer shard on a site binds the site's listen endpoints with each port +
// kShardPortStride × n (uplink, downlink and snapshot; n = 0: the endpoints themselves), so one
// daemon runs several shards and every peer knows where each listens (7101-7103, then 7201-7203).
// An endpoint without a port, or past 65535, is an error.
inline constexpr int kShardPortStride = 100;
Status ShardListen(const DaemonEndpoints& listen, int n, DaemonEndpoints* out);

}  // namespace diloco
