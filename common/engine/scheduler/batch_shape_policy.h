#pragma once

#include <cstdint>
#include <vector>

#include "common/engine/scheduler/sequence.h"

namespace tandem {

// Batch-shape policy: how one step's ragged batch is formed from the sequences the capacity
// policy lets in. Pure decisions over the numbers they are given; the Scheduler applies them.

// The order running sequences are offered a row in a step: decodes first (one token each, or
// 1 + k with a speculative proposal: cheap and latency-critical), then prefill chunks, each group
// in `running`'s (service) order. Waiting sequences join after both.
std::vector<Sequence*> RowOrder(const std::vector<Sequence*>& running);

// A decoding sequence's row.
struct DecodeRow {
  int64_t num_new_tokens = 0;  // its uncomputed token and the drafts kept
  int64_t num_drafts = 0;      // drafted tokens verified this step: a prefix of the proposal
};

// A decode row: the uncomputed token plus a proposal of `num_drafts` tokens, cut to the
// `budget_left` tokens of the step; drafts that do not fit are dropped.
DecodeRow ShapeDecode(int64_t num_uncomputed, int64_t num_drafts, int64_t budget_left);

// A prefill chunk (chunked prefill): the `num_to_compute` tokens still to compute, cut to the
// `budget_left` tokens of the step and to `max_prefill_chunk` (0: no cap of its own).
int64_t ShapePrefillChunk(int64_t num_to_compute, int64_t budget_left, int64_t max_prefill_chunk);

}  // namespace tandem
