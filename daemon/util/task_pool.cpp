#include "daemon/util/task_pool.h"

#include <chrono>

namespace diloco {

TaskPool::TaskPool(int threads) {
  for (int w = 1; w < threads; w++) workers_.emplace_back([this, w] { WorkerLoop(w); });
}

TaskPool::~TaskPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void TaskPool::Drain(int worker) {
  for (size_t t = next_.fetch_add(1); t < tasks_; t = next_.fetch_add(1)) (*fn_)(t, worker);
}

// How long a worker that finished its tasks watches for the next Run before it sleeps: Runs come
// in bursts (a merge's passes, one delta's chunks after another), and a sleeping thread takes
// tens of microseconds to wake, as long as a small Run takes.
constexpr auto kSpinBeforeSleep = std::chrono::microseconds(50);

void TaskPool::WorkerLoop(int worker) {
  uint64_t seen = 0;
  for (;;) {
    const auto spin_until = std::chrono::steady_clock::now() + kSpinBeforeSleep;
    while (generation_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < spin_until)
      std::this_thread::yield();
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      busy_++;
    }
    Drain(worker);
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_--;
    }
    done_cv_.notify_all();
  }
}

void TaskPool::Run(size_t tasks, const std::function<void(size_t, int)>& fn) {
  {
    // A worker that woke late for the previous Run may still be looking for work: let it
    // leave before the task list changes under it.
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return busy_ == 0; });
    fn_ = &fn;
    tasks_ = tasks;
    next_.store(0);
    generation_++;
  }
  start_cv_.notify_all();
  Drain(0);
  // Every task has been taken; wait for the workers still running theirs. A worker that wakes
  // late finds no task left (next_ >= tasks_) and leaves at once (the next Run waits for it).
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return busy_ == 0; });
}

}  // namespace diloco
