#pragma once

// The sending side shared by the device transports whose control messages travel over
// SenderOptions::control_channel (nccl, cuda-ipc; control_message.h): SenderCore over one peer
// per receiver endpoint, each with a worker thread that runs the queued work in order and a
// finisher thread for FINISH and ABORT, so SendLayer only enqueues. This shell owns the peers,
// Begin (CONNECT when needed, then BEGIN over the control channel on the calling thread), the
// control exchange, the worker loop, FINISH and ABORT, a peer that breaks, retiring replaced peers
// and the shutdown; a transport supplies what differs through the hooks below: how a peer connects
// (its device state), how one DATA item moves, what a stopped or broken peer releases. User
// callbacks run on the core's event loop.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kvtransfer/control_message.h"
#include "kvtransfer/faults.h"
#include "kvtransfer/sender_core.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer {

// The link to one receiver endpoint and its two threads: the worker runs the queued DATA work in
// order (it only queues device work: it never waits for a transfer's data to complete) and hands
// each FINISH and ABORT, in order, to the finisher, which waits for that transfer's device work
// (SettleReads) and exchanges the control message. So a transfer's FINISH never holds up the
// next transfer's data: several transfers are in flight per peer. Transports extend it with
// their device state (a communicator, a mapped pool and a stream).
struct ControlPeer : SenderLink {
  std::string endpoint;
  uint64_t incarnation = 0;
  std::thread worker;
  std::thread finisher;
  std::mutex mu;  // the two queues and worker_done
  std::condition_variable cv;
  std::condition_variable finish_cv;
  std::deque<SenderWork> queue;      // DATA, FINISH, ABORT: the worker's
  std::deque<SenderWork> finishing;  // FINISH, ABORT handed to the finisher
  bool worker_done = false;          // the worker returned: the finisher drains and returns
  std::atomic<bool> stop{false};
  std::atomic<bool> broken{false};

  // BEGIN went over the control channel inside Begin already: kBegin is not queued.
  void Send(SenderWork work) override;
  bool healthy() const override { return !broken; }
};

class ControlSender : public CoreSender {
 public:
  struct Config {
    std::string transport;    // in messages: "nccl", "cuda-ipc"
    std::string thread_name;  // the core's event loop
    ControlKinds kinds;
    size_t max_blocks_per_message = SIZE_MAX;
  };

  // The subclass's destructor must call Close() (the hooks are not called after it returned).
  ControlSender(const SenderOptions& options, KvRegionAccess* access, Config config);
  ~ControlSender() override;

  absl::StatusOr<TransferHandle> Begin(const TransferTarget& target,
                                       std::vector<int32_t> src_blocks) final;

 protected:
  using PeerMap = std::unordered_map<std::string, std::shared_ptr<ControlPeer>>;

  // Aborts what is in flight (done(ABORTED) delivered), stops every peer (DISCONNECT to the live
  // ones) and the core's event loop. Called first by the subclass's destructor, while its hooks
  // still work; idempotent.
  void Close();

  // Hooks, in the order a peer lives.
  // Under mu_, before connecting to an endpoint that has no peer: the peer to evict (it is
  // retired), peers.end() for none, or an error when the transport cannot take another peer.
  virtual absl::StatusOr<PeerMap::iterator> PickEviction(PeerMap& peers) { return peers.end(); }
  // Connects a new peer to target.endpoint on the calling thread, outside mu_: the CONNECT
  // exchange (Handshake) and the transport's setup, with `endpoint` and `incarnation` set. The
  // shell starts its worker and installs it; a peer of another incarnation than the target's is
  // installed too and Begin fails (a transport may refuse earlier with IncarnationMismatch).
  virtual absl::StatusOr<std::shared_ptr<ControlPeer>> Connect(const TransferTarget& target) = 0;
  // Begin of a zero-copy target (TransferTarget::zero_copy), once the peer is connected and
  // before BEGIN: OK when the caller may write the transfer's blocks through this peer, else
  // UNIMPLEMENTED saying why (the caller begins again copying).
  virtual absl::Status CheckZeroCopy(ControlPeer* p, const TransferTarget& target) {
    return absl::UnimplementedError(absl::StrCat(
        "the ", config_.transport, " kv transport copies the KV: zero-copy needs cuda-ipc"));
  }
  // First thing on the peer's worker thread.
  virtual void StartWorker(ControlPeer* p) {}
  // One DATA item on the worker thread, between the core's StartRead and EndRead. A failure
  // breaks the peer (its transfers fail); a transport that fails one transfer only ends it
  // (core().End) and returns OK. A transport whose device work outlives the call (nccl's sends,
  // cuda-ipc's copies: queued on a stream, never waited for here) keeps a read of its own
  // (core().StartRead) until SettleReads.
  virtual absl::Status SendData(ControlPeer* p, SenderWork& work) = 0;
  // On the worker thread, in queue order, as it hands a FINISH or ABORT to the finisher: device
  // work that must precede the message (cuda-ipc: a zero-copy transfer's ABORT waits for the
  // engine's latest events).
  virtual void BeforeFinishing(ControlPeer* p, SenderWork& work) {}
  // On the finisher thread (concurrently with SendData of later transfers on the worker), before
  // the transfer's FINISH or ABORT goes out; every DATA item of the transfer was handed to
  // SendData before: waits for the device work of the transfer still in flight and ends the
  // reads it kept; returns how it went (a failure of the copies fails the transfer, ABORT
  // following; DEADLINE_EXCEEDED, CANCELLED, INTERNAL and UNAVAILABLE also break the peer).
  virtual absl::Status SettleReads(ControlPeer* p, const std::shared_ptr<SenderTransfer>& t) {
    return absl::OkStatus();
  }
  // The peer broke, on its worker or its finisher thread (once), before its transfers fail.
  virtual void OnBroken(ControlPeer* p) {}
  // The peer stopped: its worker joined, its queue cleared. Releases its device state.
  virtual void Release(ControlPeer* p) {}

  // One control exchange with `endpoint`: `kind` and `body` framed with this sender's id. An
  // unreachable receiver is UNAVAILABLE, a refused proof of the shared secret UNAUTHENTICATED,
  // a REFUSE or a failed RESULT its status; both name the endpoint. A WELCOME is OK, with the
  // reply in `reply_out` when given. With kv_control_drop, a message other than CONNECT may be
  // lost (UNAVAILABLE).
  // `transfer`, when given, counts the message and its reply as the transfer's
  // (TransferHooks::ControlMessages).
  absl::Status Control(const std::string& endpoint, uint8_t kind, std::string body,
                       ControlReply* reply_out = nullptr, SenderTransfer* transfer = nullptr);
  // The CONNECT exchange: as Control, counting a refused handshake (FAILED_PRECONDITION).
  absl::Status Handshake(const std::string& endpoint, std::string body, ControlReply* reply);
  // A receiver that is not the one the blocks were reserved with (FAILED_PRECONDITION).
  static absl::Status IncarnationMismatch(const std::string& endpoint, uint64_t have,
                                          uint64_t want);

  const SenderOptions& options() const { return options_; }
  KvRegionAccess* access() const { return access_; }
  FaultInjector& faults() { return faults_; }
  SenderCore& core() { return core_; }

 private:
  // The peer to send target's transfer through: the endpoint's live peer of the target's
  // incarnation, else a new one connected now.
  absl::StatusOr<std::shared_ptr<ControlPeer>> GetPeer(const TransferTarget& target);
  // GetPeer's connect, under the endpoint's connecting_ mutex.
  absl::StatusOr<std::shared_ptr<ControlPeer>> ConnectLocked(const TransferTarget& target);
  // Under mu_: the endpoint's peer if it serves the target's incarnation and is not broken.
  std::shared_ptr<ControlPeer> UsablePeer(const TransferTarget& target);
  void StopPeer(const std::shared_ptr<ControlPeer>& p, bool tell_receiver);
  void Work(ControlPeer* p);
  // The finisher thread: FINISH and ABORT in the order the worker handed them over.
  void FinishWork(ControlPeer* p);
  absl::Status Run(ControlPeer* p, SenderWork& work);
  void Broken(ControlPeer* p, const absl::Status& s);
  // The transfer's last control message (FINISH or ABORT) was exchanged: reports its count.
  void ReportControl(const SenderTransfer& t);
  // On the core's event loop: peers replaced, evicted or broken are stopped once nothing uses
  // them.
  void StopRetired();

  const SenderOptions options_;
  KvRegionAccess* const access_;
  const Config config_;
  FaultInjector faults_{options_.faults};
  const uint64_t sender_id_;
  std::mutex mu_;  // the peers; taken before the core's
  bool closing_ = false;
  PeerMap peers_;
  // Under mu_: one mutex per endpoint being connected, held across the connect (taken before
  // mu_); an entry lives while someone connects.
  std::unordered_map<std::string, std::shared_ptr<std::mutex>> connecting_;
  std::vector<std::shared_ptr<ControlPeer>> retired_;  // stopped when unused
  SenderCore core_;                                    // last: its event loop stops first
};

}  // namespace tandem::kvtransfer
