#include "daemon/net/zap.h"

#include <array>
#include <zmq_addon.hpp>

#include "daemon/net/curve.h"
#include "daemon/net/net_log.h"

namespace diloco::net {

ZapDecision DecideZap(const ZapRequest& request, const std::map<std::string, std::set<std::string>>& allowlists) {
  if (request.mechanism != "CURVE") {
    return {false, "mechanism " + request.mechanism + " is not accepted on domain '" + request.domain + "'"};
  }
  const auto it = allowlists.find(request.domain);
  if (it == allowlists.end()) return {false, "no allowlist for domain '" + request.domain + "'"};
  if (it->second.count(request.client_key_z85) == 0) {
    return {false, "key not on the allowlist of domain '" + request.domain + "'"};
  }
  return {true, "allowlisted"};
}

ZapHandler::ZapHandler(zmq::context_t& context) : context_(context) {}

ZapHandler::~ZapHandler() { Stop(); }

Status ZapHandler::Start() {
  if (thread_.joinable()) return Status::Ok();
  try {
    zmq::socket_t socket(context_, zmq::socket_type::rep);
    socket.set(zmq::sockopt::linger, 0);
    socket.bind("inproc://zeromq.zap.01");
    thread_ = std::thread(&ZapHandler::Run, this, std::move(socket));
  } catch (const zmq::error_t& e) {
    return Status::Error(std::string("cannot start the ZAP handler (inproc://zeromq.zap.01): ") + e.what());
  }
  return Status::Ok();
}

void ZapHandler::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

Status ZapHandler::SetAllowlist(const std::string& domain, const std::vector<std::string>& public_keys_z85) {
  std::set<std::string> keys;
  for (const std::string& k : public_keys_z85) {
    DL_RETURN_IF_ERROR(ValidateZ85Key(k, "allowlisted key"));
    keys.insert(k);
  }
  std::lock_guard<std::mutex> lock(mu_);
  allowlists_[domain] = std::move(keys);
  return Status::Ok();
}

ZapStats ZapHandler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

uint64_t ZapHandler::refused_count(const std::string& key_z85) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = refused_by_key_.find(key_z85);
  return it == refused_by_key_.end() ? 0 : it->second;
}

void ZapHandler::Run(zmq::socket_t socket) {
  // Polls with a timeout so Stop() works even while the context lives on.
  while (!stop_) {
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    try {
      if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) == 0) continue;
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(socket, std::back_inserter(frames), zmq::recv_flags::dontwait)) continue;
      // version, request_id, domain, address, identity, mechanism, credentials...
      std::string version = frames.size() > 0 ? frames[0].to_string() : "";
      std::string request_id = frames.size() > 1 ? frames[1].to_string() : "";
      ZapRequest req;
      if (frames.size() >= 6) {
        req.domain = frames[2].to_string();
        req.address = frames[3].to_string();
        req.mechanism = frames[5].to_string();
        if (req.mechanism == "CURVE" && frames.size() >= 7 && frames[6].size() == 32) {
          req.client_key_z85 = Z85EncodeKey(static_cast<const unsigned char*>(frames[6].data()));
        }
      }
      ZapDecision decision;
      if (version != "1.0" || frames.size() < 6) {
        decision = {false, "malformed ZAP request"};
      } else {
        std::lock_guard<std::mutex> lock(mu_);
        decision = DecideZap(req, allowlists_);
      }
      uint64_t refusals = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (decision.admit) {
          ++stats_.admitted;
        } else {
          ++stats_.refused;
          refusals = ++refused_by_key_[req.client_key_z85];
        }
      }
      if (!decision.admit && LogThisOccurrence(refusals)) {
        NetLogf("net.zap", "refused %s peer %s from %s: %s (refusal #%llu of this key)", req.mechanism.c_str(),
                req.client_key_z85.empty() ? "(no key)" : req.client_key_z85.c_str(), req.address.c_str(),
                decision.reason.c_str(), static_cast<unsigned long long>(refusals));
      }
      // Reply: version, request_id, status_code, status_text, user_id, metadata.
      // user_id = the client's key, so receivers can read it from a message ("User-Id").
      const std::string user_id = decision.admit ? req.client_key_z85 : std::string();
      std::array<zmq::const_buffer, 6> reply = {
          zmq::str_buffer("1.0"),
          zmq::buffer(request_id),
          decision.admit ? zmq::str_buffer("200") : zmq::str_buffer("400"),
          zmq::buffer(decision.reason),
          zmq::buffer(user_id),
          zmq::const_buffer(nullptr, 0)};
      zmq::send_multipart(socket, reply);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) break;
      NetLogf("net.zap", "ZAP handler error: %s", e.what());
    }
  }
}

}  // namespace diloco::net
