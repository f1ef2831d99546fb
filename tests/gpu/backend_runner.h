#pragma once

// Drives any Backend step by step with simple block allocation, so the CUDA backend can be run
// on exactly the batches given to the CPU backend and their logits compared.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/engine/backend/backend.h"
#include "common/engine/backend/cpu/cpu_backend.h"
#include "common/engine/backend/cuda/cuda_backend_impl.h"
#include "gtest/gtest.h"

namespace tandem::gpu_testing {

// A sequence fed in chunks: its tokens, its blocks and the logits after every fed position.
struct Seq {
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
  int64_t computed = 0;
  std::vector<std::vector<float>> logits;  // one row per fed position whose logits were wanted
};

// Hands out block ids in a fixed shuffled order (tests never free), so that tables are not
// contiguous and both backends see identical ids.
class Blocks {
 public:
  Blocks(int64_t block_size, int64_t num_blocks, uint32_t seed = 7) : block_size_(block_size) {
    for (int32_t i = 0; i < num_blocks; ++i) free_.push_back(i);
    std::mt19937 rng(seed);
    std::shuffle(free_.begin(), free_.end(), rng);
  }
  void Cover(Seq& s, int64_t positions) {
    while (static_cast<int64_t>(s.blocks.size()) * block_size_ < positions) {
      ASSERT_FALSE(free_.empty()) << "test ran out of KV blocks";
      s.blocks.push_back(free_.back());
      free_.pop_back();
    }
  }

 private:
  int64_t block_size_;
  std::vector<int32_t> free_;
};

// Builds one step: each (seq, chunk) computes its next `chunk` tokens; logits are wanted for
// every token when all_logits, else for the last token of each chunk.
inline ForwardBatch MakeStep(int64_t block_size, Blocks& blocks,
                             const std::vector<std::pair<Seq*, int64_t>>& work, bool all_logits) {
  ForwardBatch batch;
  for (auto& [seq, chunk] : work) {
    blocks.Cover(*seq, seq->computed + chunk);
    std::vector<int32_t> toks(seq->tokens.begin() + seq->computed,
                              seq->tokens.begin() + seq->computed + chunk);
    const int32_t first = static_cast<int32_t>(batch.num_tokens());
    batch.AddSequence(toks, static_cast<int32_t>(seq->computed), seq->blocks, block_size,
                      !all_logits);
    if (all_logits) {
      for (int64_t i = 0; i < chunk; ++i) batch.logit_rows.push_back(first + i);
    }
  }
  return batch;
}

// Runs the step on `backend` and appends each wanted row's logits to its sequence.
inline void RunStep(Backend& backend, const ForwardBatch& batch,
                    const std::vector<std::pair<Seq*, int64_t>>& work, bool all_logits) {
  const int64_t vocab = backend.vocab_size();
  std::vector<float> logits(batch.logit_rows.size() * vocab);
  absl::Status st = backend.Forward(batch, logits.data());
  ASSERT_TRUE(st.ok()) << backend.name() << ": " << st;
  size_t row = 0;
  for (auto& [seq, chunk] : work) {
    const int64_t rows = all_logits ? chunk : 1;
    for (int64_t i = 0; i < rows; ++i, ++row) {
      seq->logits.emplace_back(logits.begin() + row * vocab, logits.begin() + (row + 1) * vocab);
    }
    seq->computed += chunk;
  }
}

// The random mixed batches the backend comparisons run: `num_seqs` sequences of 2 to `max_len`
// tokens (token 1, then ids 3..511), fed for `steps` steps in chunks of up to 40 tokens every
// third step and up to `small_chunk` otherwise, each sequence sitting a step out at random, all
// logits or the last chunk's at random; the same batches on `a` and `b`. Returns each
// sequence's pair of runs (a's, b's).
struct MixedBatchRuns {
  std::vector<Seq> a, b;
};
inline MixedBatchRuns RunMixedBatches(Backend& a, Backend& b, int64_t num_blocks, uint32_t seed,
                                      int num_seqs, int max_len, int steps, int small_chunk) {
  std::mt19937 rng(seed);
  MixedBatchRuns runs;
  runs.a.resize(num_seqs);
  runs.b.resize(num_seqs);
  for (int s = 0; s < num_seqs; ++s) {
    const int len = std::uniform_int_distribution<int>(2, max_len)(rng);
    std::vector<int32_t> tokens = {1};
    for (int i = 1; i < len; ++i) tokens.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
    runs.a[s].tokens = runs.b[s].tokens = tokens;
  }
  Blocks a_blocks(16, num_blocks), b_blocks(16, num_blocks);
  for (int step = 0; step < steps; ++step) {
    std::vector<std::pair<Seq*, int64_t>> a_work, b_work;
    for (int s = 0; s < num_seqs; ++s) {
      const int64_t left = static_cast<int64_t>(runs.a[s].tokens.size()) - runs.a[s].computed;
      if (left == 0 || rng() % 4 == 0) continue;
      const int64_t chunk = std::min<int64_t>(left, 1 + rng() % (step % 3 == 0 ? 40 : small_chunk));
      a_work.emplace_back(&runs.a[s], chunk);
      b_work.emplace_back(&runs.b[s], chunk);
    }
    if (a_work.empty()) continue;
    const bool all = rng() % 2 == 0;
    RunStep(a, MakeStep(16, a_blocks, a_work, all), a_work, all);
    RunStep(b, MakeStep(16, b_blocks, b_work, all), b_work, all);
    if (::testing::Test::HasFatalFailure()) break;
  }
  return runs;
}

inline int32_t Argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Greedy generation of `steps` tokens for every sequence together: prompts as one chunk each,
// then one decode token per sequence per step. Returns the generated ids per sequence.
inline std::vector<std::vector<int32_t>> Greedy(Backend& backend,
                                                const std::vector<std::vector<int32_t>>& prompts,
                                                int steps, std::vector<Seq>* seqs_out = nullptr) {
  const int64_t bs = backend.kv_spec().block_size;
  Blocks blocks(bs, backend.kv_spec().num_blocks);
  std::vector<Seq> seqs(prompts.size());
  std::vector<std::vector<int32_t>> out(prompts.size());
  std::vector<std::pair<Seq*, int64_t>> work;
  for (size_t i = 0; i < prompts.size(); ++i) {
    seqs[i].tokens = prompts[i];
    work.emplace_back(&seqs[i], static_cast<int64_t>(prompts[i].size()));
  }
  for (int step = 0; step <= steps; ++step) {
    ForwardBatch batch = MakeStep(bs, blocks, work, false);
    RunStep(backend, batch, work, false);
    if (::testing::Test::HasFatalFailure() || step == steps) break;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int32_t next = Argmax(seqs[i].logits.back());
      seqs[i].tokens.push_back(next);
      out[i].push_back(next);
      work[i].second = 1;
    }
  }
  if (seqs_out != nullptr) *seqs_out = std::move(seqs);
  return out;
}

// Teacher-forced comparison of two backends: both are fed the same sequences (prompt, then the
// tokens `reference` picks greedily), prompt in one step, then one token per sequence per step;
// at each position the argmax of `other` must equal the reference's unless the reference's top
// two logits are within `tie_margin` of each other.
struct Agreement {
  int64_t positions = 0;
  int64_t near_ties = 0;            // positions skipped for a top-2 margin under tie_margin
  int64_t disagreements = 0;        // argmax differs elsewhere (must be 0)
  int64_t argmax_differs = 0;       // argmax differs at all (near ties included)
  double worst_relative_error = 0;  // max over rows of max|diff| / max|reference|
};

inline Agreement TeacherForced(Backend& reference, Backend& other,
                               const std::vector<std::vector<int32_t>>& prompts, int steps,
                               double tie_margin) {
  std::vector<Seq> a;
  Greedy(reference, prompts, steps, &a);
  std::vector<Seq> b(a.size());
  const int64_t bs = other.kv_spec().block_size;
  Blocks blocks(bs, other.kv_spec().num_blocks);
  std::vector<std::pair<Seq*, int64_t>> work;
  for (size_t i = 0; i < a.size(); ++i) {
    b[i].tokens = a[i].tokens;
    work.emplace_back(&b[i], static_cast<int64_t>(prompts[i].size()));
  }
  for (int step = 0; step <= steps; ++step) {
    RunStep(other, MakeStep(bs, blocks, work, false), work, false);
    if (::testing::Test::HasFatalFailure()) break;
    for (auto& w : work) w.second = 1;
  }
  Agreement out;
  const int64_t vocab = other.vocab_size();
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t r = 0; r < a[i].logits.size() && r < b[i].logits.size(); ++r) {
      const std::vector<float>& want = a[i].logits[r];
      const std::vector<float>& got = b[i].logits[r];
      double max_diff = 0, max_ref = 1e-30;
      for (int64_t v = 0; v < vocab; ++v) {
        max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[v]) - want[v]));
        max_ref = std::max(max_ref, std::fabs(static_cast<double>(want[v])));
      }
      out.worst_relative_error = std::max(out.worst_relative_error, max_diff / max_ref);
      std::vector<float> sorted = want;
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      ++out.positions;
      if (Argmax(got) != Argmax(want)) ++out.argmax_differs;
      if (sorted[0] - sorted[1] < tie_margin) {
        ++out.near_ties;
      } else if (Argmax(got) != Argmax(want)) {
        ++out.disagreements;
      }
    }
  }
  return out;
}

inline std::unique_ptr<cuda::CudaBackend> MakeCudaBackend(std::shared_ptr<const Model> model,
                                                          CudaBackendOptions options) {
  auto backend = cuda::CudaBackend::Create(std::move(model), options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(backend).value() : nullptr;
}

// matmul_inputs: kF32 (exact), or kBF16 (inputs rounded to bf16: the reference of the CUDA
// backend's bf16-activation mode).
inline std::unique_ptr<CpuBackend> MakeCpuBackend(std::shared_ptr<const Model> model,
                                                  int64_t num_blocks, DType kv_dtype,
                                                  DType matmul_inputs = DType::kF32) {
  CpuBackendOptions options;
  options.num_blocks = num_blocks;
  options.kv_dtype = kv_dtype;
  options.matmul_input_dtype = matmul_inputs;
  auto backend = CpuBackend::Create(std::move(model), options);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(backend).value() : nullptr;
}

}  // namespace tandem::gpu_testing
