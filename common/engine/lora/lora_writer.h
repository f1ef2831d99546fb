#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/base/dtype.h"
#include "common/config/model_config.h"

namespace tandem {

// A random PEFT LoRA adapter for a model of a given config, for tests and benchmarks: both A
// and B random (PEFT starts B at zero; a trained adapter is not), uniform with the given standard
// deviation, written as adapter_config.json + adapter_model.safetensors with PEFT's tensor names
// (base_model.model.model.layers.{i}.{self_attn,mlp}.{module}.lora_{A,B}.weight).
struct RandomLoraOptions {
  int64_t rank = 16;
  double alpha = 32;
  bool rslora = false;
  std::vector<std::string> targets = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                      "gate_proj", "up_proj", "down_proj"};
  DType dtype = DType::kF32;  // kF32 or kBF16
  double std = 0.02;
  uint64_t seed = 1;
  std::string base_model;  // base_model_name_or_path
};

absl::Status WriteRandomLoraAdapter(const ModelConfig& config, const RandomLoraOptions& options,
                                    const std::string& dir);

}  // namespace tandem
