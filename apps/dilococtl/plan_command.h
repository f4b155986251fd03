// dilococtl plan CONFIG [--set K=V]... [--device-memory GiB] [--json]: the per-rank memory of the
// run's learner (daemon/train/memory_plan.h), whether it fits a device and the largest per-rank
// batch that does. Exit 0 fits, 1 does not fit (the message names what dominates and what to
// change), 2 bad input (config, flags).
#pragma once

#include <limits>
#include <string>
#include <vector>

namespace diloco {

struct PlanCommand {
  std::string config_path;
  std::vector<std::string> overrides;
  // NaN (not given): on cpu the machine's MemTotal, on cuda an H200's 141 GiB.
  double device_memory_gib = std::numeric_limits<double>::quiet_NaN();
  bool json = false;  // one JSON object on stdout
};
int RunPlanCommand(const PlanCommand& cmd);

}  // namespace diloco
