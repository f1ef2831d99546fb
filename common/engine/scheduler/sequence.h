#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/engine/kv/kv_cache_manager.h"
#include "common/engine/sampler/rng.h"
#include "common/engine/sampler/sampling_params.h"
#include "common/engine/scheduler/sequence_state.h"

namespace tandem {

enum class SeqStatus {
  kWaiting,  // queued for admission (or preempted)
  kPending,  // not admitted yet, and not admissible until an external resource is ready
             // (Scheduler::Hold before admission: e.g. a grammar still compiling)
  kRunning,
  kAwaiting,  // admitted (holds a sequence slot and its blocks) but not runnable until an
              // external resource is ready (decode role: the prompt's KV from a prefill worker;
              // Scheduler::Hold of a running sequence)
  kFinished,
};

enum class FinishReason {
  kNone = 0,
  kStop,    // end-of-sequence token, a stop token id or a stop string
  kLength,  // max_tokens or the model's context length
  kAbort,   // cancelled by the client or the server
  kError,   // failed; see the status
};

const char* FinishReasonName(FinishReason reason);

// One generated sample of a request (a request with n > 1 has n sequences). Owned by the
// engine; the scheduler moves pointers between its queues. Engine thread only. The core fields
// (identity, tokens, KV, sampling) come first; each feature's state is one struct
// (sequence_state.h), copied as a unit when samples fork.
// Overlapped steps (common/engine/README.md): the last token of a sequence whose step is in
// flight, sampled on the device and not known on the host yet.
inline constexpr int32_t kPendingToken = -1;

struct Sequence {
  Sequence() = default;
  Sequence(const Sequence&) = delete;
  Sequence& operator=(const Sequence&) = delete;
  Sequence(Sequence&&) = default;
  Sequence& operator=(Sequence&&) = default;

  int64_t seq_id = 0;          // engine-unique
  uint64_t arrival_order = 0;  // admission order of the request (FCFS tie-break)
  std::string request_id;
  int32_t index = 0;          // sample index within the request
  int32_t pending_forks = 0;  // samples to fork from this one once its prompt is computed
  int32_t priority = 0;       // lower value runs first (vLLM convention)

  std::vector<int32_t> tokens;  // prompt followed by output
  int64_t prompt_len = 0;
  int64_t num_computed = 0;  // leading tokens whose KV is in `blocks`
  SequenceBlocks blocks;

  SamplingParams params;
  Rng rng;

  SeqStatus status = SeqStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  int32_t waits = 0;  // external resources still awaited (Scheduler::Hold / Release)

  SpecState spec;
  GrammarState grammar;
  DisaggState disagg;
  LoraState lora;
  SequenceTiming timing;
  SequenceUsage usage;
  FeatureSlots features;  // features registered at run time

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_output() const { return num_tokens() - prompt_len; }
  // Tokens still to run through the model before the next token can be sampled.
  int64_t num_uncomputed() const { return num_tokens() - num_computed; }
  bool is_prefill() const { return num_uncomputed() > 1; }
};

// Sample `index` of `parent`'s request, forked once the parent's prompt is computed (n > 1): the
// identity, tokens, computed length and sampling parameters of the parent and a copy of every
// feature state unit (SequenceUsage::ForkedSample for the usage). The caller gives it its KV
// blocks (KvCacheManager::Fork), its random stream and its place in the scheduler.
std::unique_ptr<Sequence> ForkSample(const Sequence& parent, int64_t seq_id, int32_t index);

}  // namespace tandem
