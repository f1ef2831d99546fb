#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/base/dtype.h"

namespace tandem {

// A read-only view of a dense row-major tensor. The bytes live either in a memory-mapped
// checkpoint file or in a buffer owned by the model (after a dtype conversion); `data` stays
// valid for the lifetime of the Model that handed it out.
struct Tensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }
  bool empty() const { return data == nullptr; }
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  int64_t cols() const { return shape.size() < 2 ? 1 : shape[1]; }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
};

}  // namespace tandem
