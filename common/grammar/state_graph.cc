#include "common/grammar/state_graph.h"

#include <algorithm>
#include <cstring>

namespace tandem::grammar {
namespace {

constexpr int32_t kUnknown = -2;

uint64_t Key(int32_t prod, int32_t dot, int32_t origin) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(prod)) << 40) ^
         (static_cast<uint64_t>(static_cast<uint32_t>(dot)) << 28) ^
         static_cast<uint64_t>(static_cast<uint32_t>(origin));
}

}  // namespace

StateGraph::StateGraph(const Grammar* grammar, int64_t max_bytes, bool keep_complete_items)
    : g_(grammar), max_bytes_(max_bytes), keep_complete_items_(keep_complete_items) {
  std::vector<Item> items;
  for (int32_t p : g_->rule_productions[g_->root]) items.push_back({p, 0, kSelf});
  Closure(&items);
  Intern(std::move(items));
  CountTables();
}

bool StateGraph::Closure(std::vector<Item>* items) {
  seen_.clear();
  for (const Item& it : *items) seen_[Key(it.prod, it.dot, it.origin)] = true;
  auto add = [&](const Item& it) {
    if (seen_.emplace(Key(it.prod, it.dot, it.origin), true).second) items->push_back(it);
  };
  for (size_t i = 0; i < items->size(); ++i) {
    if (budget_ != nullptr && !budget_->Check().ok()) {
      interrupted_ = true;
      return false;
    }
    const Item it = (*items)[i];
    if (it.dot < g_->Length(it.prod)) {
      const int32_t sym = g_->SymbolAt(it.prod, it.dot);
      if (sym < 0) continue;
      for (int32_t p : g_->rule_productions[sym]) add({p, 0, kSelf});
      // Aycock-Horspool: a nullable rule may be skipped at once.
      if (g_->nullable[sym]) add({it.prod, it.dot + 1, it.origin});
      continue;
    }
    // An empty completion (origin kSelf) is covered by the nullable skip above; an external
    // origin is the unknown context of a position (Intern marks the state as popping).
    if (it.origin == kSelf || it.origin == kExternal) continue;
    const int32_t lhs = g_->productions[it.prod].lhs;
    const int32_t o = it.origin;
    for (const Item& w : states_[o].items) {
      if (w.dot < g_->Length(w.prod) && g_->SymbolAt(w.prod, w.dot) == lhs) {
        add({w.prod, w.dot + 1, w.origin == kSelf ? o : w.origin});
      }
    }
  }
  return true;
}

void StateGraph::CountTables() {
  const int64_t tables =
      static_cast<int64_t>(ids_.capacity() * (sizeof(std::pair<const std::string, int32_t>) + 1) +
                           seen_.capacity() * (sizeof(std::pair<const uint64_t, bool>) + 1));
  const int64_t delta = tables - table_bytes_;
  if (delta == 0) return;
  table_bytes_ = tables;
  bytes_ += delta;
  if (charge_) charge_(delta, /*may_refuse=*/false);
}

void StateGraph::set_charge(ChargeFn charge) {
  charge_ = std::move(charge);
  if (charge_) charge_(bytes_, /*may_refuse=*/false);
}

int32_t StateGraph::Intern(std::vector<Item> items) {
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    if (a.prod != b.prod) return a.prod < b.prod;
    if (a.dot != b.dot) return a.dot < b.dot;
    return a.origin < b.origin;
  });
  // Complete items are done with once the closure ran (nothing scans or completes into them
  // later); only the flags they set stay. Dropping them keeps states that differ only in an
  // already-completed item (the previous character of a string) one state, so loops close.
  bool accepting = false, pops = false;
  size_t kept = 0;
  for (const Item& i : items) {
    if (i.dot < g_->Length(i.prod) || keep_complete_items_) {
      items[kept++] = i;
    }
    if (i.dot < g_->Length(i.prod)) {
      continue;
    } else if (i.origin == kExternal) {
      pops = true;
    } else if (g_->productions[i.prod].lhs == g_->root &&
               (i.origin == 0 || (i.origin == kSelf && states_.empty()))) {
      accepting = true;
    }
  }
  items.resize(kept);
  std::string key(items.size() * sizeof(Item) + 1, '\0');
  if (!items.empty()) std::memcpy(key.data(), items.data(), items.size() * sizeof(Item));
  key.back() = static_cast<char>((accepting ? 1 : 0) | (pops ? 2 : 0));
  auto it = ids_.find(key);
  if (it != ids_.end()) return it->second;
  // Memory of a state: its own allocation and the deque's pointer to it, its items, and its key
  // in the index when longer than the string's inline buffer (malloc's header counted as 16
  // bytes an allocation). The index's slots are counted by CountTables.
  constexpr int64_t kMalloc = 16;
  const int64_t cost =
      static_cast<int64_t>(sizeof(State)) + kMalloc + 2 * static_cast<int64_t>(sizeof(void*)) +
      (items.empty() ? 0 : static_cast<int64_t>(items.size() * sizeof(Item)) + kMalloc) +
      (key.size() < 16 ? 0 : (static_cast<int64_t>(key.size()) + 16) / 16 * 16 + kMalloc);
  if (!states_.empty() && bytes_ + cost > max_bytes_) {
    exhausted_ = true;
    ++refusals_;
    last_refusal_charged_ = false;
    return kExhausted;
  }
  if (!states_.empty() && charge_ && !charge_(cost, /*may_refuse=*/true)) {
    ++refusals_;
    ++charge_refusals_;
    last_refusal_charged_ = true;
    return kExhausted;
  }
  bytes_ += cost;
  items.shrink_to_fit();  // the closure's growth slack is not kept for the graph's lifetime
  State s;
  s.items = std::move(items);
  s.accepting = accepting;
  s.pops = pops;
  for (const Item& i : s.items) {
    if (i.dot == g_->Length(i.prod)) continue;
    const int32_t sym = g_->SymbolAt(i.prod, i.dot);
    if (sym < 0) s.next |= g_->terminals[~sym];
  }
  std::fill(std::begin(s.transitions), std::end(s.transitions), kUnknown);
  s.position = kUnknown;
  s.erased = kUnknown;
  const int32_t id = static_cast<int32_t>(states_.size());
  states_.push_back(std::move(s));
  ids_.emplace(std::move(key), id);
  CountTables();
  return id;
}

int32_t StateGraph::Step(int32_t state, uint8_t byte) {
  int32_t t = states_[state].transitions[byte];
  if (t != kUnknown) return t;
  if (interrupted_) return kInterrupted;
  if (!states_[state].next.test(byte)) {
    states_[state].transitions[byte] = kDead;
    return kDead;
  }
  std::vector<Item> items;
  for (const Item& it : states_[state].items) {
    if (it.dot >= g_->Length(it.prod)) continue;
    const int32_t sym = g_->SymbolAt(it.prod, it.dot);
    if (sym < 0 && g_->terminals[~sym].test(byte)) {
      items.push_back({it.prod, it.dot + 1, it.origin == kSelf ? state : it.origin});
    }
  }
  if (!Closure(&items)) return kInterrupted;  // not memoised, like a refusal
  CountTables();
  t = items.empty() ? kDead : Intern(std::move(items));
  if (t == kExhausted) return t;  // not memoised: the answer is no property of the grammar
  states_[state].transitions[byte] = t;
  return t;
}

int32_t StateGraph::Erased(int32_t state) {
  if (states_[state].erased != kUnknown) return states_[state].erased;
  std::vector<Item> items = states_[state].items;
  bool external = false;
  for (Item& it : items) {
    if (it.origin != kSelf) {
      it.origin = kExternal;
      external = true;
    }
  }
  const int32_t e = external ? Intern(std::move(items)) : state;
  if (e == kExhausted) return e;
  states_[state].erased = e;
  return e;
}

int32_t StateGraph::Position(int32_t state) {
  if (states_[state].position != kUnknown) return states_[state].position;
  std::vector<Item> items = states_[state].items;
  bool external = false;
  for (Item& it : items) {
    if (it.origin == kSelf) continue;
    const int32_t e = Erased(it.origin);
    if (e == kExhausted) return e;
    external |= e != it.origin;
    it.origin = e;
  }
  const int32_t p = external ? Intern(std::move(items)) : state;
  if (p == kExhausted) return p;
  states_[state].position = p;
  return p;
}

bool StateGraph::LoopsOn(int32_t state, const ByteSet& bytes) {
  // (A refused or interrupted step is no loop: the caller walks the subtree and sees it there.)
  if ((bytes & ~states_[state].next).any() || (bytes & states_[state].loop_no).any()) return false;
  const ByteSet unknown = bytes & ~states_[state].loop_yes;
  for (size_t b = unknown._Find_first(); b < unknown.size(); b = unknown._Find_next(b)) {
    const int32_t next = Step(state, static_cast<uint8_t>(b));
    if (next == state) {
      states_[state].loop_yes.set(b);
    } else if (next == kExhausted || next == kInterrupted) {
      return false;
    } else {
      states_[state].loop_no.set(b);
      return false;
    }
  }
  return true;
}

}  // namespace tandem::grammar
