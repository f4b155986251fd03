// One line format for every role (daemon, syncer, learner), on stderr:
//   <UTC time, ms>Z <who> <text>
//   2026-12-05T21:03:04.567Z dilocod[site1] job 20261205-210304-ab12: started roles: syncer
//   2026-12-05T21:03:05.012Z syncer[20261205-210304-ab12] replayed 3 published updates ...
//   2026-12-05T21:03:05.100Z learner-0 refused by the syncer: ...   (a local run: no job id)
// who is a module with its context in brackets (LogWho); text is one line.
#pragma once

#include <chrono>
#include <string>

namespace diloco {

// "2026-12-05T21:03:04.567Z".
std::string LogStamp(std::chrono::system_clock::time_point now);
// "<stamp> <who> <text>" without a newline.
std::string LogLine(const std::string& who, const std::string& text,
                    std::chrono::system_clock::time_point now = std::chrono::system_clock::now());
// "module[context]", or "module" when context is empty.
std::string LogWho(const std::string& module, const std::string& context);
// LogLine to stderr with one write, flushed (lines of several threads do not interleave).
void LogToStderr(const std::string& who, const std::string& text);

}  // namespace diloco
