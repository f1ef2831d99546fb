#include "tests/bench/static_batching/static_batching.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "common/engine/engine_core.h"
#include "common/engine/scheduling_policies.h"

namespace tandem {

StaticBatching::StaticBatching(StaticBaseline baseline, KvCacheManager* kv)
    : baseline_(baseline), kv_(kv) {}

void StaticBatching::OnLeave(Sequence* seq, bool others_running) {
  if (baseline_ != StaticBaseline::kStatic || !others_running || seq->tokens.empty()) return;
  const int64_t pos = std::min(seq->num_computed, seq->num_tokens() - 1);
  const int64_t block = pos / kv_->block_size();
  // The row writes its slot: only into a block of its own (a forked sibling may share others).
  if (block >= static_cast<int64_t>(seq->blocks.table.size()) ||
      kv_->pool()->refcount(seq->blocks.table[block]) != 1) {
    return;
  }
  PaddingRow row;
  row.token = seq->tokens[pos];
  row.pos = static_cast<int32_t>(pos);
  row.blocks = std::move(seq->blocks);
  seq->blocks = SequenceBlocks{};
  padding_.push_back(std::move(row));
}

void StaticBatching::AfterRemoval(bool running) {
  if (running) return;
  for (PaddingRow& row : padding_) kv_->Free(&row.blocks);
  padding_.clear();
}

void PaddingRowsFeature::BeforeForward(const SchedulerOutput& /*plan*/,
                                       const std::vector<Sequence*>& /*sampled*/,
                                       ForwardBatch* batch) {
  const int64_t block_size = core().kv().block_size();
  for (const PaddingRow& p : batching_->padding()) {
    batch->AddSequenceRows({p.token}, p.pos, p.blocks.table, block_size, 1);
    batch->seqs.back().local_tables = p.blocks.local;
  }
  rows_computed_ += static_cast<int64_t>(batching_->padding().size());
}

void PaddingRowsFeature::AddStats(EngineStats* stats) const {
  const int64_t block_size = core().kv().block_size();
  for (const PaddingRow& p : batching_->padding()) {
    stats->kv_reserved_token_slots += static_cast<int64_t>(p.blocks.table.size()) * block_size;
    stats->kv_filled_token_slots += p.pos + 1;
  }
}

std::function<void(KvCacheManager*, EngineExtensions*)> StaticBaselineExtensions(
    StaticBaseline baseline, std::function<void(const StaticBaselineParts&)> made) {
  return [baseline, made](KvCacheManager* kv, EngineExtensions* out) {
    StaticBaselineParts parts;
    auto batching = std::make_unique<StaticBatching>(baseline, kv);
    parts.batching = batching.get();
    if (baseline == StaticBaseline::kStatic) {
      auto padding = std::make_unique<PaddingRowsFeature>(batching.get());
      parts.padding = padding.get();
      out->features.push_back(std::move(padding));
    }
    out->batching = std::move(batching);
    if (made) made(parts);
  };
}

void RegisterStaticBaselines() {
  RegisterSchedulingPolicy("static", StaticBaselineExtensions(StaticBaseline::kStatic));
  RegisterSchedulingPolicy("static-compact",
                           StaticBaselineExtensions(StaticBaseline::kStaticCompact));
}

}  // namespace tandem
