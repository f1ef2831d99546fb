#include "common/engine/backend/cuda/attention_plan.h"

#include <algorithm>

namespace tandem::cuda {
namespace {

int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Splits of a key range of `len` keys: enough to keep splits under `partition` keys and to give
// `occupancy_splits` when the batch alone does not fill the GPU, never under min_split_keys keys
// a split, at most kMaxAttentionSplits.
int SplitCount(int64_t len, int occupancy_splits, const AttentionPlanOptions& options) {
  int splits = std::max(CeilDiv(len, std::max(1, options.partition)), occupancy_splits);
  splits = std::min<int64_t>(splits, len / std::max(1, options.min_split_keys));
  return std::clamp(splits, 1, kMaxAttentionSplits);
}

// Splits wanted for occupancy when `tiles` tiles make tiles * kv_heads blocks.
int OccupancySplits(int64_t tiles, const AttentionPlanOptions& options) {
  const int64_t blocks = std::max<int64_t>(1, tiles * options.kv_heads);
  return blocks >= options.target_blocks ? 1 : CeilDiv(options.target_blocks, blocks);
}

// Appends the items of one tile over keys [lo, hi), split when allowed.
void AddTile(int32_t token_begin, int32_t num_tokens, int32_t table_row, int32_t lo, int32_t hi,
             int occupancy_splits, const AttentionPlanOptions& options, AttentionPlan* plan) {
  plan->max_tile_rows = std::max(plan->max_tile_rows, num_tokens * options.group);
  const int64_t len = hi - lo;
  const int32_t rows = num_tokens * options.group;
  const int32_t path = rows <= std::min(options.decode_max_rows, kAttentionDecodeRows)
                           ? kAttentionPathDecode
                       : options.mma_tiles ? kAttentionPathMma
                                           : kAttentionPathTile;
  int splits = 1;
  if (num_tokens <= options.split_max_tokens &&
      plan->partial_slots + num_tokens <= options.max_partial_slots) {
    splits = SplitCount(len, occupancy_splits, options);
  }
  if (splits <= 1) {
    plan->items.push_back(AttentionItem{token_begin, num_tokens, table_row, lo, hi, -1, 0, path});
    return;
  }
  const int span = CeilDiv(CeilDiv(len, splits), kAttentionKeyChunk) * kAttentionKeyChunk;
  splits = CeilDiv(len, span);
  const int32_t slot = plan->partial_slots;
  plan->partial_slots += num_tokens;
  for (int s = 0; s < splits; ++s) {
    const int32_t begin = lo + s * span;
    const int32_t end = std::min<int32_t>(hi, begin + span);
    plan->items.push_back(
        AttentionItem{token_begin, num_tokens, table_row, begin, end, slot, s, path});
  }
  for (int32_t i = 0; i < num_tokens; ++i) {
    plan->combines.push_back(CombineItem{token_begin + i, slot + i, splits, 0});
  }
}

}  // namespace

AttentionPlan PlanAttention(const ForwardBatch& batch, const std::vector<int32_t>& context_lens,
                            int32_t sliding_window, const AttentionPlanOptions& options) {
  AttentionPlan plan;
  const int tile = std::max(1, options.max_tile_tokens);
  int64_t tiles = 0;
  for (const ForwardSeq& seq : batch.seqs) tiles += (seq.num_tokens + tile - 1) / tile;
  const int occupancy = OccupancySplits(tiles, options);
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const ForwardSeq& seq = batch.seqs[s];
    for (int32_t first = 0; first < seq.num_tokens; first += tile) {
      const int32_t count = std::min(tile, seq.num_tokens - first);
      const int32_t begin = seq.token_begin + first;
      int32_t lo = INT32_MAX, hi = 0;
      for (int32_t t = begin; t < begin + count; ++t) {
        const int32_t ctx = context_lens[t];
        const int32_t start = sliding_window > 0 && ctx > sliding_window ? ctx - sliding_window : 0;
        if (ctx <= start) continue;
        lo = std::min(lo, start);
        hi = std::max(hi, ctx);
      }
      if (hi <= lo) lo = hi = 0;
      AddTile(begin, count, static_cast<int32_t>(s), lo, hi, occupancy, options, &plan);
    }
  }
  return plan;
}

}  // namespace tandem::cuda
