#include "daemon/util/lock_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

namespace diloco {

namespace {

// The pid the holder wrote, or "" when unreadable (it may not have written it yet).
std::string ReadHolderPid(int fd) {
  char buf[32] = {};
  const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "";
  std::string pid(buf, static_cast<size_t>(n));
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  for (char c : pid)
    if (c < '0' || c > '9') return "";
  return pid;
}

}  // namespace

Status LockFile::Acquire(const std::string& path, std::unique_ptr<LockFile>* out) {
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return Status::Error("cannot open lock file '" + path + "': " + std::strerror(errno) +
                         " (check that the state directory exists and is writable)");
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string dir = std::filesystem::path(path).parent_path().string();
    if (err == EWOULDBLOCK) {
      const std::string pid = ReadHolderPid(fd);
      close(fd);
      return Status::Error("state directory '" + dir + "' is in use by another dilocod (pid " +
                           (pid.empty() ? std::string("unknown") : pid) + ", lock file " + path +
                           "): stop it first, or give this daemon another state directory");
    }
    close(fd);
    return Status::Error("cannot lock '" + path + "': " + std::strerror(err));
  }
  // Ours now: replace whatever pid a dead holder left.
  const std::string pid = std::to_string(getpid()) + "\n";
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int err = errno;
    close(fd);
    return Status::Error("cannot write the pid into lock file '" + path + "': " + std::strerror(err));
  }
  out->reset(new LockFile(path, fd));
  return Status::Ok();
}

LockFile::~LockFile() {
  if (fd_ < 0) return;
  // Empty the pid while still holding the lock, so it never names a process
  // that has let go; close() then releases the lock.
  (void)ftruncate(fd_, 0);
  close(fd_);
}

}  // namespace diloco
