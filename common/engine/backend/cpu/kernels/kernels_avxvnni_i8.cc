// MatMul with int8 inputs on AVX-VNNI (vpdpbusd on 256-bit vectors; i8_tiles_256.h), equal to
// MatMulI8Reference bit for bit. Compiled with the AVX-VNNI tier's flags only (CMakeLists.txt);
// everything here has internal linkage except MatMulI8AvxVnni (README, "ODR").

#include "common/engine/backend/cpu/kernels/i8_tiles_256.h"

#if !defined(__AVXVNNI__)
#error "kernels_avxvnni_i8.cc needs -mavxvnni"
#endif

namespace tandem::cpu::internal {

void MatMulI8AvxVnni(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                     const float* bias, float* y, int64_t ldy) {
  MatMulI8Tiles256<true>(in, w, n0, n1, bias, y, ldy);
}

}  // namespace tandem::cpu::internal
