#pragma once

// The TCP transport's receiving side (decode worker). Threads: one acceptor (poll with a 100 ms
// timeout, also reaps finished connections; refuses connections over ReceiverLimits' caps), one
// reader per connection (handshake within handshake_timeout, then messages in order, payloads
// read with readv straight into the KV regions), and the ReceiverCore's event loop (outcomes,
// deadlines, RESULT messages to senders). Every connection's buffers are charged to the memory
// budget before they are allocated.

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/connection_limiter.h"
#include "kvtransfer/faults.h"
#include "kvtransfer/receiver_core.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/tcp/wire.h"
#include "kvtransfer/transfer_hooks.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer::tcp {

class TcpReceiver : public KvReceiver {
 public:
  static absl::StatusOr<std::unique_ptr<KvReceiver>> Create(const ReceiverOptions& options,
                                                            KvRegionAccess* access,
                                                            CompletionCallback on_complete);
  ~TcpReceiver() override;

  std::string endpoint() const override { return endpoint_; }
  uint64_t incarnation() const override { return incarnation_; }
  void Expect(const Expectation& expectation) override { core_->Expect(expectation); }
  void Cancel(uint64_t transfer_id, ReleasedCallback released) override {
    core_->Cancel(transfer_id, nullptr, std::move(released));
  }
  int64_t num_in_flight() const override { return core_->num_in_flight(); }
  TransportStats stats() const override;

 private:
  struct Conn {
    Fd fd;
    uint64_t owner = 0;
    std::string peer;
    std::string peer_host;  // the address the per-peer cap counts
    absl::Time handshake_deadline;
    std::string binding;  // the handshake's nonces (receiver's, sender's): BeginProof's binding
    int64_t charged = 0;  // reader thread: bytes charged to the budget for this connection
    std::thread thread;
    std::atomic<bool> finished{false};
    std::mutex write_mu;
    std::vector<uint8_t> scratch;  // reader thread: discarded payloads
    // The last (transfer, attempt) rejected, so a stream of its DATA gets one RESULT.
    uint64_t rejected_id = 0;
    int64_t rejected_attempt = -1;
  };

  TcpReceiver(const ReceiverOptions& options, KvRegionAccess* access,
              CompletionCallback on_complete);
  void AcceptLoop();
  void Serve(const std::shared_ptr<Conn>& conn);
  absl::Status Handshake(Conn* conn);
  // With a secret: CHALLENGE, then checks the sender's AUTH. UNAUTHENTICATED saying why.
  absl::Status Authenticate(Conn* conn, const std::string& hello_meta, std::string* receiver_nonce,
                            std::string* sender_nonce);
  // One message: before the handshake completed, at most max_handshake_message bytes and by the
  // handshake deadline; after it, metadata beyond the connection's allowance charged to the
  // budget (added to `*extra`, which the caller releases once done with the message).
  absl::Status ReadMessage(Conn* conn, wire::Prefix* prefix, std::string* meta, bool handshake,
                           int64_t* extra = nullptr);
  bool Charge(int64_t bytes);
  void Release(int64_t bytes);
  // Counts and logs (at most one line per 10 s) a connection refused or closed for `reason`.
  void NoteRefused(KvRefusal reason, const std::string& peer, const absl::Status& why);
  absl::Status HandleBegin(const std::shared_ptr<Conn>& conn, const std::string& meta);
  absl::Status HandleData(Conn* conn, const wire::Prefix& prefix, const std::string& meta);
  absl::Status Drain(Conn* conn, uint64_t bytes);
  void Reject(Conn* conn, uint64_t transfer_id, uint32_t attempt, const absl::Status& status);
  absl::Status Send(Conn* conn, wire::FrameType type, const std::string& meta);
  void ReapFinished(bool all);

  const ReceiverOptions options_;
  const uint64_t incarnation_;
  FaultInjector faults_;
  Fd listen_fd_;
  std::string endpoint_;
  std::atomic<bool> stopping_{false};
  std::mutex conns_mu_;
  std::list<std::shared_ptr<Conn>> conns_;
  ConnectionLimiter limiter_;  // the caps and limits.memory_budget
  std::thread acceptor_;
  std::unique_ptr<ReceiverCore> core_;
};

}  // namespace tandem::kvtransfer::tcp
