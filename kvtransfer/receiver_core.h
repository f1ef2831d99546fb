#pragma once

// The receiving side's bookkeeping, shared by every transport (tcp, loopback, nccl, cuda-ipc):
// which transfers are expected, which attempt of each is live, which (layer, block) regions of
// it arrived, and when it ends. Transports feed it the messages they read; it decides and reports
// outcomes (to the receiver's user through on_complete, to the sender through the attempt's
// ResultFn), both from its own event-loop thread.
//
// Sender binding: an expectation with a transfer key accepts an attempt only from a BEGIN
// proving the key (BeginProof over the link's binding); the attempt then belongs to the link
// (`owner`) it began on, and DATA, FINISH and ABORT count only from that owner. Everything else
// about a transfer -- unknown, ended, or asked by a sender that proved nothing -- gets the same
// NOT_FOUND that tells nothing about it (ids, blocks, attempts); details (stale attempts,
// foreign blocks) go only to senders that proved the key.
//
// Write safety: a transport writes a region only inside a Ticket (one admitted DATA message),
// one short non-blocking syscall at a time (nccl: one message) while holding io_mutex(ticket),
// and checks Writable(ticket) under it before each. Cancel, a newer attempt and every failure
// invalidate tickets (an atomic generation, without waiting for that mutex), so a write that
// starts later goes nowhere and one in progress ends when the mutex is next free. Cancel never
// waits for that: its `released` runs once the mutex was free after the invalidation and the
// link's own admitted writes are over (cuda-ipc's copies: Cancel's `writes_over`), checked at
// once and then on the event loop (each tick, and after WakeReleases).

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kvtransfer/event_loop.h"
#include "kvtransfer/stats.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer {

// A receiver's incarnation (KvReceiver::incarnation): 64 random bits from OpenSSL's CSPRNG, never
// 0, drawn once per receiver. Every transport's receiver takes it from here (or from
// ReceiverOptions::incarnation, which a multi-transport receiver fills from here).
uint64_t NewIncarnation();

class ReceiverCore {
 public:
  // Tells the sender of one attempt how it ended (OK, or why not). Runs on the event loop.
  using ResultFn = std::function<void(const absl::Status&)>;

  struct AttemptStart {
    uint64_t transfer_id = 0;
    uint32_t attempt = 0;
    std::vector<int32_t> dst_blocks;
    uint64_t owner = 0;  // connection / sender the attempt arrives on
    absl::Time deadline = absl::InfiniteFuture();
    std::string proof;    // BeginProof of the expectation's transfer key
    std::string binding;  // what the proof is bound to on this link (auth.h, BeginProof)
  };

  struct Entry;
  // One admitted DATA message: the regions its payload goes to, in message order.
  struct Ticket {
    std::shared_ptr<Entry> entry;
    uint64_t generation = 0;
    int64_t layer = 0;
    std::vector<int32_t> cells;
    std::vector<uint8_t*> regions;
    absl::Time deadline = absl::InfiniteFuture();  // the attempt's, when admitted
  };

  ReceiverCore(const KvLayout& layout, KvRegionAccess* access,
               KvReceiver::CompletionCallback on_complete, absl::Duration deadline_grace,
               absl::Duration max_transfer_time, const std::string& thread_name,
               TransferHooks* hooks = nullptr);
  // Stops the event loop (callbacks already posted still run); nothing runs afterwards.
  ~ReceiverCore();

  // From now on no user callback (on_complete, ResultFn, released) runs and no pending Cancel's
  // writes_over is called (waits for a check in progress); for destructors.
  void Shutdown();

  const KvLayout& layout() const { return layout_; }
  StatsCounters& counters() { return counters_; }
  uint64_t NewOwnerId();

  // KvReceiver's calls. Expect replacing an expected id waits for a write of the old one in
  // progress (io_mutex); Cancel never waits: `released` (may be null) runs once no write admitted
  // for the transfer can land (see above) and `writes_over` (null: always) returns true -- on
  // the calling thread before Cancel returns when both hold at once, else on the event loop.
  // `writes_over` is called without the core's locks, on either thread.
  void Expect(const Expectation& expectation);
  void Cancel(uint64_t transfer_id, std::function<bool()> writes_over,
              KvReceiver::ReleasedCallback released);
  // What a pending Cancel's `writes_over` looks at changed: check the pending releases soon.
  void WakeReleases();
  int64_t num_in_flight() const;

  // A sender starts an attempt. Errors (unknown transfer or no proof of its key: NotExpected;
  // then, for a sender that proved it, stale attempt, blocks differing from the expectation)
  // are for the caller to report to the sender; `result` is then never called.
  absl::Status Begin(AttemptStart start, ResultFn result);
  // A DATA message from `owner` of layer `layer` for `blocks` (destination ids). On error the
  // payload must be discarded; `*reported` tells whether the sender has been (or needs no)
  // telling: the message belonged to the last attempt, which failed now or earlier. Otherwise
  // (unknown transfer, another owner's or a stale attempt) the caller tells the sender.
  absl::StatusOr<Ticket> AdmitData(uint64_t owner, uint64_t transfer_id, uint32_t attempt,
                                   int64_t layer, absl::Span<const int32_t> blocks, bool* reported);
  // Admits at once every (layer, block) the live attempt of `owner` still has to move (a
  // windowed layer: only its window's blocks): one ticket for the whole transfer, for a
  // transport whose BEGIN admits it (cuda-ipc). Errors as AdmitData's; FAILED_PRECONDITION when
  // some cell was admitted already.
  absl::StatusOr<Ticket> AdmitAll(uint64_t owner, uint64_t transfer_id, uint32_t attempt);
  std::mutex* io_mutex(const Ticket& ticket);
  // Call with io_mutex(ticket) held.
  bool Writable(const Ticket& ticket) const;
  // The payload of `ticket` was written (OK) or not (checksum mismatch: DATA_LOSS; I/O error).
  // `frames`: the sender's messages it counts as (what FINISH's message count checks).
  void EndData(const Ticket& ticket, const absl::Status& status, uint64_t frames = 1);
  // The sender's FINISH. OK when the attempt is the last one (its outcome is reported through
  // ResultFn and on_complete, or was when it failed earlier); else the error to send back.
  // `writes_over` (null: always), for a link whose older attempts' admitted writes may outlive
  // them (cuda-ipc: another sender's copies in flight): a completed attempt's on_complete waits
  // until it returns true (checked like a Cancel's; a Cancel meanwhile drops it), so the blocks
  // are handed over only when nothing else writes them. ResultFn (the sender's answer) does not
  // wait.
  absl::Status Finish(uint64_t owner, uint64_t transfer_id, uint32_t attempt, uint64_t frames,
                      uint64_t bytes, std::string trailer,
                      std::function<bool()> writes_over = nullptr);
  // The sender `owner` gave up on the attempt (ignored from any other).
  void Abort(uint64_t owner, uint64_t transfer_id, uint32_t attempt, const absl::Status& why);
  // The connection `owner` is gone: its live attempts fail.
  void FailOwner(uint64_t owner, const absl::Status& why);

  // What a sender hears about a transfer it may not know of: NOT_FOUND, naming only the ids it
  // sent itself.
  static absl::Status NotExpected(uint64_t transfer_id, uint32_t attempt);

 private:
  // The entry `owner` may act on for (transfer_id, attempt), or null after NotExpected in
  // `*status`; an owner that never proved the key is counted as refused (kNotNamed).
  Entry* OwnedLocked(uint64_t owner, uint64_t transfer_id, uint32_t attempt, absl::Status* status);
  void RefuseNotNamedLocked(uint64_t transfer_id, const char* what);
  void FailAttemptLocked(Entry* e, const absl::Status& status, bool notify_sender);
  void InvalidateLocked(Entry* e);
  void Tick();
  // A Cancel waiting for its release.
  struct PendingRelease {
    std::shared_ptr<Entry> entry;  // null: the transfer was not expected any more
    bool fenced = false;           // entry's io_mutex was free after the invalidation
    std::function<bool()> writes_over;
    KvReceiver::ReleasedCallback released;
  };
  // Whether `p` is released now (updates p->fenced).
  static bool Released(PendingRelease* p);
  // Runs the released callbacks of the pending releases that are, and the completions held
  // for older writes that are over (event loop).
  void CheckReleases();
  // A completed transfer whose on_complete waits for older writes (Finish's writes_over).
  struct HeldCompletion {
    uint64_t serial = 0;
    CompletedTransfer completed;
    std::function<bool()> writes_over;
  };

  const KvLayout layout_;
  KvRegionAccess* const access_;
  const KvReceiver::CompletionCallback on_complete_;
  const absl::Duration deadline_grace_;
  const absl::Duration max_transfer_time_;
  TransferHooks* const hooks_;
  StatsCounters counters_;
  std::atomic<bool> shutting_down_{false};

  mutable std::mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Entry>> entries_;
  uint64_t next_owner_ = 1;
  absl::Time last_refusal_log_ = absl::InfinitePast();
  uint64_t refusals_not_logged_ = 0;

  std::mutex check_mu_;    // held by CheckReleases throughout; taken before release_mu_
  std::mutex release_mu_;  // never held while calling out; taken without mu_
  std::vector<PendingRelease> pending_releases_;
  std::vector<HeldCompletion> held_completions_;  // under release_mu_
  uint64_t next_held_ = 0;                        // under release_mu_

  EventLoop loop_;  // last: stopped first
};

}  // namespace tandem::kvtransfer
