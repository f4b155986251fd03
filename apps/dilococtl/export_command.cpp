// dilococtl export: a model (checkpoint file, run directory, or a job's run directory on this
// site) as a safetensors file in nanoGPT's or Hugging Face GPT-2's layout
// (daemon/export/export_run.h). A job's merged model is on its syncer's site.
#include <cstdio>

#include "apps/dilococtl/job_commands.h"
#ifdef DILOCO_HAVE_EXPORT
#include "apps/dilococtl/model_arg.h"
#include "daemon/export/export_run.h"
#endif

namespace diloco {

int RunExportCommand(const ExportCommand& cmd) {
  if (cmd.format != "safetensors") {
    std::fprintf(stderr, "dilococtl export: --format %s is not supported; use --format safetensors\n",
                 cmd.format.c_str());
    return 2;
  }
  if (cmd.out.empty()) {
    std::fprintf(stderr, "dilococtl export: -o FILE is required\n");
    return 2;
  }
#ifdef DILOCO_HAVE_EXPORT
  ExportLayout layout;
  if (!ParseExportLayout(cmd.layout, &layout)) {
    std::fprintf(stderr, "dilococtl export: --layout %s is not supported; use nanogpt or hf-gpt2\n", cmd.layout.c_str());
    return 2;
  }
  ModelArgument arg;
  bool usage = false;
  if (Status st = ResolveModelArgument(cmd.model, cmd.daemon, &arg, &usage); !st.ok()) {
    std::fprintf(stderr, "dilococtl export: %s\n", st.message().c_str());
    return usage ? 2 : 1;
  }
  ModelSource source;
  ExportSummary summary;
  Status st = OpenModelArgument(arg, &source);
  if (st.ok()) st = ExportModel(source, cmd.out, layout, &summary);
  if (!st.ok()) {
    std::fprintf(stderr, "dilococtl export: %s\n", st.message().c_str());
    return 1;
  }
  if (cmd.json) {
    std::printf("%s\n", ExportSummaryObject(summary).dump().c_str());
  } else {
    std::printf("%s\n", ExportSummaryLine(summary).c_str());
  }
  return 0;
#else
  std::fprintf(stderr, "dilococtl export: this build has no exporter (daemon/export)\n");
  return 1;
#endif
}

}  // namespace diloco
