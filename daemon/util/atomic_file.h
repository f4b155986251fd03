// Whole-file writes that a crash cannot tear: write path.tmp, fsync it,
// rename it over path, fsync the directory. Afterwards path holds either the
// old contents or the new ones, never a mix.
// Checkpoints and the syncer's global state both use it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "daemon/util/status.h"

namespace diloco {

// A piece of the file, written in order (no copy into one buffer).
struct ByteChunk {
  const void* data;
  size_t size;
};

// what names the file in messages, e.g. "global state".
Status WriteFileAtomically(const std::string& path, const std::vector<ByteChunk>& chunks,
                           const std::string& what);

// Reads the whole file into *bytes.
Status ReadWholeFile(const std::string& path, const std::string& what, std::string* bytes);

}  // namespace diloco
