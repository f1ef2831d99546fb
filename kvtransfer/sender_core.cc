#include "kvtransfer/sender_core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cluster/kv_transfer_layout.h"
#include "kvtransfer/transfer_window.h"

namespace tandem::kvtransfer {

bool SenderTransfer::Ended() {
  std::lock_guard<std::mutex> lock(io_mu);
  return !readable;
}

absl::Status SenderCore::CheckOptions(const SenderOptions& options, KvRegionAccess* access) {
  absl::Status valid = ValidateKvLayout(options.layout);
  if (!valid.ok()) return valid;
  if (access == nullptr) return absl::InvalidArgumentError("kv sender needs region access");
  if (options.max_message_bytes == 0) {
    return absl::InvalidArgumentError("max_message_bytes must be positive");
  }
  return absl::OkStatus();
}

absl::Status SenderCore::FromReceiver(const std::string& endpoint, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat("kv transfer receiver ", endpoint, ": ", status.message()));
}

SenderCore::SenderCore(const SenderOptions& options, KvRegionAccess* access,
                       const std::string& thread_name, std::function<void()> on_tick,
                       size_t max_blocks_per_message)
    : options_(options),
      access_(access),
      max_blocks_per_message_(std::max<size_t>(1, max_blocks_per_message)),
      on_tick_(std::move(on_tick)),
      loop_(thread_name, absl::Milliseconds(10), [this] { Tick(); }) {}

SenderCore::~SenderCore() { Stop(); }

absl::Status SenderCore::CheckBegin(const TransferTarget& target,
                                    const std::vector<int32_t>& src_blocks,
                                    bool zero_copy_capable) const {
  if (target.zero_copy && !zero_copy_capable) {
    return absl::UnimplementedError(absl::StrCat(
        "the ", options_.transport, " kv transport copies the KV: zero-copy needs cuda-ipc"));
  }
  if (target.zero_copy && !src_blocks.empty()) {
    return absl::InvalidArgumentError(
        "a zero-copy kv transfer reads no source blocks: src_blocks must be empty");
  }
  if (!target.zero_copy && src_blocks.size() != target.dst_blocks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("kv transfer of ", src_blocks.size(),
                                                   " source blocks into ", target.dst_blocks.size(),
                                                   " destinations"));
  }
  const int64_t num_blocks = access_->num_blocks();
  for (int32_t b : src_blocks) {
    if (b < 0 || b >= num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("source block ", b, " outside the pool [0, ", num_blocks, ")"));
    }
  }
  absl::Status window =
      ValidateTransferWindow(target.window_layers, target.window_first, options_.layout.num_layers,
                             target.dst_blocks.size());
  if (!window.ok()) return window;
  if (absl::Now() >= target.deadline) {
    return absl::DeadlineExceededError("kv transfer deadline passed before it began");
  }
  return absl::OkStatus();
}

absl::StatusOr<TransferHandle> SenderCore::Start(const TransferTarget& target,
                                                 std::vector<int32_t> src_blocks,
                                                 std::shared_ptr<SenderLink> link) {
  auto t = std::make_shared<SenderTransfer>();
  t->target = target;
  t->target.deadline = std::min(target.deadline, absl::Now() + options_.max_transfer_time);
  t->src_blocks = std::move(src_blocks);
  t->link = std::move(link);
  t->started = absl::Now();
  t->layer_queued.assign(static_cast<size_t>(options_.layout.num_layers), false);
  t->first_block =
      FirstBlockPerLayer(target.window_layers, target.window_first, options_.layout.num_layers);

  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return absl::CancelledError("kv sender shutting down");
  if (!t->link->healthy()) {
    return absl::UnavailableError(
        absl::StrCat("kv transfer connection to ", target.endpoint, " was lost"));
  }
  const WireKey key{t->link.get(), target.transfer_id, target.attempt};
  if (by_wire_id_.count(key)) {
    return absl::AlreadyExistsError(absl::StrCat("kv transfer ", target.transfer_id, " attempt ",
                                                 target.attempt, " is already in flight"));
  }
  t->handle = next_handle_++;
  transfers_.emplace(t->handle, t);
  by_wire_id_.emplace(key, t->handle);
  t->link->live_.fetch_add(1, std::memory_order_acq_rel);
  t->link->last_used_ns_.store(absl::ToUnixNanos(t->started), std::memory_order_relaxed);
  counters_.transfers_started.fetch_add(1, std::memory_order_relaxed);
  SenderWork work;
  work.kind = SenderWork::Kind::kBegin;
  work.transfer = t;
  t->link->Send(std::move(work));
  return t->handle;
}

void SenderCore::SendLayer(TransferHandle handle, int64_t layer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(handle);
  if (it == transfers_.end() || it->second->ended) return;
  std::shared_ptr<SenderTransfer> t = it->second;
  const bool in_range = layer >= 0 && layer < options_.layout.num_layers;
  if (!in_range || t->layer_queued[layer]) {
    EndLocked(t,
              absl::InvalidArgumentError(
                  absl::StrCat("SendLayer(", layer, ") ", in_range ? "twice" : "out of range")),
              /*tell_receiver=*/true);
    return;
  }
  t->layer_queued[layer] = true;
  const size_t per_message = std::clamp<size_t>(
      options_.max_message_bytes / options_.layout.region_bytes(), 1, max_blocks_per_message_);
  // A windowed layer moves only the window's blocks (transfer_window.h).
  const size_t n = t->target.dst_blocks.size();
  for (size_t first = t->first_block[layer]; first < n; first += per_message) {
    SenderWork work;
    work.kind = SenderWork::Kind::kData;
    work.transfer = t;
    work.layer = layer;
    work.first = first;
    work.count = std::min(per_message, n - first);
    t->link->Send(std::move(work));
  }
}

void SenderCore::Finish(TransferHandle handle, std::string trailer, KvSender::DoneCallback done) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(handle);
  if (it == transfers_.end() || it->second->finish_called) {
    if (done) {
      absl::Status why =
          it == transfers_.end()
              ? absl::NotFoundError(absl::StrCat("unknown kv transfer handle ", handle))
              : absl::FailedPreconditionError("Finish called twice on a kv transfer");
      loop_.Post([done = std::move(done), why] { done(why); });
    }
    return;
  }
  std::shared_ptr<SenderTransfer> t = it->second;
  t->finish_called = true;
  t->done = std::move(done);
  if (t->ended) {
    DeliverLocked(t);
    return;
  }
  for (size_t l = 0; l < t->layer_queued.size(); ++l) {
    if (!t->layer_queued[l]) {
      EndLocked(t,
                absl::FailedPreconditionError(
                    absl::StrCat("kv transfer finished before layer ", l, " was sent")),
                /*tell_receiver=*/true);
      return;
    }
  }
  SenderWork work;
  work.kind = SenderWork::Kind::kFinish;
  work.transfer = t;
  work.trailer = std::move(trailer);
  t->link->Send(std::move(work));
}

void SenderCore::Abort(TransferHandle handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(handle);
  if (it == transfers_.end()) return;
  std::shared_ptr<SenderTransfer> t = it->second;
  EndLocked(t, absl::AbortedError("kv transfer aborted by the sender"), /*tell_receiver=*/true);
  // After Finish the handle lives until done is delivered (at once, unless a read is on).
  if (!t->finish_called) transfers_.erase(handle);
}

int64_t SenderCore::num_in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(transfers_.size());
}

void SenderCore::OnResult(const SenderLink* link, uint64_t transfer_id, uint32_t attempt,
                          const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  auto key = by_wire_id_.find(WireKey{link, transfer_id, attempt});
  if (key == by_wire_id_.end()) return;  // already ended (a duplicate or late verdict)
  auto it = transfers_.find(key->second);
  if (it == transfers_.end()) return;
  std::shared_ptr<SenderTransfer> t = it->second;
  if (status.ok() && !t->finish_called) return;  // only FINISH earns an OK
  EndLocked(t, status.ok() ? status : FromReceiver(t->target.endpoint, status),
            /*tell_receiver=*/false);
}

void SenderCore::End(const std::shared_ptr<SenderTransfer>& transfer, const absl::Status& status,
                     bool tell_receiver) {
  std::lock_guard<std::mutex> lock(mu_);
  EndLocked(transfer, status, tell_receiver);
}

void SenderCore::FailLink(const SenderLink* link, const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<SenderTransfer>> victims;
  for (auto& [handle, t] : transfers_) {
    if (t->link.get() == link && !t->ended) victims.push_back(t);
  }
  for (auto& t : victims) EndLocked(t, status, /*tell_receiver=*/false);
}

bool SenderCore::StartRead(const std::shared_ptr<SenderTransfer>& transfer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (transfer->ended) return false;
  ++transfer->reading;
  return true;
}

void SenderCore::EndRead(const std::shared_ptr<SenderTransfer>& transfer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (transfer->reading > 0) --transfer->reading;
  if (transfer->reading == 0 && transfer->done_deferred) DeliverLocked(transfer);
}

std::shared_ptr<SenderTransfer> SenderCore::Find(TransferHandle handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(handle);
  if (it == transfers_.end() || it->second->ended) return nullptr;
  return it->second;
}

void SenderCore::Shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  closing_ = true;
  std::vector<std::shared_ptr<SenderTransfer>> live;
  for (auto& [handle, t] : transfers_) live.push_back(t);
  for (auto& t : live) {
    EndLocked(t, absl::AbortedError("kv sender shut down"), /*tell_receiver=*/true);
  }
  transfers_.clear();
}

void SenderCore::EndLocked(const std::shared_ptr<SenderTransfer>& t, const absl::Status& status,
                           bool tell_receiver) {
  if (t->ended) return;
  t->ended = true;
  t->outcome = status;
  {
    std::lock_guard<std::mutex> io(t->io_mu);
    t->readable = false;
  }
  by_wire_id_.erase(WireKey{t->link.get(), t->target.transfer_id, t->target.attempt});
  t->link->live_.fetch_sub(1, std::memory_order_acq_rel);
  t->link->last_used_ns_.store(absl::ToUnixNanos(absl::Now()), std::memory_order_relaxed);
  if (status.ok()) {
    counters_.transfers_ok.fetch_add(1, std::memory_order_relaxed);
    counters_.RecordLatency(absl::Now() - t->started);
  } else {
    counters_.transfers_failed.fetch_add(1, std::memory_order_relaxed);
    if (absl::IsDeadlineExceeded(status)) {
      counters_.deadline_expired.fetch_add(1, std::memory_order_relaxed);
    }
    if (tell_receiver && t->link->healthy()) {
      SenderWork work;
      work.kind = SenderWork::Kind::kAbort;
      work.transfer = t;
      // A fresh rep: Status refcounts live in the (uninstrumented) abseil library.
      work.status = absl::Status(status.code(), std::string(status.message()));
      t->link->Send(std::move(work));
    }
  }
  if (t->finish_called) DeliverLocked(t);
}

void SenderCore::DeliverLocked(const std::shared_ptr<SenderTransfer>& t) {
  if (t->reading > 0) {  // the regions may still be read by a message on the wire
    t->done_deferred = true;
    return;
  }
  t->done_deferred = false;
  if (t->done) loop_.Post([done = std::move(t->done), s = t->outcome] { done(s); });
  t->done = nullptr;
  transfers_.erase(t->handle);
}

void SenderCore::Tick() {
  {
    const absl::Time now = absl::Now();
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::shared_ptr<SenderTransfer>> expired;
    for (auto& [handle, t] : transfers_) {
      if (!t->ended && now >= t->target.deadline) expired.push_back(t);
    }
    for (auto& t : expired) {
      EndLocked(t,
                absl::DeadlineExceededError(absl::StrCat(
                    "kv transfer ", t->target.transfer_id, " attempt ", t->target.attempt, " to ",
                    t->target.endpoint, " passed its deadline")),
                /*tell_receiver=*/true);
    }
  }
  if (on_tick_) on_tick_();
}

}  // namespace tandem::kvtransfer
