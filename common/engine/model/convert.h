#pragma once

#include <cstddef>
#include <cstdint>

#include "common/base/dtype.h"
#include "common/base/thread_pool.h"

namespace tandem {

// Converts n elements from `src` (kF32, kBF16 or kF16) to `dst` (kF32 or kBF16): f16/bf16 -> f32
// is exact, f32 -> bf16 rounds to nearest even (NaN stays NaN), f16 -> bf16 goes through f32.
// Equal dtypes copy. Splits the work over `pool` when it is given and n is large.
void ConvertElements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                     ThreadPool* pool = nullptr);

}  // namespace tandem
