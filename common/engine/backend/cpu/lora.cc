#include "common/engine/backend/cpu/lora.h"

#include <cstring>

#include "common/base/half.h"
#include "common/engine/backend/cpu/kernels/kernels.h"

namespace tandem {
namespace {

cpu::MatMulWeight DenseView(const void* data, DType dtype) {
  cpu::MatMulWeight w;
  w.data = data;
  w.dtype = dtype;
  w.input_dtype = DType::kF32;
  return w;
}

}  // namespace

bool LoraRunner::Prepare(const ForwardBatch& b) {
  groups_.clear();
  for (int64_t t = 0; t < b.num_tokens(); ++t) {
    const LoraAdapter* a = b.seqs[b.seq_of_token[t]].lora;
    if (a == nullptr) continue;
    Group* g = nullptr;
    for (Group& existing : groups_) {
      if (existing.adapter == a) g = &existing;
    }
    if (g == nullptr) {
      g = &groups_.emplace_back();
      g->adapter = a;
    }
    g->rows.push_back(static_cast<int32_t>(t));
  }
  return active();
}

void LoraRunner::Add(int64_t layer, LoraTarget target, const float* x, int64_t K, int64_t ldx,
                     float* y, int64_t N, int64_t ldy, ThreadPool* pool) {
  for (const Group& g : groups_) {
    const LoraMatrices& m = g.adapter->at(layer, target);
    if (!m.present()) continue;
    const int64_t M = static_cast<int64_t>(g.rows.size());
    const int64_t r = g.adapter->rank;
    // The group's rows of x, contiguous (a sequence's tokens are consecutive; groups of several
    // sequences are gathered).
    const float* xg = x + static_cast<int64_t>(g.rows.front()) * ldx;
    int64_t ldxg = ldx;
    if (g.rows.back() - g.rows.front() + 1 != M || bf16_inputs_) {
      if (gathered_.size() < static_cast<size_t>(M * K)) gathered_.resize(M * K);
      for (int64_t i = 0; i < M; ++i) {
        const float* src = x + g.rows[i] * ldx;
        float* dst = gathered_.data() + i * K;
        if (bf16_inputs_) {  // the base product's inputs: each x rounded to nearest-even bf16
          for (int64_t k = 0; k < K; ++k) dst[k] = Bf16ToFloat(FloatToBf16(src[k]));
        } else {
          std::memcpy(dst, src, K * sizeof(float));
        }
      }
      xg = gathered_.data();
      ldxg = K;
    }
    if (low_.size() < static_cast<size_t>(M * r)) low_.resize(M * r);
    // Decode-sized products (a few rows) run on this thread: a fork and join per product would
    // cost more than the product (14 of them per layer), and far more when a pool thread is
    // descheduled; prefill-sized ones fan out. Which thread computes an output changes nothing.
    ThreadPool* fan = M * r * (K + N) >= (int64_t{1} << 22) ? pool : nullptr;
    cpu::MatMul(xg, M, K, ldxg, DenseView(m.a, m.dtype), r, nullptr, low_.data(), r, fan);
    // The scale goes into U (r products a row, not N), so the expand's output is the term itself:
    // y + sum_j (scale u_j) B[n, j].
    const float s = g.adapter->scale;
    for (int64_t i = 0; i < M * r; ++i) low_[i] *= s;
    if (M == 1) {
      // One row: the expand adds its sums to y itself (MatMul's bias is y's row), with no pass
      // over a delta buffer; y + sum, the same float addition as the loop below.
      float* row = y + g.rows[0] * ldy;
      cpu::MatMul(low_.data(), 1, r, r, DenseView(m.b, m.dtype), N, row, row, N, fan);
      continue;
    }
    if (delta_.size() < static_cast<size_t>(M * N)) delta_.resize(M * N);
    cpu::MatMul(low_.data(), M, r, r, DenseView(m.b, m.dtype), N, nullptr, delta_.data(), N, fan);
    for (int64_t i = 0; i < M; ++i) {
      float* row = y + g.rows[i] * ldy;
      const float* d = delta_.data() + i * N;
      for (int64_t j = 0; j < N; ++j) row[j] += d[j];
    }
  }
}

}  // namespace tandem
