// Appends one JSON object per line to a file, flushed per line so a crash
// loses at most the line being written. With rotate_bytes, a file that has grown past it is
// renamed to <path>.1 (replacing the previous one) and a new one begun: at most about twice
// rotate_bytes on disk. Readers read <path>.1 first (sync/event_log.h ReadEventLog).
#pragma once

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "daemon/util/status.h"

namespace diloco {

class JsonlWriter {
 public:
  JsonlWriter() = default;
  ~JsonlWriter();
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;

  Status Open(const std::string& path, int64_t rotate_bytes = 0);  // appends to an existing file
  Status Write(const nlohmann::json& object);

 private:
  Status Rotate();

  std::mutex mu_;  // guards Write (and the Rotate it may do)
  std::FILE* file_ = nullptr;
  std::string path_;
  int64_t rotate_bytes_ = 0;
  int64_t size_ = 0;  // of the current file
};

}  // namespace diloco
