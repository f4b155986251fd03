// Fragments: the model split into P sets of tensors, or row ranges of large
// tensors, that are synced on their own staggered schedule (Streaming
// DiLoCo). A fragment is a list of ranges of the flat parameter buffer; its
// "packed" form is those ranges back to back in one contiguous vector, which
// is what deltas, merges, codecs and checkpoints work on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "daemon/util/status.h"
#include "kernels/tensor_table.h"

namespace diloco {

// One tensor of the flat buffer, or a range of its rows (a "piece"). A
// tensor of shape [d0, d1, ...] (2-D or more) has d0 rows of d1·d2·...
// elements each, so a row range is a contiguous range of the buffer. 1-D
// tensors (biases, LayerNorm) are never cut.
struct FragmentRange {
  std::string tensor;  // its name in the tensor table (also for a piece)
  size_t offset = 0;   // in the flat buffer, in elements
  size_t numel = 0;
  size_t packed_offset = 0;  // in the fragment's packed vector, in elements
  bool embedding = false;    // wte/wpe (or a piece of them): plain weighted mean, never RDA
  bool piece = false;        // rows [row_begin, row_end) of the tensor, not all of it
  size_t row_begin = 0;      // pieces only; 0 and 0 for a whole tensor
  size_t row_end = 0;
};

// The range's name for payloads and logs: the tensor's name, and for a piece
// its rows as a half-open slice, "wte[0:2094]" (printable ASCII, no spaces:
// a valid wire identifier, envelope.h).
std::string RangeName(const FragmentRange& range);

struct Fragment {
  int index = 0;
  std::vector<FragmentRange> ranges;  // sorted by offset
  size_t numel = 0;                   // length of the packed vector
};

// The embedding tensors: merged with a plain weighted mean, and kept together
// in fragment 0 by the whole-tensor partition (when P >= 2).
inline bool IsEmbeddingTensor(const std::string& name) { return name == "wte" || name == "wpe"; }

// The balance PartitionFragments aims for: largest fragment <= this x the
// mean (the Streaming DiLoCo paper's figure; also the LPT guarantee).
inline constexpr double kFragmentBalance = 4.0 / 3.0;

// Splits table into P = num_fragments fragments. P = 1: one fragment holds
// every tensor. P >= 2, in two steps:
//  1. The whole-tensor partition: when the table has embedding tensors,
//     fragment 0 holds exactly the embeddings and the other tensors are
//     packed into fragments 1..P-1 (without embeddings: all tensors into
//     0..P-1) greedily, largest first, each into the lightest fragment (ties:
//     the lower index); those fragments are then numbered by their first
//     offset. Used when its largest fragment is <= kFragmentBalance x the
//     mean (total / P), which is the case for small vocabularies.
//  2. Otherwise (e.g. GPT-2's 50257 x 768 wte alone is 31% of the model) the
//     row-split partition, tried with cap = ceil(total / P), then ceil(cap/2),
//     then ceil(cap/4), stopping at the first balanced one: every 2-D (or
//     higher) tensor larger than cap is cut into k = min(rows, ceil(numel /
//     cap)) pieces of whole rows, as even as possible (piece i: rows
//     [i·rows/k, (i+1)·rows/k)); all pieces and tensors, embeddings included,
//     are packed largest first (ties: the lower offset) into the lightest of
//     the P fragments (ties: the lower index); inside a fragment, neighbouring
//     pieces of one tensor are joined (all of its rows make the whole tensor
//     again); fragments are numbered by their first offset. (Pieces <= a
//     quarter of the mean keep the largest fragment <= 5/4 of the mean, unless
//     a row or a 1-D tensor is larger.) When none is balanced, the partition
//     tried (step 1 included) with the smallest largest fragment wins (the
//     earlier on a tie).
// A fragment may so mix embedding pieces and other tensors: the merge treats
// each range on its own (merge.h), so that changes nothing for either.
// Deterministic: the same table and P give the same fragments everywhere.
// Errors when P < 1 or P > MaxFragments(table).
//
// rule kWholeTensors stops after step 1 whatever its balance: the unbalanced
// partition tensors would get without row pieces. No daemon role uses it
// (peers must agree on one rule); `dilococtl simulate` compares the two
// (its scenario key balanced_fragments: false).
enum class PartitionRule { kBalanced, kWholeTensors };
Status PartitionFragments(const TensorTable& table, int num_fragments, std::vector<Fragment>* out,
                          PartitionRule rule = PartitionRule::kBalanced);

// The largest P that PartitionFragments accepts for table: one fragment per
// tensor, the embeddings counting as one (the whole-tensor partition's limit;
// a row-split partition has at least as many pieces, so every fragment of
// either is nonempty).
int MaxFragments(const TensorTable& table);

// 64-bit FNV-1a over every fragment's ranges (offset, numel, embedding flag,
// and for pieces their rows): two partitions with the same digest are the
// same (guards checkpoints and peers against a different P or partition
// rule). A partition without pieces hashes as it did before pieces existed.
uint64_t FragmentsDigest(const std::vector<Fragment>& fragments);

// max fragment numel / mean (total / P): 1 is perfect balance.
double FragmentImbalance(const std::vector<Fragment>& fragments);

// Each fragment's share of the parameters (numel / total; they sum to 1): what a token of its
// deltas counts for in goodput (goodput.h).
std::vector<double> FragmentWeights(const std::vector<Fragment>& fragments);

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
// The last step <= inner_step at which fragment p fired (0: none yet): where a lock-step fleet's
// cadence stood when it sent a delta of p at inner_step.
long LastFiring(int fragment, long inner_step, int inner_steps_h, int num_fragments);

}  // namespace diloco
