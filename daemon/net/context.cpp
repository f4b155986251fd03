#include "daemon/net/context.h"

#include <algorithm>
#include <thread>

namespace diloco::net {

int DefaultIoThreads() {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());  // 0: unknown
  return std::clamp(cores, 1, 4);
}

NetContext::NetContext(const NetContextOptions& options) : context_(options.io_threads, options.max_sockets) {}

Status NetContext::Create(const NetContextOptions& options, std::unique_ptr<NetContext>* out) {
  if (options.io_threads < 1) return Status::Error("io_threads must be at least 1");
  if (options.max_sockets < 8) return Status::Error("max_sockets must be at least 8");
  try {
    out->reset(new NetContext(options));
  } catch (const zmq::error_t& e) {
    return Status::Error(std::string("cannot create the ZeroMQ context: ") + e.what());
  }
  return Status::Ok();
}

NetContext::~NetContext() {
  // shutdown() makes blocking calls in other threads (link relays, ZAP) return ETERM so they
  // close their sockets; close() then waits for every socket to be closed.
  context_.shutdown();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (zap_) zap_->Stop();
  }
  context_.close();
}

Status NetContext::EnsureZap() {
  std::lock_guard<std::mutex> lock(mu_);
  if (zap_) return Status::Ok();
  auto zap = std::make_unique<ZapHandler>(context_);
  DL_RETURN_IF_ERROR(zap->Start());
  zap_ = std::move(zap);
  return Status::Ok();
}

Status NetContext::SetAllowlist(const std::string& domain, const std::vector<std::string>& public_keys_z85) {
  DL_RETURN_IF_ERROR(EnsureZap());
  std::lock_guard<std::mutex> lock(mu_);
  return zap_->SetAllowlist(domain, public_keys_z85);
}

ZapStats NetContext::zap_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return zap_ ? zap_->stats() : ZapStats{};
}

uint64_t NetContext::zap_refused_count(const std::string& key_z85) const {
  std::lock_guard<std::mutex> lock(mu_);
  return zap_ ? zap_->refused_count(key_z85) : 0;
}

uint64_t NetContext::NextId() {
  std::lock_guard<std::mutex> lock(mu_);
  return next_id_++;
}

}  // namespace diloco::net
