#include "tools/bench/kv_occupancy.h"

#include <algorithm>

namespace tandem::bench {
namespace {

int64_t RoundUpToBlocks(int64_t tokens, int64_t block_size) {
  return (tokens + block_size - 1) / block_size * block_size;
}

}  // namespace

KvSlots& KvSlots::operator+=(const KvSlots& o) {
  filled += o.filled;
  paged += o.paged;
  static_reservation += o.static_reservation;
  max_len += o.max_len;
  return *this;
}

KvSlots SlotsOfSequence(int64_t prompt_len, int64_t computed, int64_t max_tokens,
                        int64_t block_size, int64_t max_model_len) {
  KvSlots s;
  s.filled = computed;
  s.paged = RoundUpToBlocks(computed, block_size);
  s.static_reservation = RoundUpToBlocks(prompt_len + max_tokens, block_size);
  s.max_len = std::max(RoundUpToBlocks(max_model_len, block_size), s.static_reservation);
  return s;
}

KvSlots SlotsOverDecodeSteps(int64_t prompt_len, int64_t output_tokens, int64_t max_tokens,
                             int64_t block_size, int64_t max_model_len) {
  KvSlots total;
  for (int64_t k = 0; k < output_tokens; ++k) {
    total += SlotsOfSequence(prompt_len, prompt_len + k, max_tokens, block_size, max_model_len);
  }
  return total;
}

double WasteFraction(int64_t reserved, int64_t filled) {
  if (reserved <= 0) return 0;
  return static_cast<double>(reserved - filled) / static_cast<double>(reserved);
}

}  // namespace tandem::bench
