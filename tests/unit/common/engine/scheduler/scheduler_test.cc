// Scheduler policies and budgets without a model: token budget and chunking, decode-first
// ordering, priority, preemption of the newest lowest-priority sequence. (The static-batching
// benchmark baselines are tested with them, in tests/bench/static_batching.)

#include "common/engine/scheduler/scheduler.h"

#include <memory>

#include "gtest/gtest.h"

namespace tandem {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  void Init(SchedulerOptions options, int64_t blocks) {
    pool_ = std::make_unique<BlockPool>(blocks, false);
    kv_ = std::make_unique<KvCacheManager>(pool_.get(), 4);
    scheduler_ = std::make_unique<Scheduler>(options, kv_.get());
  }
  Sequence* Add(int64_t prompt_len, int32_t priority = 0, int32_t max_tokens = 100) {
    auto s = std::make_unique<Sequence>();
    s->seq_id = static_cast<int64_t>(seqs_.size());
    s->arrival_order = seqs_.size() + 1;
    s->priority = priority;
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
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
};

TEST_F(SchedulerTest, ChunksLongPromptsWithinTheTokenBudget) {
  SchedulerOptions o;
  o.max_num_batched_tokens = 10;
  Init(o, 100);
  Sequence* a = Add(25);
  auto out = scheduler_->Schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 10);
  Apply(out);
  Sequence* b = Add(3);
  out = scheduler_->Schedule();  // a continues its prompt, b joins with what is left
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].seq, a);
  Apply(out);
  out = scheduler_->Schedule();
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 5);
  EXPECT_EQ(out.scheduled[1].seq, b);
  EXPECT_EQ(out.scheduled[1].num_new_tokens, 3);
  EXPECT_LE(out.num_batched_tokens, 10);
}

TEST_F(SchedulerTest, DecodesGoBeforePrefillChunks) {
  SchedulerOptions o;
  o.max_num_batched_tokens = 8;
  Init(o, 100);
  Sequence* a = Add(2);
  Apply(scheduler_->Schedule());  // a is now decoding
  Sequence* b = Add(50);
  Apply(scheduler_->Schedule());  // b prefilling
  auto out = scheduler_->Schedule();
  ASSERT_GE(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[0].seq, a);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 1);
  EXPECT_EQ(out.scheduled[1].seq, b);
  EXPECT_EQ(out.scheduled[1].num_new_tokens, 7);
}

TEST_F(SchedulerTest, PreemptsTheNewestWhenBlocksRunOut) {
  SchedulerOptions o;
  o.max_num_batched_tokens = 100;
  Init(o, 6);  // 24 token slots of 4
  Sequence* old = Add(8);
  Sequence* young = Add(8);
  Apply(scheduler_->Schedule());
  EXPECT_EQ(scheduler_->num_running(), 2);
  // Grow both until the pool is exhausted: the young one must be the victim.
  bool preempted = false;
  for (int step = 0; step < 20 && !preempted; ++step) {
    auto out = scheduler_->Schedule();
    for (Sequence* p : out.preempted) {
      EXPECT_EQ(p, young);
      preempted = true;
    }
    Apply(out);
  }
  EXPECT_TRUE(preempted);
  EXPECT_EQ(young->num_computed, 0);
  EXPECT_EQ(young->status, SeqStatus::kWaiting);
  EXPECT_EQ(old->status, SeqStatus::kRunning);
}

TEST_F(SchedulerTest, PriorityPolicyServesLowerValuesFirst) {
  SchedulerOptions o;
  o.policy = SchedulingPolicy::kPriority;
  o.max_num_seqs = 1;
  Init(o, 100);
  Add(4, /*priority=*/5);
  Sequence* urgent = Add(4, /*priority=*/-1);
  auto out = scheduler_->Schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].seq, urgent);
}

}  // namespace
}  // namespace tandem
