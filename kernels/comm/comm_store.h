// The key/value store through which the processes of a ring across hosts meet (Gloo's
// addresses, NCCL's unique id): kernels/comm/gloo_comm.h and kernels/cuda/nccl_comm.h. The daemon
// implements it over its authenticated control channel (daemon/control/ring_store.h);
// DirectoryCommStore serves tests and single-host rings.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/comm/local_comm.h"

namespace diloco {

// Where the processes of a ring publish their addresses. The daemon can
// implement it over its authenticated control channel; DirectoryCommStore
// serves tests and single-host rings.
class CommStore {
 public:
  virtual ~CommStore() = default;
  // Publishes value under key (replacing an earlier value).
  virtual CommStatus set(const std::string& key, const std::vector<char>& value) = 0;
  // *value = key's value, waiting up to timeout_ms for some process to set it.
  virtual CommStatus get(const std::string& key, int64_t timeout_ms, std::vector<char>* value) = 0;
};

// One file per key in a directory every process can reach (a temp dir, a
// shared filesystem). set writes a temp file and renames it, so get never
// sees half a value; get polls every few milliseconds.
class DirectoryCommStore final : public CommStore {
 public:
  // dir is created when missing (by set).
  explicit DirectoryCommStore(std::string dir);
  CommStatus set(const std::string& key, const std::vector<char>& value) override;
  CommStatus get(const std::string& key, int64_t timeout_ms, std::vector<char>* value) override;

 private:
  std::string path_of(const std::string& key) const;
  std::string dir_;
};

}  // namespace diloco
