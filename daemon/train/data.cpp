#include "daemon/train/data.h"

#include <sys/stat.h>

#include <algorithm>
#include <bit>
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

// llm.c's token file header (dev/data/data_common.py): 256 int32, then the tokens.
constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;
constexpr size_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

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

bool has_bin_extension(const fs::path& p) {
  const std::string name = p.filename().string();
  return name.size() > 4 && name.compare(name.size() - 4, 4, ".bin") == 0;
}

int32_t LoadLittleInt32(const uint8_t* p) {
  return static_cast<int32_t>(uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
}

// "token file 'f' at byte 12: reason".
Status TokenFileError(const std::string& path, uint64_t offset, const std::string& reason) {
  return Status::Error("token file " + quoted(path) + " at byte " + std::to_string(offset) + ": " + reason);
}

// Appends the tokens of one token file (llm.c's header layout or nanoGPT's raw uint16; data.h) to
// out, checking the layout and that every token is below vocab_size. On error out is unchanged.
Status AppendTokenFile(const std::string& path, int vocab_size, std::vector<uint16_t>* out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr)
    return Status::Error("cannot read token file " + quoted(path) + ": " + std::strerror(errno) +
                         ": check its permissions");
  struct FileCloser {
    FILE* f;
    ~FileCloser() { std::fclose(f); }
  } closer{f};
  struct stat st;
  if (::fstat(fileno(f), &st) != 0)
    return Status::Error("cannot stat token file " + quoted(path) + ": " + std::strerror(errno));
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);

  // The layout: the magic in the first 4 bytes means llm.c's header.
  uint8_t header[kLlmcHeaderBytes] = {};
  const size_t probe = std::fread(header, 1, std::min<uint64_t>(file_bytes, kLlmcHeaderBytes), f);
  if (probe != std::min<uint64_t>(file_bytes, kLlmcHeaderBytes))
    return Status::Error("error reading token file " + quoted(path) + ": " + std::strerror(errno));
  uint64_t data_offset = 0, count = 0;
  if (file_bytes >= 4 && LoadLittleInt32(header) == kLlmcMagic) {
    if (file_bytes < kLlmcHeaderBytes)
      return TokenFileError(path, 0,
                            "starts with llm.c's magic 20240520 but has " + std::to_string(file_bytes) +
                                " bytes, less than its 1024-byte header: the file is truncated");
    const int32_t version = LoadLittleInt32(header + 4);
    if (version != kLlmcVersion)
      return TokenFileError(path, 4,
                            "llm.c header version is " + std::to_string(version) +
                                ", expected 1 (uint16 GPT-2 tokens); version 2 (llama-3 uint32 tokens) "
                                "is not supported");
    const int32_t n = LoadLittleInt32(header + 8);
    if (n < 0 || file_bytes != kLlmcHeaderBytes + 2 * static_cast<uint64_t>(n))
      return TokenFileError(path, 8,
                            "llm.c header says " + std::to_string(n) + " tokens, so the file should have 1024 + 2 * " +
                                std::to_string(n) + " = " + std::to_string((int64_t)kLlmcHeaderBytes + 2 * (int64_t)n) +
                                " bytes, but it has " + std::to_string(file_bytes) +
                                ": the file is truncated or not an llm.c token file");
    data_offset = kLlmcHeaderBytes;
    count = static_cast<uint64_t>(n);
  } else {
    if (file_bytes % 2 != 0)
      return TokenFileError(path, file_bytes - 1,
                            "odd length of " + std::to_string(file_bytes) +
                                " bytes: a raw token file (no llm.c header) holds 2-byte uint16 tokens, so the "
                                "last byte is left over; the file is truncated or not a token file");
    count = file_bytes / 2;
  }

  const size_t start = out->size();
  out->resize(start + count);
  uint16_t* tokens = out->data() + start;
  if (std::fseek(f, static_cast<long>(data_offset), SEEK_SET) != 0 || std::fread(tokens, 2, count, f) != count) {
    const int saved_errno = errno;
    out->resize(start);
    return Status::Error("error reading token file " + quoted(path) + ": " +
                         (std::ferror(f) ? std::strerror(saved_errno) : "it shrank while being read"));
  }
  if constexpr (std::endian::native == std::endian::big) {
    for (size_t i = 0; i < count; i++) tokens[i] = static_cast<uint16_t>(tokens[i] << 8 | tokens[i] >> 8);
  }
  for (size_t i = 0; i < count; i++) {
    if (tokens[i] >= vocab_size) {
      const int token = tokens[i];
      out->resize(start);
      return TokenFileError(path, data_offset + 2 * i,
                            "token " + std::to_string(token) + " is not below model.vocab_size " +
                                std::to_string(vocab_size) +
                                ": set vocab_size to the tokenizer's (50257 for GPT-2) or check that this is a "
                                "uint16 token file");
    }
  }
  return Status::Ok();
}

// Every non-hidden regular file under dir, sorted by path, each file once even if linked under
// several names. With bin_only, files whose names do not end in ".bin" are left out and counted in
// *skipped.
Status ListFiles(const std::string& dir, bool bin_only, std::vector<std::string>* files, int* skipped) {
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
    if (!entry.is_regular_file(entry_ec)) continue;
    if (bin_only && !has_bin_extension(entry.path())) {
      (*skipped)++;
      continue;
    }
    found.push_back(entry.path());
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
  if (o.format == DataFormat::kTokens && (o.vocab_size < 2 || o.vocab_size > 65536))
    return Status::Error("vocab_size is " + std::to_string(o.vocab_size) +
                         ": it must be in [2, 65536] for uint16 token files");
  return Status::Ok();
}

}  // namespace

Status Corpus::Load(const std::string& path, const CorpusOptions& options, std::unique_ptr<Corpus>* out) {
  DL_RETURN_IF_ERROR(CheckOptions(options).WithContext("corpus " + quoted(path)));
  std::unique_ptr<Corpus> corpus(new Corpus());
  const bool tokens = options.format == DataFormat::kTokens;
  corpus->format_ = options.format;
  const std::string give = tokens ? "give a uint16 token file (.bin) or a directory of them"
                                  : "give a text file or a directory of text files";

  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    return Status::Error("cannot access corpus " + quoted(path) + ": " + ec.message());
  if (!fs::exists(st)) return Status::Error("corpus " + quoted(path) + " does not exist: " + give);

  if (fs::is_directory(st)) {
    std::vector<std::string> files;
    DL_RETURN_IF_ERROR(ListFiles(path, tokens, &files, &corpus->files_skipped_));
    for (const std::string& file : files) {
      if (tokens) {
        DL_RETURN_IF_ERROR(AppendTokenFile(file, options.vocab_size, &corpus->tokens_));
        corpus->files_read_++;
        continue;
      }
      bool binary = false;
      DL_RETURN_IF_ERROR(AppendFile(file, &corpus->bytes_, &binary));
      if (binary) {
        corpus->files_skipped_++;
      } else {
        corpus->files_read_++;
      }
    }
    if (corpus->files_read_ == 0 && tokens)
      return Status::Error("corpus directory " + quoted(path) + " has no .bin token files (" +
                           std::to_string(corpus->files_skipped_) +
                           " other files skipped): put nanoGPT's or llm.c's .bin files in it or point at another");
    if (corpus->files_read_ == 0)
      return Status::Error("corpus directory " + quoted(path) + " has no text files (" +
                           std::to_string(corpus->files_skipped_) +
                           " binary files skipped): put .txt files in it or point at another");
  } else if (fs::is_regular_file(st) && tokens) {
    DL_RETURN_IF_ERROR(AppendTokenFile(path, options.vocab_size, &corpus->tokens_));
    corpus->files_read_ = 1;
  } else if (fs::is_regular_file(st)) {
    bool binary = false;
    DL_RETURN_IF_ERROR(AppendFile(path, &corpus->bytes_, &binary));
    if (binary)
      return Status::Error("corpus " + quoted(path) +
                           " is not a text file (a NUL byte in its first 8 KiB): "
                           "give a text file or a directory of text files, or set data.format: tokens for a "
                           "token file");
    if (corpus->bytes_.empty())
      return Status::Error("corpus " + quoted(path) + " is empty: give a non-empty text file");
    corpus->files_read_ = 1;
  } else {
    return Status::Error("corpus " + quoted(path) + " is neither a regular file nor a directory: " + give);
  }

  // From here on a token is a token, whichever its width; messages count in the format's unit.
  const std::string unit = tokens ? " tokens" : " bytes";
  const size_t total = corpus->total_tokens();
  const size_t need = (size_t)options.block_size + 1;
  const std::string need_str = "it needs at least block_size + 1 = " + std::to_string(need);
  if (total < need)
    return Status::Error("corpus " + quoted(path) + " has " + std::to_string(total) + unit + "; " + need_str +
                         ": use a larger corpus or a smaller model.block_size");

  const size_t val_size = (size_t)std::floor((double)total * options.val_fraction);
  if (options.val_fraction > 0 && val_size < need)
    return Status::Error("corpus " + quoted(path) + " has " + std::to_string(val_size) + unit +
                         " of validation data (val_fraction " + std::to_string(options.val_fraction) + " of " +
                         std::to_string(total) + unit + "); " + need_str +
                         ": use a larger corpus, a larger val_fraction or a smaller "
                         "model.block_size");

  const size_t train_size = total - val_size;
  const size_t m = (size_t)options.num_learners, i = (size_t)options.learner;
  const size_t begin = train_size * i / m, end = train_size * (i + 1) / m;
  if (end - begin < need)
    return Status::Error("corpus " + quoted(path) + " has " + std::to_string(end - begin) + unit +
                         " of training data for learner " + std::to_string(i) + " of " + std::to_string(m) + "; " +
                         need_str + ": use a larger corpus or a smaller model.block_size");

  const TokenSpan all = tokens ? TokenSpan(std::span<const uint16_t>(corpus->tokens_))
                               : TokenSpan(std::span<const uint8_t>(corpus->bytes_));
  corpus->train_ = all.subspan(begin, end - begin);
  corpus->val_ = all.subspan(train_size, val_size);
  *out = std::move(corpus);
  return Status::Ok();
}

TokenSpan TokenSpan::subspan(size_t offset, size_t count) const {
  DL_CHECK(offset <= size_ && count <= size_ - offset, "subspan [%zu, +%zu) of %zu tokens", offset, count, size_);
  TokenSpan out = *this;
  out.data_ = static_cast<const uint8_t*>(data_) + offset * width_;
  out.size_ = count;
  return out;
}

std::span<const uint8_t> TokenSpan::bytes() const {
  DL_CHECK(width_ == 1, "a uint16 token corpus read as bytes; use Corpus::train_tokens() / val_tokens()");
  return {static_cast<const uint8_t*>(data_), size_};
}

std::span<const uint16_t> TokenSpan::tokens() const {
  DL_CHECK(width_ == 2, "a byte corpus read as uint16 tokens");
  return {static_cast<const uint16_t*>(data_), size_};
}

namespace {

// Fills rows of T inputs and targets from windows of data; one template for both widths so that the
// byte path stays as tight as before.
template <typename Token>
void FillRows(const Token* data, size_t num_starts, size_t T, int rows, Rng* rng, int* inputs, int* targets) {
  for (int b = 0; b < rows; b++) {
    const Token* window = data + rng->below(num_starts);
    int* in = inputs + (size_t)b * T;
    int* tg = targets + (size_t)b * T;
    for (size_t t = 0; t < T; t++) {
      in[t] = window[t];
      tg[t] = window[t + 1];
    }
  }
}

}  // namespace

BatchSampler::BatchSampler(TokenSpan data, int batch_size, int block_size, uint64_t seed)
    : data_(data), batch_size_(batch_size), block_size_(block_size), seed_(seed) {
  DL_CHECK(batch_size > 0 && block_size > 0, "batch %d, block %d", batch_size, block_size);
  DL_CHECK(data.size() >= (size_t)block_size + 1, "%zu tokens for block_size %d", data.size(), block_size);
}

void BatchSampler::Sample(long step, int* inputs, int* targets) const {
  SampleRows(step, 0, batch_size_, inputs, targets);
}

void BatchSampler::SampleRows(long step, int row_begin, int rows, int* inputs, int* targets) const {
  DL_CHECK(row_begin >= 0 && rows >= 0 && row_begin + rows <= batch_size_, "rows [%d, +%d) of a batch of %d",
           row_begin, rows, batch_size_);
  const size_t T = block_size_;
  const size_t num_starts = data_.size() - T;  // starts in [0, size - T - 1]
  // Seeded by (seed, step) alone, so batches never depend on earlier calls. Row b takes the b-th
  // draw, so the rows before row_begin are drawn and dropped.
  Rng rng(mix_seed(seed_, (uint64_t)step));
  for (int b = 0; b < row_begin; b++) rng.below(num_starts);
  if (data_.width() == 1) {
    FillRows(data_.bytes().data(), num_starts, T, rows, &rng, inputs, targets);
  } else {
    FillRows(data_.tokens().data(), num_starts, T, rows, &rng, inputs, targets);
  }
}

}  // namespace diloco
