// What a site refuses before it starts a job's roles, so a job it cannot hold fails at submit with
// a message instead of taking the daemon down (bad_alloc in its main thread).
//
// Memory: an estimate of the bytes the roles placed on this site allocate, against the machine's
// memory. Per parameter, a learner keeps fp32 weights, gradients, two AdamW moments, the shared
// initial model, its per-fragment bases and error feedback (7 x 4 bytes) per rank, plus
// activations of about B x T x (16 x C x n_layer + 2 x V) floats per rank; the syncer keeps the
// global model, its outer momentum, the initial model and up to M pending decoded deltas
// ((3 + M) x 4 bytes). Only CPU memory is counted (a GPU learner's device memory is checked when
// its ring starts).
#pragma once

#include <cstdint>
#include <string>

#include "daemon/config/run_config.h"
#include "daemon/util/status.h"

namespace diloco {

uint64_t EstimateLearnerBytes(const RunConfig& cfg);
uint64_t EstimateSyncerBytes(const RunConfig& cfg);
// The machine's memory (MemTotal of /proc/meminfo); 0 when unknown.
uint64_t MachineMemoryBytes();

// learners_here learners and (syncer_here) the syncer of cfg on `site`, against memory_bytes
// (0: not checked): an error naming the model, the estimate and what the site has.
Status CheckJobFitsMemory(const std::string& site, const RunConfig& cfg, int learners_here, bool syncer_here,
                          uint64_t memory_bytes);

// What a daemon job cannot run, refused at submit with what to do instead: sync.mode ddp (one
// process ring averaging gradients every step, no syncer: `dilococtl train`) and sync.clock
// virtual (virtual time is for local runs: `dilococtl train`).
Status CheckDaemonCanRun(const RunConfig& cfg, const std::string& config_source);

// A job's corpus on a site with these data_roots (canonical directories): the path, symlinks
// followed, must lie under one of them, and so must every file under it when it is a directory
// (a symlink inside a root cannot lead out). No roots: every corpus is refused, with what to add.
Status CheckCorpusAllowed(const std::string& site, const std::string& corpus, const std::vector<std::string>& roots,
                          const std::string& config_source);

}  // namespace diloco
