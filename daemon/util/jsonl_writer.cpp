#include "daemon/util/jsonl_writer.h"

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

Status JsonlWriter::Rotate() {
  std::fclose(file_);
  file_ = nullptr;
  const std::string old = path_ + ".1";
  if (std::rename(path_.c_str(), old.c_str()) != 0)
    return Status::Error("cannot rotate '" + path_ + "' to '" + old + "': " + std::strerror(errno));
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
