#pragma once

// AVX-512 vector operations for the kernel templates (16 f32 lanes). Included only by
// kernels_avx512.cc, which is compiled with -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c.
// Everything lives in namespace avx512 so that these inline functions never collide (ODR) with
// the same-named ones of other instruction sets.

#include <immintrin.h>

#include <cstdint>

#include "common/engine/backend/cpu/kernels/kv_types.h"

namespace tandem::cpu::avx512 {

struct Simd {
  using F = __m512;
  static constexpr int kLanes = 16;
  // MatMul register tile: kMR activation rows x kNR weight rows (24 accumulators of 32 registers).
  static constexpr int kMR = 4;
  static constexpr int kNR = 6;
  // Weight rows per tile when a tile has a single activation row (decode): more rows in flight.
  static constexpr int kNR1 = 8;
  // Attention output tile: accumulator vectors kept in registers (heads x vectors of head_dim).
  static constexpr int kAttnAccs = 24;
  static constexpr const char* kName = "avx512";

  static F Zero() { return _mm512_setzero_ps(); }
  static F Set1(float v) { return _mm512_set1_ps(v); }
  static __mmask16 Mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }

  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static F Load(const uint16_t* p) {  // bf16 -> f32 (exact): zero-extend, shift into the high half
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // First n (0 < n < kLanes) elements; the other lanes are +0 and nothing past p[n-1] is read.
  static F LoadTail(const float* p, int n) { return _mm512_maskz_loadu_ps(Mask(n), p); }
  static F LoadTail(const uint16_t* p, int n) {
    __m256i h = _mm256_maskz_loadu_epi16(Mask(n), p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // int8 -> f32 (exact).
  static F Load(const int8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static F LoadTail(const int8_t* p, int n) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(Mask(n), p)));
  }
  static F LoadI8(const int8_t* p) { return Load(p); }
  static F LoadI8Tail(const int8_t* p, int n) { return LoadTail(p, n); }
  // 16 nibbles: (p[i] >> shift) & 15 for i < 16, shift 0 or 4, as f32.
  static F LoadU4(const uint8_t* p, int shift) {
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    v = _mm512_and_si512(_mm512_srl_epi32(v, _mm_cvtsi32_si128(shift)), _mm512_set1_epi32(15));
    return _mm512_cvtepi32_ps(v);
  }
  // 32 nibbles of one 16-byte chunk: lo[i] = p[i] & 15, hi[i] = p[i] >> 4, as f32 (one load, one
  // widening for both halves).
  static void LoadU4Pair(const uint8_t* p, F* lo, F* hi) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    *lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
    *hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
  }
  // fp8 e4m3 -> f32 * 2^-8 (exact): the code's bits placed as an f16 (sign, 4 exponent bits in
  // the low 4 of the f16's 5, 3 mantissa bits at the top of its 10).
  static F Fp8Widen(__m128i b) {
    const __m256i w = _mm256_cvtepu8_epi16(b);
    const __m256i h =
        _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7),
                        _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8));
    return _mm512_cvtph_ps(h);
  }
  static F Load(const Fp8E4M3* p) {
    return Fp8Widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F LoadTail(const Fp8E4M3* p, int n) { return Fp8Widen(_mm_maskz_loadu_epi8(Mask(n), p)); }
  // Lanes n.. set to +0.
  static F ZeroTail(F v, int n) { return _mm512_maskz_mov_ps(Mask(n), v); }
  static void Store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void StoreTail(float* p, F v, int n) { _mm512_mask_storeu_ps(p, Mask(n), v); }

  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  // Per lane v > running ? v : running (a NaN in v is skipped).
  static F MaxKeep(F running, F v) { return _mm512_max_ps(v, running); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm512_div_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }  // a*b+c, one rounding

  // Horizontal sum in a fixed tree: halves 256, 128, 64, 32 bits.
  static float ReduceAdd(F v) {
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(3, 2, 3, 2)));
    __m256 s8 = _mm256_add_ps(lo, hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
    return _mm_cvtss_f32(s1);
  }

  // Four ReduceAdds at once with exactly the same additions (same tree, lanes packed together):
  // out[i] = ReduceAdd(v_i).
  static void ReduceAdd4(F a, F b, F c, F d, float* out) {
    // 256-bit halves: [a.lo + a.hi | b.lo + b.hi] and likewise for c, d.
    F ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    F cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
    // 128-bit halves: lane group k holds the 4-float partial sums of vector k.
    F v = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                        _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
    // 64-bit halves, then the final pair, inside every 128-bit group.
    v = _mm512_add_ps(v, _mm512_shuffle_ps(v, v, _MM_SHUFFLE(3, 2, 3, 2)));
    v = _mm512_add_ps(v, _mm512_movehdup_ps(v));
    const __m128 r = _mm512_castps512_ps128(_mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), v));
    _mm_storeu_ps(out, r);
  }

  // exp(x) with <= 2 ulp error for normal results (Cephes expf polynomial, FMA evaluation).
  // exp(-inf) = 0, exp(+inf) = inf, NaN stays NaN, results below 2^-126 are computed as subnormals.
  static F Exp(F x) {
    // Operand order keeps NaN (max/min return the second operand when either is NaN).
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
    F n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    F r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    F r2 = _mm512_mul_ps(r, r);
    F p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, r2, r);
    p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
    // p * 2^n as two exact power-of-two scalings so that subnormal and overflowing results
    // round once, correctly.
    __m512i ni = _mm512_cvtps_epi32(n);
    __m512i n1 = _mm512_srai_epi32(ni, 1);
    __m512i n2 = _mm512_sub_epi32(ni, n1);
    F s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, _mm512_set1_epi32(127)), 23));
    F s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, _mm512_set1_epi32(127)), 23));
    return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
  }

  static void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
};

}  // namespace tandem::cpu::avx512
