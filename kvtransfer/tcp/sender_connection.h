#pragma once

// One TCP connection from a sender to a receiver endpoint, shared by every transfer to that
// endpoint (multiplexed: messages of different transfers interleave at message boundaries): the
// tcp transport's SenderLink. Threads: a writer that drains a FIFO of SenderWork (the engine
// thread only enqueues, so it never blocks on the network) and a reader for the receiver's
// RESULT messages.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/faults.h"
#include "kvtransfer/sender_core.h"
#include "kvtransfer/stats.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer::tcp {

struct ConnectionOptions {
  KvLayout layout;
  absl::Duration io_timeout = absl::Seconds(10);
  bool checksum = true;
  std::string secret;  // SenderOptions::secret
  // Told of the connections this sender refuses itself (not of the receiver's refusals).
  TransferHooks* hooks = nullptr;
};

class SenderConnection : public SenderLink {
 public:
  struct Callbacks {
    // A RESULT arrived.
    std::function<void(SenderConnection*, uint64_t transfer_id, uint32_t attempt,
                       const absl::Status&)>
        on_result;
    // The connection broke (called once, from one of its threads).
    std::function<void(SenderConnection*, const absl::Status&)> on_failed;
  };

  // Connects and handshakes (HELLO -> [CHALLENGE -> AUTH ->] WELCOME | REFUSE) on the calling
  // thread, then starts the threads. FAILED_PRECONDITION when refused for the layout (the
  // message names the field), UNAUTHENTICATED when either side cannot prove the shared secret
  // (the message says which), UNAVAILABLE or DEADLINE_EXCEEDED when unreachable.
  static absl::StatusOr<std::shared_ptr<SenderConnection>> Connect(
      const std::string& endpoint, const ConnectionOptions& options, absl::Duration timeout,
      KvRegionAccess* access, FaultInjector* faults, StatsCounters* counters, Callbacks callbacks);
  ~SenderConnection() override;

  const std::string& endpoint() const { return endpoint_; }
  uint64_t incarnation() const { return incarnation_; }
  bool healthy() const override { return !failed_; }
  // Healthy and no close from the peer is pending on the socket (a restarted receiver's old
  // connection is noticed here before the reader thread gets to it).
  bool usable() const;
  // True when nothing is queued or being written.
  bool drained() const;

  // Queues `work` for the writer (dropped once the connection failed or is closing).
  void Send(SenderWork work) override;
  // Lets the writer send what is queued (bounded by io_timeout per message), then closes and
  // joins. Not from the connection's own threads.
  void Close();

 private:
  SenderConnection(std::string endpoint, const ConnectionOptions& options, Fd fd,
                   uint64_t incarnation, KvRegionAccess* access, FaultInjector* faults,
                   StatsCounters* counters, Callbacks callbacks);
  void WriterLoop();
  void ReaderLoop();
  absl::Status Write(const SenderWork& work);
  absl::Status WriteData(const SenderWork& work);
  absl::Status WriteSmall(uint16_t type, const std::string& meta);
  void Fail(const absl::Status& status);

  const std::string endpoint_;
  const ConnectionOptions options_;
  Fd fd_;
  const uint64_t incarnation_;
  std::string binding_;  // the handshake's nonces (receiver's, sender's): BeginProof's binding
  KvRegionAccess* const access_;
  FaultInjector* const faults_;
  StatsCounters* const counters_;
  const Callbacks callbacks_;
  std::vector<uint8_t> scratch_;    // writer: zeros sent for regions no longer readable
  std::vector<uint8_t> corrupted_;  // writer: fault injection's corrupted copy of a region

  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SenderWork> queue_;
  bool busy_ = false;
  bool closing_ = false;
  std::thread writer_;
  std::thread reader_;
};

}  // namespace tandem::kvtransfer::tcp
