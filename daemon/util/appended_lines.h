// A file that another thread or process appends to (a syncer's events.log), read as it grows:
// each ReadNew hands over only the whole lines added since the last call; a line still being
// written waits for the next call.
#pragma once

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

namespace diloco {

class AppendedLines {
 public:
  explicit AppendedLines(std::string path) : path_(std::move(path)) {}

  // on_line(line, line_number) for each new whole line (without its '\n'), in order; returning
  // false stops after that line, which is not handed over again. A missing file has no lines.
  template <typename OnLine>
  void ReadNew(OnLine&& on_line) {
    std::ifstream f(path_, std::ios::binary);
    if (!f) return;
    f.seekg(offset_);
    const std::string chunk((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    size_t at = 0;
    for (size_t nl; (nl = chunk.find('\n', at)) != std::string::npos;) {
      const std::string_view line(chunk.data() + at, nl - at);
      at = nl + 1;
      if (!on_line(line, ++line_)) break;
    }
    offset_ += (int64_t)at;
  }

  const std::string& path() const { return path_; }

 private:
  const std::string path_;
  int64_t offset_ = 0;  // bytes of whole lines handed over
  int64_t line_ = 0;
};

}  // namespace diloco
