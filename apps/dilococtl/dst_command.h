// `dilococtl dst`: deterministic simulation testing of the learner and syncer cores
// (daemon/virt/dst.h) over many seeds, or one seed replayed.
#pragma once

#include <cstdint>
#include <string>

namespace diloco {

struct DstCommand {
  int seeds = 100;          // seeds first .. first + seeds - 1
  uint64_t first = 1;
  uint64_t seed = 0;        // > 0: this one seed only, described in full
  std::string config;       // a run config to draw over (its model and corpus); empty: the tiny built-in one
  std::string scratch;      // where cases run; empty: a fresh temp directory (removed at the end)
  bool json = false;        // last stdout line: {"seeds", "violations", "seeds_per_s", ...}
};
int RunDstCommand(const DstCommand& cmd);

}  // namespace diloco
