#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

namespace tandem::grammar {

class CompiledGrammar;

// Counters of a GrammarMemory (a snapshot).
struct GrammarMemoryStats {
  int64_t max_bytes = 0;
  int64_t bytes = 0;         // every live grammar charged here, cached or held by sequences
  int64_t cached_bytes = 0;  // of which the grammars in the cache
  int64_t entries = 0;       // grammars in the cache
  int64_t live = 0;          // grammars alive (cached, in use, or both)
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t evictions = 0;        // cached grammars dropped to stay within the bytes (or count)
  int64_t trims = 0;            // mask / position caches of live grammars cleared for bytes
  int64_t refused_states = 0;   // parser states refused because the budget was full
  int64_t refused_caching = 0;  // masks / position sets left uncached because it was full
};

// One byte budget over every grammar a compiler made, and the cache of those grammars by
// content. Each CompiledGrammar made with it charges what it really holds: its grammar
// structure at construction, then its state graph, per-state masks and per-position token sets
// as they grow while decoding, and releases it all when destroyed.
//
// When a charge takes the total past `max_bytes`, the memory is reclaimed in this order:
//  1. cached grammars no sequence holds, least recently used first, are evicted (destroyed);
//  2. the mask and position caches of live grammars, largest first, are cleared (they are
//     recomputed when needed; a grammar in use stays alive through its shared_ptr, but these
//     lazily grown caches do not);
//  3. if still over: a mask or position set is simply not cached, and a new parser state is
//     refused (the sequence that needed it ends with RESOURCE_EXHAUSTED) only when its grammar
//     holds more than an equal share (max_bytes / live grammars), so one tenant's huge grammar is
//     cut before anyone else's ordinary one. States of grammars within their share are still
//     made: the total stays below max_bytes plus the in-use grammars' shares (2 x max_bytes at
//     worst), and each graph keeps its own bound (CompiledGrammarOptions::max_graph_bytes).
// A grammar whose state graph reached its own bound is dropped from the cache on its next lookup
// (the next request compiles a fresh graph).
//
// Cached grammars hold the GrammarMemory they are charged to: its owner calls Clear() before
// letting it go (GrammarCompiler does), or the two keep each other alive.
//
// Thread-safe. Lock order: a grammar's graph mutex, then this one, then a grammar's cache
// mutex; nothing here takes a graph mutex, and grammars are destroyed outside this lock.
class GrammarMemory {
 public:
  // `max_entries` > 0 also bounds the number of cached grammars.
  explicit GrammarMemory(int64_t max_bytes, int64_t max_entries = 0);
  ~GrammarMemory();
  GrammarMemory(const GrammarMemory&) = delete;
  GrammarMemory& operator=(const GrammarMemory&) = delete;

  // The cached grammar for `key` (now most recently used), or null.
  std::shared_ptr<const CompiledGrammar> Find(const std::string& key);
  // Caches `grammar` under `key` (an entry already there stays), then reclaims past the budget.
  void Insert(const std::string& key, std::shared_ptr<const CompiledGrammar> grammar);
  // Drops every cache entry (their grammars are destroyed unless a sequence still holds them).
  void Clear();

  int64_t max_bytes() const { return max_bytes_; }
  int64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  GrammarMemoryStats stats() const;

 private:
  friend class CompiledGrammar;
  // kAllocated: already allocated (a grammar's structure, a grown hash table): never refused,
  // but still reclaims. kGraph: a new parser state. kCache: a mask or position set.
  enum class Kind { kAllocated, kGraph, kCache };
  using Dropped = std::vector<std::shared_ptr<const CompiledGrammar>>;

  void Register(CompiledGrammar* grammar);
  // Unregisters and releases `bytes` (what the grammar still had charged).
  void Unregister(CompiledGrammar* grammar, int64_t bytes);
  // Charges `delta` > 0 bytes for `grammar` (reclaiming past the budget, see above); false: the
  // caller must not allocate them (nothing stays charged). kAllocated is never refused.
  bool Charge(const CompiledGrammar* grammar, int64_t delta, Kind kind);
  void Release(int64_t bytes) { bytes_.fetch_sub(bytes, std::memory_order_relaxed); }
  // Steps 1 (`evict`) or 2 (trim) of the reclaim; mu_ held. Evicted grammars are moved to
  // `dropped` for the caller to destroy after unlocking.
  void EvictLocked(Dropped* dropped);
  void TrimLocked();
  bool Over() const { return bytes() > max_bytes_; }

  const int64_t max_bytes_;
  const int64_t max_entries_;
  std::atomic<int64_t> bytes_{0};
  mutable std::mutex mu_;
  std::list<std::string> lru_;  // most recent first
  struct Entry {
    std::shared_ptr<const CompiledGrammar> grammar;
    std::list<std::string>::iterator lru;
  };
  absl::flat_hash_map<std::string, Entry> cache_;
  absl::flat_hash_set<CompiledGrammar*> live_;
  int64_t hits_ = 0;
  int64_t misses_ = 0;
  int64_t evictions_ = 0;
  int64_t trims_ = 0;
  std::atomic<int64_t> refused_states_{0};
  std::atomic<int64_t> refused_caching_{0};
};

}  // namespace tandem::grammar
