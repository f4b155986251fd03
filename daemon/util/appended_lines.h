// A file that another thread or process appends to (a syncer's events.log), read as it grows:
// each ReadNew hands over only the whole lines added since the last call; a line still being
// written waits for the next call. A file rotated by its writer (moved to <path>.1 and begun
// anew, util/jsonl_writer.h) is followed: the rest of the old part first, then the new one.
#pragma once

#include <sys/stat.h>

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
    struct stat now;
    if (::stat(path_.c_str(), &now) != 0) return;
    if (inode_ != 0 && now.st_ino != inode_) {
      // Rotated since the last call: what is left of the part we were reading, then the new one.
      const std::string old_part = path_ + ".1";
      struct stat old;
      if (::stat(old_part.c_str(), &old) == 0 && old.st_ino == inode_ && !ReadFrom(old_part, on_line)) return;
      offset_ = 0;
    }
    inode_ = now.st_ino;
    ReadFrom(path_, on_line);
  }

  const std::string& path() const { return path_; }

 private:
  // From offset_ on in file; false when on_line asked to stop.
  template <typename OnLine>
  bool ReadFrom(const std::string& file, OnLine& on_line) {
    std::ifstream f(file, std::ios::binary);
    if (!f) return true;
    f.seekg(offset_);
    const std::string chunk((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    size_t at = 0;
    bool go_on = true;
    for (size_t nl; go_on && (nl = chunk.find('\n', at)) != std::string::npos;) {
      const std::string_view line(chunk.data() + at, nl - at);
      at = nl + 1;
      go_on = on_line(line, ++line_);
    }
    offset_ += (int64_t)at;
    return go_on;
  }

  const std::string path_;
  ino_t inode_ = 0;     // of the part being read (0: none yet)
  int64_t offset_ = 0;  // bytes of whole lines handed over from it
  int64_t line_ = 0;    // lines handed over, all parts together
};

}  // namespace diloco
