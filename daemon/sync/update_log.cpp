#include "daemon/sync/update_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "daemon/sync/merge.h"
#include "daemon/util/crc32c.h"

namespace diloco {
namespace {

static_assert(std::endian::native == std::endian::little, "the update log assumes little-endian");

constexpr char kMagic[4] = {'D', 'L', 'U', 'R'};
constexpr size_t kHeaderCrcOffset = 20;
constexpr size_t kFixedBodyBytes = 40;  // the body up to the tensor table
// Far above any fragment's range count; keeps a forged count from driving allocations.
constexpr uint32_t kMaxTensors = 1u << 20;

std::string Quoted(const std::string& path) { return "'" + path + "'"; }
std::string Errno() { return std::strerror(errno); }

void Put(std::vector<uint8_t>* out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out->push_back((uint8_t)(v >> (8 * i)));
}
uint64_t Get(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

Status ReadAt(int fd, uint64_t offset, void* out, size_t n, const std::string& path) {
  uint8_t* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, std::min(n, (size_t)1 << 30), (off_t)offset);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::Error("cannot read update log " + Quoted(path) + ": " + Errno());
    if (r == 0) return Status::Error("update log " + Quoted(path) + " shrank while being read");
    p += r;
    offset += (uint64_t)r;
    n -= (size_t)r;
  }
  return Status::Ok();
}

Status WriteAt(int fd, uint64_t offset, const void* data, size_t n, const std::string& path) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, std::min(n, (size_t)1 << 30), (off_t)offset);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Status::Error("cannot write update log " + Quoted(path) + ": " + Errno());
    p += w;
    offset += (uint64_t)w;
    n -= (size_t)w;
  }
  return Status::Ok();
}

// Makes creations, renames and truncations of the directory's entries durable.
Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::Error("cannot open directory " + Quoted(dir) + ": " + Errno());
  const int rc = ::fsync(fd);
  const std::string err = Errno();
  ::close(fd);
  if (rc != 0) return Status::Error("cannot fsync directory " + Quoted(dir) + ": " + err);
  return Status::Ok();
}

// True when bytes [offset, size) are all zero: a tail the filesystem extended but never filled.
Status AllZero(int fd, uint64_t offset, uint64_t size, const std::string& path, bool* zero) {
  std::vector<uint8_t> buffer(1 << 16);
  *zero = false;
  while (offset < size) {
    const size_t n = (size_t)std::min<uint64_t>(buffer.size(), size - offset);
    DL_RETURN_IF_ERROR(ReadAt(fd, offset, buffer.data(), n, path));
    if (std::any_of(buffer.begin(), buffer.begin() + (ptrdiff_t)n, [](uint8_t b) { return b != 0; })) {
      return Status::Ok();
    }
    offset += n;
  }
  *zero = true;
  return Status::Ok();
}

Status Damaged(const std::string& path, uint64_t offset, const std::string& what) {
  return Status::Error("update log " + Quoted(path) + " is damaged at byte offset " +
                       std::to_string(offset) + ": " + what +
                       ". It no longer proves which updates were published: keep a copy, and "
                       "restart the run from a checkpoint with fresh learners");
}

// The body after its CRC matched: a failure here is a writer bug or a forged file.
Status ParseBody(const std::vector<uint8_t>& body, const std::string& path, uint64_t offset,
                 UpdateRecord* r) {
  if (body.size() < kFixedBodyBytes) {
    return Damaged(path, offset, "a body of " + std::to_string(body.size()) + " bytes, under " +
                                     std::to_string(kFixedBodyBytes));
  }
  const uint8_t* b = body.data();
  r->version = Get(b, 8);
  r->fragment = (uint32_t)Get(b + 8, 4);
  r->theta_crc32c = (uint32_t)Get(b + 12, 4);
  const uint8_t kind = b[16];
  if (!IsValidCodecKind(kind)) return Damaged(path, offset, "unknown codec kind " + std::to_string(kind));
  r->codec.kind = static_cast<CodecKind>(kind);
  r->codec.block_size = (int)(int32_t)Get(b + 20, 4);
  std::memcpy(&r->codec.topk_fraction, b + 24, 8);
  const uint32_t tensors = (uint32_t)Get(b + 32, 4);
  if (tensors > kMaxTensors || kFixedBodyBytes + 8ull * tensors > body.size()) {
    return Damaged(path, offset, std::to_string(tensors) + " tensors do not fit a body of " +
                                     std::to_string(body.size()) + " bytes");
  }
  r->tensor_bytes.resize(tensors);
  uint64_t sum = 0;
  for (uint32_t i = 0; i < tensors; ++i) {
    r->tensor_bytes[i] = Get(b + kFixedBodyBytes + 8 * i, 8);
    sum += std::min<uint64_t>(r->tensor_bytes[i], body.size());  // no overflow
  }
  const size_t payload_at = kFixedBodyBytes + 8 * tensors;
  if (sum != body.size() - payload_at) {
    return Damaged(path, offset, "its tensors sum to " + std::to_string(sum) + " bytes but " +
                                     std::to_string(body.size() - payload_at) + " payload bytes follow");
  }
  r->payload.assign(body.begin() + (ptrdiff_t)payload_at, body.end());
  return Status::Ok();
}

using RecordFn = std::function<Status(uint64_t offset, UpdateRecord&& record)>;

// Reads a segment record by record (on_record may be empty); stops before a torn tail.
Status ScanSegment(const std::string& path, const RecordFn& on_record, SegmentScan* scan) {
  *scan = {};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return Status::Ok();
  if (fd < 0) return Status::Error("cannot open update log " + Quoted(path) + ": " + Errno());
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return Status::Error("cannot stat update log " + Quoted(path) + ": " + Errno());
  const uint64_t size = (uint64_t)st.st_size;
  uint64_t offset = 0;
  std::vector<uint8_t> body;
  while (offset < size) {
    const uint64_t left = size - offset;
    if (left < kUpdateRecordHeaderBytes) break;  // torn inside a header
    uint8_t h[kUpdateRecordHeaderBytes];
    DL_RETURN_IF_ERROR(ReadAt(fd, offset, h, sizeof h, path));
    if (Crc32c(h, kHeaderCrcOffset) != (uint32_t)Get(h + kHeaderCrcOffset, 4)) {
      bool zero = false;
      DL_RETURN_IF_ERROR(AllZero(fd, offset, size, path, &zero));
      if (zero) break;  // a tail extended but never written
      return Damaged(path, offset, "record header CRC mismatch");
    }
    if (std::memcmp(h, kMagic, 4) != 0) return Damaged(path, offset, "bad record magic (expected \"DLUR\")");
    const uint32_t version = (uint32_t)Get(h + 4, 4);
    if (version != kUpdateLogVersion) {
      return Status::Error("update log " + Quoted(path) + " has a record of format version " +
                           std::to_string(version) + " at byte offset " + std::to_string(offset) +
                           "; this build reads version " + std::to_string(kUpdateLogVersion) +
                           ": use a matching dilocod");
    }
    const uint64_t body_bytes = Get(h + 8, 8);
    if (body_bytes > left - kUpdateRecordHeaderBytes) break;  // the append was cut short
    body.resize(body_bytes);
    DL_RETURN_IF_ERROR(ReadAt(fd, offset + kUpdateRecordHeaderBytes, body.data(), body.size(), path));
    if (Crc32c(body.data(), body.size()) != (uint32_t)Get(h + 16, 4)) {
      return Damaged(path, offset, "record body CRC mismatch");
    }
    UpdateRecord record;
    DL_RETURN_IF_ERROR(ParseBody(body, path, offset, &record));
    if (on_record) DL_RETURN_IF_ERROR(on_record(offset, std::move(record)));
    offset += kUpdateRecordHeaderBytes + body_bytes;
    scan->records++;
  }
  scan->valid_bytes = offset;
  scan->torn_tail_bytes = size - offset;
  return Status::Ok();
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

std::string UpdateLogPath(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / kUpdateLogName).string();
}
std::string PreviousUpdateLogPath(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / kPrevUpdateLogName).string();
}

Status ReadUpdateLog(const std::string& path, std::vector<UpdateRecord>* records, SegmentScan* scan) {
  records->clear();
  SegmentScan local;
  return ScanSegment(
      path,
      [&](uint64_t, UpdateRecord&& r) {
        records->push_back(std::move(r));
        return Status::Ok();
      },
      scan ? scan : &local);
}

UpdateLog::UpdateLog(std::string dir, const UpdateLogOptions& options)
    : dir_(std::move(dir)),
      path_(UpdateLogPath(dir_)),
      prev_path_(PreviousUpdateLogPath(dir_)),
      options_(options) {}

UpdateLog::~UpdateLog() {
  if (fd_ >= 0) ::close(fd_);
}

// Opens updates.log read-write (create_only: it must not exist yet); a new file's directory
// entry is made durable before any record is trusted to it.
Status UpdateLog::OpenCurrent(bool create_only) {
  const bool existed = Exists(path_);
  const int flags = O_RDWR | O_CREAT | O_CLOEXEC | (create_only ? O_EXCL : 0);
  const int fd = ::open(path_.c_str(), flags, 0644);
  if (fd < 0) {
    return Status::Error("cannot open update log " + Quoted(path_) + ": " + Errno() +
                         ": check that the run directory exists and is writable");
  }
  fd_ = fd;
  if (!existed) DL_RETURN_IF_ERROR(SyncDirectory(dir_));
  return Status::Ok();
}

Status UpdateLog::Open(const std::string& run_dir, const UpdateLogOptions& options,
                       std::unique_ptr<UpdateLog>* out) {
  std::unique_ptr<UpdateLog> log(new UpdateLog(run_dir, options));
  SegmentScan scan;
  DL_RETURN_IF_ERROR(ScanSegment(log->path_, nullptr, &scan));
  DL_RETURN_IF_ERROR(log->OpenCurrent(/*create_only=*/false));
  if (scan.torn_tail_bytes > 0) {
    if (::ftruncate(log->fd_, (off_t)scan.valid_bytes) != 0 || ::fdatasync(log->fd_) != 0) {
      return Status::Error("cannot truncate the torn tail of update log " + Quoted(log->path_) +
                           " to " + std::to_string(scan.valid_bytes) + " bytes: " + Errno());
    }
    log->truncated_bytes_ = scan.torn_tail_bytes;
    log->note_ = "update log " + Quoted(log->path_) + ": dropped a torn record of " +
                 std::to_string(scan.torn_tail_bytes) + " bytes at byte offset " +
                 std::to_string(scan.valid_bytes) +
                 " (the syncer stopped while appending it, so it was never published)";
  }
  log->end_ = scan.valid_bytes;
  log->records_ = scan.records;
  *out = std::move(log);
  return Status::Ok();
}

Status UpdateLog::Append(const UpdateRecord& r) {
  if (fd_ < 0) return Status::Error("update log " + Quoted(path_) + " is closed after an earlier error: restart the syncer");
  uint64_t sum = 0;
  for (uint64_t b : r.tensor_bytes) sum += b;
  if (sum != r.payload.size() || r.tensor_bytes.size() > kMaxTensors || !IsValidCodecKind((uint8_t)r.codec.kind)) {
    return Status::Error("update log: bad record for fragment " + std::to_string(r.fragment) + " version " +
                         std::to_string(r.version) + ": tensor bytes sum to " + std::to_string(sum) + ", payload has " +
                         std::to_string(r.payload.size()) + " (a syncer bug): do not publish it");
  }
  // Header, fixed body and tensor table in one buffer; the payload is written from the record.
  std::vector<uint8_t> head;
  head.reserve(kUpdateRecordHeaderBytes + kFixedBodyBytes + 8 * r.tensor_bytes.size());
  head.resize(kUpdateRecordHeaderBytes);
  Put(&head, r.version, 8);
  Put(&head, r.fragment, 4);
  Put(&head, r.theta_crc32c, 4);
  Put(&head, (uint8_t)r.codec.kind, 4);  // kind, then 3 zero bytes
  Put(&head, (uint32_t)r.codec.block_size, 4);
  uint64_t topk_bits;
  std::memcpy(&topk_bits, &r.codec.topk_fraction, 8);
  Put(&head, topk_bits, 8);
  Put(&head, r.tensor_bytes.size(), 4);
  Put(&head, 0, 4);
  for (uint64_t b : r.tensor_bytes) Put(&head, b, 8);
  const uint8_t* meta = head.data() + kUpdateRecordHeaderBytes;
  const size_t meta_bytes = head.size() - kUpdateRecordHeaderBytes;
  const uint32_t body_crc = Crc32c(r.payload.data(), r.payload.size(), Crc32c(meta, meta_bytes));
  std::vector<uint8_t> h;
  h.insert(h.end(), kMagic, kMagic + 4);
  Put(&h, kUpdateLogVersion, 4);
  Put(&h, meta_bytes + r.payload.size(), 8);
  Put(&h, body_crc, 4);
  Put(&h, Crc32c(h.data(), kHeaderCrcOffset), 4);
  std::copy(h.begin(), h.end(), head.begin());

  Status st = WriteAt(fd_, end_, head.data(), head.size(), path_);
  if (st.ok()) st = WriteAt(fd_, end_ + head.size(), r.payload.data(), r.payload.size(), path_);
  if (st.ok() && options_.sync && ::fdatasync(fd_) != 0) {
    st = Status::Error("cannot fdatasync update log " + Quoted(path_) + ": " + Errno());
  }
  if (!st.ok()) {
    // Cut the partial record so that the next Append does not leave damage in the middle.
    if (::ftruncate(fd_, (off_t)end_) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
    return st.WithContext("fragment " + std::to_string(r.fragment) + " version " + std::to_string(r.version) +
                          " was not logged: do not publish it");
  }
  end_ += head.size() + r.payload.size();
  records_++;
  return Status::Ok();
}

Status UpdateLog::Rotate() {
  std::lock_guard<std::mutex> lock(prev_mutex_);
  if (Exists(prev_path_)) {
    return Status::Error("cannot rotate update log " + Quoted(path_) + ": " + Quoted(prev_path_) +
                         " still exists (a checkpoint is being written, or the last one failed): skip this "
                         "rotation; a checkpoint of the current state covers both segments");
  }
  if (fd_ < 0) return Status::Error("update log " + Quoted(path_) + " is closed after an earlier error: restart the syncer");
  if (::rename(path_.c_str(), prev_path_.c_str()) != 0) {
    return Status::Error("cannot rename " + Quoted(path_) + " to " + Quoted(prev_path_) + ": " + Errno());
  }
  // The old descriptor now writes to prev: never use it again.
  ::close(fd_);
  fd_ = -1;
  end_ = 0;
  records_ = 0;
  // OpenCurrent syncs the directory: the rename and the new file are durable together.
  return OpenCurrent(/*create_only=*/true).WithContext("rotated the update log but cannot start a new segment");
}

Status UpdateLog::DropPrevious() {
  std::lock_guard<std::mutex> lock(prev_mutex_);
  // Not synced: if the unlink is lost in a crash, prev reappears, its records all at or below
  // the checkpoint's versions, and replay skips them.
  if (::unlink(prev_path_.c_str()) != 0 && errno != ENOENT) {
    return Status::Error("cannot delete " + Quoted(prev_path_) + ": " + Errno());
  }
  return Status::Ok();
}

bool UpdateLog::HasPrevious() const {
  std::lock_guard<std::mutex> lock(prev_mutex_);
  return Exists(prev_path_);
}

Status ReplayUpdateLogs(const std::string& run_dir, const std::vector<Fragment>& fragments,
                        const UpdateDecoder& decode, GlobalState* state, ReplayReport* report) {
  *report = {};
  report->replayed.assign(fragments.size(), 0);
  if (state->fragments.size() != fragments.size()) {
    return Status::Error("replaying the update log: the state has " + std::to_string(state->fragments.size()) +
                         " fragments, the run " + std::to_string(fragments.size()));
  }
  std::vector<float> update;
  for (const std::string& path : {PreviousUpdateLogPath(run_dir), UpdateLogPath(run_dir)}) {
    auto at = [&](uint64_t offset) { return Quoted(path) + " at byte offset " + std::to_string(offset); };
    auto apply = [&](uint64_t offset, UpdateRecord&& r) -> Status {
      if (r.fragment >= fragments.size()) {
        return Status::Error("update log " + at(offset) + " holds fragment " + std::to_string(r.fragment) +
                             " but the run has " + std::to_string(fragments.size()) + ": wrong run directory?");
      }
      FragmentGlobal& fg = state->fragments[r.fragment];
      const std::string name = "fragment " + std::to_string(r.fragment) + " version " + std::to_string(r.version);
      if (r.version <= fg.version) {
        report->skipped++;  // the checkpoint already has it
        return Status::Ok();
      }
      if (r.version != fg.version + 1) {
        return Status::Error("update log " + at(offset) + " holds " + name + " but the state is at version " +
                             std::to_string(fg.version) + ": a hole in the log (versions " +
                             std::to_string(fg.version + 1) + ".." + std::to_string(r.version - 1) +
                             " are missing); the published model cannot be rebuilt");
      }
      const size_t n = fragments[r.fragment].numel;
      if (fg.theta.size() != n) {
        return Status::Error("replaying " + name + ": the state holds " + std::to_string(fg.theta.size()) +
                             " values, the fragment " + std::to_string(n));
      }
      update.resize(n);
      DL_RETURN_IF_ERROR(decode(fragments[r.fragment], r, update).WithContext("update log " + at(offset) + ": " + name));
      ApplyUpdate(update.data(), n, fg.theta.data());
      const uint32_t crc = Crc32c(fg.theta.data(), n * sizeof(float));
      if (crc != r.theta_crc32c) {
        return Status::Error("update log " + at(offset) + ": after replaying " + name + " Θ has CRC32C " +
                             std::to_string(crc) + ", the published one " + std::to_string(r.theta_crc32c) +
                             ": the checkpoint and the log disagree (different build or damaged checkpoint)");
      }
      fg.version = r.version;
      state->merges++;
      report->replayed[r.fragment]++;
      return Status::Ok();
    };
    SegmentScan scan;
    DL_RETURN_IF_ERROR(ScanSegment(path, apply, &scan));
    report->torn_tail_bytes += scan.torn_tail_bytes;
  }
  return Status::Ok();
}

}  // namespace diloco
