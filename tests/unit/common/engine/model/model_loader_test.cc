#include <cmath>
#include <cstring>
#include <set>

#include "common/base/half.h"
#include "common/engine/model/model.h"
#include "common/engine/model/model_writer.h"
#include "common/engine/model/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/engine/model/test_util.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::SourcePath;

LoadOptions WithDType(DType dtype) {
  LoadOptions o;
  o.weight_dtype_auto = false;
  o.weight_dtype = dtype;
  return o;
}

void ExpectShapes(const Model& m, int64_t ffn) {
  const ModelWeights& w = m.weights();
  EXPECT_THAT(w.embed_tokens.shape, ElementsAre(512, 64));
  ASSERT_EQ(w.layers.size(), 5u);
  for (const LayerWeights& l : w.layers) {
    EXPECT_THAT(l.input_norm.shape, ElementsAre(64));
    EXPECT_THAT(l.q_proj.shape, ElementsAre(64, 64));
    EXPECT_THAT(l.k_proj.shape, ElementsAre(32, 64));
    EXPECT_THAT(l.v_proj.shape, ElementsAre(32, 64));
    EXPECT_THAT(l.o_proj.shape, ElementsAre(64, 64));
    EXPECT_THAT(l.post_norm.shape, ElementsAre(64));
    EXPECT_THAT(l.gate_proj.shape, ElementsAre(ffn, 64));
    EXPECT_THAT(l.up_proj.shape, ElementsAre(ffn, 64));
    EXPECT_THAT(l.down_proj.shape, ElementsAre(64, ffn));
    EXPECT_TRUE(l.q_bias.empty());
    EXPECT_EQ(l.input_norm.dtype, DType::kF32);
    EXPECT_EQ(l.post_norm.dtype, DType::kF32);
    EXPECT_EQ(l.q_proj.dtype, m.weight_dtype());
    EXPECT_EQ(l.down_proj.dtype, m.weight_dtype());
  }
  EXPECT_THAT(w.final_norm.shape, ElementsAre(64));
  // Tied: lm_head is the embedding table itself.
  EXPECT_EQ(w.lm_head.data, w.embed_tokens.data);
  EXPECT_EQ(w.lm_head.shape, w.embed_tokens.shape);
  EXPECT_EQ(w.lm_head.dtype, w.embed_tokens.dtype);
}

TEST(ModelLoaderTest, Stories260kF32IsMappedNotCopied) {
  absl::StatusOr<std::unique_ptr<Model>> m =
      LoadModel(SourcePath("models/stories260k"), LoadOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->weight_dtype(), DType::kF32);
  EXPECT_EQ((*m)->config().num_layers, 5);
  EXPECT_EQ((*m)->config().bos_token_id, 1);
  EXPECT_THAT((*m)->config().eos_token_ids, ElementsAre(2));
  EXPECT_EQ((*m)->dir(), SourcePath("models/stories260k"));
  ExpectShapes(**m, 172);
  EXPECT_EQ((*m)->owned_bytes(), 0u);

  // The bytes are the file's bytes.
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
      SafetensorsFile::Open(SourcePath("models/stories260k/model.safetensors"));
  ASSERT_TRUE(f.ok());
  const SafetensorsEntry* e = (*f)->Find("model.layers.3.mlp.down_proj.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(std::memcmp((*m)->weights().layers[3].down_proj.data, e->data, e->nbytes()), 0);
}

TEST(ModelLoaderTest, UnmappedWeightsAreCopiesOfTheFile) {
  LoadOptions o;
  o.map_weights = false;
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModel(SourcePath("models/stories260k"), o);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
      SafetensorsFile::Open(SourcePath("models/stories260k/model.safetensors"));
  ASSERT_TRUE(f.ok());
  size_t file_bytes = 0;
  for (const char* name : {"model.layers.3.mlp.down_proj.weight", "model.embed_tokens.weight",
                           "model.layers.0.input_layernorm.weight"}) {
    const SafetensorsEntry* e = (*f)->Find(name);
    ASSERT_NE(e, nullptr);
    file_bytes += e->nbytes();
  }
  const ModelWeights& w = (*m)->weights();
  const Tensor* tensors[] = {&w.layers[3].down_proj, &w.embed_tokens, &w.layers[0].input_norm};
  const char* names[] = {"model.layers.3.mlp.down_proj.weight", "model.embed_tokens.weight",
                         "model.layers.0.input_layernorm.weight"};
  for (int i = 0; i < 3; ++i) {
    const SafetensorsEntry* e = (*f)->Find(names[i]);
    const char* file_begin = reinterpret_cast<const char*>(e->data);
    const char* data = static_cast<const char*>(tensors[i]->data);
    EXPECT_EQ(std::memcmp(data, e->data, e->nbytes()), 0) << names[i];
    EXPECT_EQ(reinterpret_cast<uintptr_t>(data) % 64, 0u) << names[i];
    EXPECT_NE(data, file_begin) << names[i] << " is still the mapping";
  }
  // Everything is owned now: at least the three tensors above.
  EXPECT_GE((*m)->owned_bytes(), file_bytes);
}

TEST(ModelLoaderTest, Llama2xsF32AndBf16Conversion) {
  const std::string dir = SourcePath("models/llama2xs-280k");
  absl::StatusOr<std::unique_ptr<Model>> f32 = LoadModel(dir, WithDType(DType::kF32));
  ASSERT_TRUE(f32.ok()) << f32.status();
  ExpectShapes(**f32, 192);
  EXPECT_EQ((*f32)->config().max_position_embeddings, 256);

  LoadOptions bf16_options = WithDType(DType::kBF16);
  bf16_options.show_progress = true;
  bf16_options.num_threads = 2;
  absl::StatusOr<std::unique_ptr<Model>> bf16 = LoadModel(dir, bf16_options);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ((*bf16)->weight_dtype(), DType::kBF16);
  ExpectShapes(**bf16, 192);
  EXPECT_GT((*bf16)->owned_bytes(), 0u);

  // Every converted value is f32 rounded to nearest even; norms stay f32 and identical.
  auto check = [](const Tensor& a, const Tensor& b) {
    ASSERT_EQ(a.numel(), b.numel());
    for (int64_t i = 0; i < a.numel(); ++i) {
      ASSERT_EQ(b.as<uint16_t>()[i], FloatToBf16(a.as<float>()[i])) << i;
    }
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data) % 64, 0u);
  };
  const ModelWeights& a = (*f32)->weights();
  const ModelWeights& b = (*bf16)->weights();
  check(a.embed_tokens, b.embed_tokens);
  for (size_t i = 0; i < a.layers.size(); ++i) {
    check(a.layers[i].q_proj, b.layers[i].q_proj);
    check(a.layers[i].gate_proj, b.layers[i].gate_proj);
    check(a.layers[i].down_proj, b.layers[i].down_proj);
    EXPECT_EQ(std::memcmp(a.layers[i].input_norm.data, b.layers[i].input_norm.data, 64 * 4), 0);
  }
  EXPECT_EQ(std::memcmp(a.final_norm.data, b.final_norm.data, 64 * 4), 0);
}

TEST(ModelLoaderTest, ModelIdIsStableAndDistinguishesModelsAndDtypes) {
  absl::StatusOr<std::unique_ptr<Model>> a1 =
      LoadModel(SourcePath("models/stories260k"), LoadOptions());
  absl::StatusOr<std::unique_ptr<Model>> a2 =
      LoadModel(SourcePath("models/stories260k"), LoadOptions());
  absl::StatusOr<std::unique_ptr<Model>> a_bf16 =
      LoadModel(SourcePath("models/stories260k"), WithDType(DType::kBF16));
  absl::StatusOr<std::unique_ptr<Model>> b =
      LoadModel(SourcePath("models/llama2xs-280k"), LoadOptions());
  ASSERT_TRUE(a1.ok() && a2.ok() && a_bf16.ok() && b.ok());
  EXPECT_EQ((*a1)->model_id(), (*a2)->model_id());
  EXPECT_NE((*a1)->model_id(), (*a_bf16)->model_id());
  EXPECT_NE((*a1)->model_id(), (*b)->model_id());
  EXPECT_THAT((*a1)->model_id(), HasSubstr("llama-L5-H64-F172-A8x8-KV4-V512-f32-"));
  EXPECT_THAT((*a_bf16)->model_id(), HasSubstr("-bf16-"));
}

TEST(ModelLoaderTest, RejectsUnsupportedInMemoryDtype) {
  absl::StatusOr<std::unique_ptr<Model>> m =
      LoadModel(SourcePath("models/stories260k"), WithDType(DType::kI8));
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("f32 or bf16"));
}

// LoadOptions::bf16_layout kTiles16: every projection and lm_head (its own tiled copy when tied)
// holds the rows' bf16 elements at quant.h's positions, +0 in the padding; the embedding table
// stays rows; f32 weights stay rows whatever the option says.
TEST(ModelLoaderTest, Bf16TilesHoldTheRowsElements) {
  for (const bool tied : {true, false}) {
    for (const DType stored : {DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(std::string(tied ? "tied " : "untied ") + std::string(DTypeName(stored)));
      testing_util::ScratchDir dir(std::string(tied ? "tied" : "untied") +
                                   std::string(DTypeName(stored)));
      RandomModelOptions o;
      ModelConfig c = *RandomModelPresetConfig("tiny");
      c.vocab_size = 200;         // 12.5 tiles
      c.intermediate_size = 100;  // 6.25 tiles
      c.tie_word_embeddings = tied;
      o.config = c;
      o.dtype = stored;
      o.seed = 3;
      ASSERT_TRUE(WriteRandomModel(o, dir.path()).ok());
      LoadOptions lo = WithDType(DType::kBF16);
      auto rows = LoadModel(dir.path(), lo);
      lo.bf16_layout = WeightLayout::kTiles16;
      auto tiles = LoadModel(dir.path(), lo);
      ASSERT_TRUE(rows.ok() && tiles.ok());
      EXPECT_EQ((*rows)->bf16_layout(), WeightLayout::kRows);
      EXPECT_EQ((*tiles)->bf16_layout(), WeightLayout::kTiles16);
      const ModelWeights& r = (*rows)->weights();
      const ModelWeights& t = (*tiles)->weights();
      EXPECT_EQ(t.embed_tokens.layout, WeightLayout::kRows);
      EXPECT_EQ(0, std::memcmp(t.embed_tokens.data, r.embed_tokens.data, r.embed_tokens.nbytes()));
      std::vector<std::pair<const Tensor*, const Tensor*>> pairs = {{&r.lm_head, &t.lm_head}};
      for (size_t i = 0; i < r.layers.size(); ++i) {
        const LayerWeights &a = r.layers[i], &b = t.layers[i];
        for (auto m : {&LayerWeights::q_proj, &LayerWeights::k_proj, &LayerWeights::v_proj,
                       &LayerWeights::o_proj, &LayerWeights::gate_proj, &LayerWeights::up_proj,
                       &LayerWeights::down_proj}) {
          pairs.push_back({&(a.*m), &(b.*m)});
        }
      }
      for (const auto& [want, got] : pairs) {
        ASSERT_EQ(got->layout, WeightLayout::kTiles16);
        ASSERT_EQ(got->dtype, DType::kBF16);
        ASSERT_EQ(got->shape, want->shape);
        const int64_t N = want->rows(), K = want->cols(), padded = (N + 15) / 16 * 16;
        ASSERT_EQ(got->stored_bytes(), static_cast<size_t>(padded / 16 * Bf16TileBytes(K)));
        const auto* w = want->as<uint16_t>();
        const auto* g = got->as<uint16_t>();
        for (int64_t n = 0; n < padded; ++n) {
          for (int64_t k = 0; k < K; ++k) {
            ASSERT_EQ(g[Bf16TileIndex(K, n, k)], n < N ? w[n * K + k] : 0)
                << "N=" << N << " K=" << K << " n=" << n << " k=" << k;
          }
        }
      }
      // f32 weights: nothing to tile.
      LoadOptions f32 = WithDType(DType::kF32);
      f32.bf16_layout = WeightLayout::kTiles16;
      auto dense = LoadModel(dir.path(), f32);
      ASSERT_TRUE(dense.ok());
      EXPECT_EQ((*dense)->bf16_layout(), WeightLayout::kRows);
      EXPECT_EQ((*dense)->weights().layers[0].q_proj.layout, WeightLayout::kRows);
    }
  }
}

TEST(ModelLoaderTest, MissingDirectory) {
  absl::StatusOr<std::unique_ptr<Model>> m = LoadModel("/nonexistent/model", LoadOptions());
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), HasSubstr("/nonexistent/model/config.json"));
}

}  // namespace
}  // namespace tandem
