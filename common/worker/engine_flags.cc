#include "common/worker/engine_flags.h"

#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config/default_model.h"
#include "common/engine/scheduling_policies.h"

namespace tandem {
namespace {

// Command-line names of the enums, both ways from one table each.
constexpr std::pair<const char*, SchedulingPolicy> kPolicies[] = {
    {"fcfs", SchedulingPolicy::kFcfs},
    {"priority", SchedulingPolicy::kPriority},
};
constexpr std::pair<const char*, SpecOptions::Method> kSpecMethods[] = {
    {"none", SpecOptions::Method::kNone},
    {"ngram", SpecOptions::Method::kNgram},
    {"draft", SpecOptions::Method::kDraft},
};

template <typename Enum, size_t N>
std::string NameOf(const std::pair<const char*, Enum> (&table)[N], Enum value) {
  for (const auto& [name, v] : table) {
    if (v == value) return name;
  }
  return "";
}

template <typename Enum, size_t N>
bool ValueOf(const std::pair<const char*, Enum> (&table)[N], const std::string& name, Enum* out) {
  for (const auto& [n, v] : table) {
    if (name == n) {
      *out = v;
      return true;
    }
  }
  return false;
}

// "1GiB" for 1 << 30: the largest binary unit that divides the size.
std::string FormatByteSize(int64_t bytes) {
  for (const auto& [unit, shift] : {std::pair{"GiB", 30}, {"MiB", 20}, {"KiB", 10}}) {
    const int64_t scale = int64_t{1} << shift;
    if (bytes > 0 && bytes % scale == 0) return absl::StrCat(bytes / scale, unit);
  }
  return absl::StrCat(bytes);
}

}  // namespace

EngineFlags::EngineFlags()
    : kv_memory(FormatByteSize(options.kv_cache_bytes)),
      policy(NameOf(kPolicies, options.engine.scheduler.policy)),
      speculative_method(NameOf(kSpecMethods, options.engine.spec.method)),
      kv_offload_host_memory(FormatByteSize(options.engine.kv_tiers.host_bytes)),
      kv_offload_disk_size(FormatByteSize(options.engine.kv_tiers.disk_bytes)),
      kv_offload_write_bandwidth(FormatByteSize(options.engine.kv_tiers.write_bytes_per_second)),
      kv_offload_queue(FormatByteSize(options.engine.kv_tiers.write_queue_bytes)),
      no_prefix_cache(!options.engine.enable_prefix_cache),
      no_adaptive_speculation(!options.engine.spec.adaptive) {
  options.model_dir = DefaultModelDir();
}

void EngineFlags::Register(FlagSet* f) {
  EngineBuildOptions& o = options;
  SchedulerOptions& sched = o.engine.scheduler;
  SpecOptions& spec = o.engine.spec;
  f->String("model", &o.model_dir, "Hugging Face model directory");
  f->String("dtype", &o.weight_dtype, "weight dtype in memory: auto, f32 or bf16");
  f->String("kv-cache-dtype", &o.kv_cache_dtype,
            "KV cache dtype: auto, f32, bf16, fp8 (e4m3) or int8 (fp8/int8: a scale per token and "
            "kv head; the same bytes on cpu and cuda)");
  f->String("quantization", &o.quantization,
            "weight-only quantization made at load time: none, int8 (per-channel), int4 "
            "(groups with zero points) or fp8 (e4m3, per-channel scales; cpu: f32 or bf16 "
            "inputs); cpu and cuda. AWQ / GPTQ int4 checkpoints are detected "
            "from config.json and load as int4 by themselves (keep none; act-order GPTQ: cpu "
            "only)");
  f->Int("quantization-group-size", &o.quant_group_size,
         "int4: weights per scale/zero group along the input dimension (32, 64, 128, ...)");
  f->Bool("mmap-weights", &o.mmap_weights,
          "cpu: use weights stored in their in-memory dtype straight from the checkpoint's file "
          "mapping (less memory, 4 KiB page-cache pages) instead of copying them into huge-page "
          "memory at load (faster decode); bf16 projections that take bf16 inputs on "
          "AVX512_BF16 are rearranged into tiles at load either way");
  f->String("matmul-input-dtype", &o.matmul_input_dtype,
            "what the matrix products' inputs are rounded to: auto (cpu: int8 for int8 and "
            "int4 weights on CPUs with AVX512_VNNI, bf16 for bf16 weights (and quantized ones "
            "without VNNI) on CPUs with AVX512_BF16, else f32; cuda: bf16 for bf16 weights), f32 "
            "(exact; cuda: the f32-activation parity mode) or bf16 (bf16 dot products, "
            "vdpbf16ps on AVX512_BF16, tensor cores on cuda; quantized weights dequantized to "
            "bf16; not with f32 weights) or int8 (cpu, int8 / int4 weights only: each input row "
            "quantized to int8 with one scale, integer dot products, vpdpbusd on AVX512_VNNI)");
  f->String("kv-cache-memory", &kv_memory,
            "KV pool budget, e.g. 512MiB or 4GiB (cpu: the whole pool is committed at startup); "
            "0: 1GiB on cpu, on cuda what --gpu-memory-utilization leaves");
  f->Int("num-kv-blocks", &o.num_kv_blocks, "KV pool size in blocks (overrides the budget)");
  f->Int("block-size", &o.block_size, "tokens per KV block");
  f->Int("max-num-seqs", &sched.max_num_seqs, "sequences per step at most");
  f->Int("max-num-batched-tokens", &sched.max_num_batched_tokens, "tokens per step at most");
  f->Int("max-prefill-chunk", &sched.max_prefill_chunk,
         "tokens of one prompt per step (0: budget)");
  f->Int("max-model-len", &o.engine.max_model_len, "context length (0: the model's)");
  f->Int("max-waiting", &o.engine.max_waiting, "queued sequences before RESOURCE_EXHAUSTED");
  f->String("scheduling-policy", &policy, "fcfs or priority");
  f->Bool("no-prefix-cache", &no_prefix_cache, "disable prefix caching");
  f->Bool("async-scheduling", &o.engine.async_scheduling,
          "cuda: plan and launch each step before the previous one's tokens reach the host, so "
          "the host's work overlaps the GPU's (--no-async-scheduling: wait for every step); "
          "steps that need a token on the host first (grammar, penalties, n > 1, speculation) "
          "wait for it");
  f->String("kv-offload-host-memory", &kv_offload_host_memory,
            "KV tiers: host memory for prefix blocks evicted from the pool, e.g. 8GiB (0: off). "
            "On a GPU worker the tier below device memory; on a CPU worker, whose pool is host "
            "memory already, a second-level host cache beside the pool");
  f->String("kv-offload-dir", &o.engine.kv_tiers.disk_dir,
            "KV tiers: a local directory private to this worker for evicted prefix blocks "
            "(created 0700; survives restarts; one worker per directory: `serve --prefill-workers/"
            "--decode-workers` gives each worker DIR/<role>-<index>). Empty: no disk tier");
  f->String("kv-offload-disk-size", &kv_offload_disk_size,
            "KV tiers: bytes of --kv-offload-dir to use at most (least recently used first out)");
  f->String("kv-offload-write-bandwidth", &kv_offload_write_bandwidth,
            "KV tiers: disk write-behind pace, bytes per second (0: unpaced)");
  f->String("kv-offload-queue", &kv_offload_queue,
            "KV tiers: write-behind queue bound in bytes; evicted blocks beyond it are dropped "
            "(counted), never waited for");
  f->Int32("threads", &o.threads, "compute threads (0: one per core)");
  f->String("device", &o.device, "cpu, cuda, cuda:N or auto (cuda when a GPU is visible)");
  f->Double("gpu-memory-utilization", &o.gpu_memory_utilization,
            "cuda: fraction of device memory for weights, activations and the KV pool (a "
            "--kv-cache-memory budget must fit under it)");
  f->String("speculative-method", &speculative_method, "none, ngram or draft");
  f->Int32("num-speculative-tokens", &spec.num_speculative_tokens,
           "drafted tokens per step at most");
  f->String("draft-model", &spec.draft_model_dir,
            "draft model directory (speculative method draft)");
  f->Int32("ngram-max", &spec.ngram_max, "ngram: longest suffix to match");
  f->Int32("ngram-min", &spec.ngram_min, "ngram: shortest suffix to match");
  f->Bool("no-adaptive-speculation", &no_adaptive_speculation,
          "keep k fixed instead of adapting it to each sequence's acceptance");
  LoraOptions& lora = o.lora;
  f->Bool("enable-lora", &lora.enable_lora,
          "serve LoRA adapters (requests select one by its name in the model field); implied by "
          "--lora-modules; cpu only");
  f->StringList("lora-modules", &lora.modules,
                "LoRA adapters to load at start, as name=path (a PEFT directory: "
                "adapter_config.json + adapter_model.safetensors); several after one flag or the "
                "flag repeated");
  f->Int("max-loras", &lora.max_loras,
         "distinct LoRA adapters among the requests running at once (so in one batch); requests "
         "for another adapter wait");
  f->Int("max-lora-rank", &lora.max_lora_rank, "largest LoRA rank an adapter may have");
  f->String("lora-dtype", &lora.dtype,
            "what LoRA adapters are kept and computed in: auto (the model's weights: bfloat16 "
            "for bf16 and quantized weights, float32 for f32), float32 or bfloat16");
  f->Int("max-cpu-loras", &lora.max_cpu_loras,
         "LoRA adapters loaded at once (0: --max-loras); at least --max-loras");
}

absl::StatusOr<EngineBuildOptions> EngineFlags::ToBuildOptions() const {
  EngineBuildOptions o = options;
  auto bytes = ParseByteSize(kv_memory);
  if (!bytes.ok()) return bytes.status();
  o.kv_cache_bytes = *bytes;
  if (!ValueOf(kPolicies, policy, &o.engine.scheduler.policy)) {
    // A policy only a benchmark binary registers (scheduling_policies.h); `tandem` has none.
    o.engine.extensions = FindSchedulingPolicy(policy);
    if (!o.engine.extensions) {
      std::vector<std::string> names = {"fcfs", "priority"};
      for (const std::string& name : RegisteredSchedulingPolicies()) names.push_back(name);
      return absl::InvalidArgumentError(absl::StrCat("--scheduling-policy must be one of ",
                                                     absl::StrJoin(names, ", "), ", got '", policy,
                                                     "'"));
    }
  }
  if (!ValueOf(kSpecMethods, speculative_method, &o.engine.spec.method)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative-method must be none, ngram or draft, got '", speculative_method, "'"));
  }
  if (o.lora.enable_lora || !o.lora.modules.empty()) {
    if (auto st = ValidateLoraOptions(o.lora); !st.ok()) return st;
  }
  o.engine.enable_prefix_cache = !no_prefix_cache;
  for (const auto& [flag, text, out] :
       {std::tuple{"--kv-offload-host-memory", &kv_offload_host_memory,
                   &o.engine.kv_tiers.host_bytes},
        std::tuple{"--kv-offload-disk-size", &kv_offload_disk_size, &o.engine.kv_tiers.disk_bytes},
        std::tuple{"--kv-offload-write-bandwidth", &kv_offload_write_bandwidth,
                   &o.engine.kv_tiers.write_bytes_per_second},
        std::tuple{"--kv-offload-queue", &kv_offload_queue,
                   &o.engine.kv_tiers.write_queue_bytes}}) {
    auto size = ParseByteSize(*text);
    if (!size.ok())
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", size.status().message()));
    *out = *size;
  }
  o.engine.spec.adaptive = !no_adaptive_speculation;
  return o;
}

std::vector<std::string> EngineFlags::ToArgs() const {
  const EngineBuildOptions& o = options;
  const SchedulerOptions& sched = o.engine.scheduler;
  const SpecOptions& spec = o.engine.spec;
  std::vector<std::string> a = {
      "--model=" + o.model_dir,
      "--dtype=" + o.weight_dtype,
      "--kv-cache-dtype=" + o.kv_cache_dtype,
      "--quantization=" + o.quantization,
      absl::StrCat("--quantization-group-size=", o.quant_group_size),
      "--matmul-input-dtype=" + o.matmul_input_dtype,
      "--kv-cache-memory=" + kv_memory,
      absl::StrCat("--num-kv-blocks=", o.num_kv_blocks),
      absl::StrCat("--block-size=", o.block_size),
      absl::StrCat("--max-num-seqs=", sched.max_num_seqs),
      absl::StrCat("--max-num-batched-tokens=", sched.max_num_batched_tokens),
      absl::StrCat("--max-prefill-chunk=", sched.max_prefill_chunk),
      absl::StrCat("--max-model-len=", o.engine.max_model_len),
      absl::StrCat("--max-waiting=", o.engine.max_waiting),
      "--scheduling-policy=" + policy,
      absl::StrCat("--threads=", o.threads),
      "--device=" + o.device,
      absl::StrCat("--gpu-memory-utilization=", o.gpu_memory_utilization),
      "--speculative-method=" + speculative_method,
      absl::StrCat("--num-speculative-tokens=", spec.num_speculative_tokens),
      "--draft-model=" + spec.draft_model_dir,
      absl::StrCat("--ngram-max=", spec.ngram_max),
      absl::StrCat("--ngram-min=", spec.ngram_min),
  };
  if (no_adaptive_speculation) a.push_back("--no-adaptive-speculation");
  if (no_prefix_cache) a.push_back("--no-prefix-cache");
  a.push_back(absl::StrCat("--async-scheduling=", o.engine.async_scheduling ? "true" : "false"));
  a.push_back("--kv-offload-host-memory=" + kv_offload_host_memory);
  if (!o.engine.kv_tiers.disk_dir.empty()) {
    a.push_back("--kv-offload-dir=" + o.engine.kv_tiers.disk_dir);
  }
  a.push_back("--kv-offload-disk-size=" + kv_offload_disk_size);
  a.push_back("--kv-offload-write-bandwidth=" + kv_offload_write_bandwidth);
  a.push_back("--kv-offload-queue=" + kv_offload_queue);
  if (o.mmap_weights) a.push_back("--mmap-weights");
  if (o.lora.enable_lora) a.push_back("--enable-lora");
  for (const std::string& m : o.lora.modules) a.push_back("--lora-modules=" + m);
  a.push_back(absl::StrCat("--max-loras=", o.lora.max_loras));
  a.push_back(absl::StrCat("--max-lora-rank=", o.lora.max_lora_rank));
  a.push_back(absl::StrCat("--max-cpu-loras=", o.lora.max_cpu_loras));
  a.push_back("--lora-dtype=" + o.lora.dtype);
  return a;
}

}  // namespace tandem
