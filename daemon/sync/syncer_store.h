// The syncer's durable state in its run directory, one recipe for every runtime (the wall syncer,
// local mode's, the virtual one): global_state.bin (the checkpoint), the update log of every
// update published since it (update_log.h), and the merges in events.log a resumed syncer
// recalls (SyncerCore::RecallMerges). A new run removes old logs and saves its version 0, the
// base the log replays over; a resumed one loads the checkpoint and replays the log over it, so
// Θ_p and v_p are exactly the last published.
//
// Without a run directory nothing is durable: the state starts from init_params, updates and
// checkpoints go nowhere, and a resume is refused.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/sync/event_log.h"
#include "daemon/sync/fragments.h"
#include "daemon/sync/global_state.h"
#include "daemon/sync/shards.h"
#include "daemon/sync/state_writer.h"
#include "daemon/sync/update_log.h"
#include "daemon/util/status.h"
#include "kernels/tensor_table.h"

namespace diloco {

struct SyncerStoreOptions {
  std::string run_dir;  // empty: nothing durable
  // The run's merges a resumed syncer recalls; empty: run_dir/events.log.
  std::string events_log;
  bool resume = false;  // from run_dir's checkpoint and update log (else a new run)
  // Checkpoints on a thread of their own, off the merge path (the wall syncer); else written at
  // once (the virtual syncer: its clock does not run while it writes).
  bool async_checkpoints = true;
  bool sync_log = true;  // fsync every update; a simulated crash loses no page cache
};

// The durable store of syncer shard `shard` of a run in run_dir: run_dir itself with one shard;
// with several, each its own directory run_dir/<shard name> (its checkpoint and update log),
// recalling merges from the run's events.log, which every shard appends to.
SyncerStoreOptions ShardStoreOptions(const std::string& run_dir, const ShardMap& shards, int shard);
// Where that store keeps its global_state.bin and update log.
std::string ShardStoreDir(const std::string& run_dir, int shard, int shards);

class SyncerStore {
 public:
  // Opens the store and fills *state: the resumed state (*replayed: update-log records applied
  // over the checkpoint), or the initial one from init_params (required then).
  static Status Open(const SyncerStoreOptions& options, const TensorTable& table,
                     const std::vector<Fragment>& fragments, const float* init_params, GlobalState* state,
                     uint64_t* replayed, std::unique_ptr<SyncerStore>* out);
  ~SyncerStore();

  bool durable() const { return update_log_ != nullptr; }
  const std::string& state_path() const { return state_path_; }
  // What the update log said when it opened (a torn tail it cut, ...); empty: nothing.
  std::string open_note() const;

  // Resumed: the merges of earlier incarnations (events.log; none when it is missing); a new
  // run: none.
  Status RecalledMerges(std::vector<MergeEvent>* out) const;

  // Every update is in the log (durable) before it is published.
  Status LogUpdate(const UpdateRecord& record);
  // The checkpoint recipe of update_log.h. Async: note says why one was skipped or failed (the
  // update log keeps everything meanwhile; note runs on the writer's thread, so it must be
  // thread-safe); written at once: the error.
  Status Checkpoint(const GlobalState& state, const std::function<void(const std::string&)>& note);
  // At the end: the final state, which covers every logged update, so the log is dropped.
  Status SaveFinal(const GlobalState& state);

 private:
  SyncerStore() = default;

  SyncerStoreOptions options_;
  std::string state_path_;
  std::unique_ptr<UpdateLog> update_log_;
  std::unique_ptr<AsyncStateWriter> state_writer_;  // async_checkpoints only
};

}  // namespace diloco
