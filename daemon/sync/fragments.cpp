#include "daemon/sync/fragments.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "kernels/check.h"

namespace diloco {
namespace {

bool HasEmbeddings(const TensorTable& table) {
  for (const TensorInfo& t : table.tensors()) {
    if (IsEmbeddingTensor(t.name)) return true;
  }
  return false;
}

FragmentRange RangeOf(const TensorInfo& t) {
  FragmentRange r;
  r.tensor = t.name;
  r.offset = t.offset;
  r.numel = t.numel;
  r.embedding = IsEmbeddingTensor(t.name);
  return r;
}

// Rows a tensor may be cut into: the first dimension of a matrix (or higher);
// 1 for vectors and scalars, which always stay whole.
size_t RowsOf(const TensorInfo& t) {
  if (t.shape.size() < 2 || t.shape[0] <= 0 || t.numel == 0) return 1;
  return (size_t)t.shape[0];
}

// Sorts ranges by offset and lays out the packed vector.
void Finish(Fragment* f) {
  std::sort(f->ranges.begin(), f->ranges.end(),
            [](const FragmentRange& a, const FragmentRange& b) { return a.offset < b.offset; });
  f->numel = 0;
  for (FragmentRange& r : f->ranges) {
    r.packed_offset = f->numel;
    f->numel += r.numel;
  }
}

size_t LargestNumel(const std::vector<Fragment>& fragments) {
  size_t largest = 0;
  for (const Fragment& f : fragments) largest = std::max(largest, f.numel);
  return largest;
}

// Packs items largest first (ties: the earlier item) into the lightest of
// bins [first_bin, fragments.size()) (ties: the lower index) (LPT: within 4/3
// of the best split), then numbers those bins by their first offset.
void PackLargestFirst(std::vector<FragmentRange> items, int first_bin,
                      std::vector<Fragment>* fragments) {
  std::stable_sort(items.begin(), items.end(),
                   [](const FragmentRange& a, const FragmentRange& b) { return a.numel > b.numel; });
  const int bins = (int)fragments->size();
  std::vector<size_t> load(bins, 0);
  for (FragmentRange& r : items) {
    int lightest = first_bin;
    for (int b = first_bin + 1; b < bins; ++b) {
      if (load[b] < load[lightest]) lightest = b;
    }
    load[lightest] += r.numel;
    (*fragments)[lightest].ranges.push_back(std::move(r));
  }
  for (Fragment& f : *fragments) Finish(&f);
  // Number the packed fragments by where they start, so the earliest layers
  // come first (and the order does not depend on tie-breaking).
  std::sort(fragments->begin() + first_bin, fragments->end(),
            [](const Fragment& a, const Fragment& b) {
              return a.ranges.front().offset < b.ranges.front().offset;
            });
}

// Step 1 of PartitionFragments (P >= 2): whole tensors, embeddings apart.
std::vector<Fragment> WholeTensorPartition(const TensorTable& table, int num_fragments) {
  std::vector<Fragment> fragments(num_fragments);
  const bool embeddings_apart = HasEmbeddings(table);
  std::vector<FragmentRange> rest;
  for (const TensorInfo& t : table.tensors()) {
    if (embeddings_apart && IsEmbeddingTensor(t.name)) {
      fragments[0].ranges.push_back(RangeOf(t));
    } else {
      rest.push_back(RangeOf(t));
    }
  }
  PackLargestFirst(std::move(rest), embeddings_apart ? 1 : 0, &fragments);
  return fragments;
}

// Joins neighbouring pieces of one tensor inside a fragment (ranges sorted
// by offset); a piece that grows to the whole tensor becomes it.
void JoinPieces(const TensorTable& table, Fragment* f) {
  std::vector<FragmentRange> joined;
  for (FragmentRange& r : f->ranges) {
    if (!joined.empty()) {
      FragmentRange& last = joined.back();
      if (last.piece && r.piece && last.tensor == r.tensor && last.row_end == r.row_begin) {
        last.numel += r.numel;
        last.row_end = r.row_end;
        const TensorInfo* t = table.find(r.tensor);
        if (last.row_begin == 0 && last.row_end == RowsOf(*t)) {
          last.piece = false;
          last.row_begin = last.row_end = 0;
        }
        continue;
      }
    }
    joined.push_back(std::move(r));
  }
  f->ranges = std::move(joined);
  Finish(f);
}

// Step 2 of PartitionFragments: tensors larger than cap cut into row pieces,
// everything packed largest first.
std::vector<Fragment> RowSplitPartition(const TensorTable& table, int num_fragments, size_t cap) {
  std::vector<FragmentRange> items;
  for (const TensorInfo& t : table.tensors()) {
    const size_t rows = RowsOf(t);
    const size_t k = t.numel > cap ? std::min(rows, (t.numel + cap - 1) / cap) : 1;
    if (k <= 1) {
      items.push_back(RangeOf(t));
      continue;
    }
    const size_t row_numel = t.numel / rows;
    for (size_t i = 0; i < k; ++i) {
      FragmentRange r = RangeOf(t);
      r.piece = true;
      r.row_begin = i * rows / k;
      r.row_end = (i + 1) * rows / k;
      r.offset = t.offset + r.row_begin * row_numel;
      r.numel = (r.row_end - r.row_begin) * row_numel;
      items.push_back(std::move(r));
    }
  }
  std::vector<Fragment> fragments(num_fragments);
  PackLargestFirst(std::move(items), 0, &fragments);
  for (Fragment& f : fragments) JoinPieces(table, &f);
  return fragments;
}

}  // namespace

std::string RangeName(const FragmentRange& range) {
  if (!range.piece) return range.tensor;
  return range.tensor + "[" + std::to_string(range.row_begin) + ":" + std::to_string(range.row_end) +
         "]";
}

int MaxFragments(const TensorTable& table) {
  const int tensors = static_cast<int>(table.tensors().size());
  int embeddings = 0;
  for (const TensorInfo& t : table.tensors()) embeddings += IsEmbeddingTensor(t.name);
  // The embeddings share one fragment; every other tensor can be alone.
  return embeddings > 0 ? tensors - embeddings + 1 : tensors;
}

Status PartitionFragments(const TensorTable& table, int num_fragments, std::vector<Fragment>* out,
                          PartitionRule rule) {
  const int max_fragments = MaxFragments(table);
  if (num_fragments < 1) {
    return Status::Error("cannot split the model into " + std::to_string(num_fragments) +
                         " fragments: sync.fragments must be >= 1");
  }
  if (num_fragments > max_fragments) {
    return Status::Error("cannot split the model into " + std::to_string(num_fragments) +
                         " fragments: it has " + std::to_string(table.tensors().size()) +
                         " tensors, which make at most " + std::to_string(max_fragments) +
                         " fragments (the embeddings share one); lower sync.fragments");
  }
  std::vector<Fragment> fragments;
  if (num_fragments == 1) {
    fragments.resize(1);
    for (const TensorInfo& t : table.tensors()) fragments[0].ranges.push_back(RangeOf(t));
  } else {
    const size_t total = table.total_numel();
    // largest <= balance x total / P, in integers: 3 * largest <= 4 * total / P.
    auto balanced = [&](const std::vector<Fragment>& f) {
      return 3 * LargestNumel(f) * (size_t)num_fragments <= 4 * total;
    };
    fragments = WholeTensorPartition(table, num_fragments);
    // Caps of the mean, half of it, a quarter: pieces <= a quarter of the
    // mean keep LPT's largest fragment <= 5/4 of the mean, unless one row is
    // larger than that.
    const size_t mean_up = (total + num_fragments - 1) / num_fragments;
    for (size_t divisor = 1; rule == PartitionRule::kBalanced && divisor <= 4 && !balanced(fragments);
         divisor *= 2) {
      const size_t cap = std::max<size_t>(1, (mean_up + divisor - 1) / divisor);
      std::vector<Fragment> split = RowSplitPartition(table, num_fragments, cap);
      if (LargestNumel(split) < LargestNumel(fragments)) fragments = std::move(split);
    }
  }
  for (int p = 0; p < num_fragments; ++p) {
    fragments[p].index = p;
    Finish(&fragments[p]);
  }
  *out = std::move(fragments);
  return Status::Ok();
}

double FragmentImbalance(const std::vector<Fragment>& fragments) {
  size_t total = 0;
  for (const Fragment& f : fragments) total += f.numel;
  if (fragments.empty() || total == 0) return 1;
  return (double)LargestNumel(fragments) * fragments.size() / total;
}

std::vector<double> FragmentWeights(const std::vector<Fragment>& fragments) {
  double total = 0;
  for (const Fragment& f : fragments) total += (double)f.numel;
  std::vector<double> w;
  for (const Fragment& f : fragments) w.push_back(total > 0 ? (double)f.numel / total : 0);
  return w;
}

uint64_t FragmentsDigest(const std::vector<Fragment>& fragments) {
  uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ULL;
    }
  };
  mix(fragments.size());
  for (const Fragment& f : fragments) {
    mix(f.ranges.size());
    for (const FragmentRange& r : f.ranges) {
      mix(r.offset);
      mix(r.numel);
      mix(r.embedding);
      if (r.piece) {
        mix(r.row_begin);
        mix(r.row_end);
      }
    }
  }
  return h;
}

void GatherFragment(const Fragment& fragment, const float* flat, float* packed) {
  for (const FragmentRange& r : fragment.ranges) {
    std::memcpy(packed + r.packed_offset, flat + r.offset, r.numel * sizeof(float));
  }
}

std::vector<float> GatherFragment(const Fragment& fragment, const float* flat) {
  std::vector<float> packed(fragment.numel);
  GatherFragment(fragment, flat, packed.data());
  return packed;
}

void ScatterFragment(const Fragment& fragment, const float* packed, float* flat) {
  for (const FragmentRange& r : fragment.ranges) {
    std::memcpy(flat + r.offset, packed + r.packed_offset, r.numel * sizeof(float));
  }
}

int FragmentPhase(int fragment, int inner_steps_h, int num_fragments) {
  DL_CHECK(inner_steps_h >= 1 && num_fragments >= 1 && fragment >= 0 && fragment < num_fragments,
           "fragment %d of %d, H %d", fragment, num_fragments, inner_steps_h);
  return static_cast<int>(static_cast<long>(fragment) * inner_steps_h / num_fragments);
}

bool Fires(int fragment, long inner_step, int inner_steps_h, int num_fragments) {
  const int phase = FragmentPhase(fragment, inner_steps_h, num_fragments);
  return inner_step >= 1 && inner_step % inner_steps_h == phase;
}

long StepsUntilFires(int fragment, long steps_done, int inner_steps_h, int num_fragments) {
  const int phase = FragmentPhase(fragment, inner_steps_h, num_fragments);
  const long next = steps_done + 1;
  const long wait = ((phase - next) % inner_steps_h + inner_steps_h) % inner_steps_h;
  return 1 + wait;
}

long LastFiring(int fragment, long inner_step, int inner_steps_h, int num_fragments) {
  const int phase = FragmentPhase(fragment, inner_steps_h, num_fragments);
  if (inner_step < 1) return 0;
  const long last = inner_step - ((inner_step - phase) % inner_steps_h + inner_steps_h) % inner_steps_h;
  return last >= 1 ? last : 0;
}

}  // namespace diloco
