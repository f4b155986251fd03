#include "kernels/tensor_table.h"

namespace diloco {

void TensorTable::add(std::string name, std::vector<int> shape) {
  TensorInfo t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.offset = total_;
  t.numel = 1;
  for (int d : t.shape) t.numel *= (size_t)d;
  total_ += t.numel;
  tensors_.push_back(std::move(t));
}

const TensorInfo* TensorTable::find(const std::string& name) const {
  for (const TensorInfo& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

uint64_t TensorTable::digest() const {
  uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](const void* data, size_t n) {
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; i++) {
      h ^= p[i];
      h *= 0x100000001b3ULL;
    }
  };
  for (const TensorInfo& t : tensors_) {
    mix(t.name.data(), t.name.size() + 1);
    for (int d : t.shape) {
      const int64_t d64 = d;
      mix(&d64, sizeof d64);
    }
    const uint64_t off = t.offset;
    mix(&off, sizeof off);
  }
  return h;
}

}  // namespace diloco
