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
  if (wait) {
    // A fetch that starts from now on: wait for it, as long as the site has earned.
    e.urgent = true;
    cv_.notify_all();
    const Clock::time_point asked = now;
    const int wait_ms = s->up ? options_.fresh_wait_up_ms : options_.fresh_wait_ms;
    Site* site_ptr = s.get();
    cv_.wait_until(lock, now + std::chrono::milliseconds(wait_ms), [&] {
      auto it = site_ptr->jobs.find(job);
      return stop_ || it == site_ptr->jobs.end() || (it->second.tried_once && it->second.tried_started >= asked);
    });
  } else {
    cv_.notify_all();
  }
  auto it = s->jobs.find(job);
  if (it == s->jobs.end()) return View{};
  View v = it->second.view;
  v.age_ms = it->second.answered_once
                 ? std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - it->second.fetched).count()
                 : -1;
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
      const auto at = e.urgent || !e.tried_once ? now : e.tried + std::chrono::milliseconds(options_.refresh_ms);
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
    const Clock::time_point started = Clock::now();
    s.jobs[due_job].urgent = false;
    lock.unlock();
    nlohmann::json view;
    const Status st = fetch_(site, due_job, &view);
    lock.lock();
    s.up = st.ok();
    auto it = s.jobs.find(due_job);
    if (it == s.jobs.end()) continue;
    Entry& e = it->second;
    e.tried = Clock::now();
    e.tried_started = started;
    e.tried_once = true;
    if (st.ok()) {
      e.view.ok = true;
      e.view.json = std::move(view);
      e.view.error.clear();
      e.fetched = e.tried;
      e.answered_once = true;
    } else {
      e.view.error = st.message();
    }
    cv_.notify_all();
  }
}

}  // namespace diloco
