// Speculative decoding inside the continuous batch (DESIGN §4): proposals before scheduling,
// verification of every sequence's 1 + k positions after the one forward pass, KV rollback of
// rejected positions, and per-sequence adaptive k.

#include <algorithm>
#include <cmath>

#include "common/base/log.h"
#include "common/engine/engine.h"
#include "common/engine/spec/verifier.h"

namespace tandem {

void Engine::ProposeDrafts() {
  if (proposer_ == nullptr || options_.spec.method == SpecOptions::Method::kNone) return;
  const SpecOptions& o = options_.spec;
  std::vector<Sequence*> seqs;
  std::vector<SpecRequest> requests;
  for (Sequence* seq : scheduler_->running()) {
    seq->spec.draft.clear();
    seq->spec.draft_q.clear();
    if (seq->num_uncomputed() != 1 || seq->pending_forks > 0) continue;  // not decoding
    if (seq->params.speculative.has_value() && !*seq->params.speculative) continue;
    if (seq->spec.k == 0) {
      if (--seq->spec.pause > 0) continue;
      seq->spec.k = 1;  // probe again
      seq->spec.acceptance = o.min_acceptance * 2;
    }
    // Never draft past the context or max_tokens (the step adds accepted + 1 tokens).
    const int64_t room = std::min<int64_t>(max_model_len_ - seq->num_tokens() - 1,
                                           seq->params.max_tokens - seq->num_output() - 1);
    const int32_t k = static_cast<int32_t>(std::min<int64_t>(seq->spec.k, room));
    if (k <= 0) continue;
    SpecRequest r;
    r.seq_id = seq->seq_id;
    r.tokens = &seq->tokens;
    r.prompt_len = seq->prompt_len;
    r.k = k;
    r.params = &seq->params;
    requests.push_back(r);
    seqs.push_back(seq);
  }
  if (requests.empty()) return;
  std::vector<Proposal> proposals;
  if (absl::Status st = proposer_->Propose(requests, &proposals); !st.ok()) {
    TLOG(WARNING) << "speculative proposer failed, decoding without drafts this step: " << st;
    return;
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i]->spec.draft = std::move(proposals[i].tokens);
    seqs[i]->spec.draft_q = std::move(proposals[i].q);
  }
  TrimDraftsToGrammar();
}

void Engine::VerifyDrafts(Sequence* seq, float* logits, std::vector<SequenceUpdate>* updates) {
  const size_t vocab = static_cast<size_t>(vocab_size_);
  const std::vector<int32_t> draft = std::move(seq->spec.draft);
  const std::vector<TokenDistribution> draft_q = std::move(seq->spec.draft_q);
  seq->spec.draft.clear();
  seq->spec.draft_q.clear();
  const int64_t seq_id = seq->seq_id;
  const int64_t len_before = seq->num_tokens();
  const int32_t drafted = static_cast<int32_t>(draft.size());
  std::vector<int32_t> stop_ids = seq->params.stop_token_ids;
  if (!seq->params.ignore_eos) stop_ids.insert(stop_ids.end(), eos_ids_.begin(), eos_ids_.end());

  int32_t accepted = 0;
  bool finished = false;
  for (int32_t j = 0; j <= drafted; ++j) {
    float* row = logits + static_cast<size_t>(j) * vocab;
    const float* raw = row;
    if (seq->params.logprobs >= 0) {
      raw_logits_.assign(row, row + vocab);
      raw = raw_logits_.data();
    }
    absl::Span<const int32_t> all(seq->tokens);
    TokenHistory history{all.subspan(0, seq->prompt_len), all.subspan(seq->prompt_len)};
    ProcessLogits(seq->params, history, stop_ids, row, static_cast<int32_t>(vocab_size_));
    ApplyGrammarMask(seq, row);
    const int32_t proposed = j < drafted ? draft[j] : -1;
    const TokenDistribution* q = j < drafted && !draft_q.empty() ? &draft_q[j] : nullptr;
    VerifyResult v = VerifyPosition(seq->params, row, static_cast<int32_t>(vocab_size_), proposed,
                                    q, seq->rng, options_.spec.testing_always_accept);
    if (v.accepted) {
      ++accepted;
      ++seq->spec.accepted;
    }
    AppendToken(seq, v.token, raw, &UpdateFor(seq, updates));
    if (seq->status == SeqStatus::kFinished) {
      finished = true;
      break;
    }
    if (!v.accepted) break;
  }

  if (spec_hooks_ != nullptr) spec_hooks_->OnVerification(drafted, accepted);
  ++stats_.spec_verifications;
  stats_.spec_drafted_tokens += drafted;
  stats_.spec_accepted_tokens += accepted;
  for (int32_t j = 0; j < accepted && j < static_cast<int32_t>(stats_.spec_accepted_at.size());
       ++j) {
    ++stats_.spec_accepted_at[j];
  }
  if (finished) return;  // Finish released the blocks and the proposer's state

  // KV is valid for the fed last token and the accepted drafts; positions of rejected drafts
  // are overwritten before anything reads them, and blocks past them go back to the pool.
  seq->num_computed = len_before + accepted;
  kv_->RegisterFull(seq->tokens, seq->num_computed, &seq->blocks);
  kv_->Truncate(&seq->blocks, seq->num_computed);
  if (proposer_ != nullptr) proposer_->OnVerified(seq_id, len_before, accepted);
  AdaptSpeculation(seq, drafted, accepted);
}

void Engine::AdaptSpeculation(Sequence* seq, int32_t drafted, int32_t accepted) {
  const SpecOptions& o = options_.spec;
  if (!o.adaptive || drafted == 0) return;
  const double rate = static_cast<double>(accepted) / drafted;
  seq->spec.acceptance = 0.7 * seq->spec.acceptance + 0.3 * rate;
  if (seq->spec.acceptance < o.min_acceptance) {
    seq->spec.k = 0;  // pause, probe again later
    seq->spec.pause = o.probe_interval;
  } else if (seq->spec.acceptance >= 0.6) {
    seq->spec.k = std::min(seq->spec.k + 1, o.num_speculative_tokens);
  } else if (seq->spec.acceptance < 0.35) {
    seq->spec.k = std::max(1, seq->spec.k - 1);
  }
}

}  // namespace tandem
