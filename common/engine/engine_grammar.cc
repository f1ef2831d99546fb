// Structured output inside the engine: attaching a request's compiled grammar, masking logits
// before temperature/top-k/top-p, computing masks on a worker thread while the forward pass runs,
// and keeping speculative drafts inside the grammar (DESIGN §4, common/grammar/README.md).

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/engine/engine.h"

namespace tandem {

absl::Status Engine::AttachGrammar(Sequence* seq, const std::vector<int32_t>& prior_output) {
  const grammar::Constraint& c = seq->params.constraint;
  if (!c.active()) return absl::OkStatus();
  if (options_.grammar == nullptr) {
    return absl::InvalidArgumentError(
        "constraint: this server has no tokenizer vocabulary for structured output");
  }
  if (options_.grammar->vocab().size() > vocab_size_) {
    return absl::InvalidArgumentError("constraint: tokenizer vocabulary larger than the model's");
  }
  auto compiled = options_.grammar->Compile(c);
  if (!compiled.ok()) return compiled.status();
  seq->grammar.matcher.emplace(*compiled);
  // Migration / disaggregation: the output so far must already follow the grammar.
  for (size_t i = 0; i < prior_output.size(); ++i) {
    const int32_t t = prior_output[i];
    const bool eos = std::find(eos_ids_.begin(), eos_ids_.end(), t) != eos_ids_.end();
    if (eos || !seq->grammar.matcher->AcceptToken(t)) {
      if (!seq->grammar.matcher->status().ok()) return seq->grammar.matcher->status();
      return absl::InvalidArgumentError(
          absl::StrCat("prior_output: token ", i, " (id ", t, ") does not follow the constraint"));
    }
  }
  return absl::OkStatus();
}

void Engine::ApplyGrammarMask(Sequence* seq, float* logits) {
  if (!seq->grammar.active()) return;
  std::shared_ptr<const grammar::TokenMask> mask = std::move(seq->grammar.next_mask);
  seq->grammar.next_mask.reset();
  if (mask == nullptr) mask = seq->grammar.matcher->NextTokenMask();
  ++stats_.grammar_masks;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  // End-of-sequence tokens have no bytes: they are allowed exactly where the grammar is complete.
  std::vector<float> eos_logits;
  for (int32_t e : eos_ids_) eos_logits.push_back(e >= 0 && e < vocab_size_ ? logits[e] : 0.0f);
  const int32_t masked_vocab = seq->grammar.matcher->compiled().vocab().size();
  const uint64_t* bits = mask->data();
  bool any = false;
  // Word at a time: a refused word is one fill, a partial word visits only its refused bits.
  for (int32_t w = 0; w * 64 < masked_vocab; ++w) {
    const uint64_t word = bits[w];
    const int32_t base = w * 64;
    const int32_t n = std::min(64, masked_vocab - base);
    const uint64_t in_range = n == 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
    if (word == 0) {
      std::fill(logits + base, logits + base + n, kNegInf);
      continue;
    }
    any = true;
    for (uint64_t refused = ~word & in_range; refused != 0; refused &= refused - 1) {
      logits[base + __builtin_ctzll(refused)] = kNegInf;
    }
  }
  for (int64_t id = masked_vocab; id < vocab_size_; ++id) logits[id] = kNegInf;
  // Where nothing else fits the sequence may still end (a token vocabulary that cannot spell
  // what the grammar needs); it is never left without a choice.
  if (seq->grammar.matcher->CanTerminate() || !any) {
    for (size_t i = 0; i < eos_ids_.size(); ++i) {
      const int32_t e = eos_ids_[i];
      if (e < 0 || e >= vocab_size_) continue;
      logits[e] = any || std::isfinite(eos_logits[i]) ? eos_logits[i] : 0.0f;
    }
  }
}

void Engine::TrimDraftsToGrammar() {
  for (Sequence* seq : scheduler_->running()) {
    if (!seq->grammar.active() || seq->spec.draft.empty()) continue;
    size_t ok = 0;
    while (ok < seq->spec.draft.size() && seq->grammar.matcher->AcceptToken(seq->spec.draft[ok]))
      ++ok;
    seq->grammar.matcher->Rollback(static_cast<int32_t>(ok));
    if (ok < seq->spec.draft.size()) {
      stats_.grammar_drafts_trimmed += static_cast<int64_t>(seq->spec.draft.size() - ok);
      seq->spec.draft.resize(ok);
      if (seq->spec.draft_q.size() > ok) seq->spec.draft_q.resize(ok);
    }
  }
}

std::function<void()> Engine::StartGrammarMasks(const std::vector<Sequence*>& seqs) {
  // Cached masks are taken here; only states seen for the first time need the worker thread.
  std::vector<Sequence*> constrained;
  for (Sequence* s : seqs) {
    if (!s->grammar.active()) continue;
    s->grammar.next_mask = s->grammar.matcher->CachedMask();
    if (s->grammar.next_mask == nullptr) constrained.push_back(s);
  }
  if (constrained.empty()) return [] {};
  auto compute = [constrained] {
    for (Sequence* s : constrained) s->grammar.next_mask = s->grammar.matcher->NextTokenMask();
  };
  if (!options_.overlap_grammar_masks) {
    compute();
    return [] {};
  }
  auto worker = std::make_shared<std::thread>(compute);
  return [worker] { worker->join(); };
}

}  // namespace tandem
