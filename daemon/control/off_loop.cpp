#include "daemon/control/off_loop.h"

namespace diloco {

OffLoop::OffLoop(int workers, size_t max_queued) : max_queued_(max_queued) {
  for (int i = 0; i < workers; i++) threads_.emplace_back([this] { Worker(); });
}

OffLoop::~OffLoop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    queue_.clear();  // not started: dropped (the daemon is going down)
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
}

bool OffLoop::Run(Work work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_ || queue_.size() + running_ + finished_.size() >= max_queued_) return false;
    queue_.push_back(std::move(work));
  }
  wake_.notify_one();
  return true;
}

void OffLoop::Drain() {
  std::vector<Task> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done.swap(finished_);
  }
  for (Task& task : done)
    if (task) task();
}

size_t OffLoop::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() + running_ + finished_.size();
}

void OffLoop::Worker() {
  for (;;) {
    Work work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return closing_ || !queue_.empty(); });
      if (closing_) return;
      work = std::move(queue_.front());
      queue_.pop_front();
      running_++;
    }
    Task task;
    try {
      task = work();
    } catch (const std::exception&) {
      // The daemon's Defer catches its own; anything else has nothing to follow.
    }
    std::lock_guard<std::mutex> lock(mu_);
    running_--;
    finished_.push_back(std::move(task));
  }
}

}  // namespace diloco
