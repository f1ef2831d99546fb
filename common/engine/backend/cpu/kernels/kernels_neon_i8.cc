// MatMul with int8 inputs on baseline aarch64 NEON (smull + saddlp; i8_tiles_neon.h) and the
// input quantizer's row function on NEON, equal to MatMulI8Reference and QuantizeRowI8Reference
// bit for bit: the neon tier's, and the quantizer of every aarch64 tier. Everything here has
// internal linkage except MatMulI8NeonBase and QuantizeRowI8Neon (README, "ODR").

#define TANDEM_I8_NEON_MODE 0
#include "common/engine/backend/cpu/kernels/i8_tiles_neon.h"

namespace tandem::cpu::internal {

void MatMulI8NeonBase(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                      const float* bias, float* y, int64_t ldy) {
  MatMulI8Neon(in, w, n0, n1, bias, y, ldy);
}

void QuantizeRowI8Neon(const float* x, int64_t K, bool int4, int64_t group_size, int8_t* codes,
                       float* scale, int32_t* sum, float* group_sums) {
  *sum = 0;
  const int64_t kmain = K - K % 4;
  const float32x4_t big = vdupq_n_f32(__FLT_MAX__);  // not std::numeric_limits (README, "ODR")
  float32x4_t vmax = vdupq_n_f32(0.0f);
  uint32x4_t good = vdupq_n_u32(~0u);  // lanes that saw only values <= FLT_MAX (no NaN, inf)
  const auto load = [&](int64_t k) {
    if (k < kmain) return vld1q_f32(x + k);
    float buf[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t i = k; i < K; ++i) buf[i - k] = x[i];
    return vld1q_f32(buf);
  };
  for (int64_t k = 0; k < K; k += 4) {
    const float32x4_t a = vabsq_f32(load(k));
    good = vandq_u32(good, vcleq_f32(a, big));
    vmax = vmaxq_f32(vmax, a);  // exact whatever the order once every element is finite
  }
  float inv = 0.0f;
  const bool finite = vminvq_u32(good) != 0;
  if (!QuantizeRowI8Scale(vmaxvq_f32(vmax), finite, scale, &inv)) return;
  const float32x4_t vinv = vdupq_n_f32(inv);
  const float32x4_t hi = vdupq_n_f32(127.0f), lo = vdupq_n_f32(-127.0f);
  int32x4_t total = vdupq_n_s32(0), group = vdupq_n_s32(0);
  for (int64_t k = 0; k < K; k += 4) {
    const float32x4_t v = vrndnq_f32(vmulq_f32(load(k), vinv));
    const int32x4_t q = vcvtq_s32_f32(vmaxq_f32(vminq_f32(v, hi), lo));  // integral: exact
    total = vaddq_s32(total, q);
    int32_t lanes[4];
    vst1q_s32(lanes, q);
    for (int i = 0; i < 4 && k + i < K; ++i) codes[k + i] = static_cast<int8_t>(lanes[i]);
    if (int4) {
      group = vaddq_s32(group, q);
      if ((k + 4) % group_size == 0 || k + 4 >= K) {  // a group holds whole 4s (>= 32)
        group_sums[k / group_size] = static_cast<float>(vaddvq_s32(group));
        group = vdupq_n_s32(0);
      }
    }
  }
  *sum = vaddvq_s32(total);
}

}  // namespace tandem::cpu::internal
