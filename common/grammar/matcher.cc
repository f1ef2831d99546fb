#include "common/grammar/matcher.h"

#include <mutex>

#include "absl/strings/str_cat.h"

namespace tandem::grammar {
namespace {

void SetRange(const std::vector<int32_t>& tokens, int32_t begin, int32_t end, uint64_t* mask) {
  for (int32_t t = begin; t < end; ++t) {
    const int32_t id = tokens[t];
    mask[id >> 6] |= uint64_t{1} << (id & 63);
  }
}

}  // namespace

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)) {
  states_.push_back(grammar_->graph().initial());
}

void GrammarMatcher::CheckExhausted(const StateGraph& graph, int64_t refusals_before) {
  if (graph.refusals() == refusals_before || !status_.ok()) return;
  auto size = [](int64_t bytes) {
    return bytes >= (1 << 20) ? absl::StrCat(bytes >> 20, " MiB")
                              : absl::StrCat(bytes >> 10, " KiB");
  };
  if (graph.last_refusal_charged() && grammar_->memory() != nullptr) {
    status_ = absl::ResourceExhaustedError(absl::StrCat(
        "constraint: the grammar memory budget of ", size(grammar_->memory()->max_bytes()),
        " (all grammars together) is full and this grammar holds more than its share (",
        size(grammar_->memory_bytes()), ", ", graph.num_states(),
        " parser states); the grammar is too large to serve now"));
    return;
  }
  status_ = absl::ResourceExhaustedError(absl::StrCat(
      "constraint: the grammar's parser state graph reached its bound of ", size(graph.max_bytes()),
      " (", graph.num_states(), " states); the grammar is too ambiguous or too large to serve"));
}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) {
  StateGraph& graph = grammar_->graph();
  std::lock_guard<std::mutex> lock(graph.mu());
  const int64_t refusals = graph.refusals();
  const size_t start = states_.size();
  for (unsigned char c : bytes) {
    const int32_t next = graph.Step(states_.back(), c);
    if (next < 0) {
      states_.resize(start);
      CheckExhausted(graph, refusals);
      return false;
    }
    states_.push_back(next);
  }
  return true;
}

bool GrammarMatcher::AcceptToken(int32_t token) {
  if (token < 0 || token >= grammar_->vocab().size()) return false;
  const std::string& bytes = grammar_->vocab().bytes(token);
  if (bytes.empty() || !AcceptBytes(bytes)) return false;
  token_ends_.push_back(static_cast<int32_t>(states_.size()));
  return true;
}

void GrammarMatcher::Rollback(int32_t n) {
  n = std::min<int32_t>(n, num_tokens());
  if (n <= 0) return;
  token_ends_.resize(token_ends_.size() - n);
  states_.resize(token_ends_.empty() ? 1 : token_ends_.back());
}

bool GrammarMatcher::CanTerminate() const {
  StateGraph& graph = grammar_->graph();
  std::lock_guard<std::mutex> lock(graph.mu());
  return graph.accepting(states_.back());
}

bool GrammarMatcher::IsTerminated() const {
  StateGraph& graph = grammar_->graph();
  std::lock_guard<std::mutex> lock(graph.mu());
  return graph.accepting(states_.back()) && graph.next(states_.back()).none();
}

void GrammarMatcher::Walk(StateGraph& graph, int32_t node, int32_t state, uint64_t* mask) {
  const TokenVocab& v = grammar_->vocab();
  const TokenVocab::Node& n = v.nodes()[node];
  for (int32_t c = n.child_begin; c < n.child_end; ++c) {
    const int32_t next = graph.Step(state, v.child_bytes()[c]);
    if (next < 0) continue;
    const int32_t child = v.child_nodes()[c];
    const TokenVocab::Node& cn = v.nodes()[child];
    // Every byte below this trie node loops on `next` (inside a string, a number...): the whole
    // subtree's tokens are allowed without walking it.
    const ByteSet& below = v.subtree_bytes(child);
    const bool closed = below.none() || graph.LoopsOn(next, below);
    SetRange(v.node_tokens(), cn.token_begin, closed ? v.subtree_token_end(child) : cn.token_end,
             mask);
    if (!closed) Walk(graph, child, next, mask);
  }
}

// The trie walk of a position: a token is accepted when the position's own parse survives its
// bytes (the full parse of any state with this position holds at least those items), refused
// when that parse dies and never popped into the context on the way (the full parse then has
// nothing more either), and uncertain otherwise. `popped`: a state after at least one byte of
// this trie path popped.
void GrammarMatcher::PositionWalk(StateGraph& graph, int32_t node, int32_t state, bool popped,
                                  PositionTokens* out) {
  const TokenVocab& v = grammar_->vocab();
  const TokenVocab::Node& n = v.nodes()[node];
  for (int32_t c = n.child_begin; c < n.child_end; ++c) {
    const int32_t next = graph.Step(state, v.child_bytes()[c]);
    const int32_t child = v.child_nodes()[c];
    const TokenVocab::Node& cn = v.nodes()[child];
    if (next < 0) {
      if (popped) {
        const std::vector<int32_t>& tokens = v.node_tokens();
        out->uncertain.insert(out->uncertain.end(), tokens.begin() + cn.token_begin,
                              tokens.begin() + v.subtree_token_end(child));
      }
      continue;
    }
    const ByteSet& below = v.subtree_bytes(child);
    const bool closed = below.none() || graph.LoopsOn(next, below);
    SetRange(v.node_tokens(), cn.token_begin, closed ? v.subtree_token_end(child) : cn.token_end,
             out->accepted.data());
    if (!closed) PositionWalk(graph, child, next, popped || graph.pops(next), out);
  }
}

std::shared_ptr<const PositionTokens> GrammarMatcher::PositionTokensLocked(StateGraph& graph,
                                                                           int32_t position) {
  const int64_t refusals = graph.refusals();
  auto tokens = std::make_shared<PositionTokens>();
  tokens->accepted.assign(grammar_->mask_words(), 0);
  PositionWalk(graph, 0, position, /*popped=*/false, tokens.get());
  // Cached only when complete (no bound refused a state on the way, no budget ran out).
  if (graph.refusals() == refusals && !graph.interrupted()) {
    grammar_->StorePosition(position, tokens);
  }
  return tokens;
}

TokenMask GrammarMatcher::ComputeMaskLocked(StateGraph& graph, bool force_positions) {
  const int32_t state = states_.back();
  const int32_t position = graph.Position(state);
  if (position < 0) return TokenMask(grammar_->mask_words(), 0);  // exhausted
  std::shared_ptr<const PositionTokens> sets = grammar_->FindPosition(position);
  if (sets == nullptr && !force_positions &&
      (position == state || grammar_->FirstSightOf(position))) {
    // No context to share (the state is its own position), or a position not met before: the
    // direct walk costs less than the position's sets plus the check.
    TokenMask mask(grammar_->mask_words(), 0);
    Walk(graph, 0, state, mask.data());
    return mask;
  }
  if (sets == nullptr) sets = PositionTokensLocked(graph, position);
  TokenMask mask = sets->accepted;
  if (sets->uncertain.empty()) return mask;
  // The context-dependent rest, in byte order: `path[d]` is the state after the first d bytes of
  // the previous token, so tokens sharing a prefix share its steps.
  const TokenVocab& v = grammar_->vocab();
  std::vector<int32_t> path = {state};
  const std::string* prev = nullptr;
  for (int32_t id : sets->uncertain) {
    const std::string& b = v.bytes(id);
    size_t common = 0;
    if (prev != nullptr) {
      const size_t limit = std::min(path.size() - 1, std::min(prev->size(), b.size()));
      while (common < limit && (*prev)[common] == b[common]) ++common;
    }
    path.resize(common + 1);
    prev = &b;
    bool ok = true;
    for (size_t i = common; i < b.size(); ++i) {
      const int32_t next = graph.Step(path.back(), static_cast<uint8_t>(b[i]));
      if (next < 0) {
        ok = false;
        break;
      }
      path.push_back(next);
    }
    if (ok) mask[id >> 6] |= uint64_t{1} << (id & 63);
  }
  return mask;
}

TokenMask GrammarMatcher::ComputeMaskUncached() {
  StateGraph& graph = grammar_->graph();
  std::lock_guard<std::mutex> lock(graph.mu());
  const int64_t refusals = graph.refusals();
  TokenMask mask(grammar_->mask_words(), 0);
  Walk(graph, 0, states_.back(), mask.data());
  CheckExhausted(graph, refusals);
  return mask;
}

TokenMask GrammarMatcher::ComputeMaskByPosition() {
  StateGraph& graph = grammar_->graph();
  std::lock_guard<std::mutex> lock(graph.mu());
  const int64_t refusals = graph.refusals();
  TokenMask mask = ComputeMaskLocked(graph, /*force_positions=*/true);
  CheckExhausted(graph, refusals);
  return mask;
}

std::shared_ptr<const TokenMask> GrammarMatcher::NextTokenMask() {
  return *NextTokenMaskWithin(nullptr);
}

absl::StatusOr<std::shared_ptr<const TokenMask>> GrammarMatcher::NextTokenMaskWithin(
    CompileBudget* budget) {
  const int32_t state = states_.back();
  if (auto hit = grammar_->FindMask(state)) return hit;
  std::shared_ptr<const TokenMask> mask;
  bool complete;
  {
    StateGraph& graph = grammar_->graph();
    std::lock_guard<std::mutex> lock(graph.mu());
    const int64_t refusals = graph.refusals();
    graph.set_budget(budget);
    mask = std::make_shared<const TokenMask>(ComputeMaskLocked(graph, /*force_positions=*/false));
    const bool interrupted = graph.interrupted();
    graph.set_budget(nullptr);
    if (interrupted) return budget->Check();
    complete = graph.refusals() == refusals;
    CheckExhausted(graph, refusals);
  }
  if (complete) grammar_->StoreMask(state, mask);
  return mask;
}

}  // namespace tandem::grammar
