#pragma once

// An Earley recognizer written independently of common/grammar's StateGraph (the reference the
// mask tests compare against): plain item sets per input byte, origins as byte positions.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/grammar/grammar.h"

namespace tandem::grammar {

// Textbook Earley (fixpoint closure, no nullable shortcut), a set per input byte.
class ReferenceRecognizer {
 public:
  explicit ReferenceRecognizer(const Grammar& g) : g_(g) {
    sets_.emplace_back();
    for (int32_t p : g_.rule_productions[g_.root]) Add(0, {p, 0, 0});
    Close(0);
  }

  bool Push(unsigned char byte) {
    const size_t cur = sets_.size() - 1;
    std::vector<Item> next;
    for (const Item& it : sets_[cur]) {
      if (it.dot == g_.Length(it.prod)) continue;
      const int32_t s = g_.SymbolAt(it.prod, it.dot);
      if (s < 0 && g_.terminals[~s].test(byte)) next.push_back({it.prod, it.dot + 1, it.origin});
    }
    if (next.empty()) return false;
    sets_.emplace_back();
    for (const Item& it : next) Add(cur + 1, it);
    Close(cur + 1);
    return true;
  }
  void Pop() { sets_.pop_back(); }
  size_t depth() const { return sets_.size(); }

 private:
  struct Item {
    int32_t prod, dot, origin;
    bool operator==(const Item& o) const {
      return prod == o.prod && dot == o.dot && origin == o.origin;
    }
  };
  void Add(size_t k, const Item& it) {
    for (const Item& x : sets_[k]) {
      if (x == it) return;
    }
    sets_[k].push_back(it);
  }
  void Close(size_t k) {
    for (bool changed = true; changed;) {
      changed = false;
      const size_t before = sets_[k].size();
      for (size_t i = 0; i < sets_[k].size(); ++i) {
        const Item it = sets_[k][i];
        if (it.dot < g_.Length(it.prod)) {
          const int32_t s = g_.SymbolAt(it.prod, it.dot);
          if (s >= 0) {
            for (int32_t p : g_.rule_productions[s]) Add(k, {p, 0, static_cast<int32_t>(k)});
          }
        } else {
          const int32_t lhs = g_.productions[it.prod].lhs;
          // By index: the origin may be set k itself, which Add grows (an item it appends is
          // seen here or on the next pass).
          const std::vector<Item>& origin = sets_[it.origin];
          for (size_t j = 0; j < origin.size(); ++j) {
            const Item w = origin[j];
            if (w.dot < g_.Length(w.prod) && g_.SymbolAt(w.prod, w.dot) == lhs) {
              Add(k, {w.prod, w.dot + 1, w.origin});
            }
          }
        }
      }
      changed = sets_[k].size() != before;
    }
  }
  const Grammar& g_;
  std::vector<std::vector<Item>> sets_;
};

}  // namespace tandem::grammar
