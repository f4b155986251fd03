#include "daemon/net/net_log.h"

#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <sys/time.h>

namespace diloco::net {
namespace {

std::mutex& LogMutex() {
  static std::mutex m;
  return m;
}
std::function<void(const std::string&)>& Sink() {
  static std::function<void(const std::string&)> sink;
  return sink;
}

std::string& Site() {
  static std::string site;
  return site;
}

std::string Timestamp() {
  timeval tv;
  gettimeofday(&tv, nullptr);
  std::tm tm;
  gmtime_r(&tv.tv_sec, &tm);
  char buf[64];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03dZ", static_cast<int>(tv.tv_usec / 1000));
  return buf;
}

}  // namespace

void NetLog(const char* module, const std::string& text) {
  std::lock_guard<std::mutex> lock(LogMutex());
  std::string line = Timestamp();
  line.append(" [").append(module);
  if (!Site().empty()) line.append(" ").append(Site());
  line.append("] ").append(text);
  if (Sink()) {
    Sink()(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

void NetLogf(const char* module, const char* format, ...) {
  char buf[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  NetLog(module, buf);
}

void SetNetLogSite(const std::string& site) {
  std::lock_guard<std::mutex> lock(LogMutex());
  Site() = site;
}

void SetNetLogSink(std::function<void(const std::string& line)> sink) {
  std::lock_guard<std::mutex> lock(LogMutex());
  Sink() = std::move(sink);
}

}  // namespace diloco::net
