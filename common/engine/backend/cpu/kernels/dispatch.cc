// Public entry points of the CPU kernels: pick the ISA table, split work among pool threads,
// hand out per-thread scratch. Compiled with the baseline flags; no arithmetic happens here
// except the attention scale and the rounding of bf16 MatMul inputs (the same bit operations on
// every ISA), so results depend only on the ISA table in use.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "common/base/half.h"
#include "common/base/log.h"
#include "common/engine/backend/cpu/kernels/int8_inputs.h"
#include "common/engine/backend/cpu/kernels/kernels.h"
#include "common/engine/backend/cpu/kernels/tiers.h"

namespace tandem::cpu {
namespace internal {
namespace {

// The kernels of each tier this build has (kernels README, "Tiers").
std::vector<TierKernels> BuildTiers() {
  std::vector<TierKernels> tiers;
  tiers.push_back({SimdLevel::kScalar, &ScalarKernels(), nullptr, nullptr, false});
#if defined(__x86_64__)
  tiers.push_back({SimdLevel::kAvx2, &Avx2Kernels(), &MatMulI8Avx2, &QuantizeRowI8Avx2, false});
  tiers.push_back(
      {SimdLevel::kAvxVnni, &Avx2Kernels(), &MatMulI8AvxVnni, &QuantizeRowI8Avx2, false});
  tiers.push_back(
      {SimdLevel::kAvx512, &Avx512Kernels(), &MatMulI8Avx512, &QuantizeRowI8Avx512, false});
  tiers.push_back({SimdLevel::kAvx512Vnni, &Avx512Kernels(), &MatMulI8Avx512Vnni,
                   &QuantizeRowI8Avx512, GetCpuFeatures().avx512bf16});
#elif defined(__aarch64__)
  tiers.push_back({SimdLevel::kNeon, &NeonKernels(), &MatMulI8NeonBase, &QuantizeRowI8Neon, false});
  tiers.push_back(
      {SimdLevel::kNeonDotProd, &NeonKernels(), &MatMulI8NeonDot, &QuantizeRowI8Neon, false});
  tiers.push_back(
      {SimdLevel::kNeonI8mm, &NeonKernels(), &MatMulI8NeonI8mm, &QuantizeRowI8Neon, false});
#endif
  return tiers;
}

const std::vector<TierKernels>& AllTiers() {
  static const std::vector<TierKernels> tiers = BuildTiers();
  return tiers;
}

const TierKernels* FindTier(SimdLevel level) {
  for (const TierKernels& t : AllTiers()) {
    if (t.level == level) return &t;
  }
  return nullptr;
}

// The tier the public entry points use by default: the best implemented tier at or below
// ActiveSimdLevel() whose integer kernels pass SelfCheckTier (a tier whose kernels give wrong
// bits on this CPU is logged and skipped, never used).
const TierKernels* DefaultTier() {
  static const TierKernels* const tier = [] {
    const TierKernels* chosen = &AllTiers().front();
    for (const TierKernels& t : AllTiers()) {
      if (!CpuSupportsLevel(t.level) || t.level > ActiveSimdLevel()) continue;
      std::string error;
      if (!SelfCheckTier(t, &error)) {
        TLOG(ERROR) << "cpu kernels: the " << SimdLevelName(t.level)
                    << " tier fails its self-check on this CPU (" << error << "); not used";
        continue;
      }
      chosen = &t;
    }
    if (chosen->level != ActiveSimdLevel()) {
      TLOG(WARNING) << "cpu kernels: the " << SimdLevelName(ActiveSimdLevel())
                    << " tier has no kernels in this build (or failed its self-check); using "
                    << SimdLevelName(chosen->level);
    }
    return chosen;
  }();
  return tier;
}

std::atomic<const TierKernels*> g_override{nullptr};

}  // namespace

const TierKernels& ActiveTier() {
  if (const TierKernels* t = g_override.load(std::memory_order_acquire)) return *t;
  return *DefaultTier();
}

const KernelTable& ActiveKernels() { return *ActiveTier().f32; }

std::vector<SimdLevel> SupportedSimdLevels() {
  std::vector<SimdLevel> levels;
  for (const TierKernels& t : AllTiers()) {
    if (CpuSupportsLevel(t.level)) levels.push_back(t.level);
  }
  return levels;
}

std::vector<SimdLevel> BuiltSimdLevels() {
  std::vector<SimdLevel> levels;
  for (const TierKernels& t : AllTiers()) levels.push_back(t.level);
  return levels;
}

bool SetSimdLevelForTesting(SimdLevel level) {
  const TierKernels* t = FindTier(level);
  if (t == nullptr || !CpuSupportsLevel(level)) return false;
  g_override.store(t, std::memory_order_release);
  return true;
}

void ResetSimdLevelForTesting() { g_override.store(nullptr, std::memory_order_release); }

SimdLevel CurrentSimdLevel() { return ActiveTier().level; }

}  // namespace internal

namespace {

// Per-thread scratch that only grows: no allocation per call once warm.
float* ThreadScratch(int64_t floats) {
  thread_local std::vector<float> buffer;
  if (static_cast<int64_t>(buffer.size()) < floats) buffer.resize(floats);
  return buffer.data();
}

// Per-thread bf16 scratch, likewise: MatMul inputs rounded to bf16 (the calling thread's, read by
// every thread of the call) and weight blocks dequantized to bf16 (each thread its own).
uint16_t* GrowBf16(std::vector<uint16_t>& buffer, int64_t elems) {
  if (static_cast<int64_t>(buffer.size()) < elems) buffer.resize(elems);
  return buffer.data();
}
uint16_t* InputScratchBf16(int64_t elems) {
  thread_local std::vector<uint16_t> buffer;
  return GrowBf16(buffer, elems);
}
uint16_t* WeightScratchBf16(int64_t elems) {
  thread_local std::vector<uint16_t> buffer;
  return GrowBf16(buffer, elems);
}

// Quantized weights with bf16 inputs are dequantized this many rows (of 256 KiB of bf16) at a
// time, at least 8 (any block size gives the same bits).
int64_t DequantBlockRows(int64_t K) {
  const int64_t rows = K > 0 ? (int64_t{256} << 10) / (2 * K) : 8;
  return rows < 8 ? 8 : rows;
}

// Rows [n0, n1) of a quantized weight as bf16 (rows of K from out), the same values as the
// AVX512_BF16 kernel's: int8 codes and fp8 codes' values themselves (exact; the row scale is
// applied to the finished dot product), int4 the f32 dequantized value (one exact product, quant.h)
// rounded to nearest even. The path for CPUs without AVX512_BF16.
void DequantRowsBf16(const MatMulWeight& w, int64_t K, int64_t n0, int64_t n1, uint16_t* out) {
  const int64_t groups = w.quant == WeightQuant::kInt4 ? Int4Groups(K, w.group_size) : 0;
  for (int64_t n = n0; n < n1; ++n) {
    uint16_t* o = out + (n - n0) * K;
    if (w.quant == WeightQuant::kInt8) {
      const int8_t* q = static_cast<const int8_t*>(w.data) + n * K;
      for (int64_t k = 0; k < K; ++k) o[k] = FloatToBf16(static_cast<float>(q[k]));
    } else if (w.quant == WeightQuant::kFp8) {  // e4m3 values are exact in bf16
      const uint8_t* q = static_cast<const uint8_t*>(w.data) + n * K;
      for (int64_t k = 0; k < K; ++k) o[k] = FloatToBf16(Fp8E4M3Value(q[k]));
    } else {
      const uint8_t* q = static_cast<const uint8_t*>(w.data) + n * Int4RowBytes(K);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t g = n * groups + k / w.group_size;
        const float v = static_cast<float>(Int4RowCode(q, k)) - w.zeros[g];
        o[k] = FloatToBf16(v * w.scales[g]);
      }
    }
  }
}

// Rows [n0, n1) of a dense bf16 weight in kTiles16 as rows of K elements from `out`: the path for
// CPUs without AVX512_BF16.
void RowsFromBf16Tiles(const MatMulWeight& w, int64_t K, int64_t n0, int64_t n1, uint16_t* out) {
  const auto* tiles = static_cast<const uint16_t*>(w.data);
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t k = 0; k < K; ++k) out[(n - n0) * K + k] = tiles[Bf16TileIndex(K, n, k)];
  }
}

// Below this many multiply-adds a MatMul runs on the calling thread only (waking the pool costs
// more than it saves). Which thread computes an output never changes its value.
constexpr int64_t kMatMulMinParallelMacs = 1 << 15;
// Columns are split among threads in multiples of this (any split gives the same bits).
constexpr int64_t kMatMulColumnGrain = 16;
// For a lone row over weights in tiles of 16 rows: the tile kernels' lone-row register tile (4
// tiles, 4 weight streams), so that no range ends in a register tile of fewer streams (with a
// grain of 16, a projection of 768 columns went out in ranges of 3 tiles: 3-stream register
// tiles throughout).
constexpr int64_t kMatMulLoneRowTileGrain = 64;
// Up to this many activation rows (decode batches), columns go out in several small ranges per
// thread, so that a thread another process delays has its share taken by the others. Above it
// (prefill), one range per thread: every range re-reads all the activations, which costs more
// than the finer split saves on an idle machine.
constexpr int64_t kMatMulFineSplitRows = 32;

// Runs fn(n0, n1) over column ranges covering [0, N), on the pool when the call is big enough.
template <class Fn>
void ForColumns(ThreadPool* pool, int64_t M, int64_t N, int64_t K, WeightLayout layout,
                const Fn& fn) {
  if (pool == nullptr || pool->size() == 1 || M * N * K < kMatMulMinParallelMacs) {
    fn(0, N);
    return;
  }
  int64_t grain =
      M == 1 && layout == WeightLayout::kTiles16 ? kMatMulLoneRowTileGrain : kMatMulColumnGrain;
  if (M > kMatMulFineSplitRows) {
    const int64_t per_thread = (N + pool->size() - 1) / pool->size();
    grain = (per_thread + kMatMulColumnGrain - 1) / kMatMulColumnGrain * kMatMulColumnGrain;
  }
  pool->ParallelForGrain(N, grain, fn);
}

// Elements below which a row-wise op runs on the caller alone: a fork/join costs a few us, a
// thread does ~1-2 G elements/s of these ops.
constexpr int64_t kRowsMinParallelElements = int64_t{1} << 16;

// Runs fn(m0, m1) over row ranges covering [0, M), on the pool when the call is big enough.
template <class Fn>
void ForRows(ThreadPool* pool, int64_t M, int64_t row_elements, const Fn& fn) {
  if (pool == nullptr || pool->size() == 1 || M < 2 ||
      M * row_elements < kRowsMinParallelElements) {
    fn(0, M);
    return;
  }
  pool->ParallelFor(M, fn);
}

void CheckKvType(DType t) {
  TANDEM_CHECK(t == DType::kF32 || t == DType::kBF16 || t == DType::kI8 || t == DType::kF8E4M3)
      << "KV cache dtype must be f32, bf16, i8 or f8e4m3, got " << DTypeName(t);
}

void CheckFloatType(DType t, const char* what) {
  TANDEM_CHECK(t == DType::kF32 || t == DType::kBF16)
      << what << " dtype must be f32 or bf16, got " << DTypeName(t);
}

}  // namespace

int64_t MatMulWeight::RowBytes(int64_t K) const {
  switch (quant) {
    case WeightQuant::kInt8:
    case WeightQuant::kFp8:
      return K;
    case WeightQuant::kInt4:
      return Int4RowBytes(K);
    case WeightQuant::kNone:
      break;
  }
  return K * static_cast<int64_t>(DTypeSize(dtype));
}

namespace {

void CheckWeight(const MatMulWeight& w, int64_t K) {
  switch (w.quant) {
    case WeightQuant::kNone:
      CheckFloatType(w.dtype, "MatMul weight");
      TANDEM_CHECK(w.layout == WeightLayout::kRows ||
                   (w.dtype == DType::kBF16 && w.input_dtype == DType::kBF16))
          << "dense MatMul weights in the kTiles16 layout are bf16 and take bf16 inputs";
      break;
    case WeightQuant::kInt8:
      TANDEM_CHECK(w.scales != nullptr) << "int8 MatMul weight without scales";
      break;
    case WeightQuant::kFp8:
      TANDEM_CHECK(w.scales != nullptr && w.layout == WeightLayout::kRows &&
                   w.input_dtype != DType::kI8)
          << "fp8 MatMul weights need scales, the kRows layout and f32 or bf16 inputs";
      break;
    case WeightQuant::kInt4:
      // kTiles16 holds the scales and zeros in the tiles.
      TANDEM_CHECK(
          (w.layout == WeightLayout::kTiles16 || (w.scales != nullptr && w.zeros != nullptr)) &&
          w.group_size >= kInt4Chunk && (w.group_size & (w.group_size - 1)) == 0)
          << "int4 MatMul weight needs scales, zeros and a power-of-two group >= 32, got group "
          << w.group_size;
      break;
  }
  TANDEM_CHECK(w.quant == WeightQuant::kNone ||
               (w.layout == WeightLayout::kTiles16) == (w.input_dtype == DType::kI8))
      << "quantized MatMul weights take int8 inputs in the kTiles16 layout and f32 or bf16 "
         "inputs in kRows";
  const bool quantized = w.quant != WeightQuant::kNone;
  TANDEM_CHECK(w.input_dtype == DType::kF32 ||
               (w.input_dtype == DType::kBF16 && (quantized || w.dtype == DType::kBF16)) ||
               (w.input_dtype == DType::kI8 && quantized))
      << "MatMul input dtype " << DTypeName(w.input_dtype)
      << ": bf16 inputs need bf16, int8 or int4 weights, int8 inputs int8 or int4 weights, f32 "
         "inputs any weights";
  TANDEM_CHECK(w.input_dtype != DType::kI8 || K <= internal::kI8MaxK)
      << "int8 MatMul inputs: K " << K << " exceeds " << internal::kI8MaxK;
}

// Whether weights a and b take the input in the same prepared form (MatMulShared prepares it
// once): the same input dtype and, for int8 inputs, the same code layout.
bool SameInputs(const MatMulWeight& a, const MatMulWeight& b) {
  if (a.input_dtype != b.input_dtype) return false;
  if (a.input_dtype != DType::kI8) return true;
  return a.quant == b.quant && (a.quant != WeightQuant::kInt4 || a.group_size == b.group_size);
}

}  // namespace

MatMulPath MatMulPathOf(const MatMulWeight& w) {
  const internal::TierKernels& t = internal::ActiveTier();
  const bool quantized = w.quant != WeightQuant::kNone;
  if (w.input_dtype == DType::kI8) {
    return t.matmul_i8 != nullptr ? MatMulPath::kI8Dot : MatMulPath::kI8Reference;
  }
  if (w.input_dtype == DType::kBF16) {
    // fp8 rows: the generic bf16 path on every tier (the bf16 dot kernels read no fp8 rows).
    return t.bf16_dot && w.quant != WeightQuant::kFp8 ? MatMulPath::kBf16Dot
                                                      : MatMulPath::kBf16ViaF32;
  }
  return quantized ? MatMulPath::kF32Dequant : MatMulPath::kF32;
}

const char* MatMulPathName(MatMulPath p) {
  switch (p) {
    case MatMulPath::kF32:
      return "f32-fma";
    case MatMulPath::kF32Dequant:
      return "f32-dequant-fma";
    case MatMulPath::kBf16Dot:
      return "bf16-dot";
    case MatMulPath::kBf16ViaF32:
      return "bf16-via-f32";
    case MatMulPath::kI8Dot:
      return "int8-dot";
    case MatMulPath::kI8Reference:
      return "int8-reference";
  }
  return "?";
}

DType AutoMatMulInputDtype(WeightQuant quant, DType dtype) {
  const internal::TierKernels& t = internal::ActiveTier();
  if (quant == WeightQuant::kFp8) return DType::kF32;  // the SIMD dequantizing FMA kernels
  if (quant != WeightQuant::kNone) {
    if (t.matmul_i8 != nullptr) return DType::kI8;
    return t.bf16_dot ? DType::kBF16 : DType::kF32;
  }
  return dtype == DType::kBF16 && t.bf16_dot ? DType::kBF16 : DType::kF32;
}

bool Bf16TilesPreferred() { return internal::ActiveTier().bf16_dot; }

std::string ActiveTierName() { return SimdLevelName(internal::ActiveTier().level); }

bool MatMulPathTuned(MatMulPath p) {
  if (internal::ActiveTier().level == SimdLevel::kScalar) return false;
  return p == MatMulPath::kF32 || p == MatMulPath::kBf16Dot || p == MatMulPath::kI8Dot;
}

namespace {

// The input as the kernels take it, made once per call.
struct PreparedInput {
  MatMulPath path = MatMulPath::kF32;
  const float* x = nullptr;  // f32 rows (kBf16ViaF32: bf16-rounded and widened)
  int64_t ldx = 0;
  const uint16_t* xb = nullptr;  // kBf16Dot: rounded, rows contiguous
  internal::I8Inputs i8;         // int8 inputs
};

PreparedInput PrepareInput(const internal::TierKernels& t, const float* x, int64_t M, int64_t K,
                           int64_t ldx, const MatMulWeight& w, ThreadPool* pool) {
  PreparedInput p;
  p.path = MatMulPathOf(w);
  p.x = x;
  p.ldx = ldx;
  if (w.input_dtype == DType::kI8) {
    thread_local internal::I8InputBuffer buffer;  // the calling thread's, read by every thread
    p.i8 = internal::QuantizeInputsI8(x, M, K, ldx, w, &buffer, t.quantize_i8, pool);
  } else if (w.input_dtype == DType::kBF16) {
    uint16_t* r = InputScratchBf16(M * K);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t k = 0; k < K; ++k) r[m * K + k] = FloatToBf16(x[m * ldx + k]);
    }
    p.xb = r;
    if (p.path == MatMulPath::kBf16ViaF32) {  // the same products in the f32 kernels
      float* xr = ThreadScratch(M * K);
      for (int64_t i = 0; i < M * K; ++i) xr[i] = Bf16ToFloat(r[i]);
      p.x = xr;
      p.ldx = K;
      p.xb = nullptr;
    }
  }
  return p;
}

// Columns [n0, n1) of bf16 inputs (rounded and widened to f32 in p.x) over quantized weights
// or bf16 tiles on a tier without bf16 dot products: blocks of rows as dense bf16, then the f32
// kernels.
void RunBf16ViaF32(const internal::KernelTable& t, const PreparedInput& p, int64_t M, int64_t K,
                   const MatMulWeight& w, int64_t n0, int64_t n1, const float* bias, float* y,
                   int64_t ldy) {
  const bool bf16_tiles = w.quant == WeightQuant::kNone && w.layout == WeightLayout::kTiles16;
  const int64_t block_rows = DequantBlockRows(K);
  uint16_t* ws = WeightScratchBf16(block_rows * K);
  MatMulWeight dense;
  dense.data = ws;
  dense.dtype = DType::kBF16;
  for (int64_t b0 = n0; b0 < n1; b0 += block_rows) {
    const int64_t b1 = b0 + block_rows < n1 ? b0 + block_rows : n1;
    if (bf16_tiles) {
      RowsFromBf16Tiles(w, K, b0, b1, ws);
    } else {
      DequantRowsBf16(w, K, b0, b1, ws);
    }
    if (w.quant == WeightQuant::kInt8 || w.quant == WeightQuant::kFp8) {  // dot * scale + bias
      t.matmul(p.x, M, K, p.ldx, dense, 0, b1 - b0, nullptr, y + b0, ldy);
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = b0; n < b1; ++n) {
          float v = y[m * ldy + n] * w.scales[n];
          if (bias != nullptr) v += bias[n];
          y[m * ldy + n] = v;
        }
      }
    } else {
      t.matmul(p.x, M, K, p.ldx, dense, 0, b1 - b0, bias != nullptr ? bias + b0 : nullptr, y + b0,
               ldy);
    }
  }
}

// Columns [n0, n1) of y = x . w^T (+ bias) from the prepared input.
void RunColumns(const internal::TierKernels& t, const PreparedInput& p, int64_t M, int64_t K,
                const MatMulWeight& w, int64_t n0, int64_t n1, const float* bias, float* y,
                int64_t ldy) {
  const bool quantized = w.quant != WeightQuant::kNone;
  const bool bf16_tiles = !quantized && w.layout == WeightLayout::kTiles16;
  switch (p.path) {
    case MatMulPath::kI8Dot:
      t.matmul_i8(p.i8, w, n0, n1, bias, y, ldy);
      return;
    case MatMulPath::kI8Reference:
      internal::MatMulI8Reference(p.i8, w, n0, n1, bias, y, ldy);
      return;
#if defined(__x86_64__)
    case MatMulPath::kBf16Dot:
      if (bf16_tiles) {
        internal::MatMulBf16TilesAvx512(p.xb, M, K, K, w, n0, n1, bias, y, ldy);
      } else {
        const int64_t block_rows = DequantBlockRows(K);
        uint16_t* ws = quantized ? WeightScratchBf16(block_rows * K) : nullptr;
        internal::MatMulBf16Avx512(p.xb, M, K, K, w, n0, n1, bias, y, ldy, ws, block_rows);
      }
      return;
#endif
    case MatMulPath::kBf16ViaF32:
      if (quantized || bf16_tiles) {
        RunBf16ViaF32(*t.f32, p, M, K, w, n0, n1, bias, y, ldy);
        return;
      }
      break;
    default:
      break;
  }
  t.f32->matmul(p.x, M, K, p.ldx, w, n0, n1, bias, y, ldy);
}

}  // namespace

void MatMulShared(const float* x, int64_t M, int64_t K, int64_t ldx,
                  const MatMulProjection* projections, int count, ThreadPool* pool) {
  for (int i = 0; i < count; ++i) CheckWeight(projections[i].w, K);
  for (int i = 1; i < count; ++i) {
    if (!SameInputs(projections[0].w, projections[i].w)) {  // each prepares its own input
      for (int j = 0; j < count; ++j) MatMulShared(x, M, K, ldx, projections + j, 1, pool);
      return;
    }
  }
  int64_t total = 0;
  for (int i = 0; i < count; ++i) total += projections[i].N;
  if (M <= 0 || total <= 0) return;
  const internal::TierKernels& t = internal::ActiveTier();
  const PreparedInput p = PrepareInput(t, x, M, K, ldx, projections[0].w, pool);
  // The projections' columns side by side: [0, N0) the first's, [N0, N0 + N1) the second's, ...
  ForColumns(pool, M, total, K, projections[0].w.layout, [&](int64_t n0, int64_t n1) {
    int64_t offset = 0;
    for (int i = 0; i < count && offset < n1; ++i) {
      const MatMulProjection& q = projections[i];
      const int64_t lo = n0 > offset ? n0 - offset : 0;
      const int64_t hi = n1 - offset < q.N ? n1 - offset : q.N;
      if (lo < hi) RunColumns(t, p, M, K, q.w, lo, hi, q.bias, q.y, q.ldy);
      offset += q.N;
    }
  });
}

void MatMul(const float* x, int64_t M, int64_t K, int64_t ldx, const MatMulWeight& w, int64_t N,
            const float* bias, float* y, int64_t ldy, ThreadPool* pool) {
  const MatMulProjection p{w, N, bias, y, ldy};
  MatMulShared(x, M, K, ldx, &p, 1, pool);
}

void MatMul(const float* x, int64_t M, int64_t K, int64_t ldx, const void* w, DType wtype,
            int64_t N, const float* bias, float* y, int64_t ldy, ThreadPool* pool) {
  MatMulWeight weight;
  weight.data = w;
  weight.dtype = wtype;
  MatMul(x, M, K, ldx, weight, N, bias, y, ldy, pool);
}

void RmsNorm(const float* x, const float* weight, int64_t M, int64_t D, float eps, float* out,
             ThreadPool* pool) {
  const internal::KernelTable& t = internal::ActiveKernels();
  ForRows(pool, M, D, [&](int64_t m0, int64_t m1) {
    t.rms_norm(x + m0 * D, weight, m1 - m0, D, eps, out + m0 * D);
  });
}

void AddRmsNorm(float* residual, const float* delta, const float* weight, int64_t M, int64_t D,
                float eps, float* out, ThreadPool* pool) {
  const internal::KernelTable& t = internal::ActiveKernels();
  ForRows(pool, M, D, [&](int64_t m0, int64_t m1) {
    t.add_rms_norm(residual + m0 * D, delta + m0 * D, weight, m1 - m0, D, eps, out + m0 * D);
  });
}

void ApplyRope(float* x, int64_t M, int64_t ldx, int64_t num_heads, int64_t head_dim,
               const int32_t* positions, const float* cos_sin, ThreadPool* pool) {
  const internal::KernelTable& t = internal::ActiveKernels();
  ForRows(pool, M, num_heads * head_dim, [&](int64_t m0, int64_t m1) {
    t.apply_rope(x + m0 * ldx, m1 - m0, ldx, num_heads, head_dim, positions + m0, cos_sin);
  });
}

void SiluMul(const float* gate, const float* up, int64_t M, int64_t F, float* out,
             ThreadPool* pool) {
  const internal::KernelTable& t = internal::ActiveKernels();
  ForRows(pool, M, F, [&](int64_t m0, int64_t m1) {
    t.silu_mul(gate + m0 * F, up + m0 * F, m1 - m0, F, out + m0 * F);
  });
}

void Embed(const int32_t* ids, int64_t M, const void* table, DType dtype, int64_t D, float* out) {
  CheckFloatType(dtype, "Embed table");
  internal::ActiveKernels().embed(ids, M, table, dtype, D, out);
}

void WriteKv(const float* k, int64_t ldk, const float* v, int64_t ldv, int64_t M,
             const int64_t* slots, const PagedKvLayer& kv, ThreadPool* pool) {
  CheckKvType(kv.dtype);
  const internal::KernelTable& t = internal::ActiveKernels();
  ForRows(pool, M, 2 * kv.num_kv_heads * kv.head_dim, [&](int64_t m0, int64_t m1) {
    t.write_kv(k + m0 * ldk, ldk, v + m0 * ldv, ldv, m1 - m0, slots + m0, kv);
  });
}

void ReadKvSlot(const PagedKvLayer& kv, int64_t slot, int which, float* out) {
  CheckKvType(kv.dtype);
  internal::ActiveKernels().read_kv_slot(kv, slot, which, out);
}

// Query heads per attention work item: a GQA group, or the heads of one kv head in several queries
// of a prefill chunk. Each K and V row comes from L2 once per item and serves every one of them
// from L1, so the more query heads an item holds, the fewer times the context is read (without
// GQA an item of one query would read each row for one head). A tile's scores stay under
// kAttnTileScoreFloats (they are read back by the softmax and the output pass).
constexpr int64_t kAttnTileSlots = 32;
constexpr int64_t kAttnTileScoreFloats = int64_t{1} << 16;

void PagedAttention(const float* q, int64_t ldq, const AttentionQuery* queries, int64_t num_queries,
                    int64_t num_heads, const PagedKvLayer& kv, int64_t sliding_window, float* out,
                    int64_t ldo, ThreadPool* pool, float softcap) {
  CheckKvType(kv.dtype);
  TANDEM_CHECK(kv.num_kv_heads > 0 && num_heads % kv.num_kv_heads == 0)
      << "num_heads " << num_heads << " is not a multiple of num_kv_heads " << kv.num_kv_heads;
  if (num_queries <= 0) return;
  const internal::KernelTable& t = internal::ActiveKernels();
  const int64_t group = num_heads / kv.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(kv.head_dim));
  int64_t max_span = 1;
  for (int64_t i = 0; i < num_queries; ++i) {
    const int64_t span = internal::AttentionSpan(queries[i].context_len, sliding_window);
    if (span > max_span) max_span = span;
  }
  // Tiles: runs of queries at consecutive positions of one sequence (a prefill chunk) go out
  // together, up to kAttnTileSlots query heads per kv head. Not across a sliding window's cut
  // (the queries would not share their first position).
  const int64_t max_tile = std::max<int64_t>(
      1, std::min(kAttnTileSlots / group, kAttnTileScoreFloats / (group * (max_span + 1))));
  static thread_local std::vector<int64_t> tile_starts;
  tile_starts.clear();
  for (int64_t i = 0; i < num_queries;) {
    tile_starts.push_back(i);
    const AttentionQuery& first = queries[i++];
    for (int64_t r = 1; r < max_tile && i < num_queries; ++r, ++i) {
      const AttentionQuery& qi = queries[i];
      if (first.context_len < 1 || qi.block_table != first.block_table ||
          qi.context_len != first.context_len + r ||
          (sliding_window > 0 && qi.context_len > sliding_window)) {
        break;
      }
    }
  }
  const int64_t tiles = static_cast<int64_t>(tile_starts.size());
  tile_starts.push_back(num_queries);
  // Work items are (tile, kv head) pairs handed out dynamically (contexts differ in length);
  // each query's arithmetic is the same whichever tile and thread run it.
  const int64_t items = tiles * kv.num_kv_heads;
  std::atomic<int64_t> next{0};
  const int64_t* starts = tile_starts.data();
  auto worker = [&](int, int) {
    float* scratch = ThreadScratch(max_tile * group * (max_span + 1));
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < items;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      const int64_t tile = i / kv.num_kv_heads;
      t.attention(q, ldq, queries + starts[tile], starts[tile + 1] - starts[tile],
                  i % kv.num_kv_heads, group, kv, sliding_window, scale, softcap, out, ldo,
                  scratch);
    }
  };
  if (pool == nullptr || pool->size() == 1 || items == 1) {
    worker(0, 1);
  } else {
    pool->Run(worker);
  }
}

}  // namespace tandem::cpu
