#include "common/engine/spec/draft_proposer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem {

DraftProposer::DraftProposer(std::shared_ptr<const Model> draft, std::unique_ptr<Backend> backend)
    : model_(std::move(draft)), backend_(std::move(backend)) {
  pool_ =
      std::make_unique<BlockPool>(backend_->kv_spec().num_blocks, /*enable_prefix_cache=*/false);
  kv_ = std::make_unique<KvCacheManager>(pool_.get(), backend_->kv_spec().block_size);
  seed_source_.Seed(0x5eedd4af7ull);
}

absl::StatusOr<std::unique_ptr<DraftProposer>> DraftProposer::Create(
    std::shared_ptr<const Model> draft, std::unique_ptr<Backend> backend) {
  if (draft == nullptr || backend == nullptr) {
    return absl::InvalidArgumentError("draft proposer needs a model and a backend");
  }
  return std::unique_ptr<DraftProposer>(new DraftProposer(std::move(draft), std::move(backend)));
}

absl::Status DraftProposer::Propose(const std::vector<SpecRequest>& requests,
                                    std::vector<Proposal>* out) {
  out->assign(requests.size(), Proposal());
  const int64_t block_size = backend_->kv_spec().block_size;
  const int32_t vocab = static_cast<int32_t>(model_->config().vocab_size);
  const int64_t max_pos = model_->config().max_position_embeddings;

  // Who takes part, with their working token lists (tokens + drafts so far).
  struct Active {
    size_t index;
    SeqState* state;
    std::vector<int32_t> tokens;
    int32_t k;
  };
  std::vector<Active> active;
  for (size_t i = 0; i < requests.size(); ++i) {
    const SpecRequest& r = requests[i];
    if (r.k <= 0) continue;
    const int64_t len = static_cast<int64_t>(r.tokens->size());
    const int32_t k = static_cast<int32_t>(std::min<int64_t>(r.k, max_pos - len));
    if (k <= 0) continue;
    auto [it, inserted] = states_.try_emplace(r.seq_id);
    SeqState& st = it->second;
    if (inserted) {
      st.rng.Seed(r.params->seed.has_value() ? (*r.params->seed ^ 0xd4af7d4af7ull)
                                             : seed_source_.Next());
    }
    if (st.unverified_from >= 0) {
      st.computed = std::min(st.computed, st.unverified_from);
      st.unverified_from = -1;
    }
    st.computed = std::min(st.computed, len - 1);  // the last token always goes in again
    kv_->Truncate(&st.blocks, st.computed);
    if (!kv_->Grow(&st.blocks, len + k - 1)) continue;  // no draft KV room: no proposal
    st.unverified_from = len;
    active.push_back({i, &st, *r.tokens, k});
  }

  for (int32_t step = 0; !active.empty(); ++step) {
    ForwardBatch batch;
    for (Active& a : active) {
      const int64_t from = a.state->computed;
      std::vector<int32_t> chunk(a.tokens.begin() + from, a.tokens.end());
      batch.AddSequence(chunk, static_cast<int32_t>(from), a.state->blocks.table, block_size,
                        /*want_last_logits=*/true);
    }
    logits_.resize(active.size() * static_cast<size_t>(vocab));
    if (absl::Status st = backend_->Forward(batch, logits_.data()); !st.ok()) {
      return absl::InternalError(absl::StrCat("draft model forward: ", st.message()));
    }
    std::vector<Active> next;
    for (size_t j = 0; j < active.size(); ++j) {
      Active& a = active[j];
      const SpecRequest& r = requests[a.index];
      a.state->computed = static_cast<int64_t>(a.tokens.size());
      float* row = logits_.data() + j * vocab;
      absl::Span<const int32_t> all(a.tokens);
      TokenHistory history{all.subspan(0, r.prompt_len), all.subspan(r.prompt_len)};
      ProcessLogits(*r.params, history, {}, row, vocab);
      Proposal& p = (*out)[a.index];
      int32_t token;
      if (r.params->greedy()) {
        token = GreedyToken(row, vocab);
      } else {
        p.q.push_back(ComputeDistribution(*r.params, row, vocab));
        token = SampleFromDistribution(p.q.back(), a.state->rng);
      }
      p.tokens.push_back(token);
      a.tokens.push_back(token);
      if (static_cast<int32_t>(p.tokens.size()) < a.k) next.push_back(std::move(a));
    }
    active.swap(next);
  }
  return absl::OkStatus();
}

void DraftProposer::OnVerified(int64_t seq_id, int64_t num_tokens_before, int32_t accepted) {
  auto it = states_.find(seq_id);
  if (it == states_.end()) return;
  SeqState& st = it->second;
  st.unverified_from = -1;
  st.computed = std::min(st.computed, num_tokens_before + accepted);
  kv_->Truncate(&st.blocks, st.computed);
}

void DraftProposer::Release(int64_t seq_id) {
  auto it = states_.find(seq_id);
  if (it == states_.end()) return;
  kv_->Free(&it->second.blocks);
  states_.erase(it);
}

}  // namespace tandem
