#include "daemon/config/daemon_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "daemon/config/run_config.h"
#include "daemon/config/site_name.h"
#include "daemon/config/yaml_helpers.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;
using config_internal::DidYouMean;
using config_internal::Describe;
using config_internal::Join;
using config_internal::ParseInt;
using config_internal::Where;
using config_internal::ResolvePath;

// Reads one mapping, refusing keys it does not know.
class Section {
 public:
  Section(const YAML::Node& node, std::string path, const std::string& source, std::vector<std::string> keys)
      // A missing section (an invalid node: yaml-cpp throws on most calls) reads as empty.
      : node_(node.IsDefined() ? node : YAML::Node(YAML::NodeType::Null)),
        path_(std::move(path)),
        source_(source),
        keys_(std::move(keys)) {}

  Status CheckKeys() const {
    if (node_.IsNull()) return Status::Ok();
    if (!node_.IsMap()) {
      return Status::Error(Where(source_, node_.Mark()) + ": " + (path_.empty() ? "the file" : path_) +
                           ": expected a mapping of keys (" + Join(keys_) + "), got " + Describe(node_));
    }
    std::set<std::string> seen;
    for (const auto& entry : node_) {
      const std::string name = entry.first.Scalar();
      const std::string full = path_.empty() ? name : path_ + "." + name;
      if (std::find(keys_.begin(), keys_.end(), name) == keys_.end()) {
        return Status::Error(Where(source_, entry.first.Mark()) + ": unknown key '" + full + "'; known keys" +
                             (path_.empty() ? "" : " in '" + path_ + "'") + ": " + Join(keys_) +
                             DidYouMean(name, keys_));
      }
      if (!seen.insert(name).second) {
        return Status::Error(Where(source_, entry.first.Mark()) + ": key '" + full + "' appears twice; keep one");
      }
    }
    return Status::Ok();
  }

  YAML::Node Get(const std::string& key) const {
    if (!node_.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& map = node_;  // const []: no insertion, an invalid node when missing
    return map[key];
  }
  std::string WhereOf(const std::string& key) const {
    const YAML::Node n = Get(key);
    return Where(source_, n.IsDefined() ? n.Mark() : node_.Mark());
  }
  const std::string& source() const { return source_; }
  std::string Full(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  Status String(const std::string& key, std::string* out) const {
    const YAML::Node n = Get(key);
    if (!n.IsDefined() || n.IsNull()) return Status::Ok();
    if (!n.IsScalar()) return Status::Error(WhereOf(key) + ": " + Full(key) + ": expected text, got " + Describe(n));
    *out = n.Scalar();
    return Status::Ok();
  }
  // A list of plain strings (absent: *out unchanged).
  Status Strings(const std::string& key, std::vector<std::string>* out) const {
    const YAML::Node n = Get(key);
    if (!n.IsDefined() || n.IsNull()) return Status::Ok();
    if (!n.IsSequence()) return Status::Error(WhereOf(key) + ": " + Full(key) + ": expected a list, got " + Describe(n));
    out->clear();
    for (const YAML::Node& item : n) {
      if (!item.IsScalar())
        return Status::Error(Where(source_, item.Mark()) + ": " + Full(key) + ": expected text items, got " + Describe(item));
      out->push_back(item.Scalar());
    }
    return Status::Ok();
  }
  Status Int(const std::string& key, int* out) const {
    const YAML::Node n = Get(key);
    if (!n.IsDefined() || n.IsNull()) return Status::Ok();
    const std::string text = n.IsScalar() ? n.Scalar() : "";
    if (!ParseInt(text, out)) {
      return Status::Error(WhereOf(key) + ": " + Full(key) + ": expected an integer, got " + Describe(n));
    }
    return Status::Ok();
  }
  Status Bool(const std::string& key, bool* out) const {
    const YAML::Node n = Get(key);
    if (!n.IsDefined() || n.IsNull()) return Status::Ok();
    const std::string text = n.IsScalar() ? n.Scalar() : "";
    if (text == "true") {
      *out = true;
    } else if (text == "false") {
      *out = false;
    } else {
      return Status::Error(WhereOf(key) + ": " + Full(key) + ": expected true or false, got " + Describe(n));
    }
    return Status::Ok();
  }

 private:
  YAML::Node node_;
  std::string path_;
  const std::string& source_;
  std::vector<std::string> keys_;
};

constexpr int kMaxIoThreads = 64;

const std::vector<std::string> kEndpointKeys = {"control", "uplink", "downlink", "snapshot"};

Status ReadEndpoints(const Section& s, DaemonEndpoints* out) {
  DL_RETURN_IF_ERROR(s.String("control", &out->control));
  DL_RETURN_IF_ERROR(s.String("uplink", &out->uplink));
  DL_RETURN_IF_ERROR(s.String("downlink", &out->downlink));
  DL_RETURN_IF_ERROR(s.String("snapshot", &out->snapshot));
  for (const std::string& key : kEndpointKeys) {
    std::string value;
    DL_RETURN_IF_ERROR(s.String(key, &value));
    if (!value.empty() && value.rfind("tcp://", 0) != 0) {
      return Status::Error(s.WhereOf(key) + ": " + s.Full(key) + ": '" + value +
                           "' is not a tcp endpoint; write tcp://HOST:PORT");
    }
  }
  return Status::Ok();
}

// devices: cpu | {cuda: [0, 1, ...]}
Status ReadDevices(const Section& top, SiteDevices* out) {
  const YAML::Node node = top.Get("devices");
  if (!node.IsDefined() || node.IsNull()) return Status::Ok();
  const std::string where = top.WhereOf("devices");
  const std::string forms = "write devices: cpu, or devices: {cuda: [0, 1]} listing the GPUs jobs may use";
  if (node.IsScalar() && node.Scalar() == "cpu") return Status::Ok();
  if (!node.IsMap()) {
    return Status::Error(where + ": devices: expected cpu or {cuda: [...]}, got " + Describe(node) + "; " + forms);
  }
  const Section devices(node, "devices", top.source(), {"cuda"});
  DL_RETURN_IF_ERROR(devices.CheckKeys());
  const YAML::Node list = devices.Get("cuda");
  const std::string list_where = devices.WhereOf("cuda");
  if (!list.IsDefined() || !list.IsSequence() || list.size() == 0) {
    return Status::Error(list_where + ": devices.cuda: expected a non-empty list of GPU indices, e.g. [0, 1], got " +
                         (list.IsDefined() ? Describe(list) : std::string("nothing")) + "; " + forms);
  }
  SiteDevices d;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string text = list[i].IsScalar() ? list[i].Scalar() : "";
    int gpu = -1;
    const std::string item_where = Where(top.source(), list[i].Mark());
    if (!ParseInt(text, &gpu) || gpu < 0) {
      return Status::Error(item_where + ": devices.cuda." + std::to_string(i) +
                           ": expected a GPU index (0, 1, ...), got " + Describe(list[i]));
    }
    if (std::find(d.gpus.begin(), d.gpus.end(), gpu) != d.gpus.end()) {
      return Status::Error(item_where + ": devices.cuda." + std::to_string(i) + ": GPU " + std::to_string(gpu) +
                           " is listed twice; list each GPU once");
    }
    d.gpus.push_back(gpu);
  }
  *out = std::move(d);
  return Status::Ok();
}

// A public_key or public_key_file of a mapping (peers.N, site_hosts.N): the key text, or "".
Status ReadPublicKey(const Section& s, const std::string& path, const std::string& base_dir, bool allow_plaintext,
                     const std::string& what, std::string* out) {
  std::string key, key_file;
  DL_RETURN_IF_ERROR(s.String("public_key", &key));
  DL_RETURN_IF_ERROR(s.String("public_key_file", &key_file));
  if (!key_file.empty()) {
    if (!key.empty())
      return Status::Error(s.WhereOf("public_key_file") + ": " + path + ": give public_key or public_key_file, not both");
    const std::string file = ResolvePath(key_file, base_dir);
    std::ifstream f(file);
    std::stringstream ss;
    ss << f.rdbuf();
    if (!f)
      return Status::Error(s.WhereOf("public_key_file") + ": " + path + ".public_key_file: cannot read '" + file +
                           "'; copy " + what + "'s key.public there");
    key = ss.str();
    while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
  }
  if (key.empty() && !allow_plaintext)
    return Status::Error(s.WhereOf("control") + ": " + path + ": public_key (or public_key_file) is required: " + what +
                         "'s key.public, so that CURVE can authenticate it");
  if (!key.empty() && key.size() != 40)
    return Status::Error(s.WhereOf(key_file.empty() ? "public_key" : "public_key_file") + ": " + path +
                         ".public_key: expected a 40-character Z85 key (" + what + "'s key.public), got " +
                         std::to_string(key.size()) + " characters");
  *out = key;
  return Status::Ok();
}

// site_hosts: [{control, ring_address, public_key | public_key_file}, ...], host, ring_timeout_ms.
Status ReadSiteHosts(const Section& top, const std::string& base_dir, DaemonConfig* c) {
  const YAML::Node found = top.Get("site_hosts");
  const YAML::Node list = found.IsDefined() ? found : YAML::Node(YAML::NodeType::Null);
  if (!list.IsNull() && !list.IsSequence())
    return Status::Error(top.WhereOf("site_hosts") + ": site_hosts: expected a list of this site's hosts ({control, "
                                                     "ring_address, public_key}), got " + Describe(list));
  std::set<std::string> controls, rings, keys;
  for (size_t i = 0; list.IsSequence() && i < list.size(); ++i) {
    const std::string path = "site_hosts." + std::to_string(i);
    const Section hs(list[i], path, top.source(), {"control", "ring_address", "public_key", "public_key_file"});
    DL_RETURN_IF_ERROR(hs.CheckKeys());
    if (!list[i].IsMap())
      return Status::Error(Where(top.source(), list[i].Mark()) + ": " + path +
                           ": expected {control: tcp://ADDR:PORT, ring_address: ADDR, public_key: ...}, got " +
                           Describe(list[i]));
    SiteHost h;
    DL_RETURN_IF_ERROR(hs.String("control", &h.control));
    DL_RETURN_IF_ERROR(hs.String("ring_address", &h.ring_address));
    if (h.control.rfind("tcp://", 0) != 0)
      return Status::Error(hs.WhereOf("control") + ": " + path + ".control: " +
                           (h.control.empty() ? std::string("is required") : "'" + h.control + "' is not a tcp endpoint") +
                           ": host " + std::to_string(i) + "'s listen.control as this site's hosts reach it, e.g. "
                           "tcp://10.1.0.2:7100");
    if (h.ring_address.empty() || h.ring_address.find_first_of(" /:") != std::string::npos)
      return Status::Error(hs.WhereOf("ring_address") + ": " + path + ".ring_address: " +
                           (h.ring_address.empty() ? std::string("is required") : "'" + h.ring_address + "' is not an address") +
                           ": the IP (or host name) of host " + std::to_string(i) +
                           " on the site's private network, where its Gloo ring binds, e.g. 192.168.0.2");
    DL_RETURN_IF_ERROR(ReadPublicKey(hs, path, base_dir, c->allow_plaintext, "host " + std::to_string(i), &h.public_key));
    if (!controls.insert(h.control).second)
      return Status::Error(hs.WhereOf("control") + ": " + path + ".control: '" + h.control +
                           "' is listed for two hosts; each host has its own control endpoint");
    if (!rings.insert(h.ring_address).second)
      return Status::Error(hs.WhereOf("ring_address") + ": " + path + ".ring_address: '" + h.ring_address +
                           "' is listed for two hosts; give each host its own address on the private network");
    if (!h.public_key.empty() && !keys.insert(h.public_key).second)
      return Status::Error(hs.WhereOf("public_key") + ": " + path +
                           ": the same public key as another host; each host has its own keys (dilococtl keygen)");
    for (const PeerConfig& p : c->peers)
      if (!h.public_key.empty() && p.public_key == h.public_key)
        return Status::Error(hs.WhereOf("public_key") + ": " + path + ": the key of peer site '" + p.site +
                             "'; a host of this site has its own keys");
    c->site_hosts.push_back(std::move(h));
  }
  const int hosts = c->SiteHostCount();
  if (c->host < 0 || c->host >= hosts)
    return Status::Error(top.WhereOf("host") + ": host: " + std::to_string(c->host) + " is not a host of this site: " +
                         (c->site_hosts.empty() ? std::string("without site_hosts the site has one host, 0; list the "
                                                              "site's hosts in site_hosts")
                                                : "site_hosts lists " + std::to_string(hosts) + " hosts, 0 .. " +
                                                      std::to_string(hosts - 1) + "; fix host or add the host to site_hosts"));
  if (c->site_hosts.size() > 1 && c->listen.control.empty())
    return Status::Error(top.WhereOf("listen") + ": listen.control: is required with site_hosts: the tcp endpoint "
                                                 "this site's hosts reach this daemon on, e.g. tcp://0.0.0.0:7100");
  if (c->host > 0 && !c->peers.empty())
    return Status::Error(top.WhereOf("peers") + ": peers: host " + std::to_string(c->host) +
                         " of a site talks only to its site's hosts; list peers on host 0 (the other sites reach "
                         "the site there)");
  if (c->ring_timeout_ms < 100 || c->ring_timeout_ms > 3600 * 1000)
    return Status::Error(top.WhereOf("ring_timeout_ms") + ": ring_timeout_ms: " + std::to_string(c->ring_timeout_ms) +
                         " is out of range; must be in [100, 3600000] ms (default 60000)");
  return Status::Ok();
}

}  // namespace

std::string SiteDevices::ToString() const {
  if (gpus.empty()) return "cpu";
  std::string out = "cuda [";
  for (size_t i = 0; i < gpus.size(); ++i) out += (i ? ", " : "") + std::to_string(gpus[i]);
  return out + "]";
}

Status CheckJobFitsSite(const std::string& site, const SiteDevices& devices, const std::string& device, int ranks) {
  const std::string asks = "site '" + site + "' has devices " + devices.ToString() +
                           "; the job asks for train.device " + device + " with " + std::to_string(ranks) +
                           (ranks == 1 ? " rank" : " ranks");
  DeviceSpec spec;
  if (Status st = ParseDevice(device, &spec); !st.ok()) return Status::Error(asks + ": train.device " + st.message());
  if (ranks < 1) return Status::Error(asks + ": train.ranks must be >= 1");
  if (!spec.cuda) return Status::Ok();  // every site has a CPU; its ranks are threads
  if (devices.gpus.empty()) {
    return Status::Error(asks + ": place this learner on a GPU site or set train.device: cpu");
  }
  for (int r = 0; r < ranks; ++r) {
    const int gpu = spec.first_gpu + r;
    if (std::find(devices.gpus.begin(), devices.gpus.end(), gpu) == devices.gpus.end()) {
      return Status::Error(asks + ": GPU " + std::to_string(gpu) + " (rank " + std::to_string(r) +
                           ") is not listed; lower train.ranks, pick a train.device cuda:N whose GPUs N .. N+ranks-1 "
                           "the site lists, or place the learner on another site");
    }
  }
  return Status::Ok();
}

int DaemonConfig::SiteHostOfKey(const std::string& public_key) const {
  for (size_t i = 0; i < site_hosts.size(); i++)
    if (site_hosts[i].public_key == public_key) return (int)i;
  return -1;
}

Status CheckJobFitsSiteHosts(const std::string& site, int site_hosts_count, int train_hosts, const std::string& source) {
  if (train_hosts <= site_hosts_count) return Status::Ok();
  return Status::Error("site '" + site + "' has " + std::to_string(site_hosts_count) +
                       (site_hosts_count == 1 ? " host" : " hosts") + "; the job asks for train.hosts " +
                       std::to_string(train_hosts) + ": lower train.hosts to " + std::to_string(site_hosts_count) +
                       " or fewer, place the learner on a site with more hosts, or list the site's hosts in "
                       "site_hosts of " + source);
}

const PeerConfig* DaemonConfig::FindPeer(const std::string& name) const {
  for (const PeerConfig& p : peers)
    if (p.site == name) return &p;
  return nullptr;
}

std::string ConnectableEndpoint(const std::string& bound) {
  for (const char* wildcard : {"tcp://*:", "tcp://0.0.0.0:"}) {
    const std::string w = wildcard;
    if (bound.rfind(w, 0) == 0) return "tcp://127.0.0.1:" + bound.substr(w.size());
  }
  return bound;
}

Status ShardListen(const DaemonEndpoints& listen, int n, DaemonEndpoints* out) {
  *out = listen;
  if (n == 0) return Status::Ok();
  for (std::string* e : {&out->uplink, &out->downlink, &out->snapshot}) {
    const size_t colon = e->rfind(':');
    const std::string port = colon == std::string::npos ? "" : e->substr(colon + 1);
    if (port.empty() || port.size() > 5 || !std::all_of(port.begin(), port.end(), ::isdigit) ||
        std::stoi(port) + kShardPortStride * n > 65535)
      return Status::Error("endpoint '" + *e + "' has no port a syncer shard can add " +
                           std::to_string(kShardPortStride * n) + " to");
    *e = e->substr(0, colon + 1) + std::to_string(std::stoi(port) + kShardPortStride * n);
  }
  return Status::Ok();
}

Status ParseDaemonConfig(const std::string& yaml_text, const std::string& source_name,
                         const std::string& base_dir, DaemonConfig* out) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return Status::Error(Where(source_name, e.mark) + ": invalid YAML: " + e.msg);
  }
  DaemonConfig c;
  c.source = source_name;
  const Section top(root, "", source_name,
                    {"site", "state_dir", "control_socket", "listen", "peers", "keys", "allow_plaintext", "threads",
                     "metrics_port", "devices", "chaos", "submitters", "data_roots", "max_jobs",
                     "max_job_spec_bytes", "metrics_keep_finished_s", "net", "host", "site_hosts",
                     "ring_timeout_ms"});
  DL_RETURN_IF_ERROR(top.CheckKeys());
  DL_RETURN_IF_ERROR(top.String("site", &c.site));
  DL_RETURN_IF_ERROR(top.String("state_dir", &c.state_dir));
  DL_RETURN_IF_ERROR(top.String("control_socket", &c.control_socket));
  DL_RETURN_IF_ERROR(top.String("keys", &c.keys_dir));
  DL_RETURN_IF_ERROR(top.Bool("allow_plaintext", &c.allow_plaintext));
  DL_RETURN_IF_ERROR(top.Int("threads", &c.threads));
  DL_RETURN_IF_ERROR(top.Int("metrics_port", &c.metrics_port));
  DL_RETURN_IF_ERROR(top.Bool("chaos", &c.chaos));
  DL_RETURN_IF_ERROR(top.Strings("submitters", &c.submitters));
  DL_RETURN_IF_ERROR(top.Strings("data_roots", &c.data_roots));
  DL_RETURN_IF_ERROR(top.Int("max_jobs", &c.max_jobs));
  DL_RETURN_IF_ERROR(top.Int("max_job_spec_bytes", &c.max_job_spec_bytes));
  DL_RETURN_IF_ERROR(top.Int("metrics_keep_finished_s", &c.metrics_keep_finished_s));
  DL_RETURN_IF_ERROR(top.Int("host", &c.host));
  DL_RETURN_IF_ERROR(top.Int("ring_timeout_ms", &c.ring_timeout_ms));
  if (c.metrics_keep_finished_s < 0)
    return Status::Error(top.WhereOf("metrics_keep_finished_s") + ": metrics_keep_finished_s: must be >= 0");
  DL_RETURN_IF_ERROR(ReadDevices(top, &c.devices));
  const Section net(top.Get("net"), "net", source_name, {"io_threads"});
  DL_RETURN_IF_ERROR(net.CheckKeys());
  DL_RETURN_IF_ERROR(net.Int("io_threads", &c.net_io_threads));
  if (c.net_io_threads < 0 || c.net_io_threads > kMaxIoThreads) {
    return Status::Error(net.WhereOf("io_threads") + ": net.io_threads: " + std::to_string(c.net_io_threads) +
                         " is out of range; must be in [0, " + std::to_string(kMaxIoThreads) +
                         "]: ZeroMQ I/O threads, about one per learner whose CURVE uplink this site's syncer "
                         "takes at once (0 = min(4, cores))");
  }
  const Section listen(top.Get("listen"), "listen", source_name, kEndpointKeys);
  DL_RETURN_IF_ERROR(listen.CheckKeys());
  DL_RETURN_IF_ERROR(ReadEndpoints(listen, &c.listen));

  if (!IsSiteName(c.site)) {
    return Status::Error(top.WhereOf("site") + ": site: " +
                         (c.site.empty() ? std::string("is required") : "'" + c.site + "' is not a site name") + " (" +
                         std::string(kSiteNameRule) + "): this site's name, as run configs' placement names it");
  }
  if (c.state_dir.empty()) {
    return Status::Error(top.WhereOf("state_dir") +
                         ": state_dir: is required: the directory for jobs and the lock file, e.g. /var/lib/dilocod");
  }
  c.state_dir = ResolvePath(c.state_dir, base_dir);
  c.control_socket = c.control_socket.empty() ? (fs::path(c.state_dir) / "control.sock").string()
                                              : ResolvePath(c.control_socket, base_dir);
  if (c.control_socket.size() > 100) {
    return Status::Error(top.WhereOf("control_socket") + ": control_socket: '" + c.control_socket +
                         "' is longer than a unix socket path may be (~107 bytes); choose a shorter path");
  }
  c.keys_dir = ResolvePath(c.keys_dir, base_dir);
  if (c.keys_dir.empty() && !c.allow_plaintext) {
    return Status::Error(top.WhereOf("keys") +
                         ": keys: is required (a directory with key.public and key.secret; create one with "
                         "`dilococtl keygen --out DIR`), unless allow_plaintext: true for development");
  }
  if (c.threads < 0) return Status::Error(top.WhereOf("threads") + ": threads: must be >= 0 (0 = all cores)");
  if (c.metrics_port < 0 || c.metrics_port > 65535) {
    return Status::Error(top.WhereOf("metrics_port") + ": metrics_port: must be in [0, 65535] (0 = off)");
  }

  const YAML::Node found_peers = top.Get("peers");
  const YAML::Node peers = found_peers.IsDefined() ? found_peers : YAML::Node(YAML::NodeType::Null);
  if (peers.IsDefined() && !peers.IsNull() && !peers.IsSequence()) {
    return Status::Error(top.WhereOf("peers") + ": peers: expected a list of peers ({site, control, uplink, "
                                                "downlink, snapshot, public_key}), got " + Describe(peers));
  }
  std::set<std::string> sites = {c.site};
  for (size_t i = 0; peers.IsSequence() && i < peers.size(); ++i) {
    const std::string path = "peers." + std::to_string(i);
    std::vector<std::string> keys = kEndpointKeys;
    keys.insert(keys.begin(), "site");
    keys.push_back("public_key");
    keys.push_back("public_key_file");
    const Section ps(peers[i], path, source_name, keys);
    DL_RETURN_IF_ERROR(ps.CheckKeys());
    PeerConfig p;
    DL_RETURN_IF_ERROR(ps.String("site", &p.site));
    DL_RETURN_IF_ERROR(ReadEndpoints(ps, &p.endpoints));
    DL_RETURN_IF_ERROR(ps.String("public_key", &p.public_key));
    std::string key_file;
    DL_RETURN_IF_ERROR(ps.String("public_key_file", &key_file));
    if (!IsSiteName(p.site)) {
      return Status::Error(ps.WhereOf("site") + ": " + path + ".site: " +
                           (p.site.empty() ? std::string("is required")
                                          : "'" + p.site + "' is not a site name (" + std::string(kSiteNameRule) + ")"));
    }
    if (!sites.insert(p.site).second) {
      return Status::Error(ps.WhereOf("site") + ": " + path + ".site: '" + p.site +
                           (p.site == c.site ? "' is this site itself; list only the other sites"
                                             : "' is listed twice; keep one entry per site"));
    }
    if (p.endpoints.control.empty()) {
      return Status::Error(ps.WhereOf("control") + ": " + path + ".control: is required: the peer's "
                                                                  "listen.control endpoint, e.g. tcp://10.0.0.2:7100");
    }
    if (!key_file.empty()) {
      if (!p.public_key.empty()) {
        return Status::Error(ps.WhereOf("public_key_file") + ": " + path +
                             ": give public_key or public_key_file, not both");
      }
      const std::string file = ResolvePath(key_file, base_dir);
      std::ifstream f(file);
      std::stringstream ss;
      ss << f.rdbuf();
      if (!f) {
        return Status::Error(ps.WhereOf("public_key_file") + ": " + path + ".public_key_file: cannot read '" +
                             file + "'; copy the peer's key.public there");
      }
      p.public_key = ss.str();
      while (!p.public_key.empty() && std::isspace(static_cast<unsigned char>(p.public_key.back())))
        p.public_key.pop_back();
    }
    if (p.public_key.empty() && !c.allow_plaintext) {
      return Status::Error(ps.WhereOf("site") + ": " + path + ": public_key (or public_key_file) is required: the "
                                                               "peer's key.public, so that CURVE can authenticate it");
    }
    if (!p.public_key.empty() && p.public_key.size() != 40) {
      return Status::Error(ps.WhereOf(key_file.empty() ? "public_key" : "public_key_file") + ": " + path +
                           ".public_key: expected a 40-character Z85 key (the peer's key.public), got " +
                           std::to_string(p.public_key.size()) + " characters");
    }
    c.peers.push_back(std::move(p));
  }
  DL_RETURN_IF_ERROR(ReadSiteHosts(top, base_dir, &c));
  for (const std::string& site : c.submitters) {
    if (!c.FindPeer(site))
      return Status::Error(top.WhereOf("submitters") + ": submitters: '" + site +
                           "' is not among the peers; list sites from peers (the local CLI may always submit)");
  }
  for (std::string& root : c.data_roots) {
    if (root.empty()) return Status::Error(top.WhereOf("data_roots") + ": data_roots: an empty path");
    root = ResolvePath(root, base_dir);  // symlinks are resolved when a job is checked
  }
  if (c.max_jobs < 1) return Status::Error(top.WhereOf("max_jobs") + ": max_jobs: must be >= 1");
  if (c.max_job_spec_bytes < 1024 || c.max_job_spec_bytes > 65536) {
    return Status::Error(top.WhereOf("max_job_spec_bytes") +
                         ": max_job_spec_bytes: must be in [1024, 65536] (a control message carries 64 KiB of text)");
  }
  if (!c.peers.empty() && c.listen.control.empty()) {
    return Status::Error(top.WhereOf("listen") +
                         ": listen.control: is required when peers are listed: the tcp endpoint peers reach "
                         "this daemon on, e.g. tcp://0.0.0.0:7100");
  }
  *out = std::move(c);
  return Status::Ok();
}

Status LoadDaemonConfig(const std::string& path, DaemonConfig* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::Error("cannot read daemon config '" + path + "': " + std::strerror(errno));
  std::stringstream ss;
  ss << f.rdbuf();
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  return ParseDaemonConfig(ss.str(), path, (ec ? fs::path(path) : absolute).parent_path().string(), out);
}

}  // namespace diloco
