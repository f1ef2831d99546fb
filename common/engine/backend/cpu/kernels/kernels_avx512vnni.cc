// MatMul with int8 inputs on AVX512_VNNI (vpdpbusd; i8_tiles_512.h) and the input quantizer's
// row function on AVX-512, equal to MatMulI8Reference and QuantizeRowI8Reference bit for bit.
// Compiled with this tier's flags only (see CMakeLists.txt); the dispatcher calls
// MatMulI8Avx512Vnni only on the avx512-vnni tier and QuantizeRowI8Avx512 on the AVX-512 tiers.
// Everything here has internal linkage except those two (README.md, "ODR").

#define TANDEM_I8_512_VNNI 1
#include "common/engine/backend/cpu/kernels/i8_tiles_512.h"

namespace tandem::cpu::internal {

void MatMulI8Avx512Vnni(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                        const float* bias, float* y, int64_t ldy) {
  if (in.quant == WeightQuant::kInt4) {
    RangeOf<WeightQuant::kInt4>(in, w, n0, n1, bias, y, ldy);
  } else {
    RangeOf<WeightQuant::kInt8>(in, w, n0, n1, bias, y, ldy);
  }
}

void QuantizeRowI8Avx512(const float* x, int64_t K, bool int4, int64_t group_size, int8_t* codes,
                         float* scale, int32_t* sum, float* group_sums) {
  *sum = 0;
  const int64_t kmain = K - K % 16;
  const auto tail = static_cast<__mmask16>((1u << (K - kmain)) - 1);
  const __m512 big = _mm512_set1_ps(__FLT_MAX__);  // not std::numeric_limits (README, "ODR")
  __m512 vmax = _mm512_setzero_ps();
  __mmask16 bad = 0;  // lanes that saw a NaN or an infinity (not <= FLT_MAX)
  for (int64_t k = 0; k < K; k += 16) {
    const __m512 a =
        _mm512_abs_ps(k < kmain ? _mm512_loadu_ps(x + k) : _mm512_maskz_loadu_ps(tail, x + k));
    bad |= _mm512_cmp_ps_mask(a, big, _CMP_NLE_UQ);
    vmax = _mm512_max_ps(vmax, a);  // exact whatever the order once every element is finite
  }
  float inv = 0.0f;
  if (!QuantizeRowI8Scale(_mm512_reduce_max_ps(vmax), bad == 0, scale, &inv)) return;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512 hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
  __m512i total = _mm512_setzero_si512(), group = _mm512_setzero_si512();
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 m = k < kmain ? __mmask16{0xFFFF} : tail;
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + k), vinv);
    v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i q = _mm512_cvtps_epi32(_mm512_max_ps(_mm512_min_ps(v, hi), lo));
    total = _mm512_add_epi32(total, q);
    _mm_mask_storeu_epi8(codes + k, m, _mm512_cvtepi32_epi8(q));
    if (int4) {
      group = _mm512_add_epi32(group, q);
      if ((k + 16) % group_size == 0 || k + 16 >= K) {  // a group holds whole 16s (>= 32)
        group_sums[k / group_size] = static_cast<float>(_mm512_reduce_add_epi32(group));
        group = _mm512_setzero_si512();
      }
    }
  }
  *sum = _mm512_reduce_add_epi32(total);
}

}  // namespace tandem::cpu::internal
