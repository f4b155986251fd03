// Checkpoints: model parameters, AdamW state, training step, GptConfig and
// the resolved run config, in one binary file written atomically.
//
// Format version 1. Little-endian, no padding, offsets in bytes:
//
//   offset size  field
//        0    8  magic "DLCKPT01"
//        8    4  u32 format version = 1
//       12    4  u32 dtype = 1 (float32)
//       16    4  i32 vocab_size      } GptConfig
//       20    4  i32 block_size      }
//       24    4  i32 n_layer         }
//       28    4  i32 n_embd          }
//       32    4  i32 n_head          }
//       36    8  i64 training step
//       44    8  i64 adam step (AdamWState::step)
//       52    8  u64 num_params N (= gpt_tensor_table(config).total_numel())
//       60    8  u64 tensor table digest (gpt_tensor_table(config).digest())
//       68    8  u64 config yaml length Y
//       76    4  u32 body CRC32C (over every body byte)
//       80    4  u32 header CRC32C (over bytes [0, 80))
//       84       body:
//                  Y bytes   run config YAML (UTF-8, no terminator)
//                  4N bytes  params, float32, gpt_tensor_table order
//                  4N bytes  AdamW m
//                  4N bytes  AdamW v
//   file size = 84 + Y + 12 N exactly.
//
// Python: struct.unpack("<8sII5iqqQQQII", f.read(84)), then
// np.frombuffer(body, "<f4", count=N, offset=Y) and so on. CRC32C is
// Castagnoli (crc32c package, google-crc32c).
#pragma once

#include <string>
#include <vector>

#include "daemon/util/status.h"
#include "daemon/train/local_ring.h"
#include "kernels/backend.h"
#include "kernels/gpt.h"
#include "kernels/optimizer.h"

namespace diloco {

inline constexpr char kCheckpointMagic[8] = {'D', 'L', 'C', 'K', 'P', 'T', '0', '1'};
inline constexpr uint32_t kCheckpointVersion = 1;
inline constexpr size_t kCheckpointHeaderBytes = 84;

struct Checkpoint {
  GptConfig model;
  long step = 0;            // training steps taken
  std::string config_yaml;  // the resolved run config
  std::vector<float> params;
  AdamWState optimizer;  // m and v hold num_params floats each
};

// Writes path.tmp, fsyncs it, renames it over path and fsyncs the directory:
// a crash leaves either the old file or the new one. Empty optimizer.m / .v
// (no AdamW step taken yet) are written as zeros.
// Parameters and moments in tensor-table layout, so a checkpoint written on one backend resumes
// on any other (cpu <-> cuda).
Status SaveCheckpoint(const std::string& path, const GptConfig& model, const float* params,
                      const AdamWState& optimizer, long step, const std::string& config_yaml);
// A ring's parameters (rank 0's) and whole AdamW state (every rank's part when it is sharded),
// downloaded from wherever they live. Call it from rank 0 while the other ranks wait.
Status SaveCheckpoint(const std::string& path, const LocalRing& ring, long step, const std::string& config_yaml);

// Reads and verifies (magic, version, dtype, both CRCs, sizes, table digest).
Status LoadCheckpoint(const std::string& path, Checkpoint* out);

// Whether ckpt fits a model of shape model (and holds AdamW moments, when with_optimizer):
// check before uploading its parameters and moments to a backend.
Status CheckCheckpointFits(const Checkpoint& ckpt, const GptConfig& model, bool with_optimizer);

}  // namespace diloco
