// The loopback transport's sending side: one worker thread per sender copies regions with
// memcpy, in order; deadlines and callbacks run on an event loop.

#include "kvtransfer/loopback/loopback.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtransfer/crc32c.h"
#include "kvtransfer/event_loop.h"
#include "kvtransfer/faults.h"
#include "kvtransfer/layout.h"
#include "kvtransfer/loopback/registry.h"
#include "kvtransfer/receiver_core.h"
#include "kvtransfer/stats.h"

namespace tandem::kvtransfer::loopback {
namespace {

// ---------------------------------------------------------------- sender

struct Transfer {
  TransferHandle handle = 0;
  TransferTarget target;
  std::vector<int32_t> src_blocks;
  std::shared_ptr<Peer> peer;
  uint64_t owner = 0;
  absl::Time started;
  // Worker thread only.
  uint64_t frames_sent = 0;
  uint64_t bytes_sent = 0;
  // Under io_mu: the worker reads the source regions only while readable.
  std::mutex io_mu;
  bool readable = true;
  // Under the sender's mutex.
  bool ended = false;
  absl::Status outcome;
  bool finish_called = false;
  KvSender::DoneCallback done;
  std::vector<bool> layer_queued;
};

class SenderImpl : public std::enable_shared_from_this<SenderImpl> {
 public:
  SenderImpl(const SenderOptions& options, KvRegionAccess* access)
      : options_(options),
        access_(access),
        faults_(ResolveFaultOptions(options.faults, options.faults_from_env)),
        worker_("kvt-loop-work", absl::ZeroDuration(), nullptr),
        loop_("kvt-loop-send", absl::Milliseconds(10), [this] { Tick(); }) {}

  void Shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
      std::vector<std::shared_ptr<Transfer>> live;
      for (auto& [h, t] : transfers_) live.push_back(t);
      for (auto& t : live) EndLocked(t, absl::AbortedError("kv sender shut down"), true);
      transfers_.clear();
    }
    worker_.Stop();  // runs the queued ABORTs; copies of ended transfers are skipped
    loop_.Stop();
  }

  absl::StatusOr<TransferHandle> Begin(const TransferTarget& target,
                                       std::vector<int32_t> src_blocks) {
    if (src_blocks.size() != target.dst_blocks.size()) {
      return absl::InvalidArgumentError(absl::StrCat("kv transfer of ", src_blocks.size(),
                                                     " source blocks into ",
                                                     target.dst_blocks.size(), " destinations"));
    }
    for (int32_t b : src_blocks) {
      if (b < 0 || b >= access_->num_blocks()) {
        return absl::InvalidArgumentError(absl::StrCat("source block ", b, " outside the pool"));
      }
    }
    if (absl::Now() >= target.deadline) {
      return absl::DeadlineExceededError("kv transfer deadline passed before it began");
    }
    std::shared_ptr<Peer> peer = Registry::Get().Find(target.endpoint);
    if (peer == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("kv transfer peer ", target.endpoint, " unreachable: no such endpoint"));
    }
    uint64_t owner = 0;
    {
      std::shared_lock<std::shared_mutex> lock(peer->mu);
      if (!peer->alive) {
        return absl::UnavailableError(
            absl::StrCat("kv transfer peer ", target.endpoint, " is gone"));
      }
      absl::Status s = CheckCompatible(options_.layout, peer->layout);
      if (!s.ok()) {
        counters_.handshakes_refused.fetch_add(1, std::memory_order_relaxed);
        peer->core->counters().handshakes_refused.fetch_add(1, std::memory_order_relaxed);
        // Worded from the receiver's side, as tcp's REFUSE is.
        s = CheckCompatible(peer->layout, options_.layout);
        return absl::FailedPreconditionError(absl::StrCat(
            "kv transfer peer ", target.endpoint, " refused the connection: ", s.message()));
      }
      if (peer->incarnation != target.incarnation) {
        return absl::FailedPreconditionError(absl::StrCat(
            "kv transfer peer ", target.endpoint, " has incarnation ", peer->incarnation,
            " but the blocks were reserved under incarnation ", target.incarnation,
            " (the receiver restarted; its reservations are gone)"));
      }
      owner = OwnerFor(peer);
    }
    auto t = std::make_shared<Transfer>();
    t->target = target;
    t->target.deadline = std::min(target.deadline, absl::Now() + options_.max_transfer_time);
    t->src_blocks = std::move(src_blocks);
    t->peer = peer;
    t->owner = owner;
    t->started = absl::Now();
    t->layer_queued.assign(static_cast<size_t>(options_.layout.num_layers), false);
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return absl::CancelledError("kv sender shutting down");
    t->handle = next_handle_++;
    transfers_.emplace(t->handle, t);
    counters_.transfers_started.fetch_add(1, std::memory_order_relaxed);
    worker_.Post([self = shared_from_this(), t] { self->DoBegin(t); });
    return t->handle;
  }

  void SendLayer(TransferHandle handle, int64_t layer) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = transfers_.find(handle);
    if (it == transfers_.end() || it->second->ended) return;
    std::shared_ptr<Transfer> t = it->second;
    if (layer < 0 || layer >= options_.layout.num_layers || t->layer_queued[layer]) {
      EndLocked(t,
                absl::InvalidArgumentError(absl::StrCat("SendLayer(", layer, ") invalid or twice")),
                true);
      return;
    }
    t->layer_queued[layer] = true;
    const size_t region = options_.layout.region_bytes();
    const size_t per_message = std::max<size_t>(1, options_.max_message_bytes / region);
    for (size_t first = 0; first < t->src_blocks.size(); first += per_message) {
      const size_t count = std::min(per_message, t->src_blocks.size() - first);
      worker_.Post([self = shared_from_this(), t, layer, first, count] {
        self->DoData(t, layer, first, count);
      });
    }
  }

  void Finish(TransferHandle handle, std::string trailer, KvSender::DoneCallback done) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = transfers_.find(handle);
    if (it == transfers_.end() || it->second->finish_called) {
      if (done) {
        loop_.Post([done = std::move(done)] {
          done(absl::NotFoundError("unknown or already finished kv transfer handle"));
        });
      }
      return;
    }
    std::shared_ptr<Transfer> t = it->second;
    t->finish_called = true;
    t->done = std::move(done);
    if (t->ended) {
      if (t->done) loop_.Post([done = std::move(t->done), s = t->outcome] { done(s); });
      transfers_.erase(it);
      return;
    }
    for (size_t l = 0; l < t->layer_queued.size(); ++l) {
      if (!t->layer_queued[l]) {
        EndLocked(t,
                  absl::FailedPreconditionError(
                      absl::StrCat("kv transfer finished before layer ", l, " was sent")),
                  true);
        return;
      }
    }
    worker_.Post([self = shared_from_this(), t, trailer = std::move(trailer)]() mutable {
      self->DoFinish(t, std::move(trailer));
    });
  }

  void Abort(TransferHandle handle) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = transfers_.find(handle);
    if (it == transfers_.end()) return;
    std::shared_ptr<Transfer> t = it->second;
    EndLocked(t, absl::AbortedError("kv transfer aborted by the sender"), true);
    transfers_.erase(handle);
  }

  int64_t num_in_flight() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(transfers_.size());
  }
  TransportStats stats() const { return counters_.Snapshot(); }

 private:
  uint64_t OwnerFor(const std::shared_ptr<Peer>& peer) {  // peer->mu held (shared)
    std::lock_guard<std::mutex> lock(mu_);
    auto it = owners_.find(peer.get());
    if (it != owners_.end()) return it->second;
    const uint64_t owner = peer->core->NewOwnerId();
    owners_.emplace(peer.get(), owner);
    counters_.connects.fetch_add(1, std::memory_order_relaxed);
    peer->core->counters().connects.fetch_add(1, std::memory_order_relaxed);
    return owner;
  }

  bool Readable(Transfer* t) {
    std::lock_guard<std::mutex> lock(t->io_mu);
    return t->readable;
  }

  void Fail(const std::shared_ptr<Transfer>& t, const absl::Status& s, bool tell_receiver) {
    std::lock_guard<std::mutex> lock(mu_);
    EndLocked(t, s, tell_receiver);
  }

  // Runs even when the transfer already ended, so that the receiver learns of the attempt and
  // of the abort queued behind it.
  void DoBegin(const std::shared_ptr<Transfer>& t) {
    std::shared_lock<std::shared_mutex> lock(t->peer->mu);
    if (!t->peer->alive) return Fail(t, PeerGone(t), false);
    ReceiverCore::AttemptStart start;
    start.transfer_id = t->target.transfer_id;
    start.attempt = t->target.attempt;
    start.dst_blocks = t->target.dst_blocks;
    start.owner = t->owner;
    start.deadline = t->target.deadline;
    std::weak_ptr<SenderImpl> weak = weak_from_this();
    absl::Status s = t->peer->core->Begin(std::move(start), [weak, t](const absl::Status& r) {
      if (auto self = weak.lock()) self->OnResult(t, r);
    });
    if (!s.ok()) Fail(t, Prefixed(t, s), false);
  }

  void DoData(const std::shared_ptr<Transfer>& t, int64_t layer, size_t first, size_t count) {
    if (!Readable(t.get())) return;
    FaultInjector::Decision fault = faults_.Next();
    if (fault.any()) counters_.faults_injected.fetch_add(1, std::memory_order_relaxed);
    if (fault.delay > absl::ZeroDuration()) absl::SleepFor(fault.delay);
    std::shared_lock<std::shared_mutex> lock(t->peer->mu);
    if (!t->peer->alive) return Fail(t, PeerGone(t), false);
    ReceiverCore* core = t->peer->core;
    if (fault.close) {
      core->FailOwner(t->owner, absl::UnavailableError("fault injection closed the connection"));
      return Fail(t, absl::UnavailableError("fault injection closed the connection"), false);
    }
    const size_t region = options_.layout.region_bytes();
    t->frames_sent += 1;
    t->bytes_sent += count * region;
    if (fault.drop) return;
    std::vector<int32_t> dst(t->target.dst_blocks.begin() + first,
                             t->target.dst_blocks.begin() + first + count);
    bool reported = false;
    absl::StatusOr<ReceiverCore::Ticket> ticket =
        core->AdmitData(t->target.transfer_id, t->target.attempt, layer, dst, &reported);
    if (!ticket.ok()) return Fail(t, Prefixed(t, ticket.status()), false);
    absl::Status verdict;
    {
      std::lock_guard<std::mutex> src_lock(t->io_mu);
      std::lock_guard<std::mutex> dst_lock(*core->io_mutex(*ticket));
      if (!t->readable || !core->Writable(*ticket)) return;
      // Region by region, so both checksums read bytes the copy just brought into cache; the
      // corruption fault lands between the copy and the destination's checksum.
      const size_t corrupt_region =
          fault.corrupt && count > 0 ? fault.corrupt_position % count : count;
      uint32_t src_crc = 0, dst_crc = 0;
      for (size_t i = 0; i < count; ++i) {
        const uint8_t* src = access_->Region(layer, t->src_blocks[first + i]);
        std::memcpy(ticket->regions[i], src, region);
        if (i == corrupt_region)
          ticket->regions[i][(fault.corrupt_position >> 20) % region] ^= 0x5a;
        if (options_.checksum) {
          src_crc = Crc32c(src_crc, src, region);
          dst_crc = Crc32c(dst_crc, ticket->regions[i], region);
        }
      }
      if (options_.checksum) {
        if (src_crc != dst_crc) {
          core->counters().checksum_failures.fetch_add(1, std::memory_order_relaxed);
          verdict = absl::DataLossError(absl::StrCat(
              "checksum mismatch in layer ", layer, " of transfer ", t->target.transfer_id,
              " attempt ", t->target.attempt, " (", count, " regions)"));
        }
      }
    }
    core->EndData(*ticket, verdict);
    if (verdict.ok()) {
      counters_.frames.fetch_add(1, std::memory_order_relaxed);
      counters_.bytes.fetch_add(count * region, std::memory_order_relaxed);
    }
  }

  void DoFinish(const std::shared_ptr<Transfer>& t, std::string trailer) {
    if (!Readable(t.get())) return;
    std::shared_lock<std::shared_mutex> lock(t->peer->mu);
    if (!t->peer->alive) return Fail(t, PeerGone(t), false);
    absl::Status s = t->peer->core->Finish(t->target.transfer_id, t->target.attempt, t->frames_sent,
                                           t->bytes_sent, std::move(trailer));
    if (!s.ok()) Fail(t, Prefixed(t, s), false);
  }

  void DoAbort(const std::shared_ptr<Transfer>& t, const absl::Status& why) {
    std::shared_lock<std::shared_mutex> lock(t->peer->mu);
    if (t->peer->alive) t->peer->core->Abort(t->target.transfer_id, t->target.attempt, why);
  }

  void OnResult(const std::shared_ptr<Transfer>& t, const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (s.ok() && !t->finish_called) return;
    EndLocked(t, s.ok() ? s : Prefixed(t, s), false);
  }

  static absl::Status Prefixed(const std::shared_ptr<Transfer>& t, const absl::Status& s) {
    return absl::Status(
        s.code(), absl::StrCat("kv transfer receiver ", t->target.endpoint, ": ", s.message()));
  }
  static absl::Status PeerGone(const std::shared_ptr<Transfer>& t) {
    return absl::UnavailableError(
        absl::StrCat("kv transfer connection to ", t->target.endpoint, " lost: receiver gone"));
  }

  void EndLocked(const std::shared_ptr<Transfer>& t, const absl::Status& status,
                 bool tell_receiver) {
    if (t->ended) return;
    t->ended = true;
    t->outcome = status;
    {
      std::lock_guard<std::mutex> io(t->io_mu);
      t->readable = false;
    }
    if (status.ok()) {
      counters_.transfers_ok.fetch_add(1, std::memory_order_relaxed);
      counters_.RecordLatency(absl::Now() - t->started);
    } else {
      counters_.transfers_failed.fetch_add(1, std::memory_order_relaxed);
      if (absl::IsDeadlineExceeded(status)) {
        counters_.deadline_expired.fetch_add(1, std::memory_order_relaxed);
      }
      if (tell_receiver) {
        worker_.Post([self = shared_from_this(), t, status] { self->DoAbort(t, status); });
      }
    }
    if (t->finish_called) {
      if (t->done) loop_.Post([done = std::move(t->done), status] { done(status); });
      transfers_.erase(t->handle);
    }
  }

  void Tick() {
    const absl::Time now = absl::Now();
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::shared_ptr<Transfer>> victims;
    std::vector<absl::Status> why;
    for (auto& [h, t] : transfers_) {
      if (t->ended) continue;
      if (now >= t->target.deadline) {
        victims.push_back(t);
        why.push_back(absl::DeadlineExceededError(
            absl::StrCat("kv transfer ", t->target.transfer_id, " attempt ", t->target.attempt,
                         " to ", t->target.endpoint, " passed its deadline")));
        continue;
      }
      std::shared_lock<std::shared_mutex> peer_lock(t->peer->mu, std::try_to_lock);
      if (peer_lock.owns_lock() && !t->peer->alive) {
        victims.push_back(t);
        why.push_back(PeerGone(t));
      }
    }
    for (size_t i = 0; i < victims.size(); ++i) {
      EndLocked(victims[i], why[i], /*tell_receiver=*/absl::IsDeadlineExceeded(why[i]));
    }
  }

  const SenderOptions options_;
  KvRegionAccess* const access_;
  FaultInjector faults_;
  StatsCounters counters_;
  mutable std::mutex mu_;
  bool closing_ = false;
  TransferHandle next_handle_ = 1;
  std::unordered_map<TransferHandle, std::shared_ptr<Transfer>> transfers_;
  std::map<const Peer*, uint64_t> owners_;
  EventLoop worker_;  // Begin / Data / Finish / Abort work, in order (the "connection")
  EventLoop loop_;    // done callbacks and the deadline tick
};

class LoopbackSender : public KvSender {
 public:
  explicit LoopbackSender(std::shared_ptr<SenderImpl> impl) : impl_(std::move(impl)) {}
  ~LoopbackSender() override { impl_->Shutdown(); }

  absl::StatusOr<TransferHandle> Begin(const TransferTarget& target,
                                       std::vector<int32_t> src_blocks) override {
    return impl_->Begin(target, std::move(src_blocks));
  }
  void SendLayer(TransferHandle handle, int64_t layer) override { impl_->SendLayer(handle, layer); }
  void Finish(TransferHandle handle, std::string trailer, DoneCallback done) override {
    impl_->Finish(handle, std::move(trailer), std::move(done));
  }
  void Abort(TransferHandle handle) override { impl_->Abort(handle); }
  int64_t num_in_flight() const override { return impl_->num_in_flight(); }
  TransportStats stats() const override { return impl_->stats(); }

 private:
  std::shared_ptr<SenderImpl> impl_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvSender>> CreateSender(const SenderOptions& options,
                                                       KvRegionAccess* access) {
  absl::Status valid = ValidateLayout(options.layout);
  if (!valid.ok()) return valid;
  if (access == nullptr) return absl::InvalidArgumentError("kv sender needs region access");
  if (options.max_message_bytes == 0) {
    return absl::InvalidArgumentError("max_message_bytes must be positive");
  }
  return std::unique_ptr<KvSender>(
      new LoopbackSender(std::make_shared<SenderImpl>(options, access)));
}

}  // namespace tandem::kvtransfer::loopback
