#include "common/engine/model/quant_config.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/base/mapped_file.h"
#include "common/base/status_macros.h"
#include "common/config/json_fields.h"
#include "common/engine/model/fp8_checkpoint.h"

namespace tandem {
namespace {

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The first of `keys` present in q (AutoAWQ spells some fields differently from transformers).
absl::StatusOr<std::optional<int64_t>> IntField(const nlohmann::json& q,
                                                std::initializer_list<const char*> keys,
                                                const std::string& source) {
  for (const char* key : keys) {
    TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> v, JsonOptionalInt(q, key, source));
    if (v.has_value()) return v;
  }
  return std::optional<int64_t>();
}

absl::Status CheckGroupSize(CheckpointQuantConfig& c, const nlohmann::json& q,
                            const std::string& source, bool allow_minus_one) {
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> group,
                          IntField(q, {"group_size", "q_group_size"}, source));
  if (!group.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": quantization 'group_size' missing"));
  }
  c.group_size = *group;
  if (c.group_size == -1 && allow_minus_one) return absl::OkStatus();
  if (c.group_size < 32 || (c.group_size & (c.group_size - 1)) != 0) {
    return UnsupportedQuantization(source, absl::StrCat("quantization group_size ", c.group_size,
                                                        " is not supported (a power of two >= 32",
                                                        allow_minus_one ? ", or -1)" : ")"));
  }
  return absl::OkStatus();
}

absl::Status ParseAwq(CheckpointQuantConfig& c, const nlohmann::json& q,
                      const std::string& source) {
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> version,
                          JsonOptionalString(q, "version", source));
  const std::string v = Lower(version.value_or("gemm"));
  if (v != "gemm") {
    return UnsupportedQuantization(
        source, absl::StrCat("AWQ version '", *version,
                             "' is not supported (only 'gemm': qweight [in, "
                             "out/8]; gemv, gemv_fast and marlin are other layouts)"));
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<bool> zero_point,
                          JsonOptionalBool(q, "zero_point", source));
  if (!zero_point.value_or(true)) {
    return UnsupportedQuantization(source, "AWQ with zero_point false is not supported");
  }
  return CheckGroupSize(c, q, source, /*allow_minus_one=*/false);
}

absl::Status ParseGptq(CheckpointQuantConfig& c, const nlohmann::json& q,
                       const std::string& source) {
  TANDEM_ASSIGN_OR_RETURN(std::optional<bool> sym, JsonOptionalBool(q, "sym", source));
  TANDEM_ASSIGN_OR_RETURN(std::optional<bool> desc_act, JsonOptionalBool(q, "desc_act", source));
  TANDEM_ASSIGN_OR_RETURN(std::optional<bool> marlin,
                          JsonOptionalBool(q, "is_marlin_format", source));
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> format,
                          JsonOptionalString(q, "checkpoint_format", source));
  c.sym = sym.value_or(true);
  c.desc_act = desc_act.value_or(false);
  const std::string f = Lower(format.value_or("gptq"));
  if (marlin.value_or(false) || (f != "gptq" && f != "gptq_v2")) {
    return UnsupportedQuantization(
        source,
        absl::StrCat("GPTQ checkpoint_format '", marlin.value_or(false) ? "marlin" : *format,
                     "' is not supported (supported: gptq, gptq_v2)"));
  }
  c.gptq_version = f == "gptq_v2" ? 2 : 1;
  return CheckGroupSize(c, q, source, /*allow_minus_one=*/true);
}

}  // namespace

std::string CheckpointQuantConfig::MethodName() const {
  switch (method) {
    case CheckpointQuantMethod::kAwq:
      return "awq";
    case CheckpointQuantMethod::kGptq:
      return "gptq";
    case CheckpointQuantMethod::kCompressedTensorsFp8:
      return "compressed-tensors";
    case CheckpointQuantMethod::kFbgemmFp8:
      return "fbgemm_fp8";
    case CheckpointQuantMethod::kFp8:
      return "fp8";
    case CheckpointQuantMethod::kNone:
      break;
  }
  return "none";
}

std::string CheckpointQuantConfig::IdSuffix() const {
  if (!quantized()) return "";
  if (fp8()) return absl::StrCat("-", MethodName(), per_tensor ? "-fp8t" : "-fp8");
  return absl::StrCat("-", MethodName(), group_size < 0 ? "-gch" : absl::StrCat("-g", group_size),
                      desc_act ? "-act" : "");
}

absl::StatusOr<CheckpointQuantConfig> ParseCheckpointQuantConfig(const nlohmann::json& q,
                                                                 const std::string& source,
                                                                 bool from_quantize_config) {
  CheckpointQuantConfig c;
  c.source = source;
  if (!q.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": quantization config is not a JSON object"));
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> method,
                          JsonOptionalString(q, "quant_method", source));
  if (!method.has_value() && !from_quantize_config) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": quantization_config has no 'quant_method'"));
  }
  const std::string m = Lower(method.value_or("gptq"));
  if (m == "awq") {
    c.method = CheckpointQuantMethod::kAwq;
  } else if (m == "gptq") {
    c.method = CheckpointQuantMethod::kGptq;
  } else if (m == "compressed-tensors" || m == "fbgemm_fp8" || m == "fp8") {
    c.method = m == "fp8"          ? CheckpointQuantMethod::kFp8
               : m == "fbgemm_fp8" ? CheckpointQuantMethod::kFbgemmFp8
                                   : CheckpointQuantMethod::kCompressedTensorsFp8;
    TANDEM_RETURN_IF_ERROR(ParseFp8QuantConfig(q, source, &c));
    return c;
  } else {
    return UnsupportedQuantization(source, absl::StrCat("quant_method '", *method,
                                                        "' is not supported (supported: awq, gptq, "
                                                        "compressed-tensors, fbgemm_fp8, fp8)"));
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> bits, IntField(q, {"bits", "w_bit"}, source));
  if (!bits.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": quantization 'bits' missing"));
  }
  if (*bits != 4) {
    return UnsupportedQuantization(
        source, absl::StrCat(c.MethodName(), " with bits ", *bits, " is not supported (only 4)"));
  }
  c.bits = *bits;
  if (c.method == CheckpointQuantMethod::kAwq) {
    TANDEM_RETURN_IF_ERROR(ParseAwq(c, q, source));
  } else {
    TANDEM_RETURN_IF_ERROR(ParseGptq(c, q, source));
  }
  return c;
}

absl::StatusOr<CheckpointQuantConfig> LoadCheckpointQuantConfig(const std::string& dir) {
  const std::filesystem::path root(dir);
  const std::string config_path = (root / "config.json").string();
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_path));
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json doc, ParseJsonDocument(text, config_path));
  if (doc.is_object()) {
    auto it = doc.find("quantization_config");
    if (it != doc.end() && !it->is_null()) {
      return ParseCheckpointQuantConfig(*it, config_path, /*from_quantize_config=*/false);
    }
  }
  const std::string separate = (root / "quantize_config.json").string();
  if (!std::filesystem::exists(separate)) return CheckpointQuantConfig();
  TANDEM_ASSIGN_OR_RETURN(std::string qtext, ReadFileToString(separate));
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json qdoc, ParseJsonDocument(qtext, separate));
  return ParseCheckpointQuantConfig(qdoc, separate, /*from_quantize_config=*/true);
}

absl::Status UnsupportedQuantization(const std::string& source, const std::string& message) {
  return absl::UnimplementedError(absl::StrCat(source, ": ", message));
}

}  // namespace tandem
