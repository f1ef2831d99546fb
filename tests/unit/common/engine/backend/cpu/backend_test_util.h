#pragma once

// Helpers shared by the CPU backend tests: load a bundled model, read its reference logits,
// and drive a CpuBackend with simple per-sequence block allocation.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/engine/backend/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/util/test_paths.h"

namespace tandem::testing {

inline std::string ModelDir(const std::string& name) {
  return tandem::TestSourceDir() + "/models/" + name;
}

struct Reference {
  std::vector<int32_t> sequence;  // prompt + generated ids
  size_t prompt_len = 0;
  std::vector<float> logits;  // [sequence.size(), vocab]
};

inline Reference LoadReference(const std::string& model) {
  Reference ref;
  std::ifstream in(ModelDir(model) + "/reference/once_upon_a_time.json");
  nlohmann::json j = nlohmann::json::parse(in);
  for (int id : j["prompt_ids"]) ref.sequence.push_back(id);
  ref.prompt_len = ref.sequence.size();
  for (int id : j["generated_ids"]) ref.sequence.push_back(id);
  std::ifstream lf(ModelDir(model) + "/reference/once_upon_a_time.logits.f32", std::ios::binary);
  lf.seekg(0, std::ios::end);
  ref.logits.resize(static_cast<size_t>(lf.tellg()) / sizeof(float));
  lf.seekg(0);
  lf.read(reinterpret_cast<char*>(ref.logits.data()), ref.logits.size() * sizeof(float));
  return ref;
}

// `input`: the MatMul inputs the model's backend will take (int8 inputs take int4 weights in
// their own layout). `bf16_tiles`: dense bf16 matrices in WeightLayout::kTiles16 (for bf16
// inputs).
inline std::shared_ptr<const Model> Load(const std::string& model, DType weights,
                                         WeightQuant quant = WeightQuant::kNone,
                                         int64_t group_size = 128, DType input = DType::kF32,
                                         bool bf16_tiles = false) {
  LoadOptions options;
  options.quant_layout = input == DType::kI8 ? WeightLayout::kTiles16 : WeightLayout::kRows;
  options.bf16_layout = bf16_tiles ? WeightLayout::kTiles16 : WeightLayout::kRows;
  options.weight_dtype_auto = false;
  options.weight_dtype = weights;
  options.quantization = quant;
  options.quant_group_size = group_size;
  auto m = LoadModel(ModelDir(model), options);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::shared_ptr<const Model>(std::move(m).value());
}

// max |a - b| / max |b| over one row.
inline double RowRelativeError(const float* got, const float* want, int64_t n) {
  double max_diff = 0, max_ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[i])));
  }
  return max_diff / max_ref;
}

// A sequence being fed to the backend in chunks, with its own blocks.
struct TestSeq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
  int64_t computed = 0;
  std::vector<std::vector<float>> logits;  // logits after each computed position
};

// Allocates blocks sequentially from a counter (tests never free).
class BlockCounter {
 public:
  explicit BlockCounter(int64_t block_size) : block_size_(block_size) {}
  void Cover(TestSeq& s, int64_t positions) {
    while (static_cast<int64_t>(s.blocks.size()) * block_size_ < positions) {
      s.blocks.push_back(next_++);
    }
  }
  int32_t used() const { return next_; }

 private:
  int64_t block_size_;
  int32_t next_ = 0;
};

// Runs one step: each (seq, chunk) pair computes its next `chunk` tokens and records logits for
// every one of them.
inline void RunStep(CpuBackend& backend, BlockCounter& blocks,
                    const std::vector<std::pair<TestSeq*, int64_t>>& work) {
  ForwardBatch batch;
  const int64_t bs = backend.kv_spec().block_size;
  for (auto& [seq, chunk] : work) {
    blocks.Cover(*seq, seq->computed + chunk);
    std::vector<int32_t> toks(seq->tokens.begin() + seq->computed,
                              seq->tokens.begin() + seq->computed + chunk);
    const int32_t first = static_cast<int32_t>(batch.num_tokens());
    batch.AddSequence(toks, static_cast<int32_t>(seq->computed), seq->blocks, bs, false);
    for (int64_t i = 0; i < chunk; ++i) batch.logit_rows.push_back(first + i);
  }
  const int64_t vocab = backend.vocab_size();
  std::vector<float> logits(batch.logit_rows.size() * vocab);
  absl::Status st = backend.Forward(batch, logits.data());
  ASSERT_TRUE(st.ok()) << st;
  size_t row = 0;
  for (auto& [seq, chunk] : work) {
    for (int64_t i = 0; i < chunk; ++i, ++row) {
      seq->logits.emplace_back(logits.begin() + row * vocab, logits.begin() + (row + 1) * vocab);
    }
    seq->computed += chunk;
  }
}

inline std::vector<int32_t> RandomTokens(std::mt19937& rng, int64_t n, int32_t vocab) {
  std::uniform_int_distribution<int32_t> dist(3, vocab - 1);
  std::vector<int32_t> v(n);
  for (auto& t : v) t = dist(rng);
  return v;
}

// Feeds `seq` in chunks of `chunk` tokens until its prompt is done, then one token per step.
inline void RunAlone(CpuBackend& backend, BlockCounter& blocks, TestSeq& seq, int64_t prompt_len,
                     int64_t chunk) {
  while (seq.computed < prompt_len) {
    RunStep(backend, blocks, {{&seq, std::min(chunk, prompt_len - seq.computed)}});
  }
  while (seq.computed < static_cast<int64_t>(seq.tokens.size())) {
    RunStep(backend, blocks, {{&seq, 1}});
  }
}

// Batch invariance (DESIGN §4 "Determinism"): a sequence's logits are bit-identical alone, with
// its prompt chunked by 1, 5 and 16, and batched among seven others joining at different steps.
inline void ExpectBatchInvariant(const std::shared_ptr<const Model>& model,
                                 const CpuBackendOptions& options) {
  const int32_t vocab = static_cast<int32_t>(model->config().vocab_size);
  std::mt19937 rng(1234);

  // The sequence under test: a 37-token prompt and 20 continuation tokens.
  std::vector<int32_t> target = RandomTokens(rng, 57, vocab);
  const int64_t target_prompt = 37;

  auto alone_backend = CpuBackend::Create(model, options);
  ASSERT_TRUE(alone_backend.ok());
  BlockCounter alone_blocks(options.block_size);
  TestSeq alone;
  alone.tokens = target;
  RunAlone(**alone_backend, alone_blocks, alone, target_prompt, target_prompt);

  // Same sequence with prompt chunks of 1, 5 and 16 tokens, each alone: identical logits.
  for (int64_t chunk : {1, 5, 16}) {
    auto b = CpuBackend::Create(model, options);
    BlockCounter counter(options.block_size);
    TestSeq s;
    s.tokens = target;
    RunAlone(**b, counter, s, target_prompt, chunk);
    for (size_t i = 0; i < target.size(); ++i) {
      ASSERT_EQ(0, std::memcmp(s.logits[i].data(), alone.logits[i].data(), vocab * sizeof(float)))
          << "chunk " << chunk << " position " << i;
    }
  }

  // Batched: 7 other sequences of different lengths, joining at different steps, with
  // different chunk sizes; the target's prompt chunked by 7.
  auto batch_backend = CpuBackend::Create(model, options);
  ASSERT_TRUE(batch_backend.ok());
  BlockCounter counter(options.block_size);
  TestSeq t;
  t.tokens = target;
  std::vector<TestSeq> others(7);
  std::vector<int64_t> other_chunk = {3, 11, 64, 1, 9, 24, 2};
  for (size_t k = 0; k < others.size(); ++k) {
    others[k].tokens = RandomTokens(rng, 10 + 13 * static_cast<int64_t>(k), vocab);
  }
  int64_t step = 0;
  while (t.computed < static_cast<int64_t>(t.tokens.size())) {
    std::vector<std::pair<TestSeq*, int64_t>> work;
    for (size_t k = 0; k < others.size(); ++k) {
      TestSeq& o = others[k];
      const int64_t remaining = static_cast<int64_t>(o.tokens.size()) - o.computed;
      if (remaining <= 0 || step < static_cast<int64_t>(k)) continue;  // staggered joins
      work.push_back({&o, std::min(other_chunk[k], remaining)});
    }
    const int64_t chunk =
        t.computed < target_prompt ? std::min<int64_t>(7, target_prompt - t.computed) : 1;
    // Put the target in the middle of the batch.
    work.insert(work.begin() + work.size() / 2, {&t, chunk});
    RunStep(**batch_backend, counter, work);
    ++step;
  }
  for (size_t i = 0; i < target.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(t.logits[i].data(), alone.logits[i].data(), vocab * sizeof(float)))
        << "batched position " << i;
  }
}

}  // namespace tandem::testing
