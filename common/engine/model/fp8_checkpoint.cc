#include "common/engine/model/fp8_checkpoint.h"

#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/config/json_fields.h"
#include "common/engine/model/convert.h"

namespace tandem {
namespace {

// Whether q[key] is absent or null.
bool Absent(const nlohmann::json& q, const char* key) {
  auto it = q.find(key);
  return it == q.end() || it->is_null();
}

// An fp8 quantization args object of compressed-tensors (`what` names it in errors, e.g.
// "config_groups.group_0.weights"): num_bits 8, type "float", strategy among `strategies`.
absl::StatusOr<std::string> CheckFloat8Args(const nlohmann::json& a, const std::string& what,
                                            const std::string& source,
                                            std::initializer_list<const char*> strategies) {
  if (!a.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", what, " is not an object"));
  }
  const std::string src = absl::StrCat(source, " (", what, ")");
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> bits, JsonOptionalInt(a, "num_bits", src));
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> type, JsonOptionalString(a, "type", src));
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> strategy,
                          JsonOptionalString(a, "strategy", src));
  if (bits.value_or(0) != 8 || type.value_or("") != "float") {
    return UnsupportedQuantization(
        source,
        absl::StrCat(what, ": num_bits ", bits.has_value() ? absl::StrCat(*bits) : "missing",
                     " type '", type.value_or(""),
                     "' is not supported (only num_bits 8, type float)"));
  }
  std::string names;
  for (const char* s : strategies) {
    if (strategy.value_or("") == s) return *strategy;
    absl::StrAppend(&names, names.empty() ? "" : ", ", s);
  }
  return UnsupportedQuantization(source,
                                 absl::StrCat(what, ".strategy '", strategy.value_or(""),
                                              "' is not supported (supported: ", names, ")"));
}

absl::Status ParseCompressedTensors(const nlohmann::json& q, const std::string& source,
                                    CheckpointQuantConfig* c) {
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> format,
                          JsonOptionalString(q, "format", source));
  if (format.value_or("") != "float-quantized") {
    return UnsupportedQuantization(source,
                                   absl::StrCat("compressed-tensors format '", format.value_or(""),
                                                "' is not supported (only 'float-quantized': fp8 "
                                                "e4m3 weights)"));
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> status,
                          JsonOptionalString(q, "quantization_status", source));
  if (status.has_value() && *status != "compressed") {
    return UnsupportedQuantization(source,
                                   absl::StrCat("compressed-tensors quantization_status '", *status,
                                                "' is not supported (only 'compressed')"));
  }
  if (!Absent(q, "kv_cache_scheme")) {
    return UnsupportedQuantization(
        source,
        "compressed-tensors kv_cache_scheme is not supported (the KV cache dtype "
        "is --kv-cache-dtype's, with its own scales)");
  }
  auto groups = q.find("config_groups");
  if (groups == q.end() || !groups->is_object() || groups->size() != 1) {
    return UnsupportedQuantization(source,
                                   absl::StrCat("compressed-tensors config_groups: ",
                                                groups == q.end() || !groups->is_object()
                                                    ? std::string("missing")
                                                    : absl::StrCat(groups->size(), " groups"),
                                                " (supported: exactly one group)"));
  }
  const std::string gname = groups->begin().key();
  const nlohmann::json& g = groups->begin().value();
  if (!g.is_object() || Absent(g, "weights")) {
    return UnsupportedQuantization(source,
                                   absl::StrCat("config_groups.", gname, ".weights missing"));
  }
  const std::string wname = absl::StrCat("config_groups.", gname, ".weights");
  const nlohmann::json& w = g["weights"];
  TANDEM_ASSIGN_OR_RETURN(std::string strategy,
                          CheckFloat8Args(w, wname, source, {"channel", "tensor"}));
  TANDEM_ASSIGN_OR_RETURN(std::optional<bool> dynamic, JsonOptionalBool(w, "dynamic", source));
  TANDEM_ASSIGN_OR_RETURN(std::optional<bool> symmetric, JsonOptionalBool(w, "symmetric", source));
  if (dynamic.value_or(false) || !symmetric.value_or(true)) {
    return UnsupportedQuantization(
        source, absl::StrCat(wname, dynamic.value_or(false) ? ".dynamic true is not supported"
                                                            : ".symmetric false is not supported"));
  }
  if (!Absent(w, "block_structure")) {
    return UnsupportedQuantization(
        source, absl::StrCat(wname,
                             ".block_structure (block-wise scales) is not "
                             "supported (per-channel or per-tensor scales only)"));
  }
  if (!Absent(g, "input_activations")) {
    const std::string aname = absl::StrCat("config_groups.", gname, ".input_activations");
    TANDEM_RETURN_IF_ERROR(
        CheckFloat8Args(g["input_activations"], aname, source, {"token", "tensor"}).status());
  }
  if (!Absent(g, "output_activations")) {
    return UnsupportedQuantization(
        source, absl::StrCat("config_groups.", gname, ".output_activations is not supported"));
  }
  c->per_tensor = strategy == "tensor";
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseFp8QuantConfig(const nlohmann::json& q, const std::string& source,
                                 CheckpointQuantConfig* c) {
  c->bits = 8;
  c->group_size = 0;
  switch (c->method) {
    case CheckpointQuantMethod::kCompressedTensorsFp8:
      return ParseCompressedTensors(q, source, c);
    case CheckpointQuantMethod::kFbgemmFp8:
      c->per_tensor = false;
      return absl::OkStatus();
    case CheckpointQuantMethod::kFp8: {
      if (!Absent(q, "weight_block_size")) {
        return UnsupportedQuantization(source,
                                       "fp8 weight_block_size (block-wise scales) is not supported "
                                       "(per-tensor or per-channel scales only)");
      }
      TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> scheme,
                              JsonOptionalString(q, "activation_scheme", source));
      if (scheme.has_value() && *scheme != "dynamic" && *scheme != "static") {
        return UnsupportedQuantization(source,
                                       absl::StrCat("fp8 activation_scheme '", *scheme,
                                                    "' is not supported (dynamic or static)"));
      }
      c->per_tensor = true;
      return absl::OkStatus();
    }
    default:
      break;
  }
  return absl::InternalError(absl::StrCat(source, ": not an fp8 quantization method"));
}

absl::StatusOr<QuantizedMatrix> ConvertFp8Checkpoint(const Checkpoint::TensorRef& weight,
                                                     const Checkpoint::TensorRef& scale, int64_t N,
                                                     int64_t K) {
  const SafetensorsEntry& w = *weight.entry;
  const SafetensorsEntry& s = *scale.entry;
  auto bad = [](const Checkpoint::TensorRef& r, const std::string& message) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.file->path(), ": tensor '", r.entry->name, "' ", message));
  };
  if (w.dtype != DType::kF8E4M3 || w.shape != std::vector<int64_t>{N, K}) {
    return bad(weight, absl::StrCat("must be F8_E4M3 of shape ", ShapeString({N, K}), ", has ",
                                    w.dtype == DType::kF8E4M3 ? "F8_E4M3" : "another dtype",
                                    " of shape ", ShapeString(w.shape)));
  }
  const bool per_row = s.shape == std::vector<int64_t>{N} || s.shape == std::vector<int64_t>{N, 1};
  const bool per_tensor = s.shape.empty() || s.shape == std::vector<int64_t>{1};
  if ((s.dtype != DType::kF32 && s.dtype != DType::kBF16 && s.dtype != DType::kF16) ||
      !(per_row || per_tensor)) {
    return bad(scale, absl::StrCat("must be F32, BF16 or F16 of shape [", N, "], [", N,
                                   ", 1] (per channel) or [] / [1] (per tensor; block-wise "
                                   "scales are not supported), has shape ",
                                   ShapeString(s.shape)));
  }
  QuantizedMatrix m;
  m.quant = WeightQuant::kFp8;
  m.layout = WeightLayout::kRows;
  m.rows = N;
  m.cols = K;
  m.codes.assign(w.data, w.data + static_cast<size_t>(N * K));
  for (int64_t i = 0; i < N * K; ++i) {
    if ((m.codes[i] & 0x7f) == 0x7f) {
      return bad(weight, absl::StrCat("holds a NaN code at row ", i / K, ", column ", i % K));
    }
  }
  std::vector<float> stored(per_row ? static_cast<size_t>(N) : 1);
  ConvertElements(s.data, s.dtype, stored.data(), DType::kF32, static_cast<int64_t>(stored.size()));
  for (size_t i = 0; i < stored.size(); ++i) {
    if (!std::isfinite(stored[i]) || stored[i] < 0.0f) {
      return bad(scale,
                 absl::StrCat("holds ", stored[i], " at ", i, " (scales must be finite and >= 0)"));
    }
  }
  m.scales = per_row ? std::move(stored) : std::vector<float>(static_cast<size_t>(N), stored[0]);
  return m;
}

}  // namespace tandem
