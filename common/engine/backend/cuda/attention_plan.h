#pragma once

// Host-side planning of the paged-attention work of a step (pure C++, no device calls): query
// tokens are cut into tiles of consecutive tokens of one sequence; tiles of few tokens over long
// contexts are split over the key range (flash-decoding) and merged afterwards.

#include <cstdint>
#include <vector>

#include "common/engine/backend/backend.h"
#include "common/engine/backend/cuda/kernels.h"

namespace tandem::cuda {

struct AttentionPlanOptions {
  int group = 1;              // query heads per kv head
  int max_tile_tokens = 16;   // tokens per tile (rows = tokens * group)
  int split_max_tokens = 8;   // only tiles of at most this many tokens are split over keys
  int partition = 512;        // keys per split at most, about (longer ranges split further)
  int min_split_keys = 64;    // keys per split at least
  int max_partial_slots = 0;  // capacity of the partial buffers, in tokens
  // Occupancy: when tiles x kv_heads blocks fall short of target_blocks (about two per SM), small
  // tiles are split further so that the GPU fills up (decode at small batch sizes).
  int kv_heads = 1;
  int target_blocks = 0;
  // Items of at most this many rows (tokens x group; 0: none) take the decode path, at most
  // kAttentionDecodeRows; the others run on tensor cores (mma_tiles) or the fp32 SIMT tile path.
  int decode_max_rows = kAttentionDecodeRows;
  bool mma_tiles = true;
};

struct AttentionPlan {
  std::vector<AttentionItem> items;
  std::vector<CombineItem> combines;
  int max_tile_rows = 0;
  int partial_slots = 0;  // slots used
};

// Plans a ragged batch. context_lens[t] = positions[t] + 1; the block table of sequence s is row
// s of the uploaded tables.
AttentionPlan PlanAttention(const ForwardBatch& batch, const std::vector<int32_t>& context_lens,
                            int32_t sliding_window, const AttentionPlanOptions& options);

}  // namespace tandem::cuda
