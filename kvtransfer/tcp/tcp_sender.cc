#include "kvtransfer/tcp/tcp_sender.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"

namespace tandem::kvtransfer::tcp {

absl::StatusOr<std::unique_ptr<KvSender>> TcpSender::Create(const SenderOptions& options,
                                                            KvRegionAccess* access) {
  absl::Status valid = SenderCore::CheckOptions(options, access);
  if (!valid.ok()) return valid;
  return std::unique_ptr<KvSender>(new TcpSender(options, access));
}

TcpSender::TcpSender(const SenderOptions& options, KvRegionAccess* access)
    : CoreSender(&core_),
      access_(access),
      faults_(ResolveFaultOptions(options.faults, options.faults_from_env)),
      core_(options, access, "kvt-send-loop", [this] { CloseUnused(); }) {
  conn_options_.layout = options.layout;
  conn_options_.io_timeout = options.io_timeout;
  conn_options_.checksum = options.checksum;
  conn_options_.secret = options.secret;
  conn_options_.hooks = options.hooks;
}

TcpSender::~TcpSender() {
  core_.Shutdown();  // queues the ABORTs
  std::vector<std::shared_ptr<SenderConnection>> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    pool_.clear();
    conns.swap(conns_);
  }
  for (auto& c : conns) c->Close();  // flushes the ABORTs
  core_.Stop();                      // runs the done callbacks already posted
}

absl::StatusOr<std::shared_ptr<SenderConnection>> TcpSender::GetConnection(
    const TransferTarget& target) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pool_.find(target.endpoint);
    if (it != pool_.end() && it->second->usable() &&
        it->second->incarnation() == target.incarnation) {
      return it->second;
    }
  }
  // No usable connection, or one to another incarnation: ask the endpoint afresh (a peer that
  // restarted is only ever learnt through a new handshake; stale state is never reused).
  absl::Duration timeout = core_.options().connect_timeout;
  if (target.deadline != absl::InfiniteFuture()) {
    timeout = std::min(timeout, target.deadline - absl::Now());
  }
  SenderConnection::Callbacks callbacks;
  callbacks.on_result = [this](SenderConnection* c, uint64_t id, uint32_t attempt,
                               const absl::Status& s) { core_.OnResult(c, id, attempt, s); };
  callbacks.on_failed = [this](SenderConnection* c, const absl::Status& s) {
    OnConnectionFailed(c, s);
  };
  absl::StatusOr<std::shared_ptr<SenderConnection>> fresh = SenderConnection::Connect(
      target.endpoint, conn_options_, timeout, access_, &faults_, &core_.counters(), callbacks);
  if (!fresh.ok()) return fresh.status();
  std::shared_ptr<SenderConnection> conn = *fresh;
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return absl::CancelledError("kv sender shutting down");
  conns_.push_back(conn);
  std::shared_ptr<SenderConnection>& slot = pool_[target.endpoint];
  if (!slot || !slot->usable() || slot->incarnation() != conn->incarnation()) {
    slot = conn;  // what the endpoint is now
  } else {
    conn = slot;  // a racing Begin pooled an equivalent one; the fresh one is reaped unused
  }
  if (conn->incarnation() != target.incarnation) {
    return absl::FailedPreconditionError(
        absl::StrCat("kv transfer peer ", target.endpoint, " has incarnation ", conn->incarnation(),
                     " but the blocks were reserved under incarnation ", target.incarnation,
                     " (the receiver restarted; its reservations are gone)"));
  }
  return conn;
}

absl::StatusOr<TransferHandle> TcpSender::Begin(const TransferTarget& target,
                                                std::vector<int32_t> src_blocks) {
  absl::Status s = core_.CheckBegin(target, src_blocks);
  if (!s.ok()) return s;
  absl::StatusOr<std::shared_ptr<SenderConnection>> conn = GetConnection(target);
  if (!conn.ok()) return conn.status();
  return core_.Start(target, std::move(src_blocks), *std::move(conn));
}

void TcpSender::OnConnectionFailed(SenderConnection* conn, const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
    core_.counters().connections_lost.fetch_add(1, std::memory_order_relaxed);
    TLOG(WARNING) << status.message();
    auto pooled = pool_.find(conn->endpoint());
    if (pooled != pool_.end() && pooled->second.get() == conn) pool_.erase(pooled);
  }
  core_.FailLink(conn, status);
}

void TcpSender::CloseUnused() {
  std::vector<std::shared_ptr<SenderConnection>> to_close;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Broken or replaced, and not needed by a transfer still in flight or by a queued message.
    for (auto it = conns_.begin(); it != conns_.end();) {
      SenderConnection* c = it->get();
      auto pooled = pool_.find(c->endpoint());
      const bool in_pool = pooled != pool_.end() && pooled->second.get() == c;
      if ((!in_pool || !c->healthy()) && c->idle() && (!c->healthy() || c->drained())) {
        to_close.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : to_close) c->Close();
}

}  // namespace tandem::kvtransfer::tcp
