// An exclusive, advisory lock on a file (flock), held for the life of the
// object: one dilocod per state directory. The holder's pid is written into
// the file so that the refusal can name it. The kernel drops the lock when
// the process dies in any way (kill -9 included), so a crash never leaves a
// stale lock behind; the file itself stays (removing it would race with a
// process that has just opened it).
#pragma once

#include <memory>
#include <string>

#include "daemon/util/status.h"

namespace diloco {

class LockFile {
 public:
  // Opens (creating it, mode 0644) and locks path without blocking. When
  // another process holds it: an error naming the directory, the holder's
  // pid and the lock file. The descriptor is close-on-exec, so processes the
  // daemon starts never inherit the lock.
  static Status Acquire(const std::string& path, std::unique_ptr<LockFile>* out);

  // Releases the lock (and empties the pid).
  ~LockFile();
  LockFile(const LockFile&) = delete;
  LockFile& operator=(const LockFile&) = delete;

  const std::string& path() const { return path_; }

 private:
  LockFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
};

}  // namespace diloco
