// The static-batching baselines on their own and in the Scheduler: admission only between
// batches, the prompt + max_tokens reservation, padding rows kept for finished members (never
// over a shared block) and released when the batch is done.

#include "tests/bench/static_batching/static_batching.h"

#include <memory>

#include "common/engine/scheduler/scheduler.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(StaticBatchingTest, AdmitsBetweenBatchesAndReservesTheWholeLength) {
  BlockPool pool(4, false);
  KvCacheManager kv(&pool, 4);
  StaticBatching baseline(StaticBaseline::kStatic, &kv);
  EXPECT_TRUE(baseline.MayAdmit(/*batch_running=*/false));
  EXPECT_FALSE(baseline.MayAdmit(/*batch_running=*/true));
  Sequence seq;
  seq.prompt_len = 5;
  seq.params.max_tokens = 11;
  EXPECT_EQ(baseline.ReserveTo(seq, /*chunk_end=*/5), 16);
}

class StaticBatchingRowsTest : public ::testing::Test {
 protected:
  // A finished member: 6 tokens, 5 computed, KV reserved for 12.
  Sequence Member() {
    Sequence seq;
    seq.tokens = {1, 2, 3, 4, 5, 6};
    seq.prompt_len = 4;
    seq.num_computed = 5;
    EXPECT_TRUE(kv_.Grow(&seq.blocks, 12));
    return seq;
  }
  BlockPool pool_{16, /*enable_prefix_cache=*/false};
  KvCacheManager kv_{&pool_, 4};
};

TEST_F(StaticBatchingRowsTest, KeepsAFinishedMemberAsPaddingUntilTheBatchIsDone) {
  StaticBatching baseline(StaticBaseline::kStatic, &kv_);
  Sequence seq = Member();
  const auto table = seq.blocks.table;
  baseline.OnLeave(&seq, /*others_running=*/true);
  ASSERT_EQ(baseline.padding().size(), 1u);
  EXPECT_EQ(baseline.padding()[0].pos, 5);  // the slot after the last computed one
  EXPECT_EQ(baseline.padding()[0].token, 6);
  EXPECT_EQ(baseline.padding()[0].blocks.table, table);
  EXPECT_TRUE(seq.blocks.table.empty());
  EXPECT_EQ(pool_.num_referenced(), 3);
  baseline.AfterRemoval(/*running=*/true);
  EXPECT_EQ(baseline.padding().size(), 1u);
  baseline.AfterRemoval(/*running=*/false);
  EXPECT_TRUE(baseline.padding().empty());
  EXPECT_EQ(pool_.num_referenced(), 0);
}

TEST_F(StaticBatchingRowsTest, NoPaddingForTheLastMemberASharedBlockOrTheCompactBaseline) {
  StaticBatching baseline(StaticBaseline::kStatic, &kv_);
  Sequence last = Member();
  baseline.OnLeave(&last, /*others_running=*/false);
  Sequence shared = Member();
  SequenceBlocks sibling;
  kv_.Fork(shared.blocks, &sibling);  // the row's block (1) is shared
  baseline.OnLeave(&shared, /*others_running=*/true);
  StaticBatching compact(StaticBaseline::kStaticCompact, &kv_);
  Sequence member = Member();
  compact.OnLeave(&member, /*others_running=*/true);
  EXPECT_TRUE(baseline.padding().empty());
  EXPECT_TRUE(compact.padding().empty());
  for (Sequence* s : {&last, &shared, &member}) {
    EXPECT_FALSE(s->blocks.table.empty()) << "the scheduler frees them";
  }
  for (SequenceBlocks* b : {&last.blocks, &shared.blocks, &sibling, &member.blocks}) kv_.Free(b);
  EXPECT_EQ(pool_.num_referenced(), 0);
}

// The baselines plugged into the Scheduler.
class StaticSchedulerTest : public ::testing::Test {
 protected:
  void Init(StaticBaseline baseline) {
    SchedulerOptions o;
    o.max_num_seqs = 2;
    pool_ = std::make_unique<BlockPool>(100, false);
    kv_ = std::make_unique<KvCacheManager>(pool_.get(), 4);
    auto batching = std::make_unique<StaticBatching>(baseline, kv_.get());
    batching_ = batching.get();
    scheduler_ = std::make_unique<Scheduler>(o, kv_.get(), std::move(batching));
  }
  Sequence* Add(int64_t prompt_len, int32_t max_tokens = 100) {
    auto s = std::make_unique<Sequence>();
    s->seq_id = static_cast<int64_t>(seqs_.size());
    s->arrival_order = seqs_.size() + 1;
    s->tokens.assign(prompt_len, 5);
    s->prompt_len = prompt_len;
    s->params.max_tokens = max_tokens;
    scheduler_->AddWaiting(s.get());
    seqs_.push_back(std::move(s));
    return seqs_.back().get();
  }
  // Applies a plan as the engine would: tokens computed, one sampled token appended.
  void Apply(const SchedulerOutput& out) {
    for (const auto& s : out.scheduled) {
      s.seq->num_computed += s.num_new_tokens;
      if (s.seq->num_computed == s.seq->num_tokens()) s.seq->tokens.push_back(7);
    }
  }
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<KvCacheManager> kv_;
  StaticBatching* batching_ = nullptr;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
};

TEST_F(StaticSchedulerTest, AdmitsOnlyBetweenBatchesAndReservesMaxLength) {
  Init(StaticBaseline::kStatic);
  Sequence* a = Add(4, /*max_tokens=*/12);
  Add(4, 12);
  auto out = scheduler_->Schedule();
  EXPECT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(static_cast<int64_t>(a->blocks.table.size()), 4);  // (4 + 12) / 4 reserved upfront
  Apply(out);
  Sequence* c = Add(4);
  out = scheduler_->Schedule();
  for (const auto& s : out.scheduled) EXPECT_NE(s.seq, c) << "joined a running static batch";
}

TEST_F(StaticSchedulerTest, KeepsFinishedMembersAsPaddingUntilTheBatchIsDone) {
  Init(StaticBaseline::kStatic);
  Sequence* a = Add(4, 4);
  Sequence* b = Add(4, 12);
  Apply(scheduler_->Schedule());  // both prompts; one token each
  Apply(scheduler_->Schedule());  // a: 2 tokens, b: 2 tokens
  const int64_t held = pool_->num_referenced();
  const auto a_table = a->blocks.table;
  scheduler_->Remove(a);  // a finished: its row stays as padding, its blocks held
  ASSERT_EQ(batching_->padding().size(), 1u);
  const PaddingRow& row = batching_->padding()[0];
  EXPECT_EQ(row.pos, a->num_tokens() - 1);
  EXPECT_EQ(row.token, a->tokens.back());
  EXPECT_EQ(row.blocks.table, a_table);
  EXPECT_TRUE(a->blocks.table.empty());
  EXPECT_EQ(pool_->num_referenced(), held);
  Apply(scheduler_->Schedule());
  EXPECT_EQ(batching_->padding().size(), 1u);
  scheduler_->Remove(b);  // the batch is done: padding and all blocks go back
  EXPECT_TRUE(batching_->padding().empty());
  EXPECT_EQ(pool_->num_referenced(), 0);
}

TEST_F(StaticSchedulerTest, CompactBaselineDropsFinishedMembers) {
  Init(StaticBaseline::kStaticCompact);
  Sequence* a = Add(4, 4);
  Sequence* b = Add(4, 12);
  Apply(scheduler_->Schedule());
  const int64_t b_blocks = static_cast<int64_t>(b->blocks.table.size());
  scheduler_->Remove(a);
  EXPECT_TRUE(batching_->padding().empty());
  EXPECT_EQ(pool_->num_referenced(), b_blocks);
  Sequence* c = Add(4);
  auto out = scheduler_->Schedule();  // still b's batch: c waits
  for (const auto& s : out.scheduled) EXPECT_NE(s.seq, c);
}

}  // namespace
}  // namespace tandem
