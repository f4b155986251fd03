#include "daemon/control/peer_views.h"

#include <vector>

namespace diloco {

PeerViews::PeerViews(Fetch fetch, Options options) : fetch_(std::move(fetch)), options_(options) {}

PeerViews::~PeerViews() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& [name, site] : sites_)
    if (site->worker.joinable()) site->worker.join();
}

PeerViews::View PeerViews::Get(const std::string& site, const std::string& job, bool wait) {
  std::unique_lock<std::mutex> lock(mu_);
  std::unique_ptr<Site>& s = sites_[site];
  if (!s) {
    s = std::make_unique<Site>();
    s->worker = std::thread([this, site] { Work(site); });
  }
  Entry& e = s->jobs[job];
  const auto now = Clock::now();
  e.wanted = now;
  cv_.notify_all();
  const bool site_up = s->last_answer != Clock::time_point{} && now - s->last_answer < std::chrono::seconds(5);
  const int wait_ms = site_up ? options_.first_wait_up_ms : options_.first_wait_ms;
  if (wait && !e.tried_once)
    cv_.wait_until(lock, now + std::chrono::milliseconds(wait_ms), [&] { return e.tried_once || stop_; });
  View v = e.view;
  v.age_ms = e.answered_once ? std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - e.fetched).count() : -1;
  return v;
}

void PeerViews::Work(const std::string& site) {
  std::unique_lock<std::mutex> lock(mu_);
  Site& s = *sites_[site];
  while (!stop_) {
    // The wanted view that is due soonest.
    const auto now = Clock::now();
    std::string due_job;
    Clock::time_point due_at = Clock::time_point::max();
    for (auto it = s.jobs.begin(); it != s.jobs.end();) {
      Entry& e = it->second;
      if (now - e.wanted > std::chrono::milliseconds(options_.keep_wanted_ms)) {
        it = s.jobs.erase(it);
        continue;
      }
      const auto at = e.tried_once ? e.tried + std::chrono::milliseconds(options_.refresh_ms) : now;
      if (at < due_at) {
        due_at = at;
        due_job = it->first;
      }
      ++it;
    }
    if (due_job.empty() || due_at > now) {
      if (due_job.empty()) cv_.wait(lock);
      else cv_.wait_until(lock, due_at);
      continue;
    }
    lock.unlock();
    nlohmann::json view;
    const Status st = fetch_(site, due_job, &view);
    lock.lock();
    auto it = s.jobs.find(due_job);
    if (it == s.jobs.end()) continue;
    Entry& e = it->second;
    e.tried = Clock::now();
    e.tried_once = true;
    if (st.ok()) {
      e.view.ok = true;
      e.view.json = std::move(view);
      e.view.error.clear();
      e.fetched = e.tried;
      e.answered_once = true;
      s.last_answer = e.tried;
    } else {
      e.view.error = st.message();
    }
    cv_.notify_all();
  }
}

}  // namespace diloco
