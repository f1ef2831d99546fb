#include "common/engine/engine_builder.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/engine/backend/cpu/cpu_backend.h"
#include "common/engine/kv_fingerprint.h"
#include "common/engine/model/quantize.h"
#include "common/engine/spec/draft_proposer.h"
#include "common/engine/spec/ngram_proposer.h"
#include "common/tokenizer/tokenizer.h"
#if defined(TANDEM_HAVE_CUDA)
#include "common/engine/backend/cuda/cuda_backend.h"
#endif

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

absl::StatusOr<std::string> ResolveDevice(const std::string& device) {
  if (device == "cpu") return std::string("cpu");
  int index = 0;
  if (device != "auto" && device != "cuda" &&
      !(device.rfind("cuda:", 0) == 0 && absl::SimpleAtoi(device.substr(5), &index) &&
        index >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("device must be auto, cpu, cuda or cuda:N, got '", device, "'"));
  }
#if defined(TANDEM_HAVE_CUDA)
  std::string why;
  if (CudaDeviceAvailable(&why)) return absl::StrCat("cuda:", index);
  if (device == "auto") return std::string("cpu");
  return absl::FailedPreconditionError(absl::StrCat("device '", device, "' requested but ", why));
#else
  if (device == "auto") return std::string("cpu");
  return absl::FailedPreconditionError(
      absl::StrCat("device '", device,
                   "' requested but this build has no CUDA backend (configure with -DWITH_CUDA=ON "
                   "on a machine with the CUDA toolkit)"));
#endif
}

namespace {

// Whether any of the model's matrices multiplies a permuted input (act-order GPTQ).
bool HasInputPermutation(const Model& model) {
  const ModelWeights& w = model.weights();
  if (w.lm_head.input_perm != nullptr) return true;
  for (const LayerWeights& lw : w.layers) {
    for (const Tensor* t : {&lw.q_proj, &lw.k_proj, &lw.v_proj, &lw.o_proj, &lw.gate_proj,
                            &lw.up_proj, &lw.down_proj}) {
      if (t->input_perm != nullptr) return true;
    }
  }
  return false;
}

// The speculative proposer the options ask for (null when speculation is off). A draft model
// runs on the CPU backend with its own KV pool (f32).
absl::StatusOr<std::unique_ptr<Proposer>> BuildProposer(const EngineBuildOptions& options,
                                                        const Model& target, int64_t target_blocks,
                                                        const LoadOptions& load) {
  const SpecOptions& spec = options.engine.spec;
  switch (spec.method) {
    case SpecOptions::Method::kNone:
      return std::unique_ptr<Proposer>();
    case SpecOptions::Method::kNgram:
      if (spec.ngram_min < 1 || spec.ngram_max < spec.ngram_min) {
        return absl::InvalidArgumentError("ngram sizes must satisfy 1 <= min <= max");
      }
      return std::unique_ptr<Proposer>(new NgramProposer(spec.ngram_max, spec.ngram_min));
    case SpecOptions::Method::kDraft:
      break;
  }
  if (spec.draft_model_dir.empty()) {
    return absl::InvalidArgumentError("speculative method 'draft' needs a draft model directory");
  }
  LoadOptions draft_load = load;  // its backend takes f32 inputs
  draft_load.quant_layout = WeightLayout::kRows;
  draft_load.bf16_layout = WeightLayout::kRows;
  auto draft = LoadModel(spec.draft_model_dir, draft_load);
  if (!draft.ok()) return draft.status();
  if ((*draft)->config().vocab_size != target.config().vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft model ", spec.draft_model_dir, " has vocabulary size ",
        (*draft)->config().vocab_size, ", the target has ", target.config().vocab_size));
  }
  std::shared_ptr<const Model> draft_model = std::move(draft).value();
  CpuBackendOptions bo;
  bo.num_threads = options.threads;
  bo.block_size = options.block_size;
  bo.kv_dtype = DType::kF32;
  bo.num_blocks = spec.draft_kv_blocks > 0 ? spec.draft_kv_blocks : target_blocks;
  auto backend = CpuBackend::Create(draft_model, bo);
  if (!backend.ok()) return backend.status();
  auto proposer = DraftProposer::Create(draft_model, std::move(backend).value());
  if (!proposer.ok()) return proposer.status();
  return std::unique_ptr<Proposer>(std::move(proposer).value());
}

}  // namespace

absl::StatusOr<std::shared_ptr<grammar::GrammarCompiler>> LoadGrammarCompiler(
    const std::string& model_dir) {
  auto tokenizer = Tokenizer::FromModelDir(model_dir);
  if (!tokenizer.ok()) return tokenizer.status();
  auto vocab = grammar::TokenVocab::FromTokenizer(**tokenizer);
  if (!vocab.ok()) return vocab.status();
  return std::make_shared<grammar::GrammarCompiler>(*vocab);
}

absl::StatusOr<BuiltEngine> BuildEngine(const EngineBuildOptions& options) {
  auto device = ResolveDevice(options.device);
  if (!device.ok()) return device.status();
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
  if (!ParseWeightQuant(options.quantization, &load.quantization)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantization must be none, int8, int4 or fp8, got '", options.quantization, "'"));
  }
  load.quant_group_size = options.quant_group_size;
  load.map_weights = options.mmap_weights || *device != "cpu";
  // Quantized weights go into the layout of int8 MatMul inputs wherever those can be chosen: asked
  // for, or auto where the CPU kernels' tier has integer dot products (the rule below; decided
  // before loading, as the layout is made at load).
  const bool int8_dot = cpu::AutoMatMulInputDtype(WeightQuant::kInt8, DType::kBF16) == DType::kI8;
  const bool int8_inputs = options.matmul_input_dtype == "int8" ||
                           options.matmul_input_dtype == "i8" ||
                           (options.matmul_input_dtype == "auto" && int8_dot);
  load.quant_layout =
      *device == "cpu" && int8_inputs ? WeightLayout::kTiles16 : WeightLayout::kRows;
  // Dense bf16 matrices go into the tiles of bf16 inputs where the tier has bf16 dot products
  // unless f32 inputs are asked for: every other choice gives them bf16 inputs (int8 ones are
  // for quantized weights).
  const bool bf16_dot = cpu::Bf16TilesPreferred();
  const bool f32_inputs =
      options.matmul_input_dtype == "f32" || options.matmul_input_dtype == "float32";
  load.bf16_layout =
      *device == "cpu" && bf16_dot && !f32_inputs ? WeightLayout::kTiles16 : WeightLayout::kRows;
  absl::Time start = absl::Now();
  auto model_or = LoadModel(options.model_dir, load);
  if (!model_or.ok()) return model_or.status();
  std::shared_ptr<const Model> model = std::move(model_or).value();
  // int8 / int4 weights (--quantization, AWQ / GPTQ checkpoints) run on both backends, except
  // act-order GPTQ (an input permutation per matrix): cpu only, CudaBackend::Create says so.
  if (model->checkpoint_quant().quantized() && *device != "cpu" && HasInputPermutation(*model)) {
    if (options.device != "auto") {
      return absl::InvalidArgumentError(absl::StrCat(
          options.model_dir, " is an act-order (desc_act) ", model->checkpoint_quant().MethodName(),
          " int4 checkpoint: implemented on cpu only (--device cpu)"));
    }
    *device = "cpu";  // auto: the one backend that serves it
  }
  const ModelConfig& mc = model->config();
  if ((mc.qk_norm || IsGemma(mc.architecture) || mc.num_experts > 0 ||
       mc.rope_dim() != mc.head_dim) &&
      *device != "cpu") {  // not on the CUDA backend yet
    if (options.device != "auto") {
      return absl::InvalidArgumentError(
          absl::StrCat(options.model_dir, " is a ", mc.architecture_name,
                       " model: it is implemented on cpu only (--device cpu)"));
    }
    *device = "cpu";
  }

  // auto: what the CPU kernels' tier runs fastest (cpu::AutoMatMulInputDtype): int8 inputs for
  // int8 and int4 weights where it has integer dot products, bf16 dot products for bf16 weights
  // (and quantized ones without integer dots) where it has those, f32 elsewhere.
  const bool bf16_weights = model->weight_dtype() == DType::kBF16 ||
                            model->quantization() != WeightQuant::kNone ||
                            model->checkpoint_quant().quantized();
  LoraOptions lora_options = options.lora;  // --lora-dtype auto: the weights' dtype
  lora_options.model_dtype = bf16_weights ? DType::kBF16 : DType::kF32;
  DType matmul_input_dtype = DType::kF32;
  if (options.matmul_input_dtype == "auto") {
    const bool quantized =
        model->quantization() != WeightQuant::kNone || model->checkpoint_quant().quantized();
    const bool tiles16 = model->quant_layout() == WeightLayout::kTiles16;
    if (*device == "cpu" && model->quantization() == WeightQuant::kFp8) {
      matmul_input_dtype = cpu::AutoMatMulInputDtype(WeightQuant::kFp8, model->weight_dtype());
    } else if (*device == "cpu" && int8_dot && quantized && tiles16) {
      matmul_input_dtype = DType::kI8;
    } else if (*device == "cpu" && bf16_weights && bf16_dot) {
      matmul_input_dtype = DType::kBF16;
    } else if (*device != "cpu" && bf16_weights) {
      matmul_input_dtype = DType::kBF16;  // cuda: bf16 activations on the tensor cores
    }
  } else if (options.matmul_input_dtype == "bf16" || options.matmul_input_dtype == "bfloat16") {
    matmul_input_dtype = DType::kBF16;
    if (*device != "cpu" && !bf16_weights) {
      return absl::InvalidArgumentError(
          "matmul input dtype bf16 needs bf16 weights (--dtype bf16)");
    }
  } else if (options.matmul_input_dtype == "int8" || options.matmul_input_dtype == "i8") {
    matmul_input_dtype = DType::kI8;
    if (*device != "cpu") {
      return absl::InvalidArgumentError("matmul input dtype int8 is a cpu option");
    }
  } else if (options.matmul_input_dtype != "f32" && options.matmul_input_dtype != "float32") {
    return absl::InvalidArgumentError(
        absl::StrCat("matmul input dtype must be auto, f32, bf16 or int8, got '",
                     options.matmul_input_dtype, "'"));
  }

  DType kv_dtype = model->weight_dtype() == DType::kF32 ? DType::kF32 : DType::kBF16;
  if (options.kv_cache_dtype == "f32") {
    kv_dtype = DType::kF32;
  } else if (options.kv_cache_dtype == "bf16") {
    kv_dtype = DType::kBF16;
  } else if (options.kv_cache_dtype == "fp8" || options.kv_cache_dtype == "fp8_e4m3") {
    kv_dtype = DType::kF8E4M3;
  } else if (options.kv_cache_dtype == "int8") {
    kv_dtype = DType::kI8;
  } else if (options.kv_cache_dtype != "auto") {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache dtype must be auto, f32, bf16, fp8 or int8, got '", options.kv_cache_dtype, "'"));
  }

  const size_t per_block =
      CpuBackend::KvBytesPerBlock(model->config(), options.block_size, kv_dtype, options.window_kv);
  std::unique_ptr<Backend> backend;
  std::string kv_commit;  // how long the CPU pool took to commit, for the log line
  if (*device == "cpu") {
    CpuBackendOptions backend_options;
    backend_options.num_threads = options.threads;
    backend_options.block_size = options.block_size;
    backend_options.kv_dtype = kv_dtype;
    backend_options.matmul_input_dtype = matmul_input_dtype;
    backend_options.max_num_tokens = options.engine.scheduler.max_num_batched_tokens;
    backend_options.window_kv = options.window_kv;
    const int64_t budget =
        options.kv_cache_bytes > 0 ? options.kv_cache_bytes : kDefaultCpuKvCacheBytes;
    backend_options.num_blocks = options.num_kv_blocks > 0
                                     ? options.num_kv_blocks
                                     : budget / static_cast<int64_t>(per_block);
    if (backend_options.num_blocks < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV cache budget ", budget, " bytes holds no block of ", per_block, " bytes"));
    }
    auto cpu = CpuBackend::Create(model, backend_options);
    if (!cpu.ok()) return cpu.status();
    kv_commit =
        absl::StrCat(", committed in ", static_cast<int64_t>((*cpu)->kv_commit_seconds() * 1e3),
                     " ms; activations for ", backend_options.max_num_tokens, " tokens ",
                     (*cpu)->activation_bytes() >> 20, " MiB");
    backend = std::move(cpu).value();
  } else {
#if defined(TANDEM_HAVE_CUDA)
    CudaBackendOptions backend_options;
    if (!absl::SimpleAtoi(device->substr(5), &backend_options.device)) {
      return absl::InternalError(absl::StrCat("bad resolved device '", *device, "'"));
    }
    backend_options.block_size = options.block_size;
    backend_options.kv_dtype = kv_dtype;
    backend_options.num_blocks = options.num_kv_blocks;
    backend_options.kv_cache_bytes = options.kv_cache_bytes;
    backend_options.gpu_memory_utilization = options.gpu_memory_utilization;
    backend_options.bf16_activations = matmul_input_dtype == DType::kBF16;
    backend_options.max_num_tokens = options.engine.scheduler.max_num_batched_tokens;
    backend_options.max_num_seqs = options.engine.scheduler.max_num_seqs;
    backend_options.max_model_len = options.engine.max_model_len;
    if (lora_options.enable_lora || !lora_options.modules.empty()) {
      backend_options.lora_slots = lora_options.max_loras;
      backend_options.lora_max_rank = lora_options.max_lora_rank;
      backend_options.lora_dtype = lora_options.resolved_dtype();
    }
    auto cuda = CreateCudaBackend(model, backend_options);
    if (!cuda.ok()) return cuda.status();
    backend = std::move(cuda).value();
#else
    return absl::InternalError(absl::StrCat("device '", *device, "' in a build without CUDA"));
#endif
  }
  const int64_t num_blocks = backend->kv_spec().num_blocks;
  const std::string backend_name = backend->name();
  EngineOptions engine_options = options.engine;
  if (engine_options.kv_tiers.enabled()) {
    // Everything besides tokens and salt that changes a KV block's bytes.
    std::vector<std::pair<std::string, std::string>> settings = {
        {"weights", std::string(DTypeName(model->weight_dtype()))},
        {"quantization", absl::StrCat(options.quantization, "/", options.quant_group_size, "/",
                                      model->checkpoint_quant().MethodName())},
        {"backend", *device == "cpu" ? std::string("cpu") : std::string("cuda")},
    };
    if (const auto* cpu = dynamic_cast<const CpuBackend*>(backend.get()); cpu != nullptr) {
      for (auto& label : cpu->InfoLabels()) settings.push_back(std::move(label));
    }
    auto fingerprint = KvTierFingerprint(options.model_dir, backend->kv_spec(), settings);
    if (!fingerprint.ok()) return fingerprint.status();
    engine_options.kv_tiers.fingerprint = *fingerprint;
  }
  auto proposer = BuildProposer(options, *model, num_blocks, load);
  if (!proposer.ok()) return proposer.status();
  if (engine_options.grammar == nullptr) {
    // Structured output needs each token's bytes: from the model's tokenizer when it has one.
    auto grammar = LoadGrammarCompiler(options.model_dir);
    if (grammar.ok()) {
      engine_options.grammar = std::move(*grammar);
    } else {
      TLOG(WARNING) << "structured output disabled: " << grammar.status();
    }
  }
  if (engine_options.lora == nullptr) {
    auto lora = MakeLoraRegistry(model->config(), lora_options);
    if (!lora.ok()) return lora.status();
    engine_options.lora = std::move(lora).value();
  }
  auto engine = Engine::Create(engine_options, model, std::move(backend), std::move(*proposer));
  if (!engine.ok()) return engine.status();
  if (options.show_progress) {
    TLOG(INFO) << "engine ready: model " << options.model_dir << " ("
               << DTypeName(model->weight_dtype()) << " weights"
               << (load.quantization != WeightQuant::kNone
                       ? absl::StrCat(" quantized ", options.quantization)
                   : model->checkpoint_quant().quantized()
                       ? absl::StrCat(" ", model->checkpoint_quant().MethodName(), " ",
                                      model->checkpoint_quant().FormatName())
                       : std::string())
               << (matmul_input_dtype == DType::kBF16 ? ", bf16 matmul inputs"
                   : matmul_input_dtype == DType::kI8 ? ", int8 matmul inputs"
                                                      : "")
               << ", " << model->config().num_layers << " layers) on " << backend_name
               << ", KV pool " << num_blocks << " blocks x " << options.block_size << " tokens ("
               << DTypeName(kv_dtype) << ", " << (per_block * num_blocks) / (1 << 20) << " MiB"
               << kv_commit << "), " << absl::ToDoubleMilliseconds(absl::Now() - start) << " ms";
  }
  return BuiltEngine{std::move(model), std::move(engine).value()};
}

}  // namespace tandem
