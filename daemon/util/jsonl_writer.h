// Appends one JSON object per line to a file, flushed per line so a crash
// loses at most the line being written.
#pragma once

#include <cstdio>
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

  Status Open(const std::string& path);  // appends to an existing file
  Status Write(const nlohmann::json& object);

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
};

}  // namespace diloco
