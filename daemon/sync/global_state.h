// The syncer's global state: per fragment Θ_p, its Nesterov buffer u_p and
// version v_p; a token ledger per learner; counters. Saved atomically every N
// merges and restored at start, so a restarted syncer continues where it
// stopped and the global model never goes back further than N merges.
//
// File format version 1. Little-endian, no padding, offsets in bytes:
//
//   offset size  field
//        0    8  magic "DLSYNC01"
//        8    4  u32 format version = 1
//       12    4  u32 num_fragments P
//       16    4  u32 num_ledger_entries L
//       20    4  u32 reserved = 0
//       24    8  u64 tensor table digest (of the parameter layout)
//       32    8  u64 fragments digest (FragmentsDigest of the partition, row pieces included)
//       40    8  u64 merges
//       48    8  u64 dropped_deltas   (too stale / from the future)
//       56    8  u64 rejected_deltas  (failed the norm filter)
//       64    8  u64 body bytes B
//       72    4  u32 body CRC32C (over every body byte)
//       76    4  u32 header CRC32C (over bytes [0, 76))
//       80       body:
//                  P times: u64 version, u64 numel n, 4n bytes Θ (f32), 4n bytes u (f32)
//                  L times: i32 learner, u32 reserved = 0, u64 tokens, u64 steps,
//                           u64 merged, u64 dropped, u64 rejected          (48 bytes)
//   file size = 80 + B exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "daemon/sync/fragments.h"
#include "daemon/util/status.h"
#include "kernels/tensor_table.h"

namespace diloco {

inline constexpr char kGlobalStateMagic[8] = {'D', 'L', 'S', 'Y', 'N', 'C', '0', '1'};
inline constexpr uint32_t kGlobalStateVersion = 1;
inline constexpr size_t kGlobalStateHeaderBytes = 80;

struct FragmentGlobal {
  uint64_t version = 0;
  std::vector<float> theta;     // Θ_p, packed (fragments.h)
  std::vector<float> momentum;  // u_p, same length
  bool operator==(const FragmentGlobal&) const = default;
};

// What the syncer has taken from one learner, over the whole run.
struct LedgerEntry {
  int learner = 0;
  uint64_t tokens = 0;    // c_tokens of its merged deltas
  uint64_t steps = 0;     // c_steps of its merged deltas
  uint64_t merged = 0;    // deltas merged
  uint64_t dropped = 0;   // deltas dropped as too stale
  uint64_t rejected = 0;  // deltas rejected by the filter
  bool operator==(const LedgerEntry&) const = default;
};

struct GlobalState {
  uint64_t table_digest = 0;
  uint64_t fragments_digest = 0;
  std::vector<FragmentGlobal> fragments;
  std::vector<LedgerEntry> ledger;  // sorted by learner
  uint64_t merges = 0;
  uint64_t dropped_deltas = 0;
  uint64_t rejected_deltas = 0;
  bool operator==(const GlobalState&) const = default;
};

// Version 0 of every fragment: Θ from params (the initial model), u = 0.
GlobalState InitialGlobalState(const TensorTable& table, const std::vector<Fragment>& fragments,
                               const float* params);

// The learner's ledger entry, created (in order) when missing.
LedgerEntry& LedgerFor(GlobalState* state, int learner);

Status SaveGlobalState(const std::string& path, const GlobalState& state);

// Reads and verifies (magic, version, both CRCs, sizes, body structure).
Status LoadGlobalState(const std::string& path, GlobalState* out);

// Whether a loaded state fits this run (same parameter layout, same
// fragments); the error says what differs.
Status CheckGlobalStateFits(const GlobalState& state, const TensorTable& table,
                            const std::vector<Fragment>& fragments);

}  // namespace diloco
