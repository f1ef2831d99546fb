#pragma once

// Advanced SIMD (aarch64 NEON) vector operations for the kernel templates: 8 f32 lanes as two
// 128-bit registers, so that the templates' tiles, tails and reduction tree are the AVX2 ones
// (ReduceAdd: halves 128, 64, 32 bits; Exp: the same polynomial with fused multiply-adds), and
// the f32 kernels compute the AVX2 tier's bits. Included only by kernels_neon.cc. Namespace neon
// keeps these inline functions apart (ODR) from the same-named ones of other instruction sets.

#include <arm_neon.h>

#include <cstdint>

#include "common/engine/backend/cpu/kernels/kv_types.h"

namespace tandem::cpu::neon {

struct Simd {
  struct F {
    float32x4_t lo, hi;
  };
  static constexpr int kLanes = 8;
  // MatMul register tile: 3 x 4 = 12 accumulators of 2 registers + 3 inputs + 1 weight (32
  // registers).
  static constexpr int kMR = 3;
  static constexpr int kNR = 4;
  // Weight rows per tile when a tile has a single activation row (decode): more rows in flight.
  static constexpr int kNR1 = 8;
  // Attention output tile: accumulator vectors kept in registers (heads x vectors of head_dim).
  static constexpr int kAttnAccs = 8;
  static constexpr const char* kName = "neon";

  static F Make(float32x4_t lo, float32x4_t hi) { return F{lo, hi}; }
  static F Zero() { return Set1(0.0f); }
  static F Set1(float v) { return F{vdupq_n_f32(v), vdupq_n_f32(v)}; }
  // All-ones in the first n lanes (0 <= n <= 8).
  static uint32x4_t MaskLo(int n) {
    const int32_t idx[4] = {0, 1, 2, 3};
    return vcltq_s32(vld1q_s32(idx), vdupq_n_s32(n));
  }
  static uint32x4_t MaskHi(int n) {
    const int32_t idx[4] = {4, 5, 6, 7};
    return vcltq_s32(vld1q_s32(idx), vdupq_n_s32(n));
  }

  static F Load(const float* p) { return F{vld1q_f32(p), vld1q_f32(p + 4)}; }
  static F Load(const uint16_t* p) {  // bf16 -> f32 (exact)
    const uint16x8_t h = vld1q_u16(p);
    return F{vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)),
             vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(h), 16))};
  }
  // First n (0 < n < kLanes) elements; the other lanes are +0 and nothing past p[n-1] is read.
  template <class T>
  static F LoadTail(const T* p, int n) {
    T buf[8] = {};
    for (int i = 0; i < n; ++i) buf[i] = p[i];
    return Load(buf);
  }
  // int8 -> f32 (exact).
  static F Load(const int8_t* p) {
    const int16x8_t w = vmovl_s8(vld1_s8(p));
    return F{vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(w)))};
  }
  static F LoadI8(const int8_t* p) { return Load(p); }
  static F LoadI8Tail(const int8_t* p, int n) { return LoadTail(p, n); }
  // 8 nibbles: (p[i] >> shift) & 15 for i < 8, shift 0 or 4, as f32.
  static F LoadU4(const uint8_t* p, int shift) {
    uint8x8_t b = vld1_u8(p);
    b = shift != 0 ? vshr_n_u8(b, 4) : vand_u8(b, vdup_n_u8(15));
    const uint16x8_t w = vmovl_u8(b);
    return F{vcvtq_f32_u32(vmovl_u16(vget_low_u16(w))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(w)))};
  }
  // fp8 e4m3 -> f32 * 2^-8 (exact), as avx2::Simd::Fp8Widen: the bits placed in an f16.
  static F Load(const Fp8E4M3* p) {
    const uint16x8_t w = vmovl_u8(vld1_u8(reinterpret_cast<const uint8_t*>(p)));
    const uint16x8_t h = vorrq_u16(vshlq_n_u16(vandq_u16(w, vdupq_n_u16(0x7f)), 7),
                                   vshlq_n_u16(vandq_u16(w, vdupq_n_u16(0x80)), 8));
    const float16x8_t f = vreinterpretq_f16_u16(h);
    return F{vcvt_f32_f16(vget_low_f16(f)), vcvt_f32_f16(vget_high_f16(f))};
  }
  // Lanes n.. set to +0.
  static F ZeroTail(F v, int n) {
    return F{vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v.lo), MaskLo(n))),
             vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v.hi), MaskHi(n)))};
  }
  static void Store(float* p, F v) {
    vst1q_f32(p, v.lo);
    vst1q_f32(p + 4, v.hi);
  }
  static void StoreTail(float* p, F v, int n) {
    float buf[8];
    Store(buf, v);
    for (int i = 0; i < n; ++i) p[i] = buf[i];
  }

  static F Add(F a, F b) { return F{vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)}; }
  static F Sub(F a, F b) { return F{vsubq_f32(a.lo, b.lo), vsubq_f32(a.hi, b.hi)}; }
  // Per lane v > running ? v : running (a NaN in v is skipped).
  static F MaxKeep(F running, F v) {
    return F{vbslq_f32(vcgtq_f32(v.lo, running.lo), v.lo, running.lo),
             vbslq_f32(vcgtq_f32(v.hi, running.hi), v.hi, running.hi)};
  }
  static F Mul(F a, F b) { return F{vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)}; }
  static F Div(F a, F b) { return F{vdivq_f32(a.lo, b.lo), vdivq_f32(a.hi, b.hi)}; }
  static F Fma(F a, F b, F c) {
    return F{vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)};
  }

  // Horizontal sum in avx2::Simd::ReduceAdd's tree: halves 128, 64, 32 bits.
  static float ReduceAdd(F v) {
    const float32x4_t s4 = vaddq_f32(v.lo, v.hi);
    const float32x2_t s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
    return vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1);
  }
  static void ReduceAdd4(F a, F b, F c, F d, float* out) {
    out[0] = ReduceAdd(a);
    out[1] = ReduceAdd(b);
    out[2] = ReduceAdd(c);
    out[3] = ReduceAdd(d);
  }

  // avx2::Simd::Exp's algorithm, operation for operation (<= 2 ulp for normal results, NaN
  // preserved).
  static float32x4_t Exp4(float32x4_t x) {
    x = vminq_f32(vdupq_n_f32(89.0f), vmaxq_f32(vdupq_n_f32(-104.0f), x));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    const float32x4_t r2 = vmulq_f32(r, r);
    float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vfmaq_f32(r, p, r2);
    p = vaddq_f32(p, vdupq_n_f32(1.0f));
    const int32x4_t ni = vcvtq_s32_f32(n);  // n is integral: truncation is exact
    const int32x4_t n1 = vshrq_n_s32(ni, 1);
    const int32x4_t n2 = vsubq_s32(ni, n1);
    const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, vdupq_n_s32(127)), 23));
    const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, vdupq_n_s32(127)), 23));
    return vmulq_f32(vmulq_f32(p, s1), s2);
  }
  static F Exp(F x) { return F{Exp4(x.lo), Exp4(x.hi)}; }

  static void Prefetch(const void* p) { __builtin_prefetch(p); }
};

}  // namespace tandem::cpu::neon
