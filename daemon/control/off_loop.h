// Work the daemon's control loop hands off so that it never waits: calls to other sites (each
// may take seconds against a slow or dead peer). A few worker threads run the work; the task it
// returns (touching the daemon's state, sending a deferred reply) runs on the loop's next turn,
// through Drain.
//
//   off_loop.Run([=] {
//     auto answers = CallPeers(...);                   // on a worker
//     return [=] { Reply(to, Combine(answers)); };     // on the loop, later
//   });
//
// The queue is bounded: when it is full Run refuses (the caller answers "busy") instead of
// letting a flood of requests pile up threads or memory.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace diloco {

class OffLoop {
 public:
  using Task = std::function<void()>;  // on the loop
  using Work = std::function<Task()>;  // on a worker; an exception or a null task: nothing follows

  OffLoop(int workers, size_t max_queued);
  ~OffLoop();  // waits for the work running now (its peer calls are bounded by their deadlines)
  OffLoop(const OffLoop&) = delete;
  OffLoop& operator=(const OffLoop&) = delete;

  // False (and nothing runs) when max_queued items are already waiting or running.
  bool Run(Work work);
  // On the loop: the task of every finished item, in the order they finished.
  void Drain();
  // Items queued, running or finished but not yet drained.
  size_t in_flight() const;

 private:
  void Worker();

  const size_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Work> queue_;
  std::vector<Task> finished_;
  size_t running_ = 0;
  bool closing_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace diloco
