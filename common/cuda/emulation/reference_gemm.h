#pragma once

// The emulator's cuBLAS and cuBLASLt matmuls: C[i, j] = finish(i, j, sum over l of a(i, l) *
// b(l, j)), each output's products added in order l = 0 .. k - 1 into its own Acc from 0. The
// operands are first read into panels of contiguous floats (op(A)'s rows, op(B)'s columns,
// through the caller's element loaders), so the dot products run over plain arrays instead of a
// type switch and an index computation per element (in the sanitizer build that loop was most of
// the emulated backend tests' time); four outputs run side by side, each its own chain, so the
// sums are the same as element by element.

#include <algorithm>
#include <cstdint>
#include <vector>

namespace tandem::cuda_emu {

// load_a(i, l), load_b(l, j) -> float; finish(i, j, Acc dot) stores the output.
template <class Acc, class LoadA, class LoadB, class Finish>
void ReferenceGemm(int64_t m, int64_t n, int64_t k, LoadA load_a, LoadB load_b, Finish finish) {
  constexpr int64_t kRows = 64, kCols = 256;  // panel sizes: bounded memory for any m, n
  std::vector<float> a(static_cast<size_t>(std::min(m, kRows) * k));
  std::vector<float> b(static_cast<size_t>(std::min(n, kCols) * k));
  for (int64_t j0 = 0; j0 < n; j0 += kCols) {
    const int64_t j1 = std::min(n, j0 + kCols);
    for (int64_t j = j0; j < j1; ++j) {
      for (int64_t l = 0; l < k; ++l) b[(j - j0) * k + l] = load_b(l, j);
    }
    for (int64_t i0 = 0; i0 < m; i0 += kRows) {
      const int64_t i1 = std::min(m, i0 + kRows);
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t l = 0; l < k; ++l) a[(i - i0) * k + l] = load_a(i, l);
      }
      for (int64_t j = j0; j < j1; ++j) {
        const float* bj = &b[(j - j0) * k];
        int64_t i = i0;
        for (; i + 4 <= i1; i += 4) {
          const float* ai = &a[(i - i0) * k];
          Acc s0 = 0, s1 = 0, s2 = 0, s3 = 0;
          for (int64_t l = 0; l < k; ++l) {
            const Acc x = bj[l];
            s0 += static_cast<Acc>(ai[l]) * x;
            s1 += static_cast<Acc>(ai[k + l]) * x;
            s2 += static_cast<Acc>(ai[2 * k + l]) * x;
            s3 += static_cast<Acc>(ai[3 * k + l]) * x;
          }
          finish(i, j, s0);
          finish(i + 1, j, s1);
          finish(i + 2, j, s2);
          finish(i + 3, j, s3);
        }
        for (; i < i1; ++i) {
          const float* ai = &a[(i - i0) * k];
          Acc s = 0;
          for (int64_t l = 0; l < k; ++l) s += static_cast<Acc>(ai[l]) * static_cast<Acc>(bj[l]);
          finish(i, j, s);
        }
      }
    }
  }
}

}  // namespace tandem::cuda_emu
