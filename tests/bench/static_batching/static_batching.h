#pragma once

// Static batching, as servers without continuous batching run it: the baselines the batching
// benchmark (scripts/bench/batching.sh) measures continuous batching against. Benchmark-only: a
// library that the benchmark server (tandem_bench_serve) and its tests link; the serving path
// never contains it. It plugs into the engine as a BatchingPolicy for the scheduler plus, for the
// fixed-shape baseline, a feature that computes the padding rows (EngineOptions::extensions).
//
// A batch is admitted when the previous one has finished, each member with KV reserved for
// prompt + max_tokens; nothing joins it until it is done.

#include <cstdint>
#include <functional>
#include <vector>

#include "common/engine/engine_feature.h"
#include "common/engine/kv/kv_cache_manager.h"
#include "common/engine/scheduler/batching_policy.h"
#include "common/engine/scheduler/sequence.h"

namespace tandem {

enum class StaticBaseline {
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

class StaticBatching final : public BatchingPolicy {
 public:
  StaticBatching(StaticBaseline baseline, KvCacheManager* kv);

  // Waiting sequences join only between batches: when no sequence was running as the step began.
  bool MayAdmit(bool batch_running) const override { return !batch_running; }
  // An admitted sequence reserves its prompt and all it may generate.
  int64_t ReserveTo(const Sequence& seq, int64_t /*chunk_end*/) const override {
    return seq.prompt_len + seq.params.max_tokens;
  }
  // kStatic keeps a member that leaves a batch still running as a padding row (unless the row
  // would write a block another sequence shares); the scheduler frees what is left in `seq`.
  void OnLeave(Sequence* seq, bool others_running) override;
  // The batch is done when nothing runs: its padding rows' blocks go back to the pool.
  void AfterRemoval(bool running) override;

  const std::vector<PaddingRow>& padding() const { return padding_; }

 private:
  StaticBaseline baseline_;
  KvCacheManager* kv_;
  std::vector<PaddingRow> padding_;
};

// Computes a StaticBatching's padding rows in every step (appended to the batch, logits never
// sampled) and counts their blocks in the KV occupancy statistics.
class PaddingRowsFeature final : public EngineFeature {
 public:
  explicit PaddingRowsFeature(const StaticBatching* batching) : batching_(batching) {}
  const char* name() const override { return "static batching padding rows"; }

  void BeforeForward(const SchedulerOutput& plan, const std::vector<Sequence*>& sampled,
                     ForwardBatch* batch) override;
  void AddStats(EngineStats* stats) const override;

  // Padding rows computed so far (one per row per step).
  int64_t rows_computed() const { return rows_computed_; }

 private:
  const StaticBatching* batching_;
  int64_t rows_computed_ = 0;
};

// What each engine made by StaticBaselineExtensions got (for tests).
struct StaticBaselineParts {
  StaticBatching* batching = nullptr;
  PaddingRowsFeature* padding = nullptr;  // null for kStaticCompact
};

// EngineOptions::extensions that make an engine run `baseline`. `made`, when set, hears the
// parts made for each engine (owned by that engine).
std::function<void(KvCacheManager*, EngineExtensions*)> StaticBaselineExtensions(
    StaticBaseline baseline, std::function<void(const StaticBaselineParts&)> made = nullptr);

// Adds "static" and "static-compact" to the names --scheduling-policy accepts in this process
// (scheduling_policies.h). Call before parsing flags.
void RegisterStaticBaselines();

}  // namespace tandem
