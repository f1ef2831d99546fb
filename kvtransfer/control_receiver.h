#pragma once

// The receiving side shared by the device transports whose control messages arrive through
// KvReceiver::HandleControl (nccl, cuda-ipc; control_message.h), beside ControlSender: the whole
// control state machine over ReceiverCore. This shell owns the endpoint name and the incarnation,
// the peers (one per sender id, each with the owner id its attempts carry in the core), the
// dispatch of control messages, CONNECT's layout check and the peer table (a reconnect replaces
// the sender's peer; an optional cap evicts the least recently used, busy or not), BEGIN (the
// incarnation, the sender's peer, the attempt), FINISH (its verdict, waiting for an outcome
// decided meanwhile), ABORT, DISCONNECT, what FINISH waits on and when it is forgotten, a peer that
// goes, and the shutdown. A transport supplies only the link, through the hooks below: what CONNECT
// carries besides the HELLO and what it checks, the link it opens for a sender (nccl: a
// communicator and its receiving thread), the WELCOME it answers, what FINISH must wait for on the
// link, how Cancel waits for writes in flight, the requests of its own kinds, and what a closed
// link releases.
//
// Threads: HandleControl runs on the control service's threads (several at once); the core's
// event loop runs on_complete. Locks: mu_ (peers, outcomes) is taken before the core's; hooks
// are called without mu_ unless they say otherwise.

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kvtransfer/control_message.h"
#include "kvtransfer/receiver_core.h"
#include "kvtransfer/tcp/wire.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer {

// (transfer id, attempt): what FINISH, ABORT and a transport's own messages name.
using AttemptKey = std::pair<uint64_t, uint32_t>;

// How an attempt ended, for the FINISH reply. Set once (the first call wins).
struct AttemptOutcome {
  uint64_t owner = 0;  // the sender's owner id in the core
  std::mutex mu;
  bool set = false;
  absl::Status status;
  std::condition_variable cv;
  void Set(const absl::Status& s);
};

// One sender (by its sender id) and the link the transport keeps with it. Transports extend it
// (nccl: the communicator and its thread).
struct ReceiverPeer {
  virtual ~ReceiverPeer() = default;
  uint64_t sender_id = 0;
  uint64_t owner = 0;  // the owner id of its attempts in the core
  // Under the shell's mutex: when a BEGIN last used it (the eviction order).
  absl::Time last_used_at;
  absl::Time last_used() const { return last_used_at; }
  // For PickVictim: at the cap the least recently used peer goes whatever it has in flight (its
  // attempts fail; the senders retry), so a sender that stalls cannot hold a slot.
  bool idle() const { return true; }
};

class ControlReceiver : public KvReceiver {
 public:
  struct Config {
    std::string transport;    // in names and messages: "nccl", "cuda-ipc"
    std::string thread_name;  // the core's event loop
    ControlKinds kinds;       // the shell answers CONNECT, BEGIN, FINISH, ABORT, DISCONNECT
    int max_peers = 0;        // senders connected at once; 0: no cap
  };

  // The subclass's destructor must call Close() (the hooks are not called after it returned).
  ControlReceiver(const ReceiverOptions& options, KvRegionAccess* access,
                  CompletionCallback on_complete, Config config);
  ~ControlReceiver() override;

  std::string endpoint() const final { return name_; }
  uint64_t incarnation() const final { return incarnation_; }
  void Expect(const Expectation& e) final { core_->Expect(e); }
  // The core forgets the transfer (nothing is admitted for it any more); `released` runs once
  // the writes already admitted ended, the link's included (WritesOver). Never waits.
  void Cancel(uint64_t transfer_id, ReleasedCallback released) final;
  int64_t num_in_flight() const final { return core_->num_in_flight(); }
  TransportStats stats() const final { return core_->counters().Snapshot(); }
  absl::StatusOr<std::string> HandleControl(const std::string& request) final;

 protected:
  // What CONNECT carries besides the HELLO, for OpenPeer.
  struct ConnectArgs {
    wire::Hello hello;
    std::string link;  // transport-specific (nccl: the unique id)
  };

  // Stops every peer (ClosePeer) and the core's callbacks. Called first by the subclass's
  // destructor, while its hooks still work; idempotent.
  void Close();

  // Hooks.
  // CONNECT's body: its HELLO and what the link needs; an error (malformed, or a sender the
  // transport refuses, e.g. on another GPU) is answered REFUSE, like a layout mismatch.
  virtual absl::Status ParseConnect(absl::string_view body, ConnectArgs* args) = 0;
  // Opens the link with a sender that passed the checks, its ids already chosen (a failure is
  // answered as a RESULT). The returned peer must have `sender_id` and `owner` as given.
  virtual absl::StatusOr<std::shared_ptr<ReceiverPeer>> OpenPeer(uint64_t sender_id, uint64_t owner,
                                                                 const ConnectArgs& args) = 0;
  // The WELCOME reply (the shell fills incarnation and layout).
  virtual std::string WelcomeReply(const wire::Welcome& welcome) = 0;
  // BEGIN of `key` from `owner` started the attempt: what the link admits at once (cuda-ipc:
  // every region of the transfer). An error is BEGIN's answer and ends the attempt.
  virtual absl::Status AfterBegin(uint64_t owner, const AttemptKey& key) {
    return absl::OkStatus();
  }
  // Before FINISH of `key` from `owner` is checked: lets the link account for the data it
  // carried (nccl: waits for its thread to count `frames` messages; cuda-ipc: FINISH reports the
  // copies admitted at BEGIN landed, `frames` items of `bytes` bytes). `outcome` is the live
  // attempt's of this owner, or null when it has none.
  virtual void BeforeFinish(uint64_t owner, const AttemptKey& key, uint64_t frames, uint64_t bytes,
                            const std::shared_ptr<AttemptOutcome>& outcome) {}
  // The sender `owner` aborted the attempt `key` (before the core hears it).
  virtual void OnAbort(uint64_t owner, const AttemptKey& key, const absl::Status& why) {}
  // The shell forgot what FINISH waits on for `key` of `owner` (after FINISH or ABORT).
  virtual void OnForget(uint64_t owner, const AttemptKey& key) {}
  // `owner`'s peer is gone (replaced, disconnected, closed); called before the core fails its
  // attempts.
  virtual void OnPeerGone(uint64_t owner) {}
  // Cancel: after the core forgot `transfer_id`, a check (called on any thread, without the
  // shell's or the core's locks, never after Close) of whether no write the link admitted for it
  // can still land (cuda-ipc: the copies in flight); null: the link admits none of its own. The
  // link calls core().WakeReleases() when what it checks changed.
  virtual std::function<bool()> WritesOver(uint64_t transfer_id) { return nullptr; }
  // Requests of the transport's own kinds (cuda-ipc: DATA, LANDED).
  virtual absl::StatusOr<std::string> HandleLink(const ControlRequest& request);
  // Releases a peer's link (joins its threads); it is out of the table already.
  virtual void ClosePeer(ReceiverPeer* peer) {}

  // For the link's threads: the link of `peer` broke; its attempts fail with `why`.
  void LinkBroken(const ReceiverPeer& peer, const absl::Status& why);
  // The owner id of the sender's peer; UNAVAILABLE when it has none.
  absl::StatusOr<uint64_t> OwnerOf(uint64_t sender_id);
  // OwnerOf, or 0 (no attempt's owner) for a sender without a peer.
  uint64_t PeerOwner(uint64_t sender_id);

  const ReceiverOptions& options() const { return options_; }
  ReceiverCore& core() { return *core_; }

 private:
  absl::StatusOr<std::string> Connect(const ControlRequest& req);
  absl::StatusOr<std::string> Begin(const ControlRequest& req);
  absl::StatusOr<std::string> Finish(const ControlRequest& req);
  absl::StatusOr<std::string> Abort(const ControlRequest& req);
  // Drops what FINISH waits on for an attempt of `owner` (another sender's stays).
  void Forget(const AttemptKey& key, uint64_t owner);
  // Takes the sender's peer out of the table and ends it: its link closed, its attempts failed.
  void DropPeer(uint64_t sender_id, const absl::Status& why);
  void EndPeer(const std::shared_ptr<ReceiverPeer>& peer, const absl::Status& why);
  // Under mu_: forgets the outcomes of `owner`.
  void ForgetOwnerLocked(uint64_t owner);

  const ReceiverOptions options_;
  const Config config_;
  const std::string name_;
  const uint64_t incarnation_;
  std::mutex mu_;
  bool closing_ = false;
  std::unordered_map<uint64_t, std::shared_ptr<ReceiverPeer>> peers_;  // by sender id
  std::map<AttemptKey, std::shared_ptr<AttemptOutcome>> outcomes_;
  std::unique_ptr<ReceiverCore> core_;
};

// FAILED_PRECONDITION when BEGIN's transfer was reserved under another incarnation than this
// receiver's.
absl::Status CheckIncarnation(const wire::Begin& b, uint64_t incarnation);

// The attempt BEGIN from sender `sender_id` starts on its owner id `owner` (its deadline
// relative to now; its proof of the transfer key bound to the sender id).
ReceiverCore::AttemptStart AttemptFromBegin(wire::Begin b, uint64_t owner, uint64_t sender_id);

// What an attempt ends with when the sender aborted it with `status` (ABORTED when OK).
absl::Status SenderAborted(const absl::Status& status);

}  // namespace tandem::kvtransfer
