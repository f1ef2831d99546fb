// Structured output off the engine loop (grammar_feature.h): compilations on the compile
// service while their sequence waits, token masks prepared before the plan within a CPU budget
// or computed on the service while their sequence waits, and the waits' bookkeeping.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/engine/grammar_feature.h"
#include "common/grammar/compile_budget.h"

namespace tandem {

grammar::GrammarCompileService& GrammarFeature::service() {
  if (service_ == nullptr) {
    const EngineOptions& options = core().options();
    service_ = options.grammar_service != nullptr
                   ? options.grammar_service
                   : std::make_shared<grammar::GrammarCompileService>(options.grammar,
                                                                      options.grammar_compile);
  }
  return *service_;
}

absl::Status GrammarFeature::OnAdmit(Sequence* seq, const EngineRequest& request) {
  const grammar::Constraint& c = seq->params.constraint;
  if (!c.active()) return absl::OkStatus();
  const EngineOptions& options = core().options();
  if (options.grammar == nullptr && options.grammar_service == nullptr) {
    return absl::InvalidArgumentError(
        "constraint: this server has no tokenizer vocabulary for structured output");
  }
  if (service().compiler().vocab().size() > core().vocab_size()) {
    return absl::InvalidArgumentError("constraint: tokenizer vocabulary larger than the model's");
  }
  seq->grammar.tenant = request.tenant;
  EngineWake* wake = &core().wake();
  std::unique_ptr<grammar::GrammarCompileHandle> handle =
      service().Submit(request.tenant, c, [wake] { wake->Notify(); });
  if (!handle->ready()) {
    seq->grammar.handle = std::move(handle);
    StartWait(seq, Wait::kCompile);
    return absl::OkStatus();
  }
  // Answered already: by Submit itself (a cached grammar, or a refusal), or by a worker that
  // finished first (a small grammar): no wait at all.
  const grammar::CompileResult& result = handle->result();
  const bool in_submit = handle->answered_in_submit();
  if (!result.ok()) {
    const absl::Status& st = result.status();
    ++(in_submit && st.code() == absl::StatusCode::kResourceExhausted ? counters_.rejected
       : grammar::IsBudgetExceeded(st)                                ? counters_.budget_exceeded
                                                                      : counters_.invalid);
    return st;
  }
  ++(in_submit ? counters_.cache_hits : counters_.compiled);
  return Attach(seq, *result);
}

absl::Status GrammarFeature::Attach(Sequence* seq,
                                    std::shared_ptr<const grammar::CompiledGrammar> compiled) {
  seq->grammar.matcher.emplace(std::move(compiled));
  if (seq->num_tokens() == seq->prompt_len) return absl::OkStatus();
  // Replaying walks the grammar's state graph: never while a worker holds it.
  if (Computing(&seq->grammar.matcher->compiled())) {
    seq->grammar.replay = true;
    StartWait(seq, Wait::kGrammarBusy);
    return absl::OkStatus();
  }
  return Replay(seq);
}

absl::Status GrammarFeature::Replay(Sequence* seq) {
  // Migration / disaggregation: the output so far must already follow the grammar.
  for (int64_t i = seq->prompt_len; i < seq->num_tokens(); ++i) {
    const int32_t t = seq->tokens[i];
    if (core().IsEos(t) || !seq->grammar.matcher->AcceptToken(t)) {
      if (!seq->grammar.matcher->status().ok()) return seq->grammar.matcher->status();
      return absl::InvalidArgumentError(absl::StrCat("prior_output: token ", i - seq->prompt_len,
                                                     " (id ", t,
                                                     ") does not follow the constraint"));
    }
  }
  return absl::OkStatus();
}

void GrammarFeature::StartWait(Sequence* seq, Wait kind) {
  seq->grammar.wait = kind;
  seq->grammar.masks.clear();
  core().scheduler().Hold(seq);
  held_.push_back(seq);
}

void GrammarFeature::StopWait(Sequence* seq, bool release) {
  GrammarState& gs = seq->grammar;
  if (gs.wait == Wait::kNone) return;
  if (gs.wait == Wait::kMask) {
    auto it = busy_.find(&gs.matcher->compiled());
    if (it != busy_.end() && --it->second == 0) busy_.erase(it);
  }
  gs.wait = Wait::kNone;
  gs.handle.reset();  // cancels what is still running
  gs.pending_mask.reset();
  held_.erase(std::find(held_.begin(), held_.end(), seq));
  if (release) core().scheduler().Release(seq);
}

void GrammarFeature::Fail(Sequence* seq, const absl::Status& status,
                          std::vector<SequenceUpdate>* updates) {
  core().EndPendingForks(seq, FinishReason::kError, status, updates);
  SequenceUpdate& u = EngineCore::UpdateFor(seq, updates);
  u.status = status;
  core().Finish(seq, FinishReason::kError, &u);
}

void GrammarFeature::OnStepBegin(std::vector<SequenceUpdate>* updates) {
  if (held_.empty()) return;
  // Compilations and masks first (they free grammars), then the sequences a busy grammar held.
  const std::vector<Sequence*> held = held_;
  for (Sequence* seq : held) {
    GrammarState& gs = seq->grammar;
    if ((gs.wait != Wait::kCompile && gs.wait != Wait::kMask) || !gs.handle->ready()) continue;
    const Wait kind = gs.wait;
    const grammar::CompileResult result = gs.handle->result();
    std::shared_ptr<const grammar::TokenMask> mask =
        gs.pending_mask != nullptr ? *gs.pending_mask : nullptr;
    StopWait(seq, /*release=*/true);
    absl::Status st = result.status();
    if (kind == Wait::kCompile) {
      if (st.ok()) {
        st = Attach(seq, *result);
        ++counters_.compiled;
      } else {
        ++(grammar::IsBudgetExceeded(st) ? counters_.budget_exceeded : counters_.invalid);
      }
    } else if (st.ok()) {
      gs.masks.emplace_back(gs.matcher->state(), std::move(mask));
    } else if (grammar::IsBudgetExceeded(st)) {
      ++counters_.mask_budget_exceeded;
    }
    if (!st.ok()) Fail(seq, st, updates);
  }
  const std::vector<Sequence*> still = held_;
  for (Sequence* seq : still) {
    GrammarState& gs = seq->grammar;
    if (gs.wait != Wait::kGrammarBusy || busy_.contains(&gs.matcher->compiled())) continue;
    StopWait(seq, /*release=*/true);
    if (!gs.replay) continue;
    gs.replay = false;
    if (absl::Status st = Replay(seq); !st.ok()) Fail(seq, st, updates);
  }
}

bool GrammarFeature::Computing(const grammar::CompiledGrammar* g) const {
  if (!busy_.contains(g)) return false;
  // Done but not yet taken (OnStepBegin): the worker has let go of the graph.
  return std::any_of(held_.begin(), held_.end(), [g](const Sequence* s) {
    const GrammarState& gs = s->grammar;
    return gs.wait == Wait::kMask && &gs.matcher->compiled() == g && !gs.handle->ready();
  });
}

bool GrammarFeature::ForeignTokenPending(const Sequence& seq) const {
  return seq.grammar.active() && Computing(&seq.grammar.matcher->compiled());
}

void GrammarFeature::OnFinish(Sequence* seq, FinishReason /*reason*/, SequenceUpdate* /*u*/) {
  if (seq->grammar.wait == Wait::kCompile) ++counters_.cancelled;
  StopWait(seq, /*release=*/false);  // the scheduler drops it whatever queue holds it
}

std::shared_ptr<const grammar::TokenMask> GrammarFeature::InlineMask(
    grammar::GrammarMatcher& matcher) {
  const EngineOptions& options = core().options();
  const int64_t mask_us = options.grammar_mask_inline_us;
  const grammar::CompiledGrammar& g = matcher.compiled();
  // A grammar one of whose masks took longer has all its uncached masks computed off the loop.
  if (mask_us <= 0 || g.max_mask_cost_us() > mask_us) return nullptr;
  // The step's allowance spent: the rest wait off the loop (their grammar is not slow for it).
  const int64_t limit_us = std::min(mask_us, options.grammar_mask_step_us - step_inline_us_);
  if (limit_us <= 0) return nullptr;
  auto budget = grammar::CompileBudget::Micros(limit_us, "computing a token mask");
  auto mask = matcher.NextTokenMaskWithin(budget.get());
  const int64_t used_us = static_cast<int64_t>(budget->cpu_ms_used() * 1000);
  step_inline_us_ += std::max(used_us, mask.ok() ? int64_t{0} : limit_us);
  if (!mask.ok()) {
    if (limit_us == mask_us) g.NoteMaskCost(mask_us + 1);
    return nullptr;
  }
  g.NoteMaskCost(used_us);
  return *mask;
}

bool GrammarFeature::PrepareMasks(Sequence* seq) {
  GrammarState& gs = seq->grammar;
  grammar::GrammarMatcher& m = *gs.matcher;
  const auto kept = std::move(gs.masks);  // a mask computed off the loop for this state
  gs.masks.clear();
  auto find = [&](int32_t state) {
    for (const auto& [s, mask] : kept) {
      if (s == state) return mask;
    }
    return m.CachedMask();
  };
  std::shared_ptr<const grammar::TokenMask> mask = find(m.state());
  if (mask == nullptr) mask = InlineMask(m);
  if (mask == nullptr) return false;
  gs.masks.emplace_back(m.state(), std::move(mask));
  std::vector<int32_t>& draft = seq->spec.draft;
  if (draft.empty()) return true;
  // Verifying row i needs the mask of the state after draft[0..i): the draft ends at its first
  // token the grammar forbids or whose following mask is not ready.
  size_t ok = 0;
  while (ok < draft.size() && m.AcceptToken(draft[ok])) {
    std::shared_ptr<const grammar::TokenMask> next = find(m.state());
    if (next == nullptr) next = InlineMask(m);
    if (next == nullptr) {
      m.Rollback(1);
      break;
    }
    gs.masks.emplace_back(m.state(), std::move(next));
    ++ok;
  }
  m.Rollback(static_cast<int32_t>(ok));
  if (ok < draft.size()) {
    core().stats().grammar_drafts_trimmed += static_cast<int64_t>(draft.size() - ok);
    draft.resize(ok);
    if (seq->spec.draft_q.size() > ok) seq->spec.draft_q.resize(ok);
  }
  return true;
}

void GrammarFeature::DeferMask(Sequence* seq) {
  GrammarState& gs = seq->grammar;
  // The worker gets its own copy of the matcher (the same state; the grammar is shared).
  auto matcher = std::make_shared<grammar::GrammarMatcher>(*gs.matcher);
  auto out = std::make_shared<std::shared_ptr<const grammar::TokenMask>>();
  grammar::GrammarTask task = [matcher, out](grammar::CompileBudget* budget) -> absl::Status {
    auto mask = matcher->NextTokenMaskWithin(budget);
    matcher->compiled().NoteMaskCost(static_cast<int64_t>(budget->cpu_ms_used() * 1000));
    if (!mask.ok()) return mask.status();
    if (!matcher->status().ok()) return matcher->status();  // the state graph's bound
    *out = *std::move(mask);
    return absl::OkStatus();
  };
  EngineWake* wake = &core().wake();
  gs.handle = service().SubmitTask(gs.tenant, "computing a token mask", std::move(task),
                                   [wake] { wake->Notify(); });
  gs.pending_mask = std::move(out);
  ++busy_[&gs.matcher->compiled()];
  ++counters_.masks_deferred;
  StartWait(seq, Wait::kMask);
}

void GrammarFeature::BeforeSchedule() {
  // The sequences this step may compute: the running ones and those the plan may admit.
  Scheduler& scheduler = core().scheduler();
  std::vector<Sequence*> candidates;
  for (Sequence* s : scheduler.running()) {
    if (s->grammar.active()) candidates.push_back(s);
  }
  const int64_t admissible =
      std::max<int64_t>(0, scheduler.options().max_num_seqs - scheduler.num_running());
  int64_t seen = 0;
  for (Sequence* s : scheduler.waiting()) {
    if (seen++ >= admissible) break;
    if (s->grammar.active()) candidates.push_back(s);
  }
  if (candidates.empty()) return;
  step_inline_us_ = 0;
  // Masks computed off the loop start after this pass: while one runs it holds its grammar's
  // state graph, which nothing on this thread may then touch.
  std::vector<Sequence*> deferred;
  for (Sequence* s : candidates) {
    const grammar::CompiledGrammar* g = &s->grammar.matcher->compiled();
    const bool grammar_deferred = std::any_of(deferred.begin(), deferred.end(), [g](Sequence* d) {
      return &d->grammar.matcher->compiled() == g;
    });
    if (busy_.contains(g) || grammar_deferred) {
      s->grammar.masks.clear();
      continue;
    }
    if (!PrepareMasks(s)) deferred.push_back(s);
  }
  for (Sequence* s : deferred) DeferMask(s);
  // Every other sequence on a grammar now busy waits for it (masks prepared before included).
  for (Sequence* s : candidates) {
    if (s->grammar.wait == Wait::kNone && busy_.contains(&s->grammar.matcher->compiled())) {
      StartWait(s, Wait::kGrammarBusy);
    }
  }
}

void GrammarFeature::AddStats(EngineStats* s) const {
  for (const Sequence* seq : held_) {
    if (seq->grammar.wait == Wait::kCompile) {
      ++s->grammar_compile_waiting;
    } else {
      ++s->grammar_mask_waiting;
    }
    if (seq->status == SeqStatus::kAwaiting) --s->num_awaiting_kv;
  }
  s->grammar_cache_hits = counters_.cache_hits;
  s->grammar_compiled = counters_.compiled;
  s->grammar_rejected = counters_.rejected;
  s->grammar_invalid = counters_.invalid;
  s->grammar_budget_exceeded = counters_.budget_exceeded;
  s->grammar_cancelled = counters_.cancelled;
  s->grammar_masks_deferred = counters_.masks_deferred;
  s->grammar_mask_budget_exceeded = counters_.mask_budget_exceeded;
  if (service_ != nullptr) {
    const grammar::GrammarCompileServiceStats st = service_->stats();
    s->grammar_queued = st.queued;
    s->grammar_running = st.running;
    s->grammar_memory_bytes = st.memory.bytes;
  }
}

}  // namespace tandem
