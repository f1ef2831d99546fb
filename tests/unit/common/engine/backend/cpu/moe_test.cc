// MoeMlp: a token's output does not depend on the tokens that share its step. A lone token (and
// a step whose tokens all chose the same experts) takes the pass that runs every chosen expert's
// gate/up in one call; a mixed step runs one pass per expert over gathered rows. Both must give
// each token the same bits, for every weight format and MatMul input.

#include "common/engine/backend/cpu/moe.h"

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/base/thread_pool.h"
#include "common/engine/model/model.h"
#include "common/engine/model/model_writer.h"
#include "gtest/gtest.h"
#include "tests/unit/common/engine/model/test_util.h"

namespace tandem {
namespace {

struct Case {
  const char* preset;
  WeightQuant quant;
  DType input;
};

std::vector<float> RunMoe(MoeMlp& moe, const Model& m, const std::vector<float>& h, int64_t t,
                          DType input, ThreadPool* pool) {
  const ModelConfig& c = m.config();
  std::vector<float> out(static_cast<size_t>(t * c.hidden_size));
  moe.Run(c, m.weights().layers[0], h.data(), t, input, out.data(), pool);
  return out;
}

TEST(MoeTest, EachTokenGetsTheSameBitsAloneAndInAnyStep) {
  const Case cases[] = {{"mixtral-tiny", WeightQuant::kNone, DType::kF32},
                        {"qwen3-moe-tiny", WeightQuant::kNone, DType::kF32},
                        {"mixtral-tiny", WeightQuant::kInt8, DType::kI8},
                        {"qwen3-moe-tiny", WeightQuant::kInt4, DType::kI8},
                        {"mixtral-tiny", WeightQuant::kInt8, DType::kF32},
                        {"mixtral-tiny", WeightQuant::kInt4, DType::kBF16},
                        {"qwen2moe-tiny", WeightQuant::kNone, DType::kF32},
                        {"qwen2moe-tiny", WeightQuant::kInt8, DType::kI8},
                        {"qwen2moe-tiny", WeightQuant::kInt4, DType::kBF16}};
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(k.preset) + " quant " + std::to_string(static_cast<int>(k.quant)) +
                 " input " + std::to_string(static_cast<int>(k.input)));
    testing_util::ScratchDir dir(k.preset);
    RandomModelOptions o;
    o.preset = k.preset;
    o.vocab_size = 300;
    o.num_layers = 1;
    o.dtype = DType::kF32;
    o.init_std = 0.08;
    ASSERT_TRUE(WriteRandomModel(o, dir.path()).ok());
    LoadOptions load;
    load.weight_dtype_auto = false;
    load.weight_dtype = DType::kF32;
    load.quantization = k.quant;
    load.quant_group_size = 32;
    load.quant_layout = k.input == DType::kI8 ? WeightLayout::kTiles16 : WeightLayout::kRows;
    auto m = LoadModel(dir.path(), load);
    ASSERT_TRUE(m.ok()) << m.status();
    const ModelConfig& c = (*m)->config();
    const int64_t d = c.hidden_size, t = 7;
    // Rows 0..t-1 random (so the tokens choose different experts), then the same row t times.
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> mixed(static_cast<size_t>(t * d)), same(static_cast<size_t>(t * d));
    for (float& v : mixed) v = normal(rng);
    for (int64_t i = 0; i < t; ++i) {
      std::memcpy(same.data() + i * d, mixed.data() + 2 * d, static_cast<size_t>(d) * 4);
    }
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      MoeMlp moe;
      const std::vector<float> batch = RunMoe(moe, **m, mixed, t, k.input, &pool);
      const std::vector<float> batch_same = RunMoe(moe, **m, same, t, k.input, &pool);
      for (int64_t i = 0; i < t; ++i) {
        const std::vector<float> row(mixed.begin() + i * d, mixed.begin() + (i + 1) * d);
        const std::vector<float> alone = RunMoe(moe, **m, row, 1, k.input, &pool);
        EXPECT_EQ(std::memcmp(alone.data(), batch.data() + i * d, static_cast<size_t>(d) * 4), 0)
            << "token " << i << ", " << threads << " thread(s)";
        if (i == 2) {
          for (int64_t r = 0; r < t; ++r) {
            EXPECT_EQ(
                std::memcmp(alone.data(), batch_same.data() + r * d, static_cast<size_t>(d) * 4), 0)
                << "row " << r << " of a step whose tokens chose the same experts";
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem
