// dilococtl report: load each run directory (forgiving: damage becomes a note in the page)
// and write the overlay page. Exit 1 when a directory does not exist or the page cannot be
// written, 2 on usage errors.
#include <cstdio>
#include <vector>

#include "apps/dilococtl/job_commands.h"
#include "daemon/report/html_report.h"
#include "daemon/report/run_data.h"

namespace diloco {

int RunReportCommand(const ReportCommand& cmd) {
  if (cmd.labels.size() > cmd.run_dirs.size()) {
    std::fprintf(stderr, "dilococtl report: %zu --label for %zu run directories; give at most one per directory\n",
                 cmd.labels.size(), cmd.run_dirs.size());
    return 2;
  }
  std::vector<RunData> runs(cmd.run_dirs.size());
  for (size_t i = 0; i < cmd.run_dirs.size(); ++i) {
    const std::string label = i < cmd.labels.size() ? cmd.labels[i] : "";
    if (Status st = LoadRunDir(cmd.run_dirs[i], label, &runs[i]); !st.ok()) {
      std::fprintf(stderr, "dilococtl report: %s\n", st.message().c_str());
      return 1;
    }
    for (const std::string& note : runs[i].notes)
      std::fprintf(stderr, "dilococtl report: %s: %s\n", runs[i].dir.c_str(), note.c_str());
  }
  if (Status st = WriteHtmlReport(runs, cmd.out); !st.ok()) {
    std::fprintf(stderr, "dilococtl report: %s\n", st.message().c_str());
    return 1;
  }
  std::printf("report: %s (%zu runs)\n", cmd.out.c_str(), runs.size());
  return 0;
}

}  // namespace diloco
