#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/base/dtype.h"
#include "common/base/quant.h"

namespace tandem {

// A read-only view of a dense row-major tensor. The bytes live either in a memory-mapped
// checkpoint file or in a buffer owned by the model (after a dtype conversion); `data` stays
// valid for the lifetime of the Model that handed it out.
struct Tensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  // Weight-only quantized matrices (common/base/quant.h): `data` holds the codes, `dtype` is the
  // dense dtype the model would otherwise use; scales (int8, fp8: one per row; int4 with zeros) are
  // owned by the Model (int4 in kTiles16: both null, `data` holds them with the codes).
  WeightQuant quant = WeightQuant::kNone;
  const float* scales = nullptr;
  const float* zeros = nullptr;
  int64_t group_size = 0;
  // LoadOptions::quant_layout (quantized), LoadOptions::bf16_layout (dense bf16 matrices).
  WeightLayout layout = WeightLayout::kRows;
  // Act-order int4 checkpoints (GPTQ desc_act): column j of the matrix multiplies input element
  // input_perm[j] (int32 [K], owned by the Model), so y = W' . x[input_perm]; null when the
  // columns are in input order.
  const int32_t* input_perm = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  // Bytes of the dense elements (quantized: of the dequantized matrix in `dtype`).
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype); }
  // Bytes a matrix product reads: codes plus scales (and zeros, and the input permutation) when
  // quantized, else nbytes().
  size_t stored_bytes() const {
    if (quant == WeightQuant::kNone) {
      return layout == WeightLayout::kTiles16  // bf16 tiles: rows and K padded
                 ? static_cast<size_t>(QuantStoredRows(rows(), layout) / kQuantTileRows *
                                       Bf16TileBytes(cols()))
                 : nbytes();
    }
    if (quant == WeightQuant::kFp8) return static_cast<size_t>(rows() * (cols() + 4));
    if (quant == WeightQuant::kInt8) {
      return layout == WeightLayout::kTiles16
                 ? static_cast<size_t>(QuantStoredRows(rows(), layout) * (Int8TileK(cols()) + 4))
                 : static_cast<size_t>(rows() * (cols() + 4));
    }
    return static_cast<size_t>(QuantStoredRows(rows(), layout) *
                                   (Int4RowBytes(cols()) + Int4Groups(cols(), group_size) * 8) +
                               (input_perm != nullptr ? cols() * 4 : 0));
  }
  bool empty() const { return data == nullptr; }
  int64_t rows() const { return shape.empty() ? 0 : shape[0]; }
  int64_t cols() const { return shape.size() < 2 ? 1 : shape[1]; }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
};

}  // namespace tandem
