#include "kvtransfer/metered.h"

#include <mutex>
#include <unordered_map>
#include <utility>

#include "kvtransfer/transfer_window.h"

namespace tandem::kvtransfer {
namespace {

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

int64_t BytesOf(const KvLayout& layout, int64_t regions) {
  return regions * static_cast<int64_t>(layout.region_bytes());
}

// Sender side. The state outlives the sender: done callbacks may run while the inner sender
// shuts down (it aborts what is in flight).
class SenderMeter {
 public:
  SenderMeter(const KvLayout& layout, TransferHooks* hooks) : layout_(layout), hooks_(hooks) {}

  void Began(TransferHandle handle, absl::Time start, int64_t blocks, int64_t regions) {
    std::lock_guard<std::mutex> lock(mu_);
    open_[handle] = Open{start, blocks, regions};
  }
  void Finishing(TransferHandle handle) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = open_.find(handle); it != open_.end()) it->second.finishing = true;
  }
  // Abort before Finish ends the transfer here; after Finish, its done reports the outcome.
  void Aborting(TransferHandle handle) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = open_.find(handle);
    if (it == open_.end() || it->second.finishing) return;
    open_.erase(it);
    hooks_->TransferFailed(TransferDirection::kSend, TransferFailure::kAborted);
  }
  void Done(TransferHandle handle, const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = open_.find(handle);
    if (it == open_.end()) return;
    const Open o = it->second;
    open_.erase(it);
    if (status.ok()) {
      hooks_->TransferSucceeded(TransferDirection::kSend, SecondsSince(o.start),
                                BytesOf(layout_, o.regions), o.blocks);
    } else {
      hooks_->TransferFailed(TransferDirection::kSend, TransferFailureOf(status));
    }
  }

 private:
  struct Open {
    absl::Time start;
    int64_t blocks = 0;
    int64_t regions = 0;  // (layer, block) regions of the transfer (every layer was sent: OK)
    bool finishing = false;
  };
  const KvLayout layout_;
  TransferHooks* const hooks_;
  std::mutex mu_;
  std::unordered_map<TransferHandle, Open> open_;
};

class MeteredSender : public KvSender {
 public:
  MeteredSender(std::unique_ptr<KvSender> inner, const KvLayout& layout, TransferHooks* hooks)
      : hooks_(hooks),
        layout_(layout),
        meter_(std::make_shared<SenderMeter>(layout, hooks)),
        inner_(std::move(inner)) {}

  absl::StatusOr<TransferHandle> Begin(const TransferTarget& target,
                                       std::vector<int32_t> src_blocks) override {
    const absl::Time start = absl::Now();
    const int64_t blocks = static_cast<int64_t>(target.dst_blocks.size());
    const int64_t regions = TransferRegions(target.window_layers, target.window_first,
                                            layout_.num_layers, target.dst_blocks.size());
    auto handle = inner_->Begin(target, std::move(src_blocks));
    // A zero-copy Begin the transport cannot take started nothing: the caller begins again.
    if (!handle.ok() && target.zero_copy && absl::IsUnimplemented(handle.status())) return handle;
    hooks_->TransferStarted(TransferDirection::kSend);
    if (!handle.ok()) {
      hooks_->TransferFailed(TransferDirection::kSend, TransferFailureOf(handle.status()));
      return handle;
    }
    meter_->Began(*handle, start, blocks, regions);
    return handle;
  }
  void SendLayer(TransferHandle handle, int64_t layer) override {
    inner_->SendLayer(handle, layer);
  }
  void Finish(TransferHandle handle, std::string trailer, DoneCallback done) override {
    meter_->Finishing(handle);
    inner_->Finish(handle, std::move(trailer),
                   [meter = meter_, handle, done = std::move(done)](absl::Status status) {
                     meter->Done(handle, status);
                     if (done) done(std::move(status));
                   });
  }
  void Abort(TransferHandle handle) override {
    meter_->Aborting(handle);
    inner_->Abort(handle);
  }
  int64_t num_in_flight() const override { return inner_->num_in_flight(); }
  TransportStats stats() const override { return inner_->stats(); }
  absl::StatusOr<ZeroCopyDestination> Destination(TransferHandle handle) override {
    return inner_->Destination(handle);
  }

 private:
  TransferHooks* const hooks_;
  const KvLayout layout_;
  std::shared_ptr<SenderMeter> meter_;
  std::unique_ptr<KvSender> inner_;  // last: destroyed first, while the meter lives
};

// Receiver side: one entry per expected transfer, from Expect to its end. After a failed
// attempt the expectation stays (the router retries the prefill); the next attempt's
// completion counts as a new transfer, timed from the failure.
class ReceiverMeter {
 public:
  ReceiverMeter(const KvLayout& layout, TransferHooks* hooks) : layout_(layout), hooks_(hooks) {}

  int64_t num_layers() const { return layout_.num_layers; }

  void Expect(uint64_t transfer_id, int64_t blocks, int64_t regions) {
    std::lock_guard<std::mutex> lock(mu_);
    auto [it, inserted] = open_.try_emplace(transfer_id);
    if (!inserted && it->second.active) {
      hooks_->TransferFailed(TransferDirection::kReceive, TransferFailure::kAborted);  // replaced
    }
    it->second = Open{absl::Now(), blocks, regions, true};
    hooks_->TransferStarted(TransferDirection::kReceive);
  }
  void Cancel(uint64_t transfer_id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = open_.find(transfer_id);
    if (it == open_.end()) return;
    if (it->second.active) {
      hooks_->TransferFailed(TransferDirection::kReceive, TransferFailure::kAborted);
    }
    open_.erase(it);
  }
  void Completed(const CompletedTransfer& done) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = open_.find(done.transfer_id);
    if (it == open_.end()) return;
    Open& o = it->second;
    if (!o.active) hooks_->TransferStarted(TransferDirection::kReceive);  // a retried attempt
    if (done.status.ok()) {
      hooks_->TransferSucceeded(TransferDirection::kReceive, SecondsSince(o.start),
                                BytesOf(layout_, o.regions), o.blocks);
      open_.erase(it);
      return;
    }
    hooks_->TransferFailed(TransferDirection::kReceive, TransferFailureOf(done.status));
    o.active = false;
    o.start = absl::Now();
  }

 private:
  struct Open {
    absl::Time start;
    int64_t blocks = 0;
    int64_t regions = 0;  // (layer, block) regions expected
    bool active = false;  // started and not yet ended
  };
  const KvLayout layout_;
  TransferHooks* const hooks_;
  std::mutex mu_;
  std::unordered_map<uint64_t, Open> open_;
};

class MeteredReceiver : public KvReceiver {
 public:
  MeteredReceiver(std::unique_ptr<KvReceiver> inner, std::shared_ptr<ReceiverMeter> meter)
      : meter_(std::move(meter)), inner_(std::move(inner)) {}

  std::string endpoint() const override { return inner_->endpoint(); }
  uint64_t incarnation() const override { return inner_->incarnation(); }
  void Expect(const Expectation& expectation) override {
    meter_->Expect(expectation.transfer_id, static_cast<int64_t>(expectation.dst_blocks.size()),
                   TransferRegions(expectation.window_layers, expectation.window_first,
                                   meter_->num_layers(), expectation.dst_blocks.size()));
    inner_->Expect(expectation);
  }
  void Cancel(uint64_t transfer_id, ReleasedCallback released) override {
    inner_->Cancel(transfer_id, std::move(released));
    meter_->Cancel(transfer_id);
  }
  int64_t num_in_flight() const override { return inner_->num_in_flight(); }
  TransportStats stats() const override { return inner_->stats(); }
  absl::StatusOr<std::string> HandleControl(const std::string& request) override {
    return inner_->HandleControl(request);
  }

 private:
  std::shared_ptr<ReceiverMeter> meter_;
  std::unique_ptr<KvReceiver> inner_;  // last: destroyed first, while the meter lives
};

}  // namespace

TransferFailure TransferFailureOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kDeadlineExceeded:
      return TransferFailure::kTimeout;
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kCancelled:
      return TransferFailure::kAborted;
    case absl::StatusCode::kUnavailable:
      return TransferFailure::kConnection;
    case absl::StatusCode::kDataLoss:
      return TransferFailure::kChecksum;
    case absl::StatusCode::kFailedPrecondition:
      return TransferFailure::kIncompatible;
    case absl::StatusCode::kUnauthenticated:
      return TransferFailure::kUnauthenticated;
    default:
      return TransferFailure::kOther;
  }
}

void ReportRefused(TransferHooks* hooks, TransferDirection direction, const absl::Status& status) {
  if (hooks == nullptr) return;
  const TransferFailure reason = TransferFailureOf(status);
  if (reason == TransferFailure::kIncompatible || reason == TransferFailure::kUnauthenticated) {
    hooks->ConnectionRefused(direction, reason);
  }
}

std::unique_ptr<KvSender> MeterSender(std::unique_ptr<KvSender> inner, const KvLayout& layout,
                                      TransferHooks* hooks) {
  return std::make_unique<MeteredSender>(std::move(inner), layout, hooks);
}

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateMeteredReceiver(
    const ReceiverFactory& create, const KvLayout& layout, TransferHooks* hooks,
    KvReceiver::CompletionCallback on_complete) {
  auto meter = std::make_shared<ReceiverMeter>(layout, hooks);
  auto inner = create([meter, on_complete = std::move(on_complete)](const CompletedTransfer& d) {
    meter->Completed(d);
    if (on_complete) on_complete(d);
  });
  if (!inner.ok()) return inner.status();
  return std::unique_ptr<KvReceiver>(
      std::make_unique<MeteredReceiver>(std::move(inner).value(), std::move(meter)));
}

}  // namespace tandem::kvtransfer
