// Calls to other sites and to this site's other hosts (daemon_impl.h), and replies to requests.
#include "daemon/control/daemon_impl.h"

#include <future>

namespace diloco {

// A daemon's control endpoint whose CURVE server key is server_key, as a control target.
ControlTarget DaemonImpl::TargetOf(const std::string& endpoint, const std::string& server_key, int timeout_ms) const {
  ControlTarget t;
  t.endpoint = endpoint;
  t.sender = config.site;
  t.timeout_ms = timeout_ms;
  if (keys) {
    net::CurveOptions c;
    c.public_key_z85 = keys->public_z85;
    c.secret_key_z85 = keys->secret_z85;
    c.server_public_key_z85 = server_key;
    t.curve = c;
  }
  return t;
}

// Host h of this site (site_hosts), as a control target.
ControlTarget DaemonImpl::SiteHostTarget(int h, int timeout_ms) const {
  return TargetOf(config.site_hosts[h].control, config.site_hosts[h].public_key, timeout_ms);
}

ControlTarget DaemonImpl::PeerTarget(const PeerConfig& peer, int timeout_ms) const {
  return TargetOf(peer.endpoints.control, peer.public_key, timeout_ms);
}

Status DaemonImpl::CallPeer(const std::string& site, const std::string& name, const std::string& job_id,
                            const ControlArgs& args, ControlArgs* reply, int timeout_ms) const {
  const PeerConfig* peer = config.FindPeer(site);
  if (!peer) return Status::Error("site '" + site + "' is not among this daemon's peers");
  return CallControl(*context, PeerTarget(*peer, timeout_ms), name, job_id, args, reply)
      .WithContext("site " + site);
}

// On a worker: call(site, &reply) for every site at once (a thread each), so a slow or dead
// site costs its own deadline, not the sum; answers in the order of sites.
DaemonImpl::PeerAnswers DaemonImpl::AtOnce(const std::vector<std::string>& sites,
                                           const std::function<Status(const std::string& site, ControlArgs* reply)>& call) {
  std::vector<std::future<PeerAnswer>> calls;
  for (const std::string& site : sites) {
    calls.push_back(std::async(std::launch::async, [&call, site] {
      PeerAnswer a{site, Status::Ok(), {}};
      a.status = call(site, &a.reply);
      return a;
    }));
  }
  PeerAnswers out;
  for (auto& c : calls) out.push_back(c.get());
  return out;
}

DaemonImpl::PeerAnswers DaemonImpl::CallPeersAtOnce(const std::vector<std::string>& sites, const std::string& name, const std::string& job_id,
                                                    const ControlArgs& args, int timeout_ms) const {
  return AtOnce(sites, [&](const std::string& site, ControlArgs* reply) {
    return CallPeer(site, name, job_id, args, reply, timeout_ms);
  });
}

// The same for work nobody waits on (a rollback, a chaos action of the job's timeline): then
// runs on the loop with the answers.
void DaemonImpl::InBackground(const std::string& what, std::function<PeerAnswers()> work, std::function<void(const PeerAnswers&)> then) {
  const bool queued = off_loop->Run([this, what, work, then]() -> OffLoop::Task {
    try {
      PeerAnswers answers = work();
      return [this, what, then, answers] { Guarded(what.c_str(), [&] { then(answers); }); };
    } catch (const std::exception& e) {
      const std::string error = e.what();
      return [this, what, error] { Log(what + " failed: " + error); };
    }
  });
  if (!queued) Log(what + " not done: too many calls to other sites are waiting");
}

ControlArgs DaemonImpl::Busy(const std::string& name) const {
  return {{"error", "site " + config.site + " is busy with calls to other sites (" + std::to_string(kMaxOffLoop) +
                        " waiting): '" + name + "' not taken; try again in a moment"}};
}

DaemonImpl::ReplyTo DaemonImpl::ReplyToOf(net::RouterChannel& ch, const net::Received& r, const ParsedMessage& m) {
  const ControlMsg* c = m.get<ControlMsg>();
  return {&ch, r.peer, nullptr, 0, m.header.job_id, c ? c->name : "job_spec", c ? c->request_id : 0};
}

DaemonImpl::ReplyTo DaemonImpl::ReplyToOf(net::LocalServer& server, const net::LocalReceived& r, const ParsedMessage& m) {
  const ControlMsg* c = m.get<ControlMsg>();
  ReplyTo to{nullptr, "", &server, r.connection, m.header.job_id, c ? c->name : "job_spec", c ? c->request_id : 0};
  return to;
}

void DaemonImpl::Reply(const ReplyTo& to, const ControlArgs& args) {
  net::Message out;
  if (Status st = BuildControlReply(config.site, to.job_id, to.name, to.request_id, args, &out); !st.ok()) {
    // Too big for one reply (or not encodable): say so instead of leaving the caller to time out.
    Log("reply to '" + to.name + "' not sent: " + st.message());
    if (!BuildControlReply(config.site, to.job_id, to.name, to.request_id,
                           {{"error", "site " + config.site + " could not send its reply to '" + to.name + "': " + st.message()}},
                           &out)
             .ok())
      return;
  }
  if (to.local) {
    (void)to.local->SendTo(to.connection, out);  // false: the client is gone (or was closed)
  } else {
    (void)to.channel->SendTo(to.peer, out, 100);
  }
}

}  // namespace diloco
