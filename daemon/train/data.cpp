#include "daemon/train/data.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <utility>

#include "kernels/check.h"
#include "kernels/rng.h"

namespace diloco {
namespace fs = std::filesystem;
namespace {

constexpr size_t kBinaryProbeBytes = 8192;
constexpr size_t kReadChunkBytes = 1 << 20;

std::string quoted(const std::string& path) { return "'" + path + "'"; }

bool is_hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

// Appends the file's bytes to out. *binary is set (and nothing appended) when
// a NUL byte is in its first 8 KiB.
Status AppendFile(const std::string& path, std::vector<uint8_t>* out, bool* binary) {
  *binary = false;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr)
    return Status::Error("cannot read corpus file " + quoted(path) + ": " + std::strerror(errno) +
                         ": check its permissions");
  const size_t start = out->size();
  size_t used = start;
  bool failed = false;
  for (;;) {
    out->resize(used + kReadChunkBytes);
    const size_t got = std::fread(out->data() + used, 1, kReadChunkBytes, f);
    used += got;
    if (got < kReadChunkBytes) {
      failed = std::ferror(f) != 0;
      break;
    }
  }
  const int saved_errno = errno;
  std::fclose(f);
  out->resize(used);
  if (failed) {
    out->resize(start);
    return Status::Error("error reading corpus file " + quoted(path) + ": " +
                         std::strerror(saved_errno));
  }
  const size_t probe = std::min(kBinaryProbeBytes, used - start);
  if (std::memchr(out->data() + start, 0, probe) != nullptr) {
    *binary = true;
    out->resize(start);
  }
  return Status::Ok();
}

// Every regular file under dir, sorted by path, hidden names skipped, each
// file once even if linked under several names.
Status ListTextCandidates(const std::string& dir, std::vector<std::string>* files) {
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec);
  std::vector<fs::path> found;
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const fs::directory_entry& entry = *it;
    std::error_code entry_ec;  // a broken symlink is skipped, not an error
    if (is_hidden(entry.path())) {
      if (entry.is_directory(entry_ec)) it.disable_recursion_pending();
      continue;
    }
    if (entry.is_regular_file(entry_ec)) found.push_back(entry.path());
  }
  if (ec)
    return Status::Error("cannot list corpus directory " + quoted(dir) + ": " + ec.message() +
                         ": check its permissions");
  std::sort(found.begin(), found.end());
  std::set<std::pair<dev_t, ino_t>> seen;
  for (const fs::path& p : found) {
    struct stat st;
    if (::stat(p.c_str(), &st) == 0 && !seen.insert({st.st_dev, st.st_ino}).second) continue;
    files->push_back(p.string());
  }
  return Status::Ok();
}

Status CheckOptions(const CorpusOptions& o) {
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    return Status::Error("val_fraction is " + std::to_string(o.val_fraction) +
                         ": it must be in [0, 1)");
  if (o.block_size < 1)
    return Status::Error("block_size is " + std::to_string(o.block_size) + ": it must be >= 1");
  if (o.num_learners < 1 || o.learner < 0 || o.learner >= o.num_learners)
    return Status::Error("learner " + std::to_string(o.learner) + " of " +
                         std::to_string(o.num_learners) + ": need 0 <= learner < num_learners");
  return Status::Ok();
}

}  // namespace

Status Corpus::Load(const std::string& path, const CorpusOptions& options,
                    std::unique_ptr<Corpus>* out) {
  DL_RETURN_IF_ERROR(CheckOptions(options).WithContext("corpus " + quoted(path)));
  std::unique_ptr<Corpus> corpus(new Corpus());

  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    return Status::Error("cannot access corpus " + quoted(path) + ": " + ec.message());
  if (!fs::exists(st))
    return Status::Error("corpus " + quoted(path) +
                         " does not exist: give a text file or a directory of text files");

  if (fs::is_directory(st)) {
    std::vector<std::string> files;
    DL_RETURN_IF_ERROR(ListTextCandidates(path, &files));
    for (const std::string& file : files) {
      bool binary = false;
      DL_RETURN_IF_ERROR(AppendFile(file, &corpus->bytes_, &binary));
      if (binary) {
        corpus->files_skipped_++;
      } else {
        corpus->files_read_++;
      }
    }
    if (corpus->files_read_ == 0)
      return Status::Error("corpus directory " + quoted(path) + " has no text files (" +
                           std::to_string(corpus->files_skipped_) +
                           " binary files skipped): put .txt files in it or point at another");
  } else if (fs::is_regular_file(st)) {
    bool binary = false;
    DL_RETURN_IF_ERROR(AppendFile(path, &corpus->bytes_, &binary));
    if (binary)
      return Status::Error("corpus " + quoted(path) +
                           " is not a text file (a NUL byte in its first 8 KiB): "
                           "give a text file or a directory of text files");
    if (corpus->bytes_.empty())
      return Status::Error("corpus " + quoted(path) + " is empty: give a non-empty text file");
    corpus->files_read_ = 1;
  } else {
    return Status::Error("corpus " + quoted(path) +
                         " is neither a regular file nor a directory: "
                         "give a text file or a directory of text files");
  }

  const size_t total = corpus->bytes_.size();
  const size_t need = (size_t)options.block_size + 1;
  const std::string need_str = "it needs at least block_size + 1 = " + std::to_string(need);
  if (total < need)
    return Status::Error("corpus " + quoted(path) + " has " + std::to_string(total) + " bytes; " +
                         need_str + ": use a larger corpus or a smaller model.block_size");

  const size_t val_bytes = (size_t)std::floor((double)total * options.val_fraction);
  if (options.val_fraction > 0 && val_bytes < need)
    return Status::Error("corpus " + quoted(path) + " has " + std::to_string(val_bytes) +
                         " bytes of validation data (val_fraction " +
                         std::to_string(options.val_fraction) + " of " + std::to_string(total) +
                         " bytes); " + need_str +
                         ": use a larger corpus, a larger val_fraction or a smaller "
                         "model.block_size");

  const size_t train_bytes = total - val_bytes;
  const size_t m = (size_t)options.num_learners, i = (size_t)options.learner;
  const size_t begin = train_bytes * i / m, end = train_bytes * (i + 1) / m;
  if (end - begin < need)
    return Status::Error("corpus " + quoted(path) + " has " + std::to_string(end - begin) +
                         " bytes of training data for learner " + std::to_string(i) + " of " +
                         std::to_string(m) + "; " + need_str +
                         ": use a larger corpus or a smaller model.block_size");

  const std::span<const uint8_t> all(corpus->bytes_);
  corpus->train_ = all.subspan(begin, end - begin);
  corpus->val_ = all.subspan(train_bytes, val_bytes);
  *out = std::move(corpus);
  return Status::Ok();
}

BatchSampler::BatchSampler(std::span<const uint8_t> data, int batch_size, int block_size,
                           uint64_t seed)
    : data_(data), batch_size_(batch_size), block_size_(block_size), seed_(seed) {
  DL_CHECK(batch_size > 0 && block_size > 0, "batch %d, block %d", batch_size, block_size);
  DL_CHECK(data.size() >= (size_t)block_size + 1, "%zu bytes for block_size %d", data.size(),
           block_size);
}

void BatchSampler::Sample(long step, int* inputs, int* targets) const {
  const size_t T = block_size_;
  const size_t num_starts = data_.size() - T;  // starts in [0, size - T - 1]
  // Seeded by (seed, step) alone, so batches never depend on earlier calls.
  Rng rng(mix_seed(seed_, (uint64_t)step));
  for (int b = 0; b < batch_size_; b++) {
    const uint8_t* window = data_.data() + rng.below(num_starts);
    int* in = inputs + (size_t)b * T;
    int* tg = targets + (size_t)b * T;
    for (size_t t = 0; t < T; t++) {
      in[t] = window[t];
      tg[t] = window[t + 1];
    }
  }
}

}  // namespace diloco
