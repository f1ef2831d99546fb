// The static-batching benchmark baseline on its own: admission only between batches, the
// prompt + max_tokens reservation, padding rows kept for finished members (never over a shared
// block) and released when the batch is done.

#include "common/engine/scheduler/static_batching.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(StaticBatchingTest, AdmitsBetweenBatchesAndReservesTheWholeLength) {
  EXPECT_TRUE(StaticBatching::MayAdmit(/*batch_running=*/false));
  EXPECT_FALSE(StaticBatching::MayAdmit(/*batch_running=*/true));
  Sequence seq;
  seq.prompt_len = 5;
  seq.params.max_tokens = 11;
  EXPECT_EQ(StaticBatching::ReserveTo(seq), 16);
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
  StaticBatching baseline(BatchingBaseline::kStatic, &kv_);
  Sequence seq = Member();
  const auto table = seq.blocks.table;
  EXPECT_TRUE(baseline.KeepAsPadding(&seq, /*batch_running=*/true));
  ASSERT_EQ(baseline.padding().size(), 1u);
  EXPECT_EQ(baseline.padding()[0].pos, 5);  // the slot after the last computed one
  EXPECT_EQ(baseline.padding()[0].token, 6);
  EXPECT_EQ(baseline.padding()[0].blocks.table, table);
  EXPECT_TRUE(seq.blocks.table.empty());
  EXPECT_EQ(pool_.num_referenced(), 3);
  baseline.ReleaseIfBatchDone(/*batch_running=*/true);
  EXPECT_EQ(baseline.padding().size(), 1u);
  baseline.ReleaseIfBatchDone(/*batch_running=*/false);
  EXPECT_TRUE(baseline.padding().empty());
  EXPECT_EQ(pool_.num_referenced(), 0);
}

TEST_F(StaticBatchingRowsTest, NoPaddingForTheLastMemberASharedBlockOrTheCompactBaseline) {
  StaticBatching baseline(BatchingBaseline::kStatic, &kv_);
  Sequence last = Member();
  EXPECT_FALSE(baseline.KeepAsPadding(&last, /*batch_running=*/false));
  Sequence shared = Member();
  SequenceBlocks sibling;
  kv_.Fork(shared.blocks, &sibling);  // the row's block (1) is shared
  EXPECT_FALSE(baseline.KeepAsPadding(&shared, /*batch_running=*/true));
  StaticBatching compact(BatchingBaseline::kStaticCompact, &kv_);
  Sequence member = Member();
  EXPECT_FALSE(compact.KeepAsPadding(&member, /*batch_running=*/true));
  EXPECT_TRUE(baseline.padding().empty());
  EXPECT_TRUE(compact.padding().empty());
  EXPECT_FALSE(member.blocks.table.empty());  // the caller frees them
  for (SequenceBlocks* b : {&last.blocks, &shared.blocks, &sibling, &member.blocks}) kv_.Free(b);
  EXPECT_EQ(pool_.num_referenced(), 0);
}

}  // namespace
}  // namespace tandem
