#include "common/grammar/compiled_grammar.h"

#include <algorithm>

namespace tandem::grammar {
namespace {

// Heap bytes an allocation of `n` bytes takes (glibc: a 16-byte header, 16-byte granules).
int64_t Alloc(int64_t n) { return n <= 0 ? 0 : (n + 8 + 15) / 16 * 16; }

template <typename T>
int64_t VectorHeap(const std::vector<T>& v) {
  return Alloc(static_cast<int64_t>(v.capacity() * sizeof(T)));
}

// The grammar structure's heap.
int64_t GrammarBytes(const Grammar& g) {
  int64_t n = VectorHeap(g.terminals) + VectorHeap(g.productions) + VectorHeap(g.symbols) +
              VectorHeap(g.rule_productions) + VectorHeap(g.rule_names) +
              Alloc(static_cast<int64_t>(g.nullable.capacity() / 8));
  for (const auto& prods : g.rule_productions) n += VectorHeap(prods);
  for (const std::string& name : g.rule_names) {
    if (name.capacity() > 15) n += Alloc(static_cast<int64_t>(name.capacity()) + 1);
  }
  return n;
}

// A hash map entry of the caches: the slot and its control byte, twice for the table's load.
template <typename Map>
constexpr int64_t kSlot = 2 * static_cast<int64_t>(sizeof(typename Map::slot_type) + 1);

// A cached mask: the vector's words, the shared_ptr's block holding the vector, the map entry.
int64_t MaskBytes(const TokenMask& mask) {
  return Alloc(static_cast<int64_t>(mask.size() * sizeof(uint64_t))) +
         Alloc(static_cast<int64_t>(sizeof(TokenMask)) + 16) +
         kSlot<absl::flat_hash_map<int32_t, std::shared_ptr<const TokenMask>>>;
}

int64_t PositionBytes(const PositionTokens& p) {
  return Alloc(static_cast<int64_t>(p.accepted.capacity() * sizeof(uint64_t))) +
         Alloc(static_cast<int64_t>(p.uncertain.capacity() * sizeof(int32_t))) +
         Alloc(static_cast<int64_t>(sizeof(PositionTokens)) + 16) +
         kSlot<absl::flat_hash_map<int32_t, std::shared_ptr<const PositionTokens>>>;
}

constexpr int64_t kSeenBytes = kSlot<absl::flat_hash_set<int32_t>>;

}  // namespace

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocab> vocab,
                                 const CompiledGrammarOptions& options,
                                 std::shared_ptr<GrammarMemory> memory)
    : CompiledGrammar(std::move(grammar), std::move(vocab), options, std::move(memory),
                      /*keep_complete_items=*/false) {}

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocab> vocab,
                                 const CompiledGrammarOptions& options,
                                 std::shared_ptr<GrammarMemory> memory, bool keep_complete_items)
    : grammar_(std::move(grammar)),
      vocab_(std::move(vocab)),
      memory_(std::move(memory)),
      graph_(new StateGraph(&grammar_, options.max_graph_bytes, keep_complete_items)),
      max_mask_bytes_(options.max_mask_cache_bytes),
      max_position_bytes_(options.max_position_cache_bytes) {
  if (memory_ != nullptr) memory_->Register(this);
  // The structure exists already (never refused); a new parser state may be.
  Charge(static_cast<int64_t>(sizeof(*this) + sizeof(StateGraph)) + GrammarBytes(grammar_),
         GrammarMemory::Kind::kAllocated);
  graph_->set_charge([this](int64_t delta, bool may_refuse) {
    return Charge(delta,
                  may_refuse ? GrammarMemory::Kind::kGraph : GrammarMemory::Kind::kAllocated);
  });
}

CompiledGrammar::~CompiledGrammar() {
  // First: once unregistered no reclaim touches this grammar's caches.
  if (memory_ != nullptr) memory_->Unregister(this, memory_bytes());
}

bool CompiledGrammar::Charge(int64_t delta, GrammarMemory::Kind kind) const {
  if (delta > 0 && memory_ != nullptr && !memory_->Charge(this, delta, kind)) return false;
  if (delta < 0 && memory_ != nullptr) memory_->Release(-delta);
  charged_.fetch_add(delta, std::memory_order_relaxed);
  return true;
}

std::shared_ptr<const TokenMask> CompiledGrammar::FindMask(int32_t state) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = masks_.find(state);
  if (it == masks_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  return it->second;
}

void CompiledGrammar::StoreMask(int32_t state, std::shared_ptr<const TokenMask> mask) const {
  const int64_t bytes = MaskBytes(*mask);
  // Charged before taking mu_ (a reclaim may clear this grammar's caches).
  if (!Charge(bytes, GrammarMemory::Kind::kCache)) return;
  int64_t freed = 0;
  bool stored;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Bounded: when full, start over (states in use are recomputed once).
    if (mask_bytes_ + bytes > max_mask_bytes_) {
      freed = mask_bytes_;
      masks_ = {};
      mask_bytes_ = 0;
    }
    stored = masks_.emplace(state, std::move(mask)).second;
    if (stored) mask_bytes_ += bytes;
    cache_bytes_.store(mask_bytes_ + position_bytes_, std::memory_order_relaxed);
  }
  Charge(-(freed + (stored ? 0 : bytes)), GrammarMemory::Kind::kCache);
}

std::shared_ptr<const PositionTokens> CompiledGrammar::FindPosition(int32_t position) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = positions_.find(position);
  if (it == positions_.end()) {
    ++position_misses_;
    return nullptr;
  }
  ++position_hits_;
  return it->second;
}

void CompiledGrammar::StorePosition(int32_t position,
                                    std::shared_ptr<const PositionTokens> tokens) const {
  const int64_t bytes = PositionBytes(*tokens);
  if (!Charge(bytes, GrammarMemory::Kind::kCache)) return;
  int64_t freed = 0;
  bool stored;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Bounded like the masks: when full, start over.
    if (position_bytes_ + bytes > max_position_bytes_) {
      freed = position_bytes_;
      positions_ = {};
      seen_positions_ = {};
      position_bytes_ = 0;
    }
    stored = positions_.emplace(position, std::move(tokens)).second;
    if (stored) position_bytes_ += bytes;
    cache_bytes_.store(mask_bytes_ + position_bytes_, std::memory_order_relaxed);
  }
  Charge(-(freed + (stored ? 0 : bytes)), GrammarMemory::Kind::kCache);
}

bool CompiledGrammar::FirstSightOf(int32_t position) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (seen_positions_.contains(position)) return false;
  }
  // Not recorded when the budget refuses: the position is then served by direct walks.
  if (!Charge(kSeenBytes, GrammarMemory::Kind::kCache)) return true;
  int64_t freed = 0;
  bool inserted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Bounded with the position sets.
    if (position_bytes_ + kSeenBytes > max_position_bytes_) {
      freed = position_bytes_;
      positions_ = {};
      seen_positions_ = {};
      position_bytes_ = 0;
    }
    inserted = seen_positions_.insert(position).second;
    if (inserted) position_bytes_ += kSeenBytes;
    cache_bytes_.store(mask_bytes_ + position_bytes_, std::memory_order_relaxed);
  }
  Charge(-(freed + (inserted ? 0 : kSeenBytes)), GrammarMemory::Kind::kCache);
  return inserted;
}

int64_t CompiledGrammar::ClearCachesLocked() const {
  const int64_t freed = mask_bytes_ + position_bytes_;
  masks_ = {};
  positions_ = {};
  seen_positions_ = {};
  mask_bytes_ = 0;
  position_bytes_ = 0;
  cache_bytes_.store(0, std::memory_order_relaxed);
  return freed;
}

int64_t CompiledGrammar::ClearCaches() const {
  int64_t freed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    freed = ClearCachesLocked();
  }
  Charge(-freed, GrammarMemory::Kind::kCache);
  return freed;
}

int64_t CompiledGrammar::cache_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

int64_t CompiledGrammar::cache_misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

int64_t CompiledGrammar::position_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return position_hits_;
}

int64_t CompiledGrammar::position_misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return position_misses_;
}

}  // namespace tandem::grammar
