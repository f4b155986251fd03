// The one right to run, handed between the virtual scheduler's thread and actor threads (a
// learner runs its inner loop on a thread of its own): exactly one of them runs at a time, so
// actors on threads act in the scheduler's order and at its times, whatever the machine's load.
#pragma once

#include <condition_variable>
#include <mutex>
#include <set>

namespace diloco {

class Baton {
 public:
  static constexpr int kScheduler = -1;

  // Scheduler thread: lets actor `who` run until it hands the baton back.
  void RunActor(int who) {
    std::unique_lock<std::mutex> lock(mu_);
    if (aborted_) return;
    holder_ = who;
    cv_.notify_all();
    cv_.wait(lock, [&] { return holder_ == kScheduler || aborted_; });
  }
  // Actor thread: hands the baton back and waits until the scheduler lets `who` run again.
  // false: the run was aborted (the actor must unwind without touching shared state).
  bool Yield(int who) {
    std::unique_lock<std::mutex> lock(mu_);
    holder_ = kScheduler;
    cv_.notify_all();
    cv_.wait(lock, [&] { return holder_ == who || aborted_ || killed_.count(who); });
    return !aborted_ && !killed_.count(who);
  }
  // Actor thread, at its start: waits for its first turn (false: aborted).
  bool AwaitTurn(int who) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return holder_ == who || aborted_ || killed_.count(who); });
    return !aborted_ && !killed_.count(who);
  }
  // Scheduler thread: actor `who` dies where it waits (a kill -9); it unwinds without touching
  // shared state. Revive lets a new actor of that number run.
  void Kill(int who) {
    std::lock_guard<std::mutex> lock(mu_);
    killed_.insert(who);
    cv_.notify_all();
  }
  void Revive(int who) {
    std::lock_guard<std::mutex> lock(mu_);
    killed_.erase(who);
  }
  // Scheduler thread: the run ends early; every waiting actor wakes and unwinds.
  void Abort() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }
  bool aborted() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }
  // Actor thread, at its end: hands the baton back for good.
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    holder_ = kScheduler;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int holder_ = kScheduler;
  bool aborted_ = false;
  std::set<int> killed_;
};

}  // namespace diloco
