#pragma once

// Device helpers shared by the GEMV kernels over bf16 weights (gemv_kernels.cu) and over
// quantized weights (quant_gemv_kernels.cu): bf16 / f32 activation loads of 8 elements, the
// SiLU of the fused gate/up epilogue, and the rounding of an f32 value to bf16 precision.

#include "common/engine/backend/cuda/device_compat.cuh"

#if !defined(TANDEM_CUDA_EMULATION)
#include <cuda_bf16.h>
#endif

namespace tandem::cuda::gemv {

// Warps (outputs) per block of every GEMV kernel.
constexpr int kGemvWarps = 4;

// 8 bf16 values (16 bytes) as f32.
TANDEM_DEVICE void Unpack8(const dev::U32x4& v, float* out) {
  out[0] = dev::BitsToFloat(v.x << 16);
  out[1] = dev::BitsToFloat(v.x & 0xffff0000u);
  out[2] = dev::BitsToFloat(v.y << 16);
  out[3] = dev::BitsToFloat(v.y & 0xffff0000u);
  out[4] = dev::BitsToFloat(v.z << 16);
  out[5] = dev::BitsToFloat(v.z & 0xffff0000u);
  out[6] = dev::BitsToFloat(v.w << 16);
  out[7] = dev::BitsToFloat(v.w & 0xffff0000u);
}

// 8 consecutive activations (16-byte aligned) as f32.
TANDEM_DEVICE void LoadX8(const uint16_t* p, float* out) { Unpack8(dev::Load16(p), out); }
TANDEM_DEVICE void LoadX8(const float* p, float* out) {
  const dev::U32x4 a = dev::Load16(p), b = dev::Load16(p + 4);
  out[0] = dev::BitsToFloat(a.x);
  out[1] = dev::BitsToFloat(a.y);
  out[2] = dev::BitsToFloat(a.z);
  out[3] = dev::BitsToFloat(a.w);
  out[4] = dev::BitsToFloat(b.x);
  out[5] = dev::BitsToFloat(b.y);
  out[6] = dev::BitsToFloat(b.z);
  out[7] = dev::BitsToFloat(b.w);
}

TANDEM_DEVICE float Silu(float g) { return g / (1.0f + dev::Exp(-g)); }

// f rounded to the nearest-even bf16 value, as f32 (finite f: the bits of dev::FloatToBf16; on
// the GPU one cvt.rn.bf16.f32).
TANDEM_DEVICE float RoundToBf16(float f) {
#if defined(TANDEM_CUDA_EMULATION)
  return dev::Bf16ToFloat(dev::FloatToBf16(f));
#else
  return __bfloat162float(__float2bfloat16_rn(f));
#endif
}

}  // namespace tandem::cuda::gemv
