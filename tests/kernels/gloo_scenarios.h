// What the Gloo ring tests run on every rank: once in worker processes over
// a GlooCommGroup (tests/kernels/gloo_worker.cpp) and once on a
// ThreadCommGroup inside the test (tests/kernels/test_gloo_comm.cpp). One
// definition, so both sides see the same inputs and call the same
// collectives; the test compares their result bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/comm/local_comm.h"
#include "kernels/rng.h"

namespace diloco::gloo_testing {

inline std::vector<float> random_floats(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = (float)rng.normal();
  return v;
}

template <typename T>
void append_bytes(const std::vector<T>& v, std::vector<char>* out) {
  const char* p = reinterpret_cast<const char*>(v.data());
  out->insert(out->end(), p, p + v.size() * sizeof(T));
}

// Uneven parts with an empty one: 5, 0, 19, 26, ... floats.
inline std::vector<size_t> uneven_counts(int world) {
  std::vector<size_t> counts(world);
  for (int q = 0; q < world; q++) counts[q] = q == 1 ? 0 : 7 * (size_t)q + 5;
  return counts;
}

// Every collective, on inputs that depend on the rank; *out = this rank's results, back to back.
inline CommStatus RunCollectives(LocalComm& comm, std::vector<char>* out) {
  const int R = comm.world_size(), r = comm.rank();
  const size_t n = 1003;  // not a multiple of R
  std::vector<float> a = random_floats(n, 10 + r), b = a;
  if (CommStatus st = comm.all_reduce(a.data(), n, ReduceOp::kSum); !st.ok()) return st;
  if (CommStatus st = comm.all_reduce(b.data(), n, ReduceOp::kMean); !st.ok()) return st;
  append_bytes(a, out);
  append_bytes(b, out);
  std::vector<float> none(1, 7.0f);
  if (CommStatus st = comm.all_reduce(none.data(), 0, ReduceOp::kSum); !st.ok()) return st;
  append_bytes(none, out);

  const std::vector<size_t> counts = uneven_counts(R);
  size_t total = 0;
  for (size_t c : counts) total += c;
  const size_t at = PartOffset(counts, r);
  // reduce_scatter alone: only this rank's part is specified.
  std::vector<float> c = random_floats(total, 30 + r);
  if (CommStatus st = comm.reduce_scatter(c.data(), counts, ReduceOp::kSum); !st.ok()) return st;
  append_bytes(std::vector<float>(c.begin() + at, c.begin() + at + counts[r]), out);
  // reduce_scatter (mean) + all_gather: a whole all-reduce.
  std::vector<float> d = random_floats(total, 40 + r);
  if (CommStatus st = comm.reduce_scatter(d.data(), counts, ReduceOp::kMean); !st.ok()) return st;
  if (CommStatus st = comm.all_gather(d.data(), counts); !st.ok()) return st;
  append_bytes(d, out);
  // all_gather alone: every part from its owner.
  std::vector<float> e = random_floats(total, 60 + r);
  if (CommStatus st = comm.all_gather(e.data(), counts); !st.ok()) return st;
  append_bytes(e, out);

  std::vector<double> h = {r + 1.0 / 3.0, 1e-17 * r, -2.5 * r}, hm = h;
  if (CommStatus st = comm.all_reduce_host(h.data(), 3, ReduceOp::kSum); !st.ok()) return st;
  if (CommStatus st = comm.all_reduce_host(hm.data(), 3, ReduceOp::kMean); !st.ok()) return st;
  append_bytes(h, out);
  append_bytes(hm, out);

  std::vector<float> f = random_floats(n, 50 + r);
  if (CommStatus st = comm.broadcast(f.data(), n, R - 1); !st.ok()) return st;
  append_bytes(f, out);
  return comm.barrier();
}

// The acceptance run: a small GPT, 5 ring steps on per-rank batches.
inline GptConfig TrainModel() {
  GptConfig m;
  m.vocab_size = 64;
  m.block_size = 16;
  m.n_layer = 2;
  m.n_embd = 32;
  m.n_head = 2;
  return m;
}
constexpr int kTrainB = 2;
constexpr int kTrainSteps = 5;

// Rank r's batch at step s: tokens from a seeded LCG.
inline void TrainBatch(const GptConfig& m, int B, int rank, int step, std::vector<int>* inputs,
                       std::vector<int>* targets) {
  const int T = m.block_size;
  uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(rank * 1000 + step + 1);
  inputs->resize((size_t)B * T);
  targets->resize((size_t)B * T);
  for (int b = 0; b < B; b++) {
    std::vector<int> tokens(T + 1);
    for (int& t : tokens) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      t = (int)((x >> 33) % (uint64_t)m.vocab_size);
    }
    for (int t = 0; t < T; t++) {
      (*inputs)[(size_t)b * T + t] = tokens[t];
      (*targets)[(size_t)b * T + t] = tokens[t + 1];
    }
  }
}

// *params = this rank's parameters after the run.
inline CommStatus TrainRank(LocalComm& comm, std::vector<float>* params) {
  BackendOptions options;
  options.model = TrainModel();
  options.max_batch = kTrainB;
  std::unique_ptr<TrainingBackend> backend;
  if (std::string e = CreateBackend("cpu", options, &backend); !e.empty()) return CommStatus::Error(e);
  backend->init_weights(1234);
  const AdamWHyper hp;
  std::vector<int> inputs, targets;
  for (int step = 0; step < kTrainSteps; step++) {
    TrainBatch(options.model, kTrainB, comm.rank(), step, &inputs, &targets);
    StepStats stats;
    if (CommStatus st = ring_train_step(*backend, comm, inputs.data(), targets.data(), kTrainB,
                                        options.model.block_size, hp, /*grad_clip=*/1.0, &stats);
        !st.ok())
      return st;
    if (!stats.applied) return CommStatus::Error("step " + std::to_string(step) + " was not applied");
  }
  params->resize(backend->num_params());
  backend->download_params(params->data());
  return CommStatus::Ok();
}

}  // namespace diloco::gloo_testing
