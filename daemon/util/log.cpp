#include "daemon/util/log.h"

#include <cstdio>
#include <ctime>

namespace diloco {

std::string LogStamp(std::chrono::system_clock::time_point now) {
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const int ms = (int)(std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm utc;
  gmtime_r(&t, &utc);
  char stamp[80];  // room for any int the format could print (no truncation warning)
  std::snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, ms);
  return stamp;
}

std::string LogLine(const std::string& who, const std::string& text, std::chrono::system_clock::time_point now) {
  return LogStamp(now) + " " + who + " " + text;
}

std::string LogWho(const std::string& module, const std::string& context) {
  return context.empty() ? module : module + "[" + context + "]";
}

void LogToStderr(const std::string& who, const std::string& text) {
  const std::string line = LogLine(who, text) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace diloco
