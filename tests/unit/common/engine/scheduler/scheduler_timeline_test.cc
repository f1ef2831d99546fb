// The scheduler over many steps (the Timeline harness of scheduler_timeline.h): chunked
// prefill, decode-first rows, priority, preemption, prefix caching, speculation slots and
// remote-prefill reservations, each step's plan asserted as one line.

#include "tests/unit/common/engine/scheduler/scheduler_timeline.h"

namespace tandem {
namespace {

using testing_util::Timeline;

SchedulerOptions Budget(int64_t max_num_batched_tokens, int64_t max_num_seqs = 64) {
  SchedulerOptions o;
  o.max_num_batched_tokens = max_num_batched_tokens;
  o.max_num_seqs = max_num_seqs;
  return o;
}

TEST(SchedulerTimelineTest, ChunkedPrefillShareTheTokenBudgetWithArrivals) {
  Timeline t(Budget(10), 100);
  t.Arrive("a", 25, 2);
  EXPECT_EQ(t.Step(), "a:10");
  t.Arrive("b", 3, 2);
  EXPECT_EQ(t.Step(), "a:10");  // the budget is spent on a's prompt: b waits
  EXPECT_EQ(t.Step(), "a:5 b:3");
  t.Arrive("c", 12, 1);
  EXPECT_EQ(t.Step(), "a:1 b:1 c:8 | finished a b");
  EXPECT_EQ(t.Step(), "c:4 | finished c");
  EXPECT_EQ(t.Step(), "-");
  t.ExpectDrained();
}

TEST(SchedulerTimelineTest, PrefillChunkCapSplitsPromptsBelowTheBudget) {
  SchedulerOptions o = Budget(16);
  o.max_prefill_chunk = 6;
  Timeline t(o, 100);
  t.Arrive("a", 10, 2);
  t.Arrive("b", 5, 1);
  EXPECT_EQ(t.Step(), "a:6 b:5 | finished b");
  EXPECT_EQ(t.Step(), "a:4");
  EXPECT_EQ(t.Step(), "a:1 | finished a");
  t.ExpectDrained();
}

TEST(SchedulerTimelineTest, MaxNumSeqsHoldsArrivalsUntilASequenceFinishes) {
  Timeline t(Budget(100, /*max_num_seqs=*/2), 100);
  t.Arrive("a", 4, 3);
  t.Arrive("b", 4, 1);
  t.Arrive("c", 4, 2);
  EXPECT_EQ(t.Step(), "a:4 b:4 | finished b");
  EXPECT_EQ(t.Step(), "a:1 c:4");
  EXPECT_EQ(t.Step(), "a:1 c:1 | finished a c");
  t.Arrive("d", 2, 1);
  EXPECT_EQ(t.Step(), "d:2 | finished d");
  t.ExpectDrained();
}

TEST(SchedulerTimelineTest, DecodesGoFirstThenPrefillChunksThenNewcomers) {
  Timeline t(Budget(8), 100);
  t.Arrive("a", 2, 5);
  EXPECT_EQ(t.Step(), "a:2");
  t.Arrive("b", 16, 1);
  EXPECT_EQ(t.Step(), "a:1 b:7");
  t.Arrive("c", 3, 3);
  EXPECT_EQ(t.Step(), "a:1 b:7");  // b's chunk takes the rest of the budget: c waits
  EXPECT_EQ(t.Step(), "a:1 b:2 c:3 | finished b");
  EXPECT_EQ(t.Step(), "a:1 c:1 | finished a");
  EXPECT_EQ(t.Step(), "c:1 | finished c");
  t.ExpectDrained();
}

TEST(SchedulerTimelineTest, OutOfBlocksPreemptsTheNewestAndRecomputesItLater) {
  Timeline t(Budget(100), /*num_blocks=*/6);  // 24 token slots
  t.Arrive("a", 8, 8);
  t.Arrive("b", 8, 7);
  EXPECT_EQ(t.Step(), "a:8 b:8");  // 2 blocks each
  EXPECT_EQ(t.Step(), "a:1 b:1");  // a third block each: the pool is full
  EXPECT_EQ(t.Step(), "a:1 b:1");
  EXPECT_EQ(t.Step(), "a:1 b:1");
  EXPECT_EQ(t.Step(), "a:1 b:1");
  EXPECT_EQ(t.Step(), "a:1 | preempted b");  // a needs a fourth block: b, served last, yields
  EXPECT_EQ(t.Get("b")->num_computed, 0);
  EXPECT_EQ(t.Get("b")->usage.num_preemptions, 1);
  EXPECT_EQ(t.Step(), "a:1");  // b's 13 tokens need 4 blocks, 2 are free
  EXPECT_EQ(t.Step(), "a:1 | finished a");
  EXPECT_EQ(t.Step(), "b:13");  // prompt and output so far, recomputed
  EXPECT_EQ(t.Step(), "b:1 | finished b");
  t.ExpectDrained();
}

TEST(SchedulerTimelineTest, PriorityPreemptsTheLowerPriorityEvenWhenOlder) {
  SchedulerOptions o = Budget(100);
  o.policy = SchedulingPolicy::kPriority;
  Timeline t(o, /*num_blocks=*/5);
  t.Arrive("lo", 8, 3, /*priority=*/5);
  EXPECT_EQ(t.Step(), "lo:8");
  t.Arrive("hi", 8, 3, /*priority=*/0);
  EXPECT_EQ(t.Step(), "lo:1 hi:8");
  EXPECT_EQ(t.Step(), "hi:1 | preempted lo");
  EXPECT_EQ(t.Step(), "hi:1 | finished hi");
  EXPECT_EQ(t.Step(), "lo:10 | finished lo");
  t.ExpectDrained();
}

TEST(SchedulerTimelineTest, PriorityOrdersAdmissionAndTheBatch) {
  SchedulerOptions o = Budget(100, /*max_num_seqs=*/2);
  o.policy = SchedulingPolicy::kPriority;
  Timeline t(o, 100);
  t.Arrive("lo", 4, 3, /*priority=*/5);
  t.Arrive("mid", 4, 2, /*priority=*/1);
  t.Arrive("hi", 4, 1, /*priority=*/-1);
  EXPECT_EQ(t.Step(), "hi:4 mid:4 | finished hi");
  EXPECT_EQ(t.Step(), "mid:1 lo:4 | finished mid");
  EXPECT_EQ(t.Step(), "lo:1");
  EXPECT_EQ(t.Step(), "lo:1 | finished lo");
  t.ExpectDrained();
}

TEST(SchedulerTimelineTest, SpeculationSlotsAreCutToTheTokenBudget) {
  Timeline t(Budget(4), 100);
  t.Arrive("a", 2, 20);
  t.Arrive("b", 2, 20);
  EXPECT_EQ(t.Step(), "a:2 b:2");
  t.Draft("a", 3);
  t.Draft("b", 2);
  EXPECT_EQ(t.Step(), "a:4(+3)");  // 1 + 3 verified positions take the whole budget
  EXPECT_EQ(t.Get("b")->spec.draft.size(), 2u);
  t.Draft("a", 2);
  t.Draft("b", 2);
  EXPECT_EQ(t.Step(), "a:3(+2) b:1");  // b's proposal does not fit: dropped
  EXPECT_TRUE(t.Get("b")->spec.draft.empty());
  EXPECT_EQ(t.Get("a")->num_output(), 8);
  EXPECT_EQ(t.Get("b")->num_output(), 2);
  t.ExpectDrained();
}

TEST(SchedulerTimelineTest, PrefixCacheHitsSkipTheCachedBlocks) {
  Timeline t(Budget(100), 100, /*prefix_cache=*/true);
  t.Arrive("a", 8, 1, 0, /*content=*/1);
  EXPECT_EQ(t.Step(), "a:8 | finished a");
  t.Arrive("b", 10, 1, 0, /*content=*/1);  // a's 8 tokens (2 full blocks) and 2 more
  EXPECT_EQ(t.Step(), "b:2 | finished b");
  EXPECT_EQ(t.Get("b")->usage.cached_prompt_tokens, 8);
  t.Arrive("c", 8, 1, 0, /*content=*/1);  // the last token is always computed: 1 block cached
  EXPECT_EQ(t.Step(), "c:4 | finished c");
  t.ExpectDrained();
}

TEST(SchedulerTimelineTest, RemotePrefillsReserveBlocksAndCountAsSequences) {
  Timeline t(Budget(100, /*max_num_seqs=*/2), /*num_blocks=*/6);
  t.ArriveRemote("r", 8, 3);
  t.Arrive("l", 4, 1);
  EXPECT_EQ(t.Step(), "l:4 | reserved r | finished l");
  t.ArriveRemote("r2", 12, 2);
  EXPECT_EQ(t.Step(), "- | reserved r2");
  t.KvArrived("r");
  t.Arrive("l2", 4, 1);
  EXPECT_EQ(t.Step(), "r:1");  // r and r2 fill both sequence slots: l2 waits
  EXPECT_EQ(t.Step(), "r:1 | finished r");
  EXPECT_EQ(t.Step(), "l2:4 | finished l2");
  EXPECT_EQ(t.Get("r2")->status, SeqStatus::kAwaiting);
  t.ExpectDrained();
}

TEST(SchedulerTimelineTest, RemotePrefillWaitsForBlocksAtTheHeadOfTheQueue) {
  Timeline t(Budget(100), /*num_blocks=*/4);
  t.Arrive("a", 12, 2);
  EXPECT_EQ(t.Step(), "a:12");  // 3 blocks
  t.ArriveRemote("r", 8, 1);
  t.Arrive("l", 2, 1);
  EXPECT_EQ(t.Step(), "a:1 | finished a");  // r needs 2 blocks, 1 is free; l queues behind it
  EXPECT_EQ(t.Step(), "l:2 | reserved r | finished l");
  t.ExpectDrained();
}

}  // namespace
}  // namespace tandem
