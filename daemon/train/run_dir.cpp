#include "daemon/train/run_dir.h"

#include <cstdlib>
#include <filesystem>

#include "daemon/sync/protocol.h"  // LearnerName
#include "daemon/util/atomic_file.h"

namespace diloco {

namespace fs = std::filesystem;

Status PrepareRunDir(const std::string& run_dir, const RunConfig& config) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec) return Status::Error("cannot create run directory '" + run_dir + "': " + ec.message());
  const std::string text = RunConfigToYaml(config);
  return WriteFileAtomically((fs::path(run_dir) / "config.yaml").string(), {{text.data(), text.size()}},
                             "run config");
}

std::string LearnerStepPath(const std::string& run_dir, int learner) {
  return (fs::path(run_dir) / (LearnerName(learner) + ".step")).string();
}

std::string LearnerCheckpointPath(const std::string& run_dir, int learner) {
  return (fs::path(run_dir) / (LearnerName(learner) + ".ckpt")).string();
}

Status SaveLearnerStep(const std::string& run_dir, int learner, long step) {
  const std::string text = std::to_string(step) + "\n";
  return WriteFileAtomically(LearnerStepPath(run_dir, learner), {{text.data(), text.size()}}, "learner step");
}

Status ReadLearnerStep(const std::string& run_dir, int learner, long* step) {
  *step = 0;
  const std::string path = LearnerStepPath(run_dir, learner);
  if (!fs::exists(path)) return Status::Ok();
  std::string text;
  DL_RETURN_IF_ERROR(ReadWholeFile(path, "learner step", &text));
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || v < 0 || (*end != '\n' && *end != '\0'))
    return Status::Error("cannot resume: '" + path + "' does not hold a step number; delete it to restart " +
                         LearnerName(learner) + " from step 0");
  *step = v;
  return Status::Ok();
}

std::string LearnerMetricsPath(const std::string& run_dir, int learner) {
  return (fs::path(run_dir) / (LearnerName(learner) + ".jsonl")).string();
}

Status LearnerMetricsFiles::Open(const std::string& run_dir, int learners) {
  files_.clear();
  for (int i = 0; i < learners; i++) {
    files_.push_back(std::make_unique<File>());
    DL_RETURN_IF_ERROR(files_.back()->writer.Open(LearnerMetricsPath(run_dir, i)));
  }
  return Status::Ok();
}

}  // namespace diloco
