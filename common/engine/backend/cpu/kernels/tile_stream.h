#pragma once

// How the tile kernels (kernels_avx512vnni.cc: int8 / int4 weights with int8 inputs;
// kernels_avx512bf16_tiles.cc: bf16 weights with bf16 inputs) walk WeightLayout::kTiles16: L2
// blocks, prefetch distance, the lanes a tile stores. Shared by both; everything here is a
// constant or always inlined (TANDEM_LAYOUT_FN), so the ISA files that include it define no
// entity of their own (README, "ODR").

#include <cstdint>

#include "common/base/quant.h"

namespace tandem::cpu::internal {

// Weight bytes that one row tile's blocks of tiles keep in L2 while every row tile passes over.
inline constexpr int64_t kTileBlockBytes = 256 * 1024;

// Bytes ahead that a tile prefetches in each of its weight streams: 1 KiB for a lone input row
// (batch-1 decode), 4 KiB for more: the fastest distances tried per decode step (512 B - 16 KiB)
// for each batch size. Four streams 16 KiB ahead would need more than the 48 KiB L1. (A tier
// may leave a lone row without prefetches where they slow it: i8_tiles_256.h, kLonePrefetch.)
template <int MR>
inline constexpr int64_t kTilePrefetchBytes = MR == 1 ? 1024 : 4096;

// The hint of a register tile's weight-stream prefetches. A lone row reads every weight line
// once: NTA (a line fetched for one use, which the CPU keeps out of the other cache levels as
// far as it can), so streaming weights do not evict activations and KV; it streams at least as
// fast as T0. Tiles of more rows reuse each L2 block across row tiles: T0. (__builtin_prefetch's
// locality 0 is prefetchnta on x86-64, 3 prefetcht0; on aarch64 PLDL1STRM and PLDL1KEEP.)
template <int MR>
TANDEM_LAYOUT_FN void TilePrefetch(const void* p) {
  __builtin_prefetch(p, 0, MR == 1 ? 0 : 3);
}

// Where tile j of a register tile of MR x NT (tile_bytes apart) is prefetched while byte
// `offset` of it is read: kTilePrefetchBytes ahead in the same tile or, past its end, in the next
// register tile's tile j (consecutive tiles are consecutive in memory), so a tile starts with its
// lines on the way.
template <int MR, int NT>
TANDEM_LAYOUT_FN int64_t PrefetchOffset(int64_t offset, int64_t tile_bytes) {
  const int64_t ahead = offset + kTilePrefetchBytes<MR>;
  return ahead < tile_bytes ? ahead : ahead + (NT - 1) * tile_bytes;
}

// Lanes of tile t that are columns in [n0, n1) (a __mmask16).
TANDEM_LAYOUT_FN uint16_t TileMask(int64_t t, int64_t n0, int64_t n1) {
  const int64_t lo = n0 > 16 * t ? n0 - 16 * t : 0;
  const int64_t hi = n1 - 16 * t < 16 ? n1 - 16 * t : 16;
  return static_cast<uint16_t>(((1u << hi) - 1) & ~((1u << lo) - 1));
}

}  // namespace tandem::cpu::internal
