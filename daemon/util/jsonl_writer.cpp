#include "daemon/util/jsonl_writer.h"

#include <cerrno>
#include <cstring>

namespace diloco {

JsonlWriter::~JsonlWriter() {
  if (file_) std::fclose(file_);
}

Status JsonlWriter::Open(const std::string& path) {
  path_ = path;
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) return Status::Error("cannot open '" + path + "' for appending: " + std::strerror(errno));
  return Status::Ok();
}

Status JsonlWriter::Write(const nlohmann::json& object) {
  const std::string line = object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";  // bad UTF-8 -> U+FFFD
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    return Status::Error("cannot write to '" + path_ + "': " + std::strerror(errno));
  return Status::Ok();
}

}  // namespace diloco
