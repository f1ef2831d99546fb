// Structured output inside the engine: attaching a request's compiled grammar, masking logits
// before temperature/top-k/top-p, computing masks on a worker thread while the forward pass runs,
// and keeping speculative drafts inside the grammar (DESIGN §4, common/grammar/README.md).

#include "common/engine/grammar_feature.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status GrammarFeature::OnAdmit(Sequence* seq, const EngineRequest& request) {
  const grammar::Constraint& c = seq->params.constraint;
  if (!c.active()) return absl::OkStatus();
  const EngineOptions& options = core().options();
  const int64_t vocab_size = core().vocab_size();
  if (options.grammar == nullptr) {
    return absl::InvalidArgumentError(
        "constraint: this server has no tokenizer vocabulary for structured output");
  }
  if (options.grammar->vocab().size() > vocab_size) {
    return absl::InvalidArgumentError("constraint: tokenizer vocabulary larger than the model's");
  }
  auto compiled = options.grammar->Compile(c);
  if (!compiled.ok()) return compiled.status();
  seq->grammar.matcher.emplace(*compiled);
  // Migration / disaggregation: the output so far must already follow the grammar.
  for (size_t i = 0; i < request.prior_output.size(); ++i) {
    const int32_t t = request.prior_output[i];
    if (core().IsEos(t) || !seq->grammar.matcher->AcceptToken(t)) {
      if (!seq->grammar.matcher->status().ok()) return seq->grammar.matcher->status();
      return absl::InvalidArgumentError(
          absl::StrCat("prior_output: token ", i, " (id ", t, ") does not follow the constraint"));
    }
  }
  return absl::OkStatus();
}

absl::Status GrammarFeature::CheckForeignToken(const Sequence& seq, int32_t token) const {
  if (!seq.grammar.active() || core().IsEos(token)) return absl::OkStatus();
  grammar::GrammarMatcher probe(*seq.grammar.matcher);
  if (!probe.AcceptToken(token)) {
    return absl::InvalidArgumentError(
        absl::StrCat("first token ", token, " does not follow the request's constraint"));
  }
  return absl::OkStatus();
}

void GrammarFeature::OnLogits(Sequence* seq, float* logits) {
  if (!seq->grammar.active()) return;
  const int64_t vocab_size = core().vocab_size();
  const std::vector<int32_t>& eos_ids = core().eos_ids();
  std::shared_ptr<const grammar::TokenMask> mask = std::move(seq->grammar.next_mask);
  seq->grammar.next_mask.reset();
  if (mask == nullptr) mask = seq->grammar.matcher->NextTokenMask();
  ++core().stats().grammar_masks;
  const float kNegInf = -std::numeric_limits<float>::infinity();
  // End-of-sequence tokens have no bytes: they are allowed exactly where the grammar is complete.
  std::vector<float> eos_logits;
  for (int32_t e : eos_ids) eos_logits.push_back(e >= 0 && e < vocab_size ? logits[e] : 0.0f);
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
  for (int64_t id = masked_vocab; id < vocab_size; ++id) logits[id] = kNegInf;
  // Where nothing else fits the sequence may still end (a token vocabulary that cannot spell
  // what the grammar needs); it is never left without a choice.
  if (seq->grammar.matcher->CanTerminate() || !any) {
    for (size_t i = 0; i < eos_ids.size(); ++i) {
      const int32_t e = eos_ids[i];
      if (e < 0 || e >= vocab_size) continue;
      logits[e] = any || std::isfinite(eos_logits[i]) ? eos_logits[i] : 0.0f;
    }
  }
}

void GrammarFeature::BeforeSchedule() {
  for (Sequence* seq : core().scheduler().running()) {
    if (!seq->grammar.active() || seq->spec.draft.empty()) continue;
    size_t ok = 0;
    while (ok < seq->spec.draft.size() && seq->grammar.matcher->AcceptToken(seq->spec.draft[ok])) {
      ++ok;
    }
    seq->grammar.matcher->Rollback(static_cast<int32_t>(ok));
    if (ok < seq->spec.draft.size()) {
      core().stats().grammar_drafts_trimmed += static_cast<int64_t>(seq->spec.draft.size() - ok);
      seq->spec.draft.resize(ok);
      if (seq->spec.draft_q.size() > ok) seq->spec.draft_q.resize(ok);
    }
  }
}

void GrammarFeature::BeforeForward(const SchedulerOutput& /*plan*/,
                                   const std::vector<Sequence*>& sampled, ForwardBatch* /*batch*/) {
  // Cached masks are taken here; only states seen for the first time need the worker thread.
  std::vector<Sequence*> constrained;
  for (Sequence* s : sampled) {
    if (!s->grammar.active()) continue;
    s->grammar.next_mask = s->grammar.matcher->CachedMask();
    if (s->grammar.next_mask == nullptr) constrained.push_back(s);
  }
  if (constrained.empty()) return;
  auto compute = [constrained] {
    for (Sequence* s : constrained) s->grammar.next_mask = s->grammar.matcher->NextTokenMask();
  };
  if (!core().options().overlap_grammar_masks) {
    compute();
    return;
  }
  auto worker = std::make_shared<std::thread>(compute);
  join_masks_ = [worker] { worker->join(); };
}

void GrammarFeature::AfterForward() {
  if (!join_masks_) return;
  join_masks_();
  join_masks_ = nullptr;
}

void GrammarFeature::OnToken(Sequence* seq, int32_t token, bool eos, TokenVerdict* verdict) {
  if (!seq->grammar.active()) return;
  grammar::GrammarMatcher& matcher = *seq->grammar.matcher;
  verdict->constrained = true;
  if (!matcher.status().ok()) {
    // The grammar's state graph reached its bound: the mask was incomplete.
    verdict->error = matcher.status();
  } else if (!eos) {
    if (!matcher.AcceptToken(token)) {
      // Masks make this unreachable; refuse to continue outside the grammar.
      verdict->error = absl::InternalError(absl::StrCat("token ", token, " outside the grammar"));
    } else {
      verdict->complete = matcher.IsTerminated();
    }
  }
}

}  // namespace tandem
