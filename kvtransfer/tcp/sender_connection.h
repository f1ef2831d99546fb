#pragma once

// One TCP connection from a sender to a receiver endpoint, shared by every transfer to that
// endpoint (multiplexed: messages of different transfers interleave at message boundaries).
// Threads: a writer that drains a FIFO of work items (the engine thread only enqueues, so it
// never blocks on the network) and a reader for the receiver's RESULT messages.

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
#include "kvtransfer/stats.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer::tcp {

class SenderConnection;

// What the writer needs of one transfer attempt. Immutable after Begin except where noted.
struct SenderTransfer : std::enable_shared_from_this<SenderTransfer> {
  TransferHandle handle = 0;
  uint64_t transfer_id = 0;
  uint32_t attempt = 0;
  uint64_t incarnation = 0;
  std::vector<int32_t> src_blocks;
  std::vector<int32_t> dst_blocks;
  absl::Time deadline = absl::InfiniteFuture();
  absl::Time started;
  std::shared_ptr<SenderConnection> conn;

  // Writer thread only: what was put on the wire (dropped-by-fault messages included).
  uint64_t frames_sent = 0;
  uint64_t bytes_sent = 0;

  // The writer reads the source regions only under io_mu while `readable`; ending the
  // transfer clears it under io_mu, after which the regions are never read again.
  std::mutex io_mu;
  bool readable = true;

  // Owned by TcpSender (under its mutex).
  bool ended = false;
  absl::Status outcome;
  bool finish_called = false;
  KvSender::DoneCallback done;
  std::vector<bool> layer_queued;
};

struct WorkItem {
  enum class Kind { kBegin, kData, kFinish, kAbort };
  Kind kind = Kind::kData;
  std::shared_ptr<SenderTransfer> transfer;
  int64_t layer = 0;  // kData
  size_t first = 0;   // kData: blocks [first, first + count) of the transfer
  size_t count = 0;
  std::string trailer;  // kFinish
  absl::Status status;  // kAbort
};

struct ConnectionOptions {
  KvLayout layout;
  absl::Duration io_timeout = absl::Seconds(10);
  bool checksum = true;
  std::string secret;  // SenderOptions::secret
  // Told of the connections this sender refuses itself (not of the receiver's refusals).
  TransferHooks* hooks = nullptr;
};

class SenderConnection {
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
  ~SenderConnection();

  const std::string& endpoint() const { return endpoint_; }
  uint64_t incarnation() const { return incarnation_; }
  bool healthy() const { return !failed_; }
  // Healthy and no close from the peer is pending on the socket (a restarted receiver's old
  // connection is noticed here before the reader thread gets to it).
  bool usable() const;
  // True when nothing is queued or being written.
  bool idle() const;

  void Enqueue(WorkItem item);
  // Lets the writer send what is queued (bounded by io_timeout per message), then closes and
  // joins. Not from the connection's own threads.
  void Close();

 private:
  SenderConnection(std::string endpoint, const ConnectionOptions& options, Fd fd,
                   uint64_t incarnation, KvRegionAccess* access, FaultInjector* faults,
                   StatsCounters* counters, Callbacks callbacks);
  void WriterLoop();
  void ReaderLoop();
  absl::Status Write(const WorkItem& item);
  absl::Status WriteData(const WorkItem& item);
  absl::Status WriteSmall(uint16_t type, const std::string& meta);
  void Fail(const absl::Status& status);

  const std::string endpoint_;
  const ConnectionOptions options_;
  Fd fd_;
  const uint64_t incarnation_;
  KvRegionAccess* const access_;
  FaultInjector* const faults_;
  StatsCounters* const counters_;
  const Callbacks callbacks_;
  std::vector<uint8_t> scratch_;    // writer: zeros sent for regions no longer readable
  std::vector<uint8_t> corrupted_;  // writer: fault injection's corrupted copy of a region

  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<WorkItem> queue_;
  bool busy_ = false;
  bool closing_ = false;
  std::thread writer_;
  std::thread reader_;
};

}  // namespace tandem::kvtransfer::tcp
