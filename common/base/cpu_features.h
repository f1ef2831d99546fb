#pragma once

#include <string>
#include <vector>

namespace tandem {

// Instruction-set tiers the CPU kernels dispatch on at run time (kernels README, "Tiers"). Each
// tier names what its kernels may execute; a CPU supports a tier when it has every feature the
// tier needs. Per architecture the tiers are ordered (x86-64: scalar < avx2 < avx-vnni < avx512 <
// avx512-vnni < amx; aarch64: scalar < neon < neon-dotprod < neon-i8mm), and the kernels use the
// last supported one in that order, or the last supported one at or below TANDEM_SIMD.
enum class SimdLevel {
  kScalar = 0,
  // x86-64.
  kAvx2 = 1,        // AVX2 + FMA + F16C
  kAvxVnni = 2,     // + AVX-VNNI (vpdpbusd on 256-bit vectors; Alder Lake, Zen 5 client)
  kAvx512 = 3,      // AVX2 tier + AVX-512 F/BW/VL (no VNNI used; Skylake-SP)
  kAvx512Vnni = 4,  // + AVX512_VNNI (and AVX512_BF16 where the CPU has it; Ice Lake, Zen 4/5)
  kAmx = 5,         // + AMX-TILE/INT8/BF16, granted by the kernel (Sapphire Rapids)
  // aarch64.
  kNeon = 6,         // Advanced SIMD (every aarch64 CPU)
  kNeonDotProd = 7,  // + dotprod (sdot / udot)
  kNeonI8mm = 8,     // + i8mm (usdot)
};

struct CpuFeatures {
  // x86-64 (CPUID, with the OS saving the registers each needs: XCR0).
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx_vnni = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512bf16 = false;
  bool avx512vnni = false;
  bool amx_tile = false;  // AMX-TILE with the kernel's permission for tile data (arch_prctl)
  bool amx_int8 = false;
  bool amx_bf16 = false;
  // aarch64 (getauxval HWCAP / HWCAP2).
  bool neon = false;
  bool dotprod = false;
  bool i8mm = false;
  bool bf16 = false;
  int num_cores = 1;  // online CPUs usable by this process
  std::string model;  // the CPU's model name (/proc/cpuinfo), for logs and reports
};

const CpuFeatures& GetCpuFeatures();

// Whether this CPU has every feature `level` needs.
bool CpuSupportsLevel(SimdLevel level);

// Tiers of this machine's architecture that this CPU supports, in tier order (scalar first).
std::vector<SimdLevel> SupportedSimdLevelsOfCpu();

// The tier the kernels use: the last supported one, or with TANDEM_SIMD=<name> (SimdLevelName's
// names; "avx512vnni" and the like without dashes too) the last supported one at or below it in
// the tier order (a warning is logged when the named tier is unknown or not supported here).
SimdLevel ActiveSimdLevel();
// The tier `cap` asks for, resolved as for TANDEM_SIMD (nullptr or "": the best supported).
SimdLevel ResolveSimdLevel(const char* cap, std::string* warning);
std::string SimdLevelName(SimdLevel level);

// Spin-wait hint (x86 pause, aarch64 yield).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

}  // namespace tandem
