// One process of a Gloo ring for tests/kernels/test_gloo_comm.cpp: runs a
// scenario of tests/kernels/gloo_scenarios.h on its ranks (one thread each)
// and writes what each rank got to out_dir:
//   rank<r>.bin   the rank's result bytes
//   rank<r>.err   why the rank failed
//   rank<r>.fail  die/stall scenarios: "<ms the failing collective took>\n<its error>"
//
// gloo_comm_worker SCENARIO STORE_DIR RING WORLD FIRST_RANK LOCAL_RANKS OUT_DIR TIMEOUT_MS
//   collectives | train   the scenarios; exit 0 when every rank succeeded
//   die | stall           every rank all-reduces twice; then the process whose
//                         first rank is not 0 exits (die) or sleeps (stall),
//                         and the others all-reduce a third time, which must fail
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/comm/gloo_comm.h"
#include "tests/kernels/gloo_scenarios.h"

namespace {

using namespace diloco;

void write_file(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), (std::streamsize)bytes.size());
}

void write_text(const std::string& path, const std::string& text) {
  write_file(path, std::vector<char>(text.begin(), text.end()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 9) {
    std::fprintf(stderr,
                 "usage: %s SCENARIO STORE_DIR RING WORLD FIRST_RANK LOCAL_RANKS OUT_DIR TIMEOUT_MS\n", argv[0]);
    return 2;
  }
  const std::string scenario = argv[1], out_dir = argv[7];
  GlooCommOptions options;
  options.store = std::make_shared<DirectoryCommStore>(argv[2]);
  options.ring_name = argv[3];
  options.world_size = std::atoi(argv[4]);
  options.first_rank = std::atoi(argv[5]);
  options.local_ranks = std::atoi(argv[6]);
  options.timeout_ms = std::atoll(argv[8]);
  options.rendezvous_timeout_ms = 60000;
  std::unique_ptr<GlooCommGroup> group;
  if (std::string e = GlooCommGroup::Create(options, &group); !e.empty()) {
    std::fprintf(stderr, "gloo_comm_worker: %s\n", e.c_str());
    return 1;
  }
  const bool victim = options.first_rank != 0;
  std::vector<int> ok(options.local_ranks, 0);
  std::vector<std::thread> threads;
  for (int l = 0; l < options.local_ranks; l++) {
    threads.emplace_back([&, l] {
      std::unique_ptr<LocalComm> comm = group->comm(l);
      const std::string base = out_dir + "/rank" + std::to_string(comm->rank());
      CommStatus st;
      if (scenario == "collectives") {
        std::vector<char> out;
        st = gloo_testing::RunCollectives(*comm, &out);
        if (st.ok()) write_file(base + ".bin", out);
      } else if (scenario == "train") {
        std::vector<float> params;
        st = gloo_testing::TrainRank(*comm, &params);
        if (st.ok()) {
          std::vector<char> out;
          gloo_testing::append_bytes(params, &out);
          write_file(base + ".bin", out);
        }
      } else if (scenario == "die" || scenario == "stall") {
        std::vector<float> x(4096, 1.0f);
        for (int i = 0; i < 2 && st.ok(); i++) st = comm->all_reduce(x.data(), x.size(), ReduceOp::kSum);
        if (st.ok() && !victim) {
          const auto t0 = std::chrono::steady_clock::now();
          const CommStatus third = comm->all_reduce(x.data(), x.size(), ReduceOp::kSum);
          const auto ms =
              std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
          write_text(base + ".fail", std::to_string(ms) + "\n" + (third.ok() ? "ok" : third.error));
        }
      } else {
        st = CommStatus::Error("unknown scenario " + scenario);
      }
      if (!st.ok()) write_text(base + ".err", st.error);
      ok[l] = st.ok();
    });
  }
  for (auto& t : threads) t.join();
  if (victim && scenario == "die") _exit(3);  // sockets close: the survivors see EOF
  if (victim && scenario == "stall") {
    std::this_thread::sleep_for(std::chrono::seconds(60));  // the test kills us first
    return 3;
  }
  for (int v : ok)
    if (!v) return 1;
  return 0;
}
