#include "daemon/util/lock_file.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/temp_dir.h"

namespace diloco {
namespace {

using diloco::testing::TempDir;

std::string ReadText(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A child process that takes the lock, tells the parent through a pipe and
// then waits to be killed (or, with exit_after_lock, exits by itself).
struct LockHolder {
  pid_t pid = -1;
};

LockHolder StartHolder(const std::string& path, bool exit_after_lock) {
  int ready[2];
  REQUIRE(pipe(ready) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(ready[0]);
    std::unique_ptr<LockFile> lock;
    const char byte = LockFile::Acquire(path, &lock).ok() ? '1' : '0';
    (void)!write(ready[1], &byte, 1);
    if (exit_after_lock) {
      lock.reset();
      _exit(0);
    }
    for (;;) pause();
  }
  close(ready[1]);
  char byte = 0;
  REQUIRE(read(ready[0], &byte, 1) == 1);
  close(ready[0]);
  REQUIRE(byte == '1');
  return {pid};
}

TEST_CASE("LockFile: a second process is refused with the holder's pid until the holder is killed",
          "[unit]") {
  TempDir dir;
  const std::string path = dir.file("dilocod.lock");
  const LockHolder holder = StartHolder(path, /*exit_after_lock=*/false);
  CHECK(ReadText(path) == std::to_string(holder.pid) + "\n");

  std::unique_ptr<LockFile> lock;
  const Status refused = LockFile::Acquire(path, &lock);
  REQUIRE_FALSE(refused.ok());
  CHECK(lock == nullptr);
  CHECK_THAT(refused.message(),
             Catch::Contains("state directory '" + dir.path().string() + "' is in use by another dilocod") &&
                 Catch::Contains("pid " + std::to_string(holder.pid)) && Catch::Contains(path) &&
                 Catch::Contains("stop it first"));

  // kill -9: no destructor runs, the kernel still drops the lock.
  REQUIRE(kill(holder.pid, SIGKILL) == 0);
  int status = 0;
  REQUIRE(waitpid(holder.pid, &status, 0) == holder.pid);
  REQUIRE(LockFile::Acquire(path, &lock).ok());
  CHECK(ReadText(path) == std::to_string(getpid()) + "\n");
}

TEST_CASE("LockFile: a holder that exits cleanly releases the lock and empties the pid", "[unit]") {
  TempDir dir;
  const std::string path = dir.file("dilocod.lock");
  const LockHolder holder = StartHolder(path, /*exit_after_lock=*/true);
  int status = 0;
  REQUIRE(waitpid(holder.pid, &status, 0) == holder.pid);
  CHECK(ReadText(path).empty());
  std::unique_ptr<LockFile> lock;
  REQUIRE(LockFile::Acquire(path, &lock).ok());
}

TEST_CASE("LockFile: held once per process too, and free again after destruction", "[unit]") {
  TempDir dir;
  const std::string path = dir.file("dilocod.lock");
  std::unique_ptr<LockFile> first, second;
  REQUIRE(LockFile::Acquire(path, &first).ok());
  CHECK(first->path() == path);
  const Status st = LockFile::Acquire(path, &second);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("pid " + std::to_string(getpid())));
  first.reset();
  REQUIRE(LockFile::Acquire(path, &second).ok());
}

TEST_CASE("LockFile: a missing directory is a clear error", "[unit]") {
  TempDir dir;
  std::unique_ptr<LockFile> lock;
  const Status st = LockFile::Acquire(dir.file("missing/dilocod.lock"), &lock);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("missing/dilocod.lock") && Catch::Contains("No such file"));
}

}  // namespace
}  // namespace diloco
