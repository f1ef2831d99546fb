#pragma once

// The paged KV pool's codes on the device (KvLayerView): where a row (block, K or V, kv head,
// token) and its scale lie, and each KV dtype's load and quantization, bit for bit the CPU's
// (cpu/kernels/attention_impl.h: WriteKv, ReadKvSlot, F32ToFp8E4M3), so that a pool region moves
// between CPU and GPU workers unchanged and a row written on either side dequantizes to the same
// values on both.
//
// Quantized rows (int8, fp8 e4m3) carry one f32 scale each, quantized on their own from their
// max |value|: int8 code = rint(x / s) with s = max / 127; fp8 code = e4m3(x / s) with
// s = max / 448 (round to nearest even, saturating at 448), the scale stored as 256 s because
// the fp8 load gives the code's value times 2^-8 (as the CPU's widening does).

#include <cstdint>

#include "common/engine/backend/cuda/device_compat.cuh"
#include "common/engine/backend/cuda/kernels.h"

namespace tandem::cuda::dev {

TANDEM_HOST_DEVICE bool KvQuantized(DType t) { return t == DType::kI8 || t == DType::kF8E4M3; }

TANDEM_HOST_DEVICE int64_t KvCodeBytes(DType t) {
  return t == DType::kF32 ? 4 : t == DType::kBF16 ? 2 : 1;
}

// Bytes of one block of one layer (KvRegionBytes of common/base/kv_layout.h).
TANDEM_HOST_DEVICE int64_t KvBlockBytes(const KvLayerView& kv) {
  const int64_t rows = 2LL * kv.num_kv_heads * kv.block_size;
  return rows * kv.head_dim * KvCodeBytes(kv.dtype) + (KvQuantized(kv.dtype) ? rows * 4 : 0);
}

// The first byte of block `block` of the layer (`block_bytes`: KvBlockBytes(kv)): the local pool's,
// or for an id tagged kKvRemoteBlock the remote pool's.
TANDEM_HOST_DEVICE uint8_t* KvBlockAt(const KvLayerView& kv, int64_t block, int64_t block_bytes) {
  if (block >= kKvRemoteBlock) {
    return static_cast<uint8_t*>(kv.remote_base) + (block - kKvRemoteBlock) * block_bytes;
  }
  return static_cast<uint8_t*>(kv.base) + block * block_bytes;
}

// Index inside its block of the row of (which: 0 K, 1 V; kv head h; token offset in the block).
TANDEM_HOST_DEVICE int64_t KvRow(const KvLayerView& kv, int which, int64_t h, int64_t off) {
  return (which * static_cast<int64_t>(kv.num_kv_heads) + h) * kv.block_size + off;
}

// The scale of row `row` of a quantized block.
TANDEM_HOST_DEVICE int64_t KvScaleOffset(const KvLayerView& kv, int64_t row) {
  return 2LL * kv.num_kv_heads * kv.block_size * kv.head_dim + row * 4;
}

// fp8 e4m3 ("E4M3FN": bias 7, no infinities, max 448) code of x, rounded to nearest even and
// saturated at 448 (NaN too).
TANDEM_DEVICE uint8_t FloatToFp8E4M3(float x) {
  const uint32_t b = FloatToBits(x);
  const uint8_t sign = static_cast<uint8_t>((b >> 24) & 0x80);
  const uint32_t ab = b & 0x7fffffffu;
  const float a = BitsToFloat(ab);
  if (!(a < 464.0f)) return sign | 0x7e;
  if (a < 0.015625f) {  // below the smallest normal: multiples of 2^-9 (the scaling is exact)
    return sign | static_cast<uint8_t>(rintf(a * 512.0f));
  }
  int32_t e = static_cast<int32_t>((ab >> 23) & 0xff) - 127;
  const uint32_t m = ab & 0x7fffffu;
  uint32_t keep = m >> 20;
  const uint32_t rest = m & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (keep & 1u) != 0)) ++keep;
  if (keep == 8) {
    keep = 0;
    ++e;
  }
  if (e > 8 || (e == 8 && keep > 6)) return sign | 0x7e;
  return sign | static_cast<uint8_t>(((e + 7) << 3) | static_cast<int32_t>(keep));
}

// The value of an fp8 e4m3 code times 2^-8 (exact).
TANDEM_DEVICE float Fp8E4M3ToFloatScaled(uint8_t c) {
  const uint32_t e = (c >> 3) & 15u, m = c & 7u;
  const float v =
      e == 0 ? static_cast<float>(m) * 0x1p-17f : BitsToFloat(((e + 112u) << 23) | (m << 20));
  return (c & 0x80) != 0 ? -v : v;
}

// Element d of row `row` of `block` (the block's first byte), as f32.
template <DType T>
TANDEM_DEVICE float LoadKv(const uint8_t* block, const KvLayerView& kv, int64_t row, int64_t d) {
  const int64_t i = row * kv.head_dim + d;
  if constexpr (T == DType::kF32) {
    return reinterpret_cast<const float*>(block)[i];
  } else if constexpr (T == DType::kBF16) {
    return Bf16ToFloat(reinterpret_cast<const uint16_t*>(block)[i]);
  } else {
    const float scale = *reinterpret_cast<const float*>(block + KvScaleOffset(kv, row));
    if constexpr (T == DType::kI8) {
      return static_cast<float>(static_cast<int8_t>(block[i])) * scale;
    } else {
      return Fp8E4M3ToFloatScaled(block[i]) * scale;
    }
  }
}

// Row `row` of `block` from `src` (head_dim f32 values, readable by all lanes) by the 32 lanes
// of one warp, `lane` being this thread's: the quantized dtypes reduce the row's max |value|
// across the warp first (every lane must call).
template <DType T>
TANDEM_DEVICE void StoreKvRow(uint8_t* block, const KvLayerView& kv, int64_t row, const float* src,
                              int lane) {
  const int64_t hd = kv.head_dim;
  if constexpr (T == DType::kF32) {
    float* dst = reinterpret_cast<float*>(block) + row * hd;
    for (int64_t d = lane; d < hd; d += 32) dst[d] = src[d];
  } else if constexpr (T == DType::kBF16) {
    uint16_t* dst = reinterpret_cast<uint16_t*>(block) + row * hd;
    for (int64_t d = lane; d < hd; d += 32) dst[d] = FloatToBf16(src[d]);
  } else {
    float amax = 0.0f;
    for (int64_t d = lane; d < hd; d += 32) {
      const float a = src[d] < 0.0f ? -src[d] : src[d];
      amax = a > amax ? a : amax;
    }
    for (int m = 16; m > 0; m >>= 1) {
      const float o = ShflXor(amax, m);
      amax = o > amax ? o : amax;
    }
    uint8_t* dst = block + row * hd;
    float* scale = reinterpret_cast<float*>(block + KvScaleOffset(kv, row));
    if constexpr (T == DType::kI8) {
      const float sc = amax / 127.0f;
      if (lane == 0) *scale = sc;
      for (int64_t d = lane; d < hd; d += 32) {
        float q = sc > 0.0f ? rintf(src[d] / sc) : 0.0f;
        q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
        dst[d] = static_cast<uint8_t>(static_cast<int8_t>(q));
      }
    } else {
      const float sc = amax / 448.0f;
      if (lane == 0) *scale = sc * 256.0f;
      for (int64_t d = lane; d < hd; d += 32) {
        dst[d] = sc > 0.0f ? FloatToFp8E4M3(src[d] / sc) : uint8_t{0};
      }
    }
  }
}

}  // namespace tandem::cuda::dev
