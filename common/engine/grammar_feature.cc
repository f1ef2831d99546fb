// Structured output inside the engine: checking foreign tokens, masking logits before
// temperature/top-k/top-p and advancing the matcher (DESIGN §4, common/grammar/README.md); the
// waits for compilations and masks off the loop are in grammar_wait.cc.

#include "common/engine/grammar_feature.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status GrammarFeature::CheckForeignToken(const Sequence& seq, int32_t token) const {
  if (!seq.grammar.active() || core().IsEos(token)) return absl::OkStatus();
  const grammar::GrammarMatcher& m = *seq.grammar.matcher;
  // The current state's mask when known (no walk of the grammar's state graph), else a probe.
  std::shared_ptr<const grammar::TokenMask> mask = m.CachedMask();
  for (const auto& [state, prepared] : seq.grammar.masks) {
    if (state == m.state()) mask = prepared;
  }
  bool allowed;
  if (mask != nullptr) {
    allowed = token >= 0 && token < m.compiled().vocab().size() &&
              ((*mask)[token >> 6] >> (token & 63) & 1) != 0;
  } else {
    grammar::GrammarMatcher probe(m);
    allowed = probe.AcceptToken(token);
  }
  if (!allowed) {
    return absl::InvalidArgumentError(
        absl::StrCat("first token ", token, " does not follow the request's constraint"));
  }
  return absl::OkStatus();
}

void GrammarFeature::BuildTokenMask(Sequence* seq, TokenMaskEdit* out) {
  const int64_t vocab_size = core().vocab_size();
  const std::vector<int32_t>& eos_ids = core().eos_ids();
  // Prepared before the plan (BeforeSchedule); the fallbacks serve a state it did not foresee.
  std::shared_ptr<const grammar::TokenMask> mask;
  for (const auto& [state, prepared] : seq->grammar.masks) {
    if (state == seq->grammar.matcher->state()) mask = prepared;
  }
  if (mask == nullptr) mask = seq->grammar.matcher->NextTokenMask();
  ++core().stats().grammar_masks;
  const int32_t masked_vocab =
      std::min<int64_t>(seq->grammar.matcher->compiled().vocab().size(), vocab_size);
  const uint64_t* bits = mask->data();
  out->allowed.assign((vocab_size + 63) / 64, 0);
  out->revive.clear();
  bool any = false;
  for (int32_t w = 0; w * 64 < masked_vocab; ++w) {
    const int32_t n = std::min(64, masked_vocab - w * 64);
    const uint64_t in_range = n == 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
    any = any || bits[w] != 0;
    out->allowed[w] = bits[w] & in_range;
  }
  // End-of-sequence tokens have no bytes: they are allowed exactly where the grammar is
  // complete. Where nothing else fits the sequence may still end (a token vocabulary that cannot
  // spell what the grammar needs); it is never left without a choice.
  if (seq->grammar.matcher->CanTerminate() || !any) {
    for (int32_t e : eos_ids) {
      if (e < 0 || e >= vocab_size) continue;
      out->allowed[e / 64] |= uint64_t{1} << (e % 64);
      if (!any) out->revive.push_back(e);
    }
  }
}

void GrammarFeature::OnLogits(Sequence* seq, float* logits) {
  if (!seq->grammar.active()) return;
  BuildTokenMask(seq, &mask_);
  ApplyTokenMask(mask_, logits, static_cast<int32_t>(core().vocab_size()));
}

bool GrammarFeature::OnDeviceSample(Sequence* seq, DeviceSampleRow* row) {
  if (seq->grammar.active()) BuildTokenMask(seq, &row->mask);
  return true;
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
