#pragma once

#include <cstdint>

namespace tandem::bench {

// KV-cache token slots of running sequences: how many hold computed tokens (filled) and how
// many each reservation scheme holds for them. Waste = (reserved - filled) / reserved.
struct KvSlots {
  int64_t filled = 0;
  int64_t paged = 0;               // paged pool: whole blocks up to the computed tokens
  int64_t static_reservation = 0;  // static batching: blocks for prompt + max_tokens from the start
  int64_t max_len = 0;             // reserve-max-length baseline: max_model_len slots per sequence

  KvSlots& operator+=(const KvSlots& o);
};

// Slots of one running sequence with `computed` tokens in the KV cache (prompt + generated
// tokens but the last one sampled), whose request asked for max_tokens.
KvSlots SlotsOfSequence(int64_t prompt_len, int64_t computed, int64_t max_tokens,
                        int64_t block_size, int64_t max_model_len);

// The same summed over every decode step of a finished sequence: the sequence holds
// prompt_len + k computed tokens at decode step k = 0 .. output_tokens - 1. This is the
// sequence's contribution to the time-averaged occupancy when steps take equal time.
KvSlots SlotsOverDecodeSteps(int64_t prompt_len, int64_t output_tokens, int64_t max_tokens,
                             int64_t block_size, int64_t max_model_len);

// (reserved - filled) / reserved, 0 when nothing is reserved.
double WasteFraction(int64_t reserved, int64_t filled);

}  // namespace tandem::bench
