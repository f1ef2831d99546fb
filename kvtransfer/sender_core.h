#pragma once

// The sending side's bookkeeping, shared by every transport (tcp, loopback, nccl, cuda-ipc) as
// ReceiverCore is by the receivers: the handle table, the checks of Begin / SendLayer / Finish,
// how an attempt ends (exactly once: counters, the receiver told, done delivered), deadlines.
// A transport supplies the links that carry the work the core queues (a connection or a peer,
// with the thread that drains it) and reports what its threads learn (the receiver's verdicts,
// broken links, failed messages). User callbacks run on the core's event-loop thread, never
// under a lock of the core and never on the caller's thread.
//
// Read safety: a transport reads a transfer's source regions only while holding the transfer's
// io_mu with `readable` set (one short step at a time); ending the attempt clears `readable`
// under io_mu, so once done ran or Abort returned the regions are never read again. A transport
// whose reads cannot be split that way (nccl: a message on the device) brackets each message
// with StartRead / EndRead instead, and done waits for EndRead.
//
// Locks: the core's mutex is taken after a transport's own locks and SenderLink::Send is called
// under it, so Send must not block nor call back into the core.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/event_loop.h"
#include "kvtransfer/stats.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer {

class SenderLink;
class SenderCore;

// One attempt begun on a link. The link's thread reads `target`, `src_blocks` and `link`
// (immutable after SenderCore::Start) and owns the counts of what it put on the wire.
struct SenderTransfer {
  TransferHandle handle = 0;
  TransferTarget target;  // deadline already bounded by SenderOptions::max_transfer_time
  std::vector<int32_t> src_blocks;
  std::shared_ptr<SenderLink> link;
  absl::Time started;

  // The link's thread only: what it put on the wire (messages dropped by fault injection too).
  uint64_t frames_sent = 0;
  uint64_t bytes_sent = 0;
  // Control messages of this attempt (nccl, cuda-ipc): requests sent to the receiver and
  // replies received from it (ControlSender counts them; TransferHooks::ControlMessages).
  std::atomic<uint32_t> control_sent{0};
  std::atomic<uint32_t> control_received{0};

  // The source regions are read only under io_mu while `readable`.
  std::mutex io_mu;
  bool readable = true;
  // True once the attempt ended (takes io_mu).
  bool Ended();

 private:
  friend class SenderCore;
  // Under the core's mutex.
  bool ended = false;
  absl::Status outcome;
  bool finish_called = false;
  KvSender::DoneCallback done;
  std::vector<bool> layer_queued;
  std::vector<int32_t> first_block;  // per layer: the first index into the block lists it sends
  int reading = 0;                   // StartRead calls not yet matched by EndRead
  bool done_deferred = false;        // ended while reading: done waits for EndRead
};

// Work the core queues on a link, to be done in order by the link's thread.
struct SenderWork {
  enum class Kind { kBegin, kData, kFinish, kAbort };
  Kind kind = Kind::kData;
  std::shared_ptr<SenderTransfer> transfer;
  int64_t layer = 0;  // kData: this layer of blocks [first, first + count) of the transfer
  size_t first = 0;
  size_t count = 0;
  std::string trailer;  // kFinish
  absl::Status status;  // kAbort: why the sender gave up
};

// A transport's way to one receiver (tcp: a connection and its writer thread; loopback: the
// sender's worker thread and the receiver's core; nccl: a communicator and its thread).
class SenderLink {
 public:
  virtual ~SenderLink() = default;
  // Queues `work` for the link's thread. Called under the core's mutex: must not block, must
  // not call the core. Work queued on a link that broke may be dropped.
  virtual void Send(SenderWork work) = 0;
  // False once the link broke: no transfer begins on it and no ABORT is queued on it.
  virtual bool healthy() const = 0;

  // Attempts begun on this link and not ended, and when that number last changed (the core
  // keeps both; transports use them to retire links nobody uses).
  int64_t live_transfers() const { return live_.load(std::memory_order_acquire); }
  bool idle() const { return live_transfers() == 0; }
  absl::Time last_used() const {
    return absl::FromUnixNanos(last_used_ns_.load(std::memory_order_relaxed));
  }

 private:
  friend class SenderCore;
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> last_used_ns_{0};
};

class SenderCore {
 public:
  // OK when `options` and `access` can make a sender: a valid layout, region access, a positive
  // message size.
  static absl::Status CheckOptions(const SenderOptions& options, KvRegionAccess* access);
  // `status` as the receiver at `endpoint` reported it (the message names the receiver).
  static absl::Status FromReceiver(const std::string& endpoint, const absl::Status& status);

  // `max_blocks_per_message` bounds the blocks of one kData item beyond max_message_bytes.
  // `on_tick` (may be empty): the transport's housekeeping, run on the event loop after each
  // deadline sweep (about every 10 ms), outside the core's mutex.
  SenderCore(const SenderOptions& options, KvRegionAccess* access, const std::string& thread_name,
             std::function<void()> on_tick, size_t max_blocks_per_message = SIZE_MAX);
  // Stop().
  ~SenderCore();
  SenderCore(const SenderCore&) = delete;
  SenderCore& operator=(const SenderCore&) = delete;

  const SenderOptions& options() const { return options_; }
  StatsCounters& counters() { return counters_; }

  // Begin's own checks, before the transport contacts the endpoint: as many source blocks as
  // destinations (INVALID_ARGUMENT), source blocks inside the pool (INVALID_ARGUMENT), a valid
  // window (ValidateTransferWindow: INVALID_ARGUMENT), the deadline not passed
  // (DEADLINE_EXCEEDED). A zero-copy target (TransferTarget::zero_copy) has no source blocks
  // (INVALID_ARGUMENT otherwise) and is refused UNIMPLEMENTED unless `zero_copy_capable`.
  absl::Status CheckBegin(const TransferTarget& target, const std::vector<int32_t>& src_blocks,
                          bool zero_copy_capable = false) const;
  // Registers the attempt on `link` and queues its kBegin. CANCELLED while shutting down,
  // UNAVAILABLE when the link broke, ALREADY_EXISTS when the same attempt is in flight on it.
  absl::StatusOr<TransferHandle> Start(const TransferTarget& target,
                                       std::vector<int32_t> src_blocks,
                                       std::shared_ptr<SenderLink> link);

  // KvSender's calls (after Begin). SendLayer queues the layer as kData items of at most
  // max_message_bytes (a windowed layer: only blocks [window_first, n), none when empty); a layer
  // out of range or queued twice fails the transfer (INVALID_ARGUMENT). Finish before every layer
  // was queued fails it (FAILED_PRECONDITION); otherwise it queues kFinish. Finish on an unknown
  // handle (NOT_FOUND) or twice (FAILED_PRECONDITION) answers done with that error and touches
  // nothing.
  void SendLayer(TransferHandle handle, int64_t layer);
  void Finish(TransferHandle handle, std::string trailer, KvSender::DoneCallback done);
  void Abort(TransferHandle handle);
  int64_t num_in_flight() const;
  TransportStats stats() const { return counters_.Snapshot(); }

  // From the transport's threads.
  // The receiver's verdict on an attempt on `link`. An OK ends it only after Finish (the
  // receiver verifies only what FINISH closes); attempts that already ended are ignored.
  void OnResult(const SenderLink* link, uint64_t transfer_id, uint32_t attempt,
                const absl::Status& status);
  // Ends the attempt with `status` unless it already ended; `tell_receiver`: a failure is
  // reported to the receiver (kAbort) when the link is healthy.
  void End(const std::shared_ptr<SenderTransfer>& transfer, const absl::Status& status,
           bool tell_receiver);
  // The link broke: its live attempts end with `status` (the receiver cannot be told).
  void FailLink(const SenderLink* link, const absl::Status& status);
  // Brackets a read of the transfer's regions that io_mu cannot cover. StartRead is false when
  // the attempt already ended (read nothing). Brackets nest (a transport may hold one across
  // device copies still in flight after its message was issued); a done due meanwhile waits
  // for the last EndRead.
  bool StartRead(const std::shared_ptr<SenderTransfer>& transfer);
  void EndRead(const std::shared_ptr<SenderTransfer>& transfer);

  // For a transport's destructor, before it closes its links: ends every attempt with ABORTED
  // (receivers told, done callbacks posted) and refuses new ones.
  void Shutdown();
  // The live attempt of `handle` (null when unknown or ended): for a transport's own calls on a
  // handle (KvSender::Destination).
  std::shared_ptr<SenderTransfer> Find(TransferHandle handle) const;
  // Runs the callbacks already posted and stops the event loop: no tick and no callback runs
  // afterwards. Idempotent; not from the event loop.
  void Stop() { loop_.Stop(); }

 private:
  using WireKey = std::tuple<const SenderLink*, uint64_t, uint32_t>;

  void EndLocked(const std::shared_ptr<SenderTransfer>& t, const absl::Status& status,
                 bool tell_receiver);
  // Delivers the outcome of an ended attempt whose Finish was called, and forgets the handle.
  void DeliverLocked(const std::shared_ptr<SenderTransfer>& t);
  void Tick();

  const SenderOptions options_;
  KvRegionAccess* const access_;
  const size_t max_blocks_per_message_;
  const std::function<void()> on_tick_;
  StatsCounters counters_;

  mutable std::mutex mu_;
  bool closing_ = false;
  TransferHandle next_handle_ = 1;
  std::unordered_map<TransferHandle, std::shared_ptr<SenderTransfer>> transfers_;
  std::map<WireKey, TransferHandle> by_wire_id_;  // attempts not ended

  EventLoop loop_;  // last: stopped first
};

// A KvSender whose calls after Begin are its SenderCore's; every transport's sender is one.
class CoreSender : public KvSender {
 public:
  // `core` (usually a member of the derived class, so not yet constructed here) outlives it.
  explicit CoreSender(SenderCore* core) : sender_core_(core) {}

  void SendLayer(TransferHandle handle, int64_t layer) override {
    sender_core_->SendLayer(handle, layer);
  }
  void Finish(TransferHandle handle, std::string trailer, DoneCallback done) override {
    sender_core_->Finish(handle, std::move(trailer), std::move(done));
  }
  void Abort(TransferHandle handle) override { sender_core_->Abort(handle); }
  int64_t num_in_flight() const override { return sender_core_->num_in_flight(); }
  TransportStats stats() const override { return sender_core_->stats(); }

 private:
  SenderCore* const sender_core_;
};

}  // namespace tandem::kvtransfer
