// Waiting for an external resource (Scheduler::Hold / Release): a held sequence that was not
// admitted yet (kPending) holds nothing and is passed by the others; one held while running
// (kAwaiting) keeps its slot and blocks but is not scheduled; other sequences keep stepping, and
// after the last Release it continues where it was, in service order.

#include <memory>

#include "common/engine/scheduler/scheduler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

class SchedulerWaitTest : public ::testing::Test {
 protected:
  void Init(int64_t max_num_seqs = 8, int64_t blocks = 100) {
    SchedulerOptions o;
    o.max_num_seqs = max_num_seqs;
    o.max_num_batched_tokens = 64;
    pool_ = std::make_unique<BlockPool>(blocks, false);
    kv_ = std::make_unique<KvCacheManager>(pool_.get(), 4);
    scheduler_ = std::make_unique<Scheduler>(o, kv_.get());
  }
  Sequence* Add(int64_t prompt_len) {
    auto s = std::make_unique<Sequence>();
    s->seq_id = static_cast<int64_t>(seqs_.size());
    s->arrival_order = seqs_.size() + 1;
    s->tokens.assign(prompt_len, 5);
    s->prompt_len = prompt_len;
    s->params.max_tokens = 100;
    scheduler_->AddWaiting(s.get());
    seqs_.push_back(std::move(s));
    return seqs_.back().get();
  }
  // Plans a step and applies it as the engine would; returns the sequences it scheduled.
  std::vector<Sequence*> Step() {
    std::vector<Sequence*> out;
    for (const ScheduledSeq& s : scheduler_->Schedule().scheduled) {
      s.seq->num_computed += s.num_new_tokens;
      if (s.seq->num_computed == s.seq->num_tokens()) s.seq->tokens.push_back(7);
      out.push_back(s.seq);
    }
    return out;
  }
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
};

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

TEST_F(SchedulerWaitTest, APendingSequenceHoldsNothingAndIsPassedUntilReleased) {
  Init();
  Sequence* a = Add(6);
  Sequence* b = Add(5);
  scheduler_->Hold(a);  // e.g. its grammar is still compiling
  EXPECT_EQ(a->status, SeqStatus::kPending);
  EXPECT_EQ(scheduler_->num_waiting(), 2);
  EXPECT_EQ(scheduler_->num_pending(), 1);
  EXPECT_THAT(Step(), ElementsAre(b));  // b is admitted past the held head of the queue
  EXPECT_TRUE(a->blocks.table.empty());
  EXPECT_THAT(Step(), ElementsAre(b));
  EXPECT_EQ(pool_->num_referenced(), 2);  // b's alone
  scheduler_->Release(a);
  EXPECT_EQ(a->status, SeqStatus::kWaiting);
  EXPECT_EQ(scheduler_->num_pending(), 0);
  EXPECT_THAT(Step(), UnorderedElementsAre(a, b));
  EXPECT_EQ(a->num_computed, 6);
}

TEST_F(SchedulerWaitTest, OnlyHeldSequencesLeaveTheSchedulerIdle) {
  Init();
  Sequence* a = Add(4);
  scheduler_->Hold(a);
  EXPECT_TRUE(scheduler_->idle()) << "nothing to compute until the resource is ready";
  EXPECT_FALSE(scheduler_->empty());
  EXPECT_TRUE(Step().empty());
  scheduler_->Release(a);
  EXPECT_FALSE(scheduler_->idle());
  EXPECT_THAT(Step(), ElementsAre(a));
  scheduler_->Hold(a);  // running: now awaiting
  EXPECT_TRUE(scheduler_->idle());
  EXPECT_FALSE(scheduler_->empty());
}

TEST_F(SchedulerWaitTest, AnAwaitingSequenceKeepsItsSlotAndBlocksWhileOthersStep) {
  Init(/*max_num_seqs=*/2);
  Sequence* a = Add(6);
  Sequence* b = Add(5);
  EXPECT_THAT(Step(), UnorderedElementsAre(a, b));
  a->spec.draft = {1, 2};
  const std::vector<int32_t> a_blocks = a->blocks.table;
  scheduler_->Hold(a);  // e.g. blocks of a lower KV tier are on their way
  EXPECT_EQ(a->status, SeqStatus::kAwaiting);
  EXPECT_TRUE(a->spec.draft.empty()) << "a proposal is not kept across a wait";
  EXPECT_EQ(scheduler_->num_awaiting(), 1);
  Sequence* c = Add(3);
  EXPECT_THAT(Step(), ElementsAre(b)) << "c must not take a's slot";
  EXPECT_EQ(a->blocks.table, a_blocks);
  EXPECT_EQ(a->num_computed, 6);
  scheduler_->Release(a);
  EXPECT_EQ(a->status, SeqStatus::kRunning);
  EXPECT_THAT(Step(), UnorderedElementsAre(a, b));
  EXPECT_EQ(a->num_computed, 7);  // went on decoding where it stopped
  EXPECT_EQ(c->status, SeqStatus::kWaiting);
}

TEST_F(SchedulerWaitTest, EveryHoldNeedsItsRelease) {
  Init();
  Sequence* a = Add(4);
  scheduler_->Hold(a);
  scheduler_->Hold(a);  // two resources
  scheduler_->Release(a);
  EXPECT_EQ(a->status, SeqStatus::kPending);
  EXPECT_TRUE(Step().empty());
  scheduler_->Release(a);
  EXPECT_THAT(Step(), ElementsAre(a));
}

TEST_F(SchedulerWaitTest, RemovingAHeldSequenceFreesEverything) {
  Init();
  Sequence* a = Add(4);
  Sequence* b = Add(8);
  scheduler_->Hold(a);
  Step();
  scheduler_->Hold(b);
  EXPECT_GT(pool_->num_referenced(), 0);
  scheduler_->Remove(a);
  scheduler_->Remove(b);
  EXPECT_TRUE(scheduler_->empty());
  EXPECT_EQ(scheduler_->num_waiting(), 0);
  EXPECT_EQ(scheduler_->num_awaiting(), 0);
  EXPECT_EQ(pool_->num_referenced(), 0);
}

TEST_F(SchedulerWaitTest, AReleasedSequenceKeepsItsPlaceInServiceOrder) {
  Init(/*max_num_seqs=*/1);
  Sequence* a = Add(4);
  Sequence* b = Add(4);
  Sequence* c = Add(4);
  scheduler_->Hold(a);
  scheduler_->Hold(b);
  EXPECT_THAT(Step(), ElementsAre(c));
  scheduler_->Remove(c);
  scheduler_->Release(b);
  scheduler_->Release(a);
  EXPECT_THAT(Step(), ElementsAre(a)) << "the earlier arrival first, whatever the release order";
}

}  // namespace
}  // namespace tandem
