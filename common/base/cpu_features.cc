#include "common/base/cpu_features.h"

#include <sched.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string_view>
#include <thread>

#include "common/base/log.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#elif defined(__aarch64__)
#include <sys/auxv.h>
#endif

namespace tandem {
namespace {

#if defined(__x86_64__)
struct CpuidRegs {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

CpuidRegs Cpuid(unsigned leaf, unsigned subleaf) {
  CpuidRegs r;
  if (__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx) == 0) return CpuidRegs{};
  return r;
}

// XCR0: the register state the OS saves on a context switch (only valid with OSXSAVE).
uint64_t Xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

// Linux keeps AMX tile data off until a process asks (arch_prctl ARCH_REQ_XCOMP_PERM for
// XFEATURE_XTILEDATA, Linux 5.16+); a tile instruction without it faults.
bool RequestAmxPermission() {
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

void DetectX86(CpuFeatures* f) {
  const unsigned max_leaf = Cpuid(0, 0).eax;
  const CpuidRegs l1 = Cpuid(1, 0);
  const bool osxsave = (l1.ecx & (1u << 27)) != 0;
  const uint64_t xcr0 = osxsave ? Xcr0() : 0;
  const bool ymm_state = (xcr0 & 0x6) == 0x6;           // SSE + AVX state
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;         // + opmask, ZMM_Hi256, Hi16_ZMM
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;  // XTILECFG + XTILEDATA
  const bool avx = (l1.ecx & (1u << 28)) != 0 && ymm_state;
  f->fma = avx && (l1.ecx & (1u << 12)) != 0;
  f->f16c = avx && (l1.ecx & (1u << 29)) != 0;
  if (max_leaf < 7) return;
  const CpuidRegs l7 = Cpuid(7, 0);
  const CpuidRegs l7s1 = Cpuid(7, 1);
  f->avx2 = avx && (l7.ebx & (1u << 5)) != 0;
  f->avx_vnni = avx && (l7s1.eax & (1u << 4)) != 0;
  f->avx512f = zmm_state && (l7.ebx & (1u << 16)) != 0;
  f->avx512bw = f->avx512f && (l7.ebx & (1u << 30)) != 0;
  f->avx512vl = f->avx512f && (l7.ebx & (1u << 31)) != 0;
  f->avx512vnni = f->avx512f && (l7.ecx & (1u << 11)) != 0;
  f->avx512bf16 = f->avx512f && (l7s1.eax & (1u << 5)) != 0;
  const bool amx = tile_state && (l7.edx & (1u << 24)) != 0;
  if (amx && RequestAmxPermission()) {
    f->amx_tile = true;
    f->amx_int8 = (l7.edx & (1u << 25)) != 0;
    f->amx_bf16 = (l7.edx & (1u << 22)) != 0;
  }
}
#endif

#if defined(__aarch64__)
void DetectArm(CpuFeatures* f) {
  // Bits of AT_HWCAP / AT_HWCAP2 (Linux arch/arm64/include/uapi/asm/hwcap.h).
  constexpr unsigned long kHwcapAsimd = 1ul << 1, kHwcapAsimdDp = 1ul << 20;
  constexpr unsigned long kHwcap2I8mm = 1ul << 13, kHwcap2Bf16 = 1ul << 14;
  const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
  f->neon = (hw & kHwcapAsimd) != 0;
  f->dotprod = f->neon && (hw & kHwcapAsimdDp) != 0;
  f->i8mm = f->neon && (hw2 & kHwcap2I8mm) != 0;
  f->bf16 = f->neon && (hw2 & kHwcap2Bf16) != 0;
}
#endif

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    // x86: "model name"; aarch64 kernels print "CPU part" codes only, so take what there is.
    for (std::string_view key : {"model name", "Model name", "Hardware"}) {
      if (line.rfind(key, 0) == 0) {
        const size_t colon = line.find(':');
        if (colon != std::string::npos) {
          size_t b = colon + 1;
          while (b < line.size() && line[b] == ' ') ++b;
          return line.substr(b);
        }
      }
    }
  }
#if defined(__aarch64__)
  return "aarch64";
#else
  return "unknown";
#endif
}

CpuFeatures Detect() {
  CpuFeatures f;
#if defined(__x86_64__)
  DetectX86(&f);
#elif defined(__aarch64__)
  DetectArm(&f);
#endif
  f.model = CpuModel();
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    f.num_cores = CPU_COUNT(&set);
  } else {
    f.num_cores = static_cast<int>(std::thread::hardware_concurrency());
  }
  if (f.num_cores < 1) f.num_cores = 1;
  return f;
}

// This architecture's tiers in tier order.
constexpr SimdLevel kTierOrder[] = {
    SimdLevel::kScalar,
#if defined(__x86_64__)
    SimdLevel::kAvx2,       SimdLevel::kAvxVnni, SimdLevel::kAvx512,
    SimdLevel::kAvx512Vnni, SimdLevel::kAmx,
#elif defined(__aarch64__)
    SimdLevel::kNeon,
    SimdLevel::kNeonDotProd,
    SimdLevel::kNeonI8mm,
#endif
};

constexpr SimdLevel kAllLevels[] = {
    SimdLevel::kScalar, SimdLevel::kAvx2,        SimdLevel::kAvxVnni,
    SimdLevel::kAvx512, SimdLevel::kAvx512Vnni,  SimdLevel::kAmx,
    SimdLevel::kNeon,   SimdLevel::kNeonDotProd, SimdLevel::kNeonI8mm,
};

// The name without dashes or underscores, lower case ("AVX512_VNNI" -> "avx512vnni").
std::string Squash(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '-' || c == '_') continue;
    out.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
  }
  return out;
}

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

bool CpuSupportsLevel(SimdLevel level) {
  const CpuFeatures& f = GetCpuFeatures();
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  const bool avx512 = avx2 && f.avx512f && f.avx512bw && f.avx512vl;
  switch (level) {
    case SimdLevel::kScalar:
      return true;
    case SimdLevel::kAvx2:
      return avx2;
    case SimdLevel::kAvxVnni:
      return avx2 && f.avx_vnni;
    case SimdLevel::kAvx512:
      return avx512;
    case SimdLevel::kAvx512Vnni:
      return avx512 && f.avx512vnni;
    case SimdLevel::kAmx:
      return avx512 && f.avx512vnni && f.amx_tile && f.amx_int8 && f.amx_bf16;
    case SimdLevel::kNeon:
      return f.neon;
    case SimdLevel::kNeonDotProd:
      return f.neon && f.dotprod;
    case SimdLevel::kNeonI8mm:
      return f.neon && f.dotprod && f.i8mm;
  }
  return false;
}

std::vector<SimdLevel> SupportedSimdLevelsOfCpu() {
  std::vector<SimdLevel> out;
  for (SimdLevel l : kTierOrder) {
    if (CpuSupportsLevel(l)) out.push_back(l);
  }
  return out;
}

SimdLevel ResolveSimdLevel(const char* cap, std::string* warning) {
  const std::vector<SimdLevel> supported = SupportedSimdLevelsOfCpu();
  SimdLevel best = supported.back();
  if (cap == nullptr || cap[0] == '\0') return best;
  const std::string want = Squash(cap);
  int limit = -1;  // position of the named tier in this architecture's order
  for (int i = 0; i < static_cast<int>(std::size(kTierOrder)); ++i) {
    if (Squash(SimdLevelName(kTierOrder[i])) == want) limit = i;
  }
  if (limit < 0) {
    bool other_arch = false;
    for (SimdLevel l : kAllLevels) other_arch = other_arch || Squash(SimdLevelName(l)) == want;
    if (warning != nullptr) {
      *warning = std::string("TANDEM_SIMD=") + cap +
                 (other_arch ? " is a tier of another architecture" : " is no tier") + "; using " +
                 SimdLevelName(best);
    }
    return best;
  }
  SimdLevel chosen = SimdLevel::kScalar;
  for (int i = 0; i <= limit; ++i) {
    if (CpuSupportsLevel(kTierOrder[i])) chosen = kTierOrder[i];
  }
  if (chosen != kTierOrder[limit] && warning != nullptr) {
    *warning = std::string("TANDEM_SIMD=") + cap + ": this CPU lacks the " +
               SimdLevelName(kTierOrder[limit]) + " tier; using " + SimdLevelName(chosen);
  }
  return chosen;
}

SimdLevel ActiveSimdLevel() {
  static const SimdLevel level = [] {
    std::string warning;
    const SimdLevel l = ResolveSimdLevel(std::getenv("TANDEM_SIMD"), &warning);
    if (!warning.empty()) {
      TLOG(WARNING) << warning;
    }
    return l;
  }();
  return level;
}

std::string SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvxVnni:
      return "avx-vnni";
    case SimdLevel::kAvx512:
      return "avx512";
    case SimdLevel::kAvx512Vnni:
      return "avx512-vnni";
    case SimdLevel::kAmx:
      return "amx";
    case SimdLevel::kNeon:
      return "neon";
    case SimdLevel::kNeonDotProd:
      return "neon-dotprod";
    case SimdLevel::kNeonI8mm:
      return "neon-i8mm";
  }
  return "?";
}

}  // namespace tandem
