// Fragments: the model split into P sets of whole tensors that are synced on
// their own staggered schedule (Streaming DiLoCo). A fragment is a list of
// ranges of the flat parameter buffer; its "packed" form is those ranges back
// to back in one contiguous vector, which is what deltas, merges, codecs and
// checkpoints work on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "daemon/util/status.h"
#include "kernels/tensor_table.h"

namespace diloco {

// One whole tensor of the flat buffer.
struct FragmentRange {
  std::string tensor;  // its name in the tensor table
  size_t offset = 0;   // in the flat buffer, in elements
  size_t numel = 0;
  size_t packed_offset = 0;  // in the fragment's packed vector, in elements
  bool embedding = false;    // wte/wpe: merged with a plain weighted mean, never RDA
};

struct Fragment {
  int index = 0;
  std::vector<FragmentRange> ranges;  // sorted by offset
  size_t numel = 0;                   // length of the packed vector
};

// Tensors that form the embedding fragment (when P >= 2).
inline bool IsEmbeddingTensor(const std::string& name) { return name == "wte" || name == "wpe"; }

// Splits table into num_fragments fragments of whole tensors. With P >= 2 and
// embedding tensors present, fragment 0 holds exactly the embeddings and the
// other tensors are packed into fragments 1..P-1 greedily, largest first, each
// into the lightest fragment (ties: the lower index); those fragments are then
// numbered by their first offset. With P = 1 one fragment holds everything.
// Deterministic: the same table and P give the same fragments everywhere.
// Errors when P < 1 or P exceeds the number of fragments that can be nonempty.
Status PartitionFragments(const TensorTable& table, int num_fragments, std::vector<Fragment>* out);

// The largest P that PartitionFragments accepts for table.
int MaxFragments(const TensorTable& table);

// 64-bit FNV-1a over every fragment's ranges: two partitions with the same
// digest are the same (guards checkpoints and peers against a different P).
uint64_t FragmentsDigest(const std::vector<Fragment>& fragments);

// Copies the fragment's ranges of flat (the whole parameter buffer) into
// packed (fragment.numel floats).
void GatherFragment(const Fragment& fragment, const float* flat, float* packed);
std::vector<float> GatherFragment(const Fragment& fragment, const float* flat);
// The inverse: writes packed into the fragment's ranges of flat.
void ScatterFragment(const Fragment& fragment, const float* packed, float* flat);

// Staggered cadence. inner_step counts completed inner steps (1, 2, ...);
// fragment p of P fires when inner_step ≡ ⌊p·H/P⌋ (mod H), so with P = H one
// fragment fires per step, round robin. Step 0 never fires.
int FragmentPhase(int fragment, int inner_steps_h, int num_fragments);
bool Fires(int fragment, long inner_step, int inner_steps_h, int num_fragments);
// How many more inner steps a learner that has done steps_done makes until
// fragment p fires (1..H): the syncer's forecast of a learner's next delta.
long StepsUntilFires(int fragment, long steps_done, int inner_steps_h, int num_fragments);

}  // namespace diloco
