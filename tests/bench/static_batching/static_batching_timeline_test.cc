// The static-batching baselines over many scheduler steps (the scheduler timeline harness):
// nothing joins a running batch; under kStatic a finished member is computed as a padding row
// until its batch ends, under kStaticCompact it leaves.

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/bench/static_batching/static_batching.h"
#include "tests/unit/common/engine/scheduler/scheduler_timeline.h"

namespace tandem {
namespace {

using testing_util::Timeline;

// A timeline of batches of two under `baseline`, its step lines showing the padding rows.
std::unique_ptr<Timeline> StaticTimeline(StaticBaseline baseline) {
  SchedulerOptions o;
  o.max_num_batched_tokens = 100;
  o.max_num_seqs = 2;
  auto policy = std::make_shared<StaticBatching*>(nullptr);
  auto t = std::make_unique<Timeline>(o, 100, /*prefix_cache=*/false,
                                      [baseline, policy](KvCacheManager* kv) {
                                        auto b = std::make_unique<StaticBatching>(baseline, kv);
                                        *policy = b.get();
                                        return std::unique_ptr<BatchingPolicy>(std::move(b));
                                      });
  t->set_annotation([policy]() -> std::string {
    const size_t n = (*policy)->padding().size();
    return n == 0 ? "" : absl::StrCat(" +", n, " padding");
  });
  t->set_extra_blocks([policy] {
    std::vector<int32_t> blocks;
    for (const PaddingRow& row : (*policy)->padding()) {
      blocks.insert(blocks.end(), row.blocks.table.begin(), row.blocks.table.end());
    }
    return blocks;
  });
  return t;
}

TEST(StaticBatchingTimelineTest, StaticComputesFinishedMembersAsPaddingUntilTheBatchEnds) {
  auto t = StaticTimeline(StaticBaseline::kStatic);
  t->Arrive("a", 4, 2);
  t->Arrive("b", 4, 4);
  EXPECT_EQ(t->Step(), "a:4 b:4");
  t->Arrive("c", 4, 1);
  EXPECT_EQ(t->Step(), "a:1 b:1 | finished a");  // a free slot, but c waits for the next batch
  EXPECT_EQ(t->Step(), "b:1 +1 padding");
  EXPECT_EQ(t->Step(), "b:1 +1 padding | finished b");
  EXPECT_EQ(t->Step(), "c:4 | finished c");
  t->ExpectDrained();
}

TEST(StaticBatchingTimelineTest, StaticCompactDropsFinishedMembers) {
  auto t = StaticTimeline(StaticBaseline::kStaticCompact);
  t->Arrive("a", 4, 2);
  t->Arrive("b", 4, 4);
  EXPECT_EQ(t->Step(), "a:4 b:4");
  t->Arrive("c", 4, 1);
  EXPECT_EQ(t->Step(), "a:1 b:1 | finished a");
  EXPECT_EQ(t->Step(), "b:1");
  EXPECT_EQ(t->Step(), "b:1 | finished b");
  EXPECT_EQ(t->Step(), "c:4 | finished c");
  t->ExpectDrained();
}

}  // namespace
}  // namespace tandem
