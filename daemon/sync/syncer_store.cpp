#include "daemon/sync/syncer_store.h"

#include <filesystem>

#include "daemon/net/codec.h"
#include "daemon/sync/protocol.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;

// run_dir's global_state.bin, checked against table and fragments, with the update log replayed
// over it: the checkpoint may be older than what was published.
Status Resume(const std::string& run_dir, const std::string& path, const TensorTable& table,
              const std::vector<Fragment>& fragments, GlobalState* state, uint64_t* replayed) {
  DL_RETURN_IF_ERROR(LoadGlobalState(path, state).WithContext("syncer: resuming"));
  DL_RETURN_IF_ERROR(CheckGlobalStateFits(*state, table, fragments).WithContext("syncer: resuming from '" + path + "'"));
  ReplayReport replay;
  auto decode = [](const Fragment& frag, const UpdateRecord& r, std::span<float> update) {
    return DecodeTensors(r.codec, r.payload, FragmentNumels(frag), r.tensor_bytes, update);
  };
  DL_RETURN_IF_ERROR(ReplayUpdateLogs(run_dir, fragments, decode, state, &replay)
                         .WithContext("syncer: replaying the update log over '" + path + "'"));
  *replayed = 0;
  for (uint64_t n : replay.replayed) *replayed += n;
  return Status::Ok();
}

}  // namespace

std::string ShardStoreDir(const std::string& run_dir, int shard, int shards) {
  if (shards == 1 || run_dir.empty()) return run_dir;
  return (fs::path(run_dir) / SyncerShardName(shard, shards)).string();
}

SyncerStoreOptions ShardStoreOptions(const std::string& run_dir, const ShardMap& shards, int shard) {
  SyncerStoreOptions o;
  o.run_dir = ShardStoreDir(run_dir, shard, shards.shards());
  if (o.run_dir != run_dir) o.events_log = (fs::path(run_dir) / "events.log").string();
  return o;
}

Status SyncerStore::Open(const SyncerStoreOptions& options, const TensorTable& table,
                         const std::vector<Fragment>& fragments, const float* init_params, GlobalState* state,
                         uint64_t* replayed, std::unique_ptr<SyncerStore>* out) {
  std::unique_ptr<SyncerStore> s(new SyncerStore());
  s->options_ = options;
  *replayed = 0;
  const bool durable = !options.run_dir.empty();
  if (durable) s->state_path_ = (fs::path(options.run_dir) / "global_state.bin").string();
  if (options.resume) {
    if (!durable) return Status::Error("syncer: resume needs a run directory");
    DL_RETURN_IF_ERROR(Resume(options.run_dir, s->state_path_, table, fragments, state, replayed));
  } else {
    if (init_params == nullptr) return Status::Error("syncer: no initial parameters and not resuming");
    *state = InitialGlobalState(table, fragments, init_params);
  }
  if (durable) {
    if (!options.resume) {
      // A new run: its version 0 is the base the update log replays over; no old log applies.
      std::error_code ec;
      fs::create_directories(options.run_dir, ec);  // a shard's own directory
      fs::remove(UpdateLogPath(options.run_dir), ec);
      fs::remove(PreviousUpdateLogPath(options.run_dir), ec);
      DL_RETURN_IF_ERROR(SaveGlobalState(s->state_path_, *state));
    }
    UpdateLogOptions lo;
    lo.sync = options.sync_log;
    DL_RETURN_IF_ERROR(UpdateLog::Open(options.run_dir, lo, &s->update_log_));
    if (options.async_checkpoints) s->state_writer_ = std::make_unique<AsyncStateWriter>(s->state_path_);
  }
  *out = std::move(s);
  return Status::Ok();
}

SyncerStore::~SyncerStore() = default;

std::string SyncerStore::open_note() const { return update_log_ ? update_log_->note() : std::string(); }

Status SyncerStore::RecalledMerges(std::vector<MergeEvent>* out) const {
  out->clear();
  if (!options_.resume) return Status::Ok();
  const std::string path =
      options_.events_log.empty() ? (fs::path(options_.run_dir) / "events.log").string() : options_.events_log;
  return ReadEventLog(path, /*missing_ok=*/true, out);
}

Status SyncerStore::LogUpdate(const UpdateRecord& record) {
  return update_log_ ? update_log_->Append(record) : Status::Ok();
}

// Written off the merge path when async: a copy of the state goes to the writer's thread
// (skipped while the previous one is still being written); the log segment it covers is dropped
// once the file is durable.
Status SyncerStore::Checkpoint(const GlobalState& state, const std::function<void(const std::string&)>& note) {
  if (!update_log_ || (state_writer_ && state_writer_->busy())) return Status::Ok();
  Status st = update_log_->HasPrevious() ? Status::Ok() : update_log_->Rotate();
  if (!state_writer_) {
    if (st.ok()) st = SaveGlobalState(state_path_, state);
    if (st.ok()) st = update_log_->DropPrevious();
    return st.WithContext("checkpoint");
  }
  if (!st.ok()) {
    note("skipping a checkpoint: " + st.message());
    return Status::Ok();
  }
  UpdateLog* log = update_log_.get();
  state_writer_->Submit(state, [log, note](Status written) {
    if (written.ok()) (void)log->DropPrevious();
    else note("checkpoint failed (the update log keeps everything): " + written.message());
  });
  return Status::Ok();
}

Status SyncerStore::SaveFinal(const GlobalState& state) {
  if (!update_log_) return Status::Ok();
  if (state_writer_) (void)state_writer_->Wait();
  DL_RETURN_IF_ERROR(SaveGlobalState(state_path_, state));
  if (!update_log_->HasPrevious()) DL_RETURN_IF_ERROR(update_log_->Rotate());
  return update_log_->DropPrevious();
}

}  // namespace diloco
