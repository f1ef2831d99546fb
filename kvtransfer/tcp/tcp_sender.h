#pragma once

// The TCP transport's sending side (prefill worker). One pooled connection per receiver
// endpoint, shared by all transfers to it and replaced (fresh handshake) when it breaks or the
// receiver's incarnation changes. Threads: per connection a writer and a reader (see
// SenderConnection), plus one event loop for user callbacks, deadlines and closing connections
// that are no longer used.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtransfer/event_loop.h"
#include "kvtransfer/faults.h"
#include "kvtransfer/stats.h"
#include "kvtransfer/tcp/sender_connection.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer::tcp {

class TcpSender : public KvSender {
 public:
  static absl::StatusOr<std::unique_ptr<KvSender>> Create(const SenderOptions& options,
                                                          KvRegionAccess* access);
  // Aborts what is in flight (done callbacks run with ABORTED), tells the receivers, closes.
  ~TcpSender() override;

  absl::StatusOr<TransferHandle> Begin(const TransferTarget& target,
                                       std::vector<int32_t> src_blocks) override;
  void SendLayer(TransferHandle handle, int64_t layer) override;
  void Finish(TransferHandle handle, std::string trailer, DoneCallback done) override;
  void Abort(TransferHandle handle) override;
  int64_t num_in_flight() const override;
  TransportStats stats() const override { return counters_.Snapshot(); }

 private:
  using WireKey = std::tuple<const SenderConnection*, uint64_t, uint32_t>;

  TcpSender(const SenderOptions& options, KvRegionAccess* access);
  absl::StatusOr<std::shared_ptr<SenderConnection>> GetConnection(const TransferTarget& target);
  void OnResult(SenderConnection* conn, uint64_t transfer_id, uint32_t attempt,
                const absl::Status& status);
  void OnConnectionFailed(SenderConnection* conn, const absl::Status& status);
  // Ends the attempt: the regions are never read again once this returns.
  void EndLocked(SenderTransfer* t, const absl::Status& status, bool tell_receiver);
  void Tick();

  const SenderOptions options_;
  KvRegionAccess* const access_;
  ConnectionOptions conn_options_;
  FaultInjector faults_;
  StatsCounters counters_;

  mutable std::mutex mu_;
  bool closing_ = false;
  TransferHandle next_handle_ = 1;
  std::unordered_map<TransferHandle, std::shared_ptr<SenderTransfer>> transfers_;
  std::map<WireKey, TransferHandle> by_wire_id_;
  std::unordered_map<std::string, std::shared_ptr<SenderConnection>> pool_;
  // Every connection until it is closed by Tick or the destructor (so none is ever destroyed
  // on its own threads).
  std::vector<std::shared_ptr<SenderConnection>> conns_;

  EventLoop loop_;  // last: stopped first
};

}  // namespace tandem::kvtransfer::tcp
