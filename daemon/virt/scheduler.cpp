#include "daemon/virt/scheduler.h"

#include <algorithm>

namespace diloco {

uint64_t VirtualScheduler::At(int64_t t_ns, Event event) {
  const uint64_t id = ++next_id_;
  const int64_t t = std::max(t_ns, now_ns_);
  queue_.emplace(std::make_pair(t, id), std::move(event));
  time_of_[id] = t;
  return id;
}

void VirtualScheduler::Cancel(uint64_t id) {
  const auto it = time_of_.find(id);
  if (it == time_of_.end()) return;
  queue_.erase({it->second, id});
  time_of_.erase(it);
}

bool VirtualScheduler::RunNext() {
  if (queue_.empty()) return false;
  auto it = queue_.begin();
  now_ns_ = it->first.first;
  time_of_.erase(it->first.second);
  Event event = std::move(it->second);
  queue_.erase(it);
  events_run_++;
  event();
  return true;
}

}  // namespace diloco
