// MatMul with int8 inputs on AVX2 (vpmaddubsw + vpmaddwd; i8_tiles_256.h) and the input
// quantizer's row function on AVX2, equal to MatMulI8Reference and QuantizeRowI8Reference bit
// for bit. Compiled with the AVX2 tier's flags only (CMakeLists.txt); everything here has
// internal linkage except MatMulI8Avx2 and QuantizeRowI8Avx2 (README, "ODR").

#include "common/engine/backend/cpu/kernels/i8_tiles_256.h"

namespace tandem::cpu::internal {

void MatMulI8Avx2(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                  const float* bias, float* y, int64_t ldy) {
  MatMulI8Tiles256<false>(in, w, n0, n1, bias, y, ldy);
}

void QuantizeRowI8Avx2(const float* x, int64_t K, bool int4, int64_t group_size, int8_t* codes,
                       float* scale, int32_t* sum, float* group_sums) {
  *sum = 0;
  const int64_t kmain = K - K % 8;
  const int tail = static_cast<int>(K - kmain);
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i tail_mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(tail), idx);
  const __m256 big = _mm256_set1_ps(__FLT_MAX__);  // not std::numeric_limits (README, "ODR")
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 vmax = _mm256_setzero_ps();
  int bad = 0;  // lanes that saw a NaN or an infinity (not <= FLT_MAX)
  for (int64_t k = 0; k < K; k += 8) {
    const __m256 v = k < kmain ? _mm256_loadu_ps(x + k) : _mm256_maskload_ps(x + k, tail_mask);
    const __m256 a = _mm256_andnot_ps(sign, v);
    bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, big, _CMP_NLE_UQ));
    vmax = _mm256_max_ps(vmax, a);  // exact whatever the order once every element is finite
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  float inv = 0.0f;
  if (!QuantizeRowI8Scale(_mm_cvtss_f32(m4), bad == 0, scale, &inv)) return;
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
  __m256i total = _mm256_setzero_si256(), group = _mm256_setzero_si256();
  const auto hsum = [](__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
  };
  for (int64_t k = 0; k < K; k += 8) {
    const bool full = k < kmain;
    __m256 v = full ? _mm256_loadu_ps(x + k) : _mm256_maskload_ps(x + k, tail_mask);
    v = _mm256_round_ps(_mm256_mul_ps(v, vinv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i q = _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(v, hi), lo));
    total = _mm256_add_epi32(total, q);
    const __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    const __m128i q8 = _mm_packs_epi16(q16, q16);
    if (full) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + k), q8);
    } else {
      alignas(16) int8_t buf[16];
      _mm_store_si128(reinterpret_cast<__m128i*>(buf), q8);
      for (int i = 0; i < tail; ++i) codes[k + i] = buf[i];
    }
    if (int4) {
      group = _mm256_add_epi32(group, q);
      if ((k + 8) % group_size == 0 || k + 8 >= K) {  // a group holds whole 8s (>= 32)
        group_sums[k / group_size] = static_cast<float>(hsum(group));
        group = _mm256_setzero_si256();
      }
    }
  }
  *sum = hsum(total);
}

}  // namespace tandem::cpu::internal
