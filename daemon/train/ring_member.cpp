#include "daemon/train/ring_member.h"

#include <chrono>
#include <thread>

#include "daemon/sync/protocol.h"
#include "daemon/train/data.h"
#include "daemon/train/inner_loop.h"
#include "daemon/train/local_ring.h"
#include "daemon/train/outer_state.h"
#include "daemon/train/trainer.h"
#include "kernels/comm/comm_store.h"
#include "kernels/gpt.h"
#include "kernels/rng.h"

namespace diloco {

std::string RingPointerName(int index) { return LearnerName(index); }

std::string RingIncarnationName(const std::string& job_id, int index, int64_t boot_ms, int attempt) {
  return job_id + "." + LearnerName(index) + "." + std::to_string(boot_ms) + "." + std::to_string(attempt);
}

Status RunRingMember(const RingMemberOptions& o, RingMemberResult* result) {
  const RunConfig& cfg = *o.config;
  const std::string me = LearnerName(o.index) + " (ring member, host " + std::to_string(o.host) + ")";
  if (o.host < 1 || o.host >= cfg.train.hosts)
    return Status::Error(me + ": host " + std::to_string(o.host) + " is not a member of a ring of train.hosts " +
                         std::to_string(cfg.train.hosts));
  RingMemberProgress progress;
  const auto report = [&](const std::string& state) {
    progress.state = state;
    if (o.on_progress) o.on_progress(progress);
  };
  report("starting");
  // The learner's data and initial model, as host 0 has them.
  std::unique_ptr<Corpus> corpus;
  DL_RETURN_IF_ERROR(Corpus::Load(cfg.data.corpus, CorpusOptionsOf(cfg, o.index, cfg.sync.learners), &corpus)
                         .WithContext(me));
  const int world = cfg.train.hosts * cfg.train.ranks;
  const BatchSampler train = TrainSampler(*corpus, world * cfg.train.batch_size, cfg.model.block_size,
                                          mix_seed(cfg.train.seed, (uint64_t)o.index));
  const GptConfig gc = GptConfigOf(cfg.model);
  std::vector<float> init(gpt_tensor_table(gc).total_numel());
  gpt_init_params(gc, cfg.train.seed, init.data());
  const auto stopping = [&] { return o.stop && o.stop->load(); };
  std::string failed;  // the last incarnation that failed here: never joined again
  const std::shared_ptr<CommStore> pointer = o.store_of(RingPointerName(o.index));
  while (!stopping()) {
    std::vector<char> value;
    const CommStatus got = pointer->get(kRingIncarnationKey, 1000, &value);
    if (!got.ok()) {
      if (got.error.find(kRingEnded) != std::string::npos) {
        report("ended");
        return Status::Ok();
      }
      if (progress.state != "waiting") report("waiting");
      continue;  // host 0 unreachable, or no incarnation yet
    }
    const std::string name(value.begin(), value.end());
    if (name == failed) {
      if (progress.state != "waiting") report("waiting");
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    progress.incarnation = name;
    report("joining");
    RingAcrossHosts across;
    across.host = o.host;
    across.hosts = cfg.train.hosts;
    across.ring_name = name;
    across.ring_address = o.ring_address;
    across.timeout_ms = o.timeout_ms;
    across.store = o.store_of(name);
    std::unique_ptr<LocalRing> ring;
    Status st = LocalRing::CreateAcrossHosts(LocalRingOptionsOf(cfg, std::max(1, o.threads)), across, &ring);
    if (st.ok()) {
      ring->Upload(init.data());
      if (o.on_ring) o.on_ring(ring.get());
      progress.incarnations = ++result->incarnations;
      report("following");
      std::vector<long> done(ring->ranks(), 0);
      st = ring->Run([&](int r) {
        return RunRingFollower(RankLoopOptions(cfg, train, ring->first_rank() + r, 0), *ring, r, cfg.train.shard,
                               &done[r]);
      });
      if (o.on_ring) o.on_ring(nullptr);
      result->steps = done[0];
      if (st.ok()) {  // rank 0 ended the ring: the learner finished or stopped
        report("ended");
        return Status::Ok();
      }
    }
    failed = name;
    progress.last_error = st.message();
    report("waiting");
  }
  result->stopped = true;
  report("ended");
  return Status::Ok();
}

}  // namespace diloco
