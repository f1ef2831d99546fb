#pragma once

// fp8 (e4m3) checkpoints as published: the quantization_config of compressed-tensors
// ("float-quantized"), fbgemm_fp8 and vLLM's fp8, and their projections read into the weight
// format of common/base/quant.h (WeightQuant::kFp8: codes as stored, one f32 scale per row).
//
// Supported (anything else is refused with one line naming the file and the field):
// - compressed-tensors: format "float-quantized", quantization_status "compressed" (or absent),
//   one config group whose weights are {num_bits 8, type "float", strategy "channel" or
//   "tensor", symmetric, not dynamic}; input_activations absent/null or fp8 (num_bits 8, type
//   "float", strategy "token" or "tensor", dynamic or static); no output_activations, no
//   kv_cache_scheme. Projections listed in "ignore" are stored dense and load dense.
// - fbgemm_fp8 (per-channel weight_scale; activation_scale_ub and modules_to_not_convert read as
//   above).
// - fp8 (vLLM's serialized fp8: per-tensor weight_scale): without weight_block_size.
// Activations are not quantized: the fp8 activation schemes a checkpoint names (dynamic per
// token, static per tensor with input_scale tensors) are the producer's choice for fp8 GEMMs;
// Tandem runs these weights weight-only, dequantized in the kernels to the MatMul input dtype (as
// vLLM does on GPUs without fp8 GEMMs), so activations keep their full precision and the
// input_scale / input_scale_ub tensors are not used.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/engine/model/checkpoint.h"
#include "common/engine/model/quant_config.h"
#include "common/engine/model/quantize.h"
#include "nlohmann/json.hpp"

namespace tandem {

// Checks the fp8 fields of quantization_config `q` (from `source`) for c->method (one of the fp8
// methods, already set) and fills c->bits (8) and c->per_tensor.
absl::Status ParseFp8QuantConfig(const nlohmann::json& q, const std::string& source,
                                 CheckpointQuantConfig* c);

// One fp8 projection of logical shape [N, K]: `weight` F8_E4M3 [N, K] and its `scale` (F32, BF16
// or F16; per channel [N] or [N, 1], per tensor [] or [1], expanded to every row), as a
// QuantizedMatrix in WeightLayout::kRows: the codes as stored, scale[n] as f32. Errors name the
// tensor: wrong dtype or shape, NaN codes (0x7f / 0xff), non-finite or negative scales.
absl::StatusOr<QuantizedMatrix> ConvertFp8Checkpoint(const Checkpoint::TensorRef& weight,
                                                     const Checkpoint::TensorRef& scale, int64_t N,
                                                     int64_t K);

}  // namespace tandem
