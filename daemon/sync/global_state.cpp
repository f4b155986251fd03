#include "daemon/sync/global_state.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "daemon/util/atomic_file.h"
#include "daemon/util/crc32c.h"

namespace diloco {
namespace {

// Floats are written as their in-memory bytes.
static_assert(std::endian::native == std::endian::little, "global state assumes little-endian");

constexpr size_t kHeaderCrcOffset = 76;
constexpr size_t kFragmentRecordBytes = 16;  // version, numel
constexpr size_t kLedgerEntryBytes = 48;
// Far above any real run; keeps a corrupt count from driving allocations.
constexpr uint32_t kMaxCount = 1u << 20;

class ByteWriter {
 public:
  void Put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes_.push_back((char)(uint8_t)(v >> (8 * i)));
  }
  std::string& bytes() { return bytes_; }

 private:
  std::string bytes_;
};

// Bounds-checked little-endian reads from a byte range.
class ByteReader {
 public:
  ByteReader(const char* data, size_t size) : data_(data), size_(size) {}
  size_t left() const { return size_ - pos_; }
  uint64_t Get(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= (uint64_t)(uint8_t)data_[pos_ + i] << (8 * i);
    pos_ += n;
    return v;
  }
  void Floats(size_t count, std::vector<float>* out) {
    out->resize(count);
    std::memcpy(out->data(), data_ + pos_, count * sizeof(float));
    pos_ += count * sizeof(float);
  }

 private:
  const char* data_;
  size_t size_;
  size_t pos_ = 0;
};

std::string Quoted(const std::string& path) { return "'" + path + "'"; }

// Parses the body into *state; the CRC has already been checked, so a
// failure here means a writer bug or a forged file.
Status ParseBody(ByteReader body, uint32_t num_fragments, uint32_t num_ledger,
                 const std::string& name, GlobalState* state) {
  auto corrupt = [&](const std::string& what) {
    return Status::Error(name + " is corrupt: " + what);
  };
  state->fragments.resize(num_fragments);
  for (uint32_t p = 0; p < num_fragments; ++p) {
    if (body.left() < kFragmentRecordBytes) {
      return corrupt("the body ends inside fragment " + std::to_string(p) + "'s record");
    }
    FragmentGlobal& f = state->fragments[p];
    f.version = body.Get(8);
    const uint64_t numel = body.Get(8);
    if (numel > body.left() / (2 * sizeof(float))) {
      return corrupt("fragment " + std::to_string(p) + " says " + std::to_string(numel) +
                     " values but only " + std::to_string(body.left()) + " body bytes are left");
    }
    body.Floats(numel, &f.theta);
    body.Floats(numel, &f.momentum);
  }
  if (body.left() != (uint64_t)num_ledger * kLedgerEntryBytes) {
    return corrupt(std::to_string(body.left()) + " body bytes are left for " +
                   std::to_string(num_ledger) + " ledger entries of " +
                   std::to_string(kLedgerEntryBytes) + " bytes");
  }
  state->ledger.resize(num_ledger);
  for (LedgerEntry& e : state->ledger) {
    e.learner = (int32_t)(uint32_t)body.Get(4);
    (void)body.Get(4);
    e.tokens = body.Get(8);
    e.steps = body.Get(8);
    e.merged = body.Get(8);
    e.dropped = body.Get(8);
    e.rejected = body.Get(8);
  }
  return Status::Ok();
}

Status Parse(const std::string& bytes, const std::string& path, GlobalState* out) {
  const std::string name = "global state " + Quoted(path);
  if (bytes.empty()) return Status::Error(name + " is empty: not a global state file");
  if (std::memcmp(bytes.data(), kGlobalStateMagic, std::min<size_t>(bytes.size(), 8)) != 0) {
    return Status::Error(name + " is not a global state file (bad magic; expected \"DLSYNC01\")");
  }
  if (bytes.size() < kGlobalStateHeaderBytes) {
    return Status::Error(
        name + " is truncated: " + std::to_string(kGlobalStateHeaderBytes - bytes.size()) +
        " bytes missing (the file has " + std::to_string(bytes.size()) +
        " bytes, the header alone needs " + std::to_string(kGlobalStateHeaderBytes) + ")");
  }
  ByteReader header(bytes.data(), kGlobalStateHeaderBytes);
  (void)header.Get(8);
  const uint32_t version = (uint32_t)header.Get(4);
  const uint32_t num_fragments = (uint32_t)header.Get(4);
  const uint32_t num_ledger = (uint32_t)header.Get(4);
  (void)header.Get(4);
  GlobalState state;
  state.table_digest = header.Get(8);
  state.fragments_digest = header.Get(8);
  state.merges = header.Get(8);
  state.dropped_deltas = header.Get(8);
  state.rejected_deltas = header.Get(8);
  const uint64_t body_bytes = header.Get(8);
  const uint32_t body_crc = (uint32_t)header.Get(4);
  const uint32_t header_crc = (uint32_t)header.Get(4);
  if (version != kGlobalStateVersion) {
    return Status::Error(name + " has format version " + std::to_string(version) +
                         "; this build reads version " + std::to_string(kGlobalStateVersion) +
                         ": use a matching dilocod");
  }
  if (header_crc != Crc32c(bytes.data(), kHeaderCrcOffset)) {
    return Status::Error(name + " is corrupt: header CRC mismatch");
  }
  if (num_fragments > kMaxCount || num_ledger > kMaxCount) {
    return Status::Error(name + " is corrupt: " + std::to_string(num_fragments) +
                         " fragments and " + std::to_string(num_ledger) + " ledger entries");
  }
  const uint64_t have = bytes.size() - kGlobalStateHeaderBytes;
  if (body_bytes > have) {
    return Status::Error(name + " is truncated: " + std::to_string(body_bytes - have) +
                         " bytes missing (the file has " + std::to_string(bytes.size()) +
                         " bytes; its header describes more)");
  }
  if (body_bytes < have) {
    return Status::Error(name + " has " + std::to_string(have - body_bytes) +
                         " unexpected bytes after its body: corrupt");
  }
  const char* body = bytes.data() + kGlobalStateHeaderBytes;
  if (Crc32c(body, body_bytes) != body_crc) {
    return Status::Error(name + " is corrupt: body CRC mismatch");
  }
  DL_RETURN_IF_ERROR(
      ParseBody(ByteReader(body, body_bytes), num_fragments, num_ledger, name, &state));
  *out = std::move(state);
  return Status::Ok();
}

}  // namespace

GlobalState InitialGlobalState(const TensorTable& table, const std::vector<Fragment>& fragments,
                               const float* params) {
  GlobalState state;
  state.table_digest = table.digest();
  state.fragments_digest = FragmentsDigest(fragments);
  for (const Fragment& f : fragments) {
    FragmentGlobal g;
    g.theta = GatherFragment(f, params);
    g.momentum.assign(f.numel, 0.0f);
    state.fragments.push_back(std::move(g));
  }
  return state;
}

LedgerEntry& LedgerFor(GlobalState* state, int learner) {
  auto it = std::lower_bound(state->ledger.begin(), state->ledger.end(), learner,
                             [](const LedgerEntry& e, int id) { return e.learner < id; });
  if (it == state->ledger.end() || it->learner != learner) {
    LedgerEntry entry;
    entry.learner = learner;
    it = state->ledger.insert(it, entry);
  }
  return *it;
}

Status SaveGlobalState(const std::string& path, const GlobalState& state) {
  for (size_t p = 0; p < state.fragments.size(); ++p) {
    const FragmentGlobal& f = state.fragments[p];
    if (f.momentum.size() != f.theta.size()) {
      return Status::Error("cannot save global state " + Quoted(path) + ": fragment " +
                           std::to_string(p) + " has " + std::to_string(f.theta.size()) +
                           " values but a momentum of " + std::to_string(f.momentum.size()));
    }
  }
  // Small records are built here; Θ and u are written from where they are.
  std::vector<ByteWriter> records(state.fragments.size());
  ByteWriter ledger;
  for (size_t p = 0; p < state.fragments.size(); ++p) {
    records[p].Put(state.fragments[p].version, 8);
    records[p].Put(state.fragments[p].theta.size(), 8);
  }
  for (const LedgerEntry& e : state.ledger) {
    ledger.Put((uint32_t)e.learner, 4);
    ledger.Put(0, 4);
    for (uint64_t v : {e.tokens, e.steps, e.merged, e.dropped, e.rejected}) ledger.Put(v, 8);
  }
  std::vector<ByteChunk> body;
  for (size_t p = 0; p < state.fragments.size(); ++p) {
    const FragmentGlobal& f = state.fragments[p];
    body.push_back({records[p].bytes().data(), records[p].bytes().size()});
    body.push_back({f.theta.data(), f.theta.size() * sizeof(float)});
    body.push_back({f.momentum.data(), f.momentum.size() * sizeof(float)});
  }
  body.push_back({ledger.bytes().data(), ledger.bytes().size()});
  uint64_t body_bytes = 0;
  uint32_t body_crc = 0;
  for (const ByteChunk& chunk : body) {
    body_bytes += chunk.size;
    body_crc = Crc32c(chunk.data, chunk.size, body_crc);
  }

  ByteWriter header;
  header.bytes().append(kGlobalStateMagic, 8);
  header.Put(kGlobalStateVersion, 4);
  header.Put(state.fragments.size(), 4);
  header.Put(state.ledger.size(), 4);
  header.Put(0, 4);
  for (uint64_t v : {state.table_digest, state.fragments_digest, state.merges, state.dropped_deltas,
                     state.rejected_deltas, body_bytes}) {
    header.Put(v, 8);
  }
  header.Put(body_crc, 4);
  header.Put(Crc32c(header.bytes().data(), kHeaderCrcOffset), 4);

  std::vector<ByteChunk> chunks = {{header.bytes().data(), header.bytes().size()}};
  chunks.insert(chunks.end(), body.begin(), body.end());
  return WriteFileAtomically(path, chunks, "global state");
}

Status LoadGlobalState(const std::string& path, GlobalState* out) {
  std::string bytes;
  DL_RETURN_IF_ERROR(ReadWholeFile(path, "global state", &bytes));
  return Parse(bytes, path, out);
}

Status CheckGlobalStateFits(const GlobalState& state, const TensorTable& table,
                            const std::vector<Fragment>& fragments) {
  if (state.table_digest != table.digest()) {
    return Status::Error(
        "the global state was saved for a different model (tensor table digest differs): "
        "use the run's own model config, or start the syncer with a fresh state directory");
  }
  if (state.fragments.size() != fragments.size() ||
      state.fragments_digest != FragmentsDigest(fragments)) {
    return Status::Error("the global state has " + std::to_string(state.fragments.size()) +
                         " fragments laid out differently from this run's " +
                         std::to_string(fragments.size()) +
                         ": keep sync.fragments as it was when the state was saved");
  }
  for (size_t p = 0; p < fragments.size(); ++p) {
    if (state.fragments[p].theta.size() != fragments[p].numel) {
      return Status::Error("the global state's fragment " + std::to_string(p) + " has " +
                           std::to_string(state.fragments[p].theta.size()) +
                           " values; this run's has " + std::to_string(fragments[p].numel));
    }
  }
  return Status::Ok();
}

}  // namespace diloco
