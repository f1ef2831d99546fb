// ValidateForwardBatch: every malformed index a backend would follow is refused with
// kInvalidArgument, and well-formed batches (AddSequence's) pass.

#include "common/engine/backend/backend.h"

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr int64_t kVocab = 100;
constexpr int64_t kMaxPositions = 64;

KvCacheSpec Spec() {
  KvCacheSpec spec;
  spec.num_layers = 2;
  spec.num_kv_heads = 1;
  spec.head_dim = 8;
  spec.block_size = 4;
  spec.num_blocks = 8;
  return spec;
}

// Two sequences: a 6-token prompt chunk at positions 0-5 and one decode token at position 9.
ForwardBatch Good() {
  ForwardBatch b;
  b.AddSequence({1, 2, 3, 4, 5, 6}, 0, {0, 1}, 4, /*want_last_logits=*/true);
  b.AddSequence({7}, 9, {2, 3, 4}, 4, /*want_last_logits=*/true);
  return b;
}

absl::Status Check(const ForwardBatch& b) {
  return ValidateForwardBatch(b, Spec(), kVocab, kMaxPositions);
}

TEST(ValidateForwardBatchTest, WellFormedBatchesPass) {
  EXPECT_TRUE(Check(Good()).ok()) << Check(Good());
  EXPECT_TRUE(Check(ForwardBatch{}).ok());
  ForwardBatch skipped = Good();
  skipped.slots[0] = -1;  // a token whose KV is not written
  EXPECT_TRUE(Check(skipped).ok());
}

TEST(ValidateForwardBatchTest, EachMalformedIndexIsRefused) {
  const std::vector<std::pair<std::string, std::function<void(ForwardBatch&)>>> cases = {
      {"positions shorter", [](ForwardBatch& b) { b.positions.pop_back(); }},
      {"slots shorter", [](ForwardBatch& b) { b.slots.pop_back(); }},
      {"seq_of_token shorter", [](ForwardBatch& b) { b.seq_of_token.pop_back(); }},
      {"negative token", [](ForwardBatch& b) { b.token_ids[2] = -1; }},
      {"token past the vocabulary", [](ForwardBatch& b) { b.token_ids[6] = kVocab; }},
      {"negative position", [](ForwardBatch& b) { b.positions[0] = -1; }},
      {"position past the model", [](ForwardBatch& b) { b.positions[6] = kMaxPositions; }},
      {"slot past the pool", [](ForwardBatch& b) { b.slots[1] = 8 * 4; }},
      {"token of no sequence", [](ForwardBatch& b) { b.seq_of_token[6] = 2; }},
      {"negative sequence", [](ForwardBatch& b) { b.seq_of_token[0] = -1; }},
      {"block table too short", [](ForwardBatch& b) { b.seqs[1].block_table.pop_back(); }},
      {"block id past the pool", [](ForwardBatch& b) { b.seqs[0].block_table[1] = 8; }},
      {"negative block id", [](ForwardBatch& b) { b.seqs[1].block_table[0] = -1; }},
      {"sequence range past the batch", [](ForwardBatch& b) { b.seqs[1].num_tokens = 2; }},
      {"negative sequence range", [](ForwardBatch& b) { b.seqs[0].token_begin = -1; }},
      {"sequence range end overflowing",
       [](ForwardBatch& b) { b.seqs[1].token_begin = std::numeric_limits<int32_t>::max(); }},
      {"ranges disagree with seq_of_token", [](ForwardBatch& b) { b.seqs[0].num_tokens = 7; }},
      {"ranges leave tokens out", [](ForwardBatch& b) { b.seqs[0].num_tokens = 5; }},
      {"logit row past the batch", [](ForwardBatch& b) { b.logit_rows.push_back(7); }},
      {"negative logit row", [](ForwardBatch& b) { b.logit_rows[0] = -1; }},
  };
  for (const auto& [name, spoil] : cases) {
    ForwardBatch b = Good();
    spoil(b);
    const absl::Status st = Check(b);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << name << ": " << st;
  }
}

}  // namespace
}  // namespace tandem
