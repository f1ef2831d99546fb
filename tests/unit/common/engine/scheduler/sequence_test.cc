// A forked sample (ForkSample) gets a copy of every per-feature state unit of its parent, its own
// identity, and nothing it must not share: KV blocks, the random stream, its place in the queues.

#include "common/engine/scheduler/sequence.h"

#include "common/grammar/grammar_parser.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

struct Counter : FeatureState {
  explicit Counter(int v) : value(v) {}
  std::unique_ptr<FeatureState> Clone() const override { return std::make_unique<Counter>(*this); }
  int value;
};

std::shared_ptr<const grammar::CompiledGrammar> AbGrammar() {
  auto vocab = grammar::TokenVocab::FromBytes({"a", "b"});
  auto g = grammar::ParseGrammar(R"(root ::= "a" "b"+)");
  EXPECT_TRUE(g.ok()) << g.status();
  return std::make_shared<const grammar::CompiledGrammar>(std::move(*g), vocab);
}

TEST(SequenceTest, ForkSampleCopiesEveryStateUnit) {
  Sequence parent;
  parent.seq_id = 7;
  parent.arrival_order = 3;
  parent.request_id = "r";
  parent.priority = -2;
  parent.pending_forks = 2;
  parent.tokens = {1, 2, 3, 4};
  parent.prompt_len = 3;
  parent.num_computed = 3;
  parent.blocks.table = {5};
  parent.params.temperature = 0.5f;
  parent.status = SeqStatus::kRunning;
  parent.spec.k = 3;
  parent.spec.acceptance = 0.25;
  parent.spec.pause = 2;
  parent.grammar.matcher.emplace(AbGrammar());
  ASSERT_TRUE(parent.grammar.matcher->AcceptToken(0));
  parent.disagg.prefill_only = true;
  parent.disagg.kv_lease = absl::Seconds(5);
  parent.timing.arrival = absl::FromUnixSeconds(100);
  parent.timing.first_scheduled = absl::FromUnixSeconds(101);
  parent.usage.cached_prompt_tokens = 2;
  parent.usage.num_preemptions = 4;
  parent.usage.admission_counted = true;
  parent.features.set(1, std::make_unique<Counter>(9));

  std::unique_ptr<Sequence> child = ForkSample(parent, 8, 1);
  EXPECT_EQ(child->seq_id, 8);
  EXPECT_EQ(child->index, 1);
  EXPECT_EQ(child->arrival_order, 3u);
  EXPECT_EQ(child->request_id, "r");
  EXPECT_EQ(child->priority, -2);
  EXPECT_EQ(child->pending_forks, 0);
  EXPECT_EQ(child->tokens, parent.tokens);
  EXPECT_EQ(child->prompt_len, 3);
  EXPECT_EQ(child->num_computed, 3);
  EXPECT_EQ(child->params.temperature, 0.5f);
  EXPECT_TRUE(child->blocks.table.empty()) << "the caller shares the blocks (refcounts)";
  EXPECT_EQ(child->status, SeqStatus::kWaiting) << "the caller places it in the scheduler";

  EXPECT_EQ(child->spec.k, 3);
  EXPECT_EQ(child->spec.acceptance, 0.25);
  EXPECT_EQ(child->spec.pause, 2);
  EXPECT_TRUE(child->disagg.prefill_only);
  EXPECT_EQ(child->disagg.kv_lease, absl::Seconds(5));
  EXPECT_EQ(child->timing.arrival, parent.timing.arrival);
  EXPECT_EQ(child->timing.first_scheduled, parent.timing.first_scheduled);
  EXPECT_EQ(child->usage.cached_prompt_tokens, 2);
  EXPECT_EQ(child->usage.num_preemptions, 0) << "its own preemptions";
  EXPECT_TRUE(child->usage.admission_counted) << "the prompt is counted once, by the parent";

  // The grammar state is the parent's, and independent of it from now on.
  ASSERT_TRUE(child->grammar.active());
  EXPECT_EQ(child->grammar.matcher->state(), parent.grammar.matcher->state());
  ASSERT_TRUE(child->grammar.matcher->AcceptToken(1));
  EXPECT_TRUE(child->grammar.matcher->CanTerminate());
  EXPECT_FALSE(parent.grammar.matcher->CanTerminate());

  // Features registered at run time: their state is cloned, not shared.
  ASSERT_NE(child->features.get<Counter>(1), nullptr);
  EXPECT_EQ(child->features.get<Counter>(1)->value, 9);
  EXPECT_NE(child->features.get<Counter>(1), parent.features.get<Counter>(1));
  EXPECT_EQ(child->features.get<Counter>(0), nullptr);
  EXPECT_EQ(child->features.get<Counter>(5), nullptr);
}

}  // namespace
}  // namespace tandem
