// SelfCheckTier: a tier's integer MatMul and input quantizer against the references on small
// random problems, bit for bit, before the tier is first used by default. The tiers whose
// kernels no machine of the project's CI can execute (kernels README, "Tiers") are checked on
// the machine that runs them, where a wrong result would otherwise go unnoticed.

#include <cstring>
#include <random>
#include <vector>

#include "common/engine/backend/cpu/kernels/int8_inputs.h"
#include "common/engine/backend/cpu/kernels/tiers.h"

namespace tandem::cpu::internal {
namespace {

// Random weights of N rows in WeightLayout::kTiles16 (int8: any stored byte; int4: any nibble,
// scales in [0.5, 1.5), zeros in [0, 16]) with a group size of 64 and K not a multiple of it.
struct TileWeights {
  std::vector<uint8_t> data;
  std::vector<float> scales;
  MatMulWeight w;
};

TileWeights MakeTiles(WeightQuant quant, int64_t N, int64_t K, std::mt19937* rng) {
  TileWeights t;
  const int64_t tiles = (N + kQuantTileRows - 1) / kQuantTileRows, gs = 64;
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.5f, 1.5f);
  if (quant == WeightQuant::kInt8) {
    t.data.resize(tiles * kQuantTileRows * Int8TileK(K));
    for (uint8_t& b : t.data) b = static_cast<uint8_t>(byte(*rng));
    t.scales.resize(tiles * kQuantTileRows);
    for (float& s : t.scales) s = scale(*rng);
    t.w.scales = t.scales.data();
  } else {
    const int64_t tile_bytes = Int4TileBytes(K, gs);
    t.data.resize(tiles * tile_bytes);
    for (uint8_t& b : t.data) b = static_cast<uint8_t>(byte(*rng));
    std::uniform_int_distribution<int> zero(0, 16);
    for (int64_t tile = 0; tile < tiles; ++tile) {
      for (int64_t g = 0; g < Int4Groups(K, gs); ++g) {
        float* trailer = reinterpret_cast<float*>(t.data.data() + tile * tile_bytes +
                                                  Int4TileGroupScales(K, g, gs));
        for (int l = 0; l < 16; ++l) {
          trailer[l] = scale(*rng);
          trailer[16 + l] = static_cast<float>(zero(*rng));
        }
      }
    }
    t.w.group_size = gs;
  }
  t.w.data = t.data.data();
  t.w.quant = quant;
  t.w.layout = WeightLayout::kTiles16;
  t.w.input_dtype = DType::kI8;
  return t;
}

}  // namespace

bool SelfCheckTier(const TierKernels& t, std::string* error) {
  if (t.matmul_i8 == nullptr && t.quantize_i8 == nullptr) return true;
  std::mt19937 rng(12345);
  std::uniform_real_distribution<float> value(-2.0f, 3.0f);
  for (WeightQuant quant : {WeightQuant::kInt8, WeightQuant::kInt4}) {
    // Shapes that reach a lone row, a decode batch and a prefill tile, a K tail and a partial
    // tile of columns.
    const int64_t K = 200, N = 37, ldy = 40;
    const TileWeights tw = MakeTiles(quant, N, K, &rng);
    for (int64_t M : {1, 3, 11}) {
      std::vector<float> x(M * K), bias(N);
      for (float& v : x) v = value(rng);
      for (float& v : bias) v = value(rng);
      I8InputBuffer ref_buffer, buffer;
      const I8Inputs ref = QuantizeInputsI8(x.data(), M, K, K, tw.w, &ref_buffer);
      const I8Inputs in = QuantizeInputsI8(x.data(), M, K, K, tw.w, &buffer, t.quantize_i8);
      const int64_t code_bytes = M * ref.chunks * ref.chunk;
      // group_sums is null for weights without groups (memcmp's pointers must not be).
      if (std::memcmp(in.codes, ref.codes, code_bytes) != 0 ||
          std::memcmp(in.scale, ref.scale, M * sizeof(float)) != 0 ||
          std::memcmp(in.sum, ref.sum, M * sizeof(int32_t)) != 0 ||
          (ref.groups > 0 &&
           std::memcmp(in.group_sums, ref.group_sums, M * ref.groups * sizeof(float)) != 0)) {
        *error = "the input quantizer differs from the reference";
        return false;
      }
      if (t.matmul_i8 == nullptr) continue;
      std::vector<float> want(M * ldy, -1.0f), got(M * ldy, -1.0f);
      MatMulI8Reference(ref, tw.w, 3, N, bias.data(), want.data(), ldy);
      t.matmul_i8(ref, tw.w, 3, N, bias.data(), got.data(), ldy);
      if (std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) != 0) {
        *error = std::string("the int8-input MatMul over ") +
                 (quant == WeightQuant::kInt8 ? "int8" : "int4") +
                 " weights differs from the reference at M=" + std::to_string(M);
        return false;
      }
    }
  }
  return true;
}

}  // namespace tandem::cpu::internal
