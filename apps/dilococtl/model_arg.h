// The model argument of `dilococtl eval` and `dilococtl export`: CHECKPOINT | RUN_DIR | JOB.
// A path that exists is opened as it is (daemon/export/model_source.h); anything else that looks
// like a job id is asked of the local dilocod (`status`), which gives the job's run directory on
// this site and, when the learners reported them, the training steps.
#pragma once

#include <string>

#include "apps/dilococtl/job_commands.h"
#include "daemon/export/model_source.h"
#include "daemon/util/status.h"

namespace diloco {

struct ModelArgument {
  std::string path;             // a checkpoint file or a run directory
  ModelSourceOptions options;   // the job id and training steps a daemon reported
  bool from_job = false;
  std::string syncer_site;      // JOB: the site that holds the merged model
};

// usage: set when the failure is the command line's (an unknown job): exit 2, else 1.
Status ResolveModelArgument(const std::string& arg, const DaemonRef& daemon, ModelArgument* out, bool* usage);

// Opens the argument; for a JOB whose run directory here holds no model, the error says which
// site to run on.
Status OpenModelArgument(const ModelArgument& arg, ModelSource* out);

}  // namespace diloco
