// The tensor table: names, shapes and offsets of tensors laid out back to
// back in one flat buffer. Parameters, gradients and each AdamW moment share
// one table, so a tensor (or a fragment of the model) is a range of any of
// them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace diloco {

struct TensorInfo {
  std::string name;
  std::vector<int> shape;
  size_t offset = 0;  // in elements
  size_t numel = 0;
};

class TensorTable {
 public:
  TensorTable() = default;
  // Lays the tensors out in the given order.
  void add(std::string name, std::vector<int> shape);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  size_t total_numel() const { return total_; }
  const TensorInfo* find(const std::string& name) const;
  // 64-bit FNV-1a over every name, shape and offset: two buffers with the
  // same digest have the same layout.
  uint64_t digest() const;

 private:
  std::vector<TensorInfo> tensors_;
  size_t total_ = 0;
};

}  // namespace diloco
