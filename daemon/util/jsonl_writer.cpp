#include "daemon/util/jsonl_writer.h"

#include <sys/file.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace diloco {

JsonlWriter::~JsonlWriter() {
  if (file_) std::fclose(file_);
}

Status JsonlWriter::Open(const std::string& path, int64_t rotate_bytes) {
  path_ = path;
  rotate_bytes_ = rotate_bytes;
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) return Status::Error("cannot open '" + path + "' for appending: " + std::strerror(errno));
  std::fseek(file_, 0, SEEK_END);
  size_ = std::ftell(file_);
  return Status::Ok();
}

// Several writers may append to one file (the syncer shards of a run share its events.log): the
// first to rotate moves the file; the others find a new file at the path and reopen it instead of
// moving that one over the first's part. A lock on the file being rotated makes the look and the
// move one step, across threads and processes.
Status JsonlWriter::Rotate() {
  const int fd = fileno(file_);
  (void)::flock(fd, LOCK_EX);
  struct stat ours = {}, at_path = {};
  const bool still_ours = ::fstat(fd, &ours) == 0 && ::stat(path_.c_str(), &at_path) == 0 &&
                          ours.st_dev == at_path.st_dev && ours.st_ino == at_path.st_ino;
  const std::string old = path_ + ".1";
  Status moved = Status::Ok();
  if (still_ours && std::rename(path_.c_str(), old.c_str()) != 0)
    moved = Status::Error("cannot rotate '" + path_ + "' to '" + old + "': " + std::strerror(errno));
  (void)::flock(fd, LOCK_UN);
  std::fclose(file_);
  file_ = nullptr;
  DL_RETURN_IF_ERROR(moved);
  return Open(path_, rotate_bytes_);
}

Status JsonlWriter::Write(const nlohmann::json& object) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!file_) return Status::Error("'" + path_ + "' is not open");
  if (rotate_bytes_ > 0 && size_ >= rotate_bytes_) DL_RETURN_IF_ERROR(Rotate());
  const std::string line = object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";  // bad UTF-8 -> U+FFFD
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    return Status::Error("cannot write to '" + path_ + "': " + std::strerror(errno));
  size_ += (int64_t)line.size();
  return Status::Ok();
}

}  // namespace diloco
