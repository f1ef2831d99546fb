#pragma once

#include <string>

namespace tandem {

// Instruction-set levels the CPU kernels dispatch on at run time.
enum class SimdLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512bf16 = false;
  bool avx512vnni = false;
  int num_cores = 1;  // online CPUs usable by this process
};

const CpuFeatures& GetCpuFeatures();

// Best level this CPU supports, capped by the TANDEM_SIMD environment variable
// ("scalar", "avx2", "avx512") so tests can exercise the lower paths.
SimdLevel ActiveSimdLevel();
std::string SimdLevelName(SimdLevel level);

}  // namespace tandem
