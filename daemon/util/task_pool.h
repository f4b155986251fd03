// A small fixed pool of threads for data-parallel loops (the syncer's merge). Run(tasks, fn)
// calls fn(task, worker) once for every task in [0, tasks), spread over the pool's threads and
// the caller's (worker in [0, threads()): an index for per-thread scratch), and returns when all
// are done. Which thread runs which task is not fixed: a result that must not depend on the
// thread count must depend only on the task index (each task writes its own outputs).
// Run is called from one thread at a time; fn must not call Run.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace diloco {

class TaskPool {
 public:
  // threads >= 1: threads - 1 workers are started; the caller of Run is the last one.
  explicit TaskPool(int threads);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  int threads() const { return (int)workers_.size() + 1; }
  void Run(size_t tasks, const std::function<void(size_t task, int worker)>& fn);

 private:
  void WorkerLoop(int worker);
  void Drain(int worker);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  std::atomic<uint64_t> generation_{0};  // written under mu_: bumped by each Run
  bool stop_ = false;        // guarded by mu_
  int busy_ = 0;             // guarded by mu_: workers inside the current Run
  const std::function<void(size_t, int)>* fn_ = nullptr;
  size_t tasks_ = 0;
  std::atomic<size_t> next_{0};
};

// fn(task, 0) for every task on this thread when pool is null, else pool->Run.
inline void RunTasks(TaskPool* pool, size_t tasks, const std::function<void(size_t, int)>& fn) {
  if (pool == nullptr || pool->threads() == 1 || tasks <= 1) {
    for (size_t t = 0; t < tasks; t++) fn(t, 0);
    return;
  }
  pool->Run(tasks, fn);
}

}  // namespace diloco
