#include "daemon/util/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace diloco {
namespace {

std::string Quoted(const std::string& path) { return "'" + path + "'"; }
std::string Errno(int err) { return std::strerror(err); }

Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min(n, (size_t)1 << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Status::Error("cannot write " + Quoted(path) + ": " + Errno(errno));
    p += w;
    n -= (size_t)w;
  }
  return Status::Ok();
}

Status WriteChunks(int fd, const std::vector<ByteChunk>& chunks, const std::string& path) {
  for (const ByteChunk& chunk : chunks) {
    DL_RETURN_IF_ERROR(WriteAll(fd, chunk.data, chunk.size, path));
  }
  if (::fsync(fd) != 0) return Status::Error("cannot fsync " + Quoted(path) + ": " + Errno(errno));
  return Status::Ok();
}

// Makes the rename durable.
Status SyncDirectory(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::Error("cannot open directory " + Quoted(dir) + ": " + Errno(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return Status::Error("cannot fsync directory " + Quoted(dir) + ": " + Errno(err));
  return Status::Ok();
}

}  // namespace

Status WriteFileAtomically(const std::string& path, const std::vector<ByteChunk>& chunks,
                           const std::string& what) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Status::Error("cannot save " + what + ": cannot create " + Quoted(tmp) + ": " +
                         Errno(errno) + ": check that the directory exists and is writable");
  }
  Status st = WriteChunks(fd, chunks, tmp);
  if (::close(fd) != 0 && st.ok()) {
    st = Status::Error("cannot close " + Quoted(tmp) + ": " + Errno(errno));
  }
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st =
        Status::Error("cannot rename " + Quoted(tmp) + " to " + Quoted(path) + ": " + Errno(errno));
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st.WithContext("cannot save " + what + " " + Quoted(path) +
                          " (any previous file there is unchanged)");
  }
  return SyncDirectory(path).WithContext("saved " + what + " " + Quoted(path) +
                                         " but could not make the rename durable");
}

Status ReadWholeFile(const std::string& path, const std::string& what, std::string* bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return Status::Error("cannot open " + what + " " + Quoted(path) + ": " + Errno(err) +
                         (err == ENOENT ? ": check the path" : ""));
  }
  std::string data;
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) data.reserve((size_t)st.st_size);
  char buffer[1 << 16];
  while (true) {
    const ssize_t r = ::read(fd, buffer, sizeof buffer);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      return Status::Error("cannot read " + what + " " + Quoted(path) + ": " + Errno(err));
    }
    if (r == 0) break;
    data.append(buffer, (size_t)r);
  }
  ::close(fd);
  *bytes = std::move(data);
  return Status::Ok();
}

}  // namespace diloco
