// The scheduler over many steps, driven as the engine drives it: requests arrive between steps,
// every scheduled chunk is computed, a sampled token is appended when a sequence's tokens are all
// computed, and a sequence that reached max_tokens finishes (leaves the scheduler) after the
// step. Each step's plan is asserted as one line:
//
//   "a:4 b:1(+2) +1 padding | reserved r | preempted c | finished a"
//
// scheduled rows in batch order with their token counts (and kept draft tokens), the padding
// rows of a static baseline batch, remote-prefill reservations, preemptions and the sequences that
// finished at the end of the step ("-" when nothing was scheduled). Every step also checks the
// budgets and that every referenced KV block is held by a live sequence or padding row.

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/engine/scheduler/scheduler.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr int64_t kBlockSize = 4;
constexpr int32_t kSampledToken = 7;

class Timeline {
 public:
  Timeline(const SchedulerOptions& options, int64_t num_blocks, bool prefix_cache = false)
      : options_(options),
        pool_(num_blocks, prefix_cache),
        kv_(&pool_, kBlockSize),
        scheduler_(options, &kv_) {}

  // A request of one sequence. Prompts with the same `content` share their tokens (a common
  // prefix); by default every request's prompt is its own.
  void Arrive(const std::string& name, int64_t prompt_len, int32_t max_tokens, int32_t priority = 0,
              int32_t content = -1) {
    Sequence* seq = New(name, prompt_len, max_tokens, priority, content);
    scheduler_.AddWaiting(seq);
  }
  // Decode role: the prompt's KV will come from a prefill worker.
  void ArriveRemote(const std::string& name, int64_t prompt_len, int32_t max_tokens) {
    Sequence* seq = New(name, prompt_len, max_tokens, 0, -1);
    seq->disagg.remote_prefill = true;
    scheduler_.AddWaiting(seq);
  }
  // The prompt KV of an awaiting sequence arrived with its first token.
  void KvArrived(const std::string& name) {
    Sequence* seq = Get(name);
    ASSERT_EQ(seq->status, SeqStatus::kAwaiting) << name;
    seq->num_computed = seq->num_tokens();
    seq->disagg.remote_prefill = false;
    kv_.RegisterFull(seq->tokens, seq->num_computed, &seq->blocks);
    scheduler_.Release(seq);
    seq->tokens.push_back(kSampledToken);
  }
  // A speculative proposal of `k` tokens for a decoding sequence (the engine proposes before it
  // schedules).
  void Draft(const std::string& name, int k) {
    Sequence* seq = Get(name);
    seq->spec.draft.assign(k, kSampledToken);
  }

  // Schedules one step, checks its invariants, applies it and returns its line.
  std::string Step() {
    const SchedulerOutput out = scheduler_.Schedule();
    CheckPlan(out);
    std::vector<std::string> rows;
    for (const ScheduledSeq& s : out.scheduled) {
      std::string row = absl::StrCat(s.seq->request_id, ":", s.num_new_tokens);
      if (!s.seq->spec.draft.empty()) absl::StrAppend(&row, "(+", s.seq->spec.draft.size(), ")");
      rows.push_back(row);
    }
    std::string line = rows.empty() ? "-" : absl::StrJoin(rows, " ");
    if (!scheduler_.padding().empty()) {
      absl::StrAppend(&line, " +", scheduler_.padding().size(), " padding");
    }
    AppendNames(&line, "reserved", out.reserved);
    AppendNames(&line, "preempted", out.preempted);

    // The forward pass: every drafted token is accepted, and a token is sampled after it.
    std::vector<Sequence*> finished;
    for (const ScheduledSeq& s : out.scheduled) {
      Sequence* seq = s.seq;
      seq->num_computed += s.num_new_tokens;
      if (seq->num_computed < seq->num_tokens() + static_cast<int64_t>(seq->spec.draft.size())) {
        continue;  // a prefill chunk short of the prompt's end: nothing sampled
      }
      seq->tokens.insert(seq->tokens.end(), seq->spec.draft.begin(), seq->spec.draft.end());
      seq->spec.draft.clear();
      seq->tokens.push_back(kSampledToken);
      kv_.RegisterFull(seq->tokens, seq->num_computed, &seq->blocks);
      if (seq->num_output() >= seq->params.max_tokens) finished.push_back(seq);
    }
    for (Sequence* seq : finished) {
      scheduler_.Remove(seq);
      seq->status = SeqStatus::kFinished;
    }
    AppendNames(&line, "finished", finished);
    CheckBlocksHeld();
    return line;
  }

  // Ends every sequence still in the scheduler; afterwards the pool holds no reference.
  void ExpectDrained() {
    for (auto& [name, seq] : seqs_) {
      if (seq->status != SeqStatus::kFinished) scheduler_.Remove(seq.get());
    }
    EXPECT_TRUE(scheduler_.empty());
    EXPECT_TRUE(scheduler_.padding().empty());
    EXPECT_EQ(pool_.num_referenced(), 0);
  }

  Sequence* Get(const std::string& name) { return seqs_.at(name).get(); }
  const BlockPool& pool() const { return pool_; }

 private:
  Sequence* New(const std::string& name, int64_t prompt_len, int32_t max_tokens, int32_t priority,
                int32_t content) {
    auto seq = std::make_unique<Sequence>();
    seq->seq_id = static_cast<int64_t>(seqs_.size());
    seq->arrival_order = seqs_.size() + 1;
    seq->request_id = name;
    seq->priority = priority;
    const int32_t base = (content >= 0 ? content : 100 + static_cast<int32_t>(seqs_.size())) * 1000;
    for (int64_t i = 0; i < prompt_len; ++i) seq->tokens.push_back(base + static_cast<int32_t>(i));
    seq->prompt_len = prompt_len;
    seq->params.max_tokens = max_tokens;
    Sequence* raw = seq.get();
    EXPECT_TRUE(seqs_.emplace(name, std::move(seq)).second) << "two requests named " << name;
    return raw;
  }

  static void AppendNames(std::string* line, const char* what, const std::vector<Sequence*>& seqs) {
    if (seqs.empty()) return;
    std::vector<std::string> names;
    for (const Sequence* seq : seqs) names.push_back(seq->request_id);
    absl::StrAppend(line, " | ", what, " ", absl::StrJoin(names, " "));
  }

  void CheckPlan(const SchedulerOutput& out) {
    int64_t tokens = 0;
    std::set<const Sequence*> seen;
    for (const ScheduledSeq& s : out.scheduled) {
      EXPECT_TRUE(seen.insert(s.seq).second) << s.seq->request_id << " scheduled twice";
      EXPECT_EQ(s.seq->status, SeqStatus::kRunning) << s.seq->request_id;
      EXPECT_GT(s.num_new_tokens, 0) << s.seq->request_id;
      // The blocks to write this step's tokens (and the drafts they verify) are held.
      EXPECT_GE(static_cast<int64_t>(s.seq->blocks.table.size()) * kBlockSize,
                s.seq->num_computed + s.num_new_tokens)
          << s.seq->request_id;
      tokens += s.num_new_tokens;
    }
    EXPECT_EQ(out.num_batched_tokens, tokens);
    EXPECT_LE(out.num_batched_tokens, options_.max_num_batched_tokens);
    EXPECT_LE(static_cast<int64_t>(out.scheduled.size()), options_.max_num_seqs);
    EXPECT_LE(scheduler_.num_running() + scheduler_.num_awaiting(), options_.max_num_seqs);
  }

  // No block leaks: every referenced block belongs to a live sequence or a padding row.
  void CheckBlocksHeld() {
    std::set<int32_t> held;
    for (const auto& [name, seq] : seqs_)
      held.insert(seq->blocks.table.begin(), seq->blocks.table.end());
    for (const PaddingRow& row : scheduler_.padding()) {
      held.insert(row.blocks.table.begin(), row.blocks.table.end());
    }
    EXPECT_EQ(static_cast<int64_t>(held.size()), pool_.num_referenced());
  }

  SchedulerOptions options_;
  BlockPool pool_;
  KvCacheManager kv_;
  Scheduler scheduler_;
  std::map<std::string, std::unique_ptr<Sequence>> seqs_;
};

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

SchedulerOptions StaticBatch(BatchingBaseline baseline) {
  SchedulerOptions o = Budget(100, /*max_num_seqs=*/2);
  o.baseline = baseline;
  return o;
}

TEST(SchedulerTimelineTest, StaticBaselineComputesFinishedMembersAsPaddingUntilTheBatchEnds) {
  Timeline t(StaticBatch(BatchingBaseline::kStatic), 100);
  t.Arrive("a", 4, 2);
  t.Arrive("b", 4, 4);
  EXPECT_EQ(t.Step(), "a:4 b:4");
  t.Arrive("c", 4, 1);
  EXPECT_EQ(t.Step(), "a:1 b:1 | finished a");  // a free slot, but c waits for the next batch
  EXPECT_EQ(t.Step(), "b:1 +1 padding");
  EXPECT_EQ(t.Step(), "b:1 +1 padding | finished b");
  EXPECT_EQ(t.Step(), "c:4 | finished c");
  t.ExpectDrained();
}

TEST(SchedulerTimelineTest, StaticCompactBaselineDropsFinishedMembers) {
  Timeline t(StaticBatch(BatchingBaseline::kStaticCompact), 100);
  t.Arrive("a", 4, 2);
  t.Arrive("b", 4, 4);
  EXPECT_EQ(t.Step(), "a:4 b:4");
  t.Arrive("c", 4, 1);
  EXPECT_EQ(t.Step(), "a:1 b:1 | finished a");
  EXPECT_EQ(t.Step(), "b:1");
  EXPECT_EQ(t.Step(), "b:1 | finished b");
  EXPECT_EQ(t.Step(), "c:4 | finished c");
  t.ExpectDrained();
}

}  // namespace
}  // namespace tandem
