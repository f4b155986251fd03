#include "daemon/virt/scheduler.h"

#include <algorithm>

namespace diloco {

uint64_t VirtualScheduler::At(int64_t t_ns, Event event) {
  const uint64_t id = ++next_id_;
  queue_.emplace(std::max(t_ns, now_ns_), id);
  events_.emplace(id, std::move(event));
  return id;
}

void VirtualScheduler::Cancel(uint64_t id) { events_.erase(id); }

void VirtualScheduler::SkipCancelled() const {
  while (!queue_.empty() && events_.find(queue_.top().second) == events_.end()) queue_.pop();
}

int64_t VirtualScheduler::next_ns() const {
  SkipCancelled();
  return queue_.empty() ? now_ns_ : queue_.top().first;
}

bool VirtualScheduler::RunNext() {
  SkipCancelled();
  if (queue_.empty()) return false;
  const auto [t, id] = queue_.top();
  queue_.pop();
  const auto it = events_.find(id);
  now_ns_ = t;
  Event event = std::move(it->second);
  events_.erase(it);
  events_run_++;
  event();
  return true;
}

}  // namespace diloco
