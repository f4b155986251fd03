// Log lines of the transport: "2026-12-02T18:04:41.123Z [net.zap] refused ...".
// One line per event worth telling (log on change, not every message); tests capture them
// by installing a sink.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace diloco::net {

// Writes "<UTC time with ms> [<module>] <text>\n" (with a site: "[<module> <site>]") to stderr,
// or to the sink when one is set.
void NetLog(const char* module, const std::string& text);
// printf-style convenience.
void NetLogf(const char* module, const char* format, ...) __attribute__((format(printf, 2, 3)));

// Names this process's site (or learner) in every line; empty: none. Thread-safe.
void SetNetLogSite(const std::string& site);

// Replaces stderr with sink (nullptr restores stderr). Thread-safe; the sink is called under a
// lock, one whole line (without the trailing newline) at a time.
void SetNetLogSink(std::function<void(const std::string& line)> sink);

// True for counts 1, 2, 4, 8, ...: log a repeating event on those occurrences only.
inline bool LogThisOccurrence(uint64_t count) { return count != 0 && (count & (count - 1)) == 0; }

}  // namespace diloco::net
