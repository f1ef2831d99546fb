#include "common/base/cpu_features.h"

#include <cpuid.h>
#include <sched.h>

#include <cstdlib>
#include <cstring>
#include <thread>

namespace tandem {
namespace {

CpuFeatures Detect() {
  CpuFeatures f;
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
#if defined(__clang__) && __clang_major__ < 16
  // Clang before 16 does not know "f16c" here: CPUID leaf 1, ECX bit 29.
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  f.f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
#else
  f.f16c = __builtin_cpu_supports("f16c");
#endif
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    f.num_cores = CPU_COUNT(&set);
  } else {
    f.num_cores = static_cast<int>(std::thread::hardware_concurrency());
  }
  if (f.num_cores < 1) f.num_cores = 1;
  return f;
}

SimdLevel DetectLevel() {
  const CpuFeatures& f = GetCpuFeatures();
  SimdLevel level = SimdLevel::kScalar;
  if (f.avx2 && f.fma && f.f16c) level = SimdLevel::kAvx2;
  if (level == SimdLevel::kAvx2 && f.avx512f && f.avx512bw && f.avx512vl)
    level = SimdLevel::kAvx512;
  if (const char* cap = std::getenv("TANDEM_SIMD")) {
    SimdLevel limit = level;
    if (std::strcmp(cap, "scalar") == 0) limit = SimdLevel::kScalar;
    if (std::strcmp(cap, "avx2") == 0) limit = SimdLevel::kAvx2;
    if (limit < level) level = limit;
  }
  return level;
}

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

SimdLevel ActiveSimdLevel() {
  static const SimdLevel level = DetectLevel();
  return level;
}

std::string SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "?";
}

}  // namespace tandem
