#include "kvtransfer/tcp/tcp_sender.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "kvtransfer/layout.h"

namespace tandem::kvtransfer::tcp {

absl::StatusOr<std::unique_ptr<KvSender>> TcpSender::Create(const SenderOptions& options,
                                                            KvRegionAccess* access) {
  absl::Status valid = ValidateLayout(options.layout);
  if (!valid.ok()) return valid;
  if (access == nullptr) return absl::InvalidArgumentError("kv sender needs region access");
  if (options.max_message_bytes == 0) {
    return absl::InvalidArgumentError("max_message_bytes must be positive");
  }
  return std::unique_ptr<KvSender>(new TcpSender(options, access));
}

TcpSender::TcpSender(const SenderOptions& options, KvRegionAccess* access)
    : options_(options),
      access_(access),
      faults_(ResolveFaultOptions(options.faults, options.faults_from_env)),
      loop_("kvt-send-loop", absl::Milliseconds(10), [this] { Tick(); }) {
  conn_options_.layout = options.layout;
  conn_options_.io_timeout = options.io_timeout;
  conn_options_.checksum = options.checksum;
  conn_options_.secret = options.secret;
  conn_options_.hooks = options.hooks;
}

TcpSender::~TcpSender() {
  std::vector<std::shared_ptr<SenderConnection>> conns;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
    std::vector<std::shared_ptr<SenderTransfer>> live;
    for (auto& [handle, t] : transfers_) live.push_back(t);
    for (auto& t : live) {
      EndLocked(t.get(), absl::AbortedError("kv sender shut down"), /*tell_receiver=*/true);
    }
    transfers_.clear();
    pool_.clear();
    conns.swap(conns_);
  }
  for (auto& c : conns) c->Close();  // flushes the ABORTs
  loop_.Stop();                      // runs the done callbacks already posted
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
  absl::Duration timeout = options_.connect_timeout;
  if (target.deadline != absl::InfiniteFuture()) {
    timeout = std::min(timeout, target.deadline - absl::Now());
  }
  SenderConnection::Callbacks callbacks;
  callbacks.on_result = [this](SenderConnection* c, uint64_t id, uint32_t attempt,
                               const absl::Status& s) { OnResult(c, id, attempt, s); };
  callbacks.on_failed = [this](SenderConnection* c, const absl::Status& s) {
    OnConnectionFailed(c, s);
  };
  absl::StatusOr<std::shared_ptr<SenderConnection>> fresh = SenderConnection::Connect(
      target.endpoint, conn_options_, timeout, access_, &faults_, &counters_, callbacks);
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
  if (src_blocks.size() != target.dst_blocks.size()) {
    return absl::InvalidArgumentError(absl::StrCat("kv transfer of ", src_blocks.size(),
                                                   " source blocks into ", target.dst_blocks.size(),
                                                   " destinations"));
  }
  const int64_t num_blocks = access_->num_blocks();
  for (int32_t b : src_blocks) {
    if (b < 0 || b >= num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("source block ", b, " outside the pool [0, ", num_blocks, ")"));
    }
  }
  if (absl::Now() >= target.deadline) {
    return absl::DeadlineExceededError("kv transfer deadline passed before it began");
  }
  absl::StatusOr<std::shared_ptr<SenderConnection>> conn = GetConnection(target);
  if (!conn.ok()) return conn.status();

  auto t = std::make_shared<SenderTransfer>();
  t->transfer_id = target.transfer_id;
  t->attempt = target.attempt;
  t->incarnation = target.incarnation;
  t->src_blocks = std::move(src_blocks);
  t->dst_blocks = target.dst_blocks;
  t->deadline = std::min(target.deadline, absl::Now() + options_.max_transfer_time);
  t->started = absl::Now();
  t->conn = *conn;
  t->layer_queued.assign(static_cast<size_t>(options_.layout.num_layers), false);

  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return absl::CancelledError("kv sender shutting down");
  if (!t->conn->healthy()) {
    return absl::UnavailableError(
        absl::StrCat("kv transfer connection to ", target.endpoint, " was lost"));
  }
  const WireKey key{t->conn.get(), t->transfer_id, t->attempt};
  if (by_wire_id_.count(key)) {
    return absl::AlreadyExistsError(absl::StrCat("kv transfer ", t->transfer_id, " attempt ",
                                                 t->attempt, " is already in flight"));
  }
  t->handle = next_handle_++;
  transfers_.emplace(t->handle, t);
  by_wire_id_.emplace(key, t->handle);
  counters_.transfers_started.fetch_add(1, std::memory_order_relaxed);
  WorkItem item;
  item.kind = WorkItem::Kind::kBegin;
  item.transfer = t;
  t->conn->Enqueue(std::move(item));
  return t->handle;
}

void TcpSender::SendLayer(TransferHandle handle, int64_t layer) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(handle);
  if (it == transfers_.end()) return;
  SenderTransfer* t = it->second.get();
  if (t->ended) return;
  if (layer < 0 || layer >= options_.layout.num_layers || t->layer_queued[layer]) {
    EndLocked(t,
              absl::InvalidArgumentError(absl::StrCat(
                  "SendLayer(", layer, ") ",
                  layer < 0 || layer >= options_.layout.num_layers ? "out of range" : "twice")),
              /*tell_receiver=*/true);
    return;
  }
  t->layer_queued[layer] = true;
  const size_t region = options_.layout.region_bytes();
  const size_t per_message = std::max<size_t>(1, options_.max_message_bytes / region);
  for (size_t first = 0; first < t->src_blocks.size(); first += per_message) {
    WorkItem item;
    item.kind = WorkItem::Kind::kData;
    item.transfer = it->second;
    item.layer = layer;
    item.first = first;
    item.count = std::min(per_message, t->src_blocks.size() - first);
    t->conn->Enqueue(std::move(item));
  }
}

void TcpSender::Finish(TransferHandle handle, std::string trailer, DoneCallback done) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(handle);
  if (it == transfers_.end()) {
    if (done) {
      loop_.Post([done = std::move(done), handle] {
        done(absl::NotFoundError(absl::StrCat("unknown kv transfer handle ", handle)));
      });
    }
    return;
  }
  std::shared_ptr<SenderTransfer> t = it->second;
  if (t->finish_called) {
    if (done) {
      loop_.Post([done = std::move(done)] {
        done(absl::FailedPreconditionError("Finish called twice on a kv transfer"));
      });
    }
    return;
  }
  t->finish_called = true;
  t->done = std::move(done);
  if (t->ended) {
    if (t->done) loop_.Post([done = std::move(t->done), s = t->outcome] { done(s); });
    transfers_.erase(it);
    return;
  }
  for (size_t l = 0; l < t->layer_queued.size(); ++l) {
    if (!t->layer_queued[l]) {
      EndLocked(t.get(),
                absl::FailedPreconditionError(
                    absl::StrCat("kv transfer finished before layer ", l, " was sent")),
                /*tell_receiver=*/true);
      return;
    }
  }
  WorkItem item;
  item.kind = WorkItem::Kind::kFinish;
  item.transfer = t;
  item.trailer = std::move(trailer);
  t->conn->Enqueue(std::move(item));
}

void TcpSender::Abort(TransferHandle handle) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = transfers_.find(handle);
  if (it == transfers_.end()) return;
  std::shared_ptr<SenderTransfer> t = it->second;
  if (!t->ended) {
    EndLocked(t.get(), absl::AbortedError("kv transfer aborted by the sender"),
              /*tell_receiver=*/true);
  }
  transfers_.erase(handle);
}

int64_t TcpSender::num_in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(transfers_.size());
}

void TcpSender::EndLocked(SenderTransfer* t, const absl::Status& status, bool tell_receiver) {
  if (t->ended) return;
  t->ended = true;
  t->outcome = status;
  {
    std::lock_guard<std::mutex> io(t->io_mu);
    t->readable = false;
  }
  by_wire_id_.erase(WireKey{t->conn.get(), t->transfer_id, t->attempt});
  if (status.ok()) {
    counters_.transfers_ok.fetch_add(1, std::memory_order_relaxed);
    counters_.RecordLatency(absl::Now() - t->started);
  } else {
    counters_.transfers_failed.fetch_add(1, std::memory_order_relaxed);
    if (absl::IsDeadlineExceeded(status)) {
      counters_.deadline_expired.fetch_add(1, std::memory_order_relaxed);
    }
    if (tell_receiver && t->conn->healthy()) {
      WorkItem item;
      item.kind = WorkItem::Kind::kAbort;
      item.transfer = t->shared_from_this();
      // A fresh rep: Status refcounts live in the (uninstrumented) abseil library.
      item.status = absl::Status(status.code(), std::string(status.message()));
      t->conn->Enqueue(std::move(item));
    }
  }
  if (t->finish_called) {
    if (t->done) loop_.Post([done = std::move(t->done), status] { done(status); });
    transfers_.erase(t->handle);  // may destroy *t: nothing after this
  }
}

void TcpSender::OnResult(SenderConnection* conn, uint64_t transfer_id, uint32_t attempt,
                         const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  auto key = by_wire_id_.find(WireKey{conn, transfer_id, attempt});
  if (key == by_wire_id_.end()) return;  // already ended (a duplicate or late RESULT)
  auto it = transfers_.find(key->second);
  if (it == transfers_.end()) return;
  SenderTransfer* t = it->second.get();
  if (status.ok() && !t->finish_called) return;  // only FINISH earns an OK
  EndLocked(t,
            status.ok() ? status
                        : absl::Status(status.code(),
                                       absl::StrCat("kv transfer receiver ", conn->endpoint(), ": ",
                                                    status.message())),
            /*tell_receiver=*/false);
}

void TcpSender::OnConnectionFailed(SenderConnection* conn, const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return;
  counters_.connections_lost.fetch_add(1, std::memory_order_relaxed);
  TLOG(WARNING) << status.message();
  auto pooled = pool_.find(conn->endpoint());
  if (pooled != pool_.end() && pooled->second.get() == conn) pool_.erase(pooled);
  std::vector<SenderTransfer*> victims;
  for (auto& [handle, t] : transfers_) {
    if (t->conn.get() == conn && !t->ended) victims.push_back(t.get());
  }
  for (SenderTransfer* t : victims) EndLocked(t, status, /*tell_receiver=*/false);
}

void TcpSender::Tick() {
  std::vector<std::shared_ptr<SenderConnection>> to_close;
  {
    const absl::Time now = absl::Now();
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<SenderTransfer*> expired;
    for (auto& [handle, t] : transfers_) {
      if (!t->ended && now >= t->deadline) expired.push_back(t.get());
    }
    for (SenderTransfer* t : expired) {
      EndLocked(t,
                absl::DeadlineExceededError(
                    absl::StrCat("kv transfer ", t->transfer_id, " attempt ", t->attempt, " to ",
                                 t->conn->endpoint(), " passed its deadline")),
                /*tell_receiver=*/true);
    }
    // Close connections nobody can use any more: broken or replaced, and not needed by a
    // transfer still in flight or by a queued message.
    for (auto it = conns_.begin(); it != conns_.end();) {
      SenderConnection* c = it->get();
      auto pooled = pool_.find(c->endpoint());
      const bool in_pool = pooled != pool_.end() && pooled->second.get() == c;
      bool in_use = false;
      for (auto& [handle, t] : transfers_) {
        if (t->conn.get() == c && !t->ended) {
          in_use = true;
          break;
        }
      }
      if ((!in_pool || !c->healthy()) && !in_use && (!c->healthy() || c->idle())) {
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
