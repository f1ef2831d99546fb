#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/backend/backend.h"
#include "common/engine/kv/block_pool.h"
#include "common/engine/kv/kv_cache_manager.h"
#include "common/engine/model/model.h"
#include "common/engine/spec/proposer.h"

namespace tandem {

// Proposes tokens with a smaller draft model sharing the target's vocabulary. The draft keeps
// its own paged KV per sequence: each proposal first catches up on the tokens the sequence
// gained since the previous one (the whole prompt the first time: in disaggregated serving the
// decode worker prefills the draft itself, see spec/README.md), then runs k single-token steps
// for all proposing sequences together. After verification its KV is rolled back to what the
// target accepted. Greedy requests draft greedily; sampled ones draw from the draft's
// distribution after the same temperature / top-k / top-p processing (reported as q).
class DraftProposer : public Proposer {
 public:
  static absl::StatusOr<std::unique_ptr<DraftProposer>> Create(std::shared_ptr<const Model> draft,
                                                               std::unique_ptr<Backend> backend);

  absl::Status Propose(const std::vector<SpecRequest>& requests,
                       std::vector<Proposal>* out) override;
  void OnVerified(int64_t seq_id, int64_t num_tokens_before, int32_t accepted) override;
  void Release(int64_t seq_id) override;
  int64_t blocks_in_use() const override { return pool_->num_referenced(); }

 private:
  struct SeqState {
    SequenceBlocks blocks;
    int64_t computed = 0;  // leading tokens whose draft KV is valid
    // The sequence's length when it last got a proposal that was not verified yet. A proposal
    // the engine dropped (budget, preemption) is treated as fully rejected.
    int64_t unverified_from = -1;
    Rng rng;
  };
  DraftProposer(std::shared_ptr<const Model> draft, std::unique_ptr<Backend> backend);

  std::shared_ptr<const Model> model_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unordered_map<int64_t, SeqState> states_;
  std::vector<float> logits_;
  Rng seed_source_;
};

}  // namespace tandem
