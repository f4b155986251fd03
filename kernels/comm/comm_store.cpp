#include "kernels/comm/comm_store.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "kernels/comm/deadline.h"

namespace diloco {

namespace {

using namespace comm_deadline;

// Keys become file names: letters, digits, '-' and '_' stay, every other byte is %XX (so no name
// contains '.', which the temp files use).
std::string escape_key(const std::string& key) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_') {
      out += (char)c;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::atomic<uint64_t> g_temp_counter{0};

}  // namespace

DirectoryCommStore::DirectoryCommStore(std::string dir) : dir_(std::move(dir)) {}

std::string DirectoryCommStore::path_of(const std::string& key) const { return dir_ + "/" + escape_key(key); }

CommStatus DirectoryCommStore::set(const std::string& key, const std::vector<char>& value) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec)
    return CommStatus::Error("comm store " + dir_ + ": cannot create the directory (" + ec.message() +
                             "): check the path and its permissions");
  const std::string path = path_of(key);
  const std::string temp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(g_temp_counter++);
  {
    std::ofstream f(temp, std::ios::binary | std::ios::trunc);
    f.write(value.data(), (std::streamsize)value.size());
    f.close();
    if (!f)
      return CommStatus::Error("comm store " + dir_ + ": cannot write " + temp +
                               ": check free space and permissions");
  }
  std::filesystem::rename(temp, path, ec);
  if (ec) return CommStatus::Error("comm store " + dir_ + ": cannot rename " + temp + " (" + ec.message() + ")");
  return CommStatus::Ok();
}

CommStatus DirectoryCommStore::get(const std::string& key, int64_t timeout_ms, std::vector<char>* value) {
  const Clock::time_point deadline = Clock::now() + milliseconds(timeout_ms);
  const std::string path = path_of(key);
  int64_t poll_ms = 1;
  for (;;) {
    std::ifstream f(path, std::ios::binary);
    if (f) {
      value->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
      return CommStatus::Ok();
    }
    if (Clock::now() >= deadline)
      return CommStatus::Error("comm store " + dir_ + ": no value for '" + key + "' after " +
                               std::to_string(timeout_ms) +
                               " ms: is every process of the ring started, with the same store "
                               "directory and ring name?");
    std::this_thread::sleep_for(milliseconds(std::min<int64_t>(poll_ms, std::max<int64_t>(ms_left(deadline), 1))));
    poll_ms = std::min<int64_t>(poll_ms * 2, 20);
  }
}

}  // namespace diloco
