#include "daemon/control/job_limits.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "daemon/train/trainer.h"
#include "kernels/gpt.h"

namespace diloco {
namespace {

double Params(const RunConfig& cfg) { return (double)gpt_tensor_table(GptConfigOf(cfg.model)).total_numel(); }

std::string GiB(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

}  // namespace

uint64_t EstimateLearnerBytes(const RunConfig& cfg) {
  const ModelConfig& m = cfg.model;
  const double per_rank = 7 * 4 * Params(cfg) + 4.0 * cfg.train.batch_size * m.block_size *
                                                     (16.0 * m.n_embd * m.n_layer + 2.0 * m.vocab_size);
  return (uint64_t)(per_rank * cfg.train.ranks);
}

uint64_t EstimateSyncerBytes(const RunConfig& cfg) { return (uint64_t)((3.0 + cfg.sync.learners) * 4 * Params(cfg)); }

uint64_t MachineMemoryBytes() {
  std::ifstream f("/proc/meminfo");
  for (std::string line; std::getline(f, line);) {
    std::istringstream in(line);
    std::string key;
    uint64_t kib = 0;
    if (in >> key >> kib && key == "MemTotal:") return kib * 1024;
  }
  return 0;
}

Status CheckJobFitsMemory(const std::string& site, const RunConfig& cfg, int learners_here, bool syncer_here,
                          uint64_t memory_bytes) {
  if (memory_bytes == 0) return Status::Ok();
  const double need = (double)EstimateLearnerBytes(cfg) * learners_here + (syncer_here ? (double)EstimateSyncerBytes(cfg) : 0);
  if (need <= 0.9 * (double)memory_bytes) return Status::Ok();
  const ModelConfig& m = cfg.model;
  char model[160];
  std::snprintf(model, sizeof model, "n_layer %d, n_embd %d, block_size %d: %.3g parameters", m.n_layer, m.n_embd,
                m.block_size, Params(cfg));
  return Status::Error("site " + site + " cannot hold this job: its roles here (" + std::to_string(learners_here) +
                       " learner(s)" + (syncer_here ? " and the syncer" : "") + ") need about " + GiB(need) +
                       " (model " + model + ", batch_size " + std::to_string(cfg.train.batch_size) + ") and the site has " +
                       GiB((double)memory_bytes) + "; use a smaller model or batch, or place the roles on more sites");
}

}  // namespace diloco
