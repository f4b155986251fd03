// The Gloo local ring (kernels/comm/gloo_comm.h): ranks in real processes
// (tests/kernels/gloo_worker.cpp, two processes of two ranks each, meeting
// through a DirectoryCommStore in a temp dir) must get bitwise what the
// thread ring gets on the same inputs (tests/kernels/gloo_scenarios.h), and
// a dead or stalled peer must fail the survivors' next collective in time.
#include "kernels/comm/gloo_comm.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <iterator>
#include <thread>

#include "tests/kernels/gloo_scenarios.h"
#include "tests/temp_dir.h"

extern char** environ;

namespace diloco {
namespace {

using Clock = std::chrono::steady_clock;
using testing::TempDir;

// Starts the worker binary with args; returns its pid.
pid_t spawn_worker(const std::vector<std::string>& args) {
  std::vector<std::string> all = {GLOO_WORKER_PATH};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  REQUIRE(posix_spawn(&pid, GLOO_WORKER_PATH, nullptr, nullptr, argv.data(), environ) == 0);
  return pid;
}

// Waits up to timeout for pid; kills it after that. Returns its exit status, or -signal.
int wait_worker(pid_t pid, std::chrono::seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      FAIL("worker " << pid << " did not finish within " << timeout.count() << " s: killed");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string read_text(const std::string& path) {
  const std::vector<char> b = read_file(path);
  return std::string(b.begin(), b.end());
}

// Two worker processes of two ranks each (global ranks 0,1 and 2,3); requires both to exit 0.
void run_two_processes(const TempDir& dir, const std::string& scenario, const std::string& ring) {
  std::vector<pid_t> pids;
  for (int p = 0; p < 2; p++)
    pids.push_back(spawn_worker({scenario, dir.file("store"), ring, "4", std::to_string(2 * p), "2",
                                 dir.path().string(), "20000"}));
  for (int p = 0; p < 2; p++) {
    const int rc = wait_worker(pids[p], std::chrono::seconds(120));
    INFO("process " << p << ": rank errors: " << read_text(dir.file("rank" + std::to_string(2 * p) + ".err"))
                    << read_text(dir.file("rank" + std::to_string(2 * p + 1) + ".err")));
    REQUIRE(rc == 0);
  }
}

// fn(comm, out) on every rank of a 4-thread ring; out[r] = rank r's bytes.
std::vector<std::vector<char>> thread_ring(const std::function<CommStatus(LocalComm&, std::vector<char>*)>& fn) {
  ThreadCommGroup group(4);
  std::vector<std::vector<char>> out(4);
  std::vector<std::string> errors(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; r++) {
    threads.emplace_back([&, r] {
      std::unique_ptr<LocalComm> comm = group.comm(r);
      errors[r] = fn(*comm, &out[r]).error;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; r++) REQUIRE(errors[r] == "");
  return out;
}

// A group whose ranks all live in this process (loopback TCP all the same).
std::unique_ptr<GlooCommGroup> local_group(const TempDir& dir, const std::string& ring, int world,
                                           int64_t timeout_ms) {
  GlooCommOptions o;
  o.ring_name = ring;
  o.world_size = world;
  o.local_ranks = world;
  o.timeout_ms = timeout_ms;
  o.rendezvous_timeout_ms = 20000;
  o.store = std::make_shared<DirectoryCommStore>(dir.file("store"));
  std::unique_ptr<GlooCommGroup> group;
  const std::string e = GlooCommGroup::Create(o, &group);
  REQUIRE(e == "");
  return group;
}

void run_local(GlooCommGroup& group, const std::function<void(int, LocalComm&)>& fn) {
  std::vector<std::thread> threads;
  for (int l = 0; l < group.local_ranks(); l++) {
    threads.emplace_back([&, l] {
      std::unique_ptr<LocalComm> comm = group.comm(l);
      fn(l, *comm);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace

TEST_CASE("gloo ring: every collective over 2 processes x 2 ranks equals the thread ring bitwise",
          "[unit][kernels]") {
  TempDir dir;
  run_two_processes(dir, "collectives", "collectives");
  const auto expect = thread_ring([](LocalComm& comm, std::vector<char>* out) {
    return gloo_testing::RunCollectives(comm, out);
  });
  for (int r = 0; r < 4; r++) {
    INFO("rank " << r);
    const std::vector<char> got = read_file(dir.file("rank" + std::to_string(r) + ".bin"));
    REQUIRE(got.size() == expect[r].size());
    CHECK(got == expect[r]);
  }
}

TEST_CASE("gloo ring: 5 training steps over 2 processes x 2 ranks give the 4-thread ring's parameters bitwise",
          "[unit][kernels]") {
  TempDir dir;
  run_two_processes(dir, "train", "train");
  const auto expect = thread_ring([](LocalComm& comm, std::vector<char>* out) {
    std::vector<float> params;
    CommStatus st = gloo_testing::TrainRank(comm, &params);
    gloo_testing::append_bytes(params, out);
    return st;
  });
  // The thread ring's ranks agree among themselves; every process rank must match them.
  for (int r = 1; r < 4; r++) REQUIRE(expect[r] == expect[0]);
  REQUIRE(!expect[0].empty());
  for (int r = 0; r < 4; r++) {
    INFO("rank " << r);
    CHECK(read_file(dir.file("rank" + std::to_string(r) + ".bin")) == expect[0]);
  }
}

TEST_CASE("gloo ring: a peer process that dies or stalls fails the survivors' next collective in time",
          "[unit][kernels]") {
  const int64_t timeout_ms = 2000;
  for (const std::string scenario : {"die", "stall"}) {
    INFO(scenario);
    TempDir dir;
    const std::string ring = "ring-" + scenario;
    std::vector<pid_t> pids;
    for (int p = 0; p < 2; p++)
      pids.push_back(spawn_worker({scenario, dir.file("store"), ring, "4", std::to_string(2 * p), "2",
                                   dir.path().string(), std::to_string(timeout_ms)}));
    // The survivors (ranks 0 and 1) exit once their third all-reduce failed.
    CHECK(wait_worker(pids[0], std::chrono::seconds(60)) == 0);
    if (scenario == "stall") kill(pids[1], SIGKILL);
    const int victim = wait_worker(pids[1], std::chrono::seconds(60));
    CHECK(victim == (scenario == "die" ? 3 : -SIGKILL));
    for (int r = 0; r < 2; r++) {
      const std::string fail = read_text(dir.file("rank" + std::to_string(r) + ".fail"));
      INFO("rank " << r << ": " << fail);
      REQUIRE(fail.find('\n') != std::string::npos);
      const long ms = std::stol(fail.substr(0, fail.find('\n')));
      const std::string error = fail.substr(fail.find('\n') + 1);
      CHECK(error != "ok");
      CHECK(error.find("gloo ring '" + ring + "' rank " + std::to_string(r) + "/4") != std::string::npos);
      CHECK(error.find("all_reduce") != std::string::npos);
      // A dead process closes its sockets: the survivors learn at once. A stalled one costs the timeout.
      if (scenario == "die") CHECK(ms < timeout_ms);
      if (scenario == "stall") CHECK(ms >= timeout_ms - 50);
      CHECK(ms < timeout_ms + 1500);
    }
  }
}

TEST_CASE("gloo ring: ranks that disagree on a collective all get an error, and the ring stays usable",
          "[unit][kernels]") {
  TempDir dir;
  auto group = local_group(dir, "mismatch", 3, 10000);
  CHECK(group->world_size() == 3);
  std::vector<std::string> errors(3);
  std::vector<std::vector<float>> after(3);
  run_local(*group, [&](int l, LocalComm& comm) {
    std::vector<float> x(10 + (l == 2 ? 1 : 0), 1.0f);
    errors[l] = comm.all_reduce(x.data(), x.size(), ReduceOp::kSum).error;
    std::vector<size_t> counts = {1, 2, l == 1 ? 4u : 3u};
    std::vector<float> y(7, 1.0f);
    const std::string split_error = comm.all_gather(y.data(), counts).error;
    if (split_error.find("same sizes and counts") == std::string::npos) errors[l] += " | no split error";
    std::vector<float> z(5, (float)l);
    if (!comm.all_reduce(z.data(), z.size(), ReduceOp::kSum).ok()) errors[l] += " | not usable after";
    after[l] = z;
  });
  for (int l = 0; l < 3; l++) {
    INFO(errors[l]);
    CHECK(errors[l].find("gloo ring 'mismatch' rank " + std::to_string(l) + "/3: all_reduce: rank 2 called "
                         "all_reduce of 11 values (sum) and rank 0 all_reduce of 10 values (sum)") != std::string::npos);
    CHECK(errors[l].find(" | ") == std::string::npos);
    CHECK(after[l] == std::vector<float>(5, 3.0f));
  }
}

TEST_CASE("gloo ring: abort wakes a pending collective at once and fails the later ones", "[unit][kernels]") {
  TempDir dir;
  auto group = local_group(dir, "abort", 2, 30000);
  std::atomic<long> pending_ms{-1};
  std::string pending_error, later_error;
  std::thread aborter;
  run_local(*group, [&](int l, LocalComm& comm) {
    if (l != 0) return;  // rank 1 never joins: rank 0's all-reduce waits
    aborter = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      group->abort("rank 1 reported dead");
    });
    std::vector<float> x(100, 1.0f);
    const auto t0 = Clock::now();
    pending_error = comm.all_reduce(x.data(), x.size(), ReduceOp::kSum).error;
    pending_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    later_error = comm.barrier().error;
  });
  aborter.join();
  INFO(pending_error);
  CHECK(pending_error.find("gloo ring 'abort' rank 0/2: all_reduce: local ring aborted (rank 1 reported dead)") !=
        std::string::npos);
  CHECK(pending_ms >= 150);
  CHECK(pending_ms < 1500);  // not the 30 s timeout
  CHECK(later_error.find("barrier: local ring aborted") != std::string::npos);
}

TEST_CASE("gloo ring: a ring inside one process all-reduces like the thread ring", "[unit][kernels]") {
  TempDir dir;
  auto group = local_group(dir, "one-process", 4, 10000);
  std::vector<std::vector<char>> got(4);
  std::vector<std::string> errors(4);
  run_local(*group, [&](int l, LocalComm& comm) {
    CHECK(comm.rank() == l);
    CHECK(comm.name() == "gloo");
    errors[l] = gloo_testing::RunCollectives(comm, &got[l]).error;
  });
  const auto expect = thread_ring([](LocalComm& comm, std::vector<char>* out) {
    return gloo_testing::RunCollectives(comm, out);
  });
  for (int r = 0; r < 4; r++) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(errors[r] == "");
    CHECK(got[r] == expect[r]);
  }
}

TEST_CASE("gloo ring: Create refuses bad options and says why; a missing peer times out the rendezvous",
          "[unit][kernels]") {
  TempDir dir;
  GlooCommOptions o;
  o.store = std::make_shared<DirectoryCommStore>(dir.file("store"));
  o.world_size = 2;
  o.first_rank = 1;
  o.local_ranks = 2;
  std::unique_ptr<GlooCommGroup> group;
  CHECK(GlooCommGroup::Create(o, &group).find("do not fit a ring of 2") != std::string::npos);
  o.first_rank = 0;
  o.local_ranks = 1;
  o.store = nullptr;
  CHECK(GlooCommGroup::Create(o, &group).find("no store") != std::string::npos);
  o.store = std::make_shared<DirectoryCommStore>(dir.file("store"));
  o.hostname = "192.0.2.1";  // TEST-NET-1: never this host's
  CHECK(GlooCommGroup::Create(o, &group).find("cannot open a TCP device on 192.0.2.1") != std::string::npos);
  o.hostname = "127.0.0.1";
  o.ring_name = "alone";
  o.rendezvous_timeout_ms = 300;  // rank 1 never comes
  const std::string e = GlooCommGroup::Create(o, &group);
  INFO(e);
  CHECK(e.find("gloo ring 'alone' rank 0/2: cannot connect to the other ranks within 300 ms") != std::string::npos);
  CHECK(group == nullptr);
}

TEST_CASE("directory comm store: values round-trip, any key is a file name, get times out clearly",
          "[unit][kernels]") {
  TempDir dir;
  DirectoryCommStore store(dir.file("store"));
  const std::vector<char> value = {'a', '\0', 'b', '/'};
  REQUIRE(store.set("gloo/ring 1/../0", value).ok());
  std::vector<char> got;
  REQUIRE(store.get("gloo/ring 1/../0", 10, &got).ok());
  CHECK(got == value);
  REQUIRE(store.set("gloo/ring 1/../0", {'c'}).ok());
  REQUIRE(store.get("gloo/ring 1/../0", 10, &got).ok());
  CHECK(got == std::vector<char>{'c'});
  // A value set later, from another thread, is waited for.
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (void)store.set("late", {'x'});
  });
  CHECK(store.get("late", 5000, &got).ok());
  later.join();
  CHECK(got == std::vector<char>{'x'});
  const CommStatus missing = store.get("never", 30, &got);
  CHECK(missing.error.find("no value for 'never' after 30 ms") != std::string::npos);
}

}  // namespace diloco
