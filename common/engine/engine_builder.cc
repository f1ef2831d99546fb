#include "common/engine/engine_builder.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/engine/backend/cpu/cpu_backend.h"

namespace tandem {

absl::StatusOr<int64_t> ParseByteSize(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    ++i;
  }
  double number = 0;
  if (i == 0 || !absl::SimpleAtod(text.substr(0, i), &number)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid size '", text, "'"));
  }
  std::string unit = text.substr(i);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 1;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    scale = 1024.0;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    scale = 1024.0 * 1024;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    scale = 1024.0 * 1024 * 1024;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("invalid size unit in '", text, "'"));
  }
  return static_cast<int64_t>(number * scale);
}

absl::StatusOr<BuiltEngine> BuildEngine(const EngineBuildOptions& options) {
  if (options.device != "cpu") {
    return absl::UnimplementedError(
        absl::StrCat("device '", options.device, "' is not available in this build; use cpu"));
  }
  LoadOptions load;
  load.show_progress = options.show_progress;
  if (options.weight_dtype == "auto") {
    load.weight_dtype_auto = true;
  } else if (options.weight_dtype == "f32" || options.weight_dtype == "float32") {
    load.weight_dtype_auto = false;
    load.weight_dtype = DType::kF32;
  } else if (options.weight_dtype == "bf16" || options.weight_dtype == "bfloat16") {
    load.weight_dtype_auto = false;
    load.weight_dtype = DType::kBF16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("weight dtype must be auto, f32 or bf16, got '", options.weight_dtype, "'"));
  }
  absl::Time start = absl::Now();
  auto model_or = LoadModel(options.model_dir, load);
  if (!model_or.ok()) return model_or.status();
  std::shared_ptr<const Model> model = std::move(model_or).value();

  DType kv_dtype = model->weight_dtype() == DType::kF32 ? DType::kF32 : DType::kBF16;
  if (options.kv_cache_dtype == "f32") {
    kv_dtype = DType::kF32;
  } else if (options.kv_cache_dtype == "bf16") {
    kv_dtype = DType::kBF16;
  } else if (options.kv_cache_dtype != "auto") {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache dtype must be auto, f32 or bf16, got '", options.kv_cache_dtype, "'"));
  }

  CpuBackendOptions backend_options;
  backend_options.num_threads = options.threads;
  backend_options.block_size = options.block_size;
  backend_options.kv_dtype = kv_dtype;
  const size_t per_block =
      CpuBackend::KvBytesPerBlock(model->config(), options.block_size, kv_dtype);
  backend_options.num_blocks = options.num_kv_blocks > 0
                                   ? options.num_kv_blocks
                                   : options.kv_cache_bytes / static_cast<int64_t>(per_block);
  if (backend_options.num_blocks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache budget ", options.kv_cache_bytes,
                                                   " bytes holds no block of ", per_block,
                                                   " bytes"));
  }
  auto backend = CpuBackend::Create(model, backend_options);
  if (!backend.ok()) return backend.status();
  auto engine = Engine::Create(options.engine, model, std::move(backend).value());
  if (!engine.ok()) return engine.status();
  if (options.show_progress) {
    TLOG(INFO) << "engine ready: model " << options.model_dir << " ("
               << DTypeName(model->weight_dtype()) << " weights, " << model->config().num_layers
               << " layers), KV pool " << backend_options.num_blocks << " blocks x "
               << options.block_size << " tokens (" << DTypeName(kv_dtype) << ", "
               << (per_block * backend_options.num_blocks) / (1 << 20) << " MiB), "
               << absl::ToDoubleMilliseconds(absl::Now() - start) << " ms";
  }
  return BuiltEngine{std::move(model), std::move(engine).value()};
}

}  // namespace tandem
