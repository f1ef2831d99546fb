// MatMul with int8 inputs on aarch64 i8mm (usdot; i8_tiles_neon.h), equal to MatMulI8Reference
// bit for bit. Compiled with the neon-i8mm tier's flags only (CMakeLists.txt); everything here has
// internal linkage except MatMulI8NeonI8mm (README, "ODR").

#define TANDEM_I8_NEON_MODE 2
#include "common/engine/backend/cpu/kernels/i8_tiles_neon.h"

namespace tandem::cpu::internal {

void MatMulI8NeonI8mm(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                      const float* bias, float* y, int64_t ldy) {
  MatMulI8Neon(in, w, n0, n1, bias, y, ldy);
}

}  // namespace tandem::cpu::internal
