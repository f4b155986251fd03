#include "daemon/train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "daemon/util/atomic_file.h"
#include "daemon/util/crc32c.h"

namespace diloco {
namespace {

// Floats are written as their in-memory bytes.
static_assert(std::endian::native == std::endian::little, "checkpoints assume little-endian");

constexpr uint32_t kDtypeFloat32 = 1;
constexpr size_t kHeaderCrcOffset = 80;

struct Header {
  uint32_t version = kCheckpointVersion;
  uint32_t dtype = kDtypeFloat32;
  GptConfig model;
  int64_t step = 0;
  int64_t adam_step = 0;
  uint64_t num_params = 0;
  uint64_t table_digest = 0;
  uint64_t yaml_bytes = 0;
  uint32_t body_crc = 0;
};

// Little-endian field cursor over the 84 header bytes.
class HeaderBytes {
 public:
  uint8_t* data() { return bytes_; }
  const uint8_t* data() const { return bytes_; }
  void put(uint64_t v, int n) {
    for (int i = 0; i < n; i++) bytes_[pos_++] = (uint8_t)(v >> (8 * i));
  }
  uint64_t get(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)bytes_[pos_++] << (8 * i);
    return v;
  }
  void seek(size_t pos) { pos_ = pos; }

 private:
  uint8_t bytes_[kCheckpointHeaderBytes] = {};
  size_t pos_ = 0;
};

void EncodeHeader(const Header& h, HeaderBytes* b) {
  std::memcpy(b->data(), kCheckpointMagic, 8);
  b->seek(8);
  b->put(h.version, 4);
  b->put(h.dtype, 4);
  for (int v :
       {h.model.vocab_size, h.model.block_size, h.model.n_layer, h.model.n_embd, h.model.n_head})
    b->put((uint32_t)v, 4);
  b->put((uint64_t)h.step, 8);
  b->put((uint64_t)h.adam_step, 8);
  b->put(h.num_params, 8);
  b->put(h.table_digest, 8);
  b->put(h.yaml_bytes, 8);
  b->put(h.body_crc, 4);
  b->put(Crc32c(b->data(), kHeaderCrcOffset), 4);
}

// Decodes everything after the magic; returns the stored header CRC.
uint32_t DecodeHeader(HeaderBytes* b, Header* h) {
  b->seek(8);
  h->version = (uint32_t)b->get(4);
  h->dtype = (uint32_t)b->get(4);
  for (int* v : {&h->model.vocab_size, &h->model.block_size, &h->model.n_layer, &h->model.n_embd,
                 &h->model.n_head})
    *v = (int32_t)(uint32_t)b->get(4);
  h->step = (int64_t)b->get(8);
  h->adam_step = (int64_t)b->get(8);
  h->num_params = b->get(8);
  h->table_digest = b->get(8);
  h->yaml_bytes = b->get(8);
  h->body_crc = (uint32_t)b->get(4);
  return (uint32_t)b->get(4);
}

std::string Quoted(const std::string& path) { return "'" + path + "'"; }

std::string Errno(int err) { return std::strerror(err); }

// Reads exactly n bytes; *got says how many arrived before EOF.
Status ReadAll(int fd, void* data, size_t n, size_t* got, const std::string& path) {
  char* p = static_cast<char*>(data);
  *got = 0;
  while (*got < n) {
    const ssize_t r = ::read(fd, p + *got, std::min(n - *got, (size_t)1 << 30));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::Error("cannot read checkpoint " + Quoted(path) + ": " + Errno(errno));
    if (r == 0) break;
    *got += (size_t)r;
  }
  return Status::Ok();
}

// A moment buffer, or num_params zeros when it is empty.



// Rejects configs no Gpt could have been built from, before building its
// tensor table (bounds keep 4 * n_embd and the table size sane).
Status CheckConfig(const GptConfig& c) {
  const bool ok = c.vocab_size > 0 && c.vocab_size <= (1 << 24) && c.block_size > 0 &&
                  c.block_size <= (1 << 24) && c.n_layer >= 0 && c.n_layer <= 4096 &&
                  c.n_embd > 0 && c.n_embd <= (1 << 20) && c.n_head > 0 && c.n_embd % c.n_head == 0;
  if (ok) return Status::Ok();
  return Status::Error("invalid GptConfig (vocab_size " + std::to_string(c.vocab_size) +
                       ", block_size " + std::to_string(c.block_size) + ", n_layer " +
                       std::to_string(c.n_layer) + ", n_embd " + std::to_string(c.n_embd) +
                       ", n_head " + std::to_string(c.n_head) + ")");
}

// Reads and verifies everything after open().
Status LoadFrom(int fd, const std::string& path, Checkpoint* out) {
  const std::string name = "checkpoint " + Quoted(path);
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::Error("cannot stat " + name + ": " + Errno(errno));
  const uint64_t file_bytes = (uint64_t)st.st_size;

  HeaderBytes bytes;
  size_t got = 0;
  DL_RETURN_IF_ERROR(ReadAll(fd, bytes.data(), kCheckpointHeaderBytes, &got, path));
  if (got == 0) return Status::Error(name + " is empty: not a checkpoint");
  if (std::memcmp(bytes.data(), kCheckpointMagic, std::min<size_t>(got, 8)) != 0)
    return Status::Error(name + " is not a checkpoint (bad magic; expected \"DLCKPT01\")");
  if (got < kCheckpointHeaderBytes)
    return Status::Error(name + " is truncated: " + std::to_string(kCheckpointHeaderBytes - got) +
                         " bytes missing (the file has " + std::to_string(got) +
                         " bytes, the header alone needs " +
                         std::to_string(kCheckpointHeaderBytes) + ")");
  Header h;
  const uint32_t header_crc = DecodeHeader(&bytes, &h);
  if (h.version != kCheckpointVersion)
    return Status::Error(name + " has format version " + std::to_string(h.version) +
                         "; this build reads version " + std::to_string(kCheckpointVersion) +
                         ": use a matching dilocod");
  if (header_crc != Crc32c(bytes.data(), kHeaderCrcOffset))
    return Status::Error(name + " is corrupt: header CRC mismatch");
  if (h.dtype != kDtypeFloat32)
    return Status::Error(name + " has dtype " + std::to_string(h.dtype) +
                         "; this build reads only 1 (float32)");
  DL_RETURN_IF_ERROR(CheckConfig(h.model).WithContext(name));
  const TensorTable table = gpt_tensor_table(h.model);
  if (h.num_params != table.total_numel())
    return Status::Error(name + " says " + std::to_string(h.num_params) +
                         " parameters but its GptConfig has " +
                         std::to_string(table.total_numel()) + ": corrupt or foreign file");
  if (h.table_digest != table.digest())
    return Status::Error(name +
                         " has a different tensor layout (table digest) than this "
                         "build gives its GptConfig: written by an incompatible version");

  // Sizes are checked against the file before anything is allocated.
  const unsigned __int128 want = (unsigned __int128)kCheckpointHeaderBytes + h.yaml_bytes +
                                 (unsigned __int128)12 * h.num_params;
  if (want > file_bytes) {
    const unsigned __int128 missing = want - file_bytes;
    const std::string missing_str =
        missing > UINT64_MAX ? "more than 2^64" : std::to_string((uint64_t)missing);
    return Status::Error(name + " is truncated: " + missing_str + " bytes missing (the file has " +
                         std::to_string(file_bytes) + " bytes; its header describes more)");
  }
  if (want < file_bytes)
    return Status::Error(name + " has " + std::to_string(file_bytes - (uint64_t)want) +
                         " unexpected bytes after its body: corrupt");

  const size_t n = h.num_params;
  Checkpoint ckpt;
  ckpt.model = h.model;
  ckpt.step = h.step;
  ckpt.optimizer.step = h.adam_step;
  ckpt.config_yaml.resize(h.yaml_bytes);
  ckpt.params.resize(n);
  ckpt.optimizer.m.resize(n);
  ckpt.optimizer.v.resize(n);
  uint32_t crc = 0;
  const std::pair<void*, size_t> sections[] = {
      {ckpt.config_yaml.data(), ckpt.config_yaml.size()},
      {ckpt.params.data(), n * sizeof(float)},
      {ckpt.optimizer.m.data(), n * sizeof(float)},
      {ckpt.optimizer.v.data(), n * sizeof(float)},
  };
  for (const auto& [data, size] : sections) {
    DL_RETURN_IF_ERROR(ReadAll(fd, data, size, &got, path));
    if (got < size)
      return Status::Error(name + " was truncated while being read: " + std::to_string(size - got) +
                           " bytes missing");
    crc = Crc32c(data, size, crc);
  }
  if (crc != h.body_crc) return Status::Error(name + " is corrupt: body CRC mismatch");
  *out = std::move(ckpt);
  return Status::Ok();
}

}  // namespace

Status SaveCheckpoint(const std::string& path, const GptConfig& model, const float* params,
                      const AdamWState& optimizer, long step, const std::string& config_yaml) {
  const TensorTable table = gpt_tensor_table(model);
  const size_t n = table.total_numel();
  for (const auto* moment : {&optimizer.m, &optimizer.v})
    if (!moment->empty() && moment->size() != n)
      return Status::Error("cannot save checkpoint " + Quoted(path) + ": AdamW state has " +
                           std::to_string(moment->size()) + " floats, the model has " +
                           std::to_string(n) + " parameters");

  // A missing moment (no AdamW step yet) is saved as zeros.
  std::vector<float> zeros;
  if (optimizer.m.empty() || optimizer.v.empty()) zeros.assign(n, 0.0f);
  const float* m_data = optimizer.m.empty() ? zeros.data() : optimizer.m.data();
  const float* v_data = optimizer.v.empty() ? zeros.data() : optimizer.v.data();

  Header h;
  h.model = model;
  h.step = step;
  h.adam_step = optimizer.step;
  h.num_params = n;
  h.table_digest = table.digest();
  h.yaml_bytes = config_yaml.size();
  uint32_t crc = Crc32c(config_yaml.data(), config_yaml.size());
  crc = Crc32c(params, n * sizeof(float), crc);
  crc = Crc32c(m_data, n * sizeof(float), crc);
  h.body_crc = Crc32c(v_data, n * sizeof(float), crc);
  HeaderBytes header;
  EncodeHeader(h, &header);

  return WriteFileAtomically(path,
                             {{header.data(), kCheckpointHeaderBytes},
                              {config_yaml.data(), config_yaml.size()},
                              {params, n * sizeof(float)},
                              {m_data, n * sizeof(float)},
                              {v_data, n * sizeof(float)}},
                             "checkpoint");
}

Status SaveCheckpoint(const std::string& path, const LocalRing& ring, long step, const std::string& config_yaml) {
  const TrainingBackend& backend = ring.backend(0);
  std::vector<float> params(backend.num_params());
  backend.download_params(params.data());
  AdamWState optimizer;
  ring.DownloadOptimizer(&optimizer);
  return SaveCheckpoint(path, backend.config(), params.data(), optimizer, step, config_yaml);
}

Status LoadCheckpoint(const std::string& path, Checkpoint* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return Status::Error("cannot open checkpoint " + Quoted(path) + ": " + Errno(err) +
                         (err == ENOENT ? ": check the path" : ""));
  }
  const Status st = LoadFrom(fd, path, out);
  ::close(fd);
  return st;
}

Status CheckCheckpointFits(const Checkpoint& ckpt, const GptConfig& b, bool with_optimizer) {
  const GptConfig& a = ckpt.model;
  std::string diff;
  auto compare = [&diff](const char* field, int in_ckpt, int in_model) {
    if (in_ckpt == in_model) return;
    if (!diff.empty()) diff += ", ";
    diff += "checkpoint has ";
    diff += field;
    diff += ' ';
    diff += std::to_string(in_ckpt);
    diff += ", model has ";
    diff += std::to_string(in_model);
  };
  compare("vocab_size", a.vocab_size, b.vocab_size);
  compare("block_size", a.block_size, b.block_size);
  compare("n_layer", a.n_layer, b.n_layer);
  compare("n_embd", a.n_embd, b.n_embd);
  compare("n_head", a.n_head, b.n_head);
  if (!diff.empty())
    return Status::Error(diff + ": build the model from the checkpoint's GptConfig");
  const TensorTable table = gpt_tensor_table(b);
  if (gpt_tensor_table(a).digest() != table.digest())
    return Status::Error("checkpoint tensor layout differs from the model's (table digest)");
  const size_t n = table.total_numel();
  if (ckpt.params.size() != n ||
      (with_optimizer && (ckpt.optimizer.m.size() != n || ckpt.optimizer.v.size() != n)))
    return Status::Error("checkpoint holds " + std::to_string(ckpt.params.size()) +
                         " parameters and " + std::to_string(ckpt.optimizer.m.size()) + "/" +
                         std::to_string(ckpt.optimizer.v.size()) +
                         " AdamW moments; the model has " + std::to_string(n) + " parameters");
  return Status::Ok();
}

}  // namespace diloco
