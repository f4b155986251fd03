// A cheap status for recoverable failures (bad config, I/O, bad input).
// The message says what went wrong and what to do next; ok() has none.
#pragma once

#include <string>
#include <utility>

namespace diloco {

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string message) { return Status(std::move(message)); }

  bool ok() const { return !failed_; }
  const std::string& message() const { return message_; }

  // Prefixes context, e.g. Status::Error("x").WithContext("load foo.yaml").
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(context + ": " + message_);
  }

 private:
  explicit Status(std::string message) : failed_(true), message_(std::move(message)) {}
  bool failed_ = false;
  std::string message_;
};

// Returns from the enclosing function when expr fails.
#define DL_RETURN_IF_ERROR(expr)          \
  do {                                    \
    ::diloco::Status _st = (expr);        \
    if (!_st.ok()) return _st;            \
  } while (0)

}  // namespace diloco
