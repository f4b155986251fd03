// A cheap status for recoverable failures (bad config, I/O, bad input).
// The message says what went wrong and what to do next; ok() has none. A code tells callers that
// branch on the kind of failure what it was (they never search the message); most failures are
// plain kError.
#pragma once

#include <string>
#include <utility>

namespace diloco {

enum class StatusCode {
  kOk = 0,
  kError,         // any other failure
  kNotFound,      // the thing named (a job, a file) does not exist
  kRefused,       // valid, but this site or mode will not do it (a limit, a config setting)
  kAddressInUse,  // a bind found its address taken (EADDRINUSE): retrying later may work
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(std::string message, StatusCode code = StatusCode::kError) {
    return Status(code == StatusCode::kOk ? StatusCode::kError : code, std::move(message));
  }
  static Status NotFound(std::string message) { return Error(std::move(message), StatusCode::kNotFound); }
  static Status Refused(std::string message) { return Error(std::move(message), StatusCode::kRefused); }
  static Status AddressInUse(std::string message) { return Error(std::move(message), StatusCode::kAddressInUse); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prefixes context, e.g. Status::Error("x").WithContext("load foo.yaml"); the code stays.
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + ": " + message_);
  }

 private:
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Returns from the enclosing function when expr fails.
#define DL_RETURN_IF_ERROR(expr)          \
  do {                                    \
    ::diloco::Status _st = (expr);        \
    if (!_st.ok()) return _st;            \
  } while (0)

}  // namespace diloco
