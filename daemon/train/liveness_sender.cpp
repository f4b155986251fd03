#include "daemon/train/liveness_sender.h"

#include <chrono>

#include "daemon/net/channel.h"
#include "daemon/net/wire_transport.h"
#include "daemon/sync/protocol.h"

namespace diloco {

Status LivenessSender::Start(net::NetContext& context, const LivenessOptions& options,
                             std::unique_ptr<LivenessSender>* out) {
  std::unique_ptr<LivenessSender> s(new LivenessSender());
  s->options_ = options;
  std::promise<Status> started;
  std::future<Status> ready = started.get_future();
  s->thread_ = std::thread([&context, self = s.get(), &started] { self->Run(context, &started); });
  Status st = ready.get();
  if (!st.ok()) {
    s->thread_.join();
    return st;
  }
  *out = std::move(s);
  return Status::Ok();
}

LivenessSender::~LivenessSender() { Stop(); }

void LivenessSender::Update(const HeartbeatMsg& heartbeat) {
  std::lock_guard<std::mutex> lock(mu_);
  beat_ = heartbeat;
  have_beat_ = true;
}

void LivenessSender::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LivenessSender::Run(net::NetContext& context, std::promise<Status>* started) {
  // The sockets live and die on this thread (ZeroMQ sockets are not shared between threads).
  std::vector<std::unique_ptr<net::PubChannel>> pubs(options_.targets.size());
  Status st = Status::Ok();
  for (size_t t = 0; t < pubs.size() && st.ok(); t++) {
    st = net::PubChannel::Create(context, options_.targets[t].socket, &pubs[t]);
    if (st.ok()) st = pubs[t]->Connect(options_.targets[t].endpoint).WithContext(options_.sender + " liveness uplink");
  }
  started->set_value(st);
  if (!st.ok()) return;
  const std::string topic = LivenessTopic(options_.job_id);
  uint64_t seq = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::milliseconds(options_.interval_ms), [&] { return stop_; });
    if (stop_ || (options_.crash && options_.crash->load())) break;
    if (!have_beat_) continue;
    EnvelopeHeader h;
    h.job_id = options_.job_id;
    h.sender = options_.sender;
    h.seq = ++seq;
    h.incarnation = options_.incarnation;
    h.sent_unix_ms = (uint64_t)std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
    const HeartbeatMsg beat = beat_;
    lock.unlock();
    for (auto& pub : pubs) {
      OutgoingMessage om;
      if (!BuildMessage(h, beat, {}, &om).ok()) break;  // the training thread's beat is checked there too
      const uint64_t bytes = om.wire_bytes();
      net::Message m = net::ToMessage(std::move(om), nullptr);
      (void)pub->Publish(topic, m);  // PUB never blocks; a full queue drops the beat
      bytes_sent_ += bytes;
    }
    lock.lock();
  }
}

}  // namespace diloco
