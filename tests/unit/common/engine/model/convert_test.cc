// Element conversion at load (convert.h): exact widening, round-to-nearest-even narrowing, and
// sources at any address (a safetensors tensor may start at an odd offset; UBSan found typed
// loads there).

#include "common/engine/model/convert.h"

#include <cstring>
#include <vector>

#include "common/base/half.h"
#include "common/base/thread_pool.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ConvertTest, MisalignedSourcesConvertLikeAlignedOnes) {
  constexpr int64_t kN = 100000;  // above the threaded threshold too
  std::vector<float> values(kN);
  for (int64_t i = 0; i < kN; ++i) values[i] = static_cast<float>(i % 977) * 0.37f - 150.0f;
  std::vector<uint16_t> bf16(kN), f16(kN);
  for (int64_t i = 0; i < kN; ++i) {
    bf16[i] = FloatToBf16(values[i]);
    f16[i] = FloatToFp16(values[i]);
  }
  ThreadPool pool(2);
  for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
    for (int offset : {1, 3}) {
      struct Source {
        const void* data;
        size_t bytes;
        DType dtype;
      };
      for (const Source& src :
           {Source{values.data(), kN * 4, DType::kF32}, Source{bf16.data(), kN * 2, DType::kBF16},
            Source{f16.data(), kN * 2, DType::kF16}}) {
        std::vector<uint8_t> shifted(src.bytes + offset);
        std::memcpy(shifted.data() + offset, src.data, src.bytes);
        for (DType dst : {DType::kF32, DType::kBF16}) {
          const size_t out_bytes = kN * DTypeSize(dst);
          std::vector<uint8_t> want(out_bytes), got(out_bytes);
          ConvertElements(src.data, src.dtype, want.data(), dst, kN, p);
          ConvertElements(shifted.data() + offset, src.dtype, got.data(), dst, kN, p);
          EXPECT_EQ(std::memcmp(want.data(), got.data(), out_bytes), 0)
              << DTypeName(src.dtype) << " -> " << DTypeName(dst) << " offset " << offset;
        }
      }
    }
  }
  // Spot-check the values themselves: bf16 -> f32 is exact.
  std::vector<float> out(kN);
  ConvertElements(bf16.data(), DType::kBF16, out.data(), DType::kF32, kN, nullptr);
  for (int64_t i = 0; i < kN; i += 997) EXPECT_EQ(out[i], Bf16ToFloat(bf16[i]));
}

}  // namespace
}  // namespace tandem
