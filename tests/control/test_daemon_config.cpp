// The daemon config (daemon/config/daemon_config.h): what it accepts, its defaults, and that
// each mistake is refused with file:line and the key.
#include <catch2/catch.hpp>
#include <string>

#include "daemon/config/daemon_config.h"
#include "tests/temp_dir.h"

namespace diloco {
namespace {

const char* const kKey = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";

Status Parse(const std::string& text, DaemonConfig* c) { return ParseDaemonConfig(text, "d.yaml", "/etc/dilocod", c); }

std::string ErrorOf(const std::string& text) {
  DaemonConfig c;
  Status st = Parse(text, &c);
  INFO(text);
  REQUIRE_FALSE(st.ok());
  return st.message();
}

}  // namespace

TEST_CASE("a full daemon config parses, relative paths against the file's directory", "[unit]") {
  DaemonConfig c;
  const std::string text = std::string(
                               "site: site-a\n"
                               "state_dir: state\n"
                               "listen: {control: tcp://0.0.0.0:7100, uplink: tcp://0.0.0.0:7101, downlink: "
                               "tcp://0.0.0.0:7102, snapshot: tcp://0.0.0.0:7103}\n"
                               "keys: keys\n"
                               "threads: 2\n"
                               "metrics_port: 9100\n"
                               "peers:\n"
                               "  - {site: site-s, control: tcp://10.0.0.2:7100, uplink: tcp://10.0.0.2:7101, "
                               "downlink: tcp://10.0.0.2:7102, snapshot: tcp://10.0.0.2:7103, public_key: \"") +
                           kKey + "\"}\n";
  REQUIRE(Parse(text, &c).ok());
  CHECK(c.site == "site-a");
  CHECK(c.state_dir == "/etc/dilocod/state");
  CHECK(c.control_socket == "/etc/dilocod/state/control.sock");
  CHECK(c.keys_dir == "/etc/dilocod/keys");
  CHECK(c.threads == 2);
  CHECK(c.metrics_port == 9100);
  CHECK_FALSE(c.allow_plaintext);
  REQUIRE(c.peers.size() == 1);
  CHECK(c.FindPeer("site-s") != nullptr);
  CHECK(c.FindPeer("site-s")->public_key == kKey);
  CHECK(c.FindPeer("site-s")->endpoints.uplink == "tcp://10.0.0.2:7101");
  CHECK(c.FindPeer("site-x") == nullptr);
  CHECK(ConnectableEndpoint(c.listen.uplink) == "tcp://127.0.0.1:7101");
  CHECK(ConnectableEndpoint("tcp://10.0.0.2:7101") == "tcp://10.0.0.2:7101");
}

TEST_CASE("daemon config mistakes are refused with file:line and the key", "[unit]") {
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\nstate_dri: x\n"),
             Catch::Contains("d.yaml:4:1") && Catch::Contains("unknown key 'state_dri'") &&
                 Catch::Contains("did you mean 'state_dir'"));
  CHECK_THAT(ErrorOf("state_dir: s\nallow_plaintext: true\n"), Catch::Contains("site: is required"));
  CHECK_THAT(ErrorOf("site: 'a b'\nstate_dir: s\nallow_plaintext: true\n"), Catch::Contains("not a site name"));
  CHECK_THAT(ErrorOf("site: a\nallow_plaintext: true\n"), Catch::Contains("state_dir: is required"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\n"), Catch::Contains("keys: is required") && Catch::Contains("keygen"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: yes\n"), Catch::Contains("expected true or false"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\nthreads: -1\n"), Catch::Contains("threads"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\nlisten: {control: http://x:1}\n"),
             Catch::Contains("d.yaml:4:") && Catch::Contains("not a tcp endpoint"));
  // Peers: a key for each (unless plaintext), no duplicates, not the site itself, control needed.
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nkeys: k\nlisten: {control: tcp://*:1}\npeers:\n  - {site: b, control: "
                     "tcp://h:1}\n"),
             Catch::Contains("d.yaml:6:") && Catch::Contains("public_key"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nkeys: k\nlisten: {control: tcp://*:1}\npeers:\n  - {site: b, control: "
                     "tcp://h:1, public_key: short}\n"),
             Catch::Contains("40-character"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\nlisten: {control: tcp://*:1}\npeers:\n"
                     "  - {site: a, control: tcp://h:1}\n"),
             Catch::Contains("this site itself"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\nlisten: {control: tcp://*:1}\npeers:\n"
                     "  - {site: b, control: tcp://h:1}\n  - {site: b, control: tcp://h:2}\n"),
             Catch::Contains("listed twice"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\nlisten: {control: tcp://*:1}\npeers:\n"
                     "  - {site: b}\n"),
             Catch::Contains("peers.0.control: is required"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\npeers:\n  - {site: b, control: tcp://h:1}\n"),
             Catch::Contains("listen.control: is required"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\npeers: {site: b}\n"),
             Catch::Contains("expected a list of peers"));
  CHECK_THAT(ErrorOf("site: [a\n"), Catch::Contains("d.yaml:") && Catch::Contains("invalid YAML"));
  // Authority and limits (issue 14).
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\nsubmitters: [z]\n"),
             Catch::Contains("submitters: 'z' is not among the peers"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\nsubmitters: z\n"), Catch::Contains("expected a list"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\ndata_roots: [[x]]\n"),
             Catch::Contains("expected text items"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\nmax_jobs: 0\n"), Catch::Contains("max_jobs: must be >= 1"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\nmax_job_spec_bytes: 1000000\n"),
             Catch::Contains("[1024, 65536]"));
}

TEST_CASE("submitters, data_roots and the limits: defaults refuse peers' jobs and every corpus", "[unit]") {
  DaemonConfig c;
  REQUIRE(ParseDaemonConfig("site: a\nstate_dir: s\nallow_plaintext: true\n", "d.yaml", "/etc/dl", &c).ok());
  CHECK(c.submitters.empty());
  CHECK(c.data_roots.empty());
  CHECK(c.max_jobs == 16);
  CHECK(c.max_job_spec_bytes == 65536);
  REQUIRE(ParseDaemonConfig("site: a\nstate_dir: s\nallow_plaintext: true\nlisten: {control: tcp://*:1}\n"
                            "peers: [{site: b, control: tcp://h:1}]\nsubmitters: [b]\ndata_roots: [corpora, /srv/x/../y]\n"
                            "max_jobs: 3\n",
                            "d.yaml", "/etc/dl", &c)
              .ok());
  CHECK(c.submitters == std::vector<std::string>{"b"});
  CHECK(c.data_roots == std::vector<std::string>{"/etc/dl/corpora", "/srv/y"});  // against the file's directory
  CHECK(c.max_jobs == 3);
}

TEST_CASE("net.io_threads sets the daemon's ZeroMQ I/O threads: 0 or absent is the default", "[unit]") {
  DaemonConfig c;
  REQUIRE(Parse("site: a\nstate_dir: s\nallow_plaintext: true\n", &c).ok());
  CHECK(c.net_io_threads == 0);
  REQUIRE(Parse("site: a\nstate_dir: s\nallow_plaintext: true\nnet: {io_threads: 4}\n", &c).ok());
  CHECK(c.net_io_threads == 4);
  REQUIRE(Parse("site: a\nstate_dir: s\nallow_plaintext: true\nnet:\n  io_threads: 0\n", &c).ok());
  CHECK(c.net_io_threads == 0);

  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\nnet:\n  io_threads: -1\n"),
             Catch::Contains("d.yaml:5:15") && Catch::Contains("net.io_threads: -1 is out of range") &&
                 Catch::Contains("[0, 64]"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\nnet: {io_threads: 65}\n"),
             Catch::Contains("d.yaml:4:") && Catch::Contains("net.io_threads: 65 is out of range"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\nnet: {io_threads: many}\n"),
             Catch::Contains("d.yaml:4:") && Catch::Contains("net.io_threads: expected an integer"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\nnet: {io_thread: 2}\n"),
             Catch::Contains("unknown key 'net.io_thread'") && Catch::Contains("did you mean 'io_threads'"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\nnet: 4\n"),
             Catch::Contains("net: expected a mapping of keys (io_threads)"));
}

TEST_CASE("the example WAN site configs parse", "[unit]") {
  for (const char* site : {"site-a", "site-b", "site-c", "site-s"}) {
    const std::string path = std::string(DILOCO_SOURCE_DIR) + "/configs/wan-example/" + site + ".yaml";
    DaemonConfig c;
    const Status st = LoadDaemonConfig(path, &c);
    INFO(st.message());
    CHECK(st.ok());
    if (std::string(site) == "site-s") CHECK(c.net_io_threads == 4);  // the syncer's site
  }
}

TEST_CASE("a peer's public key can come from a file", "[unit]") {
  testing::TempDir dir;
  dir.Write("peer.public", std::string(kKey) + "\n");
  const std::string path = dir.Write("d.yaml",
                                     "site: a\nstate_dir: s\nkeys: k\nlisten: {control: tcp://*:1}\n"
                                     "peers:\n  - {site: b, control: tcp://h:1, public_key_file: peer.public}\n");
  DaemonConfig c;
  REQUIRE(LoadDaemonConfig(path, &c).ok());
  CHECK(c.peers.at(0).public_key == kKey);
  CHECK(c.source == path);

  dir.Write("d2.yaml", "site: a\nstate_dir: s\nkeys: k\nlisten: {control: tcp://*:1}\n"
                       "peers:\n  - {site: b, control: tcp://h:1, public_key_file: missing.public}\n");
  Status st = LoadDaemonConfig(dir.file("d2.yaml"), &c);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("missing.public") && Catch::Contains("d2.yaml:6:"));
  CHECK_THAT(LoadDaemonConfig(dir.file("nope.yaml"), &c).message(), Catch::Contains("cannot read daemon config"));
}

}  // namespace diloco

namespace diloco {

TEST_CASE("devices: cpu by default, or a list of GPUs", "[unit]") {
  const std::string head = "site: a\nstate_dir: s\nallow_plaintext: true\n";  // devices on line 4
  DaemonConfig c;
  REQUIRE(Parse(head, &c).ok());
  CHECK(c.devices.gpus.empty());
  CHECK(c.devices.ToString() == "cpu");
  REQUIRE(Parse(head + "devices: cpu\n", &c).ok());
  CHECK(c.devices == SiteDevices{});
  REQUIRE(Parse(head + "devices: {cuda: [0, 1, 2, 3]}\n", &c).message() == "");
  CHECK(c.devices.gpus == std::vector<int>{0, 1, 2, 3});
  CHECK(c.devices.ToString() == "cuda [0, 1, 2, 3]");
  REQUIRE(Parse(head + "devices:\n  cuda:\n    - 2\n    - 5\n", &c).message() == "");
  CHECK(c.devices.gpus == std::vector<int>{2, 5});

  CHECK_THAT(ErrorOf(head + "devices: gpu\n"),
             Catch::StartsWith("d.yaml:4:10: devices: expected cpu or {cuda: [...]}, got 'gpu'"));
  CHECK_THAT(ErrorOf(head + "devices: [0, 1]\n"),
             Catch::StartsWith("d.yaml:4:10: devices: expected cpu or {cuda: [...]}, got a sequence"));
  CHECK_THAT(ErrorOf(head + "devices: {cuda: []}\n"),
             Catch::StartsWith("d.yaml:4:17: devices.cuda: expected a non-empty list of GPU indices"));
  CHECK_THAT(ErrorOf(head + "devices: {cuda: 0}\n"), Catch::StartsWith("d.yaml:4:17: devices.cuda: expected a"));
  CHECK_THAT(ErrorOf(head + "devices: {cuda: [0, x]}\n"),
             Catch::StartsWith("d.yaml:4:21: devices.cuda.1: expected a GPU index (0, 1, ...), got 'x'"));
  CHECK_THAT(ErrorOf(head + "devices: {cuda: [-1]}\n"), Catch::StartsWith("d.yaml:4:18: devices.cuda.0:"));
  CHECK_THAT(ErrorOf(head + "devices: {cuda: [1, 1]}\n"),
             Catch::StartsWith("d.yaml:4:21: devices.cuda.1: GPU 1 is listed twice"));
  CHECK_THAT(ErrorOf(head + "devices: {gpu: [0]}\n"),
             Catch::StartsWith("d.yaml:4:11: unknown key 'devices.gpu'"));
}

TEST_CASE("CheckJobFitsSite refuses what a site cannot serve, naming the site and what it has", "[unit]") {
  const SiteDevices cpu;
  const SiteDevices gpus{{0, 1, 2, 3}};
  const SiteDevices upper{{2, 3}};
  // CPU jobs fit everywhere, with any number of ranks.
  CHECK(CheckJobFitsSite("a", cpu, "cpu", 1).ok());
  CHECK(CheckJobFitsSite("a", cpu, "cpu", 64).ok());
  CHECK(CheckJobFitsSite("g", gpus, "cpu", 8).ok());
  // GPU jobs need their GPUs listed.
  CHECK(CheckJobFitsSite("g", gpus, "cuda", 4).ok());
  CHECK(CheckJobFitsSite("g", gpus, "cuda:0", 1).ok());
  CHECK(CheckJobFitsSite("g", gpus, "cuda:2", 2).ok());
  CHECK(CheckJobFitsSite("g", gpus, "cuda:3", 1).ok());
  CHECK(CheckJobFitsSite("u", upper, "cuda:2", 2).ok());

  CHECK(CheckJobFitsSite("a", cpu, "cuda", 2).message() ==
        "site 'a' has devices cpu; the job asks for train.device cuda with 2 ranks: place this learner on a GPU "
        "site or set train.device: cpu");
  CHECK_THAT(CheckJobFitsSite("a", cpu, "cuda:1", 1).message(),
             Catch::StartsWith("site 'a' has devices cpu; the job asks for train.device cuda:1 with 1 rank:"));
  CHECK_THAT(CheckJobFitsSite("g", gpus, "cuda", 5).message(),
             Catch::StartsWith("site 'g' has devices cuda [0, 1, 2, 3]; the job asks for train.device cuda with 5 "
                               "ranks: GPU 4 (rank 4) is not listed"));
  CHECK_THAT(CheckJobFitsSite("g", gpus, "cuda:3", 2).message(), Catch::Contains("GPU 4 (rank 1) is not listed"));
  CHECK_THAT(CheckJobFitsSite("g", gpus, "cuda:7", 1).message(), Catch::Contains("GPU 7 (rank 0) is not listed"));
  CHECK_THAT(CheckJobFitsSite("u", upper, "cuda", 1).message(),
             Catch::StartsWith("site 'u' has devices cuda [2, 3]; the job asks for train.device cuda with 1 rank: "
                               "GPU 0 (rank 0) is not listed"));
  CHECK_THAT(CheckJobFitsSite("g", gpus, "gpu", 1).message(), Catch::Contains("'gpu' is not a device"));
  CHECK_THAT(CheckJobFitsSite("g", gpus, "cpu", 0).message(), Catch::Contains("train.ranks must be >= 1"));
}

}  // namespace diloco

namespace diloco {
namespace {

const char* const kKey2 = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID";

std::string TwoHosts(const std::string& extra, const std::string& key0 = kKey, const std::string& key1 = kKey2) {
  return "site: s1\nstate_dir: s\nkeys: k\nlisten: {control: tcp://0.0.0.0:7100}\n" + extra +
         "site_hosts:\n"
         "  - {control: tcp://10.1.0.1:7100, ring_address: 192.168.0.1, public_key: \"" + key0 + "\"}\n"
         "  - {control: tcp://10.1.0.2:7100, ring_address: 192.168.0.2, public_key: \"" + key1 + "\"}\n";
}

}  // namespace

TEST_CASE("a site of several hosts: host, site_hosts and ring_timeout_ms", "[unit]") {
  DaemonConfig c;
  REQUIRE(Parse(TwoHosts("host: 1\nring_timeout_ms: 5000\n"), &c).ok());
  CHECK(c.host == 1);
  CHECK(c.ring_timeout_ms == 5000);
  REQUIRE(c.site_hosts.size() == 2);
  CHECK(c.site_hosts[1].control == "tcp://10.1.0.2:7100");
  CHECK(c.site_hosts[1].ring_address == "192.168.0.2");
  CHECK(c.site_hosts[0].public_key == kKey);
  CHECK(c.SiteHostCount() == 2);
  CHECK(c.SiteHostOfKey(kKey2) == 1);
  CHECK(c.SiteHostOfKey("nobody") == -1);

  // Defaults: one host, host 0.
  DaemonConfig one;
  REQUIRE(Parse("site: a\nstate_dir: s\nallow_plaintext: true\n", &one).ok());
  CHECK(one.host == 0);
  CHECK(one.SiteHostCount() == 1);
  CHECK(one.ring_timeout_ms == 60000);

  // public_key_file.
  testing::TempDir dir;
  dir.Write("h1.public", std::string(kKey2) + "\n");
  DaemonConfig f;
  REQUIRE(ParseDaemonConfig("site: s1\nstate_dir: s\nkeys: k\nlisten: {control: tcp://0.0.0.0:7100}\nsite_hosts:\n"
                            "  - {control: tcp://10.1.0.1:7100, ring_address: 192.168.0.1, public_key: \"" +
                                std::string(kKey) + "\"}\n"
                                "  - {control: tcp://10.1.0.2:7100, ring_address: 192.168.0.2, public_key_file: h1.public}\n",
                            "d.yaml", dir.path().string(), &f)
              .ok());
  CHECK(f.site_hosts[1].public_key == kKey2);
}

TEST_CASE("site_hosts mistakes are refused with file:line, the key and what to do", "[unit]") {
  CHECK_THAT(ErrorOf(TwoHosts("host: 2\n")),
             Catch::Contains("d.yaml:5:7") && Catch::Contains("host: 2 is not a host of this site") &&
                 Catch::Contains("0 .. 1"));
  CHECK_THAT(ErrorOf("site: a\nstate_dir: s\nallow_plaintext: true\nhost: 1\n"),
             Catch::Contains("d.yaml:4:7") && Catch::Contains("without site_hosts the site has one host"));
  CHECK_THAT(ErrorOf(TwoHosts("", kKey, kKey)), Catch::Contains("site_hosts.1") && Catch::Contains("same public key"));
  CHECK_THAT(ErrorOf("site: s1\nstate_dir: s\nallow_plaintext: true\nlisten: {control: tcp://0.0.0.0:7100}\nsite_hosts:\n"
                     "  - {control: tcp://10.1.0.1:7100, ring_address: 192.168.0.1}\n"
                     "  - {control: tcp://10.1.0.1:7100, ring_address: 192.168.0.2}\n"),
             Catch::Contains("d.yaml:7") && Catch::Contains("site_hosts.1.control") && Catch::Contains("two hosts"));
  CHECK_THAT(ErrorOf("site: s1\nstate_dir: s\nallow_plaintext: true\nlisten: {control: tcp://0.0.0.0:7100}\nsite_hosts:\n"
                     "  - {control: tcp://10.1.0.1:7100, ring_address: 192.168.0.1}\n"
                     "  - {control: tcp://10.1.0.2:7100, ring_address: 192.168.0.1}\n"),
             Catch::Contains("site_hosts.1.ring_address") && Catch::Contains("two hosts"));
  CHECK_THAT(ErrorOf("site: s1\nstate_dir: s\nallow_plaintext: true\nlisten: {control: tcp://0.0.0.0:7100}\nsite_hosts:\n"
                     "  - {control: tcp://10.1.0.1:7100}\n"),
             Catch::Contains("site_hosts.0.ring_address: is required"));
  CHECK_THAT(ErrorOf("site: s1\nstate_dir: s\nallow_plaintext: true\nlisten: {control: tcp://0.0.0.0:7100}\nsite_hosts:\n"
                     "  - {control: 10.1.0.1:7100, ring_address: 192.168.0.1}\n"),
             Catch::Contains("site_hosts.0.control") && Catch::Contains("not a tcp endpoint"));
  CHECK_THAT(ErrorOf("site: s1\nstate_dir: s\nkeys: k\nlisten: {control: tcp://0.0.0.0:7100}\nsite_hosts:\n"
                     "  - {control: tcp://10.1.0.1:7100, ring_address: 192.168.0.1}\n"),
             Catch::Contains("site_hosts.0: public_key (or public_key_file) is required"));
  CHECK_THAT(ErrorOf("site: s1\nstate_dir: s\nallow_plaintext: true\nsite_hosts:\n"
                     "  - {control: tcp://10.1.0.1:7100, ring_address: 192.168.0.1}\n"
                     "  - {control: tcp://10.1.0.2:7100, ring_address: 192.168.0.2}\n"),
             Catch::Contains("listen.control: is required with site_hosts"));
  CHECK_THAT(ErrorOf(TwoHosts("ring_timeout_ms: 5\n")), Catch::Contains("ring_timeout_ms: 5 is out of range"));
  CHECK_THAT(ErrorOf(TwoHosts("", kKey, "short")), Catch::Contains("site_hosts.1.public_key: expected a 40-character"));
}

TEST_CASE("a job's train.hosts must fit its site's hosts", "[unit]") {
  CHECK(CheckJobFitsSiteHosts("s1", 2, 2, "d.yaml").ok());
  CHECK(CheckJobFitsSiteHosts("s1", 1, 1, "d.yaml").ok());
  const Status st = CheckJobFitsSiteHosts("s1", 1, 2, "d.yaml");
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("site 's1' has 1 host") && Catch::Contains("train.hosts 2") &&
                               Catch::Contains("site_hosts of d.yaml"));
}

}  // namespace diloco

namespace diloco {
namespace {

TEST_CASE("a site's second syncer shard listens 100 ports up; an endpoint without a port is refused", "[unit]") {
  const DaemonEndpoints listen{"tcp://10.0.0.2:7100", "tcp://10.0.0.2:7101", "tcp://10.0.0.2:7102", "tcp://10.0.0.2:7103"};
  DaemonEndpoints out;
  REQUIRE(ShardListen(listen, 0, &out).ok());
  CHECK(out == listen);
  REQUIRE(ShardListen(listen, 1, &out).ok());
  CHECK(out.uplink == "tcp://10.0.0.2:7201");
  CHECK(out.downlink == "tcp://10.0.0.2:7202");
  CHECK(out.snapshot == "tcp://10.0.0.2:7203");
  CHECK(out.control == listen.control);  // one control socket per daemon
  DaemonEndpoints no_port = listen;
  no_port.snapshot = "ipc:///run/dilocod.sock";
  const Status st = ShardListen(no_port, 1, &out);
  CHECK_THAT(st.message(), Catch::Contains("'ipc:///run/dilocod.sock' has no port a syncer shard can add 100 to"));
  DaemonEndpoints high = listen;
  high.uplink = "tcp://10.0.0.2:65500";
  CHECK_FALSE(ShardListen(high, 1, &out).ok());
}

}  // namespace
}  // namespace diloco
