// Qwen2, Qwen3, Phi-3, Gemma 3, Mistral and llama3-rope models written by the random-model writer
// and loaded back.

#include <cstring>

#include "common/engine/model/model.h"
#include "common/engine/model/model_writer.h"
#include "common/engine/model/rope.h"
#include "common/engine/model/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/engine/model/test_util.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using testing_util::ScratchDir;

ModelConfig Small(Architecture arch) {
  ModelConfig c;
  c.architecture = arch;
  c.hidden_size = 48;
  c.intermediate_size = 80;
  c.num_layers = 2;
  c.num_heads = 6;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 300;
  c.max_position_embeddings = 1024;
  c.rms_norm_eps = 1e-6;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

absl::StatusOr<std::unique_ptr<Model>> WriteAndLoad(const ModelConfig& config,
                                                    const ScratchDir& dir,
                                                    DType dtype = DType::kF32) {
  RandomModelOptions o;
  o.config = config;
  o.dtype = dtype;
  absl::Status s = WriteRandomModel(o, dir.path());
  if (!s.ok()) return s;
  return LoadModel(dir.path(), LoadOptions());
}

TEST(ArchitecturesTest, Qwen2LoadsQkvBiases) {
  ScratchDir dir("qwen2");
  ModelConfig c = Small(Architecture::kQwen2);
  c.tie_word_embeddings = true;
  c.rope_theta = 1000000.0;
  c.bos_token_id = -1;
  absl::StatusOr<std::unique_ptr<Model>> m = WriteAndLoad(c, dir, DType::kBF16);
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& got = (*m)->config();
  EXPECT_EQ(got.architecture, Architecture::kQwen2);
  EXPECT_EQ(got.architecture_name, "Qwen2ForCausalLM");
  EXPECT_EQ(got.model_type, "qwen2");
  EXPECT_TRUE(got.attention_bias);
  EXPECT_EQ(got.rope_theta, 1000000.0);
  EXPECT_EQ(got.bos_token_id, -1);
  for (const LayerWeights& l : (*m)->weights().layers) {
    EXPECT_THAT(l.q_bias.shape, ElementsAre(48));
    EXPECT_THAT(l.k_bias.shape, ElementsAre(16));
    EXPECT_THAT(l.v_bias.shape, ElementsAre(16));
    EXPECT_EQ(l.q_bias.dtype, DType::kF32);
    EXPECT_EQ(l.v_bias.dtype, DType::kF32);
    ASSERT_FALSE(l.k_bias.empty());
    EXPECT_NE(l.k_bias.as<float>()[0], 0.0f);
    EXPECT_THAT(l.q_proj.shape, ElementsAre(48, 48));
    EXPECT_THAT(l.k_proj.shape, ElementsAre(16, 48));
    EXPECT_EQ(l.q_proj.dtype, DType::kBF16);
  }
  EXPECT_EQ((*m)->weights().lm_head.data, (*m)->weights().embed_tokens.data);
  EXPECT_THAT((*m)->model_id(), ::testing::StartsWith("qwen2-L2-H48-"));
}

TEST(ArchitecturesTest, MistralWithSlidingWindow) {
  ScratchDir dir("mistral");
  ModelConfig c = Small(Architecture::kMistral);
  c.sliding_window = 512;
  absl::StatusOr<std::unique_ptr<Model>> m = WriteAndLoad(c, dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config().architecture, Architecture::kMistral);
  EXPECT_EQ((*m)->config().model_type, "mistral");
  EXPECT_EQ((*m)->config().sliding_window, 512);
  EXPECT_FALSE((*m)->config().attention_bias);
  EXPECT_TRUE((*m)->weights().layers[0].q_bias.empty());
  EXPECT_NE((*m)->weights().lm_head.data, (*m)->weights().embed_tokens.data);
  EXPECT_THAT((*m)->weights().lm_head.shape, ElementsAre(300, 48));
}

TEST(ArchitecturesTest, Llama3RopeScalingSurvivesTheRoundTrip) {
  ScratchDir dir("llama3");
  ModelConfig c = Small(Architecture::kLlama);
  c.rope_theta = 500000.0;
  c.rope_scaling.type = RopeScaling::Type::kLlama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 64;
  c.eos_token_ids = {2, 5, 9};
  absl::StatusOr<std::unique_ptr<Model>> m = WriteAndLoad(c, dir);
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& got = (*m)->config();
  EXPECT_EQ(got.rope_scaling, c.rope_scaling);
  EXPECT_THAT(got.eos_token_ids, ElementsAre(2, 5, 9));
  EXPECT_EQ(RopeInverseFrequencies(got), RopeInverseFrequencies(c));
  // Scaling changed the low frequencies.
  ModelConfig unscaled = c;
  unscaled.rope_scaling = RopeScaling();
  EXPECT_NE(RopeInverseFrequencies(got).back(), RopeInverseFrequencies(unscaled).back());
  EXPECT_EQ(RopeCosSinTable(got, 1024).size(), 1024u * 8);
}

TEST(ArchitecturesTest, Qwen3LoadsPerHeadQkNorms) {
  ScratchDir dir("qwen3");
  ModelConfig c = Small(Architecture::kQwen3);
  c.head_dim = 16;  // q (96) wider than hidden (48)
  RandomModelOptions o;
  o.config = c;
  o.dtype = DType::kBF16;
  o.norm_std = 0.1;
  ASSERT_TRUE(WriteRandomModel(o, dir.path()).ok());
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir.path(), LoadOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config().architecture_name, "Qwen3ForCausalLM");
  EXPECT_TRUE((*m)->config().qk_norm);
  for (const LayerWeights& l : (*m)->weights().layers) {
    EXPECT_THAT(l.q_norm.shape, ElementsAre(16));
    EXPECT_THAT(l.k_norm.shape, ElementsAre(16));
    EXPECT_EQ(l.q_norm.dtype, DType::kF32);
    EXPECT_NE(l.k_norm.as<float>()[0], 1.0f) << "norm_std makes norms differ from 1";
    EXPECT_TRUE(l.q_bias.empty());
    EXPECT_THAT(l.q_proj.shape, ElementsAre(96, 48));
    EXPECT_THAT(l.o_proj.shape, ElementsAre(48, 96));
  }
  EXPECT_THAT((*m)->model_id(), ::testing::StartsWith("qwen3-L2-H48-F80-A6x16-KV2-"));
}

TEST(ArchitecturesTest, Qwen3WithoutItsQkNormsIsAnErrorNamingTheTensor) {
  ScratchDir dir("qwen3_missing");
  ModelConfig llama = Small(Architecture::kLlama);
  RandomModelOptions o;
  o.config = llama;
  ASSERT_TRUE(WriteRandomModel(o, dir.path()).ok());
  ModelConfig qwen3 = llama;  // the same tensors but for q_norm / k_norm
  qwen3.architecture = Architecture::kQwen3;
  qwen3.architecture_name = "Qwen3ForCausalLM";
  qwen3.model_type = "qwen3";
  qwen3.qk_norm = true;
  testing_util::WriteFile(dir.file("config.json"), ModelConfigToJson(qwen3));
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir.path(), LoadOptions());
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()),
              ::testing::HasSubstr("model.layers.0.self_attn.q_norm.weight"));
}

TEST(ArchitecturesTest, Phi3SplitsItsFusedProjectionsAtLoad) {
  ScratchDir dir("phi3");
  ModelConfig c = Small(Architecture::kPhi3);
  c.sliding_window = 64;
  RandomModelOptions o;
  o.config = c;
  o.dtype = DType::kF32;
  ASSERT_TRUE(WriteRandomModel(o, dir.path()).ok());
  for (bool map : {true, false}) {
    LoadOptions load;
    load.map_weights = map;
    absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir.path(), load);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->config().architecture_name, "Phi3ForCausalLM");
    EXPECT_EQ((*m)->config().sliding_window, 64);
    const LayerWeights& l = (*m)->weights().layers[1];
    EXPECT_THAT(l.q_proj.shape, ElementsAre(48, 48));
    EXPECT_THAT(l.k_proj.shape, ElementsAre(16, 48));
    EXPECT_THAT(l.v_proj.shape, ElementsAre(16, 48));
    EXPECT_THAT(l.gate_proj.shape, ElementsAre(80, 48));
    EXPECT_THAT(l.up_proj.shape, ElementsAre(80, 48));
    // Each piece holds its own rows of the stored fused matrix, whether mapped or copied.
    absl::StatusOr<std::unique_ptr<Model>> raw = LoadModel(dir.path(), LoadOptions());
    ASSERT_TRUE(raw.ok());
    const float* q = l.q_proj.as<float>();
    const float* k = l.k_proj.as<float>();
    const float* v = l.v_proj.as<float>();
    const float* gate = l.gate_proj.as<float>();
    const float* up = l.up_proj.as<float>();
    if (map) {
      EXPECT_EQ(k, q + 48 * 48);
      EXPECT_EQ(v, k + 16 * 48);
      EXPECT_EQ(up, gate + 80 * 48);
    } else {
      EXPECT_EQ(std::memcmp(k, raw.value()->weights().layers[1].k_proj.data, 16 * 48 * 4), 0);
    }
    EXPECT_NE(q[0], k[0]);
  }
  absl::StatusOr<std::unique_ptr<Model>> q8 = LoadModel(dir.path(), [] {
    LoadOptions l;
    l.quantization = WeightQuant::kInt8;
    return l;
  }());
  ASSERT_TRUE(q8.ok()) << q8.status();
  EXPECT_EQ(q8.value()->weights().layers[0].v_proj.quant, WeightQuant::kInt8);
  EXPECT_THAT(q8.value()->weights().layers[0].v_proj.shape, ElementsAre(16, 48));
}

TEST(ArchitecturesTest, Phi3WithUnfusedOrMisshapenWeightsIsAnErrorNamingTheTensor) {
  ScratchDir dir("phi3_bad");
  ModelConfig llama = Small(Architecture::kLlama);
  RandomModelOptions o;
  o.config = llama;
  ASSERT_TRUE(WriteRandomModel(o, dir.path()).ok());
  ModelConfig phi3 = llama;  // Llama's separate q/k/v tensors under a Phi-3 config
  phi3.architecture = Architecture::kPhi3;
  phi3.architecture_name = "Phi3ForCausalLM";
  phi3.model_type = "phi3";
  testing_util::WriteFile(dir.file("config.json"), ModelConfigToJson(phi3));
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir.path(), LoadOptions());
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()),
              ::testing::HasSubstr("model.layers.0.self_attn.qkv_proj.weight"));
  // A Phi-3 checkpoint whose config claims more KV heads than its fused qkv_proj holds.
  ScratchDir dir2("phi3_shape");
  ModelConfig small = Small(Architecture::kPhi3);
  o.config = small;
  ASSERT_TRUE(WriteRandomModel(o, dir2.path()).ok());
  small.num_kv_heads = 3;
  testing_util::WriteFile(dir2.file("config.json"), ModelConfigToJson(small));
  m = LoadModel(dir2.path(), LoadOptions());
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()),
              ::testing::HasSubstr("qkv_proj.weight' has shape"));
}

TEST(ArchitecturesTest, Gemma3HoldsItsNormsAsOnePlusWeight) {
  ScratchDir dir("gemma3");
  RandomModelOptions o;
  o.preset = "gemma3-tiny";
  o.vocab_size = 300;
  o.dtype = DType::kF32;
  o.norm_std = 0.1;
  ASSERT_TRUE(WriteRandomModel(o, dir.path()).ok());
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir.path(), LoadOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.architecture_name, "Gemma3ForCausalLM");
  EXPECT_EQ(c.model_type, "gemma3_text");
  EXPECT_EQ(c.activation, Activation::kGeluTanh);
  EXPECT_THAT(c.sliding_layers, ElementsAre(1, 0, 1));
  EXPECT_EQ(c.query_pre_attn_scalar, 24);
  EXPECT_EQ(c.final_logit_softcapping, 30);
  // The file holds w (centred on 0); the model holds 1 + w for every norm.
  auto file = SafetensorsFile::Open(dir.file("model.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status();
  for (const auto& [name, tensor] : std::vector<std::pair<std::string, const Tensor*>>{
           {"model.layers.1.input_layernorm.weight", &(*m)->weights().layers[1].input_norm},
           {"model.layers.1.post_feedforward_layernorm.weight",
            &(*m)->weights().layers[1].post_ffw_norm},
           {"model.layers.0.pre_feedforward_layernorm.weight",
            &(*m)->weights().layers[0].pre_ffw_norm},
           {"model.layers.2.self_attn.k_norm.weight", &(*m)->weights().layers[2].k_norm},
           {"model.norm.weight", &(*m)->weights().final_norm}}) {
    const SafetensorsEntry* e = (*file)->Find(name);
    ASSERT_NE(e, nullptr) << name;
    const float stored = reinterpret_cast<const float*>(e->data)[3];
    EXPECT_NE(stored, 0.0f) << name;
    EXPECT_EQ(tensor->as<float>()[3], 1.0f + stored) << name;
  }
}

// Replaces `from` by `to` in the model directory's config.json (which must hold it).
void EditConfig(const ScratchDir& dir, const std::string& from, const std::string& to) {
  std::string text = testing_util::ReadFile(dir.file("config.json"));
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  testing_util::WriteFile(dir.file("config.json"), text);
}

std::string LoadError(const ScratchDir& dir) {
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir.path(), LoadOptions());
  return m.ok() ? "loaded" : std::string(m.status().message());
}

TEST(ArchitecturesTest, Gemma2LoadsItsSoftCapsAndAlternatingLayers) {
  ScratchDir dir("gemma2");
  RandomModelOptions o;
  o.preset = "gemma2-tiny";
  o.vocab_size = 300;
  o.dtype = DType::kF32;
  ASSERT_TRUE(WriteRandomModel(o, dir.path()).ok());
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir.path(), LoadOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.architecture, Architecture::kGemma2);
  EXPECT_EQ(c.model_type, "gemma2");
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.rope_local_theta, 0);
  EXPECT_THAT(c.sliding_layers, ElementsAre(1, 0, 1, 0));
  EXPECT_EQ(c.attn_logit_softcapping, 2);
  EXPECT_EQ(c.final_logit_softcapping, 30);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE((*m)->weights().layers[0].q_norm.empty());
  EXPECT_FALSE((*m)->weights().layers[3].post_ffw_norm.empty());

  // Without layer_types: every other layer slides, from layer 0 (Gemma2Config's default).
  const std::string types = R"("layer_types": [
    "sliding_attention",
    "full_attention",
    "sliding_attention",
    "full_attention"
  ],)";
  EditConfig(dir, types, "");
  m = LoadModel(dir.path(), LoadOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_THAT((*m)->config().sliding_layers, ElementsAre(1, 0, 1, 0));
  // Soft-capping absent: Gemma2Config's defaults (50 and 30); null: none.
  EditConfig(dir, R"("attn_logit_softcapping": 2.0,)", "");
  m = LoadModel(dir.path(), LoadOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config().attn_logit_softcapping, 50);
  EditConfig(dir, R"("final_logit_softcapping": 30.0)", R"("final_logit_softcapping": null)");
  m = LoadModel(dir.path(), LoadOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config().final_logit_softcapping, 0);
}

TEST(ArchitecturesTest, BadGemma2AndPhi4CheckpointsNameTheFieldOrTensor) {
  ScratchDir dir("gemma2_bad");
  RandomModelOptions o;
  o.preset = "gemma2-tiny";
  o.vocab_size = 300;
  o.dtype = DType::kF32;
  ASSERT_TRUE(WriteRandomModel(o, dir.path()).ok());
  const std::string good = testing_util::ReadFile(dir.file("config.json"));
  EditConfig(dir, R"("rope_scaling": null)",
             R"("rope_scaling": {"rope_type": "yarn", "factor": 4})");
  EXPECT_THAT(LoadError(dir), ::testing::HasSubstr("yarn"));
  testing_util::WriteFile(dir.file("config.json"), good);
  EditConfig(dir, R"("hidden_activation": "gelu_pytorch_tanh")", R"("hidden_activation": "relu")");
  EXPECT_THAT(LoadError(dir), ::testing::HasSubstr("hidden_activation 'relu'"));
  testing_util::WriteFile(dir.file("config.json"), good);
  EditConfig(dir, R"("sliding_window": 24,)",
             R"("sliding_window": 24, "rope_local_base_freq": 1e4,)");
  EXPECT_THAT(LoadError(dir), ::testing::HasSubstr("rope_local_base_freq"));
  testing_util::WriteFile(dir.file("config.json"), good);
  EditConfig(dir, R"("attn_logit_softcapping": 2.0)", R"("attn_logit_softcapping": -1.0)");
  EXPECT_THAT(LoadError(dir), ::testing::HasSubstr("attn_logit_softcapping"));
  // A Gemma 2 config over a checkpoint that lacks a norm, or one with a misshapen tensor.
  testing_util::WriteFile(dir.file("config.json"), good);
  EditConfig(dir, R"("num_hidden_layers": 4)", R"("num_hidden_layers": 5)");
  EditConfig(dir, R"("full_attention"
  ],)",
             R"("full_attention", "sliding_attention"
  ],)");
  EXPECT_THAT(LoadError(dir), ::testing::HasSubstr("model.layers.4."));
  testing_util::WriteFile(dir.file("config.json"), good);
  EditConfig(dir, R"("intermediate_size": 176)", R"("intermediate_size": 160)");
  EXPECT_THAT(LoadError(dir), ::testing::HasSubstr("mlp.gate_proj.weight' has shape"));

  ScratchDir phi("phi4_bad");
  o.preset = "phi4-tiny";
  ASSERT_TRUE(WriteRandomModel(o, phi.path()).ok());
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(phi.path(), LoadOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config().rotary_dim, 24);
  EXPECT_EQ((*m)->config().rope_dim(), 24);
  EXPECT_TRUE((*m)->config().tie_word_embeddings);
  const std::string phi_good = testing_util::ReadFile(phi.file("config.json"));
  EditConfig(phi, R"("partial_rotary_factor": 0.75)", R"("partial_rotary_factor": 0.7)");
  EXPECT_THAT(LoadError(phi), ::testing::HasSubstr("partial_rotary_factor 0.7"));
  testing_util::WriteFile(phi.file("config.json"), phi_good);
  EditConfig(phi, R"("partial_rotary_factor": 0.75)", R"("partial_rotary_factor": 0.5)");
  EXPECT_THAT(LoadError(phi),
              ::testing::HasSubstr("partial_rotary_factor / 2 = 8 entries, got 12"));
  testing_util::WriteFile(phi.file("config.json"), phi_good);
  EditConfig(phi, R"("type": "longrope")", R"("type": "dynamic")");
  EXPECT_THAT(LoadError(phi), ::testing::HasSubstr("dynamic"));
  // Partial rotary outside Phi-3: refused naming the field.
  ScratchDir llama("llama_partial");
  o.preset = "tiny";
  ASSERT_TRUE(WriteRandomModel(o, llama.path()).ok());
  EditConfig(llama, R"("rope_theta")", R"("partial_rotary_factor": 0.5, "rope_theta")");
  EXPECT_THAT(LoadError(llama), ::testing::HasSubstr("partial_rotary_factor 0.5"));
}

TEST(ArchitecturesTest, MixtureOfExpertsLoadsEveryExpertAndNamesAMissingOne) {
  for (const char* preset : {"mixtral-tiny", "qwen3-moe-tiny", "qwen2moe-tiny"}) {
    ScratchDir dir(preset);
    RandomModelOptions o;
    o.preset = preset;
    o.vocab_size = 300;
    o.dtype = DType::kBF16;
    ASSERT_TRUE(WriteRandomModel(o, dir.path()).ok());
    LoadOptions load;
    load.quantization = WeightQuant::kInt4;
    load.quant_group_size = 32;
    absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir.path(), load);
    ASSERT_TRUE(m.ok()) << m.status();
    const ModelConfig c = (*m)->config();  // a copy: m is reloaded below
    for (const LayerWeights& l : (*m)->weights().layers) {
      ASSERT_EQ(l.experts.size(), static_cast<size_t>(c.num_experts));
      EXPECT_THAT(l.router.shape, ElementsAre(c.num_experts, c.hidden_size));
      EXPECT_EQ(l.router.dtype, DType::kF32) << "the router is never quantized";
      EXPECT_EQ(l.router.quant, WeightQuant::kNone);
      EXPECT_EQ(l.experts.back().down_proj.quant, WeightQuant::kInt4);
      EXPECT_THAT(l.experts.back().gate_proj.shape, ElementsAre(c.expert_ffn(), c.hidden_size));
      EXPECT_TRUE(l.gate_proj.empty());
      if (c.architecture == Architecture::kQwen2Moe) {  // the shared expert and its f32 gate
        const int64_t sf = c.shared_expert_intermediate_size;
        EXPECT_THAT(l.shared_expert.gate_proj.shape, ElementsAre(sf, c.hidden_size));
        EXPECT_THAT(l.shared_expert.up_proj.shape, ElementsAre(sf, c.hidden_size));
        EXPECT_THAT(l.shared_expert.down_proj.shape, ElementsAre(c.hidden_size, sf));
        EXPECT_EQ(l.shared_expert.down_proj.quant, WeightQuant::kInt4);
        EXPECT_THAT(l.shared_expert_gate.shape, ElementsAre(1, c.hidden_size));
        EXPECT_EQ(l.shared_expert_gate.dtype, DType::kF32);
        EXPECT_EQ(l.shared_expert_gate.quant, WeightQuant::kNone);
        EXPECT_FALSE(l.q_bias.empty());  // Qwen2 attention
      } else {
        EXPECT_TRUE(l.shared_expert.gate_proj.empty());
        EXPECT_TRUE(l.shared_expert_gate.empty());
      }
    }
    // A config with more experts than the checkpoint holds: the first missing one is named.
    ModelConfig more = c;
    more.num_experts = c.num_experts + 1;
    testing_util::WriteFile(dir.file("config.json"), ModelConfigToJson(more));
    m = LoadModel(dir.path(), LoadOptions());
    ASSERT_FALSE(m.ok());
    EXPECT_THAT(std::string(m.status().message()), ::testing::HasSubstr("gate.weight' has shape"));
    more.num_experts = c.num_experts;
    more.moe_intermediate_size = c.architecture != Architecture::kMixtral ? 40 : 0;
    more.intermediate_size = c.architecture == Architecture::kMixtral ? 40 : c.intermediate_size;
    testing_util::WriteFile(dir.file("config.json"), ModelConfigToJson(more));
    m = LoadModel(dir.path(), LoadOptions());
    ASSERT_FALSE(m.ok());
    EXPECT_THAT(std::string(m.status().message()), ::testing::HasSubstr("experts.0."));
  }
}

// Rewrites dir's model.safetensors without the tensors whose name contains `drop`.
void DropTensors(const ScratchDir& dir, const std::string& drop) {
  const std::string path = dir.file("model.safetensors");
  std::vector<std::string> names;
  std::vector<NamedTensor> keep;
  std::vector<std::vector<uint8_t>> bytes;
  {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    for (const SafetensorsEntry& e : (*f)->header().entries) {
      if (e.name.find(drop) != std::string::npos) continue;
      bytes.emplace_back(e.data, e.data + e.nbytes());
      Tensor t;
      t.dtype = e.dtype;
      t.shape = e.shape;
      keep.push_back({e.name, t});
    }
  }
  for (size_t i = 0; i < keep.size(); ++i) keep[i].tensor.data = bytes[i].data();
  ASSERT_TRUE(WriteSafetensors(path, keep).ok());
}

TEST(ArchitecturesTest, Qwen2MoeCountsAndNamesItsSharedExpert) {
  ScratchDir dir("qwen2moe_shared");
  RandomModelOptions o;
  o.preset = "qwen2moe-tiny";
  o.vocab_size = 300;
  o.dtype = DType::kF32;
  ASSERT_TRUE(WriteRandomModel(o, dir.path()).ok());
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(dir.path(), LoadOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelConfig c = (*m)->config();
  // decode_weight_bytes: lm_head, one embedding row, and per layer the attention projections,
  // the router, num_experts_per_tok experts, the shared expert and its gate (all f32 here).
  const int64_t h = c.hidden_size, ef = c.expert_ffn(), sf = c.shared_expert_intermediate_size;
  const int64_t attention = h * c.num_heads * c.head_dim * 2 + 2 * h * c.num_kv_heads * c.head_dim;
  const int64_t per_layer =
      attention + c.num_experts * h + c.num_experts_per_tok * 3 * h * ef + 3 * h * sf + h;
  EXPECT_EQ((*m)->decode_weight_bytes(),
            static_cast<size_t>(4 * (c.vocab_size * h + h + c.num_layers * per_layer)));
  m->reset();

  // A shared expert of another ffn than the config's: the tensor and its shape are named.
  ModelConfig other = c;
  other.shared_expert_intermediate_size = sf + 8;
  testing_util::WriteFile(dir.file("config.json"), ModelConfigToJson(other));
  m = LoadModel(dir.path(), LoadOptions());
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()),
              ::testing::HasSubstr("mlp.shared_expert.gate_proj.weight' has shape"));
  testing_util::WriteFile(dir.file("config.json"), ModelConfigToJson(c));

  // Missing shared-expert tensors: each is named at load.
  for (const char* missing : {"shared_expert_gate.weight", "shared_expert.down_proj"}) {
    ScratchDir bare(std::string("qwen2moe_bare_") + missing);
    ASSERT_TRUE(WriteRandomModel(o, bare.path()).ok());
    DropTensors(bare, missing);
    m = LoadModel(bare.path(), LoadOptions());
    ASSERT_FALSE(m.ok()) << missing;
    EXPECT_THAT(std::string(m.status().message()), ::testing::HasSubstr(missing));
  }
}

}  // namespace
}  // namespace tandem
