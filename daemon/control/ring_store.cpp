#include "daemon/control/ring_store.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "daemon/train/ring_member.h"

namespace diloco {

Status RingStoreTable::Set(const std::string& job, const std::string& ring, const std::string& key,
                           const std::string& value) {
  if (ring.empty() || ring.size() > limits_.max_ring_bytes || key.empty() || key.size() > limits_.max_ring_bytes)
    return Status::Error("ring_set: ring and key must be 1 .. " + std::to_string(limits_.max_ring_bytes) + " bytes");
  if (value.size() > limits_.max_value_bytes)
    return Status::Error("ring_set: a value of " + std::to_string(value.size()) + " bytes is over the limit of " +
                         std::to_string(limits_.max_value_bytes));
  Job& j = jobs_[job];
  auto it = j.rings.find(ring);
  if (it == j.rings.end()) {
    while (j.order.size() >= limits_.max_rings_per_job) {
      j.rings.erase(j.order.front());
      j.order.pop_front();
    }
    j.order.push_back(ring);
    it = j.rings.emplace(ring, std::map<std::string, std::string>{}).first;
  }
  if (!it->second.count(key) && it->second.size() >= limits_.max_keys_per_ring)
    return Status::Error("ring_set: ring " + ring + " already holds " + std::to_string(limits_.max_keys_per_ring) + " keys");
  it->second[key] = value;
  return Status::Ok();
}

bool RingStoreTable::Get(const std::string& job, const std::string& ring, const std::string& key,
                         std::string* value) const {
  auto j = jobs_.find(job);
  if (j == jobs_.end()) return false;
  auto r = j->second.rings.find(ring);
  if (r == j->second.rings.end()) return false;
  auto k = r->second.find(key);
  if (k == r->second.end()) return false;
  *value = k->second;
  return true;
}

void RingStoreTable::DropJob(const std::string& job) { jobs_.erase(job); }

size_t RingStoreTable::rings(const std::string& job) const {
  auto j = jobs_.find(job);
  return j == jobs_.end() ? 0 : j->second.rings.size();
}

std::string HexEncode(const std::vector<char>& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) {
    const unsigned char b = (unsigned char)c;
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

bool HexDecode(const std::string& text, std::vector<char>* out) {
  if (text.size() % 2) return false;
  const auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  out->clear();
  for (size_t i = 0; i < text.size(); i += 2) {
    const int hi = nibble(text[i]), lo = nibble(text[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->push_back((char)(hi << 4 | lo));
  }
  return true;
}

ControlCommStore::ControlCommStore(net::NetContext& context, ControlTarget host0, std::string job_id, std::string ring,
                                   int learner, const std::atomic<bool>* cancel, int poll_ms)
    : context_(context),
      host0_(std::move(host0)),
      job_id_(std::move(job_id)),
      ring_(std::move(ring)),
      learner_(learner),
      cancel_(cancel),
      poll_ms_(poll_ms) {}

CommStatus ControlCommStore::set(const std::string& key, const std::vector<char>& value) {
  ControlArgs reply;
  const Status st = CallControl(context_, host0_, "ring_set", job_id_,
                                {{"ring", ring_}, {"key", key}, {"value", HexEncode(value)}}, &reply);
  if (!st.ok()) return CommStatus::Error("ring store on host 0 (" + host0_.endpoint + "): " + st.message());
  return CommStatus::Ok();
}

CommStatus ControlCommStore::get(const std::string& key, int64_t timeout_ms, std::vector<char>* value) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms));
  std::string last = "not set yet";
  for (;;) {
    if (cancel_ && cancel_->load()) return CommStatus::Error("ring store: cancelled");
    ControlTarget t = host0_;
    const int64_t left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    t.timeout_ms = (int)std::clamp<int64_t>(left, 200, host0_.timeout_ms);
    ControlArgs reply;
    const Status st = CallControl(context_, t, "ring_get", job_id_,
                                  {{"ring", ring_}, {"key", key}, {"learner", std::to_string(learner_)}}, &reply);
    if (st.ok() && reply.count("ended")) return CommStatus::Error(std::string(kRingEnded) + " (job " + job_id_ + ")");
    if (st.ok() && reply.count("value")) {
      if (!HexDecode(reply["value"], value))
        return CommStatus::Error("ring store on host 0 (" + host0_.endpoint + "): a value for '" + key + "' is not hex");
      return CommStatus::Ok();
    }
    if (!st.ok()) last = st.message();
    if (Clock::now() >= deadline)
      return CommStatus::Error("ring store on host 0 (" + host0_.endpoint + "): no value for '" + key + "' of ring " +
                               ring_ + " after " + std::to_string(timeout_ms) + " ms (" + last +
                               "): is every host of the site's ring up?");
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms_));
  }
}

}  // namespace diloco
