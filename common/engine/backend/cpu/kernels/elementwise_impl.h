#pragma once

// Row-wise kernels (norms, RoPE, SiLU, embedding, exp) as templates over an ISA's Simd type.
// Only templates live here (see matmul_impl.h). Every row is computed on its own, so results
// never depend on how many rows share a call. Plain C++ loops are fine here: the library is
// built with -ffp-contract=off, so auto-vectorized and scalar code give the same bits.

#include <cstdint>

#include "common/base/dtype.h"

namespace tandem::cpu::impl {

// bf16 <-> f32 bit conversions (same as common/base/half.h, which ISA files must not call: an
// inline function compiled with AVX-512 flags could be picked by the linker for other callers).
template <class S>
inline float Bf16BitsToF32(uint16_t h) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(h) << 16);
}

// Round to nearest even; NaN stays NaN.
template <class S>
inline uint16_t F32ToBf16Bits(float f) {
  const uint32_t bits = __builtin_bit_cast(uint32_t, f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Sum of x[d]^2 in the fixed vector order: lane accumulators, zero-padded tail, ReduceAdd.
template <class S>
float SumSquares(const float* x, int64_t n) {
  constexpr int L = S::kLanes;
  typename S::F acc = S::Zero();
  const int64_t main = n - n % L;
  for (int64_t d = 0; d < main; d += L) {
    typename S::F v = S::Load(x + d);
    acc = S::Fma(v, v, acc);
  }
  if (main < n) {
    typename S::F v = S::LoadTail(x + main, static_cast<int>(n - main));
    acc = S::Fma(v, v, acc);
  }
  return S::ReduceAdd(acc);
}

// out[d] = (x[d] * inv) * w[d].
template <class S>
void ScaleByWeight(const float* x, float inv, const float* w, int64_t n, float* out) {
  constexpr int L = S::kLanes;
  const typename S::F iv = S::Set1(inv);
  const int64_t main = n - n % L;
  for (int64_t d = 0; d < main; d += L) {
    S::Store(out + d, S::Mul(S::Mul(S::Load(x + d), iv), S::Load(w + d)));
  }
  if (main < n) {
    const int t = static_cast<int>(n - main);
    S::StoreTail(out + main, S::Mul(S::Mul(S::LoadTail(x + main, t), iv), S::LoadTail(w + main, t)),
                 t);
  }
}

// Hugging Face LlamaRMSNorm: variance = mean(x^2) in f32, x * rsqrt(variance + eps), * weight.
template <class S>
float RmsInverse(const float* x, int64_t D, float eps) {
  const float var = SumSquares<S>(x, D) / static_cast<float>(D);
  return 1.0f / __builtin_sqrtf(var + eps);
}

template <class S>
void RmsNorm(const float* x, const float* weight, int64_t M, int64_t D, float eps, float* out) {
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * D;
    ScaleByWeight<S>(xr, RmsInverse<S>(xr, D, eps), weight, D, out + m * D);
  }
}

template <class S>
void AddRmsNorm(float* residual, const float* delta, const float* weight, int64_t M, int64_t D,
                float eps, float* out) {
  for (int64_t m = 0; m < M; ++m) {
    float* r = residual + m * D;
    const float* dl = delta + m * D;
    for (int64_t d = 0; d < D; ++d) r[d] += dl[d];
    ScaleByWeight<S>(r, RmsInverse<S>(r, D, eps), weight, D, out + m * D);
  }
}

template <class S>
void ApplyRope(float* x, int64_t M, int64_t ldx, int64_t num_heads, int64_t head_dim,
               const int32_t* positions, const float* cos_sin) {
  const int64_t half = head_dim / 2;
  for (int64_t m = 0; m < M; ++m) {
    const float* cs = cos_sin + static_cast<int64_t>(positions[m]) * half * 2;
    for (int64_t h = 0; h < num_heads; ++h) {
      float* a = x + m * ldx + h * head_dim;
      float* b = a + half;
      for (int64_t i = 0; i < half; ++i) {
        const float c = cs[2 * i], s = cs[2 * i + 1];
        const float av = a[i], bv = b[i];
        a[i] = av * c - bv * s;
        b[i] = bv * c + av * s;
      }
    }
  }
}

// silu(g) * u = (g / (1 + exp(-g))) * u with the ISA's vector exp (tails masked, same code).
template <class S>
void SiluMul(const float* gate, const float* up, int64_t M, int64_t F, float* out) {
  constexpr int L = S::kLanes;
  const int64_t n = M * F;  // rows are contiguous; each element is computed on its own
  const typename S::F one = S::Set1(1.0f);
  auto one_vec = [&](typename S::F g, typename S::F u) {
    typename S::F e = S::Exp(S::Sub(S::Zero(), g));
    return S::Mul(S::Div(g, S::Add(one, e)), u);
  };
  const int64_t main = n - n % L;
  for (int64_t i = 0; i < main; i += L)
    S::Store(out + i, one_vec(S::Load(gate + i), S::Load(up + i)));
  if (main < n) {
    const int t = static_cast<int>(n - main);
    S::StoreTail(out + main, one_vec(S::LoadTail(gate + main, t), S::LoadTail(up + main, t)), t);
  }
}

template <class S>
void ExpArray(const float* x, int64_t n, float* out) {
  constexpr int L = S::kLanes;
  const int64_t main = n - n % L;
  for (int64_t i = 0; i < main; i += L) S::Store(out + i, S::Exp(S::Load(x + i)));
  if (main < n) {
    const int t = static_cast<int>(n - main);
    S::StoreTail(out + main, S::Exp(S::LoadTail(x + main, t)), t);
  }
}

template <class S>
void Embed(const int32_t* ids, int64_t M, const void* table, DType dtype, int64_t D, float* out) {
  for (int64_t m = 0; m < M; ++m) {
    const int64_t row = ids[m];
    float* o = out + m * D;
    if (dtype == DType::kBF16) {
      const uint16_t* src = static_cast<const uint16_t*>(table) + row * D;
      for (int64_t d = 0; d < D; ++d) o[d] = Bf16BitsToF32<S>(src[d]);
    } else {
      const float* src = static_cast<const float*>(table) + row * D;
      for (int64_t d = 0; d < D; ++d) o[d] = src[d];
    }
  }
}

}  // namespace tandem::cpu::impl
