#include "common/engine/model/model_writer.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include "common/base/half.h"
#include "common/engine/model/model.h"
#include "common/engine/model/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/common/engine/model/test_util.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using testing_util::ReadFile;
using testing_util::ScratchDir;

// A preset's config at test scale, keeping what distinguishes it: GQA ratio, tying, rope scaling.
ModelConfig Shrink(ModelConfig c) {
  const int64_t group = c.num_heads / c.num_kv_heads;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = std::max<int64_t>(1, 4 / group);
  c.head_dim = 16;
  c.vocab_size = 512;
  return c;
}

std::unique_ptr<Model> Load(const std::string& dir, LoadOptions options = {}) {
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir, options);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

// Every weight of `m` next to the name it was loaded from.
std::vector<std::pair<std::string, const Tensor*>> Named(const Model& m) {
  const ModelWeights& w = m.weights();
  std::vector<std::pair<std::string, const Tensor*>> out = {
      {"model.embed_tokens.weight", &w.embed_tokens}, {"model.norm.weight", &w.final_norm}};
  if (!m.config().tie_word_embeddings) out.push_back({"lm_head.weight", &w.lm_head});
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (auto [n, t] : std::initializer_list<std::pair<const char*, const Tensor*>>{
             {"input_layernorm.weight", &l.input_norm},
             {"self_attn.q_proj.weight", &l.q_proj},
             {"self_attn.k_proj.weight", &l.k_proj},
             {"self_attn.v_proj.weight", &l.v_proj},
             {"self_attn.o_proj.weight", &l.o_proj},
             {"post_attention_layernorm.weight", &l.post_norm},
             {"mlp.gate_proj.weight", &l.gate_proj},
             {"mlp.up_proj.weight", &l.up_proj},
             {"mlp.down_proj.weight", &l.down_proj},
             {"self_attn.q_proj.bias", &l.q_bias},
             {"self_attn.k_proj.bias", &l.k_bias},
             {"self_attn.v_proj.bias", &l.v_bias}}) {
      if (!t->empty()) out.push_back({p + n, t});
    }
  }
  return out;
}

const Tensor* Find(const Model& m, const std::string& name) {
  for (const auto& [n, t] : Named(m)) {
    if (n == name) return t;
  }
  return nullptr;
}

float ValueAt(const Tensor& t, int64_t i) {
  return t.dtype == DType::kF32 ? t.as<float>()[i] : Bf16ToFloat(t.as<uint16_t>()[i]);
}

TEST(ModelWriterTest, PresetConfigs) {
  absl::StatusOr<ModelConfig> big = RandomModelPresetConfig("llama-1b");
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->hidden_size, 2048);
  EXPECT_EQ(big->intermediate_size, 8192);
  EXPECT_EQ(big->num_layers, 16);
  EXPECT_EQ(big->num_heads, 32);
  EXPECT_EQ(big->num_kv_heads, 8);
  EXPECT_EQ(big->head_dim, 64);
  EXPECT_EQ(big->vocab_size, 32000);
  EXPECT_FALSE(big->tie_word_embeddings);
  EXPECT_EQ(big->rope_theta, 500000.0);
  EXPECT_EQ(big->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(big->rope_scaling.factor, 32.0);
  EXPECT_TRUE(ValidateModelConfig(*big, "llama-1b").ok());
  size_t params = 0;
  for (const auto& s : ModelTensorSpecs(*big, DType::kBF16)) params += s.nbytes() / 2;
  EXPECT_NEAR(params / 1e9, 1.1, 0.05);

  absl::StatusOr<ModelConfig> mid = RandomModelPresetConfig("llama-110m");
  ASSERT_TRUE(mid.ok());
  EXPECT_EQ(mid->hidden_size, 768);
  EXPECT_EQ(mid->intermediate_size, 2048);
  EXPECT_EQ(mid->num_layers, 12);
  EXPECT_EQ(mid->num_kv_heads, 12);
  EXPECT_TRUE(mid->tie_word_embeddings);
  EXPECT_TRUE(ValidateModelConfig(*mid, "llama-110m").ok());

  absl::StatusOr<ModelConfig> tiny = RandomModelPresetConfig("tiny");
  ASSERT_TRUE(tiny.ok());
  EXPECT_TRUE(ValidateModelConfig(*tiny, "tiny").ok());

  // Qwen3-0.6B: 596M parameters with its tied embeddings, q/k norms of head_dim per layer.
  absl::StatusOr<ModelConfig> qwen3 = RandomModelPresetConfig("qwen3-0.6b");
  ASSERT_TRUE(qwen3.ok());
  EXPECT_TRUE(ValidateModelConfig(*qwen3, "qwen3-0.6b").ok());
  EXPECT_EQ(qwen3->architecture, Architecture::kQwen3);
  size_t qwen3_params = 0;
  for (const auto& s : ModelTensorSpecs(*qwen3, DType::kBF16)) qwen3_params += s.nbytes() / 2;
  EXPECT_EQ(qwen3_params, 596049920u);
  // Phi-3-mini: 3.82B parameters, untied.
  absl::StatusOr<ModelConfig> phi3 = RandomModelPresetConfig("phi3-mini");
  ASSERT_TRUE(phi3.ok());
  EXPECT_TRUE(ValidateModelConfig(*phi3, "phi3-mini").ok());
  size_t phi3_params = 0;
  for (const auto& s : ModelTensorSpecs(*phi3, DType::kBF16)) phi3_params += s.nbytes() / 2;
  EXPECT_NEAR(phi3_params / 1e9, 3.82, 0.005);
  // Gemma-3-1B: 999,885,952 parameters (its published count), tied.
  absl::StatusOr<ModelConfig> gemma3 = RandomModelPresetConfig("gemma3-1b");
  ASSERT_TRUE(gemma3.ok());
  EXPECT_TRUE(ValidateModelConfig(*gemma3, "gemma3-1b").ok());
  size_t gemma3_params = 0;
  for (const auto& s : ModelTensorSpecs(*gemma3, DType::kBF16)) gemma3_params += s.nbytes() / 2;
  EXPECT_EQ(gemma3_params, 999885952u);
  // Gemma-2-2B: 2,614,341,888 parameters; Phi-4-mini: 3,836,021,760 (published counts), tied.
  for (const auto& [name, want] : std::vector<std::pair<std::string, size_t>>{
           {"gemma2-2b", 2614341888u}, {"phi4-mini", 3836021760u}}) {
    absl::StatusOr<ModelConfig> c = RandomModelPresetConfig(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_TRUE(ValidateModelConfig(*c, name).ok()) << name;
    size_t params = 0;
    for (const auto& s : ModelTensorSpecs(*c, DType::kBF16)) params += s.nbytes() / 2;
    EXPECT_EQ(params, want) << name;
  }
  // Mixtral-8x7B: 46.7B parameters; Qwen3-30B-A3B: 30.5B. Decode reads the active experts only.
  absl::StatusOr<ModelConfig> mixtral = RandomModelPresetConfig("mixtral-8x7b");
  ASSERT_TRUE(mixtral.ok());
  EXPECT_TRUE(ValidateModelConfig(*mixtral, "mixtral-8x7b").ok());
  size_t mixtral_params = 0;
  for (const auto& s : ModelTensorSpecs(*mixtral, DType::kBF16)) mixtral_params += s.nbytes() / 2;
  EXPECT_NEAR(mixtral_params / 1e9, 46.70, 0.01);
  absl::StatusOr<ModelConfig> a3b = RandomModelPresetConfig("qwen3-30b-a3b");
  ASSERT_TRUE(a3b.ok());
  EXPECT_TRUE(ValidateModelConfig(*a3b, "qwen3-30b-a3b").ok());
  size_t a3b_params = 0;
  for (const auto& s : ModelTensorSpecs(*a3b, DType::kBF16)) a3b_params += s.nbytes() / 2;
  EXPECT_NEAR(a3b_params / 1e9, 30.53, 0.01);
  // Qwen1.5-MoE-A2.7B: 14.3B parameters; Qwen2-57B-A14B: 57.4B (a shared expert per layer).
  for (const auto& [name, want] : std::vector<std::pair<std::string, double>>{
           {"qwen1.5-moe-a2.7b", 14.316}, {"qwen2-57b-a14b", 57.409}}) {
    absl::StatusOr<ModelConfig> c = RandomModelPresetConfig(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_TRUE(ValidateModelConfig(*c, name).ok()) << name;
    EXPECT_GT(c->shared_expert_intermediate_size, 0) << name;
    size_t params = 0;
    for (const auto& s : ModelTensorSpecs(*c, DType::kBF16)) params += s.nbytes() / 2;
    EXPECT_NEAR(params / 1e9, want, 0.001) << name;
  }
  for (const char* name : {"qwen3-tiny", "phi3-tiny", "phi4-tiny", "gemma3-tiny", "gemma2-tiny",
                           "mixtral-tiny", "qwen3-moe-tiny", "qwen2moe-tiny"}) {
    absl::StatusOr<ModelConfig> c = RandomModelPresetConfig(name);
    ASSERT_TRUE(c.ok()) << name;
    EXPECT_TRUE(ValidateModelConfig(*c, name).ok()) << name;
    EXPECT_THAT(RandomModelPresetNames(), HasSubstr(name));
  }

  absl::StatusOr<ModelConfig> bad = RandomModelPresetConfig("llama-70b");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("llama-70b"));
}

TEST(ModelWriterTest, EachPresetRoundTripsAtTestScale) {
  for (const char* preset : {"llama-1b", "llama-110m", "tiny"}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(std::string(preset) + " " + std::string(DTypeName(dtype)));
      ScratchDir dir(std::string(preset) + std::string(DTypeName(dtype)));
      RandomModelOptions o;
      o.config = Shrink(*RandomModelPresetConfig(preset));
      o.dtype = dtype;
      o.seed = 7;
      ASSERT_TRUE(WriteRandomModel(o, dir.path()).ok());
      std::unique_ptr<Model> m = Load(dir.path());
      ASSERT_NE(m, nullptr);

      ModelConfig want = *o.config;
      want.torch_dtype = dtype == DType::kBF16 ? "bfloat16" : "float32";
      EXPECT_EQ(m->config(), want);
      EXPECT_EQ(m->weight_dtype(), dtype);  // auto: the checkpoint's dtype
      EXPECT_EQ(m->owned_bytes(), dtype == DType::kF32 ? 0u : 64u * 4 * 2 * 2 + 64 * 4);

      absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
          SafetensorsFile::Open(dir.file("model.safetensors"));
      ASSERT_TRUE(f.ok()) << f.status();
      EXPECT_EQ((*f)->header().entries.size(), Named(*m).size());
      for (const auto& [name, t] : Named(*m)) {
        const SafetensorsEntry* e = (*f)->Find(name);
        ASSERT_NE(e, nullptr) << name;
        EXPECT_EQ(e->shape, t->shape) << name;
        const bool is_norm = name.find("norm") != std::string::npos;
        if (!is_norm || dtype == DType::kF32) {
          ASSERT_EQ(e->nbytes(), t->nbytes()) << name;
          EXPECT_EQ(std::memcmp(e->data, t->data, e->nbytes()), 0) << name;
        }
        if (is_norm) {
          for (int64_t i = 0; i < t->numel(); ++i) ASSERT_EQ(ValueAt(*t, i), 1.0f) << name;
        }
      }
      EXPECT_EQ(m->weights().lm_head.data == m->weights().embed_tokens.data,
                o.config->tie_word_embeddings);

      // Initialisation statistics: mean ~0, std ~0.02.
      const Tensor& g = m->weights().layers[1].gate_proj;
      double sum = 0, sq = 0;
      for (int64_t i = 0; i < g.numel(); ++i) {
        sum += ValueAt(g, i);
        sq += ValueAt(g, i) * ValueAt(g, i);
      }
      const double mean = sum / g.numel();
      EXPECT_NEAR(mean, 0.0, 0.002);
      EXPECT_NEAR(std::sqrt(sq / g.numel() - mean * mean), 0.02, 0.001);
    }
  }
}

TEST(ModelWriterTest, FullTinyPresetWithTokenizer) {
  ScratchDir dir("tiny");
  RandomModelOptions o;
  o.tokenizer_dir = testing_util::SourcePath("models/stories260k");
  ASSERT_TRUE(WriteRandomModel(o, dir.path()).ok());
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json",
                        "tokenizer_config.json", "special_tokens_map.json", "model.safetensors"}) {
    EXPECT_TRUE(std::filesystem::exists(dir.file(f))) << f;
  }
  EXPECT_EQ(ReadFile(dir.file("tokenizer.json")),
            ReadFile(testing_util::SourcePath("models/stories260k/tokenizer.json")));
  std::unique_ptr<Model> m = Load(dir.path());
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->config().vocab_size, 32000);
  EXPECT_EQ(m->config().num_layers, 2);
  EXPECT_EQ(m->weight_dtype(), DType::kBF16);

  o.tokenizer_dir = dir.file("no-such-dir");
  absl::Status s = WriteRandomModel(o, dir.path());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tokenizer.json"));
}

TEST(ModelWriterTest, DeterministicAcrossRunsAndThreadCounts) {
  ScratchDir a("a"), b("b"), c("c");
  RandomModelOptions o;
  o.vocab_size = 512;
  o.seed = 42;
  o.num_threads = 1;
  ASSERT_TRUE(WriteRandomModel(o, a.path()).ok());
  o.num_threads = 3;
  ASSERT_TRUE(WriteRandomModel(o, b.path()).ok());
  o.seed = 43;
  ASSERT_TRUE(WriteRandomModel(o, c.path()).ok());
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"}) {
    EXPECT_EQ(ReadFile(a.file(f)), ReadFile(b.file(f))) << f;
  }
  EXPECT_NE(ReadFile(a.file("model.safetensors")), ReadFile(c.file("model.safetensors")));
  std::unique_ptr<Model> ma = Load(a.path());
  std::unique_ptr<Model> mc = Load(c.path());
  ASSERT_TRUE(ma && mc);
  EXPECT_NE(ma->model_id(), mc->model_id());  // same shapes, different weights
}

TEST(ModelWriterTest, ShardedOutputLoadsToTheSameBytes) {
  ScratchDir single("single"), sharded("sharded");
  RandomModelOptions o;
  o.config = Shrink(*RandomModelPresetConfig("llama-1b"));  // untied: lm_head in the last shard
  o.dtype = DType::kF32;
  o.seed = 3;
  ASSERT_TRUE(WriteRandomModel(o, single.path()).ok());
  o.max_shard_bytes = 100000;
  ASSERT_TRUE(WriteRandomModel(o, sharded.path()).ok());

  EXPECT_FALSE(std::filesystem::exists(sharded.file("model.safetensors")));
  nlohmann::json index =
      nlohmann::json::parse(ReadFile(sharded.file("model.safetensors.index.json")));
  std::set<std::string> shards;
  for (auto& [name, shard] : index["weight_map"].items()) shards.insert(shard.get<std::string>());
  ASSERT_GE(shards.size(), 3u);
  EXPECT_TRUE(shards.count("model-00001-of-0000" + std::to_string(shards.size()) + ".safetensors"));
  for (const std::string& s : shards) {
    // At most 100000 bytes of data, unless one tensor (the 131072-byte embedding) is larger.
    EXPECT_LE(std::filesystem::file_size(sharded.file(s)), 131072u + 4096) << s;
  }

  std::unique_ptr<Model> a = Load(single.path());
  LoadOptions progress;
  progress.show_progress = true;
  std::unique_ptr<Model> b = Load(sharded.path(), progress);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->config(), b->config());
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>() + 0,
            std::filesystem::file_size(single.file("model.safetensors")) -
                testing_util::HeaderLength(ReadFile(single.file("model.safetensors"))) - 8);
  auto na = Named(*a), nb = Named(*b);
  ASSERT_EQ(na.size(), nb.size());
  for (size_t i = 0; i < na.size(); ++i) {
    ASSERT_EQ(na[i].first, nb[i].first);
    ASSERT_EQ(na[i].second->nbytes(), nb[i].second->nbytes());
    EXPECT_EQ(std::memcmp(na[i].second->data, nb[i].second->data, na[i].second->nbytes()), 0)
        << na[i].first;
  }

  // Rewriting the directory unsharded removes the shards, so nothing stale is left to load.
  o.max_shard_bytes = 0;
  ASSERT_TRUE(WriteRandomModel(o, sharded.path()).ok());
  EXPECT_FALSE(std::filesystem::exists(sharded.file("model.safetensors.index.json")));
  for (const std::string& s : shards) EXPECT_FALSE(std::filesystem::exists(sharded.file(s)));
}

TEST(ModelWriterTest, Bf16CheckpointLoadsAsF32Exactly) {
  ScratchDir dir("bf16");
  RandomModelOptions o;
  o.vocab_size = 512;
  ASSERT_TRUE(WriteRandomModel(o, dir.path()).ok());
  std::unique_ptr<Model> b = Load(dir.path());
  LoadOptions f32;
  f32.weight_dtype_auto = false;
  f32.weight_dtype = DType::kF32;
  std::unique_ptr<Model> f = Load(dir.path(), f32);
  ASSERT_TRUE(b && f);
  EXPECT_NE(b->model_id(), f->model_id());
  const Tensor& tb = b->weights().layers[0].q_proj;
  const Tensor& tf = f->weights().layers[0].q_proj;
  ASSERT_EQ(tf.dtype, DType::kF32);
  for (int64_t i = 0; i < tb.numel(); ++i) {
    ASSERT_EQ(tf.as<float>()[i], Bf16ToFloat(tb.as<uint16_t>()[i])) << i;
  }
}

TEST(ModelWriterTest, F16CheckpointConvertsExactlyToF32AndAutoPicksBf16) {
  ScratchDir src("src"), dst("dst");
  RandomModelOptions o;
  o.vocab_size = 512;
  o.dtype = DType::kF32;
  ASSERT_TRUE(WriteRandomModel(o, src.path()).ok());
  std::unique_ptr<Model> m = Load(src.path());
  ASSERT_NE(m, nullptr);

  std::vector<std::vector<uint16_t>> storage;
  std::vector<NamedTensor> tensors;
  for (const auto& [name, t] : Named(*m)) {
    std::vector<uint16_t> h(t->numel());
    for (int64_t i = 0; i < t->numel(); ++i) h[i] = FloatToFp16(t->as<float>()[i]);
    storage.push_back(std::move(h));
    tensors.push_back({name, Tensor{DType::kF16, t->shape, storage.back().data()}});
  }
  ASSERT_TRUE(WriteSafetensors(dst.file("model.safetensors"), tensors).ok());
  testing_util::WriteFile(dst.file("config.json"), ReadFile(src.file("config.json")));

  LoadOptions f32;
  f32.weight_dtype_auto = false;
  f32.weight_dtype = DType::kF32;
  std::unique_ptr<Model> a = Load(dst.path(), f32);
  std::unique_ptr<Model> b = Load(dst.path());
  ASSERT_TRUE(a && b);
  EXPECT_EQ(b->weight_dtype(), DType::kBF16);
  for (size_t k = 0; k < tensors.size(); ++k) {
    const std::string& name = tensors[k].name;
    const Tensor* ta = Find(*a, name);
    const Tensor* tb = Find(*b, name);
    ASSERT_TRUE(ta && tb) << name;
    EXPECT_EQ(ta->dtype, DType::kF32);
    for (int64_t i = 0; i < ta->numel(); ++i) {
      const float exact = Fp16ToFloat(storage[k][i]);
      ASSERT_EQ(ta->as<float>()[i], exact) << name << " " << i;
      if (tb->dtype == DType::kBF16) {
        ASSERT_EQ(tb->as<uint16_t>()[i], FloatToBf16(exact)) << name;
      }
    }
  }
}

}  // namespace
}  // namespace tandem
