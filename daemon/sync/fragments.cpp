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

}  // namespace

int MaxFragments(const TensorTable& table) {
  const int tensors = static_cast<int>(table.tensors().size());
  int embeddings = 0;
  for (const TensorInfo& t : table.tensors()) embeddings += IsEmbeddingTensor(t.name);
  // The embeddings share one fragment; every other tensor can be alone.
  return embeddings > 0 ? tensors - embeddings + 1 : tensors;
}

Status PartitionFragments(const TensorTable& table, int num_fragments, std::vector<Fragment>* out) {
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
  std::vector<Fragment> fragments(num_fragments);
  if (num_fragments == 1) {
    for (const TensorInfo& t : table.tensors()) fragments[0].ranges.push_back(RangeOf(t));
  } else {
    const bool embeddings_apart = HasEmbeddings(table);
    const int first_bin = embeddings_apart ? 1 : 0;
    std::vector<const TensorInfo*> rest;
    for (const TensorInfo& t : table.tensors()) {
      if (embeddings_apart && IsEmbeddingTensor(t.name)) {
        fragments[0].ranges.push_back(RangeOf(t));
      } else {
        rest.push_back(&t);
      }
    }
    // Largest first into the lightest bin (LPT): within 4/3 of the best split.
    std::stable_sort(rest.begin(), rest.end(),
                     [](const TensorInfo* a, const TensorInfo* b) { return a->numel > b->numel; });
    std::vector<size_t> load(num_fragments, 0);
    for (const TensorInfo* t : rest) {
      int lightest = first_bin;
      for (int b = first_bin + 1; b < num_fragments; ++b) {
        if (load[b] < load[lightest]) lightest = b;
      }
      fragments[lightest].ranges.push_back(RangeOf(*t));
      load[lightest] += t->numel;
    }
    for (Fragment& f : fragments) Finish(&f);
    // Number the packed fragments by where they start, so fragment 1 holds
    // the earliest layers (and the order does not depend on tie-breaking).
    std::sort(fragments.begin() + first_bin, fragments.end(),
              [](const Fragment& a, const Fragment& b) {
                return a.ranges.front().offset < b.ranges.front().offset;
              });
  }
  for (int p = 0; p < num_fragments; ++p) {
    fragments[p].index = p;
    Finish(&fragments[p]);
  }
  *out = std::move(fragments);
  return Status::Ok();
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

}  // namespace diloco
