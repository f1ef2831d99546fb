#pragma once

// Element types of quantized KV caches, as distinct types for the kernel templates. Data only:
// no functions (the per-ISA files must not share inline code).

#include <cstdint>

namespace tandem::cpu {

// One fp8 e4m3 (OCP "E4M3FN": bias 7, no infinities, 0x7f/0xff are NaN, max 448) code.
// The kernels' S::Load of these gives the value times 2^-8 (exact: the code is widened as an
// f16 whose exponent is 8 lower); the per-row KV scale carries the 2^8.
struct Fp8E4M3 {
  uint8_t bits;
};

}  // namespace tandem::cpu
