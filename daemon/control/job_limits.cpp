#include "daemon/control/job_limits.h"

#include <cstdio>
#include <filesystem>
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

namespace {

bool Under(const std::filesystem::path& p, const std::vector<std::string>& roots) {
  const std::string s = p.string();
  for (const std::string& root : roots)
    if (s == root || (s.size() > root.size() && s.compare(0, root.size(), root) == 0 &&
                      (root.back() == '/' || s[root.size()] == '/')))
      return true;
  return false;
}

}  // namespace

Status CheckCorpusAllowed(const std::string& site, const std::string& corpus, const std::vector<std::string>& listed,
                          const std::string& config_source) {
  namespace fs = std::filesystem;
  std::vector<std::string> roots;  // symlinks followed, as the corpus's path will be
  for (const std::string& r : listed) {
    std::error_code ec;
    const fs::path c = fs::weakly_canonical(r, ec);
    if (!ec) roots.push_back(c.string());
  }
  if (roots.empty()) {
    return Status::Error("site " + site + " reads no corpus: its config (" + config_source +
                         ") lists no data_roots; add data_roots: [DIR, ...] naming the directories corpora live under");
  }
  std::string allowed;
  for (const std::string& r : listed) allowed += (allowed.empty() ? "" : ", ") + r;
  std::error_code ec;
  const fs::path resolved = fs::weakly_canonical(corpus, ec);
  if (ec || !Under(resolved, roots)) {
    return Status::Error("site " + site + " refuses data.corpus '" + corpus + "'" +
                         (ec ? "" : " (it resolves to " + resolved.string() + ")") +
                         ": not under its data_roots (" + allowed + ")");
  }
  if (!fs::is_directory(resolved, ec)) return Status::Ok();
  size_t seen = 0;
  for (fs::recursive_directory_iterator it(resolved, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec)) {
    if (++seen > 1000000) return Status::Error("site " + site + ": data.corpus '" + corpus + "' holds over a million entries");
    const fs::path target = fs::weakly_canonical(it->path(), ec);
    if (ec) break;
    if (!Under(target, roots)) {
      return Status::Error("site " + site + " refuses data.corpus '" + corpus + "': " + it->path().string() +
                           " leads to " + target.string() + ", outside its data_roots (" + allowed + ")");
    }
  }
  if (ec) return Status::Error("site " + site + ": cannot list data.corpus '" + corpus + "': " + ec.message());
  return Status::Ok();
}

Status CheckDaemonCanRun(const RunConfig& cfg, const std::string& config_source) {
  if (cfg.sync.mode == SyncMode::kDdp)
    return Status::Refused(config_source + ": sync.mode ddp averages gradients every step in one ring of threads, with "
                                         "no syncer, so it cannot be a daemon job; run it with `dilococtl train`, or "
                                         "submit diloco, streaming or decoupled");
  if (cfg.sync.clock == ClockSource::kVirtual)
    return Status::Refused(config_source + ": sync.clock virtual runs every role in one process on virtual time; run it "
                                         "with `dilococtl train`, or submit with sync.clock: wall");
  return Status::Ok();
}

}  // namespace diloco
