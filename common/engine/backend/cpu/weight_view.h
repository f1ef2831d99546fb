#pragma once

#include "common/base/dtype.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "common/engine/model/tensor.h"

namespace tandem {

// The kernels' view of a projection (dense or quantized): quantized weights take their inputs in
// `input_dtype`, dense bf16 weights too except that int8 inputs become bf16 for them (int8
// inputs are for int8 / int4 weights), dense f32 weights always f32.
inline cpu::MatMulWeight WeightView(const Tensor& t, DType input_dtype) {
  cpu::MatMulWeight w;
  w.data = t.data;
  w.dtype = t.dtype;
  w.quant = t.quant;
  w.scales = t.scales;
  w.zeros = t.zeros;
  w.group_size = t.group_size;
  w.layout = t.layout;
  if (t.quant != WeightQuant::kNone) {
    w.input_dtype = input_dtype;
  } else if (t.dtype == DType::kBF16) {
    w.input_dtype = input_dtype == DType::kI8 ? DType::kBF16 : input_dtype;
  }
  return w;
}

}  // namespace tandem
