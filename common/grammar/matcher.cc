#include "common/grammar/matcher.h"

#include <mutex>

namespace tandem::grammar {

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : grammar_(std::move(grammar)) {
  states_.push_back(grammar_->graph().initial());
}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) {
  StateGraph& graph = grammar_->graph();
  std::lock_guard<std::mutex> lock(graph.mu());
  const size_t start = states_.size();
  for (unsigned char c : bytes) {
    const int32_t next = graph.Step(states_.back(), c);
    if (next == StateGraph::kDead) {
      states_.resize(start);
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
  const std::vector<int32_t>& tokens = v.node_tokens();
  for (int32_t c = n.child_begin; c < n.child_end; ++c) {
    const int32_t next = graph.Step(state, v.child_bytes()[c]);
    if (next == StateGraph::kDead) continue;
    const int32_t child = v.child_nodes()[c];
    const TokenVocab::Node& cn = v.nodes()[child];
    // Every byte below this trie node loops on `next` (inside a string, a number...): the whole
    // subtree's tokens are allowed without walking it.
    const ByteSet& below = v.subtree_bytes(child);
    const bool closed = below.none() || graph.LoopsOn(next, below);
    const int32_t end = closed ? v.subtree_token_end(child) : cn.token_end;
    for (int32_t t = cn.token_begin; t < end; ++t) {
      const int32_t id = tokens[t];
      mask[id >> 6] |= uint64_t{1} << (id & 63);
    }
    if (!closed) Walk(graph, child, next, mask);
  }
}

TokenMask GrammarMatcher::ComputeMaskLocked(StateGraph& graph) {
  TokenMask mask(grammar_->mask_words(), 0);
  Walk(graph, 0, states_.back(), mask.data());
  return mask;
}

TokenMask GrammarMatcher::ComputeMaskUncached() {
  StateGraph& graph = grammar_->graph();
  std::lock_guard<std::mutex> lock(graph.mu());
  return ComputeMaskLocked(graph);
}

std::shared_ptr<const TokenMask> GrammarMatcher::NextTokenMask() {
  const int32_t state = states_.back();
  if (auto hit = grammar_->FindMask(state)) return hit;
  std::shared_ptr<const TokenMask> mask;
  {
    StateGraph& graph = grammar_->graph();
    std::lock_guard<std::mutex> lock(graph.mu());
    mask = std::make_shared<const TokenMask>(ComputeMaskLocked(graph));
  }
  grammar_->StoreMask(state, mask);
  return mask;
}

}  // namespace tandem::grammar
