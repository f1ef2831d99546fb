// MatMul with int8 inputs on AVX-512 without VNNI (vpmaddubsw + vpmaddwd; i8_tiles_512.h), equal
// to MatMulI8Reference bit for bit: the avx512 tier (Skylake-SP, Cascade Lake without VNNI use).
// Compiled with that tier's flags only (see CMakeLists.txt); everything here has internal linkage
// except MatMulI8Avx512 (README.md, "ODR").

#define TANDEM_I8_512_VNNI 0
#include "common/engine/backend/cpu/kernels/i8_tiles_512.h"

namespace tandem::cpu::internal {

void MatMulI8Avx512(const I8Inputs& in, const MatMulWeight& w, int64_t n0, int64_t n1,
                    const float* bias, float* y, int64_t ldy) {
  if (in.quant == WeightQuant::kInt4) {
    RangeOf<WeightQuant::kInt4>(in, w, n0, n1, bias, y, ldy);
  } else {
    RangeOf<WeightQuant::kInt8>(in, w, n0, n1, bias, y, ldy);
  }
}

}  // namespace tandem::cpu::internal
