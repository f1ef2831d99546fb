#include "common/engine/scheduler/static_batching.h"

#include <algorithm>
#include <utility>

namespace tandem {

StaticBatching::StaticBatching(BatchingBaseline baseline, KvCacheManager* kv)
    : baseline_(baseline), kv_(kv) {}

bool StaticBatching::KeepAsPadding(Sequence* seq, bool batch_running) {
  if (baseline_ != BatchingBaseline::kStatic || !batch_running || seq->tokens.empty()) {
    return false;
  }
  const int64_t pos = std::min(seq->num_computed, seq->num_tokens() - 1);
  const int64_t block = pos / kv_->block_size();
  // The row writes its slot: only into a block of its own (a forked sibling may share others).
  if (block >= static_cast<int64_t>(seq->blocks.table.size()) ||
      kv_->pool()->refcount(seq->blocks.table[block]) != 1) {
    return false;
  }
  PaddingRow row;
  row.token = seq->tokens[pos];
  row.pos = static_cast<int32_t>(pos);
  row.blocks = std::move(seq->blocks);
  seq->blocks = SequenceBlocks{};
  padding_.push_back(std::move(row));
  return true;
}

void StaticBatching::ReleaseIfBatchDone(bool batch_running) {
  if (batch_running) return;
  for (PaddingRow& row : padding_) kv_->Free(&row.blocks);
  padding_.clear();
}

}  // namespace tandem
