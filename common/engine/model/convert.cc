#include "common/engine/model/convert.h"

#include <cstring>

#include "common/base/half.h"
#include "common/base/log.h"

namespace tandem {
namespace {

// Element i of a source that may sit at any address (a safetensors tensor can start at an odd
// offset): memcpy, which compiles to a plain unaligned load.
template <typename T>
T LoadAt(const void* src, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const uint8_t*>(src) + i * static_cast<int64_t>(sizeof(T)),
              sizeof(T));
  return v;
}

template <typename Load>
void ConvertLoop(const void* src, void* dst, DType dst_dtype, int64_t begin, int64_t end,
                 Load load) {
  if (dst_dtype == DType::kF32) {
    float* out = static_cast<float*>(dst);
    for (int64_t i = begin; i < end; ++i) out[i] = load(src, i);
  } else {
    uint16_t* out = static_cast<uint16_t*>(dst);
    for (int64_t i = begin; i < end; ++i) out[i] = FloatToBf16(load(src, i));
  }
}

void ConvertRange(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t begin,
                  int64_t end) {
  if (begin >= end) return;
  if (src_dtype == dst_dtype) {
    const size_t elem = DTypeSize(src_dtype);
    std::memcpy(static_cast<uint8_t*>(dst) + begin * elem,
                static_cast<const uint8_t*>(src) + begin * elem, (end - begin) * elem);
    return;
  }
  TANDEM_CHECK(dst_dtype == DType::kF32 || dst_dtype == DType::kBF16)
      << "unsupported destination dtype " << DTypeName(dst_dtype);
  switch (src_dtype) {
    case DType::kF32:
      ConvertLoop(src, dst, dst_dtype, begin, end,
                  [](const void* in, int64_t i) { return LoadAt<float>(in, i); });
      return;
    case DType::kBF16:
      ConvertLoop(src, dst, dst_dtype, begin, end,
                  [](const void* in, int64_t i) { return Bf16ToFloat(LoadAt<uint16_t>(in, i)); });
      return;
    case DType::kF16:
      ConvertLoop(src, dst, dst_dtype, begin, end,
                  [](const void* in, int64_t i) { return Fp16ToFloat(LoadAt<uint16_t>(in, i)); });
      return;
    default:
      TLOG(FATAL) << "unsupported source dtype " << DTypeName(src_dtype);
  }
}

}  // namespace

void ConvertElements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                     ThreadPool* pool) {
  constexpr int64_t kParallelThreshold = 1 << 16;
  if (pool == nullptr || pool->size() <= 1 || n < kParallelThreshold) {
    ConvertRange(src, src_dtype, dst, dst_dtype, 0, n);
    return;
  }
  pool->ParallelForGrain(n, 1024, [&](int64_t begin, int64_t end) {
    ConvertRange(src, src_dtype, dst, dst_dtype, begin, end);
  });
}

}  // namespace tandem
