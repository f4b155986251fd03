// The run of a daemon job, for `dilococtl report JOB`, `dilococtl status --watch` and the
// demo: the job's status (as the local dilocod answers `status`) names every site's run
// directory; those this machine can read are loaded as the parts of one run
// (LoadRunParts), the others become a note naming the site and its directory.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/report/run_data.h"
#include "daemon/util/status.h"

namespace diloco {

// The run directories of the job's sites, the syncer's (home shard's) site first (its config.yaml
// and merge tape), the other syncer shards' sites (their merge tapes), then the learners' sites in
// placement order. Sites whose directory is not
// readable here (another machine) go to *unreachable as "site-b: /path".
std::vector<std::string> JobRunDirs(const nlohmann::json& status, std::vector<std::string>* unreachable);

// Loads the job's run (label: the job id unless given). Fails when none of its
// directories can be read here.
Status LoadJobRun(const nlohmann::json& status, const std::string& label, RunData* out);

// The default report path of a finished job watched from this directory.
std::string DefaultJobReportPath(const std::string& job_id);

}  // namespace diloco
