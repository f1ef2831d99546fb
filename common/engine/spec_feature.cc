// Speculative decoding inside the continuous batch (DESIGN §4): proposals before scheduling,
// verification of every sequence's 1 + k positions after the one forward pass, KV rollback of
// rejected positions, and per-sequence adaptive k.

#include "common/engine/spec_feature.h"

#include <algorithm>
#include <cmath>

#include "common/base/log.h"
#include "common/engine/spec/verifier.h"

namespace tandem {

absl::Status SpecFeature::OnAdmit(Sequence* seq, const EngineRequest& /*request*/) {
  seq->spec.k = core().options().spec.num_speculative_tokens;
  return absl::OkStatus();
}

void SpecFeature::BeforeSchedule() {
  const SpecOptions& o = core().options().spec;
  if (proposer_ == nullptr || o.method == SpecOptions::Method::kNone) return;
  const int64_t max_model_len = core().max_model_len();
  std::vector<Sequence*> seqs;
  std::vector<SpecRequest> requests;
  for (Sequence* seq : core().scheduler().running()) {
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
    const int64_t room = std::min<int64_t>(max_model_len - seq->num_tokens() - 1,
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
}

bool SpecFeature::Sample(Sequence* seq, float* logits, std::vector<SequenceUpdate>* updates) {
  if (seq->spec.draft.empty()) return false;
  Verify(seq, logits, updates);
  return true;
}

void SpecFeature::Verify(Sequence* seq, float* logits, std::vector<SequenceUpdate>* updates) {
  EngineCore& core = this->core();
  EngineStats& stats = core.stats();
  const int32_t vocab = static_cast<int32_t>(core.vocab_size());
  const std::vector<int32_t> draft = std::move(seq->spec.draft);
  const std::vector<TokenDistribution> draft_q = std::move(seq->spec.draft_q);
  seq->spec.ClearDraft();
  const int64_t seq_id = seq->seq_id;
  const int64_t len_before = seq->num_tokens();
  const int32_t drafted = static_cast<int32_t>(draft.size());

  int32_t accepted = 0;
  bool finished = false;
  for (int32_t j = 0; j <= drafted; ++j) {
    float* row = logits + static_cast<size_t>(j) * vocab;
    const float* raw = core.RawLogits(*seq, row);
    core.ProcessLogits(seq, row);
    const int32_t proposed = j < drafted ? draft[j] : -1;
    const TokenDistribution* q = j < drafted && !draft_q.empty() ? &draft_q[j] : nullptr;
    VerifyResult v = VerifyPosition(seq->params, row, vocab, proposed, q, seq->rng,
                                    core.options().spec.testing_always_accept);
    if (v.accepted) {
      ++accepted;
      ++seq->spec.accepted;
    }
    core.AppendToken(seq, v.token, raw, &EngineCore::UpdateFor(seq, updates));
    if (seq->status == SeqStatus::kFinished) {
      finished = true;
      break;
    }
    if (!v.accepted) break;
  }

  if (hooks_ != nullptr) hooks_->OnVerification(drafted, accepted);
  ++stats.spec_verifications;
  stats.spec_drafted_tokens += drafted;
  stats.spec_accepted_tokens += accepted;
  for (int32_t j = 0; j < accepted && j < static_cast<int32_t>(stats.spec_accepted_at.size());
       ++j) {
    ++stats.spec_accepted_at[j];
  }
  if (finished) return;  // Finish released the blocks and the proposer's state

  // KV is valid for the fed last token and the accepted drafts; positions of rejected drafts
  // are overwritten before anything reads them, and blocks past them go back to the pool.
  seq->num_computed = len_before + accepted;
  core.kv().RegisterFull(seq->tokens, seq->num_computed, &seq->blocks);
  core.kv().Truncate(&seq->blocks, seq->num_computed);
  if (proposer_ != nullptr) proposer_->OnVerified(seq_id, len_before, accepted);
  Adapt(seq, drafted, accepted);
}

void SpecFeature::Adapt(Sequence* seq, int32_t drafted, int32_t accepted) {
  const SpecOptions& o = core().options().spec;
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

void SpecFeature::OnFinish(Sequence* seq, FinishReason /*reason*/, SequenceUpdate* u) {
  u->spec_accepted_tokens = seq->spec.accepted;
  seq->spec.ClearDraft();
  if (proposer_ != nullptr) proposer_->Release(seq->seq_id);
}

void SpecFeature::AddStats(EngineStats* stats) const {
  stats->spec_draft_blocks = proposer_ != nullptr ? proposer_->blocks_in_use() : 0;
}

}  // namespace tandem
