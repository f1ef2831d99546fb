#pragma once

// Detection of pre-quantized checkpoints from a model directory's config.json
// `quantization_config`, or from a separate quantize_config.json (AutoGPTQ): int4 (AWQ, GPTQ) and
// fp8 e4m3 (compressed-tensors "float-quantized", fbgemm_fp8, vLLM's fp8; fp8_checkpoint.h).

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem {

enum class CheckpointQuantMethod : uint8_t {
  kNone = 0,
  kAwq = 1,
  kGptq = 2,
  kCompressedTensorsFp8 = 3,  // quant_method "compressed-tensors", format "float-quantized"
  kFbgemmFp8 = 4,             // quant_method "fbgemm_fp8"
  kFp8 = 5,                   // quant_method "fp8" (vLLM's serialized fp8, per-tensor scales)
};

struct CheckpointQuantConfig {
  CheckpointQuantMethod method = CheckpointQuantMethod::kNone;
  std::string source;       // the file the settings came from (for error messages)
  int64_t bits = 4;         // 4 (AWQ, GPTQ) or 8 (fp8) once validated
  int64_t group_size = 0;   // a power of two >= 32, or -1 (GPTQ: one group per output channel)
  bool sym = false;         // GPTQ: symmetric (zero point 8)
  bool desc_act = false;    // GPTQ: act-order (g_idx permutes the input channels)
  int gptq_version = 1;     // GPTQ checkpoint_format: 1 ("gptq", zeros stored minus one) or 2
  bool per_tensor = false;  // fp8: the weights' scales are one per tensor (expanded to per row)

  bool quantized() const { return method != CheckpointQuantMethod::kNone; }
  bool fp8() const {
    return method == CheckpointQuantMethod::kCompressedTensorsFp8 ||
           method == CheckpointQuantMethod::kFbgemmFp8 || method == CheckpointQuantMethod::kFp8;
  }
  // "awq" / "gptq" / "compressed-tensors" / "fbgemm_fp8" / "fp8" / "none".
  std::string MethodName() const;
  // "int4" or "fp8": the format the weights load as.
  std::string FormatName() const { return fp8() ? "fp8" : "int4"; }
  // The model id suffix: "-awq-g128", "-gptq-g128", "-gptq-gch" (group_size -1),
  // "-compressed-tensors-fp8", "-fbgemm_fp8-fp8", "-fp8-fp8" (fp8 per-tensor: "-fp8t").
  std::string IdSuffix() const;
};

// Reads `dir`/config.json (its "quantization_config") and, when that is absent,
// `dir`/quantize_config.json. Returns method kNone when neither says the checkpoint is quantized.
// Supported: quant_method "awq" with version "gemm" (zero_point true), and "gptq" with
// checkpoint_format "gptq" (v1) or "gptq_v2"; bits 4; group_size a power of two >= 32 (GPTQ also
// -1); the fp8 methods as fp8_checkpoint.h lists them. Anything else is an error naming the file
// and the field (e.g. AWQ "gemv", "marlin", bits 8, group_size 16, fp8 block-wise scales, an
// unknown quant_method).
absl::StatusOr<CheckpointQuantConfig> LoadCheckpointQuantConfig(const std::string& dir);

// The same from one settings object: config.json's "quantization_config" or the whole
// quantize_config.json (where a missing quant_method means "gptq"); `source` names its file.
absl::StatusOr<CheckpointQuantConfig> ParseCheckpointQuantConfig(const nlohmann::json& q,
                                                                 const std::string& source,
                                                                 bool from_quantize_config);

// The refusal of a quantization setting the loader does not serve: UNIMPLEMENTED,
// "<source>: <message>" (source: the file and field).
absl::Status UnsupportedQuantization(const std::string& source, const std::string& message);

}  // namespace tandem
