// Writes the syncer's global state checkpoints on a background thread, off the merge path: the
// syncer hands over a copy and carries on merging while SaveGlobalState (atomic: tmp file,
// fsync, rename, fsync the directory) runs. One write at a time; a checkpoint that comes while
// one is in flight is skipped by the caller, not queued (the next one covers more anyway).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "daemon/sync/global_state.h"
#include "daemon/util/status.h"

namespace diloco {

class AsyncStateWriter {
 public:
  using Done = std::function<void(Status)>;

  explicit AsyncStateWriter(std::string path);  // starts the thread
  ~AsyncStateWriter();                          // waits for a write in flight, then stops
  AsyncStateWriter(const AsyncStateWriter&) = delete;
  AsyncStateWriter& operator=(const AsyncStateWriter&) = delete;

  // Starts saving state to path and returns true; false (state dropped, done not called) while
  // a write is in flight. done (may be empty) runs on the writer thread with the save's
  // status, after the file is durable on Ok; the writer counts as busy until done returns, so
  // done must touch only thread-safe things (UpdateLog::DropPrevious is), and must not call
  // Submit or Wait on this writer.
  bool Submit(GlobalState state, Done done);

  // Blocks until no write is in flight; returns the status of the last finished write (Ok
  // when none).
  Status Wait();
  bool busy() const;
  const std::string& path() const { return path_; }

 private:
  struct Job {
    GlobalState state;
    Done done;
  };
  void Loop();

  const std::string path_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::optional<Job> job_;  // submitted, not yet taken by the thread
  bool busy_ = false;       // from Submit until done returns
  bool stop_ = false;
  Status last_;
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace diloco
