// EngineFlags: the flags show and keep EngineBuildOptions' own defaults, the converted ones
// (sizes, names, negations) land in the options, and ToArgs (how `tandem serve` starts its
// workers) gives back the same options.

#include "common/worker/engine_flags.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

absl::StatusOr<EngineBuildOptions> Parse(const std::vector<std::string>& args) {
  EngineFlags flags;
  FlagSet set("test", "");
  flags.Register(&set);
  std::vector<char*> argv = {const_cast<char*>("test")};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  if (absl::Status st = set.Parse(static_cast<int>(argv.size()), argv.data()); !st.ok()) return st;
  return flags.ToBuildOptions();
}

void ExpectSame(const EngineBuildOptions& a, const EngineBuildOptions& b) {
  EXPECT_EQ(a.model_dir, b.model_dir);
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.gpu_memory_utilization, b.gpu_memory_utilization);
  EXPECT_EQ(a.weight_dtype, b.weight_dtype);
  EXPECT_EQ(a.kv_cache_dtype, b.kv_cache_dtype);
  EXPECT_EQ(a.quantization, b.quantization);
  EXPECT_EQ(a.quant_group_size, b.quant_group_size);
  EXPECT_EQ(a.matmul_input_dtype, b.matmul_input_dtype);
  EXPECT_EQ(a.mmap_weights, b.mmap_weights);
  EXPECT_EQ(a.kv_cache_bytes, b.kv_cache_bytes);
  EXPECT_EQ(a.num_kv_blocks, b.num_kv_blocks);
  EXPECT_EQ(a.block_size, b.block_size);
  EXPECT_EQ(a.threads, b.threads);
  const EngineOptions& ea = a.engine;
  const EngineOptions& eb = b.engine;
  EXPECT_EQ(ea.scheduler.policy, eb.scheduler.policy);
  EXPECT_EQ(ea.scheduler.max_num_seqs, eb.scheduler.max_num_seqs);
  EXPECT_EQ(ea.scheduler.max_num_batched_tokens, eb.scheduler.max_num_batched_tokens);
  EXPECT_EQ(ea.scheduler.max_prefill_chunk, eb.scheduler.max_prefill_chunk);
  EXPECT_EQ(ea.enable_prefix_cache, eb.enable_prefix_cache);
  EXPECT_EQ(ea.max_model_len, eb.max_model_len);
  EXPECT_EQ(ea.max_waiting, eb.max_waiting);
  EXPECT_EQ(ea.spec.method, eb.spec.method);
  EXPECT_EQ(ea.spec.num_speculative_tokens, eb.spec.num_speculative_tokens);
  EXPECT_EQ(ea.spec.draft_model_dir, eb.spec.draft_model_dir);
  EXPECT_EQ(ea.spec.ngram_max, eb.spec.ngram_max);
  EXPECT_EQ(ea.spec.ngram_min, eb.spec.ngram_min);
  EXPECT_EQ(ea.spec.adaptive, eb.spec.adaptive);
  EXPECT_EQ(a.lora.enable_lora, b.lora.enable_lora);
  EXPECT_EQ(a.lora.modules, b.lora.modules);
  EXPECT_EQ(a.lora.max_loras, b.lora.max_loras);
  EXPECT_EQ(a.lora.max_lora_rank, b.lora.max_lora_rank);
  EXPECT_EQ(a.lora.max_cpu_loras, b.lora.max_cpu_loras);
}

TEST(EngineFlagsTest, WithoutFlagsTheOptionsAreTheDefaults) {
  auto parsed = Parse({});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EngineBuildOptions defaults;
  defaults.model_dir = EngineFlags().options.model_dir;  // DefaultModelDir()
  ExpectSame(*parsed, defaults);
  EXPECT_FALSE(parsed->model_dir.empty());
}

TEST(EngineFlagsTest, UsageShowsTheOptionsDefaults) {
  EngineFlags flags;
  FlagSet set("test", "");
  flags.Register(&set);
  const std::string usage = set.Usage();
  EXPECT_NE(usage.find("--kv-cache-memory"), std::string::npos);
  // 0: the device's own default pool (1GiB on cpu, the --gpu-memory-utilization share on cuda).
  EXPECT_NE(usage.find("on cuda what --gpu-memory-utilization leaves (default: 0)"),
            std::string::npos);
  EXPECT_NE(usage.find("(default: fcfs)"), std::string::npos);
  EXPECT_NE(usage.find("(default: 512)"), std::string::npos);  // max-num-batched-tokens
  EXPECT_NE(usage.find("(default: 0.9)"), std::string::npos);  // gpu-memory-utilization
}

TEST(EngineFlagsTest, ConvertedFlagsLandInTheOptions) {
  auto parsed =
      Parse({"--kv-cache-memory=512MiB", "--scheduling-policy=priority",
             "--speculative-method=ngram", "--no-prefix-cache", "--no-adaptive-speculation",
             "--threads=3", "--num-speculative-tokens=7", "--max-num-seqs=9"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->kv_cache_bytes, int64_t{512} << 20);
  EXPECT_EQ(parsed->engine.scheduler.policy, SchedulingPolicy::kPriority);
  EXPECT_EQ(parsed->engine.spec.method, SpecOptions::Method::kNgram);
  EXPECT_FALSE(parsed->engine.enable_prefix_cache);
  EXPECT_FALSE(parsed->engine.spec.adaptive);
  EXPECT_EQ(parsed->threads, 3);
  EXPECT_EQ(parsed->engine.spec.num_speculative_tokens, 7);
  EXPECT_EQ(parsed->engine.scheduler.max_num_seqs, 9);
}

TEST(EngineFlagsTest, UnknownNamesAreRefusedNamingTheFlag) {
  auto policy = Parse({"--scheduling-policy=lifo"});
  ASSERT_FALSE(policy.ok());
  EXPECT_NE(policy.status().message().find("--scheduling-policy"), std::string::npos);
  // The static-batching benchmark baselines exist only in the benchmark's server.
  EXPECT_FALSE(Parse({"--scheduling-policy=static"}).ok());
  EXPECT_FALSE(Parse({"--scheduling-policy=static-compact"}).ok());
  auto spec = Parse({"--speculative-method=magic"});
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("--speculative-method"), std::string::npos);
  EXPECT_FALSE(Parse({"--kv-cache-memory=lots"}).ok());
}

TEST(EngineFlagsTest, ToArgsGivesBackTheSameOptions) {
  const std::vector<std::string> args = {"--model=/models/m",
                                         "--dtype=bf16",
                                         "--kv-cache-dtype=fp8",
                                         "--quantization=int4",
                                         "--quantization-group-size=64",
                                         "--kv-cache-memory=3GiB",
                                         "--num-kv-blocks=77",
                                         "--block-size=32",
                                         "--max-prefill-chunk=128",
                                         "--max-model-len=999",
                                         "--max-waiting=5",
                                         "--scheduling-policy=priority",
                                         "--device=auto",
                                         "--gpu-memory-utilization=0.5",
                                         "--speculative-method=draft",
                                         "--draft-model=/d",
                                         "--ngram-max=6",
                                         "--ngram-min=2",
                                         "--no-prefix-cache",
                                         "--no-async-scheduling",
                                         "--mmap-weights",
                                         "--no-adaptive-speculation",
                                         "--enable-lora",
                                         "--lora-modules=a=/x",
                                         "--max-loras=2",
                                         "--max-lora-rank=32",
                                         "--max-cpu-loras=4"};
  EngineFlags flags;
  FlagSet set("test", "");
  flags.Register(&set);
  std::vector<char*> argv = {const_cast<char*>("test")};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  ASSERT_TRUE(set.Parse(static_cast<int>(argv.size()), argv.data()).ok());
  auto original = flags.ToBuildOptions();
  ASSERT_TRUE(original.ok()) << original.status();
  auto again = Parse(flags.ToArgs());
  ASSERT_TRUE(again.ok()) << again.status();
  ExpectSame(*again, *original);
  EXPECT_EQ(again->kv_cache_bytes, int64_t{3} << 30);
  EXPECT_TRUE(again->mmap_weights);
  EXPECT_FALSE(again->engine.async_scheduling);
  EXPECT_EQ(again->lora.modules, std::vector<std::string>{"a=/x"});
  EXPECT_EQ(again->lora.max_cpu_loras, 4);
}

// vLLM's form: --lora-modules name=path name=path (values up to the next flag), or repeated.
TEST(EngineFlagsTest, LoraModulesTakeSeveralValuesOrRepeat) {
  auto parsed = Parse({"--lora-modules", "a=/x", "b=/y", "--max-loras=3", "--lora-modules=c=/z"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->lora.modules, (std::vector<std::string>{"a=/x", "b=/y", "c=/z"}));
  EXPECT_EQ(parsed->lora.max_loras, 3);
  auto bad = Parse({"--lora-modules", "a=/x", "a=/y"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("given twice"), std::string::npos) << bad.status();
  auto limits = Parse({"--enable-lora", "--max-loras=4", "--max-cpu-loras=2"});
  ASSERT_FALSE(limits.ok());
  EXPECT_NE(limits.status().message().find("--max-cpu-loras"), std::string::npos);
}

}  // namespace
}  // namespace tandem
