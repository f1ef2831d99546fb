#pragma once

// The TCP transport's sending side (prefill worker): SenderCore over pooled connections. One
// connection per receiver endpoint, shared by all transfers to it and replaced (fresh
// handshake) when it breaks or the receiver's incarnation changes. Threads: per connection a
// writer and a reader (see SenderConnection), plus the core's event loop for user callbacks,
// deadlines and closing connections that are no longer used.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtransfer/faults.h"
#include "kvtransfer/sender_core.h"
#include "kvtransfer/tcp/sender_connection.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer::tcp {

class TcpSender : public CoreSender {
 public:
  static absl::StatusOr<std::unique_ptr<KvSender>> Create(const SenderOptions& options,
                                                          KvRegionAccess* access);
  // Aborts what is in flight (done callbacks run with ABORTED), tells the receivers, closes.
  ~TcpSender() override;

  absl::StatusOr<TransferHandle> Begin(const TransferTarget& target,
                                       std::vector<int32_t> src_blocks) override;

 private:
  TcpSender(const SenderOptions& options, KvRegionAccess* access);
  absl::StatusOr<std::shared_ptr<SenderConnection>> GetConnection(const TransferTarget& target);
  void OnConnectionFailed(SenderConnection* conn, const absl::Status& status);
  // On the core's event loop: closes connections nobody can use any more.
  void CloseUnused();

  KvRegionAccess* const access_;
  ConnectionOptions conn_options_;
  FaultInjector faults_;

  std::mutex mu_;  // taken before the core's
  bool closing_ = false;
  std::unordered_map<std::string, std::shared_ptr<SenderConnection>> pool_;
  // Every connection until it is closed by CloseUnused or the destructor (so none is ever
  // destroyed on its own threads).
  std::vector<std::shared_ptr<SenderConnection>> conns_;

  SenderCore core_;  // last: its event loop stops first
};

}  // namespace tandem::kvtransfer::tcp
