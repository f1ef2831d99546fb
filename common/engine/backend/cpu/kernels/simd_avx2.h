#pragma once

// AVX2 + FMA vector operations for the kernel templates (8 f32 lanes). Included only by
// kernels_avx2.cc, compiled with -mavx2 -mfma -mf16c. Namespace avx2 keeps these inline
// functions apart (ODR) from the same-named ones of other instruction sets.

#include <immintrin.h>

#include <cstdint>

#include "common/engine/backend/cpu/kernels/kv_types.h"

namespace tandem::cpu::avx2 {

struct Simd {
  using F = __m256;
  static constexpr int kLanes = 8;
  // MatMul register tile: 3 x 4 = 12 accumulators + 3 activation vectors + 1 weight vector.
  static constexpr int kMR = 3;
  static constexpr int kNR = 4;
  // Weight rows per tile when a tile has a single activation row (decode): more rows in flight.
  static constexpr int kNR1 = 8;
  // Attention output tile: accumulator vectors kept in registers (heads x vectors of head_dim).
  static constexpr int kAttnAccs = 8;
  static constexpr const char* kName = "avx2";

  static F Zero() { return _mm256_setzero_ps(); }
  static F Set1(float v) { return _mm256_set1_ps(v); }
  static __m256i Mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }

  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static F Load(const uint16_t* p) {  // bf16 -> f32 (exact)
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // First n (0 < n < kLanes) elements; the other lanes are +0 and nothing past p[n-1] is read.
  static F LoadTail(const float* p, int n) { return _mm256_maskload_ps(p, Mask(n)); }
  static F LoadTail(const uint16_t* p, int n) {
    alignas(16) uint16_t buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < n; ++i) buf[i] = p[i];
    return Load(buf);
  }
  // int8 -> f32 (exact).
  static F Load(const int8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static F LoadTail(const int8_t* p, int n) {
    alignas(16) int8_t buf[16] = {0};
    for (int i = 0; i < n; ++i) buf[i] = p[i];
    return Load(buf);
  }
  static F LoadI8(const int8_t* p) { return Load(p); }
  static F LoadI8Tail(const int8_t* p, int n) { return LoadTail(p, n); }
  // 8 nibbles: (p[i] >> shift) & 15 for i < 8, shift 0 or 4, as f32.
  static F LoadU4(const uint8_t* p, int shift) {
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    v = _mm256_and_si256(_mm256_srl_epi32(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi32(15));
    return _mm256_cvtepi32_ps(v);
  }
  // fp8 e4m3 -> f32 * 2^-8 (exact), as avx512::Simd::Fp8Widen.
  static F Fp8Widen(__m128i b) {
    const __m128i w = _mm_cvtepu8_epi16(b);
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7),
                                   _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8));
    return _mm256_cvtph_ps(h);
  }
  static F Load(const Fp8E4M3* p) {
    return Fp8Widen(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static F LoadTail(const Fp8E4M3* p, int n) {
    alignas(16) uint8_t buf[16] = {0};
    for (int i = 0; i < n; ++i) buf[i] = p[i].bits;
    return Fp8Widen(_mm_load_si128(reinterpret_cast<const __m128i*>(buf)));
  }
  // Lanes n.. set to +0.
  static F ZeroTail(F v, int n) { return _mm256_and_ps(v, _mm256_castsi256_ps(Mask(n))); }
  static void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void StoreTail(float* p, F v, int n) { _mm256_maskstore_ps(p, Mask(n), v); }

  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  // Per lane v > running ? v : running (a NaN in v is skipped).
  static F MaxKeep(F running, F v) { return _mm256_max_ps(v, running); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm256_div_ps(a, b); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }

  // Horizontal sum in a fixed tree: halves 128, 64, 32 bits.
  static float ReduceAdd(F v) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
    return _mm_cvtss_f32(s1);
  }

  // Four ReduceAdds at once with exactly the same additions: out[i] = ReduceAdd(v_i).
  static void ReduceAdd4(F a, F b, F c, F d, float* out) {
    // 128-bit halves: [a.lo + a.hi | b.lo + b.hi], [c.lo + c.hi | d.lo + d.hi].
    F ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    F cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
    // 64-bit halves, then the final pair, inside every 128-bit group.
    ab = _mm256_add_ps(ab, _mm256_shuffle_ps(ab, ab, _MM_SHUFFLE(3, 2, 3, 2)));
    cd = _mm256_add_ps(cd, _mm256_shuffle_ps(cd, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    ab = _mm256_add_ps(ab, _mm256_movehdup_ps(ab));
    cd = _mm256_add_ps(cd, _mm256_movehdup_ps(cd));
    // Results sit in lanes 0 and 4 of ab and cd.
    const __m128 lo = _mm_unpacklo_ps(_mm256_castps256_ps128(ab), _mm256_extractf128_ps(ab, 1));
    const __m128 hi = _mm_unpacklo_ps(_mm256_castps256_ps128(cd), _mm256_extractf128_ps(cd, 1));
    _mm_storeu_ps(out, _mm_movelh_ps(lo, hi));
  }

  // Same algorithm as avx512::Simd::Exp (<= 2 ulp for normal results, NaN preserved).
  static F Exp(F x) {
    x = _mm256_min_ps(_mm256_set1_ps(89.0f), _mm256_max_ps(_mm256_set1_ps(-104.0f), x));
    F n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    F r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    F r2 = _mm256_mul_ps(r, r);
    F p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, r2, r);
    p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i n1 = _mm256_srai_epi32(ni, 1);
    __m256i n2 = _mm256_sub_epi32(ni, n1);
    F s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    F s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  }

  static void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
};

}  // namespace tandem::cpu::avx2
