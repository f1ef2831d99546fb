#pragma once

#include <cstdint>
#include <vector>

#include "common/engine/kv/kv_cache_manager.h"
#include "common/engine/scheduler/sequence.h"

namespace tandem {

// Static batching, as servers without continuous batching run it: the benchmark baselines that
// `--scheduling-policy static|static-compact` select to measure continuous batching against.
// Production never runs it: the Scheduler consults a StaticBatching only when
// SchedulerOptions::baseline names one. A batch is admitted when the previous one has finished,
// each member with KV reserved for prompt + max_tokens; nothing joins it until it is done.
enum class BatchingBaseline {
  kNone,           // continuous batching (production)
  kStatic,         // fixed shape (HF generate, FasterTransformer): a member that finishes stays
                   // in the batch as a padding row, computed and discarded every step, its KV
                   // held, until the whole batch is done
  kStaticCompact,  // the same, but a finished member leaves the batch (its row is not computed)
};

// kStatic: a finished member of the running batch. Each step recomputes `token` at `pos` (the
// slot after the last computed one, inside its own reservation), so it costs what a decode row
// costs and never grows.
struct PaddingRow {
  SequenceBlocks blocks;
  int32_t token = 0;
  int32_t pos = 0;
};

class StaticBatching {
 public:
  StaticBatching(BatchingBaseline baseline, KvCacheManager* kv);

  // Waiting sequences join only between batches: when no sequence was running as the step began.
  static bool MayAdmit(bool batch_running) { return !batch_running; }
  // Tokens whose KV an admitted sequence reserves: its prompt and all it may generate.
  static int64_t ReserveTo(const Sequence& seq) { return seq.prompt_len + seq.params.max_tokens; }

  // A running member left the batch (`batch_running`: others are still running). kStatic keeps
  // its blocks as a padding row and returns true; otherwise (or when the row would write a block
  // another sequence shares) false, and the caller frees them.
  bool KeepAsPadding(Sequence* seq, bool batch_running);
  // The batch is done when nothing runs: its padding rows' blocks go back to the pool.
  void ReleaseIfBatchDone(bool batch_running);
  const std::vector<PaddingRow>& padding() const { return padding_; }

 private:
  BatchingBaseline baseline_;
  KvCacheManager* kv_;
  std::vector<PaddingRow> padding_;
};

}  // namespace tandem
