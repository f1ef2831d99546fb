#include "common/grammar/grammar_memory.h"

#include <algorithm>

#include "common/grammar/compiled_grammar.h"

namespace tandem::grammar {

GrammarMemory::GrammarMemory(int64_t max_bytes, int64_t max_entries)
    : max_bytes_(max_bytes), max_entries_(max_entries) {}

GrammarMemory::~GrammarMemory() { Clear(); }

std::shared_ptr<const CompiledGrammar> GrammarMemory::Find(const std::string& key) {
  Dropped dropped;  // destroyed after the lock is released (a grammar unregisters)
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(key);
  if (it != cache_.end() && it->second.grammar->graph().exhausted()) {
    // Its graph reached its bound: new requests get a fresh one.
    dropped.push_back(std::move(it->second.grammar));
    lru_.erase(it->second.lru);
    cache_.erase(it);
    it = cache_.end();
  }
  if (it == cache_.end()) {
    ++misses_;
    return nullptr;
  }
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  ++hits_;
  return it->second.grammar;
}

void GrammarMemory::Insert(const std::string& key, std::shared_ptr<const CompiledGrammar> grammar) {
  Dropped dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cache_.contains(key)) return;
    lru_.push_front(key);
    cache_[key] = {std::move(grammar), lru_.begin()};
    if (Over() || (max_entries_ > 0 && static_cast<int64_t>(cache_.size()) > max_entries_)) {
      EvictLocked(&dropped);
    }
  }
  dropped.clear();  // destroyed outside the lock (they unregister)
  if (Over()) {
    std::lock_guard<std::mutex> lock(mu_);
    TrimLocked();
  }
}

void GrammarMemory::Clear() {
  Dropped dropped;  // destroyed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, entry] : cache_) dropped.push_back(std::move(entry.grammar));
  cache_.clear();
  lru_.clear();
}

void GrammarMemory::EvictLocked(Dropped* dropped) {
  // Least recently used first; a grammar some sequence holds (use_count > 1: the cache's
  // reference is not the only one, and under mu_ no new reference can be taken from the cache)
  // stays, since evicting it would free nothing. Over the count bound every entry may go.
  int64_t pending = 0;  // bytes the grammars already in `dropped` will release
  for (auto it = lru_.end(); it != lru_.begin();) {
    --it;
    const bool over_count = max_entries_ > 0 && static_cast<int64_t>(cache_.size()) > max_entries_;
    if (!over_count && bytes() - pending <= max_bytes_) break;
    auto entry = cache_.find(*it);
    const bool unused = entry->second.grammar.use_count() == 1;
    if (!over_count && !unused) continue;
    if (unused) pending += entry->second.grammar->memory_bytes();
    dropped->push_back(std::move(entry->second.grammar));
    cache_.erase(entry);
    it = lru_.erase(it);
    ++evictions_;
  }
}

void GrammarMemory::TrimLocked() {
  std::vector<std::pair<int64_t, CompiledGrammar*>> by_size;
  for (CompiledGrammar* g : live_) by_size.push_back({g->cache_bytes(), g});
  std::sort(by_size.begin(), by_size.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [size, g] : by_size) {
    if (!Over() || size == 0) break;
    const int64_t freed = g->ClearCaches();
    if (freed > 0) ++trims_;
  }
}

bool GrammarMemory::Charge(const CompiledGrammar* grammar, int64_t delta, Kind kind) {
  if (bytes_.fetch_add(delta, std::memory_order_relaxed) + delta <= max_bytes_) return true;
  Dropped dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    EvictLocked(&dropped);
  }
  dropped.clear();
  if (!Over()) return true;
  int64_t live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TrimLocked();
    live = std::max<int64_t>(1, static_cast<int64_t>(live_.size()));
  }
  if (!Over() || kind == Kind::kAllocated) return true;
  const bool refuse = kind == Kind::kCache || grammar->memory_bytes() + delta > max_bytes_ / live;
  if (!refuse) return true;
  Release(delta);
  (kind == Kind::kCache ? refused_caching_ : refused_states_)
      .fetch_add(1, std::memory_order_relaxed);
  return false;
}

void GrammarMemory::Register(CompiledGrammar* grammar) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.insert(grammar);
}

void GrammarMemory::Unregister(CompiledGrammar* grammar, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.erase(grammar);
  Release(bytes);
}

GrammarMemoryStats GrammarMemory::stats() const {
  GrammarMemoryStats s;
  std::lock_guard<std::mutex> lock(mu_);
  s.max_bytes = max_bytes_;
  s.bytes = bytes();
  for (const auto& [key, entry] : cache_) s.cached_bytes += entry.grammar->memory_bytes();
  s.entries = static_cast<int64_t>(cache_.size());
  s.live = static_cast<int64_t>(live_.size());
  s.hits = hits_;
  s.misses = misses_;
  s.evictions = evictions_;
  s.trims = trims_;
  s.refused_states = refused_states_.load(std::memory_order_relaxed);
  s.refused_caching = refused_caching_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace tandem::grammar
