#pragma once

// A harness that drives the Scheduler over many steps as the engine drives it: requests arrive
// between steps, every scheduled chunk is computed, a sampled token is appended when a sequence's
// tokens are all computed, and a sequence that reached max_tokens finishes (leaves the
// scheduler) after the step. Each step's plan is one line:
//
//   "a:4 b:1(+2) | reserved r | preempted c | finished a"
//
// scheduled rows in batch order with their token counts (and kept draft tokens), what the
// batching policy adds (set_annotation), remote-prefill reservations, preemptions and the
// sequences that finished at the end of the step ("-" when nothing was scheduled). Every step
// also checks the budgets and that every referenced KV block is held by a live sequence (or the
// batching policy: set_extra_blocks).

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/engine/scheduler/batching_policy.h"
#include "common/engine/scheduler/scheduler.h"
#include "gtest/gtest.h"

namespace tandem::testing_util {

constexpr int64_t kBlockSize = 4;
constexpr int32_t kSampledToken = 7;

class Timeline {
 public:
  // `batching`: made with the KV cache manager (null: the Scheduler's default, continuous).
  using MakeBatching = std::function<std::unique_ptr<BatchingPolicy>(KvCacheManager*)>;
  Timeline(const SchedulerOptions& options, int64_t num_blocks, bool prefix_cache = false,
           const MakeBatching& batching = nullptr)
      : options_(options),
        pool_(num_blocks, prefix_cache),
        kv_(&pool_, kBlockSize),
        scheduler_(options, &kv_, batching ? batching(&kv_) : nullptr) {}

  // A batching policy that holds blocks of its own or adds rows: what a step line gains after
  // its rows (e.g. " +1 padding") and the blocks it holds outside the sequences.
  void set_annotation(std::function<std::string()> annotation) {
    annotation_ = std::move(annotation);
  }
  void set_extra_blocks(std::function<std::vector<int32_t>()> blocks) {
    extra_blocks_ = std::move(blocks);
  }

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
    if (annotation_) absl::StrAppend(&line, annotation_());
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

  // No block leaks: every referenced block belongs to a live sequence or the batching policy.
  void CheckBlocksHeld() {
    std::set<int32_t> held;
    for (const auto& [name, seq] : seqs_) {
      held.insert(seq->blocks.table.begin(), seq->blocks.table.end());
    }
    if (extra_blocks_) {
      for (int32_t b : extra_blocks_()) held.insert(b);
    }
    EXPECT_EQ(static_cast<int64_t>(held.size()), pool_.num_referenced());
  }

  SchedulerOptions options_;
  BlockPool pool_;
  KvCacheManager kv_;
  Scheduler scheduler_;
  std::map<std::string, std::unique_ptr<Sequence>> seqs_;
  std::function<std::string()> annotation_;
  std::function<std::vector<int32_t>()> extra_blocks_;
};

}  // namespace tandem::testing_util
