#pragma once

// Portable "vector" of 8 f32 lanes in plain C++ for the kernel templates: the last-resort path
// (no AVX2). Included only by kernels_scalar.cc, compiled with the baseline flags. The compiler
// may vectorize these loops with SSE2; results do not change (no contraction, no fast-math).

#include <cstdint>

#include "common/engine/backend/cpu/kernels/kv_types.h"

namespace tandem::cpu::scalar {

struct Simd {
  struct F {
    float v[8];
  };
  static constexpr int kLanes = 8;
  static constexpr int kMR = 2;
  static constexpr int kNR = 2;
  // Weight rows per tile when a tile has a single activation row (decode): more rows in flight.
  static constexpr int kNR1 = 4;
  // Attention output tile: accumulator vectors kept in registers (heads x vectors of head_dim).
  static constexpr int kAttnAccs = 4;
  static constexpr const char* kName = "scalar";

  static F Zero() { return Set1(0.0f); }
  static F Set1(float s) {
    F r;
    for (int i = 0; i < 8; ++i) r.v[i] = s;
    return r;
  }
  static float ToF32(float f) { return f; }
  static float ToF32(uint16_t h) {
    return __builtin_bit_cast(float, static_cast<uint32_t>(h) << 16);
  }
  static float ToF32(int8_t q) { return static_cast<float>(q); }
  // fp8 e4m3 value times 2^-8 (exact), as the AVX paths give it.
  static float ToF32(Fp8E4M3 c) {
    const uint32_t b = c.bits, e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 0) {
      v = static_cast<float>(m) * 0x1p-17f;
    } else {
      v = __builtin_bit_cast(float, ((e + 112) << 23) | (m << 20));
    }
    return (b & 0x80) != 0 ? -v : v;
  }

  template <class T>
  static F Load(const T* p) {
    F r;
    for (int i = 0; i < 8; ++i) r.v[i] = ToF32(p[i]);
    return r;
  }
  template <class T>
  static F LoadTail(const T* p, int n) {
    F r = Zero();
    for (int i = 0; i < n; ++i) r.v[i] = ToF32(p[i]);
    return r;
  }
  static F LoadI8(const int8_t* p) { return Load(p); }
  static F LoadI8Tail(const int8_t* p, int n) { return LoadTail(p, n); }
  // 8 nibbles: (p[i] >> shift) & 15 for i < 8, shift 0 or 4, as f32.
  static F LoadU4(const uint8_t* p, int shift) {
    F r;
    for (int i = 0; i < 8; ++i) r.v[i] = static_cast<float>((p[i] >> shift) & 15);
    return r;
  }
  // Lanes n.. set to +0.
  static F ZeroTail(F a, int n) {
    for (int i = n; i < 8; ++i) a.v[i] = 0.0f;
    return a;
  }
  static void Store(float* p, F a) {
    for (int i = 0; i < 8; ++i) p[i] = a.v[i];
  }
  static void StoreTail(float* p, F a, int n) {
    for (int i = 0; i < n; ++i) p[i] = a.v[i];
  }

  static F Add(F a, F b) {
    for (int i = 0; i < 8; ++i) a.v[i] += b.v[i];
    return a;
  }
  // Per lane v > running ? v : running (a NaN in v is skipped).
  static F MaxKeep(F running, F v) {
    for (int i = 0; i < 8; ++i) running.v[i] = v.v[i] > running.v[i] ? v.v[i] : running.v[i];
    return running;
  }
  static F Sub(F a, F b) {
    for (int i = 0; i < 8; ++i) a.v[i] -= b.v[i];
    return a;
  }
  static F Mul(F a, F b) {
    for (int i = 0; i < 8; ++i) a.v[i] *= b.v[i];
    return a;
  }
  static F Div(F a, F b) {
    for (int i = 0; i < 8; ++i) a.v[i] /= b.v[i];
    return a;
  }
  // Product rounded, then sum rounded (no FMA instruction at this level).
  static F Fma(F a, F b, F c) {
    for (int i = 0; i < 8; ++i) c.v[i] += a.v[i] * b.v[i];
    return c;
  }

  // Same tree shape as the AVX2 reduction: 8 -> 4 -> 2 -> 1.
  static float ReduceAdd(F a) {
    float s4[4], s2[2];
    for (int i = 0; i < 4; ++i) s4[i] = a.v[i] + a.v[i + 4];
    for (int i = 0; i < 2; ++i) s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
  }

  static void ReduceAdd4(F a, F b, F c, F d, float* out) {
    out[0] = ReduceAdd(a);
    out[1] = ReduceAdd(b);
    out[2] = ReduceAdd(c);
    out[3] = ReduceAdd(d);
  }

  static F Exp(F a) {
    for (int i = 0; i < 8; ++i) a.v[i] = __builtin_expf(a.v[i]);
    return a;
  }

  static void Prefetch(const void* p) { __builtin_prefetch(p); }
};

}  // namespace tandem::cpu::scalar
