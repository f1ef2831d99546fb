#pragma once

// int8 MatMul inputs (MatMulWeight::input_dtype == kI8; int8 and int4 weights only): each row of
// x is quantized to int8 codes with one f32 scale per row (dynamic per-token quantization, as in
// W8A8 serving), and the products are integer dot products on every tier but scalar (AVX2
// vpmaddubsw, AVX-VNNI and AVX512_VNNI vpdpbusd, AVX-512 vpmaddubsw, NEON smull / sdot / usdot;
// README "Tiers"; e.g. vpdpbusd: 64 u8 x s8 products per instruction, summed in fours into 16
// int32 lanes). With quantized weights the
// bf16 path spends more instructions widening weights than multiplying; here both weight
// formats come in WeightLayout::kTiles16 (common/base/quant.h), 16 weight rows in the 16 lanes:
// one vpdpbusd per 64 products per input row against 4 input codes broadcast, int8 weights as
// stored (q + 128), int4 nibbles after a mask or a shift.
//
// Numerics (the reference below is the specification and the scalar tier's path; every tier's
// kernel equals it bit for bit):
// - Row m: amax = max |x|; d = amax / 127; codes a = clamp(round_half_even(x * (127 / amax)),
//   -127, 127) (all 0 and d = 0 when amax is 0 or below 127 / FLT_MAX, where 127 / amax
//   overflows, or the row holds a NaN or an infinity).
// - int8 weights (codes w, row scale s): dot = sum_k w_k a_k, exact in int32 (K <= 65536)
//   however it is summed (as (w + 128) * a - 128 sum(a)); y = ((float(dot) * d) * s) + bias.
// - int4 weights (WeightLayout::kTiles16; codes q in [0, 15], group scale s_g, zero z_g): per
//   output, dot_g = sum of q_k a_k over the group's elements (exact in int32), then for
//   g = 0, 1, .. from r = zc = 0: r = fma(float(dot_g), s_g, r) and zc = fma(s_g * z_g, A_g, zc),
//   A_g = the sum of the group's input codes; y = ((r - zc) * d) + bias. (The VNNI kernel keeps
//   16 rows of a tile in the 16 lanes, so the group scales are one vector load per group.)
// - reduce_add is _mm512_reduce_add_ps's fixed tree; every order is fixed per output, so
//   results are batch-invariant.

#include <cstdint>
#include <vector>

#include "common/base/quant.h"
#include "common/base/thread_pool.h"
#include "common/engine/backend/cpu/kernels/kernels.h"

namespace tandem::cpu::internal {

// Longest rows for which the int32 sums are exact (255 * 127 * K < 2^31).
constexpr int64_t kI8MaxK = kMatMulI8MaxK;

// Quantized inputs of M rows, codes in element order.
struct I8Inputs {
  WeightQuant quant = WeightQuant::kNone;
  int64_t M = 0;
  int64_t K = 0;
  int64_t chunk = 0;                  // elements per chunk: 64 (int8 weights) or 32 (int4)
  int64_t chunks = 0;                 // chunks per row
  int64_t groups = 0;                 // int4: weight groups per row
  const int8_t* codes = nullptr;      // [M][chunks * chunk], zero past K
  const float* scale = nullptr;       // [M] d
  const int32_t* sum = nullptr;       // int8: [M] sum of the codes
  const float* group_sums = nullptr;  // int4: [M][groups] A_g (exact integers)
};

// Owns an I8Inputs' memory; reused across calls (grows only).
struct I8InputBuffer {
  std::vector<int8_t> codes;
  std::vector<float> scale;
  std::vector<int32_t> sum;
  std::vector<float> group_sums;
};

// One input row of K elements: its codes (in `codes`, which the caller has zeroed), *scale = d,
// *sum = sum of the codes and, for int4, group_sums[g] = the sums per weight group (left as they
// are when the row quantizes to nothing).
using QuantizeRowI8Fn = void (*)(const float* x, int64_t K, bool int4, int64_t group_size,
                                 int8_t* codes, float* scale, int32_t* sum, float* group_sums);

// Quantizes x [M, K] (row stride ldx) for weight w (kInt8 or kInt4) into `buffer`, one row at a
// time with `row` (QuantizeRowI8Reference when nullptr; every row function gives the same bits);
// rows split over `pool` when there are enough elements.
I8Inputs QuantizeInputsI8(const float* x, int64_t M, int64_t K, int64_t ldx, const MatMulWeight& w,
                          I8InputBuffer* buffer, QuantizeRowI8Fn row = nullptr,
                          ThreadPool* pool = nullptr);

// Below this many input elements QuantizeInputsI8 stays on the calling thread.
constexpr int64_t kQuantizeMinParallelElements = int64_t{1} << 16;

// QuantizeRowI8Scale: d and 127 / amax from a row's max |x| and whether every element is
// finite; false when the row quantizes to nothing. The row functions: the reference (scalar),
// AVX2 (kernels_avx2_i8.cc) and AVX-512 (kernels_avx512vnni.cc; AVX512F/BW/VL CPUs only).
bool QuantizeRowI8Scale(float amax, bool finite, float* scale, float* inv);
void QuantizeRowI8Reference(const float* x, int64_t K, bool int4, int64_t group_size, int8_t* codes,
                            float* scale, int32_t* sum, float* group_sums);
void QuantizeRowI8Avx2(const float* x, int64_t K, bool int4, int64_t group_size, int8_t* codes,
                       float* scale, int32_t* sum, float* group_sums);
void QuantizeRowI8Avx512(const float* x, int64_t K, bool int4, int64_t group_size, int8_t* codes,
                         float* scale, int32_t* sum, float* group_sums);

// y[m, n] for n in [n0, n1), as specified above: the scalar reference (the path of tiers
// without an integer dot-product kernel) and the kernels of the tiers that have one, each
// callable only on a CPU with its tier (kernels README, "Tiers"): AVX2 (vpmaddubsw + vpmaddwd,
// kernels_avx2_i8.cc), AVX-VNNI (kernels_avxvnni_i8.cc), AVX-512 without VNNI (vpmaddubsw,
// kernels_avx512_i8.cc), AVX512_VNNI (kernels_avx512vnni.cc), NEON dotprod / i8mm
// (kernels_neon_i8.cc).
using MatMulI8Fn = void (*)(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                            const float* bias, float* y, int64_t ldy);
void MatMulI8Reference(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                       const float* bias, float* y, int64_t ldy);
void MatMulI8Avx2(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                  const float* bias, float* y, int64_t ldy);
void MatMulI8AvxVnni(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                     const float* bias, float* y, int64_t ldy);
void MatMulI8Avx512(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                    const float* bias, float* y, int64_t ldy);
void MatMulI8Avx512Vnni(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                        const float* bias, float* y, int64_t ldy);

}  // namespace tandem::cpu::internal
