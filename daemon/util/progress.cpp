#include "daemon/util/progress.h"

#include <cstdio>

namespace diloco {

ProgressLine::ProgressLine(bool in_place, int every) : in_place_(in_place), every_(every < 1 ? 1 : every) {}

void ProgressLine::Update(long done, long total, const std::string& text) {
  const auto now = std::chrono::steady_clock::now();
  updates_++;
  // A terminal is redrawn at most 10 times a second; logs get every Nth.
  if (in_place_ ? now - last_draw_ < std::chrono::milliseconds(100) && done < total
                : updates_ % every_ != 0 && done < total) {
    return;
  }
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  std::string eta = "--";
  if (done > 0 && total > done) eta = FormatDuration(elapsed * (total - done) / done);
  std::fprintf(stderr, "%s%s | ETA %s%s", in_place_ ? "\r\033[K" : "", text.c_str(), eta.c_str(),
               in_place_ ? "" : "\n");
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressLine::Finish() {
  if (in_place_ && drawn_) std::fputc('\n', stderr);
  drawn_ = false;
}

std::string FormatDuration(double seconds) {
  const long s = (long)(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lds", s);
  }
  return buf;
}

}  // namespace diloco
