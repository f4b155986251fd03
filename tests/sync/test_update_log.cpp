#include "daemon/sync/update_log.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <string>
#include <vector>

#include "daemon/net/codec.h"
#include "daemon/sync/merge.h"
#include "daemon/sync/state_writer.h"
#include "daemon/sync/syncer_store.h"
#include "daemon/util/crc32c.h"
#include "kernels/gpt.h"
#include "kernels/rng.h"
#include "tests/temp_dir.h"

namespace diloco {
namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using diloco::testing::TempDir;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::unique_ptr<UpdateLog> OpenLog(const std::string& dir) {
  std::unique_ptr<UpdateLog> log;
  const Status st = UpdateLog::Open(dir, {}, &log);
  REQUIRE(st.message() == "");
  return log;
}

// A record with arbitrary bytes: the log does not decode.
UpdateRecord SomeRecord(uint32_t fragment, uint64_t version, std::vector<uint64_t> tensor_bytes, uint8_t fill) {
  UpdateRecord r;
  r.fragment = fragment;
  r.version = version;
  r.theta_crc32c = 0xA0B0C0D0u + (uint32_t)version;
  r.codec = {CodecKind::kInt8, 128, 0};
  r.tensor_bytes = std::move(tensor_bytes);
  uint64_t n = 0;
  for (uint64_t b : r.tensor_bytes) n += b;
  for (uint64_t i = 0; i < n; ++i) r.payload.push_back((uint8_t)(fill + i));
  return r;
}

std::vector<UpdateRecord> ThreeRecords() {
  std::vector<UpdateRecord> records = {SomeRecord(0, 1, {3, 5}, 7), SomeRecord(2, 1, {40}, 9),
                                       SomeRecord(0, 2, {1, 2, 3}, 11)};
  records[1].codec = {CodecKind::kFp32, 64, 0.25};
  return records;
}

// Appends records to dir's log; returns the segment size after each.
std::vector<uint64_t> AppendAll(const std::string& dir, const std::vector<UpdateRecord>& records) {
  std::unique_ptr<UpdateLog> log = OpenLog(dir);
  std::vector<uint64_t> ends;
  for (const UpdateRecord& r : records) {
    REQUIRE(log->Append(r).message() == "");
    ends.push_back(log->bytes());
  }
  return ends;
}

std::vector<UpdateRecord> ReadAll(const std::string& path, SegmentScan* scan = nullptr) {
  std::vector<UpdateRecord> records;
  const Status st = ReadUpdateLog(path, &records, scan);
  REQUIRE(st.message() == "");
  return records;
}

TEST_CASE("update log: records round trip, and a reopened log appends after them", "[unit][update_log]") {
  TempDir dir;
  const std::vector<UpdateRecord> records = ThreeRecords();
  const std::vector<uint64_t> ends = AppendAll(dir.path(), records);
  // 24-byte frame header + 40 fixed body bytes + 8 per tensor + the payload.
  CHECK(ends[0] == 24 + 40 + 16 + 8);
  CHECK(ends[2] == fs::file_size(UpdateLogPath(dir.path())));

  std::unique_ptr<UpdateLog> log = OpenLog(dir.path());
  CHECK(log->records() == 3);
  CHECK(log->bytes() == ends[2]);
  CHECK(log->note() == "");
  const UpdateRecord fourth = SomeRecord(1, 1, {}, 0);  // no tensors: an empty fragment
  REQUIRE(log->Append(fourth).ok());

  SegmentScan scan;
  std::vector<UpdateRecord> read = ReadAll(UpdateLogPath(dir.path()), &scan);
  REQUIRE(read.size() == 4);
  for (size_t i = 0; i < 3; ++i) CHECK(read[i] == records[i]);
  CHECK(read[3] == fourth);
  CHECK(read[1].codec.topk_fraction == 0.25);
  CHECK(scan.records == 4);
  CHECK(scan.torn_tail_bytes == 0);
}

TEST_CASE("update log: a record whose tensors do not add up to its payload is refused", "[unit][update_log]") {
  TempDir dir;
  std::unique_ptr<UpdateLog> log = OpenLog(dir.path());
  UpdateRecord r = SomeRecord(0, 1, {4, 4}, 1);
  r.payload.pop_back();
  const Status st = log->Append(r);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Contains("tensor bytes sum to 8, payload has 7"));
  CHECK_THAT(st.message(), Contains("do not publish"));
  CHECK(log->bytes() == 0);
  CHECK(fs::file_size(log->path()) == 0);
}

TEST_CASE("update log: a torn tail is truncated on Open and the earlier records survive", "[unit][update_log]") {
  TempDir dir;
  const std::vector<UpdateRecord> records = ThreeRecords();
  const std::vector<uint64_t> ends = AppendAll(dir.path(), records);
  const std::string path = UpdateLogPath(dir.path());
  const std::string whole = ReadBytes(path);

  // Cut inside the third record's header, inside its body, one byte short; or a zero-filled tail.
  const uint64_t cut = GENERATE_COPY(ends[1] + 10, ends[1] + 30, ends[2] - 1, uint64_t{0});
  std::string torn = cut > 0 ? whole.substr(0, cut) : whole.substr(0, ends[1]) + std::string(300, '\0');
  WriteBytes(path, torn);
  const uint64_t dropped = torn.size() - ends[1];

  std::unique_ptr<UpdateLog> log = OpenLog(dir.path());
  CHECK(log->truncated_bytes() == dropped);
  CHECK_THAT(log->note(), Contains("torn record of " + std::to_string(dropped) + " bytes"));
  CHECK_THAT(log->note(), Contains("byte offset " + std::to_string(ends[1])));
  CHECK(fs::file_size(path) == ends[1]);
  CHECK(log->records() == 2);

  // The log goes on where the whole records end.
  REQUIRE(log->Append(records[2]).ok());
  std::vector<UpdateRecord> read = ReadAll(path);
  REQUIRE(read.size() == 3);
  CHECK(read == records);
  CHECK(ReadBytes(path) == whole);
}

TEST_CASE("update log: a flipped byte in a middle record is an error naming its offset", "[unit][update_log]") {
  TempDir dir;
  const std::vector<uint64_t> ends = AppendAll(dir.path(), ThreeRecords());
  const std::string path = UpdateLogPath(dir.path());
  std::string bytes = ReadBytes(path);
  // In the second record (at ends[0]): a payload byte, or its length field.
  const uint64_t at = GENERATE_COPY(ends[1] - 3, ends[0] + 9);
  bytes[at] ^= 0x10;
  WriteBytes(path, bytes);

  std::unique_ptr<UpdateLog> log;
  const Status st = UpdateLog::Open(dir.path(), {}, &log);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Contains(path));
  CHECK_THAT(st.message(), Contains("damaged at byte offset " + std::to_string(ends[0])));
  CHECK_THAT(st.message(), Contains(at == ends[0] + 9 ? "header CRC" : "body CRC"));
  CHECK(ReadBytes(path) == bytes);  // damage is never truncated away

  std::vector<UpdateRecord> read;
  CHECK_THAT(ReadUpdateLog(path, &read).message(), Contains("offset " + std::to_string(ends[0])));
}

// The syncer's publish path on a small model: encode an update with the downlink codec, apply
// exactly the decoded update, log it. `direct` is the syncer's live state.
struct Publisher {
  TensorTable table;
  std::vector<Fragment> fragments;
  std::vector<float> params;  // version 0
  GlobalState direct;
  ErrorFeedback ef;
  Rng rng{5};

  Publisher(CodecKind kind, int num_fragments) : ef(CodecOptions{kind, 32, 0}) {
    table = gpt_tensor_table(GptConfig{.vocab_size = 64, .block_size = 8, .n_layer = 2, .n_embd = 16, .n_head = 2});
    REQUIRE(PartitionFragments(table, num_fragments, &fragments).ok());
    params.resize(table.total_numel());
    for (float& x : params) x = (float)rng.normal();
    direct = InitialGlobalState(table, fragments, params.data());
    for (FragmentGlobal& f : direct.fragments) {
      for (float& u : f.momentum) u = (float)rng.normal();
    }
  }

  static std::vector<uint64_t> Numels(const Fragment& f) {
    std::vector<uint64_t> n;
    for (const FragmentRange& r : f.ranges) n.push_back(r.numel);
    return n;
  }

  UpdateRecord Merge(uint32_t p) {
    FragmentGlobal& fg = direct.fragments[p];
    std::vector<float> update(fg.theta.size()), decoded(fg.theta.size());
    for (float& x : update) x = (float)(0.01 * rng.normal());
    UpdateRecord r;
    REQUIRE(ef.Encode(p, update, Numels(fragments[p]), &r.payload, &r.tensor_bytes).ok());
    REQUIRE(DecodeTensors(ef.options(), r.payload, Numels(fragments[p]), r.tensor_bytes, decoded).ok());
    ApplyUpdate(decoded.data(), decoded.size(), fg.theta.data());
    r.fragment = p;
    r.version = ++fg.version;
    r.theta_crc32c = Crc32c(fg.theta.data(), fg.theta.size() * sizeof(float));
    r.codec = ef.options();
    direct.merges++;
    return r;
  }

  UpdateDecoder Decoder() const {
    return [](const Fragment& f, const UpdateRecord& r, std::span<float> out) {
      return DecodeTensors(r.codec, r.payload, Numels(f), r.tensor_bytes, out);
    };
  }
};

void CheckSameTheta(const GlobalState& a, const GlobalState& b) {
  REQUIRE(a.fragments.size() == b.fragments.size());
  for (size_t p = 0; p < a.fragments.size(); ++p) {
    INFO("fragment " << p);
    CHECK(a.fragments[p].version == b.fragments[p].version);
    REQUIRE(a.fragments[p].theta.size() == b.fragments[p].theta.size());
    CHECK(std::memcmp(a.fragments[p].theta.data(), b.fragments[p].theta.data(),
                      a.fragments[p].theta.size() * sizeof(float)) == 0);
  }
}

GlobalState Load(const std::string& path) {
  GlobalState state;
  REQUIRE(LoadGlobalState(path, &state).message() == "");
  return state;
}

TEST_CASE("update log: replay over a checkpoint rebuilds the published state bit-exactly", "[unit][update_log]") {
  const CodecKind kind = GENERATE(CodecKind::kInt4, CodecKind::kFp32);
  INFO(CodecName(kind));
  TempDir dir;
  Publisher pub(kind, 3);
  const std::string ckpt = dir.file("global_state.bin");
  REQUIRE(SaveGlobalState(ckpt, pub.direct).ok());
  const GlobalState initial = pub.direct;
  std::unique_ptr<UpdateLog> log = OpenLog(dir.path());
  REQUIRE(log->Append(pub.Merge(0)).ok());
  REQUIRE(log->Append(pub.Merge(1)).ok());
  REQUIRE(SaveGlobalState(ckpt, pub.direct).ok());  // a checkpoint covering the first two
  const GlobalState at_checkpoint = pub.direct;
  for (uint32_t p : {2u, 0u, 0u, 1u, 2u, 0u}) REQUIRE(log->Append(pub.Merge(p)).ok());

  GlobalState state = Load(ckpt);
  ReplayReport report;
  REQUIRE(ReplayUpdateLogs(dir.path(), pub.fragments, pub.Decoder(), &state, &report).message() == "");
  CheckSameTheta(state, pub.direct);
  CHECK(report.replayed == std::vector<uint64_t>{3, 1, 2});
  CHECK(report.skipped == 2);
  CHECK(state.merges == pub.direct.merges);
  for (size_t p = 0; p < 3; ++p) CHECK(state.fragments[p].momentum == at_checkpoint.fragments[p].momentum);

  // From version 0 every record applies.
  state = initial;
  REQUIRE(ReplayUpdateLogs(dir.path(), pub.fragments, pub.Decoder(), &state, &report).ok());
  CheckSameTheta(state, pub.direct);
  CHECK(report.replayed == std::vector<uint64_t>{4, 2, 2});
  CHECK(report.skipped == 0);
}

TEST_CASE("update log: a missing version is a hole, a wrong theta CRC a mismatch", "[unit][update_log]") {
  TempDir dir;
  Publisher pub(CodecKind::kInt4, 2);
  const GlobalState initial = pub.direct;
  std::vector<UpdateRecord> records;
  for (int i = 0; i < 4; ++i) records.push_back(pub.Merge(1));
  std::unique_ptr<UpdateLog> log = OpenLog(dir.path());
  GlobalState state = initial;
  ReplayReport report;

  SECTION("hole") {
    for (int i : {0, 1, 3}) REQUIRE(log->Append(records[i]).ok());
    const Status st = ReplayUpdateLogs(dir.path(), pub.fragments, pub.Decoder(), &state, &report);
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(st.message(), Contains("fragment 1 version 4"));
    CHECK_THAT(st.message(), Contains("hole in the log (versions 3..3 are missing)"));
    CHECK_THAT(st.message(), Contains(log->path()));
  }
  SECTION("CRC mismatch") {
    records[2].theta_crc32c ^= 1;
    for (const UpdateRecord& r : records) REQUIRE(log->Append(r).ok());
    const Status st = ReplayUpdateLogs(dir.path(), pub.fragments, pub.Decoder(), &state, &report);
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(st.message(), Contains("after replaying fragment 1 version 3"));
  }
}

TEST_CASE("update log: rotation, then replay across prev and current", "[unit][update_log]") {
  TempDir dir;
  Publisher pub(CodecKind::kInt4, 2);
  const GlobalState initial = pub.direct;
  const std::string ckpt = dir.file("global_state.bin");
  std::unique_ptr<UpdateLog> log = OpenLog(dir.path());
  REQUIRE(log->Append(pub.Merge(0)).ok());
  REQUIRE(log->Append(pub.Merge(1)).ok());
  CHECK_FALSE(log->HasPrevious());
  REQUIRE(log->Rotate().message() == "");
  REQUIRE(SaveGlobalState(ckpt, pub.direct).ok());  // what the rotation's checkpoint holds
  CHECK(log->HasPrevious());
  CHECK(log->records() == 0);
  CHECK(ReadAll(log->previous_path()).size() == 2);
  const Status again = log->Rotate();
  REQUIRE_FALSE(again.ok());
  CHECK_THAT(again.message(), Contains("still exists"));
  REQUIRE(log->Append(pub.Merge(0)).ok());
  REQUIRE(log->Append(pub.Merge(0)).ok());
  CHECK(ReadAll(log->path()).size() == 2);

  ReplayReport report;
  GlobalState state = initial;  // the checkpoint before prev: both segments apply
  REQUIRE(ReplayUpdateLogs(dir.path(), pub.fragments, pub.Decoder(), &state, &report).ok());
  CheckSameTheta(state, pub.direct);
  CHECK(report.replayed == std::vector<uint64_t>{3, 1});

  state = Load(ckpt);  // its checkpoint is durable, prev not yet dropped (a crash here)
  REQUIRE(ReplayUpdateLogs(dir.path(), pub.fragments, pub.Decoder(), &state, &report).ok());
  CheckSameTheta(state, pub.direct);
  CHECK(report.replayed == std::vector<uint64_t>{2, 0});
  CHECK(report.skipped == 2);

  REQUIRE(log->DropPrevious().ok());
  CHECK_FALSE(log->HasPrevious());
  CHECK_FALSE(fs::exists(log->previous_path()));
  state = Load(ckpt);
  REQUIRE(ReplayUpdateLogs(dir.path(), pub.fragments, pub.Decoder(), &state, &report).ok());
  CheckSameTheta(state, pub.direct);
  REQUIRE(log->Rotate().ok());
}

// The store every syncer runtime opens (syncer_store.h), over the publish path above.
std::unique_ptr<SyncerStore> OpenStore(const Publisher& pub, const std::string& dir, bool resume, GlobalState* state,
                                       uint64_t* replayed) {
  SyncerStoreOptions o;
  o.run_dir = dir;
  o.resume = resume;
  o.async_checkpoints = false;
  o.sync_log = false;
  std::unique_ptr<SyncerStore> store;
  const Status st = SyncerStore::Open(o, pub.table, pub.fragments, pub.params.data(), state, replayed, &store);
  REQUIRE(st.message() == "");
  return store;
}

TEST_CASE("syncer store: a new run starts at version 0, a resumed one where its updates left off", "[unit][update_log]") {
  TempDir dir;
  Publisher pub(CodecKind::kInt4, 3);
  {  // An earlier run's log in the directory: a new run must not replay it.
    std::unique_ptr<UpdateLog> stale = OpenLog(dir.path());
    REQUIRE(stale->Append(SomeRecord(0, 1, {3}, 1)).ok());
  }
  GlobalState state;
  uint64_t replayed = 9;
  std::unique_ptr<SyncerStore> store = OpenStore(pub, dir.path(), false, &state, &replayed);
  CHECK(replayed == 0);
  CHECK(store->durable());
  CheckSameTheta(Load(dir.file("global_state.bin")), state);  // version 0 saved
  CheckSameTheta(state, pub.direct);
  std::vector<UpdateRecord> records;
  REQUIRE(ReadUpdateLog(UpdateLogPath(dir.path()), &records).ok());
  CHECK(records.empty());
  std::vector<MergeEvent> merges;
  REQUIRE(store->RecalledMerges(&merges).ok());
  CHECK(merges.empty());

  // Two updates, a checkpoint (written at once: the segment it covers is dropped), one more.
  REQUIRE(store->LogUpdate(pub.Merge(0)).ok());
  REQUIRE(store->LogUpdate(pub.Merge(1)).ok());
  REQUIRE(store->Checkpoint(pub.direct, [](const std::string& line) { FAIL(line); }).ok());
  CHECK_FALSE(fs::exists(PreviousUpdateLogPath(dir.path())));
  REQUIRE(store->LogUpdate(pub.Merge(2)).ok());
  MergeEvent merge;
  merge.fragment = 2;
  merge.version = 1;
  merge.contributors.push_back({});
  merge.contributors.back().learner = 1;
  merge.contributors.back().learner_step = 25;
  EventLog events;
  REQUIRE(events.Open(dir.file("events.log")).ok());
  REQUIRE(events.Append(merge).ok());
  store.reset();  // killed

  GlobalState resumed;
  store = OpenStore(pub, dir.path(), true, &resumed, &replayed);
  CHECK(replayed == 1);  // the update after the checkpoint
  CheckSameTheta(resumed, pub.direct);
  REQUIRE(store->RecalledMerges(&merges).ok());
  REQUIRE(merges.size() == 1);
  CHECK(merges[0].contributors.at(0).learner_step == 25);
  // At the end the final state covers the log.
  REQUIRE(store->SaveFinal(resumed).ok());
  REQUIRE(ReadUpdateLog(UpdateLogPath(dir.path()), &records).ok());
  CHECK(records.empty());
  CheckSameTheta(Load(dir.file("global_state.bin")), pub.direct);
}

TEST_CASE("syncer store: without a run directory nothing is durable and a resume is refused", "[unit][update_log]") {
  Publisher pub(CodecKind::kInt4, 2);
  SyncerStoreOptions o;
  GlobalState state;
  uint64_t replayed = 0;
  std::unique_ptr<SyncerStore> store;
  REQUIRE(SyncerStore::Open(o, pub.table, pub.fragments, pub.params.data(), &state, &replayed, &store).ok());
  CHECK_FALSE(store->durable());
  CHECK(store->LogUpdate(pub.Merge(0)).ok());
  CHECK(store->Checkpoint(pub.direct, [](const std::string&) {}).ok());
  CHECK(store->SaveFinal(pub.direct).ok());
  o.resume = true;
  CHECK_THAT(SyncerStore::Open(o, pub.table, pub.fragments, nullptr, &state, &replayed, &store).message(),
             Contains("resume needs a run directory"));
  o.resume = false;
  CHECK_THAT(SyncerStore::Open(o, pub.table, pub.fragments, nullptr, &state, &replayed, &store).message(),
             Contains("no initial parameters"));
}

TEST_CASE("state writer: writes a state that loads back equal, and Wait waits", "[unit][state_writer]") {
  TempDir dir;
  Publisher pub(CodecKind::kFp32, 2);
  pub.Merge(1);
  const std::string path = dir.file("global_state.bin");
  AsyncStateWriter writer(path);
  std::promise<Status> done;
  REQUIRE(writer.Submit(pub.direct, [&](Status s) { done.set_value(s); }));
  REQUIRE(writer.Wait().message() == "");
  CHECK_FALSE(writer.busy());
  CHECK(done.get_future().get().ok());  // set before Wait returned
  CHECK(Load(path) == pub.direct);
  CHECK_FALSE(fs::exists(path + ".tmp"));
}

TEST_CASE("state writer: a second Submit while one is in flight is refused", "[unit][state_writer]") {
  TempDir dir;
  Publisher pub(CodecKind::kFp32, 2);
  const std::string path = dir.file("global_state.bin");
  AsyncStateWriter writer(path);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  int second_done = 0;
  // The first write stays in flight until the test releases its done callback.
  REQUIRE(writer.Submit(pub.direct, [released](Status) { released.wait(); }));
  CHECK(writer.busy());
  GlobalState other = pub.direct;
  other.merges = 99;
  CHECK_FALSE(writer.Submit(other, [&](Status) { ++second_done; }));
  release.set_value();
  REQUIRE(writer.Wait().ok());
  CHECK(second_done == 0);
  CHECK(Load(path).merges == pub.direct.merges);  // the refused state was not written
  REQUIRE(writer.Submit(other, [&](Status) { ++second_done; }));
  REQUIRE(writer.Wait().ok());
  CHECK(second_done == 1);
  CHECK(Load(path).merges == 99);
}

TEST_CASE("state writer: a failed save reaches done and Wait; the destructor finishes a write",
          "[unit][state_writer]") {
  TempDir dir;
  Publisher pub(CodecKind::kFp32, 2);
  {
    AsyncStateWriter writer(dir.file("missing/global_state.bin"));
    Status seen;
    REQUIRE(writer.Submit(pub.direct, [&](Status s) { seen = s; }));
    const Status st = writer.Wait();
    REQUIRE_FALSE(st.ok());
    CHECK(st.message() == seen.message());
    CHECK_THAT(st.message(), Contains("missing"));
  }
  const std::string path = dir.file("global_state.bin");
  {
    AsyncStateWriter writer(path);
    REQUIRE(writer.Submit(pub.direct, nullptr));
  }  // no Wait: the destructor must let the write finish
  CHECK(Load(path) == pub.direct);
}

TEST_CASE("state writer: done may drop the update log's previous segment", "[unit][state_writer][update_log]") {
  TempDir dir;
  Publisher pub(CodecKind::kInt4, 2);
  std::unique_ptr<UpdateLog> log = OpenLog(dir.path());
  REQUIRE(log->Append(pub.Merge(0)).ok());
  REQUIRE(log->Rotate().ok());
  AsyncStateWriter writer(dir.file("global_state.bin"));
  REQUIRE(writer.Submit(pub.direct, [&](Status s) {
    if (s.ok()) (void)log->DropPrevious();
  }));
  REQUIRE(log->Append(pub.Merge(1)).ok());  // the merge path goes on meanwhile
  REQUIRE(writer.Wait().ok());
  CHECK_FALSE(log->HasPrevious());
  GlobalState state = Load(writer.path());
  ReplayReport report;
  REQUIRE(ReplayUpdateLogs(dir.path(), pub.fragments, pub.Decoder(), &state, &report).ok());
  CheckSameTheta(state, pub.direct);
  CHECK(report.replayed == std::vector<uint64_t>{0, 1});
}

}  // namespace
}  // namespace diloco
