// The syncer's log of published updates: every Global it sends is first appended here and made
// durable, so a syncer killed at any point restarts from its last checkpoint (global_state.h)
// plus this log and reaches exactly the Θ_p and versions it had published: it never issues a
// version number twice with other contents.
//
// Two segments in the run directory:
//   updates.log       the current segment; every Append goes here.
//   updates.prev.log  exists only between Rotate() and DropPrevious(): the records the
//                     checkpoint being written will cover.
// Checkpoint recipe for the syncer (between merges, on its own thread):
//   if the state writer is busy: skip this checkpoint;
//   if !HasPrevious(): Rotate();   // else an earlier checkpoint failed or the syncer restarted:
//                                  // the new one covers prev too, so no rotation is needed
//   writer.Submit(copy of the state, done = [&](Status s) { if (s.ok()) log.DropPrevious(); });
// A checkpoint of the current state covers every record of both segments, so dropping prev once
// it is durable loses nothing; a crash before that leaves prev to be replayed.
//
// What is NOT in the log: the Nesterov buffer u_p (it would double the log's size) and the
// ledger. After a replay Θ_p and v_p are exact; u_p and the ledger are the checkpoint's, up to
// checkpoint_every merges old (the outer momentum re-warms; Θ and versions never go back).
//
// Segment format version 1: a sequence of records, nothing else. Little-endian, no padding:
//
//   offset size  field                       (a record; offsets from its start)
//        0    4  magic "DLUR"
//        4    4  u32 format version = 1
//        8    8  u64 body bytes B
//       16    4  u32 body CRC32C (over the B body bytes)
//       20    4  u32 header CRC32C (over bytes [0, 20))
//       24       body:
//                   0  8  u64 version (the fragment's version this update produces)
//                   8  4  u32 fragment
//                  12  4  u32 CRC32C of Θ_p (its f32 bytes) after applying the update
//                  16  1  u8 codec kind (CodecKind, codec_kind.h), then 3 bytes = 0
//                  20  4  u32 codec block size
//                  24  8  f64 codec top-k fraction (0 = dense)
//                  32  4  u32 tensor count T
//                  36  4  u32 reserved = 0
//                  40 8T  u64 encoded bytes per tensor (EncodeTensors' tensor_bytes)
//              40+8T      the encoded payload, Σ tensor bytes
//                 B = 40 + 8T + Σ tensor bytes exactly.
//
// Reading a segment: a record the file ends inside (header incomplete, or header valid and B
// beyond the end), or an all-zero tail, is a torn append: the syncer died before Append returned,
// so it was never published and is dropped (Open truncates it away). Any other bad record (a CRC
// mismatch, a bad magic) is damage and an error naming the file and offset: the log no longer
// proves what was published, and a human must decide.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "daemon/net/codec.h"  // CodecOptions only: this unit calls no codec
#include "daemon/sync/fragments.h"
#include "daemon/sync/global_state.h"
#include "daemon/util/status.h"

namespace diloco {

inline constexpr char kUpdateLogName[] = "updates.log";
inline constexpr char kPrevUpdateLogName[] = "updates.prev.log";
inline constexpr uint32_t kUpdateLogVersion = 1;
inline constexpr size_t kUpdateRecordHeaderBytes = 24;

std::string UpdateLogPath(const std::string& run_dir);          // run_dir/updates.log
std::string PreviousUpdateLogPath(const std::string& run_dir);  // run_dir/updates.prev.log

// One published update. The syncer can encode straight into payload, Append the record, then
// move payload into the message it publishes: no copy.
struct UpdateRecord {
  uint32_t fragment = 0;
  uint64_t version = 0;       // the version this update produces
  uint32_t theta_crc32c = 0;  // Crc32c of Θ_p's floats after ApplyUpdate
  CodecOptions codec;         // how payload decodes
  std::vector<uint64_t> tensor_bytes;
  std::vector<uint8_t> payload;
  bool operator==(const UpdateRecord& o) const {  // CodecOptions has no operator==
    return fragment == o.fragment && version == o.version && theta_crc32c == o.theta_crc32c &&
           codec.kind == o.codec.kind && codec.block_size == o.codec.block_size &&
           codec.topk_fraction == o.codec.topk_fraction && tensor_bytes == o.tensor_bytes && payload == o.payload;
  }
};

// What reading a segment found.
struct SegmentScan {
  uint64_t records = 0;
  uint64_t valid_bytes = 0;      // the whole records; the file's good prefix
  uint64_t torn_tail_bytes = 0;  // after them: a torn append (0 when none)
};

// Reads every whole record of a segment in order (a torn tail is left out and counted in
// *scan); a missing file is an empty segment. Errors on damage, naming the file and offset.
Status ReadUpdateLog(const std::string& path, std::vector<UpdateRecord>* records,
                     SegmentScan* scan = nullptr);

struct UpdateLogOptions {
  bool sync = true;  // fdatasync every Append; false only for tests and benchmarks
};

// The writer's side: Open, Append and Rotate from one thread (the syncer's). DropPrevious and
// HasPrevious may be called from any thread (the state writer's done callback).
class UpdateLog {
 public:
  // Opens run_dir/updates.log for appending, creating it if missing. Verifies every record;
  // a torn tail is truncated away (durably) and described in note(); damage is an error.
  static Status Open(const std::string& run_dir, const UpdateLogOptions& options,
                     std::unique_ptr<UpdateLog>* out);
  ~UpdateLog();
  UpdateLog(const UpdateLog&) = delete;
  UpdateLog& operator=(const UpdateLog&) = delete;

  // Writes the record and, with options.sync, fdatasyncs it before returning: publish only
  // after this returns Ok. On a failed write the segment is cut back to its last whole record.
  Status Append(const UpdateRecord& record);

  // updates.log -> updates.prev.log, and a new empty updates.log (both renames made durable).
  // Errors, changing nothing, while updates.prev.log exists.
  Status Rotate();
  // Deletes updates.prev.log, if any: call once the checkpoint that covers it is durable.
  Status DropPrevious();
  bool HasPrevious() const;

  const std::string& path() const { return path_; }
  const std::string& previous_path() const { return prev_path_; }
  uint64_t records() const { return records_; }  // in the current segment
  uint64_t bytes() const { return end_; }        // of the current segment
  // What Open had to repair ("" when nothing): the torn tail it truncated, for the log.
  const std::string& note() const { return note_; }
  uint64_t truncated_bytes() const { return truncated_bytes_; }

 private:
  UpdateLog(std::string dir, const UpdateLogOptions& options);
  Status OpenCurrent(bool create_only);

  std::string dir_, path_, prev_path_;
  UpdateLogOptions options_;
  int fd_ = -1;
  uint64_t end_ = 0;  // bytes of whole records in the current segment
  uint64_t records_ = 0;
  uint64_t truncated_bytes_ = 0;
  std::string note_;
  mutable std::mutex prev_mutex_;  // Rotate against DropPrevious / HasPrevious
};

// Decodes record.payload into update (fragment.numel floats, overwritten). The syncer passes
// DecodeTensors (daemon/net/codec.h) with the fragment's range numels:
//   [](const Fragment& f, const UpdateRecord& r, std::span<float> out) {
//     return DecodeTensors(r.codec, r.payload, FragmentNumels(f), r.tensor_bytes, out); }
// (a callback, so that diloco_sync needs no link to the codecs.)
using UpdateDecoder =
    std::function<Status(const Fragment& fragment, const UpdateRecord& record, std::span<float> update)>;

struct ReplayReport {
  std::vector<uint64_t> replayed;  // per fragment: records applied
  uint64_t skipped = 0;            // records the checkpoint already covered
  uint64_t torn_tail_bytes = 0;    // ignored at the end of a segment (never published)
};

// After LoadGlobalState: applies run_dir's updates.prev.log, then updates.log, in order to
// *state. Per record: skipped when its version <= the fragment's version in *state; else it
// must be exactly that version + 1 (else: a hole in the log, an error), is decoded, applied
// with ApplyUpdate, and Θ_p's CRC32C must equal the record's (else an error naming fragment
// and version). Each applied record also counts one merge (state->merges). *state is
// partly updated on error: discard it.
Status ReplayUpdateLogs(const std::string& run_dir, const std::vector<Fragment>& fragments,
                        const UpdateDecoder& decode, GlobalState* state, ReplayReport* report);

}  // namespace diloco
