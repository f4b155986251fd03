// Safetensors files (the format of Hugging Face's `safetensors` package):
//
//   8 bytes    u64 little-endian N: the length of the JSON header
//   N bytes    JSON header, UTF-8, padded with spaces so that 8 + N is a
//              multiple of 8:
//                {"__metadata__": {"format": "pt", ...string values only...},
//                 "<tensor>": {"dtype": "F32", "shape": [...], "data_offsets": [b, e]}, ...}
//   data       the tensors' bytes; [b, e) is relative to the data start,
//              little-endian, row-major; the tensors cover the data exactly
//              (no holes, no overlaps).
//
// dilocod writes every tensor as F32 in tensor-table order (so the data is
// the flat parameter buffer, byte for byte) and the header keys in the same
// order, __metadata__ first. Python: safetensors.torch.load_file(path), or
// json.loads(f.read(8 + N)[8:]) for the header alone.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "daemon/util/status.h"
#include "kernels/tensor_table.h"

namespace diloco {

// The largest header accepted (the safetensors package's own limit).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  std::string dtype;           // "F32", "F16", "BF16", "I64", ...
  std::vector<int64_t> shape;  // empty: a scalar
  uint64_t begin = 0;          // data_offsets, relative to the data start
  uint64_t end = 0;
};

struct SafetensorsIndex {
  uint64_t header_bytes = 0;  // N
  uint64_t data_offset = 0;   // 8 + N: where the data starts in the file
  uint64_t file_bytes = 0;
  std::map<std::string, std::string> metadata;  // __metadata__ (may be empty)
  std::vector<SafetensorsEntry> entries;        // ordered by begin offset
  const SafetensorsEntry* find(const std::string& name) const;
};

// Bytes per element of a safetensors dtype; 0 when unknown.
size_t SafetensorsDtypeBytes(const std::string& dtype);

// Writes table's tensors from params (table.total_numel() floats) as F32,
// atomically (atomic_file.h). metadata becomes __metadata__.
Status WriteSafetensors(const std::string& path, const TensorTable& table, const float* params,
                        const std::map<std::string, std::string>& metadata);

// Reads and validates the header only (the data is not read): the length
// (at least 2, at most kSafetensorsMaxHeaderBytes, inside the file), the
// JSON (an object; __metadata__ a map of strings; every tensor with a known
// dtype, a shape of non-negative integers and data_offsets [b, e] with
// e - b = numel x dtype size), and the offsets (contiguous from 0 to the end
// of the file, no overlaps, no holes). Errors name the file and the tensor.
Status ReadSafetensorsIndex(const std::string& path, SafetensorsIndex* out);

// Whether the index holds exactly table's tensors as F32: the same names,
// shapes and order. The error names the first difference.
Status CheckSafetensorsMatchesTable(const SafetensorsIndex& index, const TensorTable& table);

}  // namespace diloco
