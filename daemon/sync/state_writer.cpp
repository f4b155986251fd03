#include "daemon/sync/state_writer.h"

#include <utility>

namespace diloco {

AsyncStateWriter::AsyncStateWriter(std::string path)
    : path_(std::move(path)), thread_([this] { Loop(); }) {}

AsyncStateWriter::~AsyncStateWriter() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool AsyncStateWriter::Submit(GlobalState state, Done done) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (busy_) return false;
    busy_ = true;
    job_.emplace(Job{std::move(state), std::move(done)});
  }
  cv_.notify_all();
  return true;
}

Status AsyncStateWriter::Wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return !busy_; });
  return last_;
}

bool AsyncStateWriter::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return busy_;
}

void AsyncStateWriter::Loop() {
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || job_.has_value(); });
      if (!job_) return;  // stop_, nothing left
      job = std::move(*job_);
      job_.reset();
    }
    Status status = SaveGlobalState(path_, job.state);
    job.state = {};  // free the copy before done runs: it can be the model's size
    if (job.done) job.done(status);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      last_ = std::move(status);
      busy_ = false;
    }
    cv_.notify_all();
  }
}

}  // namespace diloco
