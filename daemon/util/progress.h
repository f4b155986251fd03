// A one-line progress display: redrawn in place on a terminal, or printed
// as plain lines (for logs) at most every `every` updates.
#pragma once

#include <chrono>
#include <string>

namespace diloco {

class ProgressLine {
 public:
  // in_place: redraw with '\r' (stderr is a terminal).
  ProgressLine(bool in_place, int every);
  // Shows text; done/total drive the ETA shown after it.
  void Update(long done, long total, const std::string& text);
  // Ends the in-place line so later output starts on a fresh line.
  void Finish();

 private:
  bool in_place_;
  int every_;
  long updates_ = 0;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_draw_{};
};

// "1h02m", "3m07s", "12s".
std::string FormatDuration(double seconds);

}  // namespace diloco
