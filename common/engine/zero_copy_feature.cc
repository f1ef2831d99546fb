// Zero-copy KV destinations of prefill-only requests (zero_copy_feature.h).

#include "common/engine/zero_copy_feature.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"

namespace tandem {
namespace {

struct DestinationState final : FeatureState {
  std::shared_ptr<const RemoteKvPool> pool;
  std::unique_ptr<FeatureState> Clone() const override {
    return std::make_unique<DestinationState>(*this);
  }
};

// One mapping: the same layer bases (two requests to one decode worker share its pool).
bool SamePool(const RemoteKvPool& a, const RemoteKvPool& b) {
  return &a == &b || (a.layer_base == b.layer_base && a.num_blocks == b.num_blocks);
}

}  // namespace

absl::Status ZeroCopyFeature::Validate(const EngineRequest& r) const {
  if (r.kv_destination == nullptr) return absl::OkStatus();
  const KvDestination& d = *r.kv_destination;
  const Backend& backend = core().backend();
  if (!r.prefill_only) {
    return absl::InvalidArgumentError("kv_destination: only a prefill_only request has one");
  }
  if (!backend.SupportsRemoteKv()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_destination: the ", backend.name(), " backend writes no remote KV pool"));
  }
  if (backend.kv_spec().windowed()) {
    return absl::InvalidArgumentError(
        "kv_destination: not with the sliding-window KV layout (its pages are not blocks)");
  }
  if (d.pool == nullptr ||
      static_cast<int64_t>(d.pool->layer_base.size()) != backend.kv_spec().num_layers) {
    return absl::InvalidArgumentError(
        "kv_destination.pool: needs one base per layer of this model");
  }
  const int64_t tokens =
      static_cast<int64_t>(r.prompt.size()) + static_cast<int64_t>(r.prior_output.size());
  const int64_t blocks = core().kv().BlocksFor(tokens);
  if (d.first_block < 0 || d.first_block + static_cast<int64_t>(d.blocks.size()) != blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_destination: ", d.blocks.size(), " blocks from block ", d.first_block,
                     " do not cover a ", tokens, "-token prompt (", blocks, " blocks)"));
  }
  for (int32_t b : d.blocks) {
    if (b < 0 || b >= d.pool->num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv_destination: block ", b, " outside the remote pool's ", d.pool->num_blocks));
    }
  }
  return absl::OkStatus();
}

absl::Status ZeroCopyFeature::OnAdmit(Sequence* seq, const EngineRequest& r) {
  if (r.kv_destination == nullptr) return absl::OkStatus();
  if (slot_ < 0) slot_ = core().AllocateFeatureSlot();
  const KvDestination& d = *r.kv_destination;
  seq->blocks.remote.clear();
  for (int32_t b : d.blocks) seq->blocks.remote.push_back(kKvRemoteBlock + b);
  seq->blocks.remote_from = d.first_block;
  auto state = std::make_unique<DestinationState>();
  state->pool = d.pool;
  seq->features.set(slot_, std::move(state));
  return absl::OkStatus();
}

const std::shared_ptr<const RemoteKvPool>* ZeroCopyFeature::PoolOf(const Sequence& seq) const {
  if (slot_ < 0) return nullptr;
  const DestinationState* s = seq.features.get<DestinationState>(slot_);
  return s != nullptr ? &s->pool : nullptr;
}

void ZeroCopyFeature::OnStepBegin(std::vector<SequenceUpdate>* /*updates*/) {
  for (Sequence* seq : held_) core().scheduler().Release(seq);
  held_.clear();
}

void ZeroCopyFeature::BeforeSchedule() {
  if (slot_ < 0) return;
  Scheduler& scheduler = core().scheduler();
  // The step's pool: the first runnable destination in service order (running, then waiting);
  // the sequences of every other destination wait for a later step.
  const RemoteKvPool* chosen = nullptr;
  std::vector<Sequence*> others;
  auto consider = [&](Sequence* seq) {
    const auto* pool = PoolOf(*seq);
    if (pool == nullptr) return;
    if (chosen == nullptr) {
      chosen = pool->get();
    } else if (!SamePool(*chosen, **pool)) {
      others.push_back(seq);
    }
  };
  for (Sequence* seq : scheduler.running()) consider(seq);
  for (Sequence* seq : scheduler.waiting()) consider(seq);
  for (Sequence* seq : others) {
    scheduler.Hold(seq);
    held_.push_back(seq);
  }
  // Held sequences alone leave the scheduler idle: the loop must step again to release them.
  if (!held_.empty()) core().wake().Notify();
}

void ZeroCopyFeature::BeforeForward(const SchedulerOutput& plan,
                                    const std::vector<Sequence*>& /*sampled*/,
                                    ForwardBatch* batch) {
  if (slot_ < 0) return;
  for (const ScheduledSeq& s : plan.scheduled) {
    const auto* pool = PoolOf(*s.seq);
    if (pool == nullptr) continue;
    if (batch->remote_kv == nullptr) {
      batch->remote_kv = *pool;
    } else {
      TANDEM_CHECK(SamePool(*batch->remote_kv, **pool)) << "two remote KV pools in one step";
    }
  }
  if (batch->remote_kv == nullptr) return;
  // Every chunk's writes are followed by the layer events (not only the exported last chunk's).
  std::function<void(int64_t)> earlier = std::move(batch->on_layer_done);
  batch->on_layer_done = [earlier](int64_t layer) {
    if (earlier) earlier(layer);
  };
}

void ZeroCopyFeature::OnFinish(Sequence* seq, FinishReason /*reason*/, SequenceUpdate* /*u*/) {
  held_.erase(std::remove(held_.begin(), held_.end(), seq), held_.end());
}

}  // namespace tandem
